"""What the bench and the sweep print with: text and Markdown tables, a progress line,
and whether a peer's result agrees with normkernels'."""

import sys


def format_table(rows, headers):
    widths = [max(len(str(h)), *(len(str(r[i])) for r in rows)) for i, h in enumerate(headers)]
    line = "  ".join(f"{{:>{w}}}" for w in widths)
    out = [line.format(*headers), line.format(*("-" * w for w in widths))]
    out += [line.format(*r) for r in rows]
    return "\n".join(out)


def markdown_table(rows, headers):
    out = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    out += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(out)


def progress(i, n, label):
    """One status line on stderr (rewritten in place on a terminal)."""
    width = 24
    done = width * i // max(n, 1)
    line = f"[{'#' * done}{'.' * (width - done)}] {i}/{n} {label}"
    if sys.stderr.isatty():
        print(f"\r{line[:100]:<100}", end="" if i < n else "\n", file=sys.stderr, flush=True)
    else:
        print(line, file=sys.stderr, flush=True)


def agrees(result, peer):
    """Does a peer's Y match normkernels' within what its dtype can hold?"""
    tol = 2e-2 if result["dtype"] in ("float16", "bfloat16") else 1e-4
    return result["agreement"].get(peer, 0.0) <= tol

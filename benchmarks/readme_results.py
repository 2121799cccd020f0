"""Regenerate the performance page's results section (``docs/guide/performance.md``)
from ``normkernels bench --json`` output.

    normkernels bench --json docs/bench-default.json --plot docs/bench-default.png
    python benchmarks/readme_results.py docs/bench-default.json --write docs/guide/performance.md

Prints the section (machine, thread count, versions, the command, the table, what
was skipped and why); with ``--write`` replaces the text between the
``<!-- bench:start -->`` and ``<!-- bench:end -->`` markers of that file.
"""

import argparse
import json
import re
import sys

from normkernels.bench import cli, report

START, END = "<!-- bench:start -->", "<!-- bench:end -->"


def section(data, command):
    rows, headers = cli.result_rows(data["results"], data["peers"])
    versions = ", ".join(f"{k} {v}" for k, v in data["versions"].items())
    lines = [START,
             f"Measured on {data['cpu']}, {data['threads']} threads "
             f"({data['threading_layer']}); {versions}.", "",
             f"`{command}`", "", report.markdown_table(rows, headers), "", cli.LEGEND]
    skipped = {}
    for r in data["results"]:
        for peer, reason in r["skipped"].items():
            skipped.setdefault((peer, reason), []).append(r["workload"])
    if skipped:
        lines.append("")
        for (peer, reason), names in skipped.items():
            where = ("all workloads" if len(names) == len(data["results"])
                     else ", ".join(names))
            lines.append(f"- {peer} skipped on {where}: {reason}")
    lines.append(END)
    return "\n".join(lines)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("json", help="output of normkernels bench --json")
    parser.add_argument("--command", default="normkernels bench --json "
                        "docs/bench-default.json --plot docs/bench-default.png",
                        help="the command that produced it (quoted in the section)")
    parser.add_argument("--write", help="a Markdown file whose marked section to replace")
    args = parser.parse_args(argv)
    with open(args.json) as f:
        text = section(json.load(f), args.command)
    if not args.write:
        print(text)
        return 0
    with open(args.write) as f:
        doc = f.read()
    pattern = re.compile(re.escape(START) + ".*?" + re.escape(END), re.S)
    if not pattern.search(doc):
        print(f"{args.write} has no {START} ... {END} section", file=sys.stderr)
        return 2
    with open(args.write, "w") as f:
        f.write(pattern.sub(lambda _: text, doc))
    return 0


if __name__ == "__main__":
    sys.exit(main())

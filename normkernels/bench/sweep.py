"""``normkernels bench --sweep``: one operator timed at sizes from 1 element to about
100M, warm and cold, beside the installed peers, to show where normkernels wins and
where it does not.

Each size runs through the bench's harness (:mod:`normkernels.bench.workloads`): the
inputs are built once, normkernels, the roofline baseline (parallel copy; read for
moments; add, two arrays read and one written, for backward passes) and the peers are
timed with interleaved repeats in each cache state, every peer's Y is checked against
normkernels', and the buffers are freed before the next size. The number of rounds
adapts to the size: a one-round trial picks about ``POINT_SECONDS x repeat`` seconds of
timing, at least ``repeat`` rounds (huge sizes) and at most ``MAX_ROUND_SCALE x
repeat`` (tiny sizes, microseconds per call).
"""

import argparse
import gc
import json
import math
import os
import sys
import time

import numpy as np

from normkernels.bench import workloads
from normkernels.bench.report import agrees, format_table, markdown_table, progress
from normkernels.operators import YARDSTICK

# logical N, C, spatial shapes (NXC workloads take the same ones), by element count:
# latency-bound tiny calls, L2 (2 MB here), last-level cache (32 MB), then DRAM
SHAPES = ((1, 1, 1, 1), (1, 16, 8, 8), (1, 64, 16, 16), (1, 512, 7, 7), (1, 2048, 7, 7),
          (1, 64, 56, 56), (2, 64, 56, 56), (4, 64, 56, 56), (8, 64, 56, 56),
          (16, 64, 56, 56), (32, 64, 56, 56), (32, 64, 112, 112), (128, 64, 112, 112))
MAX_ELEMENTS = 110_000_000  # all of SHAPES: the last has 102,760,448 elements
DEFAULT_REPEAT = 5
SKIPPED_PEERS = ("onnx-ref",)  # the slow Python reference: only when --peers names it
POINT_SECONDS = 0.3  # target timing per size and cache state, per unit of repeat
MAX_ROUND_SCALE = 200  # tiny sizes: at most this many times repeat rounds


def positive_int(text):
    """argparse type of --sweep-max-elements: a whole number >= 1 (``1.1e8`` too)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not (value >= 1 and value == int(value)):
        raise argparse.ArgumentTypeError(f"must be a whole number >= 1, got {text!r}")
    return int(value)


def check_arguments(parser, args):
    """Reject (``parser.error``) bench flags that contradict --sweep or need it."""
    if args.sweep and (args.workload or args.suite or args.quick or args.shape or args.list):
        parser.error("--sweep times its own sizes: --workload, --suite, --quick, --shape "
                     "and --list do not apply")
    if args.sweep_max_elements and not args.sweep:
        parser.error("--sweep-max-elements needs --sweep")


def sweep_workloads(op, mode, dtype, layout, max_elements=MAX_ELEMENTS):
    """The workloads of a sweep: :data:`SHAPES` up to ``max_elements`` elements."""
    return [workloads.custom_workload(op, mode, shape, dtype, layout)
            for shape in SHAPES if math.prod(shape) <= max_elements]


def _time_state(calls, cache, repeat, warmup):
    """(medians, rounds) in one cache state: ``warmup`` rounds, one round timed by
    the wall clock (flushes and touches included) to size the run, then the run."""
    for _ in range(warmup):
        for fn in calls.values():
            fn()
    t0 = time.perf_counter()
    workloads.timed_medians(calls, cache, 1, warmup=0)
    trial = time.perf_counter() - t0
    rounds = int(min(max(POINT_SECONDS * repeat / trial, repeat), MAX_ROUND_SCALE * repeat))
    return workloads.timed_medians(calls, cache, rounds, warmup=0), rounds


def time_point(workload, peers, threads, caches, repeat, warmup=1):
    """One size: a result dict per cache state (in the order of ``caches``)."""
    X, params = workloads.make_inputs(workload)
    nk = workloads.normkernels_call(workload, X, params, np.empty_like(X))
    ours = nk()
    roofline = workloads.roofline(workload)
    others, skipped = workloads.comparison_calls(workload, X, params, peers, threads,
                                                 baselines=(roofline,), yardstick=False)
    calls = {"normkernels": nk, **others}
    compared = [p for p in peers if p in calls]
    agreement = {p: workloads.agreement(workload, calls[p](), ours) for p in compared}
    nbytes = workloads.moved_bytes(workload, X)
    results = []
    for i, cache in enumerate(caches):
        medians, rounds = _time_state(calls, cache, repeat, warmup if i == 0 else 0)
        results.append({
            "workload": workload.name, "op": workload.op, "mode": workload.mode,
            "dtype": workload.dtype, "data_format": workload.data_format,
            "shape": list(workload.layout_shape), "ncx_shape": list(workload.shape),
            "elements": X.size, "bytes": nbytes, "threads": threads, "cache": cache,
            "rounds": rounds, "roofline": roofline, "seconds": medians,
            "gbps": workloads.gbps(workload, X, medians),
            "ratios": {p: medians[p] / medians["normkernels"] for p in compared},
            "skipped": skipped, "agreement": agreement})
    return results


def crossovers(results, peers, caches):
    """{cache: {peer: [{"shape", "elements", "ratio"}]}}: the sizes where normkernels
    is slower than the peer (peer time / normkernels time below 1); a peer compared at
    no size is left out."""
    found = {}
    for cache in caches:
        rows = [r for r in results if r["cache"] == cache]
        found[cache] = {
            peer: [{"shape": r["ncx_shape"], "elements": r["elements"],
                    "ratio": r["ratios"][peer]} for r in rows
                   if r["ratios"].get(peer, math.inf) < 1.0]
            for peer in peers if any(peer in r["ratios"] for r in rows)}
    return found


def run_sweep(op, mode, dtype, layout, peers, caches=workloads.CACHE_STATES,
              max_elements=MAX_ELEMENTS, repeat=DEFAULT_REPEAT, warmup=1, threads=None,
              progress=None):
    """Time the sweep; returns its description, ``results`` (one per size and cache
    state, grouped by cache state) and ``crossovers``. ``progress(i, n, label)`` is
    called before each size."""
    import numba

    threads = threads or numba.get_num_threads()
    points = sweep_workloads(op, mode, dtype, layout, max_elements)
    if not points:
        raise ValueError(f"no sweep size has at most {max_elements} elements")
    if "cold" in caches:
        workloads.flusher()()  # allocated and compiled now, not in a size's trial round
    results = []
    for i, w in enumerate(points):
        if progress is not None:
            progress(i, len(points), w.name)
        results += time_point(w, peers, threads, caches, repeat, warmup)
        gc.collect()  # the inputs, outputs and peer sessions of a 100M size go now
    if progress is not None:
        progress(len(points), len(points), "done")
    results.sort(key=lambda r: caches.index(r["cache"]))  # stable: sizes stay in order
    return {"op": op, "mode": mode, "dtype": dtype, "data_format": layout,
            "caches": list(caches), "max_elements": max_elements, "repeat": repeat,
            "shapes": [list(w.shape) for w in points], "peers": list(peers),
            "compared": [p for p in peers if any(p in r["ratios"] for r in results)],
            "results": results, "crossovers": crossovers(results, peers, caches)}


def _us(seconds):
    us = seconds * 1e6
    return f"{us:.2f}" if us < 10 else f"{us:.1f}" if us < 1000 else f"{us:,.0f}"


def _bytes(n):
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if n >= scale:
            return f"{n / scale:.3g} {unit}"
    return f"{n} B"


def sweep_rows(sweep, cache):
    """(rows, headers) of the table of one cache state."""
    peers = sweep["compared"]
    rows = []
    for r in (r for r in sweep["results"] if r["cache"] == cache):
        s, g = r["seconds"], r["gbps"]
        row = [f"{r['elements']:,}", "x".join(map(str, r["ncx_shape"])),
               _bytes(r["bytes"]), r["rounds"], _us(s["normkernels"]),
               f"{g['normkernels']:.3g}", f"{g[r['roofline']]:.3g}"]
        for peer in peers:
            if peer not in r["ratios"]:
                row += ["-", "-", "-"]
                continue
            mark = "" if agrees(r, peer) else " !"
            row += [_us(s[peer]), f"{g[peer]:.3g}", f"{r['ratios'][peer]:.2f}x{mark}"]
        rows.append(row)
    roofline = sweep["results"][0]["roofline"]
    headers = ["elements", "shape", "bytes", "rounds", "nk us", "nk GB/s", f"{roofline} GB/s"]
    for peer in peers:
        headers += [f"{peer} us", f"{peer} GB/s", f"{peer} /nk"]
    return rows, headers


CACHE_TITLES = {"warm": "warm caches (each timed call right after an untimed call of itself)",
                "cold": "cold caches (256 MB of scratch memory written before each call)"}
LEGEND = (
    "shape: N x C x spatial (the logical shape; NXC stores it channels-last); us: "
    "median time per call; bytes: X read + Y written (X only for moments; X and dY read + "
    "dX written for backward); GB/s: those bytes per second; copy (read for moments, "
    "add dX = X + dY for backward): the same bytes moved (parallel; one thread below "
    "1 MB), the bandwidth limit at large sizes; <peer> /nk: "
    "the peer's time over normkernels' "
    "(above 1: normkernels is faster), '!' when its Y differs from normkernels' by more "
    "than its dtype can hold; rounds: interleaved repeats, many for tiny sizes, few for "
    "huge ones.")


CROSSOVER_TITLE = ("crossovers: sizes where normkernels is slower than the peer "
                   "(peer time / normkernels time < 1)")


def crossover_items(sweep):
    """(cache, peer, where) for each cache state and peer compared: the sizes where
    normkernels is slower, as "elements (shape, ratio); ...", or "none"."""
    return [(cache, peer, "; ".join(f"{p['elements']:,} ({'x'.join(map(str, p['shape']))}, "
                                    f"{p['ratio']:.2f}x)" for p in points) or "none")
            for cache, by_peer in sweep["crossovers"].items()
            for peer, points in by_peer.items()]


def plot_sweep(sweep, environment, path):
    """Time per call against elements (log-log), one line per implementation and the
    copy (roofline) dashed, one panel per cache state."""
    try:
        import matplotlib
    except ImportError:
        print("--plot needs matplotlib: pip install 'normkernels[plot]'", file=sys.stderr)
        return
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    caches = sweep["caches"]
    fig, axes = plt.subplots(1, len(caches), figsize=(6.5 * len(caches), 5.2), sharey=True,
                             squeeze=False)
    roofline = sweep["results"][0]["roofline"]
    series = ["normkernels", *sweep["compared"], roofline]
    for ax, cache in zip(axes[0], caches, strict=True):
        rows = [r for r in sweep["results"] if r["cache"] == cache]
        for name in series:
            points = [(r["elements"], r["seconds"][name] * 1e6) for r in rows
                      if name in r["seconds"]]
            style = {"color": "black", "linestyle": "--", "linewidth": 1} \
                if name == roofline else {"marker": "o", "markersize": 4,
                                          "linewidth": 2.2 if name == "normkernels" else 1.3}
            label = (f"parallel {roofline} (the bandwidth limit at large sizes)"
                     if name == roofline else name)
            ax.plot(*zip(*points, strict=True), label=label, **style)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.grid(True, which="both", alpha=0.3)
        ax.set_title(f"{cache} caches")
        ax.set_xlabel("elements")
    axes[0][0].set_ylabel("median time per call (µs)")
    fig.legend(*axes[0][0].get_legend_handles_labels(), loc="lower center",
               ncol=len(series), fontsize=9)
    fig.suptitle(f"{sweep['op']} {sweep['mode']}, {sweep['dtype']}, {sweep['data_format']}: "
                 f"time per call\n{environment['cpu']}, {os.cpu_count()} cores, "
                 f"{sweep['results'][0]['threads']} threads")
    fig.tight_layout(rect=(0, 0.06, 1, 1))  # room for the legend below the panels
    fig.savefig(path, dpi=120)
    plt.close(fig)


def command(args, peers, threads):
    """``normkernels bench --sweep``: time, print, and write --json/--markdown/--plot."""
    from normkernels.bench import model_timing

    op, mode = args.op or YARDSTICK, args.mode or "inference"
    dtype, layout = args.dtype or "float32", args.layout or "NCX"
    caches = (args.cache,) if args.cache else workloads.CACHE_STATES
    repeat = args.repeat or DEFAULT_REPEAT
    max_elements = args.sweep_max_elements or MAX_ELEMENTS
    try:
        workloads.custom_workload(op, mode, (1, 1), dtype, layout)  # the flags' checks
        sizes = len(sweep_workloads(op, mode, dtype, layout, max_elements))
        print(f"normkernels bench --sweep: {op} {mode}, {dtype}, {layout}, {sizes} sizes "
              f"up to {max_elements:,} elements, {' and '.join(caches)} caches; {threads} "
              f"threads; peers: {', '.join(peers) or 'none'}; --repeat {repeat}: at "
              "least that many interleaved rounds per size", flush=True)
        load = _load_warning(threads)
        start = time.perf_counter()
        sweep = run_sweep(op, mode, dtype, layout, peers, caches, max_elements, repeat,
                          args.warmup, threads, progress=progress)
    except ValueError as exc:
        print(f"normkernels bench: {exc}", file=sys.stderr)
        return 2
    print(f"swept in {time.perf_counter() - start:.0f} s")
    tables = {cache: sweep_rows(sweep, cache) for cache in caches}
    _print_report(sweep, tables, format_table)
    environment = model_timing.environment()
    if args.json:
        with open(args.json, "w") as f:
            json.dump({**environment, "load_average": load,
                       "sweep": {k: v for k, v in sweep.items()
                                 if k not in ("results", "crossovers")},
                       "peers": peers, "results": sweep["results"],
                       "crossovers": sweep["crossovers"]}, f, indent=2)
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write(_markdown(sweep, tables, markdown_table))
    if args.plot:
        plot_sweep(sweep, environment, args.plot)
    return 0


def _load_warning(threads):
    """The 1-minute load average (None where unknown), with a warning on stderr when
    other processes keep cores busy: a parallel call then waits for a core (tens of
    microseconds), which is the machine's state, not the kernel's cost."""
    try:
        load = os.getloadavg()[0]
    except (AttributeError, OSError):
        return None
    if load > 0.5:
        print(f"warning: load average {load:.1f} before the sweep ({os.cpu_count()} cores, "
              f"{threads} threads): other processes are running, small parallel calls "
              "will measure their wait for a core", file=sys.stderr)
    return load


def _print_report(sweep, tables, format_table):
    """The tables (one per cache state), the legend, the crossovers, the skipped peers."""
    for cache, (rows, headers) in tables.items():
        print(f"\n{CACHE_TITLES[cache]}:\n{format_table(rows, headers)}")
    print(LEGEND)
    print(f"\n{CROSSOVER_TITLE}")
    for cache, peer, where in crossover_items(sweep):
        print(f"  {cache:4s}  {peer:12s} {where}")
    skipped = {(p, why) for r in sweep["results"] for p, why in r["skipped"].items()}
    for peer, reason in sorted(skipped):
        print(f"skipped {peer}: {reason}")


def _markdown(sweep, tables, markdown_table):
    """The report as Markdown: a section per cache state, the legend, the crossovers."""
    parts = [f"### {CACHE_TITLES[cache]}\n\n{markdown_table(rows, headers)}\n\n"
             for cache, (rows, headers) in tables.items()]
    parts.append(f"{LEGEND}\n\n{CROSSOVER_TITLE}:\n\n")
    parts += [f"- {cache}, {peer}: {where}\n" for cache, peer, where in crossover_items(sweep)]
    return "".join(parts)

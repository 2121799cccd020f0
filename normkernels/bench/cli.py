"""``normkernels bench | info | warmup``: the command line."""

import argparse
import functools
import json
import sys
import time

from normkernels.bench import networks, sweep, workloads
from normkernels.bench.report import agrees, format_table, markdown_table, progress
from normkernels.operators import OPERATORS, YARDSTICK

PEER_ORDER = ("numpy", "onnx-ref", "onnxruntime", "torch", "openvino")


def result_rows(results, peers):
    rows = []
    for r in results:
        s, g = r["seconds"], r["gbps"]
        row = [r["workload"], "x".join(map(str, r["shape"])), r.get("cache", "-"),
               f"{s['normkernels'] * 1e3:.3f}",
               f"{g['normkernels']:.1f}", f"{g[r['roofline']]:.1f} {r['roofline']}",
               f"{r['pct_of_roofline']:.0f}%",
               f"{r['over_inference']:.2f}x" if "over_inference" in r else "-"]
        for peer in peers:
            if peer in r["ratios"]:
                mark = "" if agrees(r, peer) else " !"
                row.append(f"{r['ratios'][peer]:.2f}x{mark}")
            else:
                row.append("-")
        row += [f"{r['max_rel_err']['normkernels']:.0e}", f"{r['first_call_s'] * 1e3:.0f}"]
        rows.append(row)
    headers = ["workload", "shape", "cache", "ms", "GB/s", "limit GB/s", "% limit", "/ BN inf",
               *[f"{p} /nk" for p in peers], "nk err", "1st call ms"]
    return rows, headers


LEGEND = (
    "cache: warm (each timed call right after an untimed call of itself) or cold (after "
    "256 MB of scratch memory was written); ms: median time of normkernels (out= "
    "given); GB/s: bytes of X read + Y written (X only for moments; X and dY read + dX "
    "written for backward) per second; limit: a copy of the same bytes (parallel; one "
    "thread below 1 MB; read: a parallel read-only sum; add: a parallel dX = X + dY, "
    "two arrays read and one written), measured in "
    "the same run; / BN inf: time over BN inference on the same tensor; <peer> /nk: the "
    "peer's time over normkernels' (higher is slower), '!' when its Y (dX) differs from "
    "normkernels' by more than its dtype can hold; nk err: max relative error against "
    "the formula in float64; 1st call: compile or load from the disk cache.")


def _plot(results, peers, path):
    try:
        import matplotlib
    except ImportError:
        print("--plot needs matplotlib: pip install 'normkernels[plot]'", file=sys.stderr)
        return
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    names = [r["workload"] for r in results]
    series = ["normkernels", *[p for p in peers if any(p in r["ratios"] for r in results)]]
    fig, ax = plt.subplots(figsize=(max(8, 1.1 * len(names)), 5))
    width = 0.8 / len(series)
    x = np.arange(len(names))
    for k, name in enumerate(series):
        ax.bar(x + k * width, [r["gbps"].get(name, 0.0) for r in results], width, label=name)
    limits = [r["gbps"][r["roofline"]] for r in results]
    ax.hlines(limits, x - width / 2, x + 0.8 - width / 2, colors="black",
              label="bandwidth limit (copy / read / add)")
    ax.set_xticks(x + 0.4 - width / 2, names, rotation=30, ha="right", fontsize=8)
    ax.set_ylabel("GB/s (X read + Y written; backward: X, dY read + dX written)")
    ax.set_title(f"normkernels bench, {results[0]['threads']} threads")
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def _workloads(args):
    if args.op or args.shape or args.dtype or args.layout or args.mode:
        shape = tuple(int(v) for v in (args.shape or "32,64,112,112").split(","))
        return [workloads.custom_workload(args.op or YARDSTICK, args.mode or "inference",
                                          shape, args.dtype or "float32",
                                          args.layout or "NCX")]
    names = list(args.workload or [])
    if args.suite or not names:
        names += workloads.SUITES["quick" if args.quick else (args.suite or "default")]
    unknown = [n for n in names if n not in workloads.WORKLOADS_BY_NAME]
    if unknown:
        raise ValueError(f"unknown workload(s): {', '.join(unknown)} (see --list)")
    return [workloads.WORKLOADS_BY_NAME[n] for n in names]


def cmd_bench(args):
    import numba

    from normkernels.bench import model_timing

    if args.list:
        for suite, names in workloads.SUITES.items():
            print(f"suite {suite}: {' '.join(names)}")
        for w in workloads.WORKLOADS:
            print(f"{w.name:30s} {w.op:20s} {w.mode:9s} {w.dtype:9s} {w.data_format} "
                  f"{w.layout_shape}")
        return 0
    if args.threads:
        numba.set_num_threads(args.threads)
    try:
        chosen = ([] if args.sweep or args.suite == "networks" or args.via == "torch"
                  else _workloads(args))
    except ValueError as exc:
        print(f"normkernels bench: {exc}", file=sys.stderr)
        return 2
    default_peers = [p for p in PEER_ORDER if not (args.sweep and p in sweep.SKIPPED_PEERS)]
    peers = [p for p in PEER_ORDER if p in (args.peers or default_peers)]
    if args.no_numpy and "numpy" in peers:
        peers.remove("numpy")
    if "openvino" in peers:  # see normkernels.bench.peers: Numba's threading layer first
        workloads.baseline_calls(*(2 * [__import__("numpy").zeros(1 << 17)]))["read"]()
    threads = numba.get_num_threads()
    if args.sweep:
        return sweep.command(args, peers, threads)
    if args.models and args.via != "torch":
        print("normkernels bench: --models runs with --via torch", file=sys.stderr)
        return 2
    if args.via == "torch":
        if args.models:
            from normkernels.bench import zoo_models

            return zoo_models.command(args)
        from normkernels.bench import via_torch

        return via_torch.command(args)
    if args.suite == "networks":
        steps = [n for n in args.network or () if n not in networks.NETWORKS]
        if steps:
            print(f"normkernels bench: {', '.join(steps)}: training steps run with --via torch",
                  file=sys.stderr)
            return 2
        return networks.command(args, peers, threads)
    repeat = args.repeat or (3 if args.quick else 10)
    caches = (f"{args.cache} caches" if args.cache else
              "warm caches below 1 MB of X, cold (flushed before each timed call) above")
    print(f"normkernels bench: {threads} threads ({numba.threading_layer()}), median of "
          f"up to {repeat} interleaved repeats, {caches}", flush=True)
    results = []
    start = time.perf_counter()
    for i, w in enumerate(chosen):
        progress(i, len(chosen), w.name)
        results.append(workloads.run_workload(w, repeat=repeat, warmup=args.warmup,
                                              peers=peers, threads=threads,
                                              budget_seconds=20 if args.quick else 40,
                                              cache=args.cache))
    progress(len(chosen), len(chosen), f"done in {time.perf_counter() - start:.0f} s")
    rows, headers = result_rows(results, peers)
    print(format_table(rows, headers))
    print(LEGEND)
    skipped = {}
    for r in results:
        for peer, reason in r["skipped"].items():
            skipped.setdefault((peer, reason), []).append(r["workload"])
    for (peer, reason), names in skipped.items():
        where = "all workloads" if len(names) == len(results) else ", ".join(names)
        print(f"skipped {peer} ({where}): {reason}")
    meta = model_timing.environment()
    if args.json:
        with open(args.json, "w") as f:
            json.dump({**meta, "peers": peers, "results": results}, f, indent=2)
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write(markdown_table(rows, headers) + "\n")
    if args.plot:
        _plot(results, peers, args.plot)
    return 0


def cmd_onnx(args):
    """Time light-zoo models under onnx.reference with and without normkernels."""
    from normkernels.bench import model_timing

    try:
        import onnx  # noqa: F401
    except ImportError:
        print("normkernels onnx needs the onnx package: pip install 'normkernels[onnx]'",
              file=sys.stderr)
        return 2
    rows = []
    for name in args.model or ["resnet50"]:
        result = model_timing.evaluator_timing(name, repeat=args.repeat)
        ours, ref = result["normkernels"], result["onnx.reference"]
        for key, r in result.items():
            rows.append([name, key, r["norm_nodes"], f"{r['model_s']:.3f}",
                         f"{r['norm_nodes_s'] * 1e3:.1f}", f"{r['max_rel_err']:.0e}"])
        rows.append([name, "speedup", "", f"{ref['model_s'] / ours['model_s']:.2f}x",
                     f"{ref['norm_nodes_s'] / ours['norm_nodes_s']:.1f}x", ""])
    print(format_table(rows, ["model", "ops", "norm nodes", "model s", "norm nodes ms",
                              "err vs stored"]))
    return 0


def cmd_coldstart(args):
    """Import time and first-call times (empty and warm kernel cache), fresh processes."""
    from normkernels.bench import model_timing

    shape = tuple(int(v) for v in args.shape.split(","))
    if args.profile:
        from normkernels.bench import compile_profile

        return compile_profile.command(args.profile, shape, args.dtype, args.limit, args.json)
    families = None
    if args.ops:
        wanted = set(args.ops.split(","))
        families = [f for f in model_timing.COLD_START_FAMILIES if f.split()[0] in wanted]
    result = model_timing.cold_start(shape, args.dtype, repeat=args.repeat, families=families)
    print(f"cold start, {'x'.join(map(str, shape))} {args.dtype}, fresh processes "
          f"(median of {args.repeat} where repeated):")
    extra = result["import normkernels + operators"] - result["import numba"]
    print(format_table([[label, f"{result[label] * 1e3:.0f}"] for label in
                        ("import numba", "import normkernels + operators")]
                       + [["normkernels operators over import numba", f"{extra * 1e3:.0f}"]],
                       ["what", "ms"]))
    rows = []
    for family in model_timing.COLD_START_FAMILIES:
        if f"{family}: second call" not in result:
            continue
        rows.append([family, f"{result[f'{family}: first call, empty cache']:.2f}",
                     f"{result[f'{family}: second call'] * 1e6:.0f}",
                     f"{result[f'{family}: import and first call, warm cache']:.2f}"])
    print(format_table(rows, ["operator and mode", "first call, empty cache (s)",
                              "second call (us)", "import + first call, cached (s)"]))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)
    return 0


def cache_files():
    """Cached kernel index files (``*.nbi``): where they are and how many."""
    from pathlib import Path

    import numba

    import normkernels.kernels

    if numba.config.CACHE_DIR:
        root = Path(numba.config.CACHE_DIR)
    else:
        root = Path(normkernels.kernels.__file__).parent / "__pycache__"
    return root, sorted(root.rglob("*.nbi")) if root.exists() else []


def cmd_info(args):
    import platform

    import numba
    import numpy as np
    from llvmlite import binding

    import normkernels
    from normkernels.engine import policy

    print(f"normkernels {normkernels.__version__}, numba {numba.__version__}, "
          f"numpy {np.__version__}, python {platform.python_version()}")
    print(f"machine: {platform.machine()}, threads: {numba.get_num_threads()}, "
          f"streaming stores: {'yes' if policy.streaming_supported() else 'no'}")
    from normkernels.kernels.target import jit_target

    target = jit_target()
    host = binding.get_host_cpu_name()
    print(f"kernels built for: {target.cpu}"
          + ("" if target.cpu == host else f" (host CPU: {host}; NUMBA_CPU_NAME)")
          + ("" if target.features else ", features of the CPU name (NUMBA_CPU_FEATURES empty)"))
    print("target features used: " + (", ".join(target.features_shown()) or "none of "
                                       "avx2, f16c, avx512f, avx512dq, avx512bf16"))
    for dtype, how in target.conversions().items():
        print(f"{dtype} conversions (narrow / widen): {how}")
    try:
        # the layer is known once a parallel kernel has run
        from normkernels.kernels.activations import NONE
        from normkernels.kernels.scale_shift import scale_shift_periodic_parallel
        x = np.zeros(1 << 16, np.float32)
        p = np.zeros(512, np.float32)
        scale_shift_periodic_parallel(x, x, 256, p, p, p, 4096, None, NONE)
        print(f"threading layer: {numba.threading_layer()}")
    except ValueError:
        print("threading layer: (none initialised)")
    root, files = cache_files()
    print(f"kernel cache: {root} ({len(files)} cached kernels; NUMBA_CACHE_DIR moves it)")
    return 0


def warmup_calls(dtypes=None, fill=None):
    """(dtype, operator, case, path, call) for every warmup case of every operator in
    :data:`normkernels.operators.OPERATORS`, in every dtype the operator takes (of
    ``dtypes``, names; default all). Shapes marked ``per_thread`` get two planes per
    thread, so the fused kernels (which need at least twice as many planes as threads)
    are the ones compiled at any thread count. X is zeros, or ``fill(rng, shape,
    dtype)``."""
    import numba
    import numpy as np

    from normkernels.bench.workloads import DTYPES

    threads = numba.get_num_threads()
    rng = np.random.default_rng(0)
    calls = []
    for name, dtype in DTYPES.items():
        if dtypes is not None and name not in dtypes:
            continue
        for op in OPERATORS.values():
            for case in op.warmup if name in op.dtypes else ():
                shape = case.ncx_shape
                if case.per_thread:
                    shape = (shape[0] * threads, *shape[1:])
                ncx = np.zeros(shape, dtype) if fill is None else fill(rng, shape, dtype)
                X = np.moveaxis(ncx, 1, -1).copy() if case.data_format == "NXC" else ncx
                axis = X.ndim - 1 if case.data_format == "NXC" and X.ndim > 2 else 1
                params = op.params(rng, op.columns(shape), dtype, X.shape, case.mode, X, axis)
                for path in case.paths:
                    calls.append((name, op, case, path, functools.partial(
                        op.call, X, params, case.mode, case.data_format, None, None, path)))
    return calls


def cmd_warmup(args):
    """Compile (or load from the disk cache) every kernel of the operators, dtypes and
    layouts chosen (default: all): normkernels.warmup."""
    import normkernels

    def split(value):
        return None if value is None else value.split(",")

    start = time.perf_counter()
    try:
        done = normkernels.warmup(split(args.ops), split(args.dtypes), split(args.layouts),
                                  progress=progress, jobs=args.jobs)
    except ValueError as exc:
        print(f"normkernels warmup: {exc}", file=sys.stderr)
        return 2
    total = time.perf_counter() - start
    progress(len(done), len(done), f"done in {total:.1f} s")
    by_op = {}
    for label, seconds in done:
        dtype, name = label.split()[:2]
        by_op[(dtype, name)] = by_op.get((dtype, name), 0.0) + seconds
    rows = [[dtype, name, f"{seconds * 1e3:.0f}"] for (dtype, name), seconds in by_op.items()]
    rows.append(["all", f"{len(done)} calls", f"{total * 1e3:.0f}"])
    print(format_table(rows, ["dtype", "operator", "ms (compile or cache load, and run)"]))
    return 0


def main(argv=None):
    parser = argparse.ArgumentParser(prog="normkernels", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    bench = sub.add_parser("bench", help="time the operators against the machine's "
                           "bandwidth and the peers installed (default: the default suite)")
    bench.add_argument("--workload", action="append", help="a workload name (repeatable)")
    bench.add_argument("--suite", choices=[*workloads.SUITES, "networks"],
                       help="a set of workloads (default: default); networks: the "
                            "normalization layers of whole networks, back to back")
    bench.add_argument("--network", action="append",
                       choices=[*networks.NETWORKS, "resnet50-b32-step", "bert-b8-step"],
                       help="with --suite networks: one network (repeatable; default all)")
    bench.add_argument("--via", choices=["torch"],
                       help="torch: normkernels.torch's modules against torch.nn's, layer "
                            "after layer (forward + backward, and inference); --network "
                            "narrows it")
    bench.add_argument("--models", action="store_true",
                       help="with --via torch: whole models of transformers, diffusers and "
                            "timm (those installed; random weights), torch's normalization "
                            "modules against the swapped ones")
    bench.add_argument("--quick", action="store_true",
                       help="the quick suite with 3 repeats (under a minute)")
    bench.add_argument("--op", choices=list(OPERATORS),
                       help="a custom workload: the operator ("
                            + "; ".join(f"{op.name}: {op.title}" for op in OPERATORS.values())
                            + ")")
    bench.add_argument("--mode", choices=sorted({m for op in OPERATORS.values()
                                                 for m in op.modes}),
                       help="inference (default), or training or backward (the gradient: dX, "
                            "dscale, dB) for the operators that have them")
    bench.add_argument("--shape", help="N,C,spatial... (e.g. 32,64,112,112)")
    bench.add_argument("--dtype", help="float32 (default), float16, bfloat16, float64")
    bench.add_argument("--layout", help="NCX (default) or NXC")
    bench.add_argument("--peers", nargs="*", choices=list(PEER_ORDER),
                       help=f"peers to compare (default: every one installed: "
                            f"{', '.join(PEER_ORDER)}; --sweep leaves out onnx-ref)")
    bench.add_argument("--list", action="store_true", help="list suites and workloads")
    bench.add_argument("--repeat", type=int, help="interleaved repeats (default 10; 3 quick; "
                       f"--sweep: at least this many per size, default {sweep.DEFAULT_REPEAT})")
    bench.add_argument("--warmup", type=int, default=1, help="untimed rounds first")
    bench.add_argument("--threads", type=int, help="Numba threads (default: all cores)")
    bench.add_argument("--no-numpy", action="store_true", help="skip the NumPy peer")
    bench.add_argument("--json", help="also write the results to this JSON file")
    bench.add_argument("--markdown", help="also write the table to this Markdown file")
    bench.add_argument("--plot", help="also draw GB/s per workload and peer to this PNG "
                       "(with --sweep: time per call against size)")
    bench.add_argument("--cache", choices=["warm", "cold"],
                       help="time each call right after an untimed call of itself (warm) or "
                            "after a cache flush (cold); default: warm below 1 MB of X, "
                            "cold above (--sweep: both)")
    bench.add_argument("--sweep", action="store_true",
                       help="time one operator (--op/--mode/--dtype/--layout; default BN "
                            "inference, float32, NCX) at sizes from 1 to ~100M elements, "
                            "warm and cold, and list where normkernels is slower than a peer")
    bench.add_argument("--sweep-max-elements", type=sweep.positive_int,
                       help="--sweep: leave out sizes above this many elements (default "
                            "1.1e8: all)")
    bench.set_defaults(func=cmd_bench)
    onnx_cmd = sub.add_parser("onnx", help="time light-zoo models under onnx.reference, "
                              "with and without the normkernels ops (needs onnx)")
    onnx_cmd.add_argument("--model", action="append",
                          help="resnet50 (default), densenet121, inception_v2, shufflenet")
    onnx_cmd.add_argument("--repeat", type=int, default=3, help="interleaved repeats")
    onnx_cmd.set_defaults(func=cmd_onnx)
    cold = sub.add_parser("coldstart", help="import time and first-call times with an "
                          "empty and a warm kernel cache, in fresh processes")
    cold.add_argument("--shape", default="2,16,8,8", help="N,C,spatial... (NCX; default: "
                      "a small tensor, so the second call shows the per-call cost)")
    cold.add_argument("--ops", help="operators, comma-separated (default: all)")
    cold.add_argument("--dtype", default="float32")
    cold.add_argument("--repeat", type=int, default=3)
    cold.add_argument("--json", help="also write the results to this JSON file")
    cold.add_argument("--profile", metavar="OP", help="instead: the first call of these "
                      "operators (comma-separated; a name, or a row such as 'layernorm "
                      "backward') with each compiled function's time by Numba's stage")
    cold.add_argument("--limit", type=int, default=25, help="--profile: functions listed")
    cold.set_defaults(func=cmd_coldstart)
    sub.add_parser("info", help="versions, threads, cache").set_defaults(func=cmd_info)
    warm = sub.add_parser("warmup", help="compile every kernel now (or the kernels of some "
                          "operators, dtypes, layouts): no later call compiles")
    warm.add_argument("--ops", help="operators, comma-separated: " + ", ".join(OPERATORS)
                      + " (or their function names; default: all)")
    warm.add_argument("--dtypes", help="float16,bfloat16,float32,float64 (default: all)")
    warm.add_argument("--layouts", help="NCX,NXC (default: both)")
    warm.add_argument("--jobs", type=int, default=None, help="compile in this many "
                      "processes into the shared disk cache (default: the machine's cores)")
    warm.set_defaults(func=cmd_warmup)
    args = parser.parse_args(argv)
    if args.command == "bench":
        sweep.check_arguments(bench, args)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())

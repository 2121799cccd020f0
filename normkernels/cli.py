"""``normkernels bench | info | warmup``: the command line."""

import argparse
import json
import sys
import time


def _format_table(rows, headers):
    widths = [max(len(str(h)), *(len(str(r[i])) for r in rows)) for i, h in enumerate(headers)]
    line = "  ".join(f"{{:>{w}}}" for w in widths)
    out = [line.format(*headers), line.format(*("-" * w for w in widths))]
    out += [line.format(*r) for r in rows]
    return "\n".join(out)


def cmd_bench(args):
    import numba

    from normkernels import benchmarks

    if args.list:
        for w in benchmarks.WORKLOADS:
            print(f"{w.name:30s} {w.op:20s} {w.dtype:9s} {w.data_format} {w.layout_shape}")
        return 0
    if args.threads:
        numba.set_num_threads(args.threads)
    names = args.workload or [w.name for w in benchmarks.WORKLOADS]
    unknown = [n for n in names if n not in benchmarks.WORKLOADS_BY_NAME]
    if unknown:
        print(f"unknown workload(s): {', '.join(unknown)} (see --list)", file=sys.stderr)
        return 2
    print(f"normkernels bench: {numba.get_num_threads()} threads, median of up to "
          f"{args.repeat} interleaved repeats; GB/s counts X read + Y written (X read "
          "for moments); roofline = parallel copy of the same bytes (read: a parallel "
          "read-only sum); / inference = time over BN inference on the same tensor "
          "(training, instance norm); err = max relative error against the formula in "
          "float64", flush=True)
    results, rows = [], []
    for name in names:
        r = benchmarks.run_workload(benchmarks.WORKLOADS_BY_NAME[name], repeat=args.repeat,
                                    numpy_baseline=not args.no_numpy)
        results.append(r)
        s, g = r["seconds"], r["gbps"]
        rows.append([
            r["workload"], "x".join(map(str, r["shape"])), f"{s['normkernels'] * 1e3:.3f}",
            f"{g['normkernels']:.1f}", f"{r['roofline']} {g[r['roofline']]:.1f}",
            f"{r['pct_of_roofline']:.0f}%",
            f"{r['pct_of_axpb']:.0f}%" if "pct_of_axpb" in r else "-",
            f"{r['over_inference']:.2f}x" if "over_inference" in r else "-",
            f"{r['numpy_over_normkernels']:.1f}x" if "numpy_over_normkernels" in r else "-",
            f"{r['max_rel_err']['normkernels']:.0e}",
            f"{r['max_rel_err']['numpy']:.0e}" if "numpy" in r["max_rel_err"] else "-",
            f"{r['first_call_s'] * 1e3:.0f}",
        ])
        print(f"  {name}: {s['normkernels'] * 1e3:.3f} ms, {g['normkernels']:.1f} GB/s",
              file=sys.stderr, flush=True)
    headers = ["workload", "shape", "ms", "GB/s", "roofline GB/s", "% roofline", "% axpb",
               "/ inference", "numpy/nk", "nk err", "numpy err", "1st call ms"]
    print(_format_table(rows, headers))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"threads": numba.get_num_threads(), "results": results}, f, indent=2)
    return 0


def cmd_onnx(args):
    """Time light-zoo models under onnx.reference with and without normkernels."""
    from normkernels import benchmarks

    try:
        import onnx  # noqa: F401
    except ImportError:
        print("normkernels onnx needs the onnx package: pip install 'normkernels[onnx]'",
              file=sys.stderr)
        return 2
    rows = []
    for name in args.model or ["resnet50"]:
        result = benchmarks.evaluator_timing(name, repeat=args.repeat)
        ours, ref = result["normkernels"], result["onnx.reference"]
        for key, r in result.items():
            rows.append([name, key, r["norm_nodes"], f"{r['model_s']:.3f}",
                         f"{r['norm_nodes_s'] * 1e3:.1f}", f"{r['max_rel_err']:.0e}"])
        rows.append([name, "speedup", "", f"{ref['model_s'] / ours['model_s']:.2f}x",
                     f"{ref['norm_nodes_s'] / ours['norm_nodes_s']:.1f}x", ""])
    print(_format_table(rows, ["model", "ops", "norm nodes", "model s", "norm nodes ms",
                               "err vs stored"]))
    return 0


def cmd_info(args):
    import platform

    import numba
    import numpy as np

    import normkernels
    from normkernels.kernels import dispatch

    print(f"normkernels {normkernels.__version__}, numba {numba.__version__}, "
          f"numpy {np.__version__}, python {platform.python_version()}")
    print(f"machine: {platform.machine()}, threads: {numba.get_num_threads()}, "
          f"streaming stores: {'yes' if dispatch.streaming_supported() else 'no'}")
    print(f"numba cache dir: {numba.config.CACHE_DIR or '(__pycache__ beside the kernels)'}")
    try:
        # the layer is known once a parallel kernel has run
        from normkernels.kernels.scale_shift import scale_shift_periodic_parallel
        x = np.zeros(1 << 16, np.float32)
        p = np.zeros(512, np.float32)
        scale_shift_periodic_parallel(x, x, 256, p, p, p, 4096)
        print(f"threading layer: {numba.threading_layer()}")
    except ValueError:
        print("threading layer: (none initialised)")
    return 0


def cmd_warmup(args):
    """Compile (or load from the disk cache) every kernel for every dtype."""
    import numpy as np

    from normkernels.benchmarks import DTYPES
    from normkernels.kernels import dispatch
    from normkernels.ops.common import fold_parameters

    rows = []
    start = time.perf_counter()

    def timed(name, label, path, kernel, *args):
        t0 = time.perf_counter()
        kernel(*args)
        rows.append([name, label, path, f"{(time.perf_counter() - t0) * 1e3:.0f}"])

    for name, dtype in DTYPES.items():
        p = np.ones(3, np.float32)
        m, a, b = fold_parameters(p, p, p, p, 1e-5, dtype)
        for label, (shape, S) in {"planes": ((2, 3, 64), 64), "periodic": ((2, 3, 4), 4)}.items():
            x = np.zeros(shape, dtype)
            for path in dispatch.PATHS:
                timed(name, label, path, dispatch.scale_shift, x, np.empty_like(x), 3, S,
                      m, a, b, path)
        timed(name, "moments planes", "parallel", dispatch.moments,
              np.zeros((2, 3, 64), dtype), 3, 64)
        timed(name, "moments rows", "parallel", dispatch.moments, np.zeros((2, 4, 3), dtype), 3, 1)
        x = np.zeros((2, 3, 1024), dtype)
        q = np.ones(1024, dtype)
        for path in dispatch.PATHS:
            timed(name, "instance planes", path, dispatch.instance_planes, x, np.empty_like(x),
                  3, 1024, q[:3], q[:3], 1e-5, path)
        timed(name, "instance rows", "parallel", dispatch.instance_rows, x, np.empty_like(x),
              2, 1024, q, q, 1e-5)
    rows.append(["all", "", "", f"{(time.perf_counter() - start) * 1e3:.0f}"])
    print(_format_table(rows, ["dtype", "kernel", "path", "ms (compile or cache load)"]))
    return 0


def main(argv=None):
    parser = argparse.ArgumentParser(prog="normkernels", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    bench = sub.add_parser("bench", help="time the operators against the roofline and NumPy")
    bench.add_argument("--workload", action="append", help="a workload name (repeatable)")
    bench.add_argument("--list", action="store_true", help="list the workloads and exit")
    bench.add_argument("--repeat", type=int, default=10, help="interleaved repeats (default 10)")
    bench.add_argument("--threads", type=int, help="Numba threads (default: all cores)")
    bench.add_argument("--no-numpy", action="store_true", help="skip the NumPy baseline")
    bench.add_argument("--json", help="also write the results to this JSON file")
    bench.set_defaults(func=cmd_bench)
    onnx_cmd = sub.add_parser("onnx", help="time light-zoo models under onnx.reference, "
                              "with and without the normkernels ops (needs onnx)")
    onnx_cmd.add_argument("--model", action="append",
                          help="resnet50 (default), densenet121, inception_v2, shufflenet")
    onnx_cmd.add_argument("--repeat", type=int, default=3, help="interleaved repeats")
    onnx_cmd.set_defaults(func=cmd_onnx)
    sub.add_parser("info", help="versions, threads, cache").set_defaults(func=cmd_info)
    sub.add_parser("warmup", help="compile every kernel now").set_defaults(func=cmd_warmup)
    args = parser.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())

"""Per-call time of every operator and mode of the table on a small warm tensor
(1x16x8x8 for the per-channel and group families, 16x64 for the row families),
through the plain call and ``normkernels.bind``, beside onnxruntime with io-binding
(inputs and outputs bound once, as a latency-minded user runs it) and the NumPy
formula, in one process, interleaved (the numbers of issues 14 and 29).

    python benchmarks/tiny_calls.py [--shape 1,16,8,8] [--row-shape 16,64] [--layout NCX]
                               [--ops layernorm,rmsnorm] [--rounds 7]
"""

import argparse
import timeit

import numpy as np

import normkernels as nk
from normkernels.bench import peers, workloads
from normkernels.operators import OPERATORS

CASES = [(name, mode) for name, op in OPERATORS.items() for mode in op.modes]
ROW_FAMILIES = ("layer", "rms")


def ort_io_binding(workload, X, params):
    """onnxruntime with inputs and outputs bound once; None when unavailable."""
    try:
        return peers.onnxruntime_bound_peer(workload, X, params, 2)
    except peers.Unavailable:
        return None


def per_call_us(calls, rounds, number):
    best = {name: np.inf for name in calls}
    for _ in range(rounds):
        for name, fn in calls.items():
            fn()
            best[name] = min(best[name], timeit.timeit(fn, number=number) / number * 1e6)
    return best


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", default="1,16,8,8")
    parser.add_argument("--row-shape", default="16,64")
    parser.add_argument("--ops", default=None, help="records, comma-separated (default all)")
    parser.add_argument("--layout", default="NCX")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--number", type=int, default=2000)
    args = parser.parse_args()
    shapes = {False: tuple(int(v) for v in args.shape.split(",")),
              True: tuple(int(v) for v in args.row_shape.split(","))}
    wanted = None if args.ops is None else set(args.ops.split(","))
    print(f"per-call us, warm, shape {shapes[False]} (rows {shapes[True]}) {args.layout} "
          f"float32, out= given, best of {args.rounds} rounds of {args.number} calls")
    print(f"{'operator':32} {'normkernels':>11} {'nk.bind':>8} {'ort io-bind':>11} "
          f"{'numpy':>8} {'ort/nk':>7} {'ort/bind':>8} {'numpy/nk':>8}")
    for op, mode in CASES:
        record = OPERATORS[op]
        if "float32" not in record.dtypes or (wanted is not None and op not in wanted):
            continue
        layout = args.layout if args.layout in record.layouts else record.layouts[0]
        shape = shapes[record.family in ROW_FAMILIES]
        workload = workloads.custom_workload(op, mode, shape, "float32", layout)
        X, params = workloads.make_inputs(workload)
        out = np.empty_like(X)
        kwargs = record.kwargs(mode, layout, record.channel_count(X, workload.data_format))
        if record.takes_out:
            kwargs["out"] = out
        arguments = record.arguments(X, params, mode)
        if record.in_place:  # bound to copies of the inputs it writes (as the bench's calls)
            arguments, _ = record._writable(arguments, mode)
        function = getattr(nk, record.target(mode)[0])
        calls = {"nk": workloads.normkernels_call(workload, X, params, out),
                 "bound": nk.bind(function, *arguments, **kwargs),
                 "numpy": workloads.numpy_call(workload, X, params)}
        ort_call = ort_io_binding(workload, X, params)
        if ort_call is not None:
            calls["ort"] = ort_call
        t = per_call_us(calls, args.rounds, args.number)
        ort = t.get("ort", np.nan)
        print(f"{op + ' ' + mode:32} {t['nk']:11.2f} {t['bound']:8.2f} {ort:11.2f} "
              f"{t['numpy']:8.2f} {ort / t['nk']:7.2f} {ort / t['bound']:8.2f} "
              f"{t['numpy'] / t['nk']:8.2f}")


if __name__ == "__main__":
    main()

"""Serial against parallel per operator family and size, warm (the data for
SERIAL_MAX_ELEMENTS in docs/design.md). Each call goes through the spec layer with
its path forced, so both columns carry the same checks; their difference is the
path's.

    python benchmarks/thresholds.py [--layout NCX] [--rounds 5]
"""

import argparse
import timeit

import numpy as np

from normkernels.bench import workloads
from normkernels.operators import OPERATORS

FAMILIES = [("batchnorm", "inference"), ("batchnorm", "training"),
            ("instancenorm", "inference"), ("moments", "inference")]
SHAPES = [(1, 64, 8, 16), (1, 64, 16, 16), (1, 64, 16, 32), (1, 64, 32, 32), (1, 64, 32, 64),
          (1, 64, 64, 64), (2, 64, 64, 64)]


def _bound(record, X, params, mode, layout, out, path):
    return lambda: record.call(X, params, mode, layout, out, path=path)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layout", default="NCX")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    print(f"us per call, warm, float32 {args.layout}, best of {args.rounds} interleaved rounds")
    print(f"{'family':24} {'elements':>9} {'serial':>8} {'parallel':>9} {'par/ser':>8}")
    for op, mode in FAMILIES:
        record = OPERATORS[op]
        for shape in SHAPES:
            workload = workloads.custom_workload(op, mode, shape, "float32", args.layout)
            X, params = workloads.make_inputs(workload)
            out = None if record.reads_only else np.empty_like(X)
            calls = {path: _bound(record, X, params, mode, args.layout, out, path)
                     for path in ("serial", "parallel")}
            number = max(20, 2_000_000 // X.size)
            best = dict.fromkeys(calls, np.inf)
            for _ in range(args.rounds):
                for path, fn in calls.items():
                    fn()
                    best[path] = min(best[path], timeit.timeit(fn, number=number) / number)
            print(f"{op + ' ' + mode:24} {X.size:9d} {best['serial'] * 1e6:8.1f} "
                  f"{best['parallel'] * 1e6:9.1f} {best['parallel'] / best['serial']:8.2f}")


if __name__ == "__main__":
    main()

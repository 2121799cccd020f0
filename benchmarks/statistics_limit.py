"""How close the float64 statistics run to this machine's float64 adders (the numbers
in docs/design.md under "The statistics against the float64 adders").

The statistics are one pass over deviations from a shift: ``d = x - shift``,
``s1 += d``, ``s2 += d * d``, three float64 additions an element. This times, on one
thread, a loop of nothing but float64 additions (64-byte aligned: a split load costs
half as much again), the same per-element work as the statistics with LLVM free to
reorder it (``fastmath``: as many accumulators as it likes; the floor of this work),
the channels-last statistics kernel (``row_partials_serial``) and the row statistics
(``wide_span``), all on data in L1/L2.

    python benchmarks/statistics_limit.py
"""

import time

import numpy as np
from numba import njit

from normkernels.kernels import statistics


@njit(fastmath=True)
def _additions(x, reps):
    s = 0.0
    for _ in range(reps):
        for i in range(x.size):
            s += x[i]
    return s


@njit(fastmath=True)
def _deviation_sums(x, reps):
    s1 = 0.0
    s2 = 0.0
    for _ in range(reps):
        for i in range(x.size):
            d = np.float64(x[i]) - 0.5
            s1 += d
            s2 += d * d
    return s1 + s2


@njit
def _row_statistics(x, K, reps):
    total = 0.0
    for _ in range(reps):
        for r in range(x.size // K):
            mean, m2 = statistics.wide_span(x[r * K:(r + 1) * K])
            total += mean + m2
    return total


def best_seconds(fn, rounds=7):
    fn()
    best = np.inf
    for _ in range(rounds):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def main():
    rng = np.random.default_rng(0)
    base = np.ones(1024 + 8)
    lane = base[(-(base.ctypes.data // 8)) % 8:][:1024]  # 64-byte aligned
    reps = 20000
    per_add = best_seconds(lambda: _additions(lane, reps)) / (lane.size * reps) * 1e9
    print(f"float64 additions, vectorised, L1:        {per_add:.3f} ns an addition")
    print(f"three additions an element:               {3 * per_add:.3f} ns an element")
    small = rng.standard_normal(2048).astype(np.float32)
    t = best_seconds(lambda: _deviation_sums(small, 10000)) / (small.size * 10000) * 1e9
    print(f"the statistics' work, reordered freely:   {t:.3f} ns an element")
    R, P, rows = 4096, 320, 64
    x = rng.standard_normal(R * P).astype(np.float32)
    part = np.empty((R // rows, P)), np.empty((R // rows, P))
    t = best_seconds(lambda: statistics.row_partials_serial(x, P, R, rows, *part))
    print(f"row_partials_serial, (4096, 320) float32: {t / x.size * 1e9:.3f} ns an element")
    K, reps = 768, 20
    rows32 = rng.standard_normal(128 * K).astype(np.float32)
    t = best_seconds(lambda: _row_statistics(rows32, K, reps))
    print(f"wide_span, 128 rows of 768 float32:       {t / (rows32.size * reps) * 1e9:.3f} ns an "
          "element")


if __name__ == "__main__":
    main()

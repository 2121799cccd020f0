"""Store policy: warm and cold BN inference with NORMKERNELS_STREAMING=always against
auto (the numbers in docs/design.md under ``wants_streaming``).

    python benchmarks/stores.py
"""

import os
import time

import numpy as np

import normkernels as nk
from normkernels.bench.workloads import flusher

CASES = [((8, 64, 56, 56), "warm"), ((16, 64, 56, 56), "warm"), ((32, 64, 56, 56), "warm"),
         ((32, 64, 112, 112), "cold"), ((8, 64, 56, 56), "cold")]


def median_call_us(X, params, out, flush, calls):
    times = []
    for _ in range(calls):
        if flush:
            flush()
        start = time.perf_counter()
        nk.batch_normalization(X, *params, out=out)
        times.append(time.perf_counter() - start)
    return np.median(times) * 1e6


def compare(shape, caches, rounds=5):
    """Best of ``rounds`` medians per mode, the modes interleaved (a noisy machine)."""
    rng = np.random.default_rng(0)
    X = rng.normal(10.0, 2.0, shape).astype(np.float32)
    params = [rng.uniform(0.5, 1.5, shape[1]).astype(np.float32) for _ in range(4)]
    out = np.empty_like(X)
    flush = flusher() if caches == "cold" else None
    best = {}
    for _ in range(rounds):
        for mode in ("always", "auto"):
            os.environ["NORMKERNELS_STREAMING"] = mode
            nk.batch_normalization(X, *params, out=out)
            t = median_call_us(X, params, out, flush, 5 if flush else 30)
            best[mode] = min(best.get(mode, np.inf), t)
    return best


if __name__ == "__main__":
    print("| shape | caches | always streaming (us) | auto (us) | auto / always |")
    print("|---|---|---:|---:|---:|")
    for shape, caches in CASES:
        t = compare(shape, caches)
        print(f"| {shape} | {caches} | {t['always']:.1f} | {t['auto']:.1f} | "
              f"{t['auto'] / t['always']:.2f} |")

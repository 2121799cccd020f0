"""The timing harness of the benchmarks: how a set of calls is timed side by side.

Candidates (normkernels, its baselines and peers: :mod:`normkernels.bench.workloads`)
are timed with interleaved repeats (A B C, B C A, ...) and reported as medians, so a
shared, noisy machine shifts all of them together and the ratios hold; each timed
call starts from the same cache state, warm (right after an untimed call of itself)
or cold (right after a flush of the caches). :func:`max_relative_error` measures a
result against the float64 formula.
"""

import functools
import statistics
import time

import numpy as np

# Before each timed call of a large workload the harness writes this much scratch
# memory (well beyond any last-level cache), so every candidate starts from the same
# cold cache (see FLUSH_BYTES in docs/design.md).
FLUSH_BYTES = 256 << 20
# Unless told (``cache``), workloads below this many bytes of X are timed warm, called
# in a loop (per-call latency), with 50x the repeats; larger ones cold, after a flush.
SMALL_WORKLOAD_BYTES = 1 << 20
CACHE_STATES = ("warm", "cold")


class CacheFlusher:
    """Evicts the caches by writing a scratch buffer with all threads."""

    def __init__(self, nbytes=FLUSH_BYTES):
        from numba import njit, prange

        @njit(parallel=True, cache=True)
        def _touch(buf):
            for i in prange(buf.size):
                buf[i] += 1.0

        self._touch = _touch
        self._buf = np.zeros(nbytes // 8)

    def __call__(self):
        self._touch(self._buf)


def interleaved_medians(calls, repeat, warmup=1, budget_seconds=None, before_each=None,
                        touch=False):
    """Median seconds per call of each callable, timed in turn (A B C, B C A, C A B,
    ...); ``before_each`` (untimed) runs before every timed call, and with ``touch``
    each callable also runs once, untimed, right before its own timed call.

    The order rotates because position matters (see ``interleaved_medians`` in
    docs/design.md).
    """
    for _ in range(warmup):
        for fn in calls.values():
            fn()
    names = list(calls)
    times = {name: [] for name in names}
    start = time.perf_counter()
    for r in range(repeat):
        k = r % len(names)
        for name in names[k:] + names[:k]:
            if before_each is not None:
                before_each()
            if touch:
                calls[name]()
            t0 = time.perf_counter()
            calls[name]()
            times[name].append(time.perf_counter() - t0)
        if budget_seconds is not None and time.perf_counter() - start > budget_seconds:
            break
    return {name: statistics.median(ts) for name, ts in times.items()}


def max_relative_error(a, b, block=1 << 22):
    """max |a - b| / max(|b|, 1) (``b`` the float64 reference), a ``block`` of elements
    at a time along the first axis: a 100M-element check then holds no float64 copies
    of whole tensors."""
    a, b = np.asarray(a), np.asarray(b)
    if a.ndim == 0 or a.size <= block:
        a = a.astype(np.float64, copy=False)
        b = b.astype(np.float64, copy=False)
        scale = np.maximum(np.abs(b), 1.0)
        return float(np.max(np.abs(a - b) / scale)) if a.size else 0.0
    step = max(1, block * a.shape[0] // a.size)
    return max(max_relative_error(a[i:i + step], b[i:i + step], a.size)
               for i in range(0, a.shape[0], step))


@functools.cache
def flusher():
    """One scratch buffer for the whole run (allocated on first use)."""
    return CacheFlusher()


def cache_state(cache, nbytes):
    """The cache state to time in: ``cache`` when given, else warm below
    :data:`SMALL_WORKLOAD_BYTES` of X and cold above."""
    if cache is None:
        return "warm" if nbytes < SMALL_WORKLOAD_BYTES else "cold"
    if cache not in CACHE_STATES:
        raise ValueError(f"cache must be warm or cold, got {cache!r}")
    return cache


def timed_medians(calls, cache, repeat, warmup=1, budget_seconds=None):
    """:func:`interleaved_medians` in a cache state. Warm: each timed call comes right
    after an untimed call of itself (its inputs and output were just touched, as in a
    loop, whatever candidate ran before). Cold: right after a cache flush."""
    if cache == "warm":
        return interleaved_medians(calls, repeat, warmup, budget_seconds, touch=True)
    if cache == "cold":
        return interleaved_medians(calls, repeat, warmup, budget_seconds,
                                   before_each=flusher())
    raise ValueError(f"cache must be warm or cold, got {cache!r}")

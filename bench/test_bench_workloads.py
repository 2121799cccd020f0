"""pytest-benchmark cases, one group per workload of :data:`normkernels.benchmarks.WORKLOADS`.

Run: ``python -m pytest bench --benchmark-only --benchmark-group-by=group`` (CI:
``--benchmark-disable --tiny``, each case once at a small shape). Each group times
normkernels (with ``out=``), the parallel copy and read of the same bytes (the
roofline) and every installed peer (:mod:`normkernels.peers`; a missing one is
skipped with the reason) in the same session; ``extra_info`` carries GB/s (bytes of X
read + Y written, X only for moments). Caches are flushed before every round of large
workloads, as in ``normkernels bench``.
"""

import numba
import numpy as np
import pytest

from normkernels import benchmarks, peers

CANDIDATES = ["normkernels", "copy", "read", *peers.PEERS]


@pytest.mark.parametrize("candidate", CANDIDATES)
@pytest.mark.parametrize("workload", benchmarks.WORKLOADS, ids=lambda w: w.name)
def test_workload(benchmark, flush, sized, workload, candidate):
    workload = sized(workload)
    X, params = benchmarks.make_inputs(workload)
    out = np.empty_like(X)
    if candidate == "normkernels":
        fn = benchmarks.normkernels_call(workload, X, params, out)
    elif candidate in ("copy", "read"):
        fn = benchmarks.baseline_calls(X, out)[candidate]
    else:
        try:
            fn = peers.PEERS[candidate](workload, X, params, numba.get_num_threads())
        except peers.Unavailable as exc:
            pytest.skip(str(exc))
    fn()  # compile / load from cache, touch the output
    benchmark.group = workload.name
    small = X.nbytes < benchmarks.SMALL_WORKLOAD_BYTES
    slow = candidate in ("numpy", "onnx-ref")
    rounds = 200 if small else (3 if slow else 15)
    benchmark.pedantic(fn, rounds=rounds, iterations=1,
                       setup=None if small else flush, warmup_rounds=1)
    if benchmark.stats is not None:  # None under --benchmark-disable
        moved = (1 if workload.operator.reads_only else 2) * X.nbytes
        benchmark.extra_info["GB/s"] = moved / benchmark.stats["median"] / 1e9

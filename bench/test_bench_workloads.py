"""pytest-benchmark cases, one group per workload of :data:`normkernels.benchmarks.WORKLOADS`.

Run: ``python -m pytest bench --benchmark-group-by=group`` (add
``--benchmark-disable`` for a quick smoke run). Each group times normkernels (with
``out=``), the parallel copy of the same bytes (the roofline) and the NumPy formula in
the same session; ``extra_info`` carries GB/s (bytes of X read + Y written). Caches
are flushed before every round of large workloads, as in ``normkernels bench``.
"""

import numpy as np
import pytest

from normkernels import benchmarks

CANDIDATES = ["normkernels", "copy", "numpy"]


@pytest.fixture(scope="module")
def flush():
    return benchmarks.CacheFlusher()


@pytest.mark.parametrize("candidate", CANDIDATES)
@pytest.mark.parametrize("workload", benchmarks.WORKLOADS, ids=lambda w: w.name)
def test_workload(benchmark, flush, workload, candidate):
    X, params = benchmarks.make_inputs(workload)
    out = np.empty_like(X)
    if candidate == "normkernels":
        fn = benchmarks.normkernels_call(workload, X, params, out)
    elif candidate == "copy":
        fn = benchmarks.baseline_calls(X, out)["copy"]
    else:
        fn = benchmarks.numpy_call(workload, X, params)
    fn()  # compile / load from cache, touch the output
    benchmark.group = workload.name
    small = X.nbytes < (1 << 20)
    rounds = 200 if small else (3 if candidate == "numpy" else 15)
    benchmark.pedantic(fn, rounds=rounds, iterations=1,
                       setup=None if small else flush, warmup_rounds=1)
    if benchmark.stats is not None:  # None under --benchmark-disable
        moved = (1 if workload.op == "moments" else 2) * X.nbytes
        benchmark.extra_info["GB/s"] = moved / benchmark.stats["median"] / 1e9

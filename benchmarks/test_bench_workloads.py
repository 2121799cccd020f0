"""pytest-benchmark cases, one group per workload of :data:`normkernels.bench.workloads.WORKLOADS`.

Run: ``python -m pytest bench --benchmark-only --benchmark-group-by=group`` (CI:
``--benchmark-disable --tiny``, each case once at a small shape). Each group times
normkernels (with ``out=``), the parallel copy and read of the same bytes (the
roofline; for backward workloads also ``add``, dX = X + dY: two arrays read and one
written) and every installed peer (:mod:`normkernels.bench.peers`; a missing one is
skipped with the reason) in the same session; ``extra_info`` carries GB/s (bytes of X
read + Y written, X only for moments, X and dY read + dX written for backward; a
baseline's own bytes for a baseline). Caches are flushed before every round of large
workloads, as in ``normkernels bench``.

``test_backward_workload_is_checked`` runs every backward workload once at a small
shape and asserts normkernels' dX against the float64 formula and torch's dX (when
torch is installed) against normkernels'.
"""

import numba
import numpy as np
import pytest

from normkernels.bench import peers, workloads

CANDIDATES = ["normkernels", "copy", "read", *peers.PEERS]
BACKWARD = [w for w in workloads.WORKLOADS if w.mode == "backward"]


def _cases():
    """(workload, candidate): every candidate, and ``add`` (the roofline of a
    backward pass) for the backward workloads."""
    for w in workloads.WORKLOADS:
        extra = ["add"] if workloads.roofline(w) == "add" else []
        for candidate in [*CANDIDATES[:3], *extra, *CANDIDATES[3:]]:
            yield pytest.param(w, candidate, id=f"{w.name}-{candidate}")


@pytest.mark.parametrize("workload,candidate", list(_cases()))
def test_workload(benchmark, flush, sized, workload, candidate):
    workload = sized(workload)
    X, params = workloads.make_inputs(workload)
    out = np.empty_like(X)
    if candidate == "normkernels":
        fn = workloads.normkernels_call(workload, X, params, out)
    elif candidate in ("copy", "read", "add"):
        dY = params[0] if candidate == "add" else None
        fn = workloads.baseline_calls(X, out, dY)[candidate]
    else:
        try:
            fn = peers.PEERS[candidate](workload, X, params, numba.get_num_threads())
        except peers.Unavailable as exc:
            pytest.skip(str(exc))
    fn()  # compile / load from cache, touch the output
    benchmark.group = workload.name
    small = X.nbytes < workloads.SMALL_WORKLOAD_BYTES
    slow = candidate in ("numpy", "onnx-ref")
    rounds = 200 if small else (3 if slow else 15)
    benchmark.pedantic(fn, rounds=rounds, iterations=1,
                       setup=None if small else flush, warmup_rounds=1)
    if benchmark.stats is not None:  # None under --benchmark-disable
        moved = workloads.moved_bytes(workload, X, candidate)
        benchmark.extra_info["GB/s"] = moved / benchmark.stats["median"] / 1e9


# max relative error of dX against the float64 formula: a few roundings of X's dtype
# (normkernels rounds dX once); a wrong term of the formula is off by O(1)
BACKWARD_TOLERANCE = {"float32": 1e-5, "float16": 4e-3, "bfloat16": 3e-2}


@pytest.mark.parametrize("workload", BACKWARD, ids=lambda w: w.name)
def test_backward_workload_is_checked(small, workload):
    """One run of a backward workload at a small shape (its rank, dtype, layout and
    operator): normkernels' dX matches the float64 formula; torch's dX agrees with it
    when torch is installed; the ONNX peers skip it."""
    w = small(workload)
    result = workloads.run_workload(w, repeat=1, warmup=0, peers=list(peers.PEERS))
    tol = BACKWARD_TOLERANCE[w.dtype]
    assert result["max_rel_err"]["normkernels"] < tol
    assert result["roofline"] == "add"
    assert result["bytes"] == 3 * np.prod(w.shape) * np.dtype(workloads.DTYPES[w.dtype]).itemsize
    assert ("over_inference" in result) == (w.mode in w.operator.over_inference)
    for peer in ("onnx-ref", "onnxruntime", "openvino"):
        assert "no ONNX operator for a backward pass" in result["skipped"][peer]
    if "torch" in result["skipped"]:
        pytest.importorskip("torch")  # installed: it must not have been skipped
        raise AssertionError(result["skipped"]["torch"])
    assert result["agreement"]["torch"] < tol

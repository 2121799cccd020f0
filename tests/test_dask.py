"""normkernels.dask against single-machine normkernels and the float64 oracle, over
chunkings (whole, size-1, uneven, the channel axis split), dtypes and layouts, with
the threaded scheduler and on a two-process dask.distributed LocalCluster.

The bounds are the README's ("Scaling out with Dask"): inference bitwise equal to
single-machine normkernels; statistics within README_STATS_RTOL of single-machine
ones (only the order of float64 merges differs); everything within the oracle's
error model (tests/oracle.py)."""

import numpy as np
import pytest
from arrays import assert_identical
from oracle import (
    assert_close,
    batch_norm_training,
    batch_statistics,
    instance_norm,
    instance_tolerance,
    rounded_statistic_tolerance,
    statistics_tolerance,
    training_tolerance,
)

da = pytest.importorskip("dask.array", reason="dask not installed")

import normkernels as nk  # noqa: E402
from normkernels import dask as nkd  # noqa: E402

F16, F32, F64 = np.dtype(np.float16), np.dtype(np.float32), np.dtype(np.float64)
EPS = 1e-5
SHAPE = (6, 5, 7, 9)  # NCX
CHUNKINGS = {"whole": SHAPE, "sample": (1, 5, 7, 9), "uneven": (4, 2, 3, 5),
             "ones": (1, 1, 1, 1), "channels": (6, 2, 7, 9)}
# The README: dask's statistics differ from single-machine normkernels' only in the
# order of the float64 merges: within 1e-13 (float32/float64 X) or 1e-6 (16-bit X)
# of the variance and of |mean| + std for the mean
README_STATS_RTOL = {F16: 1e-6, F32: 1e-13, F64: 1e-13}
# ... plus 2**-53 |mean| std on the variance for every dtype: merges of partial means
# round mean-sized numbers (measured 2.2e-12 relative at mean / std = 1e6)
README_STATS_OFFSET = 2.0**-53


def expect_same_statistics(mean, var, mean0, var0, x_dtype):
    """dask's per-channel mean and variance against single-machine normkernels', within
    the README's relative bound. A mean is taken relative to |mean| + std: a mean near
    0 has no relative accuracy of its own (its rounding errors scale with the spread
    of the data, as in oracle.statistics_tolerance)."""
    rtol = README_STATS_RTOL[np.dtype(x_dtype)]
    m0, v0 = np.asarray(mean0, F64), np.asarray(var0, F64)
    assert_close(mean, m0, rtol * (np.abs(m0) + np.sqrt(v0)), "mean against single-machine")
    assert_close(var, v0, rtol * np.abs(v0) + README_STATS_OFFSET * np.abs(m0) * np.sqrt(v0),
                 "variance against single-machine")


def expect_oracle_statistics(mean, var, X, fmt, exact=None):
    """Mean and variance within the stated accuracy of the kernels' statistics
    (oracle.statistics_tolerance), then one rounding to their dtype."""
    exact_mean, exact_var = batch_statistics(X, fmt) if exact is None else exact
    d_mean, d_var = statistics_tolerance(exact_mean, exact_var, X.dtype)
    assert_close(mean, exact_mean, rounded_statistic_tolerance(exact_mean, mean.dtype, d_mean),
                 "mean against the oracle")
    assert_close(var, exact_var, rounded_statistic_tolerance(exact_var, var.dtype, d_var),
                 "variance against the oracle")


def expect_training_close(Y, running_mean, running_var, X, p, momentum, fmt):
    """Training outputs against the oracle: Y within training_tolerance, the running
    statistics within the statistics' error (weighted by 1 - momentum) and one
    rounding to their dtype."""
    exact_Y, exact_rm, exact_rv, mean, var = batch_norm_training(X, *p, EPS, momentum, fmt)
    assert_close(Y, exact_Y, training_tolerance(X, p[0], p[1], mean, var, EPS, fmt))
    d_mean, d_var = statistics_tolerance(mean, var, X.dtype)
    assert_close(running_mean, exact_rm, rounded_statistic_tolerance(
        exact_rm, running_mean.dtype, (1 - momentum) * d_mean), "running_mean")
    assert_close(running_var, exact_rv, rounded_statistic_tolerance(
        exact_rv, running_var.dtype, (1 - momentum) * d_var), "running_var")


def expect_instance_close(Y, X, s, b, fmt):
    exact, mean, var = instance_norm(X, s, b, EPS, fmt)
    assert_close(Y, exact, instance_tolerance(X, s, b, mean, var, EPS, fmt, Y.dtype))


def layout(X, fmt):
    return X if fmt == "NCX" else np.ascontiguousarray(np.moveaxis(X, 1, -1))


def chunks_for(fmt, chunks):
    return chunks if fmt == "NCX" else (chunks[0], *chunks[2:], chunks[1])


def data(rng, dtype, fmt, mean=0.0):
    X = layout((rng.standard_normal(SHAPE) * 2 + mean).astype(dtype), fmt)
    p = [rng.uniform(0.5, 2, 5).astype(F32) for _ in range(4)]
    return X, p


@pytest.mark.parametrize("fmt", ["NCX", "NXC"])
@pytest.mark.parametrize("dtype", [F16, F32, F64], ids=["float16", "float32", "float64"])
@pytest.mark.parametrize("chunking", list(CHUNKINGS))
def test_moments_match_single_machine(rng, dtype, fmt, chunking):
    X, _ = data(rng, dtype, fmt, mean=1e3 if dtype != F16 else 0.0)
    Xd = da.from_array(X, chunks=chunks_for(fmt, CHUNKINGS[chunking]))
    mean, var = (v.compute() for v in nkd.moments(Xd, data_format=fmt))
    mean0, var0 = nk.moments(X, data_format=fmt)
    assert mean.dtype == mean0.dtype and var.dtype == var0.dtype
    expect_same_statistics(mean, var, mean0, var0, dtype)
    exact = batch_statistics(X, fmt)
    expect_oracle_statistics(mean, var, X, fmt, exact)
    expect_oracle_statistics(mean0, var0, X, fmt, exact)
    # the float64 partials themselves (16-bit X's moments are rounded to float32)
    count, part_mean, m2 = (v.compute() for v in nkd.partial_moments(Xd, data_format=fmt))
    part = nk.partial_moments(X, data_format=fmt)
    assert (count == X.size // 5).all()
    np.testing.assert_array_equal(count, part.count)
    expect_same_statistics(part_mean, m2 / count, part.mean, part.M2 / part.count, dtype)


@pytest.mark.parametrize("fmt", ["NCX", "NXC"])
@pytest.mark.parametrize("chunking", list(CHUNKINGS))
def test_inference_is_bitwise_single_machine(rng, fmt, chunking):
    X, p = data(rng, F32, fmt)
    Xd = da.from_array(X, chunks=chunks_for(fmt, CHUNKINGS[chunking]))
    assert_identical(nkd.batch_normalization(Xd, *p, data_format=fmt).compute(),
                     nk.batch_normalization(X, *p, data_format=fmt))
    g = [v.astype(F32) for v in p]
    assert_identical(nkd.batch_norm_inference(Xd, *g, epsilon=1e-3, data_format=fmt).compute(),
                     nk.batch_norm_inference(X, *g, epsilon=1e-3, data_format=fmt))


@pytest.mark.parametrize("fmt", ["NCX", "NXC"])
@pytest.mark.parametrize("dtype", [F16, F32, F64], ids=["float16", "float32", "float64"])
@pytest.mark.parametrize("chunking", ["sample", "uneven", "ones"])
def test_training_matches_single_machine_and_oracle(rng, dtype, fmt, chunking):
    X, p = data(rng, dtype, fmt, mean=3.0)
    Xd = da.from_array(X, chunks=chunks_for(fmt, CHUNKINGS[chunking]))
    Y, rm, rv = (v.compute() for v in nkd.batch_normalization(
        Xd, *p, training_mode=1, momentum=0.8, data_format=fmt))
    Y0, rm0, rv0 = nk.batch_normalization(X, *p, training_mode=1, momentum=0.8,
                                          data_format=fmt)
    assert Y.dtype == Y0.dtype and rm.dtype == rm0.dtype and rv.dtype == rv0.dtype
    expect_training_close(Y, rm, rv, X, p, 0.8, fmt)
    expect_training_close(Y0, rm0, rv0, X, p, 0.8, fmt)
    # momentum 0 with float64 running statistics: they are then the batch statistics
    # themselves (input * 0 + batch * 1 is exact), held to the README's bound
    p64 = [p[0], p[1], p[2].astype(F64), p[3].astype(F64)]
    _, mean, var = (v.compute() for v in nkd.batch_normalization(
        Xd, *p64, training_mode=1, momentum=0.0, data_format=fmt))
    _, mean0, var0 = nk.batch_normalization(X, *p64, training_mode=1, momentum=0.0,
                                            data_format=fmt)
    expect_same_statistics(mean, var, mean0, var0, dtype)
    exact = batch_statistics(X, fmt)
    expect_oracle_statistics(mean, var, X, fmt, exact)
    expect_oracle_statistics(mean0, var0, X, fmt, exact)


@pytest.mark.parametrize("fmt", ["NCX", "NXC"])
@pytest.mark.parametrize("dtype", [F16, F32], ids=["float16", "float32"])
@pytest.mark.parametrize("chunking", list(CHUNKINGS))
def test_instance_normalization_matches(rng, dtype, fmt, chunking):
    X, p = data(rng, dtype, fmt, mean=-2.0)
    s, b = p[0].astype(dtype), p[1].astype(dtype)
    Xd = da.from_array(X, chunks=chunks_for(fmt, CHUNKINGS[chunking]))
    Y = nkd.instance_normalization(Xd, s, b, data_format=fmt).compute()
    Y0 = nk.instance_normalization(X, s, b, data_format=fmt)
    assert Y.dtype == Y0.dtype == dtype
    expect_instance_close(Y, X, s, b, fmt)
    expect_instance_close(Y0, X, s, b, fmt)


def test_results_are_lazy_and_errors_are_clear(rng):
    X, p = data(rng, F32, "NCX")
    Xd = da.from_array(X, chunks=(2, 5, 7, 9))
    Y, rm, _rv = nkd.batch_normalization(Xd, *p, training_mode=1)
    assert isinstance(Y, da.Array) and isinstance(rm, da.Array)
    with pytest.raises(TypeError, match=r"dask\.array\.Array"):
        nkd.moments(X)
    with pytest.raises(NotImplementedError, match="opsets 14 and 15"):
        nkd.batch_normalization(Xd, *p, opset=9)
    with pytest.raises(ValueError, match="opset must be an integer"):
        nkd.batch_normalization(Xd, *p, opset="15")
    assert_identical(nkd.batch_normalization(Xd, *p, opset=np.int64(15)).compute(),
                     nk.batch_normalization(X, *p))
    with pytest.raises(ValueError, match=r"shape \(5,\)"):
        nkd.batch_normalization(Xd, p[0][:4], *p[1:])
    with pytest.raises(ValueError, match="epsilon must be finite"):
        nkd.batch_normalization(Xd, *p, epsilon=float("nan"))
    with pytest.raises(TypeError, match="int32"):
        nkd.instance_normalization(da.from_array(X.astype("int32")), p[0], p[1])


@pytest.mark.slow
def test_on_a_two_process_local_cluster(rng):
    distributed = pytest.importorskip("distributed", reason="distributed not installed")
    X, p = data(rng, F32, "NCX", mean=5.0)
    Xd = da.from_array(X, chunks=(2, 3, 7, 5))
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                                  dashboard_address=None) as cluster, \
            distributed.Client(cluster) as client:
        Y, rm, rv = client.compute(nkd.batch_normalization(Xd, *p, training_mode=1),
                                   sync=True)
        mean, var = client.compute(nkd.moments(Xd), sync=True)
        Z = client.compute(nkd.instance_normalization(Xd, p[0], p[1]), sync=True)
    expect_training_close(Y, rm, rv, X, p, 0.9, "NCX")
    mean0, var0 = nk.moments(X)
    expect_same_statistics(mean, var, mean0, var0, F32)
    expect_oracle_statistics(mean, var, X, "NCX")
    expect_instance_close(Z, X, p[0], p[1], "NCX")


@pytest.mark.parametrize("training", [0, 1])
def test_out_and_eager_statistics(rng, training):
    X, p = data(rng, F32, "NCX", mean=1.0)
    Xd = da.from_array(X, chunks=(2, 3, 7, 9))
    expected = nk.batch_normalization(X, *p, training_mode=training)
    out = np.full_like(X, np.nan)
    got = nkd.batch_normalization(Xd, *p, training_mode=training, out=out)
    if training:
        assert got[0] is out
        expect_training_close(*got, X, p, 0.9, "NCX")
        lazy = [v.compute() for v in nkd.batch_normalization(Xd, *p, training_mode=1,
                                                              compute_statistics=True)]
        expect_training_close(*lazy, X, p, 0.9, "NCX")
        for a, b in zip(got, lazy, strict=True):  # the same reduction, the same kernels
            assert_identical(a, b)
    else:
        assert got is out
        assert_identical(out, expected)
    with pytest.raises(ValueError, match="out must be a NumPy array"):
        nkd.batch_normalization(Xd, *p, training_mode=training, out=np.empty(3, F32))
    Z = nkd.instance_normalization(Xd, p[0], p[1], compute_statistics=True).compute()
    expect_instance_close(Z, X, p[0], p[1], "NCX")

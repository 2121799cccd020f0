"""normkernels.dask against single-machine normkernels and the float64 oracle, over
chunkings (whole, size-1, uneven, the channel axis split), dtypes and layouts, with
the threaded scheduler and on a two-process dask.distributed LocalCluster."""

import numpy as np
import pytest
from arrays import assert_identical
from oracle import batch_norm_training, batch_statistics, instance_norm

da = pytest.importorskip("dask.array", reason="dask not installed")

import normkernels as nk  # noqa: E402
from normkernels import dask as nkd  # noqa: E402

F16, F32, F64 = np.dtype(np.float16), np.dtype(np.float32), np.dtype(np.float64)
SHAPE = (6, 5, 7, 9)  # NCX
CHUNKINGS = {"whole": SHAPE, "sample": (1, 5, 7, 9), "uneven": (4, 2, 3, 5),
             "ones": (1, 1, 1, 1), "channels": (6, 2, 7, 9)}
STATS_RTOL = {F16: 1e-6, F32: 1e-13, F64: 1e-13}


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
    np.testing.assert_allclose(var, var0, rtol=STATS_RTOL[dtype])
    np.testing.assert_allclose(mean, mean0, rtol=STATS_RTOL[dtype],
                               atol=10 * STATS_RTOL[dtype])  # means near 0, std 2
    _exact_mean, exact_var = batch_statistics(X, fmt)
    np.testing.assert_allclose(var, exact_var, rtol=max(STATS_RTOL[dtype], 1e-12))
    count, _, _ = nkd.partial_moments(Xd, data_format=fmt)
    assert (count.compute() == X.size // 5).all()


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
    assert Y.dtype == Y0.dtype and rm.dtype == rm0.dtype
    tol = 2e-3 if dtype == F16 else 1e-5
    np.testing.assert_allclose(Y.astype(F64), Y0.astype(F64), rtol=tol, atol=tol)
    np.testing.assert_allclose(rm, rm0, rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(rv, rv0, rtol=1e-6)
    exact = batch_norm_training(X, *p, 1e-5, 0.8, fmt)
    np.testing.assert_allclose(Y.astype(F64), exact[0], rtol=tol, atol=tol)


@pytest.mark.parametrize("fmt", ["NCX", "NXC"])
@pytest.mark.parametrize("dtype", [F16, F32], ids=["float16", "float32"])
@pytest.mark.parametrize("chunking", list(CHUNKINGS))
def test_instance_normalization_matches(rng, dtype, fmt, chunking):
    X, p = data(rng, dtype, fmt, mean=-2.0)
    s, b = p[0].astype(dtype), p[1].astype(dtype)
    Xd = da.from_array(X, chunks=chunks_for(fmt, CHUNKINGS[chunking]))
    Y = nkd.instance_normalization(Xd, s, b, data_format=fmt).compute()
    Y0 = nk.instance_normalization(X, s, b, data_format=fmt)
    tol = 2e-3 if dtype == F16 else 1e-5
    np.testing.assert_allclose(Y.astype(F64), Y0.astype(F64), rtol=tol, atol=tol)
    np.testing.assert_allclose(Y.astype(F64), instance_norm(X, s, b, 1e-5, fmt)[0], rtol=tol,
                               atol=tol)


def test_results_are_lazy_and_errors_are_clear(rng):
    X, p = data(rng, F32, "NCX")
    Xd = da.from_array(X, chunks=(2, 5, 7, 9))
    Y, rm, _rv = nkd.batch_normalization(Xd, *p, training_mode=1)
    assert isinstance(Y, da.Array) and isinstance(rm, da.Array)
    with pytest.raises(TypeError, match=r"dask\.array\.Array"):
        nkd.moments(X)
    with pytest.raises(NotImplementedError, match="opsets 14 and 15"):
        nkd.batch_normalization(Xd, *p, opset=9)
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
        Y, _rm, rv = client.compute(nkd.batch_normalization(Xd, *p, training_mode=1),
                                    sync=True)
        _mean, var = client.compute(nkd.moments(Xd), sync=True)
        Z = client.compute(nkd.instance_normalization(Xd, p[0], p[1]), sync=True)
    Y0, _rm0, rv0 = nk.batch_normalization(X, *p, training_mode=1)
    np.testing.assert_allclose(Y, Y0, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(rv, rv0, rtol=1e-6)
    np.testing.assert_allclose(var, nk.moments(X)[1], rtol=1e-13)
    np.testing.assert_allclose(Z, nk.instance_normalization(X, p[0], p[1]), rtol=1e-5,
                               atol=1e-5)


@pytest.mark.parametrize("training", [0, 1])
def test_out_and_eager_statistics(rng, training):
    X, p = data(rng, F32, "NCX", mean=1.0)
    Xd = da.from_array(X, chunks=(2, 3, 7, 9))
    expected = nk.batch_normalization(X, *p, training_mode=training)
    out = np.full_like(X, np.nan)
    got = nkd.batch_normalization(Xd, *p, training_mode=training, out=out)
    if training:
        assert got[0] is out
        lazy = nkd.batch_normalization(Xd, *p, training_mode=1, compute_statistics=True)
        np.testing.assert_allclose(lazy[0].compute(), expected[0], rtol=1e-5, atol=1e-5)
        for a, b in zip(got, expected, strict=True):
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)
    else:
        assert got is out
        assert_identical(out, expected)
    with pytest.raises(ValueError, match="out must be a NumPy array"):
        nkd.batch_normalization(Xd, *p, training_mode=training, out=np.empty(3, F32))
    Z = nkd.instance_normalization(Xd, p[0], p[1], compute_statistics=True)
    np.testing.assert_allclose(Z.compute(), nk.instance_normalization(X, p[0], p[1]),
                               rtol=1e-5, atol=1e-5)

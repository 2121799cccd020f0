"""normkernels.dask against single-machine normkernels and the float64 oracle, over
chunkings (whole, size-1, uneven, the channel axis split; for the row normalizations
the leading and/or the normalized axes split), dtypes and layouts, with the threaded
scheduler and on a two-process dask.distributed LocalCluster.

The bounds are the user guide's (docs/guide/dask.md): inference bitwise equal to
single-machine normkernels; statistics within GUIDE_STATS_RTOL of single-machine
ones (only the order of float64 merges differs); everything within the oracle's
error model (tests/oracle.py)."""

import numpy as np
import pytest
from arrays import BFLOAT16, assert_identical
from oracle import (
    assert_close,
    batch_norm_training,
    batch_statistics,
    instance_norm,
    instance_tolerance,
    rounded_statistic_tolerance,
    row_norm,
    row_tolerance,
    statistics_tolerance,
    tolerance,
    training_tolerance,
)

da = pytest.importorskip("dask.array", reason="dask not installed")

import dask  # noqa: E402

import normkernels as nk  # noqa: E402
from normkernels import dask as nkd  # noqa: E402
from normkernels.engine.numba_engine import ENGINE  # noqa: E402
from normkernels.ops import rows  # noqa: E402

F16, F32, F64 = np.dtype(np.float16), np.dtype(np.float32), np.dtype(np.float64)
EPS = 1e-5
SHAPE = (6, 5, 7, 9)  # NCX
CHUNKINGS = {"whole": SHAPE, "sample": (1, 5, 7, 9), "uneven": (4, 2, 3, 5),
             "ones": (1, 1, 1, 1), "channels": (6, 2, 7, 9)}
# The guide: dask's statistics differ from single-machine normkernels' only in the
# order of the float64 merges: within 1e-13 (float32/float64 X) or 1e-6 (16-bit X)
# of the variance and of |mean| + std for the mean
GUIDE_STATS_RTOL = {F16: 1e-6, F32: 1e-13, F64: 1e-13}
# ... plus 2**-53 |mean| std on the variance for every dtype: merges of partial means
# round mean-sized numbers (measured 2.2e-12 relative at mean / std = 1e6)
GUIDE_STATS_OFFSET = 2.0**-53


def expect_same_statistics(mean, var, mean0, var0, x_dtype):
    """dask's per-channel mean and variance against single-machine normkernels', within
    the guide's relative bound. A mean is taken relative to |mean| + std: a mean near
    0 has no relative accuracy of its own (its rounding errors scale with the spread
    of the data, as in oracle.statistics_tolerance)."""
    rtol = GUIDE_STATS_RTOL[np.dtype(x_dtype)]
    m0, v0 = np.asarray(mean0, F64), np.asarray(var0, F64)
    assert_close(mean, m0, rtol * (np.abs(m0) + np.sqrt(v0)), "mean against single-machine")
    assert_close(var, v0, rtol * np.abs(v0) + GUIDE_STATS_OFFSET * np.abs(m0) * np.sqrt(v0),
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
    # themselves (input * 0 + batch * 1 is exact), held to the guide's bound
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
        S, B = (v.reshape(1, 7, 1).astype(F32) for v in (X[0, 0, :, :1], X[1, 1, :, :1]))
        W, w_mean, w_inv = client.compute(nkd.layer_normalization(Xd, S, B, axis=1,
                                                                   num_outputs=3), sync=True)
        V = client.compute(nkd.rms_normalization(Xd, S, axis=2), sync=True)
    expect_training_close(Y, rm, rv, X, p, 0.9, "NCX")
    mean0, var0 = nk.moments(X)
    expect_same_statistics(mean, var, mean0, var0, F32)
    expect_oracle_statistics(mean, var, X, "NCX")
    expect_instance_close(Z, X, p[0], p[1], "NCX")
    w, row_mean, row_var = row_norm(X, S, B, EPS, 1)
    assert_close(W, w, row_tolerance(X, S, B, row_mean, row_var, EPS, F32))
    expect_row_statistics_close(X, 1, w_mean, w_inv, row_mean, row_var)
    v, zero, ms = row_norm(X, S, None, EPS, 2, centered=False)
    assert_close(V, v, row_tolerance(X, S, None, zero, ms, EPS, F32, centered=False))


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


# --- row normalizations (LayerNormalization, RMSNormalization) ---

BF16 = BFLOAT16
DTYPES = [F16, BF16, F32, F64]
DTYPE_IDS = ["float16", "bfloat16", "float32", "float64"]
GUIDE_STATS_RTOL[BF16] = 1e-6
# (X's shape, axis): the last axis of 3-D X, two normalized axes of 4-D X
ROW_CASES = {"3d-last": ((4, 9, 11), -1), "4d-axis2": ((3, 4, 5, 6), 2)}
ROW_CHUNKINGS = ["whole", "leading", "rows", "both"]


def row_chunks(shape, a, chunking):
    """X's chunks: the leading axes (< a) and/or the normalized axes split unevenly."""
    split = {"whole": (), "leading": ("lead",), "rows": ("rows",),
             "both": ("lead", "rows")}[chunking]
    return tuple(d // 2 + 1 if ("lead" if i < a else "rows") in split else d
                 for i, d in enumerate(shape))


def row_data(rng, shape, a, dtype, offset=0.0, param_dtype=None):
    """X with rows around ``offset``, and Scale, B of the normalized shape."""
    X = (rng.standard_normal(shape) * 2 + offset).astype(dtype)
    pd = dtype if param_dtype is None else param_dtype
    S = rng.uniform(0.5, 2, shape[a:]).astype(pd)
    B = rng.uniform(-1, 1, shape[a:]).astype(pd)
    return X, S, B


class GivenStatistics:
    """An engine whose row normalization uses given float64 statistics: through
    normkernels' own row layer (ops.rows.normalize), this is what single-machine
    normkernels gives with those statistics."""

    def __init__(self, mean, var):
        self.mean, self.var = np.ravel(mean).astype(F64), np.ravel(var).astype(F64)

    def normalize_rows(self, x, y, scale, B, epsilon, centered, path=None, **skip):
        ENGINE.rows_from_statistics(x, y, scale, B, epsilon, centered, self.mean, self.var)
        return self.mean, self.var


def with_statistics(X, a, scale, B, mean, var, centered, out_dtype=None):
    """Single-machine normkernels' Y of X from given per-row statistics."""
    Y, _, _ = rows.normalize(X, a, scale, B, EPS, centered, GivenStatistics(mean, var),
                             out_dtype=out_dtype)
    return Y


def expect_same_row_statistics(mean, inv, mean0, inv0, dtype):
    """Per-row float64 Mean and InvStdDev against single-machine normkernels', within
    the guide's bound on the statistics (the variance's error moves 1 / sqrt(var +
    eps) by half as much, relatively)."""
    rtol = GUIDE_STATS_RTOL[np.dtype(dtype)]
    var0 = 1 / inv0.astype(F64) ** 2 - EPS
    std0 = np.sqrt(np.maximum(var0, 0))
    assert_close(mean, mean0, rtol * (np.abs(mean0) + std0), "Mean against single-machine")
    d_var = rtol * var0 + GUIDE_STATS_OFFSET * np.abs(mean0) * std0
    assert_close(inv, inv0, 1.01 * inv0 * d_var / (2 * (var0 + EPS)) + 4 * 2.0**-53 * inv0,
                 "InvStdDev against single-machine")


def expect_row_statistics_close(X, a, mean_out, inv_out, mean, var):
    """Mean and InvStdDev against the oracle's float64 statistics (keepdims)."""
    d_mean, d_var = statistics_tolerance(mean, var, X.dtype)
    inv = 1 / np.sqrt(var + EPS)
    assert_close(mean_out, mean, rounded_statistic_tolerance(mean, mean_out.dtype, d_mean),
                 "Mean against the oracle")
    assert_close(inv_out, inv, rounded_statistic_tolerance(
        inv, inv_out.dtype, inv * d_var / (var + EPS)), "InvStdDev against the oracle")


@pytest.mark.parametrize("chunking", ROW_CHUNKINGS)
@pytest.mark.parametrize("case", list(ROW_CASES))
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_layer_normalization_matches(rng, dtype, case, chunking):
    shape, axis = ROW_CASES[case]
    a = axis % len(shape)
    offset = 1e4 if dtype.itemsize >= 4 else 3.0  # |mean| 1e4 rows where X holds them
    X, S, B = row_data(rng, shape, a, dtype, offset)
    Xd = da.from_array(X, chunks=row_chunks(shape, a, chunking))
    Y, mean_out, inv_out = nkd.layer_normalization(Xd, S, B, axis=axis, num_outputs=3,
                                                   stash_type=11)
    assert all(isinstance(v, da.Array) for v in (Y, mean_out, inv_out))
    Y, mean_out, inv_out = dask.compute(Y, mean_out, inv_out)
    Y0, mean0, inv0 = nk.layer_normalization(X, S, B, axis=axis, num_outputs=3, stash_type=11)
    y, mean, var = row_norm(X, S, B, EPS, a)
    assert_close(Y, y, row_tolerance(X, S, B, mean, var, EPS, dtype))
    expect_row_statistics_close(X, a, mean_out, inv_out, mean, var)
    if chunking in ("whole", "leading"):  # whole rows: blockwise through normkernels
        for got, expected in zip((Y, mean_out, inv_out), (Y0, mean0, inv0), strict=True):
            assert_identical(got, expected)
        return
    assert Y.dtype == dtype and mean_out.shape == inv_out.shape == mean0.shape
    expect_same_row_statistics(mean_out, inv_out, mean0, inv0, dtype)
    # Y is what normkernels gives with the merged statistics, bit for bit
    m, v = dask.compute(*nkd.row_moments(Xd, axis=axis))
    assert_identical(m, mean_out)
    assert_identical(Y, with_statistics(X, a, S, B, m, v, True))
    # default stash type: the same statistics rounded once to float32
    _, mean32, inv32 = dask.compute(*nkd.layer_normalization(Xd, S, B, axis=axis,
                                                             num_outputs=3))
    assert_identical(mean32, m.astype(F32))
    assert_identical(inv32, (1 / np.sqrt(v + EPS)).astype(F32))


RMS_DTYPES = [(F32, F32), (F16, F16), (BF16, BF16), (F64, F64), (F16, F32), (F32, F64)]


@pytest.mark.parametrize("chunking", ROW_CHUNKINGS)
@pytest.mark.parametrize("case", list(ROW_CASES))
@pytest.mark.parametrize("dtypes", RMS_DTYPES,
                         ids=[f"{x.name}-{s.name}" for x, s in RMS_DTYPES])
def test_rms_normalization_matches(rng, dtypes, case, chunking):
    x_dtype, s_dtype = dtypes
    shape, axis = ROW_CASES[case]
    a = axis % len(shape)
    X, S, _ = row_data(rng, shape, a, x_dtype, 1.0, s_dtype)
    Xd = da.from_array(X, chunks=row_chunks(shape, a, chunking))
    Y = nkd.rms_normalization(Xd, S, axis=axis).compute()
    Y0 = nk.rms_normalization(X, S, axis=axis)
    y, mean, var = row_norm(X, S, None, EPS, a, centered=False)
    assert_close(Y, y, row_tolerance(X, S, None, mean, var, EPS, s_dtype, centered=False))
    if chunking in ("whole", "leading"):
        assert_identical(Y, Y0)
        return
    assert Y.dtype == s_dtype
    m, ms = dask.compute(*nkd.row_moments(Xd, axis=axis, centered=False))
    assert not m.any()
    assert_close(ms, var, GUIDE_STATS_RTOL[x_dtype] * var, "mean square against the oracle")
    assert_identical(Y, with_statistics(X, a, S, None, m, ms, False, s_dtype))


@pytest.mark.parametrize("chunking", ROW_CHUNKINGS)
def test_row_parameters_along_leading_axes_and_lazy(rng, chunking):
    """Scale and B that also vary along the leading axes (the NumPy functions' general
    path), and dask parameters."""
    shape, a = (3, 4, 5, 6), 2
    X = (rng.standard_normal(shape) * 3 - 2).astype(F32)
    S = rng.uniform(0.5, 2, (3, 1, 5, 6)).astype(F32)  # varies along axis 0
    B = rng.uniform(-1, 1, (4, 1, 1)).astype(F32)  # along axis 1
    chunks = row_chunks(shape, a, chunking)
    Xd = da.from_array(X, chunks=chunks)
    Y, mean_out, inv_out = dask.compute(*nkd.layer_normalization(Xd, S, B, axis=a,
                                                                 num_outputs=3))
    y, mean, var = row_norm(X, S, B, EPS, a)
    assert_close(Y, y, row_tolerance(X, S, B, mean, var, EPS, F32))
    expect_row_statistics_close(X, a, mean_out, inv_out, mean, var)
    Z = nkd.rms_normalization(Xd, S.astype(F64), axis=a).compute()
    z, _, ms = row_norm(X, S, None, EPS, a, centered=False)
    assert_close(Z, z, row_tolerance(X, S, None, mean, ms, EPS, F64, centered=False))
    if chunking in ("whole", "leading"):
        assert_identical(Y, nk.layer_normalization(X, S, B, axis=a))
        assert_identical(Z, nk.rms_normalization(X, S.astype(F64), axis=a))
    else:
        m, v = dask.compute(*nkd.row_moments(Xd, axis=a))
        assert_identical(Y, with_statistics(X, a, S, B, m, v, True))
    # parameters as dask arrays (chunked their own way): the same bits
    Sd, Bd = da.from_array(S, chunks=(2, 1, 2, 4)), da.from_array(B, chunks=(3, 1, 1))
    assert_identical(nkd.layer_normalization(Xd, Sd, Bd, axis=a).compute(), Y)
    cols = rng.uniform(0.5, 2, (1, 5, 6)).astype(F32)  # leading 1s: per column
    got = nkd.layer_normalization(Xd, da.from_array(cols, chunks=(1, 3, 2)), axis=a)
    assert_identical(got.compute(), nkd.layer_normalization(Xd, cols[0], axis=a).compute())


def test_row_statistics_eager_split_every_and_edges(rng):
    X = (rng.standard_normal((5, 40)) + 7).astype(F32)
    S = rng.uniform(0.5, 2, 40).astype(F32)
    Xd = da.from_array(X, chunks=(2, 3))  # 14 chunks per row: several merge levels
    lazy = dask.compute(*nkd.layer_normalization(Xd, S, num_outputs=3, split_every=2))
    eager = nkd.layer_normalization(Xd, S, num_outputs=3, compute_statistics=True)
    for got, expected in zip(dask.compute(*eager), lazy, strict=True):
        assert_identical(got, expected)
    y, mean, var = row_norm(X, S, None, EPS, 1)
    assert_close(lazy[0], y, row_tolerance(X, S, None, mean, var, EPS, F32))
    assert_identical(nkd.rms_normalization(Xd, S, compute_statistics=True).compute(),
                     nkd.rms_normalization(Xd, S, split_every=3).compute())
    # non-native byte order: converted, as the NumPy functions convert it
    big = da.from_array(X.astype(">f4"), chunks=(2, 3))
    assert_identical(nkd.layer_normalization(big, da.from_array(S.astype(">f4"))).compute(),
                     nkd.layer_normalization(Xd, S).compute())
    assert_identical(nkd.rms_normalization(big, S.astype(">f4")).compute(),
                     nkd.rms_normalization(Xd, S).compute())
    # 1-D X: one row, in chunks (axis 0: no leading axes)
    v = (rng.standard_normal(50) - 3).astype(F64)
    Y, m, inv = dask.compute(*nkd.layer_normalization(da.from_array(v, chunks=7), v[::-1],
                                                      axis=0, num_outputs=3))
    y, mean, var = row_norm(v, v[::-1], None, EPS, 0)
    assert m.shape == inv.shape == (1,) and m.dtype == F32
    assert_close(Y, y, row_tolerance(v, v[::-1], None, mean, var, EPS, F64))
    # no rows; bfloat16 stash; num_outputs 2
    empty = da.from_array(np.zeros((0, 6), F32), chunks=(1, 4))
    Y, m = dask.compute(*nkd.layer_normalization(empty, S[:6], num_outputs=2, stash_type=16))
    assert Y.shape == (0, 6) and m.shape == (0, 1) and m.dtype == BF16


def test_row_errors_are_the_numpy_ones(rng):
    X, S, B = row_data(rng, (4, 6), 1, F32)
    Xd = da.from_array(X, chunks=(2, 4))

    def same_error(*args, rms=False, **kwargs):
        numpy_fn, dask_fn = ((nk.rms_normalization, nkd.rms_normalization) if rms else
                             (nk.layer_normalization, nkd.layer_normalization))
        arrays = [np.asarray(v) if isinstance(v, da.Array) else v for v in args]
        with pytest.raises((TypeError, ValueError)) as expected:
            numpy_fn(*arrays, **kwargs)
        with pytest.raises(type(expected.value)) as got:
            dask_fn(*args, **kwargs)
        assert str(got.value) == str(expected.value)

    with pytest.raises(TypeError, match=r"dask\.array\.Array"):
        nkd.layer_normalization(X, S)
    with pytest.raises(TypeError, match=r"dask\.array\.Array"):
        nkd.rms_normalization(X, S)
    same_error(Xd, S, axis=2)
    same_error(Xd, S, axis=-3, rms=True)
    same_error(Xd, S, axis=1.0)
    same_error(Xd, S, stash_type=2)
    same_error(Xd, S, stash_type=99, rms=True)
    same_error(Xd, S, num_outputs=4)
    same_error(Xd, S.astype(F64))  # Scale's dtype is not X's
    same_error(Xd, S, B.astype(F16))
    same_error(Xd, S[:5])
    same_error(Xd, np.ones((2, 6), F32), rms=True)
    same_error(Xd, S, epsilon=float("nan"))
    same_error(Xd, S, opset=16)
    same_error(Xd, S, opset=22, rms=True)
    same_error(da.from_array(X.astype(np.int32)), S, rms=True)
    same_error(da.from_array(np.zeros((3, 0), F32)), np.ones(0, F32))
    same_error(da.from_array(np.float32(1)), np.float32(1), rms=True)


# --- group normalization ---

GROUP_SHAPE = (4, 6, 5, 7)  # NCX; 3 groups of 2 channels
GROUP_CHUNKINGS = {"whole": GROUP_SHAPE, "split-groups": (3, 1, 2, 7),
                   "straddle": (1, 4, 5, 3), "ones": (1, 1, 1, 1)}


def group_oracle(X, s, b, groups, fmt):
    """Float64 GroupNormalization-21 from the spec, and the per-element group mean and
    variance (X's layout)."""
    x = np.moveaxis(X.astype(F64), -1, 1) if fmt == "NXC" else X.astype(F64)
    N, C = x.shape[:2]
    g = x.reshape(N, groups, -1)
    mean = np.broadcast_to(g.mean(axis=2, keepdims=True), g.shape).reshape(x.shape)
    var = np.broadcast_to(g.var(axis=2, keepdims=True), g.shape).reshape(x.shape)
    shape = (1, C) + (1,) * (x.ndim - 2)
    y = (x - mean) / np.sqrt(var + EPS) * s.astype(F64).reshape(shape) \
        + b.astype(F64).reshape(shape)
    back = (lambda v: np.moveaxis(v, 1, -1)) if fmt == "NXC" else (lambda v: v)
    return back(y), back(mean), back(var)


@pytest.mark.parametrize("fmt", ["NCX", "NXC"])
@pytest.mark.parametrize("dtype", [F16, F32, F64], ids=["float16", "float32", "float64"])
@pytest.mark.parametrize("chunking", list(GROUP_CHUNKINGS))
def test_group_normalization_matches(rng, dtype, fmt, chunking):
    """Chunks that split a group and chunks that straddle two: the per-(n, c) partials
    merged per group give the oracle's Y, and single-machine normkernels' within the
    same bound."""
    X = layout((rng.standard_normal(GROUP_SHAPE) * 2 + 100.0).astype(dtype), fmt)
    s = rng.uniform(0.5, 2, 6).astype(dtype)
    b = rng.standard_normal(6).astype(dtype)
    Xd = da.from_array(X, chunks=chunks_for(fmt, GROUP_CHUNKINGS[chunking]))
    Y = nkd.group_normalization(Xd, s, b, num_groups=3, data_format=fmt)
    assert isinstance(Y, da.Array)
    Y = Y.compute()
    Y0 = nk.group_normalization(X, s, b, num_groups=3, data_format=fmt)
    assert Y.dtype == Y0.dtype == dtype
    exact, mean, var = group_oracle(X, s, b, 3, fmt)
    tol = tolerance(X, s, b, mean, var, EPS, fmt, Y.dtype, mean_rounded=dtype != F64,
                    statistics_of=X.dtype)
    assert_close(Y, exact, tol)
    assert_close(Y0, exact, tol)


def test_group_normalization_opset18_and_errors(rng):
    X = rng.standard_normal(GROUP_SHAPE).astype(F32)
    Xd = da.from_array(X, chunks=(2, 1, 5, 7))
    s, b = rng.uniform(0.5, 2, 3).astype(F32), rng.standard_normal(3).astype(F32)
    Y = nkd.group_normalization(Xd, s, b, num_groups=3, opset=18).compute()
    exact, mean, var = group_oracle(X, np.repeat(s, 2), np.repeat(b, 2), 3, "NCX")
    assert_close(Y, exact, tolerance(X, np.repeat(s, 2), np.repeat(b, 2), mean, var, EPS,
                                     "NCX", F32, mean_rounded=True, statistics_of=F32))
    with pytest.raises(ValueError, match=r"num_groups must divide the number of channels"):
        nkd.group_normalization(Xd, s, b, num_groups=4)
    with pytest.raises(ValueError, match=r"shape \(3,\), one value per group"):
        nkd.group_normalization(Xd, np.ones(6, F32), np.ones(6, F32), num_groups=3, opset=18)
    with pytest.raises(ValueError, match=r"stash_type"):
        nkd.group_normalization(Xd, np.ones(6, F32), np.ones(6, F32), num_groups=3,
                                stash_type=2)
    with pytest.raises(TypeError, match=r"dask\.array\.Array"):
        nkd.group_normalization(X, np.ones(6, F32), np.ones(6, F32), num_groups=3)


# --- every record of the table: its normkernels.dask function against normkernels ---

def _table_cases():
    from normkernels.operators import OPERATORS

    for op in OPERATORS.values():
        for mode in op.modes:
            if mode == "backward":
                continue
            for fmt in op.layouts:
                yield pytest.param(op, mode, fmt, id=f"{op.name}-{mode}-{fmt}")


def _table_workload(rng, op, mode, fmt):
    """X (per-sample, per-channel and per-row offsets and scales, so a block given
    another block's statistics or parameters is far off) and the call's arguments."""
    shape = (4, 6, 10) if op.rows else (4, 6, 5, 3)  # NCX; skip: (batch, seq, hidden)
    offsets = rng.uniform(-3, 3, shape[:2] + (1,) * (len(shape) - 2))
    X = (rng.standard_normal(shape) * rng.uniform(0.5, 2, offsets.shape) + offsets)
    X = layout(X.astype(F32), fmt) if not op.rows else X.astype(F32)
    axis = 1 if fmt == "NCX" else X.ndim - 1
    C = op.columns(X.shape) if op.rows else X.shape[axis]
    params = op.params(rng, C, F32, shape=X.shape, mode=mode, X=X, axis=axis)
    kwargs = op.kwargs(mode, fmt, C)
    return X, op.arguments(X, params, mode), kwargs


def _all_outputs(op, kwargs):
    """The call's keyword arguments asking for every output the record describes."""
    import inspect

    names = inspect.signature(getattr(nk, op.function)).parameters
    kwargs = dict(kwargs)
    if "num_outputs" in names and op.chunked.strategy == "whole":
        kwargs["num_outputs"] = len(op.chunked.outputs)
    if "keep_stats" in names:
        kwargs["keep_stats"] = True
    return kwargs


@pytest.mark.parametrize("op,mode,fmt", list(_table_cases()))
def test_every_record_runs_on_dask(rng, op, mode, fmt):
    """Each record with ``chunked`` has ``normkernels.dask.<function>``; on X chunked
    unevenly along every axis (the axes its statistics span too), with parameters as
    dask arrays, every output matches single-machine normkernels: bitwise for the
    strategies that only run blocks through normkernels ("whole", "given"), within
    the merged statistics' error for the others."""
    if op.chunked is None:
        pytest.skip(f"{op.name}: no dask strategy in its record")
    _, args, kwargs = _table_workload(rng, op, mode, fmt)
    for kw in (kwargs, _all_outputs(op, kwargs)):
        expected = getattr(nk, op.function)(*args, **kw)
        lazy = [da.from_array(a, chunks=tuple(max(1, (s + 1) // 2) for s in a.shape))
                if isinstance(a, np.ndarray) else a for a in args]
        got = dask.compute(getattr(nkd, op.function)(*lazy, **kw))[0]
        expected = expected if isinstance(expected, tuple) else (expected,)
        got = got if isinstance(got, tuple) else (got,)
        assert len(got) == len(expected), (len(got), len(expected))
        for k, (g, e) in enumerate(zip(got, expected, strict=True)):
            assert g.shape == e.shape and g.dtype == e.dtype, (k, g.shape, e.shape, g.dtype)
            if op.chunked.strategy in ("whole", "given"):
                assert_identical(g, e)
            else:  # statistics merged in another order: a few float32 roundings
                scale = np.abs(e.astype(F64)).max() + 1
                np.testing.assert_allclose(g.astype(F64), e.astype(F64), rtol=0,
                                           atol=1e-5 * scale, err_msg=f"output {k}")


def test_every_function_is_built_from_the_table():
    """``normkernels.dask`` holds one function per record with ``chunked`` (and the
    moment functions), named as normkernels names it, with its signature."""
    import inspect

    from normkernels.operators import OPERATORS

    built = {op.function for op in OPERATORS.values() if op.chunked is not None}
    assert built <= set(nkd.__all__)
    assert set(nkd.__all__) - built == {"partial_moments", "row_moments"}
    for op in OPERATORS.values():
        if op.chunked is not None and op.chunked.strategy == "whole":
            fn = getattr(nkd, op.function)
            assert fn.__name__ == op.function
            assert inspect.signature(fn) == inspect.signature(getattr(nk, op.function))


def test_whole_strategy_refuses_out_and_checks_arguments_now(rng):
    X = da.from_array(rng.standard_normal((4, 6, 10)).astype(F32), chunks=(2, 3, 5))
    with pytest.raises(ValueError, match="out="):
        nkd.lp_normalization(X, out=np.empty(X.shape, F32))
    with pytest.raises(ValueError, match="axis"):  # at the call, not at compute
        nkd.lp_normalization(X, axis=3)
    with pytest.raises(TypeError, match=r"X must be a dask\.array\.Array"):
        nkd.lrn(np.ones((2, 3, 4, 4), F32), size=3)

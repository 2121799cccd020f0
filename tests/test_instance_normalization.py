"""InstanceNormalization (opsets 1, 6, 22) against the float64 oracle."""

import numba
import numpy as np
import pytest
from arrays import FLOAT_IDS, FLOATS, LAYOUTS, assert_identical, random_tensor, to_layout
from oracle import assert_close, instance_norm, instance_tolerance

import normkernels as nk
from normkernels import reference
from normkernels.engine import policy
from normkernels.engine.numba_engine import ENGINE

F16, BF16, F32, F64 = FLOATS
EPS = 1e-5

# (N, C, *spatial) in NCX terms
SHAPES = {
    "3d": (2, 3, 5),
    "4d": (2, 3, 4, 5),
    "5d": (2, 3, 2, 3, 4),
    "N1": (1, 4, 6, 6),
    "C1": (3, 1, 17, 5),
    "spatial1": (4, 6, 1, 1),
    "odd": (3, 7, 33, 17),
    "planes": (2, 5, 61, 67),  # fused planes, parallel
    "split": (1, 2, 600, 600),  # planes above FUSED_MAX_PLANE_BYTES (float32/64)
}
OPSET_DTYPES = {1: (F16, F32, F64), 6: (F16, F32, F64), 22: tuple(FLOATS)}


def params(rng, C, dtype):
    scale = rng.uniform(0.5, 2.0, C) * rng.choice([-1, 1], C)
    return scale.astype(dtype), rng.standard_normal(C).astype(dtype)


def channel_count(shape, data_format):
    return shape[1] if data_format == "NCX" else shape[-1]


def expect_close(Y, X, scale, B, data_format):
    exact, mean, var = instance_norm(X, scale, B, EPS, data_format)
    assert Y.dtype == X.dtype and Y.shape == X.shape
    assert_close(Y, exact, instance_tolerance(X, scale, B, mean, var, EPS, data_format,
                                              Y.dtype))


def cases():
    for opset, dtypes in OPSET_DTYPES.items():
        for dtype in dtypes:
            for shape_id, shape in SHAPES.items():
                if opset == 1 and len(shape) != 4:
                    continue
                if shape_id == "split" and dtype.itemsize == 2:
                    continue  # 16-bit planes of that size are fused; see test_paths
                yield pytest.param(opset, dtype, shape_id,
                                   id=f"opset{opset}-{FLOAT_IDS[FLOATS.index(dtype)]}-{shape_id}")


@pytest.mark.parametrize("data_format", LAYOUTS)
@pytest.mark.parametrize("opset,dtype,shape_id", list(cases()))
def test_matches_oracle(rng, opset, dtype, shape_id, data_format):
    shape = to_layout(SHAPES[shape_id], data_format)
    X = random_tensor(rng, shape, dtype, mean=3.0, std=2.0)
    scale, B = params(rng, channel_count(shape, data_format), dtype)
    before = X.copy()
    Y = nk.instance_normalization(X, scale, B, epsilon=EPS, opset=opset,
                                  data_format=data_format)
    expect_close(Y, X, scale, B, data_format)
    assert_identical(X, before)  # input untouched
    twin = reference.instance_normalization(X, scale, B, epsilon=EPS, opset=opset,
                                            data_format=data_format)
    expect_close(twin, X, scale, B, data_format)


@pytest.mark.parametrize("data_format", LAYOUTS)
@pytest.mark.parametrize("dtype", [F32, F64], ids=["float32", "float64"])
@pytest.mark.parametrize("ncx_shape", [(2, 3, 64, 64), (2, 3, 7, 7), (1, 1, 700, 700)])
def test_large_mean(rng, dtype, data_format, ncx_shape):
    """|mean| 1e4 with std 1: float64 statistics, the mean's rounding compensated."""
    shape = to_layout(ncx_shape, data_format)
    X = random_tensor(rng, shape, dtype, mean=-1e4)
    scale, B = params(rng, channel_count(shape, data_format), dtype)
    Y = nk.instance_normalization(X, scale, B, epsilon=EPS, data_format=data_format)
    expect_close(Y, X, scale, B, data_format)


@pytest.mark.parametrize("data_format", LAYOUTS)
@pytest.mark.parametrize("dtype", [F16, BF16], ids=["float16", "bfloat16"])
def test_16_bit_large_planes_do_not_overflow(rng, dtype, data_format):
    """512 x 512 planes with unit variance: the sum of squares (262144) overflows
    float16, whose largest value is 65504; statistics are float64 here."""
    shape = to_layout((1, 2, 512, 512), data_format)
    X = random_tensor(rng, shape, dtype, mean=20.0)
    scale, B = params(rng, 2, dtype)
    Y = nk.instance_normalization(X, scale, B, data_format=data_format)
    assert np.all(np.isfinite(np.asarray(Y, np.float64)))
    expect_close(Y, X, scale, B, data_format)


@pytest.mark.parametrize("data_format", LAYOUTS)
@pytest.mark.parametrize("dtype", FLOATS, ids=FLOAT_IDS)
def test_constant_planes_and_spatial_size_one_give_B(rng, dtype, data_format):
    """Variance exactly 0 and x - mean exactly 0: Y is B exactly."""
    for ncx_shape in [(3, 4, 1, 1), (2, 4, 9, 11)]:
        shape = to_layout(ncx_shape, data_format)
        C = channel_count(shape, data_format)
        X = random_tensor(rng, shape, dtype, mean=5.0)
        if ncx_shape[2] > 1:  # constant planes, a different constant each
            values = rng.standard_normal((ncx_shape[0], C)).astype(dtype)
            X[...] = (values[:, :, None, None] if data_format == "NCX"
                      else values[:, None, None, :])
        scale, B = params(rng, C, dtype)
        Y = nk.instance_normalization(X, scale, B, data_format=data_format)
        expected = np.broadcast_to(B.reshape((1, C, 1, 1) if data_format == "NCX"
                                             else (1, 1, 1, C)), shape)
        assert_identical(Y, np.ascontiguousarray(expected))


@pytest.mark.parametrize("data_format", LAYOUTS)
def test_nan_stays_in_its_plane(rng, data_format):
    shape = to_layout((2, 3, 20, 20), data_format)
    X = random_tensor(rng, shape, F32)
    scale, B = params(rng, 3, F32)
    plane = (1, 2, slice(None), slice(None)) if data_format == "NCX" else (1, ..., 2)
    if data_format == "NCX":
        X[1, 2, 3, 4] = np.nan
    else:
        X[1, 3, 4, 2] = np.nan
    Y = nk.instance_normalization(X, scale, B, data_format=data_format)
    nan = np.isnan(Y)
    assert nan[plane].all()
    assert nan.sum() == nan[plane].size
    expect_close(Y, X, scale, B, data_format)


@pytest.mark.parametrize("layout", ["channels-last memory", "strided view", "reversed"])
def test_any_strides(rng, layout):
    base = random_tensor(rng, (3, 4, 10, 12), F32, mean=1.0)
    if layout == "channels-last memory":  # NCX logically, NHWC in memory: no copy
        X = np.ascontiguousarray(base.transpose(0, 2, 3, 1)).transpose(0, 3, 1, 2)
    elif layout == "strided view":
        X = random_tensor(rng, (3, 8, 10, 24), F32)[:, ::2, :, ::2]
    else:
        X = base[::-1, :, ::-1]
    scale, B = params(rng, 4, F32)
    Y = nk.instance_normalization(X, scale, B)
    expect_close(Y, X, scale, B, "NCX")
    if layout == "channels-last memory":
        assert Y.transpose(0, 2, 3, 1).flags.c_contiguous  # memory order kept


@pytest.mark.parametrize("data_format", LAYOUTS)
def test_out_and_in_place(rng, data_format):
    shape = to_layout((2, 3, 40, 40), data_format)
    X = random_tensor(rng, shape, F32)
    scale, B = params(rng, 3, F32)
    expected = nk.instance_normalization(X, scale, B, data_format=data_format)
    out = np.empty_like(X)
    assert nk.instance_normalization(X, scale, B, data_format=data_format, out=out) is out
    assert_identical(out, expected)
    assert nk.instance_normalization(X, scale, B, data_format=data_format, out=X) is X
    assert_identical(X, expected)


def test_zero_size():
    scale, B = np.ones(3, F32), np.zeros(3, F32)
    Y = nk.instance_normalization(np.zeros((0, 3, 4, 4), F32), scale, B)
    assert Y.shape == (0, 3, 4, 4)
    with pytest.raises(ValueError, match="zero-size spatial extent"):
        nk.instance_normalization(np.zeros((2, 3, 0, 4), F32), scale, B)


@pytest.mark.parametrize("dtype", FLOATS, ids=FLOAT_IDS)
@pytest.mark.parametrize("ncx_shape", [(2, 3, 61, 67), (1, 2, 600, 600), (2, 3, 5, 7)])
def test_paths_are_bitwise_identical(rng, dtype, ncx_shape, monkeypatch):
    """Fused (serial, parallel, streaming) and split planes give the same bits, so
    the choice among them, which depends on the thread count, changes nothing."""
    X = random_tensor(rng, ncx_shape, dtype, mean=2.0)
    scale, B = params(rng, ncx_shape[1], dtype)
    S = int(np.prod(ncx_shape[2:]))
    results = []
    for path, max_fused in [("serial", 1 << 40), ("parallel", 1 << 40),
                            ("streaming", 1 << 40), ("parallel", 0), ("streaming", 0)]:
        monkeypatch.setattr(policy, "FUSED_MAX_PLANE_BYTES", max_fused)
        Y = np.empty_like(X)
        stats = ENGINE.instance_planes(X, Y, ncx_shape[1], S, scale, B, EPS, path)
        results.append((Y, stats))
    for Y, (mean, m2) in results[1:]:
        assert_identical(Y, results[0][0])
        assert_identical(mean, results[0][1][0])
        assert_identical(m2, results[0][1][1])


@pytest.mark.parametrize("shape,data_format", [
    ((2, 16, 300, 300), "NCX"), ((1, 2, 700, 700), "NCX"), ((2, 300, 300, 16), "NXC"),
    ((1, 500, 500, 3), "NXC")])
def test_thread_count_independence(rng, shape, data_format):
    X = random_tensor(rng, shape, F32, mean=5.0)
    scale, B = params(rng, channel_count(shape, data_format), F32)
    before = numba.get_num_threads()
    try:
        numba.set_num_threads(1)
        one = nk.instance_normalization(X, scale, B, data_format=data_format)
        numba.set_num_threads(numba.config.NUMBA_NUM_THREADS)
        many = nk.instance_normalization(X, scale, B, data_format=data_format)
    finally:
        numba.set_num_threads(before)
    assert_identical(one, many)


@pytest.mark.parametrize("groups", [None, 32])
def test_thread_count_independence_of_wide_samples(rng, groups):
    """One sample of few wide rows (NXC): its statistics are cut into row blocks by the
    shape alone; float64, whose Y shows any change of the statistics' merge order."""
    X = random_tensor(rng, (1, 32, 32, 640), np.float64, mean=5.0)
    scale, B = params(rng, 640, np.float64)

    def run():
        if groups is None:
            return nk.instance_normalization(X, scale, B, data_format="NXC")
        return nk.group_normalization(X, scale, B, num_groups=groups, data_format="NXC")

    before = numba.get_num_threads()
    try:
        numba.set_num_threads(1)
        one = run()
        numba.set_num_threads(numba.config.NUMBA_NUM_THREADS)
        many = run()
    finally:
        numba.set_num_threads(before)
    assert_identical(one, many)


def test_opset_1_ignores_consumed_inputs(rng):
    X = random_tensor(rng, (2, 3, 4, 5), F32)
    scale, B = params(rng, 3, F32)
    assert_identical(nk.instance_normalization(X, scale, B, opset=1, consumed_inputs=[0, 0]),
                     nk.instance_normalization(X, scale, B, opset=6))


@pytest.mark.parametrize("opset,shape,match", [
    (1, (2, 3, 5), "must be 4-D"), (1, (2, 3, 4, 5, 6), "must be 4-D"),
    (6, (2, 3), "at least 3 dimensions"), (22, (3,), "at least 3 dimensions")])
def test_rank_errors(opset, shape, match):
    C = shape[1] if len(shape) > 1 else 1
    with pytest.raises(ValueError, match=match):
        nk.instance_normalization(np.zeros(shape, F32), np.ones(C, F32), np.zeros(C, F32),
                                  opset=opset)


def test_parameter_errors():
    X = np.zeros((2, 3, 4, 4), F32)
    with pytest.raises(ValueError, match=r"scale must have shape \(3,\)"):
        nk.instance_normalization(X, np.ones(4, F32), np.zeros(3, F32))
    with pytest.raises(ValueError, match=r"B must have shape \(3,\)"):
        nk.instance_normalization(X, np.ones(3, F32), np.zeros((3, 1), F32))
    with pytest.raises(TypeError, match="share type T"):
        nk.instance_normalization(X, np.ones(3, F64), np.zeros(3, F32))
    with pytest.raises(ValueError, match="data_format"):
        nk.instance_normalization(X, np.ones(3, F32), np.zeros(3, F32), data_format="NHWC")
    with pytest.raises(ValueError, match="out must have the shape"):
        nk.instance_normalization(X, np.ones(3, F32), np.zeros(3, F32), out=np.empty(3, F32))


@pytest.mark.parametrize("opset", [1, 6])
def test_bfloat16_needs_opset_22(opset):
    X = np.zeros((2, 3, 4, 4), BF16)
    with pytest.raises(TypeError, match=f"InstanceNormalization-{opset}: input has dtype "
                                        "bfloat16"):
        nk.instance_normalization(X, np.ones(3, BF16), np.zeros(3, BF16), opset=opset)


@pytest.mark.parametrize("dtype", [np.int32, np.complex64, np.bool_])
def test_non_float_dtypes(dtype):
    X = np.zeros((2, 3, 4, 4), dtype)
    with pytest.raises(TypeError, match="input has dtype"):
        nk.instance_normalization(X, np.ones(3, dtype), np.zeros(3, dtype))


@pytest.mark.parametrize("opset", [6, 22])
def test_attribute_not_in_opset(opset):
    X = np.zeros((2, 3, 4, 4), F32)
    with pytest.raises(TypeError, match=f"InstanceNormalization-{opset} has no attribute "
                                        "'consumed_inputs'"):
        nk.instance_normalization(X, np.ones(3, F32), np.zeros(3, F32), opset=opset,
                                  consumed_inputs=[0])


@pytest.mark.parametrize("epsilon,error", [(float("nan"), ValueError), ("x", TypeError)])
def test_bad_epsilon(epsilon, error):
    X = np.zeros((2, 3, 4, 4), F32)
    with pytest.raises(error, match="epsilon"):
        nk.instance_normalization(X, np.ones(3, F32), np.zeros(3, F32), epsilon=epsilon)

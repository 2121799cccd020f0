"""ONNX BatchNormalization (inference) and oneDNN BatchNormInference against the
float64 oracle, the NumPy twin, and each other, over dtypes x layouts x shapes."""

import itertools

import numpy as np
import pytest
from arrays import (
    FLOAT_IDS,
    FLOATS,
    LAYOUTS,
    SHAPES,
    assert_identical,
    random_params,
    random_tensor,
    to_layout,
)
from oracle import assert_close, batch_norm, tolerance

import normkernels as nk
from normkernels import reference

F16, BF16, F32, F64 = FLOATS
EPS = 1e-5


def expect_close(Y, X, params, epsilon, data_format, mean_rounded=False):
    """Y within the stated tolerance of the float64 oracle, NaN where it is NaN."""
    exact = batch_norm(X, *params, epsilon, data_format)
    assert_close(Y, exact, tolerance(X, *params, epsilon, data_format, Y.dtype, mean_rounded))


def run_both(X, params, data_format, **kw):
    """The kernel result, checked bit-identical to the NumPy twin."""
    Y = nk.batch_normalization(X, *params, data_format=data_format, **kw)
    assert_identical(Y, reference.batch_normalization(X, *params, data_format=data_format, **kw))
    return Y


@pytest.mark.parametrize("shape_id", list(SHAPES))
@pytest.mark.parametrize("data_format", LAYOUTS)
@pytest.mark.parametrize("dtype", FLOATS, ids=FLOAT_IDS)
def test_matches_oracle(rng, dtype, data_format, shape_id):
    shape = to_layout(SHAPES[shape_id], data_format)
    C = SHAPES[shape_id][1] if len(shape) > 1 else 1
    X = random_tensor(rng, shape, dtype)
    params = random_params(rng, C, (dtype,) * 4)
    before = [p.copy() for p in (X, *params)]
    Y = run_both(X, params, data_format)
    assert Y.dtype == dtype and Y.shape == X.shape
    expect_close(Y, X, params, EPS, data_format)
    for original, now in zip(before, (X, *params), strict=True):
        assert_identical(original, now)  # inputs untouched


@pytest.mark.parametrize("dtype", [F16, BF16, F32], ids=["float16", "bfloat16", "float32"])
@pytest.mark.parametrize("data_format", LAYOUTS)
def test_onednn_matches_oracle(rng, dtype, data_format):
    shape = to_layout((2, 5, 9, 7), data_format)
    X = random_tensor(rng, shape, dtype)
    params = random_params(rng, 5, (BF16 if dtype == BF16 else F32,) * 4)
    Y = nk.batch_norm_inference(X, *params, epsilon=1e-3, data_format=data_format)
    assert_identical(Y, reference.batch_norm_inference(X, *params, epsilon=1e-3,
                                                       data_format=data_format))
    expect_close(Y, X, params, 1e-3, data_format)


def test_onednn_default_layout_is_nxc(rng):
    X = random_tensor(rng, (2, 4, 4, 3), F32)
    params = random_params(rng, 3)
    Y = nk.batch_norm_inference(X, *params, epsilon=EPS)
    expect_close(Y, X, params, EPS, "NXC")


@pytest.mark.parametrize(
    "t1,t2", list(itertools.product(FLOATS, FLOATS)),
    ids=[f"T1={a}-T2={b}" for a, b in itertools.product(FLOAT_IDS, FLOAT_IDS)])
@pytest.mark.parametrize("t", FLOATS, ids=FLOAT_IDS)
def test_opset15_type_combinations(rng, t, t1, t2):
    X = random_tensor(rng, (2, 3, 5, 4), t)
    scale, B, m, v = random_params(rng, 3, (t1, t1, t2, t2))
    Y = run_both(X, (scale, B, m, v), "NCX", opset=15)
    assert Y.dtype == t
    expect_close(Y, X, (scale, B, m, v), EPS, "NCX", mean_rounded=t2 == F64 and t != F64)


@pytest.mark.parametrize("u", FLOATS, ids=FLOAT_IDS)
@pytest.mark.parametrize("t", FLOATS, ids=FLOAT_IDS)
def test_opset14_mean_var_type(rng, t, u):
    X = random_tensor(rng, (2, 3, 4), t)
    params = random_params(rng, 3, (t, t, u, u))
    Y = run_both(X, params, "NCX", opset=14)
    expect_close(Y, X, params, EPS, "NCX", mean_rounded=u == F64 and t != F64)


@pytest.mark.parametrize("opset,attrs", [(1, {"is_test": 1, "consumed_inputs": [0, 0, 0, 1, 1]}),
                                         (6, {"is_test": 1})])
@pytest.mark.parametrize("dtype", [F16, F32, F64], ids=["float16", "float32", "float64"])
def test_opset1_6_test_mode(rng, opset, attrs, dtype):
    X = random_tensor(rng, (2, 3, 4, 5), dtype)
    params = random_params(rng, 3, (dtype,) * 4)
    Y = run_both(X, params, "NCX", opset=opset, **attrs)
    expect_close(Y, X, params, EPS, "NCX")


@pytest.mark.parametrize("data_format", LAYOUTS)
@pytest.mark.parametrize("dtype", FLOATS, ids=FLOAT_IDS)
def test_large_mean_small_std(rng, dtype, data_format):
    """|mean| = 1e4 with std 1: the (x - mean) * a + B form keeps full accuracy."""
    shape = to_layout((2, 4, 33, 9), data_format)
    X = random_tensor(rng, shape, dtype, mean=1e4, std=1.0)
    pdt = F64 if dtype == F64 else F32
    params = random_params(rng, 4, (pdt,) * 4, mean=1e4)
    Y = run_both(X, params, data_format)
    expect_close(Y, X, params, EPS, data_format)
    if dtype in (F32, F64):  # the error is relative to Y's O(1) values, not to 1e4
        exact = batch_norm(X, *params, EPS, data_format)
        assert np.abs(Y - exact).max() < 64 * np.finfo(dtype).eps


@pytest.mark.parametrize("data_format", LAYOUTS)
@pytest.mark.parametrize("dtype", FLOATS, ids=FLOAT_IDS)
def test_nan_and_inf_stay_in_place(rng, dtype, data_format):
    shape = to_layout((2, 3, 8, 8), data_format)
    X = random_tensor(rng, shape, dtype)
    flat = X.reshape(-1)
    flat[[3, 50]] = np.nan
    flat[[7, 100]] = np.inf
    flat[200] = -np.inf
    params = random_params(rng, 3, (dtype,) * 4)
    Y = run_both(X, params, data_format)
    expect_close(Y, X, params, EPS, data_format)  # NaN and +-Inf exactly where expected
    assert np.isfinite(np.delete(Y.reshape(-1).astype(np.float64), [3, 50, 7, 100, 200])).all()


@pytest.mark.parametrize("dtype", FLOATS, ids=FLOAT_IDS)
def test_nan_parameters_poison_only_their_channel(rng, dtype):
    X = random_tensor(rng, (2, 3, 4, 4), dtype)
    scale, B, m, v = random_params(rng, 3, (dtype,) * 4)
    v[1] = np.nan
    Y = run_both(X, (scale, B, m, v), "NCX")
    assert np.isnan(Y[:, 1].astype(np.float32)).all()
    assert np.isfinite(Y[:, [0, 2]].astype(np.float32)).all()


def _views(rng, dtype):
    base = random_tensor(rng, (4, 6, 10, 12), dtype)
    return {
        "step": base[:, :, ::2, 1::3],
        "negative": base[::-1, :, :, ::-1],
        "channel-slice": base[:, 1:4],
        "channels-last-memory": np.ascontiguousarray(base.transpose(0, 2, 3, 1))
        .transpose(0, 3, 1, 2),
        "fortran": np.asfortranarray(base),
    }


@pytest.mark.parametrize("view", ["step", "negative", "channel-slice", "channels-last-memory",
                                  "fortran"])
@pytest.mark.parametrize("data_format", LAYOUTS)
@pytest.mark.parametrize("dtype", FLOATS, ids=FLOAT_IDS)
def test_strided_views(rng, dtype, data_format, view):
    X = _views(rng, dtype)[view]
    C = X.shape[1] if data_format == "NCX" else X.shape[-1]
    params = random_params(rng, C, (dtype,) * 4)
    Y = run_both(X, params, data_format)
    assert_identical(Y, run_both(np.ascontiguousarray(X), params, data_format))
    expect_close(Y, X, params, EPS, data_format)


def test_channels_last_memory_is_kept_and_not_copied(rng):
    """An NCX tensor stored channels-last (PyTorch's channels_last) runs as NXC and Y
    keeps X's memory order."""
    X = random_tensor(rng, (2, 5, 6, 7), F32)
    X_cl = np.ascontiguousarray(X.transpose(0, 2, 3, 1)).transpose(0, 3, 1, 2)
    params = random_params(rng, 5)
    Y = nk.batch_normalization(X_cl, *params)
    assert Y.strides == X_cl.strides
    assert_identical(Y, nk.batch_normalization(X, *params))


@pytest.mark.parametrize("data_format", LAYOUTS)
@pytest.mark.parametrize("dtype", FLOATS, ids=FLOAT_IDS)
def test_out_and_in_place(rng, dtype, data_format):
    shape = to_layout((2, 3, 9, 11), data_format)
    X = random_tensor(rng, shape, dtype)
    params = random_params(rng, 3, (dtype,) * 4)
    expected = nk.batch_normalization(X, *params, data_format=data_format)
    out = np.empty_like(X)
    assert nk.batch_normalization(X, *params, data_format=data_format, out=out) is out
    assert_identical(out, expected)
    X2 = X.copy()
    assert nk.batch_normalization(X2, *params, data_format=data_format, out=X2) is X2
    assert_identical(X2, expected)


@pytest.mark.parametrize("dtype", FLOATS, ids=FLOAT_IDS)
def test_unaligned_and_strided_out(rng, dtype):
    shape = (2, 3, 140, 141)  # parallel path; the output is off 64-byte alignment
    X = random_tensor(rng, shape, dtype)
    params = random_params(rng, 3, (dtype,) * 4)
    expected = nk.batch_normalization(X, *params)
    size = X.size
    unaligned = np.empty(size + 1, dtype)[1:].reshape(shape)
    assert nk.batch_normalization(X, *params, out=unaligned) is unaligned
    assert_identical(unaligned, expected)
    strided = np.empty((*shape[:3], 2 * shape[3]), dtype)[..., ::2]
    assert nk.batch_normalization(X, *params, out=strided) is strided
    assert_identical(strided, expected)


@pytest.mark.parametrize("shape", [(0, 3, 4), (2, 3, 0), (0,)])
def test_zero_size(shape):
    X = np.empty(shape, np.float32)
    C = 3 if len(shape) > 1 else 1
    params = random_params(np.random.default_rng(0), C)
    Y = nk.batch_normalization(X, *params)
    assert Y.shape == shape and Y.dtype == np.float32


def test_array_likes_follow_numpy_conversion():
    Y = nk.batch_normalization([[1.0, 2.0]], [1.0, 1.0], [0.0, 0.0], [0.0, 0.0], [1.0, 1.0],
                               epsilon=0.0)
    assert Y.dtype == np.float64
    np.testing.assert_array_equal(Y, [[1.0, 2.0]])


def test_opset_above_15_uses_version_15(rng):
    X = random_tensor(rng, (2, 3, 4), BF16)
    params = random_params(rng, 3)
    assert_identical(nk.batch_normalization(X, *params, opset=22),
                     nk.batch_normalization(X, *params, opset=15))


@pytest.mark.parametrize("dtype", FLOATS, ids=FLOAT_IDS)
def test_read_only_and_unaligned_inputs(rng, dtype):
    """Buffers from np.frombuffer are read-only and may be misaligned for the dtype."""
    X = random_tensor(rng, (2, 3, 40, 41), dtype)
    params = random_params(rng, 3, (dtype,) * 4)
    expected = nk.batch_normalization(X, *params)
    read_only = X.copy()
    read_only.flags.writeable = False
    assert_identical(nk.batch_normalization(read_only, *params), expected)
    raw = np.zeros(X.nbytes + 1, np.uint8)
    unaligned = np.frombuffer(raw[1:].data, dtype=dtype).reshape(X.shape)
    raw[1:] = X.view(np.uint8).reshape(-1)
    assert_identical(nk.batch_normalization(unaligned, *params), expected)

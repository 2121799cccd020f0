"""Training-mode BatchNormalization (every opset) and the public moments functions,
against the float64 oracle."""

import itertools

import numba
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
from oracle import (
    assert_close,
    batch_norm_training,
    batch_statistics,
    rounded_statistic_tolerance,
    statistics_tolerance,
    training_tolerance,
)

import normkernels as nk
from normkernels import reference
from normkernels.engine.numba_engine import ENGINE

F16, BF16, F32, F64 = FLOATS
EPS = 1e-5


def channels(shape, data_format):
    if len(shape) == 1:
        return 1
    return shape[1] if data_format == "NCX" else shape[-1]


def expect_stats_close(got, exact, dtype, propagated=0.0):
    """A statistic rounded once to its dtype: within half an ulp of it beyond the
    error ``propagated`` from the batch statistics."""
    assert got.dtype == dtype
    assert_close(got, exact, rounded_statistic_tolerance(exact, dtype, propagated),
                 "statistic")


def expect_moments_close(X, data_format, mean, var):
    """``nk.moments`` output: the stated accuracy of the statistics, then one rounding
    to the output dtype (float32 for 16-bit X)."""
    exact_mean, exact_var = batch_statistics(X, data_format)
    d_mean, d_var = statistics_tolerance(exact_mean, exact_var, X.dtype)
    expect_stats_close(mean, exact_mean, mean.dtype, d_mean)
    expect_stats_close(var, exact_var, var.dtype, d_var)


def expect_training_close(outputs, X, params, momentum, data_format):
    Y, running_mean, running_var = outputs[:3]
    exact_Y, exact_rm, exact_rv, mean, var = batch_norm_training(X, *params, EPS, momentum,
                                                                 data_format)
    assert_close(Y, exact_Y, training_tolerance(X, params[0], params[1], mean, var, EPS,
                                                data_format))
    d_mean, d_var = statistics_tolerance(mean, var, X.dtype)
    expect_stats_close(running_mean, exact_rm, params[2].dtype, (1 - momentum) * d_mean)
    expect_stats_close(running_var, exact_rv, params[3].dtype, (1 - momentum) * d_var)
    return mean, var, d_mean, d_var


@pytest.mark.parametrize("shape_id", [k for k in SHAPES if k != "1d"] + ["1d"])
@pytest.mark.parametrize("data_format", LAYOUTS)
@pytest.mark.parametrize("dtype", FLOATS, ids=FLOAT_IDS)
def test_training_matches_oracle(rng, dtype, data_format, shape_id):
    shape = to_layout(SHAPES[shape_id], data_format)
    X = random_tensor(rng, shape, dtype, mean=3.0)
    params = random_params(rng, channels(shape, data_format), (dtype,) * 4)
    before = [p.copy() for p in (X, *params)]
    outputs = nk.batch_normalization(X, *params, training_mode=1, momentum=0.7,
                                     data_format=data_format)
    assert len(outputs) == 3 and outputs[0].dtype == dtype
    expect_training_close(outputs, X, params, 0.7, data_format)
    for original, now in zip(before, (X, *params), strict=True):
        assert_identical(original, now)
    for stat, given in zip(outputs[1:], params[2:], strict=True):
        assert not np.shares_memory(stat, given)
    twin = reference.batch_normalization(X, *params, training_mode=1, momentum=0.7,
                                         data_format=data_format)
    expect_training_close(twin, X, params, 0.7, data_format)


@pytest.mark.parametrize(
    "t1,t2", list(itertools.product(FLOATS, FLOATS)),
    ids=[f"T1={a}-T2={b}" for a, b in itertools.product(FLOAT_IDS, FLOAT_IDS)])
@pytest.mark.parametrize("t", FLOATS, ids=FLOAT_IDS)
def test_opset15_training_types(rng, t, t1, t2):
    """Running statistics have T2's dtype (the ONNX reference casts them to T)."""
    X = random_tensor(rng, (3, 4, 5, 6), t)
    params = random_params(rng, 4, (t1, t1, t2, t2))
    outputs = nk.batch_normalization(X, *params, training_mode=1, opset=15)
    assert outputs[0].dtype == t and outputs[1].dtype == t2 and outputs[2].dtype == t2
    expect_training_close(outputs, X, params, 0.9, "NCX")


@pytest.mark.parametrize("momentum", [0.0, 0.1, 0.9, 1.0])
def test_momentum_weighs_the_running_value(rng, momentum):
    X = random_tensor(rng, (4, 3, 6, 6), F64)
    params = random_params(rng, 3, (F64,) * 4)
    outputs = nk.batch_normalization(X, *params, training_mode=1, momentum=momentum)
    expect_training_close(outputs, X, params, momentum, "NCX")
    if momentum == 1.0:
        np.testing.assert_array_equal(outputs[1], params[2])


@pytest.mark.parametrize("opset,kw", [
    (1, {"consumed_inputs": [0, 0, 0, 1, 1]}), (6, {}), (7, {}), (9, {})])
@pytest.mark.parametrize("dtype", [F16, F32, F64], ids=["float16", "float32", "float64"])
def test_opsets_1_to_9_five_outputs(rng, dtype, opset, kw):
    X = random_tensor(rng, (3, 4, 5, 6), dtype)
    params = random_params(rng, 4, (dtype,) * 4)
    outputs = nk.batch_normalization(X, *params, opset=opset, num_outputs=5, **kw)
    assert len(outputs) == 5 and all(o.dtype == dtype for o in outputs)
    mean, var, d_mean, d_var = expect_training_close(outputs, X, params, 0.9, "NCX")
    expect_stats_close(outputs[3], mean, dtype, d_mean)  # saved_mean: the batch mean
    expect_stats_close(outputs[4], var, dtype, d_var)  # saved_var: the batch variance
    inv_std = nk.batch_normalization(X, *params, opset=opset, num_outputs=5,
                                     saved_var="inv_std", **kw)[4]
    expect_stats_close(inv_std, 1 / np.sqrt(var + EPS), dtype,
                       0.5 * d_var * (var + EPS) ** -1.5)


@pytest.mark.parametrize("opset", [7, 9])
def test_opsets_7_9_one_output_is_inference(rng, opset):
    X = random_tensor(rng, (3, 4, 5), F32)
    params = random_params(rng, 4)
    Y = nk.batch_normalization(X, *params, opset=opset)
    assert_identical(Y, nk.batch_normalization(X, *params, opset=15))
    assert len(nk.batch_normalization(X, *params, opset=opset, num_outputs=3)) == 3


@pytest.mark.parametrize("num_outputs", [1, 2, 3, 4])
def test_opset6_training_returns_the_requested_outputs(rng, num_outputs):
    X = random_tensor(rng, (3, 4, 5), F32)
    params = random_params(rng, 4)
    outputs = nk.batch_normalization(X, *params, opset=6, num_outputs=num_outputs)
    full = nk.batch_normalization(X, *params, opset=6, num_outputs=5)
    if num_outputs == 1:
        assert_identical(outputs, full[0])  # Y with batch statistics
    else:
        assert len(outputs) == num_outputs
        for got, want in zip(outputs, full, strict=False):
            assert_identical(got, want)


@pytest.mark.parametrize("data_format", LAYOUTS)
@pytest.mark.parametrize("dtype", FLOATS, ids=FLOAT_IDS)
def test_single_element_per_channel_gives_B(rng, dtype, data_format):
    """N * spatial = 1: variance 0, Y = B exactly."""
    shape = to_layout((1, 5, 1, 1), data_format)
    X = random_tensor(rng, shape, dtype, mean=7.0)
    params = random_params(rng, 5, (dtype,) * 4)
    Y, _, running_var = nk.batch_normalization(X, *params, training_mode=1,
                                               data_format=data_format)
    np.testing.assert_array_equal(Y.reshape(-1), params[1])
    np.testing.assert_array_equal(running_var.astype(np.float64),
                                  (params[3].astype(np.float64) * 0.9).astype(dtype))


@pytest.mark.parametrize("data_format", LAYOUTS)
@pytest.mark.parametrize("dtype", FLOATS, ids=FLOAT_IDS)
def test_constant_channel_has_zero_variance(rng, dtype, data_format):
    shape = to_layout((6, 3, 40, 40), data_format)
    X = random_tensor(rng, shape, dtype)
    channel = (slice(None), 1) if data_format == "NCX" else (..., 1)
    X[channel] = dtype.type(0.3)
    mean, var = nk.moments(X, data_format=data_format)
    assert var[1] == 0.0 and mean[1] == np.float64(dtype.type(0.3))
    params = random_params(rng, 3, (dtype,) * 4)
    Y = nk.batch_normalization(X, *params, training_mode=1, data_format=data_format)[0]
    assert np.all(Y[channel] == params[1][1])


@pytest.mark.parametrize("data_format", LAYOUTS)
@pytest.mark.parametrize("dtype", FLOATS, ids=FLOAT_IDS)
def test_nan_stays_in_its_channel(rng, dtype, data_format):
    shape = to_layout((4, 3, 30, 30), data_format)
    X = random_tensor(rng, shape, dtype)
    channel = (slice(None), 2) if data_format == "NCX" else (..., 2)
    planted = [(0, 2, 3, 4), (3, 2, 29, 0)] if data_format == "NCX" else [(0, 3, 4, 2),
                                                                         (3, 29, 0, 2)]
    for index in planted:
        X[index] = np.nan
    assert np.isnan(X.astype(np.float64)).sum() == len(planted)
    params = random_params(rng, 3, (dtype,) * 4)
    Y, running_mean, running_var = nk.batch_normalization(X, *params, training_mode=1,
                                                          data_format=data_format)
    assert np.isnan(np.asarray(Y[channel], np.float64)).all()
    others = (slice(None), [0, 1]) if data_format == "NCX" else (..., [0, 1])
    assert np.isfinite(np.asarray(Y[others], np.float64)).all()
    assert np.isnan(np.asarray(running_mean, np.float64)).tolist() == [False, False, True]
    assert np.isnan(np.asarray(running_var, np.float64)).tolist() == [False, False, True]


def test_empty_x_in_training_is_an_error():
    X = np.zeros((0, 3, 4), F32)
    with pytest.raises(ValueError, match="statistics of zero elements are undefined"):
        nk.batch_normalization(X, *random_params(np.random.default_rng(0), 3), training_mode=1)
    with pytest.raises(ValueError, match="zero elements"):
        nk.moments(X)


@pytest.mark.parametrize("data_format", LAYOUTS)
def test_float16_sum_of_squares_does_not_overflow(rng, data_format):
    """Values near 300 square to more than float16's maximum (65504)."""
    shape = to_layout((2, 2, 256, 256), data_format)
    X = random_tensor(rng, shape, F16, mean=300.0, std=50.0)
    mean, var = nk.moments(X, data_format=data_format)
    assert mean.dtype == np.float32 and np.isfinite(var).all()
    expect_moments_close(X, data_format, mean, var)


@pytest.mark.parametrize("data_format", LAYOUTS)
@pytest.mark.parametrize("dtype", [F32, F64], ids=["float32", "float64"])
@pytest.mark.parametrize("ncx_shape", [(16, 8, 64, 64), (40, 8, 7, 7)])
@pytest.mark.parametrize("offset", [1e4, 1e6])
def test_moments_accuracy_at_large_mean(rng, dtype, data_format, ncx_shape, offset):
    """Mean 1e4 (1e6), std 1: float64 accumulation, the stated accuracy."""
    shape = to_layout(ncx_shape, data_format)
    X = random_tensor(rng, shape, dtype, mean=offset)
    mean, var = nk.moments(X, data_format=data_format)
    assert mean.dtype == np.float64
    expect_moments_close(X, data_format, mean, var)


@pytest.mark.parametrize("data_format", LAYOUTS)
@pytest.mark.parametrize("dtype", [F16, BF16], ids=["float16", "bfloat16"])
def test_moments_accuracy_16_bit(rng, dtype, data_format):
    shape = to_layout((8, 4, 96, 96), data_format)
    X = random_tensor(rng, shape, dtype)
    mean, var = nk.moments(X, data_format=data_format)
    assert var.dtype == np.float32
    expect_moments_close(X, data_format, mean, var)


@pytest.mark.parametrize("shape,data_format", [
    ((8, 16, 300, 300), "NCX"), ((4, 200, 200, 64), "NXC"), ((64, 2048, 3, 3), "NCX"),
    ((64, 300, 7, 7), "NCX"), ((8, 300, 7, 7), "NCX"),
    ((3_000_001,), "NCX")])
def test_statistics_do_not_depend_on_thread_count(rng, shape, data_format):
    X = random_tensor(rng, shape, F32, mean=5.0)
    C = channels(shape, data_format)
    layout = X.reshape(-1), C, (1 if data_format == "NXC" or len(shape) < 3
                                else int(np.prod(shape[2:])))
    before = numba.get_num_threads()
    try:
        numba.set_num_threads(1)
        one = ENGINE.channel_moments(*layout, path="parallel")
        numba.set_num_threads(numba.config.NUMBA_NUM_THREADS)
        many = ENGINE.channel_moments(*layout, path="parallel")
    finally:
        numba.set_num_threads(before)
    for a, b in zip(one, many, strict=True):
        assert_identical(a, b)


@pytest.mark.parametrize("data_format", LAYOUTS)
@pytest.mark.parametrize("dtype", FLOATS, ids=FLOAT_IDS)
def test_partial_moments_merge_like_the_whole(rng, dtype, data_format):
    shape = to_layout((7, 5, 9, 11), data_format)
    X = random_tensor(rng, shape, dtype, mean=2.0)
    whole = nk.partial_moments(X, data_format=data_format)
    merged = nk.partial_moments(X[:0], data_format=data_format)  # the identity
    for lo, hi in [(0, 1), (1, 4), (4, 7)]:
        merged = nk.merge_moments(merged, nk.partial_moments(X[lo:hi], data_format=data_format))
    np.testing.assert_array_equal(merged.count, whole.count)
    exact_mean, exact_var = batch_statistics(X, data_format)
    d_mean, d_var = statistics_tolerance(exact_mean, exact_var, dtype)
    for part in (whole, merged):  # both within the stated accuracy of the exact values
        assert_close(part.mean, exact_mean, d_mean, "mean")
        assert_close(part.M2 / part.count, exact_var, d_var, "variance")


def test_merge_rejects_different_channels():
    a = nk.partial_moments(np.ones((2, 3), F32))
    b = nk.partial_moments(np.ones((2, 4), F32))
    with pytest.raises(ValueError, match="same channels"):
        nk.merge_moments(a, b)


def test_moments_follow_layout_and_dtype(rng):
    X = random_tensor(rng, (2, 6, 5, 3), BF16)
    mean, var = nk.moments(X, data_format="NXC")
    assert mean.shape == (3,) and mean.dtype == np.float32
    expect_moments_close(X, "NXC", mean, var)
    one_d = nk.moments(random_tensor(rng, (101,), F32))
    assert one_d[0].shape == (1,)


@pytest.mark.parametrize("kw,exc,match", [
    ({"opset": 15, "num_outputs": 3}, TypeError, "num_outputs is for opsets 1-9"),
    ({"opset": 9, "num_outputs": 6}, ValueError, "num_outputs must be an integer from 1 to 5"),
    ({"opset": 6, "is_test": 1, "num_outputs": 3}, ValueError, "test mode"),
    ({"opset": 9, "num_outputs": 5, "saved_var": "std"}, ValueError, "saved_var must be one of"),
    ({"opset": 7, "spatial": 0, "num_outputs": 5}, ValueError,
     r"with spatial=0, scale must have shape \(3, 4\)"),
    ({"training_mode": 1, "momentum": float("nan")}, ValueError, "momentum must be finite"),
])
def test_training_rejects(kw, exc, match):
    X = np.ones((2, 3, 4), F32)
    with pytest.raises(exc, match=match):
        nk.batch_normalization(X, *random_params(np.random.default_rng(0), 3), **kw)


def _per_activation(X, data_format):
    """X as N x F activations (what spatial=0 normalizes over N)."""
    return X.reshape(X.shape[0], -1)


@pytest.mark.parametrize("data_format", LAYOUTS)
@pytest.mark.parametrize("dtype", [F16, F32, F64], ids=["float16", "float32", "float64"])
@pytest.mark.parametrize("opset", [1, 6, 7])
def test_spatial_0_statistics_per_activation(rng, opset, dtype, data_format):
    shape = to_layout((5, 3, 4, 6), data_format)
    X = random_tensor(rng, shape, dtype, mean=2.0)
    sample = shape[1:]
    params = tuple(p.reshape(sample) for p in random_params(rng, int(np.prod(sample)),
                                                             (dtype,) * 4))
    kw = {"consumed_inputs": [0, 0, 0, 1, 1]} if opset == 1 else {}
    outputs = nk.batch_normalization(X, *params, opset=opset, spatial=0, num_outputs=5,
                                     data_format=data_format, **kw)
    flat = tuple(p.reshape(-1) for p in params)
    X2 = _per_activation(X, data_format)
    mean, var, d_mean, d_var = expect_training_close(
        (outputs[0].reshape(X2.shape), *(o.reshape(-1) for o in outputs[1:3])), X2, flat, 0.9,
        "NCX")
    assert all(o.shape == sample for o in outputs[1:])
    expect_stats_close(outputs[3].reshape(-1), mean, dtype, d_mean)
    expect_stats_close(outputs[4].reshape(-1), var, dtype, d_var)
    if opset != 1:  # test mode: inference per activation
        test_kw = {"is_test": 1} if opset == 6 else {}
        Y = nk.batch_normalization(X, *params, opset=opset, spatial=0, data_format=data_format,
                                   **test_kw)
        assert_identical(Y.reshape(X2.shape),
                         nk.batch_normalization(X2, *flat, opset=opset, **test_kw))


@pytest.mark.parametrize("data_format", LAYOUTS)
def test_spatial_0_broadcasts_per_channel_parameters_in_opset_6(rng, data_format):
    shape = to_layout((5, 3, 4, 6), data_format)
    X = random_tensor(rng, shape, F32)
    params = random_params(rng, 3)
    outputs = nk.batch_normalization(X, *params, opset=6, spatial=0, num_outputs=3,
                                     data_format=data_format)
    axis = 1 if data_format == "NCX" else 3
    full = tuple(np.broadcast_to(np.expand_dims(p, [a for a in range(3) if a != axis - 1]),
                                 shape[1:]).copy() for p in params)
    expected = nk.batch_normalization(X, *full, opset=6, spatial=0, num_outputs=3,
                                      data_format=data_format)
    for got, want in zip(outputs, expected, strict=True):
        assert_identical(got, want)


@pytest.mark.parametrize("data_format", LAYOUTS)
def test_outlier_first_element_takes_the_two_pass_path(rng, data_format):
    """The one-pass method shifts by the first element of each block; an outlier there
    would cancel catastrophically, so such blocks are redone in two passes."""
    shape = to_layout((4, 3, 70, 70), data_format)
    X = random_tensor(rng, shape, F64)
    flat = X.reshape(-1)
    flat[::4096] = 1e9  # first elements of planes' sub-blocks and of row blocks
    mean, var = nk.moments(X, data_format=data_format)
    exact_mean, exact_var = batch_statistics(X, data_format)
    np.testing.assert_allclose(var, exact_var, rtol=1e-14)
    np.testing.assert_allclose(mean, exact_mean, rtol=0, atol=1e-15 * 1e9)

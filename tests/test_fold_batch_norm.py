"""fold_batch_norm: an inference BatchNormalization folded into the preceding Conv or
Gemm weights, against a float64 oracle written from the formula (rounded once by a
rounding written here, independent of ml_dtypes' casts), the folded layer against
BN of the layer (a matmul and a direct 2-D convolution in float64) within the error
of rounding W' and bias', and torch's fuse_conv_bn_weights."""

import numpy as np
import pytest
from arrays import FLOAT_IDS, FLOATS, assert_identical
from oracle import batch_norm, ulp

import normkernels as nk

F16, BF16, F32, F64 = FLOATS
EPS = 1e-5
# (significand bits, smallest normal exponent): the rounding below, from the formats
FORMATS = {F16: (10, -14), BF16: (7, -126), F32: (23, -126)}


def oracle(W, bias, scale, B, mean, var, epsilon, axis):
    """float64 ``(W', bias')`` by the spec: ``a = scale / sqrt(var + eps)``, ``b = B -
    mean * a``, ``W'[o] = W[o] * a[o]``, ``bias'[o] = bias[o] * a[o] + b[o]``."""
    f = lambda v: np.asarray(v).astype(F64)  # noqa: E731
    with np.errstate(all="ignore"):
        a = f(scale) / np.sqrt(f(var) + epsilon)
        b = f(B) - f(mean) * a
        bias64 = np.zeros_like(a) if bias is None else f(bias)
        fused_w = np.moveaxis(np.moveaxis(f(W), axis, -1) * a, -1, axis)
        return fused_w, bias64 * a + b


def round_once(v, dtype):
    """float64 ``v`` rounded once, to nearest with ties to even, to ``dtype``: to a
    multiple of the spacing of ``dtype`` in the binade of ``v`` (``np.round`` is
    ties-to-even and exact here), then cast (exact, or overflow to inf)."""
    dtype = np.dtype(dtype)
    if dtype == F64:
        return v
    bits, emin = FORMATS[dtype]
    with np.errstate(all="ignore"):
        exponent = np.frexp(np.where(np.isfinite(v) & (v != 0), v, 1.0))[1] - 1
        quantum = np.ldexp(1.0, np.maximum(exponent, emin) - bits)
        q = np.where(np.isfinite(v), np.round(v / quantum) * quantum, v)
        return q.astype(np.float32).astype(dtype)  # exact, except overflow to inf


def params(rng, C, dtypes=(F32,) * 4):
    """scale, B, mean, var (var > 0) of C output channels."""
    scale = rng.uniform(0.5, 2.0, C) * rng.choice([-1, 1], C)
    values = (scale, rng.standard_normal(C), rng.standard_normal(C) * 2,
              rng.uniform(0.05, 4.0, C))
    return tuple(v.astype(d) for v, d in zip(values, dtypes, strict=True))


def check_against_oracle(W, bias, ps, epsilon=EPS, axis=0):
    """The result is the oracle's float64 result rounded once; inputs unmodified;
    new arrays of the weight's dtype."""
    inputs = [W, *ps] + ([] if bias is None else [bias])
    before = [x.copy() for x in inputs]
    fused_w, fused_b = nk.fold_batch_norm(W, bias, *ps, epsilon=epsilon, axis=axis)
    exact_w, exact_b = oracle(W, bias, *ps, epsilon, axis)
    assert_identical(fused_w, round_once(exact_w, W.dtype))
    assert_identical(fused_b, round_once(exact_b, W.dtype))
    assert fused_b.shape == (W.shape[axis],)
    for x, copy in zip(inputs, before, strict=True):
        assert_identical(x, copy)
        assert not np.shares_memory(x, fused_w) and not np.shares_memory(x, fused_b)
    return fused_w, fused_b


CONV_SHAPES = {
    "conv1d": (6, 4, 3),
    "conv2d": (5, 3, 3, 3),
    "conv3d": (4, 2, 3, 2, 3),
    "grouped": (8, 2, 3, 3),  # groups=4 of 8 input channels
    "depthwise": (6, 1, 5, 5),
    "pointwise": (7, 5, 1, 1),
}


@pytest.mark.parametrize("with_bias", [False, True], ids=["no-bias", "bias"])
@pytest.mark.parametrize("shape_id", list(CONV_SHAPES))
def test_conv_weights_match_oracle(rng, shape_id, with_bias):
    shape = CONV_SHAPES[shape_id]
    W = rng.standard_normal(shape).astype(F32)
    bias = rng.standard_normal(shape[0]).astype(F32) if with_bias else None
    check_against_oracle(W, bias, params(rng, shape[0]))


@pytest.mark.parametrize("with_bias", [False, True], ids=["no-bias", "bias"])
@pytest.mark.parametrize("layout,axis", [("NK", 0), ("KN", 1), ("KN", -1)],
                         ids=["gemm-transB", "matmul-axis1", "matmul-axis-1"])
def test_gemm_weights_match_oracle(rng, layout, axis, with_bias):
    N, K = 6, 9
    W = rng.standard_normal((N, K) if layout == "NK" else (K, N)).astype(F32)
    bias = rng.standard_normal(N).astype(F32) if with_bias else None
    fused_w, _ = check_against_oracle(W, bias, params(rng, N), axis=axis)
    assert fused_w.shape == W.shape


@pytest.mark.parametrize("with_bias", [False, True], ids=["no-bias", "bias"])
@pytest.mark.parametrize("dtype", FLOATS, ids=FLOAT_IDS)
def test_every_weight_dtype_is_the_float64_result_rounded_once(rng, dtype, with_bias):
    W = rng.standard_normal((5, 3, 3, 3)).astype(dtype)
    bias = rng.standard_normal(5).astype(dtype) if with_bias else None
    fused_w, fused_b = check_against_oracle(W, bias, params(rng, 5))
    assert fused_w.dtype == dtype and fused_b.dtype == dtype
    assert fused_w.shape == W.shape


@pytest.mark.parametrize("dtype", FLOATS, ids=FLOAT_IDS)
def test_parameters_of_any_float_dtype(rng, dtype):
    """BN parameters and bias each of their own dtype; the result has the weight's."""
    W = rng.standard_normal((4, 3)).astype(dtype)
    ps = params(rng, 4, (BF16, F64, F16, F32))
    fused_w, fused_b = check_against_oracle(W, rng.standard_normal(4).astype(BF16), ps)
    assert fused_w.dtype == dtype and fused_b.dtype == dtype


def test_bfloat16_rounds_once_not_through_float32():
    """ml_dtypes casts float64 to bfloat16 through float32, rounding twice: 1 + 2**-8 +
    2**-40 becomes 1; rounded once it is 1 + 2**-7 (above the tie)."""
    value = 1 + 2.0**-8 + 2.0**-40
    assert np.array([value]).astype(BF16).astype(F64)[0] == 1.0  # the double rounding
    one = np.ones(1)
    fused_w, fused_b = nk.fold_batch_norm(np.ones((1, 1), BF16), one.astype(BF16),
                                          np.array([value]), np.zeros(1), np.zeros(1),
                                          one, epsilon=0.0)
    assert fused_w.astype(F64)[0, 0] == 1 + 2.0**-7
    assert fused_b.astype(F64)[0] == 1 + 2.0**-7
    tie = nk.fold_batch_norm(np.ones((1, 1), BF16), None, np.array([1 + 2.0**-8]),
                             np.zeros(1), np.zeros(1), one, epsilon=0.0)[0]
    assert tie.astype(F64)[0, 0] == 1.0  # a tie goes to even


def test_strided_weight_and_parameters(rng):
    W = rng.standard_normal((9, 6, 4)).astype(F32)[::2, :, ::-1].transpose(0, 2, 1)
    ps = tuple(p[::2] for p in params(rng, 10))
    check_against_oracle(W, rng.standard_normal(10).astype(F32)[1::2], ps)


def test_zero_size_weight(rng):
    fused_w, fused_b = nk.fold_batch_norm(np.ones((0, 3), F32), None,
                                          *params(rng, 0))
    assert fused_w.shape == (0, 3) and fused_b.shape == (0,) and fused_b.dtype == F32
    fused_w, fused_b = check_against_oracle(np.ones((3, 0), F16), None, params(rng, 3))
    assert fused_w.shape == (3, 0)


def half_ulp(v, dtype):
    """Half the spacing of ``dtype`` in the binade of ``v``: the error of rounding it."""
    return ulp(v, dtype) / 2


def float64_noise(*magnitudes):
    """A bound on the float64 roundings of a few dozen products and sums."""
    return 64 * 2.0**-53 * sum(magnitudes)


@pytest.mark.parametrize("with_bias", [False, True], ids=["no-bias", "bias"])
def test_folded_gemm_is_bn_of_gemm(rng, with_bias):
    """``x @ W'.T + bias'`` (float32 W', bias' widened) equals ``BN(x @ W.T + bias)``
    in float64 within what rounding W' and bias' to float32 moves it:
    ``sum_k |x_k| half_ulp(W'_k) + half_ulp(bias')`` plus float64 noise."""
    M, N, K = 16, 6, 40
    x = rng.standard_normal((M, K)) * 3
    W = rng.standard_normal((N, K)).astype(F32)
    bias = rng.standard_normal(N).astype(F32) if with_bias else None
    ps = params(rng, N)
    fused_w, fused_b = nk.fold_batch_norm(W, bias, *ps, epsilon=EPS)
    y = x @ W.astype(F64).T + (0.0 if bias is None else bias.astype(F64))
    want = batch_norm(y, *ps, EPS, "NXC")  # channels are the last axis of y
    got = x @ fused_w.astype(F64).T + fused_b.astype(F64)
    exact_w, exact_b = oracle(W, bias, *ps, EPS, 0)
    allowed = (np.abs(x) @ half_ulp(exact_w, F32).T + half_ulp(exact_b, F32)
               + float64_noise(np.abs(x) @ np.abs(exact_w).T, np.abs(exact_b), np.abs(want)))
    assert np.all(np.abs(got - want) <= allowed), np.max(np.abs(got - want) / allowed)
    # the rounding is what the bound allows: float64 weights leave only float64 noise
    w64, b64 = nk.fold_batch_norm(W.astype(F64), bias, *ps, epsilon=EPS)
    got64 = x @ w64.T + b64
    assert np.all(np.abs(got64 - want) <= float64_noise(np.abs(x) @ np.abs(w64).T,
                                                        np.abs(b64), np.abs(want)))


def conv2d(x, W, bias, groups):
    """Direct float64 convolution, stride 1, no padding: x (N, C, H, W), W (K, C /
    groups, kh, kw), bias (K,)."""
    N, _, H, Wd = x.shape
    K, Cg, kh, kw = W.shape
    y = np.empty((N, K, H - kh + 1, Wd - kw + 1))
    for o in range(K):
        g = o // (K // groups)
        for i in range(y.shape[2]):
            for j in range(y.shape[3]):
                window = x[:, g * Cg:(g + 1) * Cg, i:i + kh, j:j + kw]
                y[:, o, i, j] = (window * W[o]).sum(axis=(1, 2, 3)) + bias[o]
    return y


@pytest.mark.parametrize("groups", [1, 2])
def test_folded_conv2d_is_bn_of_conv2d(rng, groups):
    """A real convolution: Conv(x, W') + bias' against BN(Conv(x, W) + bias) in float64,
    within the rounding of W' and bias' to float32 (the convolution of |x| with half
    an ulp of each W', plus half an ulp of bias') and float64 noise."""
    C, K = 4, 6
    x = rng.standard_normal((2, C, 7, 6)) * 2
    W = rng.standard_normal((K, C // groups, 3, 3)).astype(F32)
    bias = rng.standard_normal(K).astype(F32)
    ps = params(rng, K)
    fused_w, fused_b = nk.fold_batch_norm(W, bias, *ps, epsilon=EPS)
    want = batch_norm(conv2d(x, W.astype(F64), bias.astype(F64), groups), *ps, EPS)
    got = conv2d(x, fused_w.astype(F64), fused_b.astype(F64), groups)
    exact_w, exact_b = oracle(W, bias, *ps, EPS, 0)
    allowed = (conv2d(np.abs(x), half_ulp(exact_w, F32), half_ulp(exact_b, F32), groups)
               + float64_noise(conv2d(np.abs(x), np.abs(exact_w), np.abs(exact_b), groups),
                               np.abs(want)))
    assert np.all(np.abs(got - want) <= allowed), np.max(np.abs(got - want) / allowed)


@pytest.mark.parametrize("dtype", FLOATS, ids=FLOAT_IDS)
def test_nan_in_var_stays_in_its_channel(rng, dtype):
    W = rng.standard_normal((4, 3, 2)).astype(dtype)
    scale, B, mean, var = params(rng, 4)
    var[1] = np.nan
    fused_w, fused_b = check_against_oracle(W, rng.standard_normal(4).astype(F32),
                                            (scale, B, mean, var))
    assert np.isnan(fused_w[1].astype(F64)).all() and np.isnan(float(fused_b[1]))
    others = [0, 2, 3]
    assert np.isfinite(fused_w[others].astype(F64)).all()
    assert np.isfinite(fused_b[others].astype(F64)).all()


def test_infinite_and_zero_variance_propagate(rng):
    """var = inf gives a = 0 (W' = 0, bias' = B); var + eps = 0 gives a = inf, as the
    float64 formula computes them, without an exception or a warning."""
    W = rng.standard_normal((3, 2)).astype(F32)
    scale, B, mean, var = params(rng, 3)
    var[0], var[2] = np.inf, 0.0
    fused_w, fused_b = check_against_oracle(W, None, (scale, B, mean, var), epsilon=0.0)
    assert (fused_w[0] == 0).all() and fused_b[0] == B[0]
    assert np.isinf(fused_w[2]).all()


def test_gemm_axis_folds_columns_not_rows(rng):
    """A square (K, N) MatMul weight: axis=1 scales columns, axis=0 rows."""
    W = rng.standard_normal((5, 5)).astype(F64)
    ps = params(rng, 5, (F64,) * 4)
    a = ps[0] / np.sqrt(ps[3] + EPS)
    assert_identical(nk.fold_batch_norm(W, None, *ps, axis=1)[0], W * a)
    assert_identical(nk.fold_batch_norm(W, None, *ps, axis=0)[0], W * a[:, None])


# --- errors: each names the argument and the rule ---

def _call(rng, ps=None, **kw):
    W = rng.standard_normal((4, 3, 3)).astype(F32)
    return nk.fold_batch_norm(W, None, *(params(rng, 4) if ps is None else ps), **kw)


NAMES = ["scale", "B", "mean", "var", "bias"]


@pytest.mark.parametrize("bad_shape", [(5,), (4, 1), ()], ids=["length", "matrix", "scalar"])
@pytest.mark.parametrize("name", NAMES)
def test_wrong_parameter_shape_names_it(rng, name, bad_shape):
    given = dict(zip(NAMES, [*params(rng, 4), np.zeros(4, F32)], strict=True))
    given[name] = np.ones(bad_shape, F32)
    with pytest.raises(ValueError, match=rf"fold_batch_norm: {name} must have shape \(4,\)"):
        nk.fold_batch_norm(np.ones((4, 3, 3), F32), given["bias"], given["scale"],
                           given["B"], given["mean"], given["var"])


def test_parameters_sized_by_the_axis(rng):
    W = np.ones((3, 4), F32)
    with pytest.raises(ValueError, match=r"scale must have shape \(4,\).*weight.shape\[1\]"):
        nk.fold_batch_norm(W, None, *params(rng, 3), axis=1)


@pytest.mark.parametrize("axis", [2, -3, 10])
def test_axis_out_of_range(rng, axis):
    with pytest.raises(ValueError, match=r"axis must be in \[-2, 2\)"):
        nk.fold_batch_norm(np.ones((4, 3), F32), None, *params(rng, 4), axis=axis)


@pytest.mark.parametrize("axis", [1.0, True, "0", None])
def test_axis_not_an_integer(rng, axis):
    with pytest.raises(TypeError, match="axis must be an integer"):
        _call(rng, axis=axis)


def test_scalar_weight_has_no_axis(rng):
    with pytest.raises(ValueError, match="axis"):
        nk.fold_batch_norm(np.float32(1.0), None, *params(rng, 1))


@pytest.mark.parametrize("epsilon", [-1e-5, -np.inf, np.nan, np.inf])
def test_bad_epsilon_value(rng, epsilon):
    with pytest.raises(ValueError, match="epsilon"):
        _call(rng, epsilon=epsilon)


@pytest.mark.parametrize("epsilon", ["1e-5", None, True, np.ones(1)])
def test_epsilon_not_a_number(rng, epsilon):
    with pytest.raises(TypeError, match="epsilon"):
        _call(rng, epsilon=epsilon)


def test_negative_var_plus_epsilon(rng):
    scale, B, mean, var = params(rng, 4)
    var[2] = -0.5
    with pytest.raises(ValueError, match=r"var \+ epsilon must not be negative.*var\[2\]"):
        _call(rng, ps=(scale, B, mean, var))
    var = var.astype(F64)
    var[2] = -EPS  # var + epsilon exactly zero: a = inf, no exception
    assert np.isinf(_call(rng, ps=(scale, B, mean, var), epsilon=EPS)[0][2]).all()


@pytest.mark.parametrize("weight", [np.ones((4, 3), np.complex64), np.ones((4, 3), np.int32),
                                    np.array([[None]] * 4), "weights", None],
                         ids=["complex", "int", "object", "str", "None"])
def test_weight_of_a_wrong_type(rng, weight):
    with pytest.raises(TypeError, match="fold_batch_norm: weight has dtype"):
        nk.fold_batch_norm(weight, None, *params(rng, 4))


@pytest.mark.parametrize("bad", [np.ones(4, np.complex128), np.ones(4, np.int64), "abcd"],
                         ids=["complex", "int", "str"])
@pytest.mark.parametrize("name", NAMES)
def test_parameter_of_a_wrong_type(rng, name, bad):
    given = dict(zip(NAMES, [*params(rng, 4), None], strict=True))
    given[name] = bad
    with pytest.raises(TypeError, match=rf"fold_batch_norm: {name} has dtype"):
        nk.fold_batch_norm(np.ones((4, 3), F32), given["bias"], given["scale"], given["B"],
                           given["mean"], given["var"])


def test_list_inputs_are_arrays(rng):
    """Array-likes convert by NumPy's rules (a list of floats is float64)."""
    fused_w, fused_b = nk.fold_batch_norm([[1.0, 2.0]], [0.5], [2.0], [1.0], [0.0], [4.0],
                                          epsilon=0.0)
    assert fused_w.dtype == F64 and fused_w.tolist() == [[1.0, 2.0]]
    assert fused_b.tolist() == [1.5]


# --- torch's folding (in the weights' dtype) ---

def test_matches_torch_fuse_conv_bn_weights(rng):
    torch = pytest.importorskip("torch", reason="needs torch (pip install torch==2.13.0)")
    from torch.nn.utils.fusion import fuse_conv_bn_weights, fuse_linear_bn_weights

    def folded_by_torch(fuse, W, bias, scale, B, mean, var, **kw):
        t = lambda v: None if v is None else torch.from_numpy(v)  # noqa: E731
        if fuse is fuse_conv_bn_weights:
            w, b = fuse(t(W), t(bias), t(mean), t(var), EPS, t(scale), t(B), **kw)
        else:
            w, b = fuse(t(W), t(bias), t(mean), t(var), EPS, t(scale), t(B))
        return w.detach().numpy(), b.detach().numpy()

    u = 2.0**-24
    cases = [  # (fuse, weight shape, axis, torch keywords)
        (fuse_conv_bn_weights, (6, 4, 3, 3), 0, {}),
        (fuse_conv_bn_weights, (6, 2, 3), 0, {}),
        (fuse_conv_bn_weights, (4, 6, 3, 3), 1, {"transpose": True}),  # ConvTranspose
        (fuse_linear_bn_weights, (6, 10), 0, {}),
    ]
    for fuse, shape, axis, kw in cases:
        for with_bias in (False, True):
            W = rng.standard_normal(shape).astype(F32)
            channels = shape[axis]
            bias = rng.standard_normal(channels).astype(F32) if with_bias else None
            ps = params(rng, channels)
            tw, tb = folded_by_torch(fuse, W, bias, *ps, **kw)
            ours_w, ours_b = nk.fold_batch_norm(W, bias, *ps, epsilon=EPS, axis=axis)
            exact_w, _ = oracle(W, bias, *ps, EPS, axis)
            scale, B, mean, _ = (p.astype(F64) for p in ps)
            # torch: a few float32 roundings on each chain (rsqrt, products, sums)
            bias64 = 0.0 if bias is None else np.abs(bias.astype(F64))
            a_o = np.abs(scale) / np.sqrt(ps[3].astype(F64) + EPS)
            tol_w = 8 * u * np.abs(exact_w)
            tol_b = 8 * u * ((bias64 + np.abs(mean)) * a_o + np.abs(B))
            assert ours_w.dtype == tw.dtype and ours_b.dtype == tb.dtype
            assert np.all(np.abs(tw.astype(F64) - ours_w) <= tol_w), (shape, with_bias)
            assert np.all(np.abs(tb.astype(F64) - ours_b) <= tol_b), (shape, with_bias)

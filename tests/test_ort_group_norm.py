"""onnxruntime's GroupNorm and SkipGroupNorm (com.microsoft) and the activation
epilogues, against float64 oracles written from the schema and PyTorch's definitions
(tests/oracle.py)."""

import ml_dtypes
import numpy as np
import pytest
from arrays import FLOAT_IDS, FLOATS, assert_identical
from oracle import (
    activation,
    activation_tolerance,
    assert_close,
    group_norm,
    group_tolerance,
)

import normkernels as nk
from normkernels import reference
from normkernels.engine.numba_engine import ENGINE
from normkernels.kernels import activations
from normkernels.ops import ort_group_norm as spec

EPS = 1e-5
F32, F64 = np.dtype(np.float32), np.dtype(np.float64)
# (N, C, spatial...) in channels-first order; groups
SHAPES = {"4d": ((2, 32, 5, 7), 8), "n1": ((1, 64, 9, 9), 32), "c-is-g": ((2, 6, 3, 3), 6),
          "spatial1": ((3, 8, 1, 1), 2), "3d": ((2, 12, 33), 4), "5d": ((1, 8, 3, 4, 5), 4),
          "big-plane": ((1, 16, 40, 40), 4)}


def data(rng, ncx_shape, dtype, last, offset=3.0):
    """X in channels-last (``last``) or channels-first order, each (n, c) its own mean
    and spread (a wrong group or sample index moves the statistics far)."""
    N, C = ncx_shape[:2]
    b = (N, C) + (1,) * (len(ncx_shape) - 2)
    X = rng.standard_normal(ncx_shape) * rng.uniform(0.5, 2, b) + rng.uniform(-offset, offset, b)
    if last:
        X = np.moveaxis(X, 1, -1)
    return np.ascontiguousarray(X).astype(dtype)


def expected(X, gamma, beta, G, last, kind):
    fmt = "NXC" if last else "NCX"
    exact, mean, var, s, b = group_norm(X, gamma, beta, G, EPS, fmt)
    tol = group_tolerance(X, s, b, mean, var, EPS, fmt, X.dtype)
    return activation(kind, exact), activation_tolerance(kind, exact, tol, X.dtype)


@pytest.mark.parametrize("silu", [0, 1], ids=["none", "silu"])
@pytest.mark.parametrize("last", [1, 0], ids=["nhwc", "nchw"])
@pytest.mark.parametrize("dtype", FLOATS, ids=FLOAT_IDS)
@pytest.mark.parametrize("shape_id", SHAPES)
def test_group_norm_matches_oracle(rng, shape_id, dtype, last, silu):
    shape, G = SHAPES[shape_id]
    X = data(rng, shape, dtype, last)
    C = shape[1]
    gamma = (rng.uniform(0.5, 2, C) * rng.choice([-1, 1], C)).astype(F32)
    beta = rng.standard_normal(C).astype(F32)
    before = X.copy()
    Y = nk.ort_group_norm(X, gamma, beta, groups=G, activation=silu, channels_last=last)
    assert Y.shape == X.shape and Y.dtype == X.dtype
    assert_identical(X, before)
    exact, tol = expected(X, gamma, beta, G, last, "silu" if silu else None)
    assert_close(Y, exact, tol)
    twin = spec.ort_group_norm(X, gamma, beta, groups=G, activation=silu, channels_last=last,
                               engine=reference.ENGINE)
    assert_close(twin, exact, tol, "twin Y")


@pytest.mark.parametrize("dtype", [np.float16, np.float32], ids=["float16", "float32"])
def test_gamma_in_another_dtype_and_large_offsets(rng, dtype):
    """float16 X with float32 gamma (what onnxruntime's CUDA kernel takes), float32 X
    with float16 gamma; groups at mean 1e4 with std 1 (float32 only: float16 has no
    digits left there)."""
    other = np.float32 if dtype == np.float16 else np.float16
    offset = 1e4 if dtype == np.float32 else 3.0
    X = data(rng, (2, 16, 6, 6), dtype, 1, offset=0.0) + np.asarray(offset, dtype)
    gamma = rng.uniform(0.5, 2, 16).astype(other)
    beta = rng.standard_normal(16).astype(other)
    for silu in (0, 1):
        Y = nk.ort_group_norm(X, gamma, beta, groups=4, activation=silu)
        exact, tol = expected(X, gamma, beta, 4, 1, "silu" if silu else None)
        assert_close(Y, exact, tol)


@pytest.mark.parametrize("path", ["serial", "parallel", "streaming"])
@pytest.mark.parametrize("dtype", FLOATS, ids=FLOAT_IDS)
@pytest.mark.parametrize("last", [1, 0], ids=["nhwc", "nchw"])
def test_every_path_gives_the_same_bits(rng, last, dtype, path):
    """The activation runs in the vector bodies and in the scalar heads and tails (odd
    planes put every element in each at some path): the same bits on every path."""
    X = data(rng, (2, 8, 37, 3), dtype, last)
    gamma, beta = rng.standard_normal(8).astype(F32), rng.standard_normal(8).astype(F32)
    want = nk.ort_group_norm(X, gamma, beta, groups=4, activation=1, channels_last=last)
    got = spec.ort_group_norm(X, gamma, beta, groups=4, activation=1, channels_last=last,
                              engine=ENGINE, path=path)
    assert_identical(got, want)
    offset = np.empty(X.size + 1, X.dtype)[1:].reshape(X.shape)  # misaligned by one element
    offset[...] = X
    assert_identical(nk.ort_group_norm(offset, gamma, beta, groups=4, activation=1,
                                       channels_last=last), want)


def test_silu_of_special_values():
    """One channel per group, gamma 1 and beta chosen so the normalized value is 0:
    Y is SiLU(beta) exactly as the activation computes it; NaN, infinities and signed
    zeros as PyTorch's SiLU."""
    beta = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 1e-40, 88.0, -90.0, -110.0, 20.0],
                    F32)
    C = beta.size
    X = np.ones((1, 2, 1, C), F32)  # each channel constant: x - mean = 0
    Y = nk.ort_group_norm(X, np.ones(C, F32), beta, groups=C, activation=1)
    want = [0.0, -0.0, np.inf, np.nan, np.nan, 5e-41, 88.0, -90.0 * np.exp(-90.0), -0.0, 20.0]
    got = Y[0, 0, 0]
    assert np.isnan(got[3]) and np.isnan(got[4])
    keep = [0, 1, 2, 5, 6, 7, 8, 9]
    np.testing.assert_allclose(got[keep], np.array(want, np.float64)[keep], rtol=1e-6,
                               atol=1e-45)
    # beta -0.0: y = 0 * a + -0.0 = +0.0; SiLU(-110) = -110 * 0 = -0.0
    assert np.signbit(got[8]) and not np.signbit(got[0]) and not np.signbit(got[1])


@pytest.mark.parametrize("bias", [True, False], ids=["bias", "no-bias"])
@pytest.mark.parametrize("skip_kind", ["full", "n11c", "nc"])
@pytest.mark.parametrize("dtype", FLOATS, ids=FLOAT_IDS)
@pytest.mark.parametrize("last", [1, 0], ids=["nhwc", "nchw"])
def test_skip_group_norm_matches_oracle(rng, last, dtype, skip_kind, bias):
    ncx = (2, 16, 5, 3)
    X = data(rng, ncx, dtype, last)
    N, C = ncx[:2]
    shape = {"full": X.shape, "n11c": (N, 1, 1, C) if last else (N, C, 1, 1),
             "nc": (N, C)}[skip_kind]
    skip = (rng.standard_normal(shape) * 2).astype(dtype)
    b = rng.standard_normal(C).astype(dtype) if bias else None
    gamma, beta = rng.standard_normal(C).astype(F32), rng.standard_normal(C).astype(F32)
    inputs = [a.copy() for a in (X, skip)]
    Y, S = nk.ort_skip_group_norm(X, gamma, beta, skip, b, groups=4, activation=1,
                                  channels_last=last, num_outputs=2)
    assert_identical(X, inputs[0])
    assert_identical(skip, inputs[1])
    # S: the exact sum rounded once (within half an ulp of X's dtype, and float32's
    # roundoff of the 16-bit skip add)
    sk = skip.astype(F64) if skip_kind == "full" else (
        skip.astype(F64).reshape((N, 1, 1, C) if last else (N, C, 1, 1)))
    exact_s = X.astype(F64) + sk
    if bias:
        exact_s = exact_s + (b.astype(F64) if last else b.astype(F64)[:, None, None])
    from oracle import ulp
    assert S.dtype == X.dtype and S.shape == X.shape and S.flags.c_contiguous
    assert_close(S, exact_s, 0.5 * ulp(exact_s, dtype) + 2.0**-24 * np.abs(exact_s), "S")
    exact, tol = expected(S, gamma, beta, 4, last, "silu")
    assert_close(Y, exact, tol)
    Y1 = nk.ort_skip_group_norm(X, gamma, beta, skip, b, groups=4, activation=1,
                                channels_last=last)
    assert_identical(Y1, Y)
    # Y is ort_group_norm of the returned S
    assert_identical(nk.ort_group_norm(S, gamma, beta, groups=4, activation=1,
                                       channels_last=last), Y)
    twin = spec.ort_skip_group_norm(X, gamma, beta, skip, b, groups=4, activation=1,
                                    channels_last=last, num_outputs=2,
                                    engine=reference.ENGINE)
    assert_close(twin[1], exact_s, 0.5 * ulp(exact_s, dtype) + 2.0**-24 * np.abs(exact_s),
                 "twin S")
    assert_close(twin[0], exact, tol, "twin Y")


def test_out_and_in_place(rng):
    X = data(rng, (2, 8, 4, 4), F32, 1)
    gamma, beta = np.ones(8, F32), np.zeros(8, F32)
    want = nk.ort_group_norm(X, gamma, beta, groups=2, activation=1)
    out = np.empty_like(X)
    assert nk.ort_group_norm(X, gamma, beta, groups=2, activation=1, out=out) is out
    assert_identical(out, want)
    Xc = X.copy()
    nk.ort_group_norm(Xc, gamma, beta, groups=2, activation=1, out=Xc)
    assert_identical(Xc, want)
    skip = rng.standard_normal(X.shape).astype(F32)
    want = nk.ort_skip_group_norm(X, gamma, beta, skip, groups=2, activation=0)
    Xc = X.copy()
    got = nk.ort_skip_group_norm(Xc, gamma, beta, skip, groups=2, activation=0, out=Xc)
    assert got is Xc
    assert_identical(Xc, want)


def test_errors(rng):
    X = data(rng, (1, 8, 2, 2), F32, 1)
    g, b = np.ones(8, F32), np.zeros(8, F32)
    cases = [
        (dict(activation=2), ValueError, "activation must be 0 or 1"),
        (dict(activation=1.0), TypeError, "activation must be an integer"),
        (dict(channels_last=2), ValueError, "channels_last must be 0 or 1"),
        (dict(groups=3), ValueError, "groups must divide"),
        (dict(groups=2.0), TypeError, "groups must be an integer"),
        (dict(epsilon=float("nan")), ValueError, "epsilon must be finite"),
    ]
    for kwargs, error, match in cases:
        args = dict(groups=2, activation=1) | kwargs
        with pytest.raises(error, match=match):
            nk.ort_group_norm(X, g, b, **args)
    with pytest.raises(ValueError, match="gamma must have shape"):
        nk.ort_group_norm(X, np.ones(4, F32), b, groups=2, activation=1)
    with pytest.raises(TypeError, match="M"):
        nk.ort_group_norm(X, g, b.astype(np.float16), groups=2, activation=1)
    with pytest.raises(ValueError, match="at least 3 dimensions"):
        nk.ort_group_norm(X.reshape(4, 8), g, b, groups=2, activation=1)
    with pytest.raises(TypeError, match="X"):
        nk.ort_group_norm(X.astype(np.int32), g, b, groups=2, activation=1)
    with pytest.raises(ValueError, match="skip must have shape"):
        nk.ort_skip_group_norm(X, g, b, np.ones((1, 8, 1, 1), F32), groups=2, activation=1)
    with pytest.raises(TypeError, match="T"):
        nk.ort_skip_group_norm(X, g, b, X.astype(F64), groups=2, activation=1)
    with pytest.raises(ValueError, match="bias must have shape"):
        nk.ort_skip_group_norm(X, g, b, X, np.ones(4, F32), groups=2, activation=1)
    with pytest.raises(ValueError, match="num_outputs must be 1 or 2"):
        nk.ort_skip_group_norm(X, g, b, X, groups=2, activation=1, num_outputs=3)
    with pytest.raises(ValueError, match="out"):
        nk.ort_group_norm(X, g, b, groups=2, activation=1, out=np.empty((1, 8, 2), F32))
    with pytest.raises(TypeError, match="groups"):
        nk.ort_group_norm(X, g, b, activation=1)  # groups is required


# --- the activations themselves ----------------------------------------------------------


@pytest.mark.parametrize("kind", ["relu", "silu", "gelu_tanh"])
@pytest.mark.parametrize("dtype", [F32, F64], ids=["float32", "float64"])
def test_activation_error_bound(rng, kind, dtype):
    """The epilogue alone (a per-channel normalization that leaves x unchanged: m 0,
    a 1, b 0), against a long-double evaluation, over the whole range where the
    exponential matters (to -110 and beyond float32's underflow)."""
    x = np.concatenate([rng.standard_normal(20000) * 3, rng.uniform(-120, 120, 20000),
                        rng.uniform(-800, 800, 2000)]).astype(dtype)
    y = np.empty_like(x)
    zero, one = np.zeros(1, dtype), np.ones(1, dtype)
    ENGINE.scale_shift(x, y, 1, x.size, zero, one, zero, "serial",
                       act=activations.for_kind(kind))
    L = np.longdouble
    xl = x.astype(L)
    with np.errstate(all="ignore"):
        if kind == "relu":
            exact = np.where(xl < 0, L(0), xl)
        else:
            c = 2 * np.sqrt(L(2) / L(np.pi))
            z = xl if kind == "silu" else c * (xl + L(0.044715) * xl ** 3)
            exact = xl / (1 + np.exp(-z))
    tol = activation_tolerance(kind, x.astype(F64), 0.0, dtype)
    err = np.abs(y.astype(L) - exact).astype(F64)
    finite = np.isfinite(exact.astype(F64))
    assert np.all(err[finite] <= tol[finite]), float(np.max(err[finite] / tol[finite]))


@pytest.mark.parametrize("kind", ["relu", "silu", "gelu_tanh", "gelu"])
@pytest.mark.parametrize("dtype", [F32, F64], ids=["float32", "float64"])
def test_vector_and_scalar_activations_agree(rng, kind, dtype):
    """The vector bodies and the scalar loop (a plane shorter than a vector) give the
    same bits for the same values."""
    x = (rng.standard_normal(4099) * 40).astype(dtype)
    act = activations.for_kind(kind)
    zero, one = np.zeros(1, dtype), np.ones(1, dtype)
    vector = np.empty_like(x)
    ENGINE.scale_shift(x, vector, 1, x.size, zero, one, zero, "serial", act=act)
    scalar = np.empty_like(x)
    n = 7  # planes of 7: the scalar loop only
    xs = x[:x.size // n * n]
    ENGINE.scale_shift(xs, scalar[:xs.size], 1, n, zero, one, zero, "serial", act=act)
    assert_identical(scalar[:xs.size], vector[:xs.size])


def test_activation_markers():
    assert activations.for_kind(None) is activations.NONE
    assert activations.for_kind("silu") is activations.SILU
    with pytest.raises(ValueError, match="no activation 'gelu_erf'"):
        activations.for_kind("gelu_erf")
    import pickle

    assert pickle.loads(pickle.dumps(activations.RELU)) is activations.RELU


def test_onnx_evaluator_runs_a_model_with_group_norm_and_skip_group_norm(rng):
    """A two-node com.microsoft model (GroupNorm with SiLU, then SkipGroupNorm with a
    per-(n, c) skip, a bias and both outputs) in onnx.reference.ReferenceEvaluator with
    normkernels' ops, against the float64 oracle; onnxruntime's CPU provider has no
    kernel for either node."""
    onnx = pytest.importorskip("onnx")
    from onnx import TensorProto, helper
    from onnx.reference import ReferenceEvaluator

    import normkernels.onnx as nko

    N, H, W, C, G = 2, 5, 3, 16, 4
    X = data(rng, (N, C, H, W), F32, 1)
    g1, b1 = rng.standard_normal(C).astype(F32), rng.standard_normal(C).astype(F32)
    g2, b2 = rng.standard_normal(C).astype(F32), rng.standard_normal(C).astype(F32)
    skip = rng.standard_normal((N, C)).astype(F32)
    bias = rng.standard_normal(C).astype(F32)
    f = TensorProto.FLOAT
    nodes = [helper.make_node("GroupNorm", ["X", "g1", "b1"], ["H"], domain="com.microsoft",
                              groups=G, activation=1, epsilon=EPS),
             helper.make_node("SkipGroupNorm", ["H", "g2", "b2", "skip", "bias"], ["Y", "S"],
                              domain="com.microsoft", groups=G, activation=0, epsilon=EPS)]
    inits = [onnx.numpy_helper.from_array(a, n) for a, n in
             ((g1, "g1"), (b1, "b1"), (g2, "g2"), (b2, "b2"), (bias, "bias"))]
    graph = helper.make_graph(nodes, "gn", [helper.make_tensor_value_info("X", f, X.shape),
                                            helper.make_tensor_value_info("skip", f, skip.shape)],
                              [helper.make_tensor_value_info("Y", f, X.shape),
                               helper.make_tensor_value_info("S", f, X.shape)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21),
                                                    helper.make_opsetid("com.microsoft", 1)])
    Y, S = ReferenceEvaluator(model, new_ops=nko.reference_ops()).run(
        None, {"X": X, "skip": skip})
    H_exact, H_tol = expected(X, g1, b1, G, 1, "silu")
    H_got = nk.ort_group_norm(X, g1, b1, groups=G, activation=1)
    assert_close(H_got, H_exact, H_tol)
    S_exact = H_got.astype(F64) + skip[:, None, None, :] + bias
    assert_close(S, S_exact, 2.0**-24 * np.abs(S_exact) + 1e-300, "S")
    Y_exact, Y_tol = expected(S, g2, b2, G, 1, None)
    assert_close(Y, Y_exact, Y_tol)
    assert ("com.microsoft", "GroupNorm") in {(o.op_domain, o.__name__)
                                             for o in nko.reference_ops()}


@pytest.mark.parametrize("last", [1, 0], ids=["nhwc", "nchw"])
def test_bind_runs_the_plain_call(rng, last):
    """bind of GroupNorm with SiLU: the bound kernels have no epilogue, so the bound
    call is the plain call, reading the arrays' current contents."""
    X = data(rng, (1, 16, 4, 4), F32, last)
    g, b = rng.standard_normal(16).astype(F32), rng.standard_normal(16).astype(F32)
    out = np.empty_like(X)
    call = nk.bind(nk.ort_group_norm, X, g, b, groups=4, activation=1, channels_last=last,
                   out=out)
    X[...] = data(rng, (1, 16, 4, 4), F32, last)
    assert call() is out
    assert_identical(out, nk.ort_group_norm(X, g, b, groups=4, activation=1,
                                            channels_last=last))


# --- activation= on the ONNX-style operators ------------------------------------------


def _ops(X, p, last, kind):
    """BatchNormalization inference and training, InstanceNormalization and
    GroupNormalization of X with the epilogue ``kind``."""
    fmt = "NXC" if last else "NCX"
    scale, B, mean, var = p
    return {
        "bn": nk.batch_normalization(X, scale, B, mean, var, data_format=fmt, activation=kind),
        "bn-training": nk.batch_normalization(X, scale, B, mean, var, training_mode=1,
                                              data_format=fmt, activation=kind)[0],
        "instance": nk.instance_normalization(X, scale, B, data_format=fmt, activation=kind),
        "group": nk.group_normalization(X, scale, B, num_groups=4, data_format=fmt,
                                        activation=kind),
    }


@pytest.mark.parametrize("kind", ["relu", "silu", "gelu_tanh", "gelu"])
@pytest.mark.parametrize("dtype", [F32, F64], ids=["float32", "float64"])
@pytest.mark.parametrize("last", [1, 0], ids=["nxc", "ncx"])
def test_activation_keyword_applies_the_epilogue_to_y(rng, last, dtype, kind):
    """float32/float64 Y is the compute dtype's value itself, so the activated Y is the
    activation of the plain call's Y within the activation's own error bound: the
    same statistics, the same affine arithmetic, then the epilogue."""
    X = data(rng, (2, 8, 7, 5), dtype, last)
    p = (rng.standard_normal(8).astype(dtype), rng.standard_normal(8).astype(dtype),
         rng.standard_normal(8).astype(dtype), rng.uniform(0.5, 2, 8).astype(dtype))
    plain = _ops(X, p, last, None)
    fused = _ops(X, p, last, kind)
    for name, Y in plain.items():
        tol = activation_tolerance(kind, Y.astype(F64), 0.0, dtype)
        assert_close(fused[name], activation(kind, Y), tol, f"{name} + {kind}")
    if kind == "relu":  # exact: a select
        for name, Y in plain.items():
            assert_identical(fused[name], np.where(Y < 0, dtype.type(0), Y))


@pytest.mark.parametrize("kind", ["relu", "silu", "gelu_tanh", "gelu"])
@pytest.mark.parametrize("dtype", FLOATS, ids=FLOAT_IDS)
@pytest.mark.parametrize("last", [1, 0], ids=["nxc", "ncx"])
def test_group_normalization_activation_matches_oracle(rng, last, dtype, kind):
    X = data(rng, (2, 16, 9, 5), dtype, last)
    scale, B = rng.standard_normal(16).astype(dtype), rng.standard_normal(16).astype(dtype)
    Y = nk.group_normalization(X, scale, B, num_groups=4, data_format="NXC" if last else "NCX",
                               activation=kind)
    exact, tol = expected(X, scale, B, 4, last, kind)
    assert_close(Y, exact, tol)


def test_a_plan_never_serves_another_activation(rng):
    """The same arrays called without, with, and again without an activation (and the
    reverse): each result is its own (plans are keyed without the activation, so calls
    with one take no plan)."""
    X = data(rng, (1, 8, 6, 6), F32, 0)
    s, b = rng.standard_normal(8).astype(F32), rng.standard_normal(8).astype(F32)
    out = np.empty_like(X)
    for order in ((None, "relu", None, "relu"), ("relu", None, "relu", None)):
        for kind in order * 2:
            Y = nk.group_normalization(X, s, b, num_groups=2, activation=kind, out=out)
            plain = nk.group_normalization(X, s, b, num_groups=2)
            want = plain if kind is None else np.where(plain < 0, F32.type(0), plain)
            assert_identical(Y, want)
            Y = nk.instance_normalization(X, s, b, activation=kind, out=out)
            plain = nk.instance_normalization(X, s, b)
            want = plain if kind is None else np.where(plain < 0, F32.type(0), plain)
            assert_identical(Y, want)


def test_activation_keyword_errors(rng):
    X = data(rng, (1, 4, 2, 2), F32, 0)
    s = np.ones(4, F32)
    for bad in ("gelu_erf", "SiLU", 1, True):
        with pytest.raises(ValueError, match="activation must be None or one of"):
            nk.group_normalization(X, s, s, num_groups=2, activation=bad)
        with pytest.raises(ValueError, match="activation must be None or one of"):
            nk.batch_normalization(X, s, s, s, s, activation=bad)
        with pytest.raises(ValueError, match="activation must be None or one of"):
            nk.instance_normalization(X, s, s, activation=bad)
    from normkernels.ops.common import EPILOGUES
    assert EPILOGUES == activations.KINDS[1:]


# --- add= (a residual before the activation: oneDNN's norm-add-relu) -----------------


def _ops_add(X, p, last, kind, add, path=None):
    """The four per-channel normalizations with an epilogue, on the spec layer (a path
    forced) or the public functions."""
    from normkernels.ops import batch_normalization as bn_spec
    from normkernels.ops import group_normalization as gn_spec
    from normkernels.ops import instance_normalization as in_spec

    fmt = "NXC" if last else "NCX"
    scale, B, mean, var = p
    kw = dict(data_format=fmt, activation=kind, add=add)
    if path is not None:
        kw.update(engine=ENGINE, path=path)
        bn, inst, gn = (bn_spec.batch_normalization, in_spec.instance_normalization,
                        gn_spec.group_normalization)
    else:
        bn, inst, gn = nk.batch_normalization, nk.instance_normalization, nk.group_normalization
    return {
        "bn": bn(X, scale, B, mean, var, **kw),
        "bn-training": bn(X, scale, B, mean, var, training_mode=1, **kw)[0],
        "instance": inst(X, scale, B, **kw),
        "group": gn(X, scale, B, num_groups=4, **kw),
    }


@pytest.mark.parametrize("kind", [None, "relu", "silu"])
@pytest.mark.parametrize("dtype", [F32, F64], ids=["float32", "float64"])
@pytest.mark.parametrize("last", [1, 0], ids=["nxc", "ncx"])
def test_add_is_added_before_the_activation(rng, last, dtype, kind):
    """float32/float64: the fused result is act(Y + add) with Y the plain call's (the
    compute dtype's own value) and the add in the compute dtype: bit for bit for none
    and ReLU, within the activation's bound for SiLU; on every path."""
    X = data(rng, (2, 8, 7, 5), dtype, last)
    R = (rng.standard_normal(X.shape) * 2).astype(dtype)
    p = (rng.standard_normal(8).astype(dtype), rng.standard_normal(8).astype(dtype),
         rng.standard_normal(8).astype(dtype), rng.uniform(0.5, 2, 8).astype(dtype))
    plain = _ops(X, p, last, None)
    fused = _ops_add(X, p, last, kind, R)
    for name, Y in plain.items():
        summed = Y + R  # the kernels' one addition, in the compute dtype
        if kind in (None, "relu"):
            want = summed if kind is None else np.where(summed < 0, dtype.type(0), summed)
            assert_identical(fused[name], want)
        else:
            tol = activation_tolerance(kind, summed.astype(F64), 0.0, dtype)
            assert_close(fused[name], activation(kind, summed), tol, f"{name} + add + {kind}")
    for path in ("serial", "parallel", "streaming"):
        for name, Y in _ops_add(X, p, last, kind, R, path).items():
            assert_identical(Y, fused[name])


@pytest.mark.parametrize("dtype", [np.float16, ml_dtypes.bfloat16], ids=["float16", "bfloat16"])
@pytest.mark.parametrize("last", [1, 0], ids=["nxc", "ncx"])
def test_add_and_relu_of_16_bit_x_match_the_oracle(rng, last, dtype):
    """16-bit X: the sum and the activation in float32, rounded once."""
    X = data(rng, (2, 16, 9, 5), dtype, last)
    R = rng.standard_normal(X.shape).astype(dtype)
    scale, B = rng.standard_normal(16).astype(dtype), rng.standard_normal(16).astype(dtype)
    fmt = "NXC" if last else "NCX"
    Y = nk.group_normalization(X, scale, B, num_groups=4, data_format=fmt, activation="relu",
                               add=R)
    exact, mean, var, s, b = group_norm(X, scale, B, 4, EPS, fmt)
    tol = group_tolerance(X, s, b, mean, var, EPS, fmt, F32)  # the float32 value's bound
    summed = exact + R.astype(F64)
    tol = activation_tolerance("relu", summed, tol + 2.0**-24 * np.abs(summed), X.dtype)
    assert_close(Y, activation("relu", summed), tol)
    twin = gn_twin(X, scale, B, fmt, R)
    assert_close(twin, activation("relu", summed), tol, "twin Y")


def gn_twin(X, scale, B, fmt, R):
    from normkernels.ops import group_normalization as gn_spec

    return gn_spec.group_normalization(X, scale, B, num_groups=4, data_format=fmt,
                                       activation="relu", add=R, engine=reference.ENGINE)


def test_add_in_place_views_bind_and_errors(rng):
    X = data(rng, (2, 8, 6, 6), F32, 0)
    R = rng.standard_normal(X.shape).astype(F32)
    s, b = rng.standard_normal(8).astype(F32), rng.standard_normal(8).astype(F32)
    want = nk.group_normalization(X, s, b, num_groups=2, activation="relu", add=R)
    Rc = R.copy()
    assert nk.group_normalization(X, s, b, num_groups=2, activation="relu", add=Rc,
                                  out=Rc) is Rc  # the residual stream updated in place
    assert_identical(Rc, want)
    strided = np.zeros((2, 8, 6, 12), F32)[..., ::2]
    strided[...] = R
    assert_identical(nk.group_normalization(X, s, b, num_groups=2, activation="relu",
                                            add=strided), want)
    out = np.empty_like(X)
    call = nk.bind(nk.group_normalization, X, s, b, num_groups=2, activation="relu", add=R,
                   out=out)
    R[...] = rng.standard_normal(R.shape)
    call()
    assert_identical(out, nk.group_normalization(X, s, b, num_groups=2, activation="relu",
                                                 add=R))
    with pytest.raises(ValueError, match="add must have X's shape and dtype"):
        nk.group_normalization(X, s, b, num_groups=2, add=R[:1])
    with pytest.raises(ValueError, match="add must have X's shape and dtype"):
        nk.batch_normalization(X, s, b, s, np.abs(s), add=R.astype(F64))
    with pytest.raises(ValueError, match="add= needs spatial=1"):
        nk.batch_normalization(X, s, b, s, np.abs(s), opset=6, spatial=0, add=R,
                               training_mode=None, is_test=1)
    big = np.empty(X.size + 1, F32)
    with pytest.raises(ValueError, match="out overlaps add"):
        nk.instance_normalization(X, s, b, add=big[:-1].reshape(X.shape),
                                  out=big[1:].reshape(X.shape))

"""Backward passes through the activation and residual epilogues (BN + ReLU, BN + add +
ReLU, GroupNorm + SiLU, ...) and of the modulated normalizations (AdaGroupNorm,
AdaLN), against float64 oracles written from the definitions: ``dZ = dY * act'(Z)``,
``dR = dZ``, then the normalization's gradient with dZ (tests/oracle.py's
:func:`normalization_backward`); against PyTorch's autograd where torch is installed."""

import math

import numpy as np
import pytest
from arrays import FLOAT_IDS, FLOATS, assert_identical
from oracle import (
    GELU_A,
    assert_close,
    backward_tolerance,
    compute_dtype,
    gamma,
    group_statistics,
    group_tolerance,
    tolerance,
    ulp,
    unit_roundoff,
)

import normkernels as nk
from normkernels import reference
from normkernels.ops import modulated as ada_spec

F16, BF16, F32, F64 = FLOATS
EPS = 1e-5
SMOOTH = ("silu", "gelu_tanh", "gelu")


def to_ncx(A, fmt):
    return np.moveaxis(A, -1, 1) if fmt == "NXC" and A.ndim > 2 else A


def from_ncx(A, fmt):
    return np.ascontiguousarray(np.moveaxis(A, 1, -1)) if fmt == "NXC" and A.ndim > 2 else A


def derivative(kind, z):
    """``act'(z)`` in float64 (PyTorch's formulas) and a bound of ``|act''|``."""
    with np.errstate(all="ignore"):
        if kind == "relu":
            return np.where(z > 0, 1.0, 0.0), 0.0
        if kind == "gelu":
            cdf = 0.5 * np.vectorize(math.erfc, otypes=[F64])(-z / np.sqrt(2.0))
            return cdf + z * np.exp(-0.5 * z * z) / np.sqrt(2 * np.pi), 0.5
        w = z if kind == "silu" else 2 * GELU_A * (z + 0.044715 * z ** 3)
        s = np.exp(-np.logaddexp(0.0, -w))
        if kind == "silu":
            return s * (1 + z * (1 - s)), 0.5
        dw = 2 * GELU_A * (1 + 3 * 0.044715 * z ** 2)
        return s + z * s * (1 - s) * dw, 1.0


def grouped(v, fmt, groups):
    """float64 ``v`` (X's shape and layout) as (statistic groups, elements): a channel's
    elements (``groups`` None: batch normalization) or an (n, group)'s."""
    x = to_ncx(np.asarray(v, F64), fmt)
    if groups is None:
        return np.moveaxis(x, 1, 0).reshape(x.shape[1], -1)
    return x.reshape(x.shape[0] * groups, -1)


def ungrouped(g, X, fmt, groups):
    shape = to_ncx(X, fmt).shape
    if groups is None:
        x = np.moveaxis(g.reshape((shape[1], shape[0], *shape[2:])), 0, 1)
    else:
        x = g.reshape(shape)
    return np.moveaxis(x, 1, -1) if fmt == "NXC" and len(shape) > 2 else x


def per_element(p, X, fmt, groups):
    """A per-channel parameter broadcast to X's (NCX) shape, then grouped."""
    shape = to_ncx(X, fmt).shape
    b = np.broadcast_to(np.asarray(p, F64).reshape((1, shape[1]) + (1,) * (len(shape) - 2)),
                        shape)
    return grouped(from_ncx(b, fmt) if fmt == "NXC" else b, fmt, groups)


def expected(kind, dY, X, scale, B, R, mean, r, z_tol, fmt, groups, training=True):
    """float64 ``(dX, dscale, dB, dR)`` and their tolerances: ``mean``, ``r`` per
    statistic group, ``z_tol``: the bound of the kernels' Z (X's shape)."""
    x, dy = grouped(X, fmt, groups), grouped(dY, fmt, groups)
    s, b = per_element(scale, X, fmt, groups), per_element(B, X, fmt, groups)
    m, rr = mean[:, None], r[:, None]
    with np.errstate(all="ignore"):
        z = s * (x - m) * rr + b + (0.0 if R is None else grouped(R, fmt, groups))
    slope, curvature = derivative(kind, z) if kind else (np.ones_like(z), 0.0)
    dz = dy * slope
    zt = grouped(z_tol, fmt, groups)
    u = unit_roundoff(compute_dtype(X.dtype))
    if kind == "relu" or kind is None:
        e = np.zeros_like(dz)  # dY or 0, exact (the tests keep Z away from 0)
    else:
        w = (0.5 * z * z if kind == "gelu" else
             np.abs(z) * (1 if kind == "silu" else 2 * GELU_A * (1 + 0.05 * z * z)))
        e = np.abs(dy) * (curvature * zt + (24 + 8 * w) * u * (np.abs(slope) + 1))
    x_hat = (x - m) * rr
    if training:
        dX = rr * (s * dz - (s * dz).mean(axis=1, keepdims=True)
                   - x_hat * (s * dz * x_hat).mean(axis=1, keepdims=True))
        spread = np.abs(s) * rr * (e + e.mean(axis=1, keepdims=True)
                                   + np.abs(x_hat) * (e * np.abs(x_hat)).mean(axis=1,
                                                                              keepdims=True))
    else:
        dX = s * rr * dz
        spread = np.abs(s) * rr * e
    # the bound of g = dZ * scale with scale 1 (scale may vary inside a group)
    tol = backward_tolerance(dz * s, x, 1.0, m, rr, 1, dX, X.dtype, training) + spread
    smooth_16 = kind in SMOOTH and X.dtype.itemsize == 2
    dR_tol = e + (0.5 * ulp(np.abs(dz) + e, X.dtype) if smooth_16 else 0.0)
    back = lambda g: ungrouped(g, X, fmt, groups)  # noqa: E731
    sums = lambda g: to_ncx(back(g), fmt).sum(axis=(0, *range(2, X.ndim)))  # noqa: E731
    return ((back(dX), back(tol)), (sums(dz * x_hat), sums(e * np.abs(x_hat))),
            (sums(dz), sums(e)), (back(dz), back(dR_tol)))


def check(got, want, what, dtype):
    (dX, dscale, dB, *dR) = got
    (eX, tX), (es, ts), (eb, tb), (er, tr) = want
    assert dX.dtype == dtype
    assert_close(dX, eX, tX, f"{what} dX")
    rounding = 2.0 ** -(8 if dscale.dtype == BF16 else 11 if dscale.dtype == F16 else 24)
    for g, e, t, name in ((dscale, es, ts, "dscale"), (dB, eb, tb, "dB")):
        assert_close(g, e, t + np.abs(e) * rounding + 1e-9 * (1 + np.abs(e).max()),
                     f"{what} {name}")
    if dR:
        assert dR[0].dtype == dtype and dR[0].shape == dX.shape
        assert_close(dR[0], er, tr, f"{what} dR")


def bn_case(rng, shape, dtype, fmt, offset=3.0):
    C = shape[1]
    cshape = (1, C) + (1,) * (len(shape) - 2)
    X = (rng.standard_normal(shape) * rng.uniform(0.5, 2, C).reshape(cshape)
         + offset * rng.uniform(-1, 1, C).reshape(cshape))
    X = from_ncx(X.astype(dtype), fmt)
    dY = from_ncx(rng.standard_normal(shape).astype(dtype), fmt)
    R = from_ncx(rng.standard_normal(shape).astype(dtype), fmt)
    scale = (rng.uniform(0.5, 2, C) * rng.choice([-1, 1], C)).astype(F32)
    B = rng.uniform(-1, 1, C).astype(F32)
    x = to_ncx(X.astype(F64), fmt)
    axes = (0, *range(2, x.ndim))
    return X, dY, R, scale, B, x.mean(axis=axes), x.var(axis=axes)


def z_bound(X, scale, B, R, mean, var, fmt):
    """The bound of Z as the kernels compute it (the compute dtype, before the
    activation): the forward's own bound, plus the residual's add."""
    cd = compute_dtype(X.dtype)
    tol = tolerance(X, scale, B, mean, var, EPS, fmt, cd, mean_rounded=True)
    if R is not None:
        tol = tol + gamma(2, cd) * (np.abs(R.astype(F64)) + 10)
    return tol


BN_SHAPES = {"4d": (3, 4, 9, 11), "planes": (2, 3, 40, 40), "3d": (5, 3, 7), "n1": (1, 5, 6, 6),
             "5d": (2, 3, 3, 4, 5)}


@pytest.mark.parametrize("training", [True, False], ids=["training", "eval"])
@pytest.mark.parametrize("fmt", ["NCX", "NXC"])
@pytest.mark.parametrize("dtype", FLOATS, ids=FLOAT_IDS)
@pytest.mark.parametrize("kind,add", [("relu", False), ("relu", True), ("silu", False),
                                      ("gelu_tanh", True), ("gelu", False), (None, True)])
@pytest.mark.parametrize("shape_id", ["4d", "3d", "n1", "5d"])
def test_batch_normalization_epilogue_backward(rng, shape_id, kind, add, dtype, fmt, training):
    X, dY, R, scale, B, mean, var = bn_case(rng, BN_SHAPES[shape_id], dtype, fmt)
    R = R if add else None
    before = [v.copy() for v in (X, dY, scale, B) + ((R,) if add else ())]
    kw = dict(epsilon=EPS, training=training, data_format=fmt, activation=kind, B=B, add=R)
    got = nk.batch_normalization_backward(dY, X, scale, mean, var, **kw)
    assert len(got) == (4 if add else 3)
    for a, b in zip((X, dY, scale, B) + ((R,) if add else ()), before, strict=True):
        assert_identical(a, b)  # inputs untouched
    r = 1 / np.sqrt(var + EPS)
    want = expected(kind, dY, X, scale, B, R, mean, r, z_bound(X, scale, B, R, mean, var, fmt),
                    fmt, None, training)
    check(got, want, "BN", dtype)
    twin = reference.batch_normalization_backward(dY, X, scale, mean, var, **kw)
    check(twin, want, "twin", dtype)
    # inv_std instead of var: the same gradients within the same bounds
    kw_inv = dict(kw, epsilon=None)
    check(nk.batch_normalization_backward(dY, X, scale, mean, inv_std=r, **kw_inv), want,
          "inv_std", dtype)


@pytest.mark.parametrize("fmt", ["NCX", "NXC"])
@pytest.mark.parametrize("dtype", FLOATS, ids=FLOAT_IDS)
@pytest.mark.parametrize("add", [False, True])
def test_relu_mask_from_y_is_exact(rng, dtype, fmt, add):
    """oneDNN's fuse_norm_relu: with the forward's Y the mask is ``Y > 0``, dR is dY or
    +0 exactly, and the result equals the one recomputed from B (Z away from 0)."""
    X, dY, R, scale, B, mean, var = bn_case(rng, (4, 3, 6, 7), dtype, fmt)
    R = R if add else None
    Y = nk.batch_normalization(X, scale, B, mean.astype(F32), var.astype(F32),
                               epsilon=EPS, activation="relu", add=R,
                               **({} if fmt == "NCX" else {"data_format": fmt}))
    m32, v32 = mean.astype(F32).astype(F64), var.astype(F32).astype(F64)
    kw = dict(epsilon=EPS, training=False, data_format=fmt, activation="relu", add=R)
    from_y = nk.batch_normalization_backward(dY, X, scale, m32, v32, Y=Y, **kw)
    from_b = nk.batch_normalization_backward(dY, X, scale, m32, v32, B=B, **kw)
    for a, b in zip(from_y, from_b, strict=True):
        assert_identical(a, b)
    if add:
        dR = from_y[3]
        mask = Y.astype(F64) > 0
        assert_identical(dR, np.where(mask, dY, np.zeros_like(dY)))


def test_relu_mask_takes_nan_and_inf(rng):
    """A NaN or -inf in Y masks its gradient to 0, and an infinite dY under a 0 of the
    mask gives 0 (selected, never multiplied), as PyTorch's threshold_backward."""
    X, dY, R, scale, _, mean, var = bn_case(rng, (2, 3, 4, 5), F32, "NCX")
    Y = np.abs(rng.standard_normal(X.shape)).astype(F32) + 0.5
    Y[0, 0, 0, :3] = [np.nan, 0.0, -0.0]
    Y[1, 2, 1, 1] = -np.inf
    dY[0, 0, 0, :3] = [np.inf, -np.inf, np.nan]
    dY[1, 2, 1, 1] = np.inf
    _, _, _, dR = nk.batch_normalization_backward(dY, X, scale, mean, var, epsilon=EPS,
                                                  activation="relu", Y=Y, add=R)
    assert_identical(dR[0, 0, 0, :3], np.zeros(3, F32))
    assert dR[1, 2, 1, 1] == 0
    keep = Y > 0
    assert_identical(dR[keep], dY[keep])


GN_SHAPES = [((3, 6, 9, 11), 3), ((2, 8, 3, 4, 5), 4), ((2, 6, 7), 6), ((1, 4, 40, 40), 2)]


@pytest.mark.parametrize("fmt", ["NCX", "NXC"])
@pytest.mark.parametrize("dtype", FLOATS, ids=FLOAT_IDS)
@pytest.mark.parametrize("kind,add", [("silu", False), ("silu", True), ("relu", True),
                                      ("gelu_tanh", False), ("gelu", True)])
@pytest.mark.parametrize("shape,G", GN_SHAPES)
def test_group_normalization_epilogue_backward(rng, shape, G, kind, add, dtype, fmt):
    C = shape[1]
    X = from_ncx((rng.standard_normal(shape) * 2 + 3).astype(dtype), fmt)
    dY = from_ncx(rng.standard_normal(shape).astype(dtype), fmt)
    R = from_ncx(rng.standard_normal(shape).astype(dtype), fmt) if add else None
    scale = (rng.uniform(0.5, 2, C) * rng.choice([-1, 1], C)).astype(dtype)
    B = rng.uniform(-1, 1, C).astype(dtype)
    kw = dict(num_groups=G, epsilon=EPS, data_format=fmt, activation=kind, B=B, add=R)
    got = nk.group_normalization_backward(dY, X, scale, **kw)
    mean, var, gmean, gvar = group_statistics(X, G, fmt)
    cd = compute_dtype(dtype)
    z_tol = group_tolerance(X, scale, B, mean, var, EPS, fmt, cd)
    if R is not None:
        z_tol = z_tol + gamma(2, cd) * (np.abs(R.astype(F64)) + 10)
    want = expected(kind, dY, X, scale, B, R, gmean.ravel(), 1 / np.sqrt(gvar.ravel() + EPS),
                    z_tol, fmt, G)
    check(got, want, "GN", dtype)
    check(reference.group_normalization_backward(dY, X, scale, **kw), want, "twin", dtype)
    if G == C and X.ndim > 2:  # groups of one channel: instance normalization
        inst = nk.instance_normalization_backward(dY, X, scale, epsilon=EPS, data_format=fmt,
                                                  activation=kind, B=B, add=R)
        check(inst, want, "IN", dtype)


def test_out_and_views(rng):
    """``out=`` (may be dY), strided views and a channels-last NCX tensor give the bits
    of the plain call."""
    X, dY, R, scale, B, _, _ = bn_case(rng, (3, 4, 8, 10), F32, "NCX")
    kw = dict(num_groups=2, epsilon=EPS, activation="silu", B=B, add=R)
    want = nk.group_normalization_backward(dY, X, scale, **kw)
    out = np.empty_like(X)
    got = nk.group_normalization_backward(dY, X, scale, out=out, **kw)
    assert got[0] is out
    assert_identical(out, want[0])
    dY2 = dY.copy()
    got = nk.group_normalization_backward(dY2, X, scale, out=dY2, **kw)
    assert got[0] is dY2
    assert_identical(dY2, want[0])
    big = np.zeros((6, 4, 16, 10), F32)
    big[::2, :, ::2] = X
    vw = big[::2, :, ::2]
    for a, b in zip(nk.group_normalization_backward(dY, vw, scale, **kw), want, strict=True):
        assert_identical(a, b)
    cl = np.ascontiguousarray(np.moveaxis(X, 1, -1)).transpose(0, 3, 1, 2)  # NCX, NHWC memory
    for a, b in zip(nk.group_normalization_backward(dY, cl, scale, **kw), want, strict=True):
        assert_identical(a, b)


def test_large_offsets(rng):
    X, dY, R, scale, B, mean, var = bn_case(rng, (4, 3, 9, 9), F32, "NCX", offset=0.0)
    X = (X.astype(F64) + 1e4).astype(F32)
    x = X.astype(F64)
    mean, var = x.mean(axis=(0, 2, 3)), x.var(axis=(0, 2, 3))
    got = nk.batch_normalization_backward(dY, X, scale, mean, var, epsilon=EPS,
                                          activation="silu", B=B, add=R)
    want = expected("silu", dY, X, scale, B, R, mean, 1 / np.sqrt(var + EPS),
                    z_bound(X, scale, B, R, mean, var, "NCX"), "NCX", None)
    check(got, want, "offset", F32)


@pytest.mark.parametrize("kwargs,error,match", [
    (dict(activation="silu", Y="y"), ValueError, "Y gives the mask of activation='relu'"),
    (dict(activation="silu"), ValueError, "needs B"),
    (dict(activation="relu"), ValueError, "or Y"),
    (dict(B="b"), ValueError, "give activation="),
    (dict(activation="swish", B="b"), ValueError, "activation must be None or one of"),
    (dict(activation="relu", B="b", add="short"), ValueError, "add must have X's shape"),
    (dict(activation="relu", Y="short"), ValueError, "Y .the forward's output. must have"),
    (dict(activation="relu", B="wrong"), ValueError, "B"),
])
def test_errors(rng, kwargs, error, match):
    X, dY, _, scale, B, mean, var = bn_case(rng, (2, 3, 4, 5), F32, "NCX")
    values = {"y": X, "b": B, "short": X[:1], "wrong": np.ones(4, F32)}
    kw = {k: values.get(v, v) if isinstance(v, str) and k != "activation" else v
          for k, v in kwargs.items()}
    with pytest.raises(error, match=match):
        nk.batch_normalization_backward(dY, X, scale, mean, var, **kw)
    with pytest.raises(error, match=match):
        nk.group_normalization_backward(dY, X, scale, num_groups=3, **kw)


def _torch():
    try:
        import torch as t
    except ImportError:
        pytest.skip("torch is not installed")
    return t


@pytest.mark.parametrize("fmt", ["NCX", "NXC"])
def test_agrees_with_torch(rng, fmt):
    """BN (training) + add + ReLU and GroupNorm + SiLU against PyTorch's autograd in
    float64 (a peer's independent evaluation of the same definitions)."""
    t = _torch()
    F = t.nn.functional
    X, dY, R, scale, B, mean, var = bn_case(rng, (3, 4, 6, 5), F64, "NCX")
    scale, B = scale.astype(F64), B.astype(F64)  # float64 parameter gradients
    leaves = [t.tensor(v, requires_grad=True) for v in (X, scale.astype(F64),
                                                         B.astype(F64), R)]
    tx, ts, tb, tr = leaves
    (F.relu(F.batch_norm(tx, None, None, ts, tb, training=True, eps=EPS) + tr)
     * t.tensor(dY)).sum().backward()
    got = nk.batch_normalization_backward(from_ncx(dY, fmt), from_ncx(X, fmt), scale, mean, var,
                                          epsilon=EPS, data_format=fmt, activation="relu",
                                          B=B, add=from_ncx(R, fmt))
    for g, leaf in zip(got, (tx, ts, tb, tr), strict=True):
        want = leaf.grad.numpy()
        g = to_ncx(g, fmt) if g.ndim > 1 else g
        assert_close(g, want, 1e-12 * (1 + np.abs(want)) * X.size)
    for kind, act in (("silu", F.silu), ("gelu", F.gelu), ("gelu_tanh",
                                                          lambda v: F.gelu(v, approximate="tanh"))):
        leaves = [t.tensor(v, requires_grad=True) for v in (X, scale, B)]
        tx, ts, tb = leaves
        (act(F.group_norm(tx, 2, ts, tb, EPS)) * t.tensor(dY)).sum().backward()
        got = nk.group_normalization_backward(from_ncx(dY, fmt), from_ncx(X, fmt), scale,
                                              num_groups=2, epsilon=EPS, data_format=fmt,
                                              activation=kind, B=B)
        for g, leaf in zip(got, leaves, strict=True):
            want = leaf.grad.numpy()
            g = to_ncx(g, fmt) if g.ndim > 1 else g
            assert_close(g, want, 1e-12 * (1 + np.abs(want)) * X.size, kind)


# --- AdaGroupNorm and AdaLN ---------------------------------------------------------------


@pytest.mark.parametrize("fmt", ["NCX", "NXC"])
@pytest.mark.parametrize("dtype", FLOATS, ids=FLOAT_IDS)
@pytest.mark.parametrize("shape,G", [((2, 6, 5, 7), 3), ((1, 8, 30, 30), 4), ((3, 4, 9), 4)])
def test_ada_group_norm_backward(rng, shape, G, dtype, fmt):
    N, C = shape[:2]
    X = from_ncx((rng.standard_normal(shape) * 2 + 1).astype(dtype), fmt)
    dY = from_ncx(rng.standard_normal(shape).astype(dtype), fmt)
    shift = rng.standard_normal((N, C)).astype(F32)
    scale = (rng.standard_normal((N, C)) * 0.5).astype(dtype)
    before = [v.copy() for v in (X, dY, shift, scale)]
    dX, dshift, dscale = nk.ada_group_norm_backward(dY, X, shift, scale, num_groups=G,
                                                    data_format=fmt)
    for a, b in zip((X, dY, shift, scale), before, strict=True):
        assert_identical(a, b)
    assert dshift.shape == dscale.shape == (N, C)
    assert dshift.dtype == F32 and dscale.dtype == dtype and dX.dtype == dtype
    # the oracle: per (n, group) statistics, per-(n, c) gamma = 1 + scale
    x, dy = to_ncx(X.astype(F64), fmt), to_ncx(dY.astype(F64), fmt)
    gx, gdy = x.reshape(N, G, -1), dy.reshape(N, G, -1)
    mean = gx.mean(axis=2, keepdims=True)
    r = 1 / np.sqrt(gx.var(axis=2, keepdims=True) + EPS)
    gam = np.broadcast_to((1 + scale.astype(F64)).reshape((N, C) + (1,) * (x.ndim - 2)),
                          x.shape).reshape(N, G, -1)
    g = gdy * gam
    x_hat = (gx - mean) * r
    exact = r * (g - g.mean(axis=2, keepdims=True)
                 - x_hat * (g * x_hat).mean(axis=2, keepdims=True))
    tol = backward_tolerance(g, gx, 1.0, mean, r, 2, exact, dtype)
    assert_close(to_ncx(dX, fmt), exact.reshape(x.shape), tol.reshape(x.shape), "dX")
    red = tuple(range(2, x.ndim))
    want_shift = dy.sum(axis=red)
    want_scale = (dy * x_hat.reshape(x.shape)).sum(axis=red)
    rounding = 2.0 ** -(8 if dtype == BF16 else 11 if dtype == F16 else 24)
    assert_close(dshift, want_shift, np.abs(want_shift) * 2.0**-24 + 1e-9)
    assert_close(dscale, want_scale, np.abs(want_scale) * rounding + 1e-9)
    twin = ada_spec.ada_group_norm_backward(dY, X, shift, scale, num_groups=G, data_format=fmt,
                                            engine=reference.ENGINE)
    assert_close(to_ncx(twin[0], fmt), exact.reshape(x.shape), tol.reshape(x.shape), "twin")
    # scale = shift = 0: group_normalization_backward with ones, bit for bit
    zeros = np.zeros((N, C), F32)
    plain = nk.group_normalization_backward(dY, X, np.ones(C, dtype), num_groups=G,
                                            epsilon=1e-5, data_format=fmt)
    zero = nk.ada_group_norm_backward(dY, X, zeros, zeros, num_groups=G, data_format=fmt)
    assert_identical(zero[0], plain[0])


@pytest.mark.parametrize("given", [False, True])
@pytest.mark.parametrize("dtype", [F32, F64, BF16], ids=["float32", "float64", "bfloat16"])
@pytest.mark.parametrize("shape,G", [((2, 6, 5, 7), 3), ((2, 64, 40, 40), 8)])
def test_ada_group_norm_backward_in_one_call_gives_the_steps_bits(rng, shape, G, dtype, given):
    """Channels-first AdaGroupNorm's backward runs the one-call group backward (its N *
    C planes each a channel of its own): the bits of the steps the streaming path runs,
    serial and parallel, with the statistics recomputed or given."""
    from normkernels.engine.numba_engine import ENGINE

    N, C = shape[:2]
    X = (rng.standard_normal(shape) * 2 + 1).astype(dtype)
    dY = rng.standard_normal(shape).astype(dtype)
    shift, scale = (rng.standard_normal((N, C)) * 0.5).astype(F32), (
        rng.standard_normal((N, C)) * 0.5).astype(F32)
    stats = {}
    if given:
        stats = {"mean": rng.normal(1, 0.1, (N, G)), "inv_std": rng.uniform(0.4, 0.6, (N, G))}
    want = ada_spec.ada_group_norm_backward(dY, X, shift, scale, num_groups=G, engine=ENGINE,
                                            path="streaming", **stats)
    for path in ("serial", "parallel"):
        got = ada_spec.ada_group_norm_backward(dY, X, shift, scale, num_groups=G, engine=ENGINE,
                                               path=path, **stats)
        for a, b in zip(got, want, strict=True):
            assert_identical(a, b)


def _ada_ln_torch(t, X, shift, scale, residual=None, gate=None, dY=None, dS=None):
    leaves = {k: t.tensor(v.astype(F64), requires_grad=True) for k, v in
              dict(X=X, shift=shift, scale=scale, residual=residual, gate=gate).items()
              if v is not None}
    src = leaves["X"]
    if residual is not None:
        g = leaves["gate"][:, None, :] if gate is not None else 1.0
        src = leaves["residual"] + g * leaves["X"]
    C = X.shape[-1]
    Y = (t.nn.functional.layer_norm(src, (C,), eps=1e-6) * (1 + leaves["scale"][:, None, :])
         + leaves["shift"][:, None, :])
    loss = (Y * t.tensor(dY.astype(F64))).sum()
    if dS is not None:
        loss = loss + (src * t.tensor(dS.astype(F64))).sum()
    loss.backward()
    return {k: v.grad.numpy() for k, v in leaves.items()}


@pytest.mark.parametrize("dtype", FLOATS, ids=FLOAT_IDS)
@pytest.mark.parametrize("residual", [False, True])
def test_ada_layer_norm_backward(rng, dtype, residual):
    """Against a float64 autograd of the definition (torch, float64), within the row
    backward's error model scaled to the gradient's size."""
    t = _torch()
    N, T, C = 2, 7, 40
    X = rng.standard_normal((N, T, C)).astype(dtype)
    dY = rng.standard_normal((N, T, C)).astype(dtype)
    shift = rng.standard_normal((N, C)).astype(F32)
    scale = (rng.standard_normal((N, C)) * 0.5).astype(F32)
    kw = {}
    if residual:
        kw = dict(residual=rng.standard_normal((N, T, C)).astype(dtype),
                  gate=rng.standard_normal((N, C)).astype(F32),
                  dS=rng.standard_normal((N, T, C)).astype(dtype))
    got = nk.ada_layer_norm_backward(dY, X, shift, scale, **kw)
    if residual:  # S is the forward's rounded S: the oracle starts from it
        _, S = nk.ada_layer_norm(X, shift, scale, residual=kw["residual"], gate=kw["gate"])
        want = _ada_ln_torch(t, S, shift, scale, dY=dY)
        total = want["X"] + kw["dS"].astype(F64)  # dS_total
        names = ("X", "residual", "gate", "shift", "scale")
        want = dict(want, residual=total, gate=(total * X.astype(F64)).sum(axis=1),
                    X=kw["gate"].astype(F64)[:, None, :] * total)
    else:
        want = _ada_ln_torch(t, X, shift, scale, dY=dY)
        names = ("X", "shift", "scale")
    cd = compute_dtype(dtype)
    u = unit_roundoff(cd) if dtype.itemsize == 2 else 2.0**-50
    for g, name in zip(got, names, strict=True):
        w = want[name]
        assert g.shape == w.shape
        scale_of = np.abs(w).max() + 1
        out_u = unit_roundoff(g.dtype) if g.dtype != F64 else 2.0**-50
        assert_close(g, w, 64 * (u + out_u) * scale_of * (T if w.ndim == 2 else 1), name)
    twin = ada_spec.ada_layer_norm_backward(dY, X, shift, scale, engine=reference.ENGINE, **kw)
    for a, b in zip(twin, got, strict=True):
        if b is not None:
            assert_close(a, b.astype(F64), 64 * (np.abs(b.astype(F64)).max() + 1)
                         * unit_roundoff(b.dtype if b.dtype != F64 else F32))


def test_ada_errors(rng):
    X = rng.standard_normal((2, 3, 4)).astype(F32)
    s = np.zeros((2, 4), F32)
    with pytest.raises(ValueError, match="dS is the gradient of the returned S"):
        nk.ada_layer_norm_backward(X, X, s, s, dS=X)
    with pytest.raises(ValueError, match="gate scales X"):
        nk.ada_layer_norm_backward(X, X, s, s, gate=s)
    with pytest.raises(ValueError, match="residual must have X's shape"):
        nk.ada_layer_norm_backward(X, X, s, s, residual=X[:1])
    with pytest.raises(ValueError, match=r"shift must have shape \(2, 3\)"):
        nk.ada_group_norm_backward(X, X, s, s, num_groups=1)


def _composite_engine():
    """The Numba engine with the epilogue passes of its twin (the base engine's: dZ
    written, then the plain kernels on it)."""
    from normkernels.engine import Engine
    from normkernels.engine.numba_engine import NumbaEngine

    class Composite(NumbaEngine):
        epilogue_grad_sums = Engine.epilogue_grad_sums
        epilogue_grad_apply = Engine.epilogue_grad_apply

    return Composite()


# (operator, NCX shape, layout, activation, residual, mask from Y, statistics given):
# every loop of the fused passes (planes with several chunks a plane and blocks across
# planes, rows with several column tiles, channels-last samples)
FUSED_CASES = [
    ("bn", (2, 3, 17, 19), "NCX", "silu", True, False, False),
    ("bn", (1, 2, 260, 260), "NCX", "relu", True, True, False),
    ("bn", (2, 5, 6, 7), "NXC", "gelu", False, False, False),
    ("bn", (3, 4100, 3, 2), "NXC", "relu", True, False, False),
    ("bn", (13, 4, 3, 3), "NCX", None, True, False, False),  # short planes, many rows
    ("gn", (2, 6, 20, 20), "NCX", "silu", True, False, True),
    ("gn", (2, 6, 5, 7), "NCX", "gelu_tanh", False, False, False),
    ("gn", (2, 8, 9, 10), "NXC", "silu", False, False, True),
    ("gn", (3, 6, 4, 5), "NXC", "relu", True, True, False),
    # dZ made again in the dX pass (ReLU without a residual: no dR to keep it in)
    ("bn", (2, 3, 17, 19), "NCX", "relu", False, False, False),
    ("bn", (2, 3, 300, 7), "NCX", "relu", False, True, False),
    ("gn", (2, 4, 6, 5), "NXC", "relu", False, False, True),
]


@pytest.mark.parametrize("path", ["serial", "parallel", "streaming"])
@pytest.mark.parametrize("dtype", [F32, BF16], ids=["float32", "bfloat16"])
@pytest.mark.parametrize("case", FUSED_CASES, ids=lambda c: "-".join(map(str, c[:4])))
def test_fused_passes_are_the_composition(rng, case, dtype, path):
    """The fused epilogue backward (dZ made block by block inside the two passes) gives
    the bits of the composition (dZ written, then the plain passes), on every loop and
    path."""
    from normkernels.ops import backward as spec

    op, shape, fmt, kind, add, from_y, stats = case
    X, dY, R, scale, B, mean, var = bn_case(rng, shape, dtype, fmt)
    R = R if add else None
    composite = _composite_engine()
    if op == "bn":
        Y = None
        if from_y:
            Y = nk.batch_normalization(X, scale, B, mean.astype(F32), var.astype(F32),
                                       epsilon=EPS, activation=kind, add=R, data_format=fmt)
        kw = dict(epsilon=EPS, data_format=fmt, activation=kind, add=R,
                  B=None if from_y else B, Y=Y, path=path)
        if kind is None:
            kw.pop("B")
        run = lambda e: spec.batch_normalization_backward(dY, X, scale, mean, var,  # noqa: E731
                                                          engine=e, **kw)
    else:
        G = shape[1] // 2
        scale, B = scale.astype(dtype), B.astype(dtype)  # the forward's one type T
        Y, s = None, None
        if from_y or stats:
            Y, m, s = spec_group(X, scale, B, G, fmt, kind, R)
        kw = dict(num_groups=G, epsilon=EPS, data_format=fmt, activation=kind, add=R,
                  path=path, B=None if from_y else B, Y=Y if from_y else None)
        if stats:
            kw.update(mean=m, inv_std=s)
        run = lambda e: spec.group_normalization_backward(dY, X, scale, engine=e,  # noqa: E731
                                                          **kw)
    got, want = run(_numba_engine()), run(composite)
    assert len(got) == len(want) == (4 if add else 3)
    for a, b in zip(got, want, strict=True):
        assert_identical(a, b)
    # dX written over X (the reduction cannot keep dZ there) and over dY: the same bits
    originals = X, dY
    for over_x in (True, False):
        X, dY = (v.copy() for v in originals)
        out = X if over_x else dY
        kw["out"] = out
        got = run(_numba_engine())
        assert got[0] is out
        assert_identical(out, want[0])


def _numba_engine():
    from normkernels.engine.numba_engine import ENGINE

    return ENGINE


def spec_group(X, scale, B, G, fmt, kind, R):
    """The forward's Y and its statistics (the PyTorch adapter's route)."""
    from normkernels.ops import group_normalization as gn

    return gn.group_normalization(X, scale, B, num_groups=G, epsilon=EPS, data_format=fmt,
                                  activation=kind, add=R, engine=_numba_engine(),
                                  statistics=True)

"""Backward passes of BatchNormalization and InstanceNormalization: against the float64
formulas of specs/backward-passes.md (tests/oracle.py), central finite differences of
the float64 forward, the NumPy twin, PyTorch's autograd where torch is installed, on
every route; in place, out=, NaN confinement, edge groups and hostile input."""

import concurrent.futures

import numpy as np
import pytest
from arrays import FLOAT_IDS, FLOATS, assert_identical
from oracle import assert_close, backward_tolerance, normalization_backward

import normkernels as nk
from normkernels import reference
from normkernels.engine import policy
from normkernels.engine.numba_engine import ENGINE
from normkernels.ops import backward as spec

F16, BF16, F32, F64 = FLOATS
EPS = 1e-5


def channels_first(A, fmt):
    return np.moveaxis(A, -1, 1) if fmt == "NXC" and A.ndim > 2 else A


def layout(A, fmt):
    return np.ascontiguousarray(np.moveaxis(A, 1, -1)) if fmt == "NXC" and A.ndim > 2 else A


def bn_case(rng, shape, dtype, fmt, offset=3.0):
    """X (each channel its own mean and spread), dY, scale of both signs, and the batch
    statistics of X (float64, population variance)."""
    C = shape[1] if len(shape) > 1 else 1
    cshape = (1, C) + (1,) * (len(shape) - 2) if len(shape) > 1 else (1,)
    X = (rng.standard_normal(shape) * rng.uniform(0.5, 2, C).reshape(cshape)
         + offset * rng.uniform(-1, 1, C).reshape(cshape))
    X = layout(X.astype(dtype), fmt)
    dY = layout(rng.standard_normal(shape).astype(dtype), fmt)
    scale = (rng.uniform(0.5, 2, C) * rng.choice([-1, 1], C)).astype(F32)
    x = channels_first(X.astype(F64), fmt)
    axes = (0, *range(2, x.ndim)) if x.ndim > 1 else (0,)
    return X, dY, scale, np.atleast_1d(x.mean(axis=axes)), np.atleast_1d(x.var(axis=axes))


def bn_expected(dY, X, scale, mean, var, fmt, training=True):
    x, dy = channels_first(X, fmt), channels_first(dY, fmt)
    C = mean.size
    shape = (1, C) + (1,) * (x.ndim - 2) if x.ndim > 1 else (C,)
    axes = (0, *range(2, x.ndim)) if x.ndim > 1 else (0,)
    r = (1 / np.sqrt(var + EPS)).reshape(shape)
    m, s = mean.reshape(shape), scale.astype(F64).reshape(shape)
    dX, dyx = normalization_backward(dy, x, s, m, r, axes, training)
    tol = backward_tolerance(dy, x, s, m, r, axes, dX, X.dtype, training)
    back = (lambda v: np.moveaxis(v, 1, -1)) if fmt == "NXC" and x.ndim > 2 else (lambda v: v)
    return back(dX), back(tol), dyx.sum(axis=axes), dy.astype(F64).sum(axis=axes)


def check_parameters(dscale, dB, exact_dscale, exact_dB, dY):
    """dscale and dB: float64 sums (exact to first order) rounded once to scale's dtype,
    within a few float64 roundings of the sum of |terms| besides."""
    n = dY.size
    slack = 1e-13 * n * np.abs(dY.astype(F64)).max() * 10
    for got, exact, what in ((dscale, exact_dscale, "dscale"), (dB, exact_dB, "dB")):
        assert got.dtype == F32
        assert_close(got, exact, np.abs(exact) * 2.0**-24 + slack + 1e-30, what)


SHAPES = {"4d": (4, 3, 17, 19), "long-planes": (2, 3, 300, 300), "short-planes": (8, 3, 5, 5),
          "2d": (50, 4), "1d": (70,), "3d": (3, 5, 7), "5d": (2, 3, 4, 5, 6),
          "n1": (1, 4, 9, 9), "c1": (5, 1, 8, 8)}


@pytest.mark.parametrize("training", [True, False], ids=["training", "eval"])
@pytest.mark.parametrize("fmt", ["NCX", "NXC"])
@pytest.mark.parametrize("dtype", FLOATS, ids=FLOAT_IDS)
@pytest.mark.parametrize("name", list(SHAPES))
def test_batch_normalization_backward_matches_oracle(rng, name, dtype, fmt, training):
    X, dY, scale, mean, var = bn_case(rng, SHAPES[name], dtype, fmt)
    before = (X.copy(), dY.copy(), scale.copy())
    dX, dscale, dB = nk.batch_normalization_backward(dY, X, scale, mean, var, epsilon=EPS,
                                                     training=training, data_format=fmt)
    for a, b in zip((X, dY, scale), before, strict=True):
        assert_identical(a, b)  # inputs untouched
    assert dX.dtype == dtype and dX.shape == X.shape
    exact, tol, exact_dscale, exact_dB = bn_expected(dY, X, scale, mean, var, fmt, training)
    assert_close(dX, exact, tol, "dX")
    check_parameters(dscale, dB, exact_dscale, exact_dB, dY)
    twin = reference.batch_normalization_backward(dY, X, scale, mean, var, epsilon=EPS,
                                                  training=training, data_format=fmt)
    assert_close(twin[0], exact, tol, "twin dX")


@pytest.mark.parametrize("fmt", ["NCX", "NXC"])
@pytest.mark.parametrize("dtype", [F32, F64], ids=["float32", "float64"])
def test_eval_mode_dx_does_not_read_x(rng, dtype, fmt):
    """Eval mode: dX = dY * scale / sqrt(var + epsilon), whatever X holds. NaN and inf
    in X used to reach dX through (x - mean) * 0; dscale does depend on X (NaN there,
    as torch's)."""
    X, dY, scale, mean, var = bn_case(rng, (3, 4, 5, 6), dtype, fmt)
    X = X.copy()
    X.flat[::7] = np.nan
    X.flat[3::11] = np.inf
    dX, dscale, _ = nk.batch_normalization_backward(dY, X, scale, mean, var, epsilon=EPS,
                                                    training=False, data_format=fmt)
    channel = 1 if fmt == "NCX" else -1
    shape = [1] * X.ndim
    shape[channel] = -1
    a = (scale.astype(np.float64) / np.sqrt(var.astype(np.float64) + EPS)).reshape(shape)
    exact = dY.astype(np.float64) * a
    assert np.isfinite(dX).all()
    np.testing.assert_allclose(dX, exact, rtol=2 * np.finfo(dtype).eps, atol=0)
    assert np.isnan(dscale).all()
    twin = reference.batch_normalization_backward(dY, X, scale, mean, var, epsilon=EPS,
                                                  training=False, data_format=fmt)
    assert_identical(twin[0], dX)


@pytest.mark.parametrize("fmt", ["NCX", "NXC"])
def test_inv_std_is_the_same_as_var(rng, fmt):
    X, dY, scale, mean, var = bn_case(rng, (4, 3, 9, 11), F32, fmt)
    a = nk.batch_normalization_backward(dY, X, scale, mean, var, epsilon=EPS, data_format=fmt)
    b = nk.batch_normalization_backward(dY, X, scale, mean, inv_std=1 / np.sqrt(var + EPS),
                                        data_format=fmt)
    for u, v in zip(a, b, strict=True):
        assert_identical(u, v)


def numeric_gradients(loss, args, h=1e-6):
    """Central differences of ``loss(*args)`` (float64) in every element of each of
    ``args``: one array of the loss's partial derivatives per argument."""
    grads = []
    for k, arg in enumerate(args):
        grad = np.empty(np.shape(arg))
        for i in np.ndindex(grad.shape):
            values = []
            for step in (h, -h):
                moved = arg.copy()
                moved[i] += step
                values.append(loss(*args[:k], moved, *args[k + 1:]))
            grad[i] = (values[0] - values[1]) / (2 * h)
        grads.append(grad)
    return grads


def assert_gradients(loss, args, got):
    """Each of ``got`` (an analytic gradient, None to skip) within 1e-6 of the central
    differences of ``loss`` in the matching argument."""
    for numeric, analytic in zip(numeric_gradients(loss, args), got, strict=True):
        if analytic is not None:
            np.testing.assert_allclose(analytic, numeric, rtol=1e-6, atol=1e-6)


def forward_f64(X, scale, B, fmt, instance=False):
    """Training-mode BN (or instance norm) forward in float64, statistics from X."""
    x = channels_first(X, fmt)
    axes = (2, *range(3, x.ndim)) if instance else (0, *range(2, x.ndim))
    mean = x.mean(axis=axes, keepdims=True)
    var = x.var(axis=axes, keepdims=True)
    C = x.shape[1]
    shape = (1, C) + (1,) * (x.ndim - 2)
    y = (x - mean) / np.sqrt(var + EPS) * scale.reshape(shape) + B.reshape(shape)
    return np.moveaxis(y, 1, -1) if fmt == "NXC" else y


@pytest.mark.parametrize("instance", [False, True], ids=["batchnorm", "instancenorm"])
@pytest.mark.parametrize("fmt", ["NCX", "NXC"])
def test_gradients_agree_with_finite_differences(rng, fmt, instance):
    """float64, central differences of sum(dY * Y) in every element of X, scale and B."""
    shape = (2, 3, 2, 3)
    X = layout(rng.standard_normal(shape) + 0.5, fmt)
    dY = layout(rng.standard_normal(shape), fmt)
    scale, B = rng.uniform(0.5, 2, 3), rng.standard_normal(3)
    if instance:
        dX, dscale, dB = nk.instance_normalization_backward(dY, X, scale, epsilon=EPS,
                                                            data_format=fmt)
    else:
        x = channels_first(X, fmt)
        mean, var = x.mean(axis=(0, 2, 3)), x.var(axis=(0, 2, 3))
        dX, dscale, dB = nk.batch_normalization_backward(dY, X, scale, mean, var,
                                                         epsilon=EPS, data_format=fmt)

    def loss(X_, s_, b_):
        return float((dY * forward_f64(X_, s_, b_, fmt, instance)).sum())

    assert_gradients(loss, (X, scale, B), (dX, dscale, dB))


@pytest.fixture
def routes(monkeypatch):
    taken = []
    monkeypatch.setattr(policy, "_trace", taken.append)
    monkeypatch.setattr(policy, "ASLEEP_SERIAL_FACTOR", 0)
    return taken


ROUTE_CASES = [("grad_sums/planes", "grad_apply/planes", (2, 3, 17, 19), "NCX"),
               ("grad_sums/rows", "grad_apply/rows", (2, 3, 17, 19), "NXC"),
               ("grad_sums/rows", "grad_apply/rows", (3, 37, 5, 7), "NXC"),  # odd tables
               ("grad_sums/rows", "grad_apply/rows", (40, 3, 5, 5), "NCX"),
               # short planes in few rows (by_planes)
               ("grad_sums/planes", "grad_apply/planes", (1, 16, 8, 8), "NCX"),
               ("grad_sums/planes", "grad_apply/planes", (2, 300, 15, 15), "NCX"),
               # short planes in many rows longer than a block: reduced by planes
               ("grad_sums/planes", "grad_apply/rows", (6, 7300, 3, 3), "NCX")]


@pytest.mark.parametrize("dtype", FLOATS, ids=FLOAT_IDS)
@pytest.mark.parametrize("sums,apply,shape,fmt", ROUTE_CASES)
def test_every_route_gives_the_same_bits(rng, routes, sums, apply, shape, fmt, dtype):
    """Serial, parallel and streaming kernels give the same bits: the partition
    depends only on the shape, and the streaming dX pass computes as the others."""
    X, dY, scale, mean, var = bn_case(rng, shape, dtype, fmt)
    results = []
    for path in ("serial", "parallel", "streaming"):
        routes.clear()
        results.append(spec.batch_normalization_backward(dY, X, scale, mean, var, epsilon=EPS,
                                                         data_format=fmt, engine=ENGINE,
                                                         path=path))
        one = "serial" if path == "serial" else "parallel"
        assert {f"{sums}/{one}", f"{apply}/{path}"} <= set(routes)
        assert set(routes) <= set(policy.ROUTES)
    exact, tol, _, _ = bn_expected(dY, X, scale, mean, var, fmt)
    assert_close(results[0][0], exact, tol)
    for other in results[1:]:
        for u, v in zip(results[0], other, strict=True):
            assert_identical(u, v)


def test_the_twin_writes_the_kernels_bits_given_their_sums(rng):
    """Everything after the sums (folding, the dX pass, rounding) is the twin's."""
    for dtype in FLOATS:
        X, dY, scale, mean, var = bn_case(rng, (3, 4, 6, 7), dtype, "NCX")

        class KernelSums(type(reference.ENGINE)):
            def channel_grad_sums(self, x, dy, C, S, mean, path=None):
                return ENGINE.channel_grad_sums(x, dy, C, S, mean, path)

        got = nk.batch_normalization_backward(dY, X, scale, mean, var, epsilon=EPS)
        twin = spec.batch_normalization_backward(dY, X, scale, mean, var, epsilon=EPS,
                                                 engine=KernelSums())
        for u, v in zip(got, twin, strict=True):
            assert_identical(u, v)


@pytest.mark.parametrize("Cg", [1, 3, 8, 10, 33])
@pytest.mark.parametrize("dtype", FLOATS, ids=FLOAT_IDS)
def test_group_coefficients_are_the_twins_bits(rng, dtype, Cg):
    """The group backward's coefficients (one compiled call in the Numba engine) give
    the NumPy twin's bits: group sums in plane order (8 planes and more: where a
    pairwise sum would differ), the mean rounded to the compute dtype with its
    residual folded into K, a mean that overflows float32 (no residual), infinite and
    NaN means, and per-group counts."""
    G = 7
    gamma = rng.standard_normal(G * Cg).astype(np.float32).astype(np.float64)
    gmean = rng.standard_normal(G) * 10.0 ** rng.uniform(-3, 6, G)
    gmean[1], gmean[2], gmean[3] = 1e39, np.inf, np.nan
    r = rng.uniform(0.1, 10, G)
    sum_dy, sum_dyx = rng.standard_normal(G * Cg) * 50, rng.standard_normal(G * Cg) * 50
    M = Cg * 49
    got = ENGINE.group_coefficients(gamma, gmean, r, sum_dy, sum_dyx, Cg, M, dtype)
    twin = reference.ENGINE.group_coefficients(gamma, gmean, r, sum_dy, sum_dyx, Cg, M, dtype)
    assert len(got) == len(twin) == 5
    for u, v in zip(got, twin, strict=True):
        assert u.dtype == v.dtype
        assert_identical(u, v)
    m, a, b, k, terms = got
    cd = np.float64 if dtype == np.float64 else np.float32
    assert m.dtype == cd
    assert_identical(a, (gamma * np.repeat(r, Cg)).astype(cd))
    assert_identical(terms, np.repeat(r, Cg) * sum_dyx)
    g1 = np.cumsum(gamma[:Cg] * sum_dy[:Cg])[-1]  # in plane order, not NumPy's pairwise sum
    g2 = np.cumsum(gamma[:Cg] * sum_dyx[:Cg])[-1]
    b0 = -r[0] * r[0] * r[0] * g2 / M
    assert b[0] == np.asarray(b0, cd)
    residual = b0 * (np.float64(np.float32(gmean[0])) - gmean[0]) if cd == np.float32 else 0.0
    assert k[0] == np.asarray(-r[0] * g1 / M + residual, cd)


@pytest.mark.parametrize("fmt", ["NCX", "NXC"])
@pytest.mark.parametrize("dtype", FLOATS, ids=FLOAT_IDS)
def test_instance_normalization_backward_matches_oracle(rng, dtype, fmt):
    shape = (3, 4, 9, 11)
    X = layout((rng.standard_normal(shape) * 2 + rng.uniform(-3, 3, (3, 4, 1, 1)))
               .astype(dtype), fmt)
    dY = layout(rng.standard_normal(shape).astype(dtype), fmt)
    scale = (rng.uniform(0.5, 2, 4) * rng.choice([-1, 1], 4)).astype(dtype)
    dX, dscale, dB = nk.instance_normalization_backward(dY, X, scale, epsilon=EPS,
                                                        data_format=fmt)
    assert dX.dtype == dscale.dtype == dB.dtype == dtype
    x, dy = channels_first(X.astype(F64), fmt), channels_first(dY.astype(F64), fmt)
    mean = x.mean(axis=(2, 3), keepdims=True)
    r = 1 / np.sqrt(x.var(axis=(2, 3), keepdims=True) + EPS)
    s = scale.astype(F64).reshape(1, 4, 1, 1)
    exact, dyx = normalization_backward(dy, x, s, mean, r, (2, 3))
    tol = backward_tolerance(dy, x, s, mean, r, (2, 3), exact, dtype)
    back = (lambda v: np.moveaxis(v, 1, -1)) if fmt == "NXC" else (lambda v: v)
    assert_close(dX, back(exact), back(tol), "dX")
    rounding = 2.0 ** -(8 if dtype == BF16 else 11 if dtype == F16 else 24)
    for got, want in ((dscale, dyx.sum(axis=(0, 2, 3))), (dB, dy.sum(axis=(0, 2, 3)))):
        assert_close(got, want, np.abs(want) * rounding + 1e-9)
    twin = reference.instance_normalization_backward(dY, X, scale, epsilon=EPS,
                                                     data_format=fmt)
    assert_close(twin[0], back(exact), back(tol), "twin dX")


@pytest.mark.parametrize("fmt", ["NCX", "NXC"])
def test_in_place_and_out(rng, fmt):
    X, dY, scale, mean, var = bn_case(rng, (3, 4, 9, 11), F32, fmt)
    want = nk.batch_normalization_backward(dY, X, scale, mean, var, data_format=fmt)
    out = np.empty_like(X)
    got = nk.batch_normalization_backward(dY, X, scale, mean, var, data_format=fmt, out=out)
    assert got[0] is out
    assert_identical(out, want[0])
    d = dY.copy()
    got = nk.batch_normalization_backward(d, X, scale, mean, var, data_format=fmt, out=d)
    assert got[0] is d
    assert_identical(d, want[0])
    x = X.copy()
    got = nk.batch_normalization_backward(dY, x, scale, mean, var, data_format=fmt, out=x)
    assert_identical(x, want[0])
    want_in = nk.instance_normalization_backward(dY, X, scale, data_format=fmt)
    d = dY.copy()
    got = nk.instance_normalization_backward(d, X, scale, data_format=fmt, out=d)
    assert got[0] is d
    assert_identical(d, want_in[0])


def test_views_and_memory_order(rng):
    """A strided view, and dY in another memory order than X: the same bits as
    contiguous copies; dX keeps X's memory order."""
    X, dY, scale, mean, var = bn_case(rng, (4, 3, 10, 12), F32, "NCX")
    big = np.zeros((4, 3, 20, 12), F32)
    big[:, :, ::2] = X
    view = big[:, :, ::2]
    want = nk.batch_normalization_backward(dY, X, scale, mean, var)
    got = nk.batch_normalization_backward(dY, view, scale, mean, var)
    assert_identical(got[0], want[0])
    last = np.ascontiguousarray(np.moveaxis(X, 1, -1))
    xl = np.moveaxis(last, -1, 1)  # NCX logically, channels last in memory
    got = nk.batch_normalization_backward(dY, xl, scale, mean, var)
    assert got[0].transpose(0, 2, 3, 1).flags.c_contiguous
    exact, tol, _, _ = bn_expected(dY, X, scale, mean, var, "NCX")
    assert_close(got[0], exact, tol)


def test_edge_groups(rng):
    """One element per channel (dX = 0, dscale = 0), a constant channel
    (dX = r (g - <g>)), NaN confined to its channel."""
    X = rng.standard_normal((1, 3, 1, 1))
    dY = rng.standard_normal(X.shape)
    s = np.ones(3)
    dX, dscale, dB = nk.batch_normalization_backward(dY, X, s, X.reshape(3), np.zeros(3))
    assert np.all(np.abs(dX) <= 1e-12) and np.all(dscale == 0)
    np.testing.assert_allclose(dB, dY.reshape(3))
    X = np.full((2, 2, 3, 3), 7.3)
    dY = rng.standard_normal(X.shape)
    dX, dscale, _ = nk.batch_normalization_backward(dY, X, np.ones(2), np.full(2, 7.3),
                                                    np.zeros(2))
    r = 1 / np.sqrt(EPS)
    np.testing.assert_allclose(dX, r * (dY - dY.mean(axis=(0, 2, 3), keepdims=True)),
                               rtol=1e-12, atol=1e-9)
    assert np.all(dscale == 0)
    X, dY, scale, mean, var = bn_case(rng, (3, 4, 5, 6), F32, "NCX")
    X[1, 2, 3, 4] = np.nan
    x = X.astype(F64)
    mean, var = x.mean(axis=(0, 2, 3)), x.var(axis=(0, 2, 3))
    dX, dscale, dB = nk.batch_normalization_backward(dY, X, scale, mean, var)
    assert np.isnan(dX[:, 2]).all() and not np.isnan(dX[:, [0, 1, 3]]).any()
    assert np.isnan(dscale[2]) and not np.isnan(dscale[[0, 1, 3]]).any()
    assert not np.isnan(dB[[0, 1, 3]]).any()


def test_threads_at_once(rng):
    X, dY, scale, mean, var = bn_case(rng, (4, 8, 64, 64), F32, "NCX")
    want = nk.batch_normalization_backward(dY, X, scale, mean, var)
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        runs = list(pool.map(lambda _: nk.batch_normalization_backward(dY, X, scale, mean,
                                                                       var), range(8)))
    for got in runs:
        for u, v in zip(got, want, strict=True):
            assert_identical(u, v)


def test_hostile_input(rng):
    X, dY, scale, mean, var = bn_case(rng, (2, 3, 4, 5), F32, "NCX")
    f = nk.batch_normalization_backward
    with pytest.raises(ValueError, match=r"exactly one of var .* and inv_std, got both"):
        f(dY, X, scale, mean, var, inv_std=var)
    with pytest.raises(ValueError, match=r"exactly one of var .* and inv_std, got neither"):
        f(dY, X, scale, mean)
    with pytest.raises(ValueError, match=r"dY must have X's shape"):
        f(dY[:1], X, scale, mean, var)
    with pytest.raises(TypeError, match=r"dY must have X's dtype"):
        f(dY.astype(F64), X, scale, mean, var)
    with pytest.raises(ValueError, match=r"scale must have shape \(3,\)"):
        f(dY, X, scale[:2], mean, var)
    with pytest.raises(ValueError, match=r"inv_std must have shape \(3,\)"):
        f(dY, X, scale, mean, inv_std=var[:2])
    with pytest.raises(TypeError, match=r"X .*int32"):
        f(dY.astype(np.int32), X.astype(np.int32), scale, mean, var)
    with pytest.raises(TypeError, match="training must be a bool"):
        f(dY, X, scale, mean, var, training=1)
    with pytest.raises(ValueError, match="epsilon"):
        f(dY, X, scale, mean, var, epsilon=float("nan"))
    with pytest.raises(ValueError, match="data_format"):
        f(dY, X, scale, mean, var, data_format="NHWC")
    with pytest.raises(ValueError, match="out overlaps dY"):
        big = np.empty((2, 3, 4, 10), F32)
        d = big[..., :5]
        d[...] = dY
        f(d, X, scale, mean, var, out=big[..., 1:6])
    with pytest.raises(ValueError, match="out is read-only"):
        ro = np.empty_like(X)
        ro.flags.writeable = False
        f(dY, X, scale, mean, var, out=ro)
    with pytest.raises(ValueError, match="out shares memory with scale"):
        buf = np.ones(3, F32)
        f(np.ones((1, 3), F32), np.ones((1, 3), F32), buf, mean, var, out=buf.reshape(1, 3))
    with pytest.raises(ValueError, match="at least 3 dimensions"):
        nk.instance_normalization_backward(np.ones((2, 3), F32), np.ones((2, 3), F32),
                                           np.ones(3, F32))
    empty = np.empty((0, 3, 4, 5), F32)
    dX, dscale, dB = f(empty, empty, scale, mean, var)
    assert dX.shape == empty.shape and np.all(dscale == 0) and np.all(dB == 0)


@pytest.mark.parametrize("fmt", ["NCX", "NXC"])
def test_agrees_with_torch(rng, fmt):
    torch = pytest.importorskip("torch", reason="torch not installed (an optional peer)")
    X, dY, scale, mean, var = bn_case(rng, (4, 3, 9, 11), F64, fmt)
    xt = torch.from_numpy(channels_first(X, fmt).copy()).requires_grad_(True)
    w = torch.from_numpy(scale.astype(F64)).requires_grad_(True)
    b = torch.zeros(3, dtype=torch.float64, requires_grad=True)
    y = torch.nn.functional.batch_norm(xt, None, None, w, b, training=True, eps=EPS)
    y.backward(torch.from_numpy(channels_first(dY, fmt).copy()))
    dX, dscale, dB = nk.batch_normalization_backward(dY, X, scale.astype(F64), mean, var,
                                                     epsilon=EPS, data_format=fmt)
    np.testing.assert_allclose(channels_first(dX, fmt), xt.grad.numpy(), rtol=1e-10,
                               atol=1e-12)
    np.testing.assert_allclose(dscale, w.grad.numpy(), rtol=1e-10)
    np.testing.assert_allclose(dB, b.grad.numpy(), rtol=1e-10)


@pytest.mark.parametrize("fmt", ["NCX", "NXC"])
@pytest.mark.parametrize("dtype", [F32, F64], ids=["float32", "float64"])
def test_large_offsets(rng, dtype, fmt):
    """|mean| 1e4 with std 1: the mean rounded to float32 is 5e-4 off, which dX keeps
    only through the residual folded into K; and dY correlated with X, so the x_hat
    projection is large."""
    X, _, scale, mean, var = bn_case(rng, (8, 3, 30, 30), dtype, fmt, offset=1e4)
    dY = (0.5 * (X - layout(np.broadcast_to(mean.reshape(1, 3, 1, 1), (8, 3, 30, 30)), fmt))
          + layout(rng.standard_normal((8, 3, 30, 30)), fmt)).astype(dtype)
    for training in (True, False):
        dX, dscale, dB = nk.batch_normalization_backward(dY, X, scale, mean, var, epsilon=EPS,
                                                         training=training, data_format=fmt)
        exact, tol, exact_dscale, exact_dB = bn_expected(dY, X, scale, mean, var, fmt,
                                                         training)
        assert_close(dX, exact, tol, "dX")
        check_parameters(dscale, dB, exact_dscale, exact_dB, dY)


def group_expected(dY, X, scale, G, fmt):
    """GroupNormalization-21's gradient in float64 (the fact sheet's formula, the
    statistic group (n, group)), its tolerance, and the parameter gradients."""
    x, dy = channels_first(X.astype(F64), fmt), channels_first(dY.astype(F64), fmt)
    N, C = x.shape[:2]
    gx, gdy = x.reshape(N, G, -1), dy.reshape(N, G, -1)
    mean = gx.mean(axis=2, keepdims=True)
    r = 1 / np.sqrt(gx.var(axis=2, keepdims=True) + EPS)
    s = np.broadcast_to(scale.astype(F64).reshape((1, C) + (1,) * (x.ndim - 2)),
                        x.shape).reshape(N, G, -1)
    exact, dyx = normalization_backward(gdy, gx, s, mean, r, 2)
    # the bound of g = dY * scale with scale 1: the scale varies inside a group, and K =
    # -r <g> carries the group's mean of g, not one channel's scale times <dY>
    tol = backward_tolerance(gdy * s, gx, 1.0, mean, r, 2, exact, X.dtype)
    back = (lambda v: np.moveaxis(v.reshape(x.shape), 1, -1)) if fmt == "NXC" else (
        lambda v: v.reshape(x.shape))
    axes = (0, *range(2, x.ndim))
    return back(exact), back(tol), dyx.reshape(x.shape).sum(axis=axes), dy.sum(axis=axes)


@pytest.mark.parametrize("fmt", ["NCX", "NXC"])
@pytest.mark.parametrize("dtype", FLOATS, ids=FLOAT_IDS)
@pytest.mark.parametrize("shape,G", [((3, 6, 9, 11), 3), ((2, 4, 300, 300), 2), ((5, 6), 2),
                                     ((2, 8, 3, 4, 5), 8), ((2, 6, 7), 1)])
def test_group_normalization_backward_matches_oracle(rng, shape, G, dtype, fmt):
    C = shape[1]
    X = layout((rng.standard_normal(shape) * 2 + 3).astype(dtype), fmt)
    dY = layout(rng.standard_normal(shape).astype(dtype), fmt)
    scale = (rng.uniform(0.5, 2, C) * rng.choice([-1, 1], C)).astype(dtype)
    dX, dscale, dB = nk.group_normalization_backward(dY, X, scale, num_groups=G, epsilon=EPS,
                                                     data_format=fmt)
    assert dX.dtype == dscale.dtype == dB.dtype == dtype
    exact, tol, exact_dscale, exact_dB = group_expected(dY, X, scale, G, fmt)
    assert_close(dX, exact, tol, "dX")
    rounding = 2.0 ** -(8 if dtype == BF16 else 11 if dtype == F16 else 24)
    for got, want in ((dscale, exact_dscale), (dB, exact_dB)):
        assert_close(got, want, np.abs(want) * rounding + 1e-9)
    twin = reference.group_normalization_backward(dY, X, scale, num_groups=G, epsilon=EPS,
                                                  data_format=fmt)
    assert_close(twin[0], exact, tol, "twin dX")
    if G == C:  # groups of one channel: instance normalization
        inst = nk.instance_normalization_backward(dY, X, scale, epsilon=EPS, data_format=fmt)
        assert_close(inst[0], exact, tol, "instance dX")


@pytest.mark.parametrize("fmt", ["NCX", "NXC"])
def test_group_gradients_agree_with_finite_differences(rng, fmt):
    shape, G = (2, 4, 2, 3), 2
    X = layout(rng.standard_normal(shape) + 0.5, fmt)
    dY = layout(rng.standard_normal(shape), fmt)
    scale, B = rng.uniform(0.5, 2, 4), rng.standard_normal(4)

    def loss(X_, s_, b_):
        x = channels_first(X_, fmt)
        g = x.reshape(2, G, -1)
        y = ((g - g.mean(axis=2, keepdims=True)) / np.sqrt(g.var(axis=2, keepdims=True) + EPS)
             ).reshape(x.shape) * s_.reshape(1, 4, 1, 1) + b_.reshape(1, 4, 1, 1)
        return float((channels_first(dY, fmt) * y).sum())

    dX, dscale, dB = nk.group_normalization_backward(dY, X, scale, num_groups=G, epsilon=EPS,
                                                     data_format=fmt)
    assert_gradients(loss, (X, scale, B), (dX, dscale, dB))


def test_group_backward_agrees_with_torch(rng):
    torch = pytest.importorskip("torch", reason="torch not installed (an optional peer)")
    X = rng.standard_normal((3, 6, 5, 7)) + 2
    dY = rng.standard_normal(X.shape)
    scale, B = rng.uniform(0.5, 2, 6), rng.standard_normal(6)
    xt = torch.from_numpy(X.copy()).requires_grad_(True)
    w = torch.from_numpy(scale.copy()).requires_grad_(True)
    b = torch.from_numpy(B.copy()).requires_grad_(True)
    torch.nn.functional.group_norm(xt, 3, w, b, eps=EPS).backward(torch.from_numpy(dY))
    dX, dscale, dB = nk.group_normalization_backward(dY, X, scale, num_groups=3, epsilon=EPS)
    np.testing.assert_allclose(dX, xt.grad.numpy(), rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(dscale, w.grad.numpy(), rtol=1e-10)
    np.testing.assert_allclose(dB, b.grad.numpy(), rtol=1e-10)


def test_group_backward_errors_and_in_place(rng):
    X = rng.standard_normal((2, 6, 4, 4)).astype(F32)
    dY = rng.standard_normal(X.shape).astype(F32)
    s = np.ones(6, F32)
    with pytest.raises(ValueError, match="num_groups must divide the number of channels"):
        nk.group_normalization_backward(dY, X, s, num_groups=4)
    with pytest.raises(ValueError, match=r"scale must have shape \(6,\)"):
        nk.group_normalization_backward(dY, X, s[:3], num_groups=3)
    want = nk.group_normalization_backward(dY, X, s, num_groups=3)
    d = dY.copy()
    got = nk.group_normalization_backward(d, X, s, num_groups=3, out=d)
    assert got[0] is d
    assert_identical(d, want[0])


def rows_expected(dY, X, scale, a, centered):
    """LayerNorm / RMSNorm gradient in float64 over the axes ``a..``, its tolerance
    (float64 arithmetic rounded once: half an ulp of dX plus float64's error on the
    terms), and the column sums."""
    x, dy = X.astype(F64), dY.astype(F64)
    axes = tuple(range(a, X.ndim))
    mean = x.mean(axis=axes, keepdims=True) if centered else 0.0
    r = 1 / np.sqrt(((x - mean) ** 2).mean(axis=axes, keepdims=True) + EPS)
    s = np.broadcast_to(scale.astype(F64), X.shape[a:])
    x_hat = (x - mean) * r
    g = dy * s
    mg = g.mean(axis=axes, keepdims=True) if centered else 0.0
    mgx = (g * x_hat).mean(axis=axes, keepdims=True)
    exact = r * (g - mg - x_hat * mgx)
    K = np.prod(X.shape[a:])
    terms = np.abs(r) * (np.abs(g) + np.abs(mg) + np.abs(x_hat) * np.abs(mgx)
                         + np.abs(x_hat) * (np.abs(g) * np.abs(x_hat)).mean(axis=axes,
                                                                               keepdims=True))
    tol = 2.0**-53 * (K + 10) * terms + 1e-300
    if X.dtype != F64:  # one rounding of the float64 result
        tol = tol + half_ulp(exact, X.dtype)
    lead = tuple(range(a))
    rows = int(np.prod(X.shape[:a]))
    u = 2.0**-53
    # a float64 sum over the rows, and x_hat's own error (the mean a sum of K terms)
    hat_error = (K + 20) * u * r * (np.abs(x) + np.abs(mean))
    return (exact, tol, (dy * x_hat).sum(axis=lead), dy.sum(axis=lead),
            ((rows + 2) * u * np.abs(dy * x_hat) + np.abs(dy) * hat_error).sum(axis=lead),
            (rows + 2) * u * np.abs(dy).sum(axis=lead))


def half_ulp(values, dtype):
    """Half the spacing of ``dtype`` at ``|values|`` (in float64)."""
    bits, low = {F16: (10, -14), BF16: (7, -126), F32: (23, -126)}[np.dtype(dtype)]
    e = np.floor(np.log2(np.maximum(np.abs(values), 2.0**low)))  # subnormals: fixed spacing
    return 2.0 ** (e - bits - 1)


@pytest.mark.parametrize("centered", [True, False], ids=["layernorm", "rmsnorm"])
@pytest.mark.parametrize("dtype", FLOATS, ids=FLOAT_IDS)
@pytest.mark.parametrize("shape,axis", [((16, 100), -1), ((3, 4, 70), -1), ((2, 3, 4, 5), 2),
                                        ((5, 1), -1), ((1, 5000), -1), ((7,), 0)])
def test_row_backward_matches_oracle(rng, shape, axis, dtype, centered):
    X = (rng.standard_normal(shape) * 2 + 3).astype(dtype)
    dY = rng.standard_normal(shape).astype(dtype)
    a = axis % len(shape)
    scale = (rng.uniform(0.5, 2, shape[a:]) * rng.choice([-1, 1], shape[a:])).astype(dtype)
    if centered:
        dX, dscale, dB = nk.layer_normalization_backward(dY, X, scale, axis=axis, epsilon=EPS)
        twin = reference.layer_normalization_backward(dY, X, scale, axis=axis, epsilon=EPS)
    else:
        dX, dscale = nk.rms_normalization_backward(dY, X, scale, axis=axis, epsilon=EPS)
        twin = reference.rms_normalization_backward(dY, X, scale, axis=axis, epsilon=EPS)
    exact, tol, exact_dscale, exact_dB, slack_dscale, slack_dB = rows_expected(
        dY, X, scale, a, centered)
    assert dX.dtype == dtype and dscale.shape == scale.shape and dscale.dtype == dtype
    assert_close(dX, exact, tol, "dX")
    assert_close(twin[0], exact, tol, "twin dX")
    assert_close(dscale, exact_dscale, param_tolerance(exact_dscale, slack_dscale, dtype),
                 "dscale")
    if centered:
        assert_close(dB, exact_dB, param_tolerance(exact_dB, slack_dB, dtype), "dB")


def param_tolerance(exact, slack, dtype):
    """A float64 column sum (within ``slack``) rounded once to ``dtype``."""
    return slack + 1e-300 if dtype == F64 else slack + half_ulp(exact, dtype)


@pytest.mark.parametrize("centered", [True, False], ids=["layernorm", "rmsnorm"])
def test_row_gradients_agree_with_finite_differences(rng, centered):
    X = rng.standard_normal((3, 5)) + 0.5
    dY = rng.standard_normal(X.shape)
    scale, B = rng.uniform(0.5, 2, 5), rng.standard_normal(5)

    def loss(X_, s_, b_):
        m = X_.mean(axis=1, keepdims=True) if centered else 0.0
        v = ((X_ - m) ** 2).mean(axis=1, keepdims=True)
        return float((dY * ((X_ - m) / np.sqrt(v + EPS) * s_ + b_)).sum())

    if centered:
        dX, dscale, dB = nk.layer_normalization_backward(dY, X, scale, epsilon=EPS)
    else:
        (dX, dscale), dB = nk.rms_normalization_backward(dY, X, scale, epsilon=EPS), None
    assert_gradients(loss, (X, scale, B), (dX, dscale, dB))


def test_row_backward_agrees_with_torch(rng):
    torch = pytest.importorskip("torch", reason="torch not installed (an optional peer)")
    X = rng.standard_normal((6, 40)) + 1
    dY = rng.standard_normal(X.shape)
    w = rng.uniform(0.5, 2, 40)
    for centered in (True, False):
        xt = torch.from_numpy(X.copy()).requires_grad_(True)
        wt = torch.from_numpy(w.copy()).requires_grad_(True)
        f = torch.nn.functional
        y = (f.layer_norm(xt, (40,), wt, None, eps=EPS) if centered
             else f.rms_norm(xt, (40,), wt, eps=EPS))
        y.backward(torch.from_numpy(dY))
        got = (nk.layer_normalization_backward(dY, X, w, epsilon=EPS) if centered
               else nk.rms_normalization_backward(dY, X, w, epsilon=EPS))
        np.testing.assert_allclose(got[0], xt.grad.numpy(), rtol=1e-10, atol=1e-12)
        np.testing.assert_allclose(got[1], wt.grad.numpy(), rtol=1e-10)


def test_row_backward_paths_broadcast_and_in_place(rng, routes):
    X = rng.standard_normal((37, 300)).astype(F32)
    dY = rng.standard_normal(X.shape).astype(F32)
    s = rng.uniform(0.5, 2, 300).astype(F32)
    results = []
    for path in ("serial", "parallel"):
        routes.clear()
        results.append(spec.layer_normalization_backward(dY, X, s, epsilon=EPS, engine=ENGINE,
                                                         path=path))
        assert f"rows_backward/{path}" in routes and set(routes) <= set(policy.ROUTES)
    for u, v in zip(*results, strict=True):
        assert_identical(u, v)
    d = dY.copy()
    got = nk.layer_normalization_backward(d, X, s, out=d)
    assert got[0] is d
    assert_identical(d, results[0][0])
    # Scale of shape (1, K) broadcast over 3-D X: its gradient keeps that shape
    X3 = rng.standard_normal((2, 3, 8)).astype(F32)
    dY3 = rng.standard_normal(X3.shape).astype(F32)
    s3 = rng.uniform(0.5, 2, (1, 8)).astype(F32)
    dX3, ds3, db3 = nk.layer_normalization_backward(dY3, X3, s3, axis=1)
    assert ds3.shape == db3.shape == (1, 8)
    full = nk.layer_normalization_backward(dY3, X3, np.broadcast_to(s3, (3, 8)).copy(),
                                           axis=1)
    assert_identical(dX3, full[0])
    np.testing.assert_allclose(ds3[0], full[1].astype(F64).sum(axis=0), rtol=1e-6)
    with pytest.raises(ValueError, match="stash_type"):
        nk.layer_normalization_backward(dY, X, s, stash_type=5)
    with pytest.raises(ValueError, match="axis must be in"):
        nk.layer_normalization_backward(dY, X, s, axis=2)


# --- the caller's statistics (mean=, inv_std=) instead of recomputing them ---

def given_expected(dY, X, scale, mean, r, reduced, centered=True):
    """The fact sheet's dX in float64 with the caller's ``mean`` and ``r`` (broadcast
    over ``reduced``), whatever X's own statistics are (RMS, not ``centered``: no
    ``<g>`` term)."""
    if centered:
        return normalization_backward(dY, X, scale, mean, r, reduced)[0]
    x_hat = X.astype(F64) * r
    g = dY.astype(F64) * scale
    return r * (g - x_hat * (g * x_hat).mean(axis=reduced, keepdims=True))


@pytest.mark.parametrize("dtype", [F32, F64], ids=["float32", "float64"])
@pytest.mark.parametrize("centered", [True, False], ids=["layernorm", "rmsnorm"])
def test_row_backward_uses_the_given_statistics(rng, centered, dtype):
    """Statistics off X's own (as a forward's one-pass variance could be): dX is the
    formula at the given ones, not at X's."""
    X = (rng.standard_normal((6, 4, 50)) + 2).astype(dtype)
    dY = rng.standard_normal(X.shape).astype(dtype)
    scale = rng.uniform(0.5, 2, 50).astype(dtype)
    x = X.astype(F64)
    mean = x.mean(axis=-1, keepdims=True) + 0.05 * rng.standard_normal((6, 4, 1))
    ms = ((x - mean) ** 2).mean(axis=-1, keepdims=True) if centered else (x * x).mean(
        axis=-1, keepdims=True)
    r = 1.05 / np.sqrt(ms + EPS)
    if centered:
        got = nk.layer_normalization_backward(dY, X, scale, mean=mean, inv_std=r[..., 0])
        twin = reference.layer_normalization_backward(dY, X, scale, mean=mean[..., 0],
                                                      inv_std=r)
    else:
        got = nk.rms_normalization_backward(dY, X, scale, inv_std=r)
        twin = reference.rms_normalization_backward(dY, X, scale, inv_std=r)
        mean = 0.0
    exact = given_expected(dY, X, scale.astype(F64), mean, r, -1, centered)
    tol = 1e-12 if dtype == F64 else 1e-6
    np.testing.assert_allclose(got[0], exact, rtol=tol, atol=tol)
    np.testing.assert_allclose(twin[0], exact, rtol=tol, atol=tol)
    x_hat = (x - mean) * r
    np.testing.assert_allclose(got[1], (dY.astype(F64) * x_hat).sum(axis=(0, 1)), rtol=tol)
    recomputed = (nk.layer_normalization_backward(dY, X, scale) if centered
                  else nk.rms_normalization_backward(dY, X, scale))
    assert not np.allclose(recomputed[0], got[0], rtol=1e-3)  # the given ones mattered


def test_layer_backward_takes_the_forwards_outputs(rng):
    """ONNX LayerNormalization's Mean and InvStdDev (X.shape[:axis] + ones, float32)."""
    X = (rng.standard_normal((5, 3, 64)) * 3 + 1).astype(F32)
    dY = rng.standard_normal(X.shape).astype(F32)
    scale, B = rng.uniform(0.5, 2, 64).astype(F32), rng.standard_normal(64).astype(F32)
    _, mean, inv_std = nk.layer_normalization(X, scale, B, num_outputs=3)
    assert mean.shape == (5, 3, 1)
    got = nk.layer_normalization_backward(dY, X, scale, mean=mean, inv_std=inv_std)
    want = nk.layer_normalization_backward(dY, X, scale)
    np.testing.assert_allclose(got[0], want[0], rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("instance", [False, True], ids=["groupnorm", "instancenorm"])
@pytest.mark.parametrize("fmt", ["NCX", "NXC"])
def test_group_backward_uses_the_given_statistics(rng, fmt, instance):
    shape, G = (3, 6, 7, 9), 6 if instance else 3
    X = layout(rng.standard_normal(shape) * 2 + 1, fmt)
    dY = layout(rng.standard_normal(shape), fmt)
    scale = rng.uniform(0.5, 2, 6) * rng.choice([-1, 1], 6)
    g = channels_first(X, fmt).reshape(3, G, -1)
    mean = g.mean(axis=2) + 0.1 * rng.standard_normal((3, G))
    r = 0.9 / np.sqrt(g.var(axis=2) + EPS)
    kwargs = dict(mean=mean, inv_std=r, epsilon=EPS, data_format=fmt)
    if instance:
        got = nk.instance_normalization_backward(dY, X, scale, **kwargs)
        twin = reference.instance_normalization_backward(dY, X, scale, **kwargs)
    else:
        got = nk.group_normalization_backward(dY, X, scale, num_groups=G, **kwargs)
        twin = reference.group_normalization_backward(dY, X, scale, num_groups=G, **kwargs)
    s = np.broadcast_to(scale.reshape(1, 6, 1, 1), shape).reshape(3, G, -1)
    gdy = channels_first(dY, fmt).reshape(3, G, -1)
    exact = given_expected(gdy, g, s, mean[..., None], r[..., None], 2).reshape(shape)
    for dX in (got[0], twin[0]):
        np.testing.assert_allclose(channels_first(dX, fmt), exact, rtol=1e-12, atol=1e-12)
    x_hat = ((g - mean[..., None]) * r[..., None]).reshape(shape)
    np.testing.assert_allclose(got[1], (channels_first(dY, fmt) * x_hat).sum(axis=(0, 2, 3)),
                               rtol=1e-12)


def test_given_statistics_are_checked(rng):
    X = rng.standard_normal((2, 6, 4, 4)).astype(F32)
    dY = rng.standard_normal(X.shape).astype(F32)
    s, stats = np.ones(6, F32), np.ones((2, 3), F32)
    with pytest.raises(ValueError, match="give both mean and inv_std"):
        nk.group_normalization_backward(dY, X, s, num_groups=3, mean=stats)
    with pytest.raises(ValueError, match=r"inv_std must have shape \(2, 3\)"):
        nk.group_normalization_backward(dY, X, s, num_groups=3, mean=stats, inv_std=stats.T)
    with pytest.raises(TypeError, match="mean"):
        nk.group_normalization_backward(dY, X, s, num_groups=3, mean=stats.astype(np.int32),
                                        inv_std=stats)
    with pytest.raises(ValueError, match=r"mean must have shape \(2, 6\)"):
        nk.instance_normalization_backward(dY, X, s, mean=stats, inv_std=np.ones((2, 6)))
    rows = rng.standard_normal((4, 8)).astype(F32)
    with pytest.raises(TypeError, match="mean"):  # RMS is not centred: no mean argument
        nk.rms_normalization_backward(rows, rows, np.ones(8, F32), inv_std=np.ones(4),
                                      mean=np.zeros(4))
    with pytest.raises(ValueError, match="give both mean and inv_std"):
        nk.layer_normalization_backward(rows, rows, np.ones(8, F32), inv_std=np.ones(4))
    with pytest.raises(ValueError, match=r"inv_std must have shape \(4,\)"):
        nk.layer_normalization_backward(rows, rows, np.ones(8, F32), mean=np.zeros(4),
                                        inv_std=np.ones((4, 2)))


# --- oneDNN Graph: BatchNormForwardTraining, BatchNormTrainingBackward, LayerNormBackward ---

@pytest.mark.parametrize("momentum", [None, 0.9], ids=["default", "given"])
@pytest.mark.parametrize("fmt", ["NXC", "NCX"])
@pytest.mark.parametrize("dtype", [F32, BF16, F16], ids=["float32", "bfloat16", "float16"])
@pytest.mark.parametrize("shape", [(4, 3, 9, 11), (50, 4), (2, 3, 4, 5, 6)],
                         ids=["4d", "2d", "5d"])
def test_onednn_forward_training(rng, shape, dtype, fmt, momentum):
    X, _, _, mean, var = bn_case(rng, shape, dtype, fmt)
    C = mean.size
    t2 = BF16 if dtype == BF16 else F32
    old_mean, old_var = rng.standard_normal(C).astype(t2), rng.uniform(0.5, 2, C).astype(t2)
    gamma, beta = rng.uniform(0.5, 2, C).astype(t2), rng.standard_normal(C).astype(t2)
    dst, run_mean, run_var, batch_mean, batch_var = nk.batch_norm_forward_training(
        X, old_mean, old_var, gamma, beta, epsilon=EPS, momentum=momentum, data_format=fmt)
    assert dst.dtype == dtype and dst.shape == X.shape
    assert all(v.dtype == t2 and v.shape == (C,)
               for v in (run_mean, run_var, batch_mean, batch_var))
    m = 0.5 if momentum is None else momentum  # the dnnl backend's default
    exact = {"batch_mean": mean, "batch_var": var,
             "run_mean": m * old_mean.astype(F64) + (1 - m) * mean,
             "run_var": m * old_var.astype(F64) + (1 - m) * var}
    got = {"batch_mean": batch_mean, "batch_var": batch_var, "run_mean": run_mean,
           "run_var": run_var}
    # float64 statistics rounded once (16-bit src: float32 runs joined in float64, as
    # every 16-bit statistics pass here, within a few float32 ulps)
    unit = 2.0 ** -(8 if t2 == BF16 else 24 if dtype == F32 else 20)
    for name, want in exact.items():
        assert_close(got[name], want, np.abs(want) * unit + 1e-6 * np.abs(mean).max() * unit,
                     name)
    # dst is ONNX BatchNormalization-15 in training mode (tested against its oracle)
    onnx = nk.batch_normalization(X, gamma.astype(F32), beta.astype(F32),
                                  old_mean.astype(F32), old_var.astype(F32), epsilon=EPS,
                                  momentum=m, training_mode=1, data_format=fmt)
    assert_identical(dst, onnx[0])
    plain = nk.batch_norm_forward_training(X, old_mean, old_var, epsilon=EPS,
                                           momentum=momentum, data_format=fmt)
    ones = nk.batch_norm_forward_training(X, old_mean, old_var, np.ones(C, t2),
                                          np.zeros(C, t2), epsilon=EPS, momentum=momentum,
                                          data_format=fmt)
    for u, v in zip(plain, ones, strict=True):
        assert_identical(u, v)  # no gamma/beta: 1 and 0
    twin = reference.batch_norm_forward_training(X, old_mean, old_var, gamma, beta,
                                                 epsilon=EPS, momentum=momentum,
                                                 data_format=fmt)
    for name, v in zip(("run_mean", "run_var", "batch_mean", "batch_var"), twin[1:],
                       strict=True):
        assert_close(v, exact[name], np.abs(exact[name]) * unit * 2 + 1e-6, "twin " + name)


@pytest.mark.parametrize("fmt", ["NXC", "NCX"])
@pytest.mark.parametrize("dtype", [F32, BF16, F16], ids=["float32", "bfloat16", "float16"])
def test_onednn_training_backward(rng, dtype, fmt):
    shape = (4, 3, 9, 11)
    X, dY, _, _, _ = bn_case(rng, shape, dtype, fmt)
    t2 = BF16 if dtype == BF16 else F32
    C = 3
    _, _, _, batch_mean, batch_var = nk.batch_norm_forward_training(
        X, np.zeros(C, t2), np.ones(C, t2), epsilon=EPS, data_format=fmt)
    gamma = rng.uniform(0.5, 2, C).astype(t2)
    diff_src, diff_gamma, diff_beta = nk.batch_norm_training_backward(
        X, dY, batch_mean, batch_var, gamma, epsilon=EPS, data_format=fmt)
    assert diff_src.dtype == dtype and diff_gamma.dtype == diff_beta.dtype == t2
    mean64, var64 = batch_mean.astype(F64), batch_var.astype(F64)
    exact, tol, exact_dgamma, exact_dbeta = bn_expected(dY, X, gamma, mean64, var64, fmt)
    assert_close(diff_src, exact, tol, "diff_src")
    unit = 2.0 ** -(8 if t2 == BF16 else 24)
    slack = 1e-12 * dY.size * np.abs(dY.astype(F64)).max()
    assert_close(diff_gamma, exact_dgamma, np.abs(exact_dgamma) * unit + slack, "diff_gamma")
    assert_close(diff_beta, exact_dbeta, np.abs(exact_dbeta) * unit + slack, "diff_beta")
    alone = nk.batch_norm_training_backward(X, dY, batch_mean, batch_var, epsilon=EPS,
                                            data_format=fmt)
    assert isinstance(alone, np.ndarray)  # no gamma: diff_src alone, for gamma = 1
    assert_identical(alone, nk.batch_norm_training_backward(
        X, dY, batch_mean, batch_var, np.ones(C, t2), epsilon=EPS, data_format=fmt)[0])
    d = dY.copy()
    got = nk.batch_norm_training_backward(X, d, batch_mean, batch_var, gamma, epsilon=EPS,
                                          data_format=fmt, out=d)
    assert got[0] is d
    assert_identical(d, diff_src)


@pytest.mark.parametrize("dtype", [F32, BF16, F16], ids=["float32", "bfloat16", "float16"])
@pytest.mark.parametrize("shape,axis", [((6, 40), -1), ((3, 4, 8, 5), 2), ((2, 3, 70), -1)])
def test_onednn_layer_norm_backward(rng, shape, axis, dtype):
    X = (rng.standard_normal(shape) * 2 + 3).astype(dtype)
    dY = rng.standard_normal(shape).astype(dtype)
    a = axis % len(shape)
    span = shape[a:]
    gamma = rng.uniform(0.5, 2, span).astype(F32)
    beta = rng.standard_normal(span).astype(F32)
    _, mean, variance = nk.layer_norm(X, gamma, beta, begin_norm_axis=axis)
    assert mean.shape == shape[:a]
    diff_src, diff_gamma, diff_beta = nk.layer_norm_backward(X, dY, mean, variance, gamma, beta,
                                                             begin_norm_axis=axis)
    assert diff_src.dtype == dtype and diff_gamma.shape == diff_beta.shape == span
    assert diff_gamma.dtype == diff_beta.dtype == F32
    axes = tuple(range(a, len(shape)))
    m = np.expand_dims(mean.astype(F64), axes)
    r = 1 / np.sqrt(np.expand_dims(variance.astype(F64), axes) + EPS)
    exact = given_expected(dY, X, gamma.astype(F64), m, r, axes)
    rounding = half_ulp(exact, dtype) if dtype != F32 else 2.0**-24 * np.abs(exact)
    assert_close(diff_src, exact, rounding + 1e-9 * np.abs(exact).max(), "diff_src")
    lead = tuple(range(a))
    x_hat = (X.astype(F64) - m) * r
    np.testing.assert_allclose(diff_gamma, (dY.astype(F64) * x_hat).sum(axis=lead), rtol=1e-5,
                               atol=1e-5)
    np.testing.assert_allclose(diff_beta, dY.astype(F64).sum(axis=lead), rtol=1e-5, atol=1e-5)
    plain = nk.layer_norm_backward(X, dY, mean, variance, begin_norm_axis=axis,
                                   use_affine=False)
    assert isinstance(plain, np.ndarray)
    assert_identical(plain, nk.layer_norm_backward(
        X, dY, mean, variance, np.ones(span, F32), beta, begin_norm_axis=axis)[0])
    flat = nk.layer_norm_backward(X, dY, mean, variance, gamma.ravel(), beta.ravel(),
                                  begin_norm_axis=axis)
    assert flat[1].shape == (int(np.prod(span)),)
    assert_identical(flat[0], diff_src)
    twin = reference.layer_norm_backward(X, dY, mean, variance, gamma, beta,
                                         begin_norm_axis=axis)
    assert_close(twin[0], exact, rounding + 1e-9 * np.abs(exact).max(), "twin diff_src")


def test_onednn_training_ops_check_their_inputs(rng):
    X = rng.standard_normal((2, 4, 4, 3)).astype(F32)
    dY = rng.standard_normal(X.shape).astype(F32)
    c = np.ones(3, F32)
    with pytest.raises(TypeError, match="src has dtype float64"):
        nk.batch_norm_forward_training(X.astype(F64), c, c, epsilon=EPS)
    with pytest.raises(ValueError, match="give gamma and beta together"):
        nk.batch_norm_forward_training(X, c, c, c, epsilon=EPS)
    with pytest.raises(TypeError, match="bfloat16 only when T1"):
        nk.batch_norm_forward_training(X, c.astype(BF16), c.astype(BF16), epsilon=EPS)
    with pytest.raises(ValueError, match="epsilon must be positive"):
        nk.batch_norm_forward_training(X, c, c, epsilon=0.0)
    with pytest.raises(TypeError, match="momentum must be a float"):
        nk.batch_norm_forward_training(X, c, c, epsilon=EPS, momentum="0.5")
    with pytest.raises(ValueError, match=r"mean must have shape \(3,\)"):
        nk.batch_norm_forward_training(X, np.ones(4, F32), c, epsilon=EPS)
    with pytest.raises(ValueError, match="empty src"):
        nk.batch_norm_forward_training(X[:0], c, c, epsilon=EPS)
    with pytest.raises(TypeError, match="T1"):
        nk.batch_norm_training_backward(X, dY.astype(F16), c, c, epsilon=EPS)
    with pytest.raises(ValueError, match="diff_dst must have src's shape"):
        nk.batch_norm_training_backward(X, dY[:1], c, c, epsilon=EPS)
    with pytest.raises(ValueError, match="out overlaps diff_dst without being diff_dst"):
        nk.batch_norm_training_backward(X, dY, c, c, epsilon=EPS, out=dY[::-1])
    with pytest.raises(ValueError, match="out overlaps src without being src"):
        nk.batch_norm_forward_training(X, c, c, epsilon=EPS, out=X[::-1])
    rows = rng.standard_normal((4, 8)).astype(F32)
    g = np.ones(8, F32)
    with pytest.raises(ValueError, match="use_affine=True needs gamma and beta"):
        nk.layer_norm_backward(rows, rows, np.zeros(4, F32), np.ones(4, F32), g)
    with pytest.raises(ValueError, match=r"variance must have shape \(4,\)"):
        nk.layer_norm_backward(rows, rows, np.zeros(4, F32), np.ones((4, 1), F32), g, g)
    with pytest.raises(ValueError, match="gamma must have the normalized shape"):
        nk.layer_norm_backward(rows, rows, np.zeros(4, F32), np.ones(4, F32), g[:4], g[:4])


@pytest.mark.parametrize("fmt", ["NCX", "NXC"])
@pytest.mark.parametrize("instance", [False, True], ids=["groupnorm", "instancenorm"])
def test_group_backward_fused_reduction_routes(rng, routes, instance, fmt):
    """Long planes (fused-planes) and channels-last samples (fused-rows): one reduction
    gives the statistics and the sums, the same bits on either path, and within the
    oracle's bound; short planes take the planes' one reduction too."""
    shape = (2, 4, 300, 301)  # 90300 elements a plane: two chunks, the last one short
    X = layout((rng.standard_normal(shape) * 3 + 50).astype(F32), fmt)
    dY = layout(rng.standard_normal(shape).astype(F32), fmt)
    scale = rng.uniform(0.5, 2, 4).astype(F32)
    G = 4 if instance else 2
    results = []
    for path in ("serial", "parallel"):
        routes.clear()
        if instance:
            results.append(spec.instance_normalization_backward(
                dY, X, scale, epsilon=EPS, data_format=fmt, engine=ENGINE, path=path))
        else:
            results.append(spec.group_normalization_backward(
                dY, X, scale, num_groups=G, epsilon=EPS, data_format=fmt, engine=ENGINE,
                path=path))
        fused = "fused-planes" if fmt == "NCX" else "fused-rows"
        assert f"grad_sums/{fused}/{path}" in routes
        assert not any(r.startswith("moments/") for r in routes)  # no separate statistics
    for u, v in zip(*results, strict=True):
        assert_identical(u, v)
    exact, tol, exact_dscale, exact_dB = group_expected(dY, X, scale, G, fmt)
    assert_close(results[0][0], exact, tol, "dX")
    check_parameters(results[0][1], results[0][2], exact_dscale, exact_dB, dY)
    routes.clear()  # short planes: the same one reduction
    small = rng.standard_normal((2, 4, 5, 5)).astype(F32)
    spec.group_normalization_backward(small, small, scale, num_groups=2, epsilon=EPS,
                                      engine=ENGINE, path="serial")  # path=: no plan
    assert "grad_sums/fused-planes/serial" in routes
    assert not any(r.startswith("moments/") for r in routes)


def test_a_fresh_process_can_start_with_a_parallel_backward():
    """The one-call backward kernels launch parallel kernels from compiled code, which
    does not start Numba's threading layer: a parallel launch guard starts it (a
    process whose first parallel call was a BatchNorm backward from kernels in the disk
    cache crashed). In a fresh process: the guard leaves the layer started, and such a
    first call runs."""
    import subprocess
    import sys

    code = (
        "import numpy as np, normkernels as nk\n"
        "from numba.np.ufunc import parallel\n"
        "from normkernels.engine import threads\n"
        "with threads.launch_guard('parallel'):\n"
        "    print(parallel._is_initialized)\n"
        "X = np.random.rand(8, 64, 32, 32).astype(np.float32)\n"
        "c = np.ones(64, np.float32)\n"
        "print(nk.batch_normalization_backward(X, X, c, c * 0, c)[1][0] > 0)\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, (done.returncode, done.stderr[-2000:])
    assert done.stdout.split() == ["True", "True"]

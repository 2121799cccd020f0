"""The gated RMSNorm (mamba_ssm's RMSNormGated) and its backward pass: against a float64
oracle written from the fact sheet (specs/llm-normalizations.md), bit for bit against
the NumPy twin, and the backward against torch autograd of the float64 composite."""

import subprocess
import sys
import textwrap

import numpy as np
import pytest
from arrays import FLOAT_IDS, FLOATS, assert_identical
from oracle import assert_close, ulp

import normkernels as nk
from normkernels import reference
from normkernels.engine.numba_engine import ENGINE
from normkernels.reference import gated as reference_gated

F64 = np.dtype(np.float64)
SHAPES = {"1x4096": (1, 4096), "4x4096": (4, 4096), "3x5x64": (3, 5, 64), "1x7": (1, 7),
          "13x96": (13, 96), "12x4096": (12, 4096)}  # 12 x 4096: two parallel items


def u_c(dtype):
    """Unit roundoff of the compute dtype."""
    return 2.0 ** -53 if np.dtype(dtype) == F64 else 2.0 ** -24


def silu(z):
    with np.errstate(over="ignore", invalid="ignore"):
        return z / (1.0 + np.exp(-z))


def oracle(x, z, w, b, G, eps, before):
    """``(y, x_hat, rstd, u)`` in float64 from the formulas."""
    x, z, w = (np.asarray(v, F64) for v in (x, z, w))
    b = 0.0 if b is None else np.asarray(b, F64)
    with np.errstate(all="ignore"):
        u = x if before else x * silu(z)
        groups = u.reshape(-1, G)
        rstd = 1.0 / np.sqrt(np.mean(groups * groups, axis=1, keepdims=True) + eps)
        xh = (groups * rstd).reshape(x.shape)
        y = xh * w + b
        if before:
            y = y * silu(z)
    return y, xh, np.repeat(rstd, G, axis=1).reshape(x.shape), u


def tolerance(x, z, w, b, G, eps, before, dtype):
    """The error model: the compute dtype's roundings (16 units, SiLU's own 8 among
    them) on the terms they scale, and half an ulp of the output dtype."""
    y, xh, rstd, _u = oracle(x, z, w, b, G, eps, before)
    x, z, w = (np.asarray(v, F64) for v in (x, z, w))
    b = 0.0 if b is None else np.abs(np.asarray(b, F64))
    e = 16 * u_c(dtype)
    with np.errstate(all="ignore"):
        affine = np.abs(xh * w) + b
        if before:
            tol = e * affine * (np.abs(silu(z)) + np.abs(z) + 1)
        else:
            spread = np.abs(x) * (np.abs(z) + 1)
            rms = np.sqrt(np.mean(spread.reshape(-1, G) ** 2, axis=1, keepdims=True))
            rel = np.repeat(rms, G, axis=1).reshape(x.shape) * rstd
            tol = e * (np.abs(w) * rstd * spread + affine + np.abs(xh * w) * rel)
        tol = np.nan_to_num(tol, nan=0.0, posinf=0.0)
    return y, tol + 0.5 * ulp(y, dtype) * (np.dtype(dtype).itemsize < 8) + 1e-300


def make(rng, shape, dtype, mean=0.0, bias=True, gate_scale=3.0):
    x = (rng.standard_normal(shape) + mean).astype(dtype)
    z = (rng.standard_normal(shape) * gate_scale).astype(dtype)
    K = shape[-1]
    w = rng.uniform(0.5, 2.0, K).astype(dtype) * rng.choice([-1, 1], K).astype(dtype)
    b = rng.standard_normal(K).astype(dtype) if bias else None
    return x, z, w, b


def groups_for(K, group):
    return K if group is None or group > K else group


CASES = [(s, g, bf, bias) for s in ("1x4096", "4x4096", "3x5x64", "1x7", "13x96")
         for g in (None, 32) for bf in (True, False) for bias in (True, False)
         if not (s == "1x7" and g == 32)]


def _cid(case):
    s, g, bf, bias = case
    return f"{s}-g{g}-{'before' if bf else 'after'}-{'bias' if bias else 'nobias'}"


@pytest.mark.parametrize("dtype", FLOATS, ids=FLOAT_IDS)
@pytest.mark.parametrize("case", CASES, ids=[_cid(c) for c in CASES])
def test_forward_matches_oracle(rng, dtype, case):
    shape, group, before, bias = case
    x, z, w, b = make(rng, SHAPES[shape], dtype, bias=bias)
    before_x, before_z = x.copy(), z.copy()
    G = groups_for(x.shape[-1], group)
    y = nk.gated_rms_normalization(x, z, w, b, epsilon=1e-6, group_size=group,
                                   norm_before_gate=before)
    assert y.dtype == x.dtype and y.shape == x.shape
    assert_identical(x, before_x)
    assert_identical(z, before_z)
    exact, tol = tolerance(x, z, w, b, G, 1e-6, before, dtype)
    assert_close(y, exact, tol)


@pytest.mark.parametrize("dtype", FLOATS, ids=FLOAT_IDS)
@pytest.mark.parametrize("before", [True, False], ids=["before", "after"])
@pytest.mark.parametrize("group", [None, 64])
@pytest.mark.parametrize("shape", ["4x4096", "12x4096", "3x5x64", "1x7"])
def test_forward_twin_bit_identical(rng, dtype, before, group, shape):
    """The twin given the kernels' mean squares gives their bits on both paths; its own
    statistics are within the statistics' accuracy."""
    x, z, w, b = make(rng, SHAPES[shape], dtype)
    K = x.shape[-1]
    G = groups_for(K, group)
    x2, z2 = x.reshape(-1, K), z.reshape(-1, K)
    results = []
    for path in ("serial", "parallel"):
        y = np.empty_like(x2)
        var = ENGINE.gated_rms(x2, z2, y, w, b, G, 1e-6, before, path)
        results.append((y, var))
    assert_identical(results[0][0], results[1][0])
    assert np.array_equal(results[0][1], results[1][1])
    y, var = results[0]
    twin = np.empty_like(x2)
    reference.ENGINE.gated_rms(x2, z2, twin, w, b, G, 1e-6, before, var=var)
    assert_identical(y, twin)
    own = reference.ENGINE.gated_rms(x2, z2, np.empty_like(x2), w, b, G, 1e-6, before)
    assert np.allclose(own, var, rtol=1e-6 if x.itemsize == 2 else 1e-12, atol=0)


def test_silu_twin_bit_identical():
    """The twin's SiLU is the kernels' on float32 and float64 over the whole range
    (the before-gate output with x_hat = 1 is silu(z) itself)."""
    for dtype in (np.float32, np.float64):
        z = np.concatenate([np.linspace(-120, 90, 20001), [0.0, -0.0, np.inf, -np.inf, np.nan,
                                                           1e-30, -1e-30, -745.5, -103.9]])
        z = z.astype(dtype).reshape(-1, 1)
        x = np.ones_like(z)
        y = np.empty_like(z)
        ENGINE.gated_rms(x, z, y, np.ones(1, dtype), None, 1, 0.0, True, "serial")
        assert_identical(y, reference_gated.silu(z))


@pytest.mark.parametrize("path", ["serial", "parallel"])
def test_paths_agree_on_prefill(rng, path):
    x, z, w, b = make(rng, (64, 1024), np.float32)
    y = nk.gated_rms_normalization(x, z, w, b)
    again = np.empty_like(x)
    ENGINE.gated_rms(x, z, again, w, b, 1024, 1e-6, True, path)
    assert_identical(y, again)


@pytest.mark.parametrize("dtype", FLOATS, ids=FLOAT_IDS)
@pytest.mark.parametrize("before", [True, False], ids=["before", "after"])
def test_large_offset(rng, dtype, before):
    """Rows of mean 1e4 and std 1 (mean 100 for float16, whose squares overflow past
    256): the float64 mean square keeps the normalized values."""
    mean = 100.0 if dtype == np.float16 else 1e4
    x, z, w, b = make(rng, (4, 256), dtype, mean=mean, gate_scale=1.0)
    y = nk.gated_rms_normalization(x, z, w, b, group_size=64, norm_before_gate=before)
    exact, tol = tolerance(x, z, w, b, 64, 1e-6, before, dtype)
    assert_close(y, exact, tol)


@pytest.mark.parametrize("dtype", FLOATS, ids=FLOAT_IDS)
def test_strided_views_and_out(rng, dtype):
    """Row-strided views are read in place, a non-contiguous last axis is copied; out
    may be x itself and gets the same bits."""
    big, bz, w, b = make(rng, (6, 200), dtype)
    x, z = big[::2, 8:136], bz[1::2, 4:132]
    wk, bk = w[:128], b[:128]
    want = nk.gated_rms_normalization(x.copy(), z.copy(), wk, bk, group_size=64)
    assert_identical(nk.gated_rms_normalization(x, z, wk, bk, group_size=64), want)
    xs, zs = big[:, ::2][:, :64], bz[:, ::2][:, :64]  # last axis not contiguous
    want2 = nk.gated_rms_normalization(xs.copy(), zs.copy(), w[:64], b[:64])
    assert_identical(nk.gated_rms_normalization(xs, zs, w[:64], b[:64]), want2)
    x3 = x.copy()
    out = nk.gated_rms_normalization(x3, z, wk, bk, group_size=64, out=x3)
    assert out is x3
    assert_identical(x3, want)
    target = np.zeros((3, 256), dtype)[:, ::2]  # out with a non-contiguous last axis
    assert nk.gated_rms_normalization(x, z, wk, bk, group_size=64, out=target) is target
    assert_identical(target, want)


@pytest.mark.parametrize("dtype", FLOATS, ids=FLOAT_IDS)
@pytest.mark.parametrize("before", [True, False], ids=["before", "after"])
def test_hostile_values(rng, dtype, before):
    """Zeros, infinities and NaN: as the float64 formula, confined to their group."""
    x, z, w, b = make(rng, (6, 128), dtype)
    x[0] = 0
    x[1, 5] = np.inf
    x[2, 70] = np.nan
    z[3, 3] = np.inf
    z[4, 9] = -np.inf
    z[5, 100] = np.nan
    y = nk.gated_rms_normalization(x, z, w, b, group_size=64, norm_before_gate=before)
    exact, tol = tolerance(x, z, w, b, 64, 1e-6, before, dtype)
    assert_close(y, exact, tol)
    finite = np.isfinite(np.asarray(y, F64))
    assert finite[2, :64].all() and not finite[2, 64:].any()  # NaN stays in its group
    assert np.isfinite(np.asarray(y[0], F64)).all()


def test_no_bias_adds_nothing_to_negative_zero():
    x = np.zeros((1, 8), np.float32)
    y = nk.gated_rms_normalization(x, np.ones_like(x), -np.ones(8, np.float32))
    assert np.signbit(y).all()  # (0 * -1) * silu(1) = -0, not +0


def test_mamba_group_semantics_differ_from_whole_row(rng):
    """group_size splits the statistics (mamba_ssm's ngroups)."""
    x, z, w, b = make(rng, (2, 128), np.float64)
    x[:, 64:] *= 100
    a = nk.gated_rms_normalization(x, z, w, b, group_size=64)
    c = nk.gated_rms_normalization(x, z, w, b)
    assert not np.allclose(a[:, :64], c[:, :64])
    exact, _ = tolerance(x, z, w, b, 64, 1e-6, True, np.float64)
    assert np.allclose(a, exact, rtol=1e-13, atol=1e-13)


def test_errors():
    x = np.ones((2, 8), np.float32)
    w = np.ones(8, np.float32)
    f = nk.gated_rms_normalization
    with pytest.raises(TypeError, match="gate must have x's dtype"):
        f(x, x.astype(np.float64), w)
    with pytest.raises(TypeError, match="weight must have x's dtype"):
        f(x, x, w.astype(np.float16))
    with pytest.raises(TypeError, match="x has dtype int32"):
        f(x.astype(np.int32), x.astype(np.int32), w.astype(np.int32))
    with pytest.raises(ValueError, match=r"gate must have shape \(2, 8\)"):
        f(x, x[:1], w)
    with pytest.raises(ValueError, match=r"weight must have shape \(8,\)"):
        f(x, x, w[:4])
    with pytest.raises(ValueError, match=r"bias must have shape \(8,\)"):
        f(x, x, w, w[:3])
    with pytest.raises(ValueError, match="group_size must be a positive divisor"):
        f(x, x, w, group_size=3)
    with pytest.raises(ValueError, match="group_size must be a positive divisor"):
        f(x, x, w, group_size=0)
    with pytest.raises(TypeError, match="group_size must be an integer"):
        f(x, x, w, group_size=4.0)
    with pytest.raises(TypeError, match="norm_before_gate must be a bool"):
        f(x, x, w, norm_before_gate="yes")
    with pytest.raises(ValueError, match="epsilon must be finite"):
        f(x, x, w, epsilon=np.inf)
    with pytest.raises(ValueError, match="rows of zero elements"):
        f(x[:, :0], x[:, :0], w[:0])
    with pytest.raises(ValueError, match="out must have x's shape"):
        f(x, x, w, out=np.empty((2, 4), np.float32))
    with pytest.raises(ValueError, match="out is read-only"):
        ro = np.empty_like(x)
        ro.flags.writeable = False
        f(x, x, w, out=ro)
    with pytest.raises(ValueError, match="out overlaps x"):
        big = np.ones((2, 9), np.float32)
        f(big[:, :8], x, w, out=big[:, 1:])
    with pytest.raises(ValueError, match="rank >= 1"):
        f(np.float32(1), np.float32(1), w[:1])
    assert f(x[:0], x[:0], w).shape == (0, 8)


def test_import_compiles_nothing():
    code = textwrap.dedent("""
        import normkernels.kernels.gated as g, normkernels.kernels.qk_norm as q
        from numba.core.dispatcher import Dispatcher
        ks = [k for m in (g, q) for k in vars(m).values() if isinstance(k, Dispatcher)]
        assert len(ks) >= 8, len(ks)
        print(sum(len(k.signatures) for k in ks))
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True)
    assert out.stdout.strip() == "0"


# --- backward ---------------------------------------------------------------------------


def backward_oracle(dy, x, z, w, b, G, eps, before):
    """``(dx, dz, dw, db)`` in float64 from the chain rule, and the magnitudes their
    errors scale with."""
    dy, x, z, w = (np.asarray(v, F64) for v in (dy, x, z, w))
    b = np.zeros_like(w) if b is None else np.asarray(b, F64)
    K = x.shape[-1]
    with np.errstate(all="ignore"):
        s = 1.0 / (1.0 + np.exp(-z))
        si, slope = z * s, s * (1.0 + z * (1.0 - s))
        u = x if before else x * si
        ug = u.reshape(-1, G)
        r = np.repeat(1.0 / np.sqrt(np.mean(ug * ug, axis=1, keepdims=True) + eps), G,
                      axis=1).reshape(x.shape)
        h = u * r
        d = dy * si if before else dy
        g = d * w
        hg = (h * g).reshape(-1, G)
        c = np.repeat(hg.mean(axis=1, keepdims=True), G, axis=1).reshape(x.shape)
        c_abs = np.repeat(np.abs(hg).mean(axis=1, keepdims=True), G, axis=1).reshape(x.shape)
        du = r * (g - h * c)
        mag_du = r * (np.abs(g) + np.abs(h) * c_abs) * (np.abs(si) + np.abs(z) + 2)
        if before:
            dx, dz = du, dy * (h * w + b) * slope
            mag_dx = mag_du
            mag_dz = np.abs(dy) * (np.abs(h * w) + np.abs(b)) * (np.abs(z) + 2)
        else:
            dx, dz = du * si, du * x * slope
            mag_dx, mag_dz = mag_du * (np.abs(si) + 1), mag_du * np.abs(x) * (np.abs(z) + 2)
        rows = (-1, K)
        dw = (d * h).reshape(rows).sum(axis=0)
        db = d.reshape(rows).sum(axis=0)
        mag_w = (np.abs(dy) * np.abs(h) * (np.abs(si) + np.abs(z) + 2)).reshape(rows).sum(axis=0)
        mag_b = (np.abs(dy) * (np.abs(si) + np.abs(z) + 2)).reshape(rows).sum(axis=0)
    M = x.size // K
    return ((dx, mag_dx * (4 * G + 64)), (dz, mag_dz * 64), (dw, mag_w * (M + 4 * G + 64)),
            (db, mag_b * (M + 64)))


def check_backward(grads, dy, x, z, w, b, G, before):
    names = ("dx", "dgate", "dweight", "dbias")
    for got, name, (exact, mag) in zip(grads, names,
                                       backward_oracle(dy, x, z, w, b, G, 1e-6, before),
                                       strict=False):
        assert got.dtype == x.dtype
        tol = 2.0 ** -52 * mag + 0.5 * ulp(exact, x.dtype) + 1e-300
        assert_close(got, exact, tol, name)


BACKWARD_CASES = [(s, g, bf, bias) for s in ("4x4096", "3x5x64", "1x7", "13x96")
                  for g in (None, 32) for bf in (True, False) for bias in (True, False)
                  if not (s == "1x7" and g == 32)]


@pytest.mark.parametrize("dtype", FLOATS, ids=FLOAT_IDS)
@pytest.mark.parametrize("case", BACKWARD_CASES, ids=[_cid(c) for c in BACKWARD_CASES])
def test_backward_matches_oracle(rng, dtype, case):
    shape, group, before, bias = case
    x, z, w, b = make(rng, SHAPES[shape], dtype, bias=bias)
    dy = rng.standard_normal(x.shape).astype(dtype)
    G = groups_for(x.shape[-1], group)
    grads = nk.gated_rms_normalization_backward(dy, x, z, w, b, group_size=group,
                                                norm_before_gate=before)
    assert len(grads) == (4 if bias else 3)
    assert grads[0].shape == x.shape and grads[2].shape == w.shape
    check_backward(grads, dy, x, z, w, b, G, before)


@pytest.mark.parametrize("before", [True, False], ids=["before", "after"])
@pytest.mark.parametrize("group", [None, 16])
@pytest.mark.parametrize("bias", [True, False], ids=["bias", "nobias"])
def test_backward_matches_torch_autograd(rng, before, group, bias):
    torch = pytest.importorskip("torch")
    F = torch.nn.functional
    x, z, w, b = make(rng, (5, 3, 64), np.float64, bias=bias)
    dy = rng.standard_normal(x.shape)
    G = groups_for(64, group)
    tx, tz, tw = (torch.tensor(v, requires_grad=True) for v in (x, z, w))
    tb = torch.tensor(b, requires_grad=True) if bias else None
    u = tx if before else tx * F.silu(tz)
    ug = u.reshape(*u.shape[:-1], -1, G)
    xh = (ug * torch.rsqrt(ug.pow(2).mean(-1, keepdim=True) + 1e-6)).reshape(u.shape)
    y = xh * tw + (tb if bias else 0)
    if before:
        y = y * F.silu(tz)
    y.backward(torch.tensor(dy))
    want = [tx.grad, tz.grad, tw.grad] + ([tb.grad] if bias else [])
    got = nk.gated_rms_normalization_backward(dy, x, z, w, b, group_size=group,
                                              norm_before_gate=before)
    mags = backward_oracle(dy, x, z, w, b, G, 1e-6, before)
    for g, t, (_, mag), name in zip(got, want, mags, ("dx", "dgate", "dweight", "dbias"),
                                    strict=False):
        assert t.dtype == torch.float64 and g.dtype == np.float64
        assert_close(g, t.numpy(), 2 * 2.0 ** -52 * mag + 1e-300, name)
    forward = nk.gated_rms_normalization(x, z, w, b, group_size=group, norm_before_gate=before)
    assert_close(forward, y.detach().numpy(), tolerance(x, z, w, b, G, 1e-6, before, F64)[1])


@pytest.mark.parametrize("dtype", FLOATS, ids=FLOAT_IDS)
@pytest.mark.parametrize("before", [True, False], ids=["before", "after"])
@pytest.mark.parametrize("group", [None, 64])
@pytest.mark.parametrize("shape", ["12x4096", "3x5x64", "1x7"])
def test_backward_twin_bit_identical(rng, dtype, before, group, shape):
    """Both paths and the twin given the kernels' mean squares: the same bits, the
    sums over rows included (12 x 4096 is two work items)."""
    x, z, w, b = make(rng, SHAPES[shape], dtype)
    K = x.shape[-1]
    G = groups_for(K, group)
    x2, z2 = x.reshape(-1, K), z.reshape(-1, K)
    dy = rng.standard_normal(x2.shape).astype(dtype)
    runs = []
    for engine, path in ((ENGINE, "serial"), (ENGINE, "parallel"), (reference.ENGINE, None)):
        dx, dz = np.empty_like(x2), np.empty_like(x2)
        kw = {} if engine is ENGINE else {"var": runs[0][4]}
        dw, db, var = engine.gated_rms_backward(dy, x2, z2, w, b, G, 1e-6, before, dx, dz,
                                                path, **kw)
        runs.append((dx, dz, dw, db, var))
    for other in runs[1:]:
        for a, c in zip(runs[0], other, strict=True):
            assert_identical(a, c)


def test_backward_hostile_values_stay_in_their_group(rng):
    x, z, w, _b = make(rng, (4, 128), np.float32)
    dy = rng.standard_normal(x.shape).astype(np.float32)
    x[1, 3] = np.nan
    x[2] = 0
    dx, dz, dw = nk.gated_rms_normalization_backward(dy, x, z, w, group_size=64)
    assert np.isnan(dx[1, :64]).all() and np.isfinite(dx[1, 64:]).all()
    assert np.isfinite(dx[[0, 2, 3]]).all() and np.isfinite(dz[[0, 2, 3]]).all()
    assert np.isnan(dw[:64]).all() and np.isfinite(dw[64:]).all()


def test_backward_errors():
    x = np.ones((2, 8), np.float32)
    w = np.ones(8, np.float32)
    f = nk.gated_rms_normalization_backward
    with pytest.raises(TypeError, match="dY must have x's dtype"):
        f(x.astype(np.float64), x, x, w)
    with pytest.raises(ValueError, match=r"dY must have shape \(2, 8\)"):
        f(x[:1], x, x, w)
    with pytest.raises(ValueError, match="group_size must be a positive divisor"):
        f(x, x, x, w, group_size=5)
    dx, _dz, dw, db = f(x[:0], x[:0], x[:0], w, w)
    assert dx.shape == (0, 8) and dw.dtype == np.float32 and not db.any()

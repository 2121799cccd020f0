"""Per-head QK-norm on a packed qkv, in place: against float64 oracles of both roundings
(the package's "once" and Hugging Face Qwen3RMSNorm's "llama"), bit for bit against the
NumPy twin, v untouched, no copy."""

import numpy as np
import pytest
from arrays import FLOAT_IDS, FLOATS, assert_identical
from oracle import assert_close, ulp

import normkernels as nk
from normkernels import reference
from normkernels.dtypes import BFLOAT16
from normkernels.engine.numba_engine import ENGINE

F64 = np.dtype(np.float64)
# (tokens, nq, nkv, head_dim)
# long-heads: 16-bit statistics in two float32 runs (256 + 8), vector bodies and a tail
SHAPES = {"qwen3-8b": (512, 32, 8, 128), "decode": (1, 4, 2, 64), "odd": (7, 3, 1, 24),
          "tiny-heads": (5, 2, 2, 7), "two-items": (70, 2, 1, 128),
          "long-heads": (3, 2, 1, 264)}


def round_to(values, dtype):
    """float64 ``values`` rounded once to ``dtype`` (round-to-odd through float32 for
    16-bit types, written apart from the package)."""
    dtype = np.dtype(dtype)
    if dtype == F64:
        return values
    with np.errstate(all="ignore"):
        f = values.astype(np.float32)
        if dtype.itemsize == 4:
            return f
        back = f.astype(F64)
        bits = f.view(np.int32)
        inexact = (back != values) & ~np.isnan(values) & ((bits & 1) == 0)
        step = np.where(np.abs(values) > np.abs(back), 1, -1).astype(np.int32)
        return np.where(inexact, bits + step, bits).view(np.float32).astype(dtype)


def oracle(qkv, qw, kw, nq, nkv, D, eps):
    """``(x_hat, w)`` per q and k head, float64: shape (..., nq + nkv, D)."""
    heads = np.asarray(qkv, F64)[..., :(nq + nkv) * D].reshape(*qkv.shape[:-1], nq + nkv, D)
    with np.errstate(all="ignore"):
        xh = heads / np.sqrt(np.mean(heads * heads, axis=-1, keepdims=True) + eps)
    w = np.concatenate([np.tile(np.asarray(qw, F64), (nq, 1)), np.tile(np.asarray(kw, F64),
                                                                    (nkv, 1))])
    return xh, w


def u_c(dtype):
    return 2.0 ** -53 if np.dtype(dtype) == F64 else 2.0 ** -24


def make(rng, shape, dtype, mean=0.0):
    M, nq, nkv, D = shape
    qkv = (rng.standard_normal((M, (nq + 2 * nkv) * D)) * 2 + mean).astype(dtype)
    qw = rng.uniform(0.5, 2.0, D).astype(dtype)
    kw = (rng.uniform(0.5, 2.0, D) * rng.choice([-1, 1], D)).astype(dtype)
    return qkv, qw, kw


def qk_parts(a, nq, nkv, D):
    return a[..., :(nq + nkv) * D], a[..., (nq + nkv) * D:]


@pytest.mark.parametrize("dtype", FLOATS, ids=FLOAT_IDS)
@pytest.mark.parametrize("shape", list(SHAPES))
def test_once_matches_oracle_in_place(rng, dtype, shape):
    _M, nq, nkv, D = SHAPES[shape]
    qkv, qw, kw = make(rng, SHAPES[shape], dtype)
    original = qkv.copy()
    pointer = qkv.ctypes.data
    result = nk.qk_rms_normalization(qkv, qw, kw, num_q_heads=nq, num_kv_heads=nkv,
                                     head_dim=D)
    assert result is qkv and qkv.ctypes.data == pointer and np.shares_memory(result, qkv)
    assert_identical(qk_parts(qkv, nq, nkv, D)[1], qk_parts(original, nq, nkv, D)[1])
    xh, w = oracle(original, qw, kw, nq, nkv, D, 1e-6)
    exact = xh * w
    got = qk_parts(qkv, nq, nkv, D)[0].reshape(exact.shape)
    tol = 8 * u_c(dtype) * np.abs(exact) + 0.5 * ulp(exact, dtype) * (qkv.itemsize < 8)
    assert_close(got, exact, tol + 1e-300)
    if qkv.itemsize == 2:  # one rounding: the correctly rounded value almost everywhere
        same = got.astype(F64) == round_to(exact, dtype).astype(F64)
        assert same.mean() > 0.99


@pytest.mark.parametrize("dtype", FLOATS, ids=FLOAT_IDS)
@pytest.mark.parametrize("shape", ["qwen3-8b", "odd", "tiny-heads", "long-heads"])
def test_llama_rounding_matches_its_oracle(rng, dtype, shape):
    """round_T(x_hat), then times w in float32, rounded again (HF Qwen3RMSNorm)."""
    _M, nq, nkv, D = SHAPES[shape]
    qkv, qw, kw = make(rng, SHAPES[shape], dtype)
    original = qkv.copy()
    nk.qk_rms_normalization(qkv, qw, kw, num_q_heads=nq, num_kv_heads=nkv, head_dim=D,
                            rounding="llama")
    xh, w = oracle(original, qw, kw, nq, nkv, D, 1e-6)
    t = round_to(xh, dtype).astype(F64)
    want = round_to(t * w, dtype).astype(F64)  # the product of two T values: exact
    got = qk_parts(qkv, nq, nkv, D)[0].reshape(want.shape).astype(F64)
    tol = np.abs(w) * ulp(xh, dtype) + ulp(want, dtype) + 8 * u_c(dtype) * np.abs(want)
    assert_close(got, want, tol + 1e-300)
    if qkv.itemsize == 2:  # the rule's bits almost everywhere (x_hat's float32 error
        assert (got == want).mean() > 0.99  # moves a rounding only near a tie)
    assert_identical(qk_parts(qkv, nq, nkv, D)[1], qk_parts(original, nq, nkv, D)[1])
    once = nk.qk_rms_normalization(original.copy(), qw, kw, num_q_heads=nq, num_kv_heads=nkv,
                                   head_dim=D)
    differs = (qk_parts(once, nq, nkv, D)[0] != qk_parts(qkv, nq, nkv, D)[0]).mean()
    if qkv.itemsize == 2 and shape == "qwen3-8b":
        assert differs > 0.01  # the two rules are told apart for 16-bit T
    elif qkv.itemsize > 2:
        assert differs == 0  # ... and agree otherwise


@pytest.mark.parametrize("dtype", FLOATS, ids=FLOAT_IDS)
@pytest.mark.parametrize("rounding", ["once", "llama"])
@pytest.mark.parametrize("shape", ["two-items", "odd", "decode", "long-heads"])
def test_paths_and_twin_bit_identical(rng, dtype, rounding, shape):
    _M, nq, nkv, _D = SHAPES[shape]
    qkv, qw, kw = make(rng, SHAPES[shape], dtype)
    results = []
    for path in ("serial", "parallel"):
        a = qkv.copy()
        var = ENGINE.qk_rms(a, qw, kw, nq, nkv, 1e-6, rounding == "llama", path)
        results.append((a, var))
    assert_identical(results[0][0], results[1][0])
    assert np.array_equal(results[0][1], results[1][1])
    twin = qkv.copy()
    reference.ENGINE.qk_rms(twin, qw, kw, nq, nkv, 1e-6, rounding == "llama",
                            var=results[0][1])
    assert_identical(results[0][0], twin)
    own = reference.ENGINE.qk_rms(qkv.copy(), qw, kw, nq, nkv, 1e-6, rounding == "llama")
    assert np.allclose(own, results[0][1], rtol=1e-6 if qkv.itemsize == 2 else 1e-12, atol=0)


@pytest.mark.parametrize("dtype", FLOATS, ids=FLOAT_IDS)
def test_strided_rows_of_a_bigger_buffer(rng, dtype):
    """A row-strided view (every other token of a wider buffer) is normalized in place;
    the memory around it is untouched; leading axes (batch, seq) are accepted."""
    nq, nkv, D = 4, 2, 32
    W = (nq + 2 * nkv) * D
    buffer = rng.standard_normal((12, W + 40)).astype(dtype)
    before = buffer.copy()
    view = buffer[::2, 8:8 + W]
    qw, kw = rng.standard_normal(D).astype(dtype), rng.standard_normal(D).astype(dtype)
    want = nk.qk_rms_normalization(np.ascontiguousarray(view), qw, kw, num_q_heads=nq,
                                   num_kv_heads=nkv, head_dim=D)
    got = nk.qk_rms_normalization(view, qw, kw, num_q_heads=nq, num_kv_heads=nkv, head_dim=D)
    assert got is view and np.shares_memory(got, buffer)
    assert_identical(view, want)
    mask = np.ones(buffer.shape, bool)
    mask[::2, 8:8 + (nq + nkv) * D] = False
    assert_identical(buffer[mask], before[mask])
    batched = buffer.reshape(3, 4, W + 40)[:, :, 8:8 + W]  # rows merge: stride uniform
    nk.qk_rms_normalization(batched, np.ones(D, dtype), np.ones(D, dtype), num_q_heads=nq,
                            num_kv_heads=nkv, head_dim=D)


@pytest.mark.parametrize("dtype", FLOATS, ids=FLOAT_IDS)
def test_large_offset_and_hostile_values(rng, dtype):
    nq, nkv, D = 2, 1, 64
    mean = 100.0 if dtype == np.float16 else 1e4
    qkv, qw, kw = make(rng, (4, nq, nkv, D), dtype, mean=mean)
    qkv[1, :D] = 0
    qkv[2, D + 3] = np.nan
    qkv[3, 5] = np.inf
    qkv[3, -1] = np.nan  # in v: untouched, not spread
    original = qkv.copy()
    nk.qk_rms_normalization(qkv, qw, kw, num_q_heads=nq, num_kv_heads=nkv, head_dim=D)
    xh, w = oracle(original, qw, kw, nq, nkv, D, 1e-6)
    exact = xh * w
    got = qk_parts(qkv, nq, nkv, D)[0].reshape(exact.shape)
    tol = np.nan_to_num(8 * u_c(dtype) * np.abs(exact)) + 0.5 * ulp(exact, dtype) * (
        qkv.itemsize < 8)
    assert_close(got, exact, tol + 1e-300)
    assert not got[1, 0].any() and np.isnan(got[2, 1]).all() and np.isfinite(got[2, 0]).all()
    assert_identical(qk_parts(qkv, nq, nkv, D)[1], qk_parts(original, nq, nkv, D)[1])


@pytest.mark.parametrize("D", [128, 264])
def test_bfloat16_squares_beyond_float32(rng, D):
    """A bfloat16 head whose squares overflow float32 takes the float64 statistics."""
    nq, nkv = 2, 1
    qkv, qw, kw = make(rng, (3, nq, nkv, D), BFLOAT16)
    qkv[1, D:2 * D] = (qkv[1, D:2 * D].astype(F64) * 1e20).astype(BFLOAT16)
    original = qkv.copy()
    results = []
    for path in ("serial", "parallel"):
        a = original.copy()
        results.append((a, ENGINE.qk_rms(a, qw, kw, nq, nkv, 1e-6, False, path)))
    assert_identical(results[0][0], results[1][0])
    assert np.array_equal(results[0][1], results[1][1])
    assert np.isfinite(results[0][1]).all() and results[0][1][4] > 1e38
    twin = original.copy()
    reference.ENGINE.qk_rms(twin, qw, kw, nq, nkv, 1e-6, False, var=results[0][1])
    assert_identical(results[0][0], twin)
    xh, w = oracle(original, qw, kw, nq, nkv, D, 1e-6)
    exact = xh * w
    got = qk_parts(results[0][0], nq, nkv, D)[0].reshape(exact.shape)
    assert_close(got, exact, 8 * u_c(BFLOAT16) * np.abs(exact) + 0.5 * ulp(exact, BFLOAT16))


def test_errors():
    D, nq, nkv = 8, 2, 1
    qkv = np.ones((3, (nq + 2 * nkv) * D), np.float32)
    w = np.ones(D, np.float32)
    kw = dict(num_q_heads=nq, num_kv_heads=nkv, head_dim=D)
    f = nk.qk_rms_normalization
    with pytest.raises(ValueError, match=r"last axis must be \(num_q_heads \+ 2 \* num_kv"):
        f(qkv[:, :-1], w, w, **kw)
    with pytest.raises(ValueError, match=r"q_weight must have shape \(8,\)"):
        f(qkv, w[:4], w, **kw)
    with pytest.raises(ValueError, match=r"k_weight must have shape \(8,\)"):
        f(qkv, w, w[:4], **kw)
    with pytest.raises(TypeError, match="k_weight must have qkv's dtype"):
        f(qkv, w, w.astype(np.float64), **kw)
    with pytest.raises(TypeError, match="qkv has dtype int32"):
        f(qkv.astype(np.int32), w, w, **kw)
    with pytest.raises(TypeError, match="qkv must be an ndarray"):
        f(qkv.tolist(), w, w, **kw)
    with pytest.raises(ValueError, match="num_q_heads must be a positive integer"):
        f(qkv, w, w, num_q_heads=0, num_kv_heads=nkv, head_dim=D)
    with pytest.raises(TypeError, match="head_dim must be an integer"):
        f(qkv, w, w, num_q_heads=nq, num_kv_heads=nkv, head_dim=8.0)
    with pytest.raises(TypeError, match="num_kv_heads must be an integer"):
        f(qkv, w, w, num_q_heads=nq, num_kv_heads=True, head_dim=D)
    with pytest.raises(ValueError, match="rounding must be one of once, llama"):
        f(qkv, w, w, rounding="gemma", **kw)
    ro = qkv.copy()
    ro.flags.writeable = False
    with pytest.raises(ValueError, match="qkv is read-only"):
        f(ro, w, w, **kw)
    wide = np.ones((3, 2 * qkv.shape[1]), np.float32)
    with pytest.raises(ValueError, match="last axis must be contiguous"):
        f(wide[:, ::2], w, w, **kw)
    odd = np.ones((4, 3, qkv.shape[1]), np.float32)[:, :2]  # (4, 2) rows: strides 3W, W
    with pytest.raises(ValueError, match="do not merge into one axis of rows"):
        f(odd, w, w, **kw)
    assert f(qkv[:0], w, w, **kw).shape == (0, qkv.shape[1])


def test_bfloat16_is_ml_dtypes():
    qkv = np.ones((1, 4 * 16), BFLOAT16)
    w = np.ones(16, BFLOAT16)
    out = nk.qk_rms_normalization(qkv, w, w, num_q_heads=2, num_kv_heads=1, head_dim=16)
    assert out.dtype == BFLOAT16 and np.all(out.astype(np.float32) == 1)

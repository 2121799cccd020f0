"""LLM serving's row normalizations: Llama's rounding and Gemma's offset of
rms_normalization (and the skip operators' rounding), and vLLM's in-place
fused_add_rms_norm / fused_add_layer_norm, against float64 oracles written from
specs/llm-normalizations.md and against exact identities between the modes."""

import numpy as np
import pytest
from arrays import FLOAT_IDS, FLOATS, assert_identical
from oracle import assert_close, row_norm, row_tolerance, ulp

import normkernels as nk
from normkernels import reference
from normkernels.engine import policy
from normkernels.engine.numba_engine import ENGINE
from normkernels.ops import fused_add as fused_spec
from normkernels.ops import rms_normalization as rms_spec

F16, BF16, F32, F64 = FLOATS
EPS = 1e-6
# rows with vector bodies, scalar heads and tails (odd), one element, decode rows, 3-D
SHAPES = {"odd": (5, 37), "k1": (7, 1), "decode1": (1, 4096), "decode4": (4, 4096),
          "3d": (3, 5, 64), "short": (1, 7)}


def _data(rng, shape, dtype, offset=0.0):
    lead = (*shape[:-1], 1)
    x = (rng.standard_normal(shape) * rng.uniform(0.5, 2, lead) + offset).astype(dtype)
    w = (rng.uniform(0.5, 2, shape[-1]) * rng.choice([-1, 1], shape[-1])).astype(dtype)
    return x, w


def _mul_in(dtype, a, b):
    """``a * b`` as a product of dtype-typed operands computed by torch's rule (in
    float32 for 16-bit, exact there), rounded to dtype."""
    cd = F64 if dtype == F64 else F32
    return (a.astype(cd) * b.astype(cd)).astype(dtype)


def _rms_oracle(x, w, rounding, offset=0.0):
    """Y from the fact sheet in float64 with the mode's roundings, and a tolerance."""
    scale = w.astype(F64) + offset
    if rounding == "once" or x.dtype == F64:  # float64: rounding to T changes nothing
        y, mean, var = row_norm(x, scale, None, EPS, centered=False)
        tol = row_tolerance(x, scale, None, mean, var, EPS, F64 if x.dtype == F64 else F32,
                            centered=False)
        if x.dtype.itemsize == 2:
            tol = tol + 0.5 * ulp(np.abs(y) + tol, x.dtype)
        return y, tol
    xhat, mean, var = row_norm(x, np.ones(x.shape[-1]), None, EPS, centered=False)
    t = xhat.astype(x.dtype).astype(F64)  # the normalized value rounded to T
    y = t * scale
    # the kernel's xhat is within a few compute-dtype ulps: its rounding to T may take
    # the neighbour of t (one ulp of T, times |w|), then the product's half ulp
    tol = ulp(np.abs(t), x.dtype) * np.abs(scale) + 0.5 * ulp(np.abs(y), x.dtype)
    return y, tol


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("dtype", FLOATS, ids=FLOAT_IDS)
@pytest.mark.parametrize("rounding", ["once", "llama"])
def test_rms_rounding_matches_its_oracle(rng, rounding, dtype, shape):
    x, w = _data(rng, SHAPES[shape], dtype)
    got = nk.rms_normalization(x, w, epsilon=EPS, rounding=rounding)
    exact, tol = _rms_oracle(x, w, rounding)
    assert_close(got, exact, tol)


@pytest.mark.parametrize("path", ["serial", "parallel", "streaming"])
@pytest.mark.parametrize("dtype", FLOATS, ids=FLOAT_IDS)
def test_llama_is_the_rounded_unit_normalization_times_the_weight(rng, dtype, path):
    """Bit for bit: Llama's Y is the once-rounded normalization with unit weight (the
    normalized value rounded to T), multiplied by w in T's arithmetic: torch's
    ``w * x_hat.to(dtype)``. For 16-bit T a quarter of the values differ from "once".
    On each path: the serial one is the table-free row loop, the others the row
    kernels' vector bodies and scalar heads and tails (203: both)."""
    x, w = _data(rng, (6, 203), dtype, offset=3.0)
    unit = rms_spec.rms_normalization(x, np.ones_like(w), epsilon=EPS, engine=ENGINE, path=path)
    llama = rms_spec.rms_normalization(x, w, epsilon=EPS, rounding="llama", engine=ENGINE,
                                       path=path)
    assert_identical(llama, _mul_in(dtype, unit, w))
    once = nk.rms_normalization(x, w, epsilon=EPS)
    if dtype.itemsize == 2:
        assert 0.1 < np.mean(once != llama) < 0.5
    if dtype == F64:
        assert_identical(llama, once)


@pytest.mark.parametrize("dtype", FLOATS, ids=FLOAT_IDS)
def test_gemma_offset(rng, dtype):
    """``offset=1`` multiplies by ``1 + w``: with w whose ``1 + w`` is exact in T it is
    rms_normalization with scale ``1 + w``, bit for bit; against the float64 oracle for
    any w; w = 0 is the identity weight."""
    x, _ = _data(rng, (5, 133), dtype)
    w = (rng.integers(-48, 48, 133) / 64).astype(dtype)  # 1 + w exact in every dtype
    got = nk.rms_normalization(x, w, epsilon=EPS, offset=1.0)
    assert_identical(got, nk.rms_normalization(x, (1 + w.astype(F64)).astype(dtype),
                                               epsilon=EPS))
    w = (rng.standard_normal(133) * 0.1).astype(dtype)
    got = nk.rms_normalization(x, w, epsilon=EPS, offset=1.0)
    exact, tol = _rms_oracle(x, w, "once", offset=1.0)
    # 1 + w rounded to float32 first (Gemma's float32 arithmetic)
    assert_close(got, exact, tol + 2.0**-23 * np.abs(exact))
    zero = nk.rms_normalization(x, np.zeros_like(w), epsilon=EPS, offset=1.0)
    assert_identical(zero, nk.rms_normalization(x, np.ones_like(w), epsilon=EPS))


@pytest.mark.parametrize("dtype", [BF16, F32], ids=["bfloat16", "float32"])
def test_rounding_on_every_path(rng, monkeypatch, dtype):
    """Fused rows (serial, parallel, streaming) and split rows give the same bits with
    Llama's rounding and with an offset; the NumPy twin too."""
    monkeypatch.setattr(policy, "ASLEEP_SERIAL_FACTOR", 0)
    x, w = _data(rng, (24, 203), dtype)
    twin = reference.NumPyEngine()
    for kw in ({"rounding": "llama"}, {"offset": 1.0}, {"rounding": "llama", "offset": 1.0}):
        want = rms_spec.rms_normalization(x, w, epsilon=EPS, engine=ENGINE, path="serial", **kw)
        for path in ("parallel", "streaming"):
            got = rms_spec.rms_normalization(x, w, epsilon=EPS, engine=ENGINE, path=path, **kw)
            assert_identical(got, want)
        assert_identical(rms_spec.rms_normalization(x, w, epsilon=EPS, engine=twin, **kw), want)
    monkeypatch.setattr(policy, "SPLIT_ROWS_PER_THREAD", 1 << 20)
    long_x, long_w = _data(rng, (2, 70001), dtype)
    split = rms_spec.rms_normalization(long_x, long_w, epsilon=EPS, rounding="llama",
                                       engine=ENGINE, path="parallel")
    unit = rms_spec.rms_normalization(long_x, np.ones_like(long_w), epsilon=EPS, engine=ENGINE,
                                      path="parallel")
    assert_identical(split, _mul_in(dtype, unit, long_w))


def test_llama_on_the_general_path(rng):
    """Scale of another dtype than X (the general path, NumPy's products): Llama's
    rounding to X's dtype, then the product in the wide dtype, rounded to V."""
    x, w = _data(rng, (4, 50), BF16)
    w32 = w.astype(F32)
    got = nk.rms_normalization(x, w32, epsilon=EPS, rounding="llama")
    unit = nk.rms_normalization(x, np.ones_like(w), epsilon=EPS)
    assert got.dtype == F32
    assert_identical(got, unit.astype(F32) * w32)


def _fused_oracle(x, r, w, centered, bias=None):
    z = (x.astype(F64) + r.astype(F64)).astype(x.dtype)  # the correctly rounded sum
    return z


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("dtype", FLOATS, ids=FLOAT_IDS)
@pytest.mark.parametrize("rounding", ["llama", "once"])
def test_fused_add_rms_norm(rng, rounding, dtype, shape):
    """residual becomes the correctly rounded sum, x the normalization of that rounded
    sum (bit for bit rms_normalization of it, and within the oracle's bound), as
    skip_simplified_layer_normalization's outputs."""
    x, w = _data(rng, SHAPES[shape], dtype, offset=1.0)
    r = (rng.standard_normal(x.shape) * 3).astype(dtype)
    x0, r0 = x.copy(), r.copy()
    assert nk.fused_add_rms_norm(x, r, w, epsilon=EPS, rounding=rounding) is None
    z = _fused_oracle(x0, r0, w, False)
    assert_identical(r, z)
    assert_identical(x, nk.rms_normalization(z, w, epsilon=EPS, rounding=rounding))
    exact, tol = _rms_oracle(z, w, rounding)
    assert_close(x, exact, tol)
    out, _, _, sums = nk.skip_simplified_layer_normalization(x0, r0, w, epsilon=EPS,
                                                             num_outputs=4, rounding=rounding)
    assert_identical(x, out)
    assert_identical(r, sums)


@pytest.mark.parametrize("dtype", FLOATS, ids=FLOAT_IDS)
def test_fused_add_layer_norm(rng, dtype):
    x, w = _data(rng, (5, 37), dtype, offset=2.0)
    b = rng.standard_normal(37).astype(dtype)
    r = (rng.standard_normal(x.shape) * 3).astype(dtype)
    x0, r0 = x.copy(), r.copy()
    assert nk.fused_add_layer_norm(x, r, w, b, epsilon=EPS) is None
    z = _fused_oracle(x0, r0, w, True)
    assert_identical(r, z)
    assert_identical(x, nk.layer_normalization(z, w, b, epsilon=EPS))
    y, mean, var = row_norm(z, w, b, EPS)
    tol = row_tolerance(z, w, b, mean, var, EPS, F64 if dtype == F64 else F32)
    if dtype.itemsize == 2:
        tol = tol + 0.5 * ulp(np.abs(y) + tol, dtype)
    assert_close(x, y, tol)
    out, _, _, sums = nk.skip_layer_normalization(x0, r0, w, b, epsilon=EPS, num_outputs=4)
    assert_identical(x, out)
    assert_identical(r, sums)
    # no bias, Llama's rounding and an offset reach the kernel too
    x, r = x0.copy(), r0.copy()
    nk.fused_add_layer_norm(x, r, w, epsilon=EPS, rounding="llama", offset=1.0)
    unit = nk.layer_normalization(z, np.ones_like(w), epsilon=EPS)
    assert_identical(x, _mul_in(dtype, unit, (1 + w.astype(F32 if dtype != F64 else F64))))


@pytest.mark.parametrize("dtype", [BF16, F32], ids=["bfloat16", "float32"])
def test_fused_add_views_and_large_offsets(rng, dtype):
    """Rows that are a view of a wider buffer (written in place), a last axis with a
    stride (through a copy written back), a residual that is not contiguous, a mean of
    1e4 with std 1; nothing outside the views is touched."""
    big = (rng.standard_normal((6, 300)) + 1e4).astype(dtype)
    rbig = rng.standard_normal((6, 300)).astype(dtype)
    w = rng.uniform(0.5, 2, 100).astype(dtype)
    for xs, rs in ((np.s_[:, 10:110], np.s_[:, :100]), (np.s_[:, ::3], np.s_[:, 1::3]),
                   (np.s_[::2, :100], np.s_[1::2, 200:])):
        xb, rb = big.copy(), rbig.copy()
        x, r = xb[xs], rb[rs]
        x0, r0 = x.copy(), r.copy()
        nk.fused_add_rms_norm(x, r, w, epsilon=EPS)
        z = _fused_oracle(x0, r0, w, False)
        assert_identical(np.ascontiguousarray(r), z)
        assert_identical(np.ascontiguousarray(x),
                         nk.rms_normalization(z, w, epsilon=EPS, rounding="llama"))
        xb[xs], rb[rs] = x0, r0  # everything else unchanged
        assert_identical(xb, big)
        assert_identical(rb, rbig)


@pytest.mark.parametrize("dtype", [F16, BF16, F32], ids=["float16", "bfloat16", "float32"])
def test_fused_add_paths_and_twin(rng, monkeypatch, dtype):
    monkeypatch.setattr(policy, "ASLEEP_SERIAL_FACTOR", 0)
    x0, w = _data(rng, (33, 257), dtype)
    r0 = rng.standard_normal(x0.shape).astype(dtype)
    engines = [(ENGINE, p) for p in ("serial", "parallel", "streaming")]
    for kw in ({}, {"offset": 1.0, "rounding": "once"}, {"offset": 1.0}):
        results = []
        for engine, path in [*engines, (reference.NumPyEngine(), None), (ENGINE, None)]:
            x, r = x0.copy(), r0.copy()
            fused_spec.fused_add_rms_norm(x, r, w, epsilon=EPS, engine=engine, path=path, **kw)
            results.append((x, r))
        for x, r in results[1:]:
            assert_identical(x, results[0][0])
            assert_identical(r, results[0][1])


def test_fused_add_hostile_values(rng):
    """A row whose sum is 0 gives zeros; inf and NaN stay in their rows."""
    x = rng.standard_normal((3, 64)).astype(F32)
    r = rng.standard_normal((3, 64)).astype(F32)
    r[0] = -x[0]
    x[1, 5] = np.inf
    x[2, 7] = np.nan
    w = np.ones(64, F32)
    nk.fused_add_rms_norm(x, r, w, epsilon=EPS)
    assert np.array_equal(r[0], np.zeros(64)) and np.array_equal(x[0], np.zeros(64))
    assert np.isnan(x[1]).any() or not np.isfinite(x[1]).all()
    assert np.isnan(x[2]).all()


def test_fused_add_errors(rng):
    x = rng.standard_normal((2, 8)).astype(F32)
    r = rng.standard_normal((2, 8)).astype(F32)
    w = np.ones(8, F32)
    with pytest.raises(ValueError, match="residual must have x's shape"):
        nk.fused_add_rms_norm(x, r[:1], w)
    with pytest.raises(TypeError, match="share type T"):
        nk.fused_add_rms_norm(x, r.astype(F64), w)
    with pytest.raises(ValueError, match=r"weight must have shape \(8,\)"):
        nk.fused_add_rms_norm(x, r, np.ones(7, F32))
    ro = r.copy()
    ro.flags.writeable = False
    with pytest.raises(ValueError, match="residual is read-only"):
        nk.fused_add_rms_norm(x, ro, w)
    with pytest.raises(ValueError, match="share memory"):
        nk.fused_add_rms_norm(x, x, w)
    with pytest.raises(ValueError, match="rounding must be one of"):
        nk.fused_add_rms_norm(x, r, w, rounding="gemma")
    with pytest.raises(TypeError, match=r"x must be a numpy\.ndarray"):
        nk.fused_add_rms_norm(x.tolist(), r, w)
    with pytest.raises(TypeError, match="offset must be a float"):
        nk.fused_add_rms_norm(x, r, w, offset="1")
    with pytest.raises(ValueError, match="weight shares memory with x"):
        buf = np.ones((3, 8), F32)
        nk.fused_add_rms_norm(buf[:2], r, buf[0])
    with pytest.raises(ValueError, match="rounding must be one of"):
        nk.rms_normalization(x, w, rounding=None)
    with pytest.raises(ValueError, match="offset must be finite"):
        nk.rms_normalization(x, w, offset=np.inf)
    assert np.array_equal(x, x.copy())  # nothing raised half-way wrote x


def test_fused_add_bound_and_planned_calls(rng):
    """bind and the plan of a repeated call (the same buffers, then others of the same
    metadata) give the plain call's bits from the arrays' current contents; a planned
    call whose arrays overlap or are read-only gets the full checks' errors."""
    x0, w = _data(rng, (4, 4096), BF16)
    r0 = rng.standard_normal(x0.shape).astype(BF16)
    want_x, want_r = x0.copy(), r0.copy()
    fused_spec.fused_add_rms_norm(want_x, want_r, w, epsilon=EPS, engine=reference.NumPyEngine())
    x, r = x0.copy(), r0.copy()
    bound = nk.bind(nk.fused_add_rms_norm, x, r, w, epsilon=EPS)
    x[...], r[...] = x0, r0  # binding ran the call once: start again
    assert bound() is None
    assert_identical(x, want_x)
    assert_identical(r, want_r)
    for _ in range(5):  # planned, then bound by the plan's reuse
        x, r = x0.copy(), r0.copy()
        nk.fused_add_rms_norm(x, r, w, epsilon=EPS)
        assert_identical(x, want_x)
        assert_identical(r, want_r)
    same_x, same_r = x0.copy(), r0.copy()
    for _ in range(4):
        same_x[...], same_r[...] = x0, r0
        nk.fused_add_rms_norm(same_x, same_r, w, epsilon=EPS)
        assert_identical(same_x, want_x)
    buf = np.empty((8, 4096), BF16)
    with pytest.raises(ValueError, match="share memory"):
        nk.fused_add_rms_norm(buf[:4], buf[:4].reshape(4, 4096), w, epsilon=EPS)
    same_r.flags.writeable = False
    with pytest.raises(ValueError, match="residual is read-only"):
        nk.fused_add_rms_norm(same_x, same_r, w, epsilon=EPS)
    with pytest.raises(ValueError, match="residual is read-only"):
        bound_ro = nk.bind(nk.fused_add_rms_norm, same_x, same_r, w, epsilon=EPS)
        bound_ro()

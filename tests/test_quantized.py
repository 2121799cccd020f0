"""Quantized-output normalizations (vLLM's fused rms_norm + quant kernels; fact sheet:
specs/llm-normalizations.md, "Quantized outputs") against an independent float64
oracle, the NumPy twin bit for bit, and the float8/int8 conversions exhaustively."""

import subprocess
import sys

import ml_dtypes
import numpy as np
import pytest
from arrays import assert_identical

from normkernels.engine.numba_engine import ENGINE
from normkernels.ops import quantized as spec
from normkernels.reference import ENGINE as NUMPY_ENGINE
from normkernels.reference import quantized as twin

BF16 = np.dtype(ml_dtypes.bfloat16)
F16, F32, F64 = np.dtype(np.float16), np.dtype(np.float32), np.dtype(np.float64)
XDTYPES = (F16, BF16, F32, F64)
FP8 = np.dtype(ml_dtypes.float8_e4m3fn)
INT8 = np.dtype(np.int8)
QMAX = {INT8: 127.0, FP8: 448.0}
FLOOR = {INT8: float(np.finfo(np.float32).eps), FP8: 1.0 / (448 * 512)}  # the fact sheet
# docs/guide/numerics.md, "Guarantees": relative accuracy of the kernels' float64 statistics
STAT_ERR = {F16: 1e-6, BF16: 1e-6, F32: 1e-12, F64: 1e-12}
U32 = 2.0**-24


def dname(d):
    return np.dtype(d).name


# --- the oracle (float64, from the fact sheet) --------------------------------------

# every finite float8_e4m3fn value, ascending, and its bits
_ALL = np.arange(256, dtype=np.uint8).view(FP8).astype(np.float64)
_FINITE = np.isfinite(_ALL) & ~((np.arange(256) >= 128) & (_ALL == 0))  # -0 dropped
E4M3 = np.unique(_ALL[_FINITE])
E4M3_BITS = np.array([np.float64(v).astype(FP8).view(np.uint8) for v in E4M3])


def fp8_nearest_even(v):
    """float8_e4m3fn values nearest to float64 ``v`` after saturation to +-448, ties to
    the even significand; NaN stays NaN (the oracle's quantizer, from the value table)."""
    v = np.clip(np.asarray(v, np.float64), -448.0, 448.0)
    hi = np.clip(np.searchsorted(E4M3, v), 1, E4M3.size - 1)
    lo = hi - 1
    dlo, dhi = v - E4M3[lo], E4M3[hi] - v
    pick_hi = (dhi < dlo) | ((dhi == dlo) & (E4M3_BITS[hi] % 2 == 0))
    out = np.where(pick_hi, E4M3[hi], E4M3[lo])
    out = np.where(v == 0, v, out)  # keeps the sign of zero
    out = np.where((out == 0) & (v < 0), -0.0, out)
    return np.where(np.isnan(v), np.nan, out)


def int8_nearest_even(v):
    return np.rint(np.clip(v, -128.0, 127.0))


def oracle(src, w, b, centered, eps, offset, qd, static, group, ub):
    """(quantized values as float64, float32 scales, quotients, |y| terms) of float64
    rows ``src`` (M x K): y from float64 statistics, the scale rounded to float32 (it is
    an output), q = quant(y / s)."""
    X = src.astype(np.float64)
    M, K = X.shape
    mean = X.mean(axis=1, keepdims=True) if centered else 0.0
    var = ((X - mean) ** 2).mean(axis=1, keepdims=True)
    xhat = (X - mean) / np.sqrt(var + eps)
    wt = offset + w.astype(np.float64)
    bt = 0.0 if b is None else b.astype(np.float64)
    y = xhat * wt + bt
    magnitude = np.abs(xhat * wt) + np.abs(bt)  # the size of y's terms
    g = y.reshape(M, K // group, group)
    if static is None:
        with np.errstate(invalid="ignore"):
            s = np.fmax.reduce(np.abs(g), axis=2, initial=0.0) / QMAX[qd]
        s = np.maximum(np.minimum(s, np.inf if ub is None else ub), FLOOR[qd])
        s = s.astype(np.float32)
    else:
        s = np.full((M, K // group), np.float32(static))
    with np.errstate(all="ignore"):
        v = (g / s.astype(np.float64)[:, :, None]).reshape(M, K)
    q = fp8_nearest_even(v) if qd == FP8 else int8_nearest_even(v)
    return q, s, v, magnitude.reshape(M, K) / np.repeat(s.astype(np.float64), group, axis=1)


def neighbours(a, b, qd):
    """``a`` and ``b`` are one quantization step apart."""
    if qd == INT8:
        return np.abs(a - b) == 1
    ia, ib = np.searchsorted(E4M3, a), np.searchsorted(E4M3, b)
    return np.abs(ia - ib) == 1


def assert_quantized(got, want, v, terms, qd, xd, what="q"):
    """``got == want`` except one step apart where the oracle's quotient ``v`` is within
    the arithmetic's error (float32 y and scales, float64 statistics) of the midpoint
    between them; those are counted and bounded."""
    got = got.astype(np.float64).reshape(want.shape)
    same = (got == want) | (np.isnan(got) & np.isnan(want))
    if qd == FP8:  # int8 has no negative zero
        same &= np.signbit(got) == np.signbit(want)
    if same.all():
        return 0
    rel = (2 if xd == F64 else 10) * U32 + 2 * STAT_ERR[xd]
    tol = rel * (np.abs(v) + terms)
    mid = (got + want) / 2
    off = ~same
    ok = neighbours(got[off], want[off], qd) & (np.abs(v[off] - mid[off]) <= tol[off])
    bad = np.flatnonzero(off)[~ok]
    assert bad.size == 0, (f"{what}: {bad.size} values differ beyond a boundary case, e.g. "
                           f"got {got.flat[bad[:5]]}, want {want.flat[bad[:5]]}, "
                           f"v {v.flat[bad[:5]]}")
    count = int(off.sum())
    assert count <= 2 + 0.002 * got.size, f"{what}: {count} boundary cases of {got.size}"
    return count


def assert_scales(got, want, xd):
    """Dynamic scales within a couple of float32 ulps (plus the statistics' error): max|y|
    in float32 is off by up to two ulps (its roundings), then s is rounded (one more);
    for float64 x only that last rounding."""
    ulps = 1 if xd == F64 else 3
    ulp = np.spacing(want.astype(np.float32)).astype(np.float64)
    got, want = got.astype(np.float64).reshape(want.shape), want.astype(np.float64)
    tol = ulps * ulp + STAT_ERR[xd] * want
    err = np.abs(got - want)
    assert (err <= tol).all(), (err / ulp).max()


# --- data and calls -------------------------------------------------------------------


def data(rng, shape, xd, loc=0.5, spread=2.0):
    """Rows with their own mean and spread."""
    lead = shape[:-1]
    x = (rng.standard_normal(shape) * rng.uniform(0.5, spread, (*lead, 1))
         + rng.uniform(-loc, loc, (*lead, 1)))
    return x.astype(xd)


def params(rng, K, xd, bias=True):
    w = (1 + 0.3 * rng.standard_normal(K)).astype(xd)
    b = (0.2 * rng.standard_normal(K)).astype(xd) if bias else None
    return w, b


def call(op, x, w, b, engine=ENGINE, **kw):
    if op == "rms":
        return spec.quantized_rms_normalization(x, w, engine=engine, **kw)
    return spec.quantized_layer_normalization(x, w, b, engine=engine, **kw)


def residual_sum(x, r):
    cd = F64 if x.dtype == F64 else F32
    return (x.astype(cd) + r.astype(cd)).astype(x.dtype)


def check(op, x, w, b, qd, *, residual=None, path=None, eps=1e-6, static_scale=None,
          group_size=None, scale_ub=None, offset=0.0):
    """One call against the oracle and the twin; returns (q, scales)."""
    b = None if op == "rms" else b
    x_before = x.copy()
    kw = dict(dtype=qd, epsilon=eps, static_scale=static_scale, group_size=group_size,
              scale_ub=scale_ub, offset=offset)
    r_before = None if residual is None else residual.copy()
    q, scales = call(op, x, w, b, residual=residual, path=path, **kw)
    assert_identical(x, x_before)
    assert q.dtype == qd and q.shape == x.shape
    src = x
    if residual is not None:
        assert_identical(residual, residual_sum(x_before, r_before))
        src = residual
    K = x.shape[-1]
    M = x.size // K
    rows = np.ascontiguousarray(src).reshape(M, K)
    group = K if group_size is None else group_size
    want, s, v, terms = oracle(rows, w, b, op == "layer", eps, offset, qd, static_scale,
                               group, scale_ub)
    if static_scale is None:
        assert scales.dtype == np.float32 and scales.shape == (*x.shape[:-1], K // group)
        assert_scales(scales, s, x.dtype)
    else:
        assert scales.shape == () and scales == np.float32(static_scale)
    assert_quantized(q.reshape(M, K), want, v, terms, qd, x.dtype)
    # the twin, given the kernel's statistics: the same bits
    q2 = np.empty((M, K), np.uint8)
    s2 = np.empty((M, K // group), np.float32)
    mean, var, _ = ENGINE.quantized_rows(rows, w, b, None, q2, s2, eps, op == "layer", offset,
                                         qd == FP8, static_scale, group, scale_ub, FLOOR[qd],
                                         path)
    assert_identical(q2, q.reshape(M, K).view(np.uint8))
    q3, s3 = np.empty_like(q2), np.empty_like(s2)
    twin.quantize_rows_from(rows, w, b, q3, s3, eps, op == "layer", offset, qd == FP8,
                            static_scale, group, scale_ub, FLOOR[qd], mean, var)
    assert_identical(q3, q2)
    if static_scale is None:
        assert_identical(s3, scales.reshape(M, -1))
        assert_identical(s2, s3)
    return q, scales


# --- the conversions, exhaustively ----------------------------------------------------


def _converter():
    from numba import njit

    from normkernels.kernels import quantize

    @njit
    def convert(v, out):
        for i in range(v.size):
            out[i] = quantize.fp8_bits(v[i])

    @njit
    def to_int8(v, out):
        for i in range(v.size):
            out[i] = quantize.int8_round(v[i])

    return convert, to_int8


def fp8_probes(dtype):
    """Every e4m3 value, the midpoints between neighbours, each +-1 and +-2 ulps of
    ``dtype``, both signs; beyond 448, infinities, NaN, zeros, the subnormal range."""
    base = np.concatenate([E4M3, (E4M3[1:] + E4M3[:-1]) / 2, [464.0, 480.0, 500.0, 1e30,
                                                             2.0**-10, 2.0**-11, 2.0**-12]])
    base = base.astype(dtype)
    probes = [base]
    for direction in (np.inf, -np.inf):
        step = base
        for _ in range(2):
            step = np.nextafter(step, dtype.type(direction))
            probes.append(step)
    v = np.concatenate(probes)
    v = np.concatenate([v, -v, np.array([np.inf, -np.inf, np.nan, -np.nan, 0.0, -0.0], dtype)])
    return v[np.isfinite(v) | np.isinf(v) | np.isnan(v)]


@pytest.mark.parametrize("dtype", [F32, F64], ids=dname)
def test_fp8_conversion_is_correctly_rounded(dtype):
    convert, _ = _converter()
    v = fp8_probes(dtype)
    got = np.empty(v.size, np.uint8)
    convert(v, got)
    values = got.view(FP8).astype(np.float64)
    want = fp8_nearest_even(v.astype(np.float64))
    nan = np.isnan(v)
    assert np.isnan(values[nan]).all()
    assert_identical(got[nan] & 0x80, np.where(np.signbit(v[nan]), 0x80, 0).astype(np.uint8))
    assert_identical(values[~nan], want[~nan])  # signs of zero included
    if dtype == F32:  # ml_dtypes' own conversion of the saturated value
        ml = np.clip(v[~nan], -448, 448).astype(FP8).view(np.uint8)
        assert_identical(got[~nan], ml)
    assert_identical(twin.fp8_bits(v), got)  # the twin's bits
    assert v.size > 3000


def test_fp8_conversion_of_every_float32_near_small_values():
    """Every float32 in [0, 2**-5] every 2**-20 (the subnormal range and the first
    binades, many times over), against ml_dtypes."""
    convert, _ = _converter()
    v = np.arange(0, 2**15 + 1, dtype=np.float64) * 2.0**-20
    v = np.concatenate([v, -v]).astype(np.float32)
    got = np.empty(v.size, np.uint8)
    convert(v, got)
    assert_identical(got, v.astype(FP8).view(np.uint8))


@pytest.mark.parametrize("dtype", [F32, F64], ids=dname)
def test_int8_rounding_is_half_to_even_and_saturates(dtype):
    _, to_int8 = _converter()
    k = np.arange(-140, 141, dtype=np.float64)
    v = np.concatenate([k, k + 0.5, k - 0.5]).astype(dtype)
    v = np.concatenate([v, np.nextafter(v, dtype.type(np.inf)),
                        np.nextafter(v, dtype.type(-np.inf)), [1e30, -1e30, np.inf, -np.inf]])
    got = np.empty(v.size, np.int64)
    to_int8(v.astype(dtype), got)
    assert_identical(got, int8_nearest_even(v.astype(np.float64)).astype(np.int64))
    assert_identical(twin.int8_values(v.astype(dtype)).astype(np.int64), got)


# --- the operators against the oracle -------------------------------------------------

MODES = {  # name: keyword arguments (static scales chosen so that some values saturate)
    "static": lambda qd: dict(static_scale=0.02 if qd == INT8 else 0.008),
    "dynamic": lambda qd: {},
    "group": lambda qd: dict(group_size=128),
    "ub": lambda qd: dict(scale_ub=0.01 if qd == INT8 else 0.004),
}


@pytest.mark.parametrize("mode", list(MODES))
@pytest.mark.parametrize("op", ["rms", "layer"])
@pytest.mark.parametrize("qd", [INT8, FP8], ids=dname)
@pytest.mark.parametrize("xd", XDTYPES, ids=dname)
def test_against_the_oracle(xd, qd, op, mode):
    rng = np.random.default_rng(1)
    x = data(rng, (6, 512), xd)
    w, b = params(rng, 512, xd)
    check(op, x, w, b, qd, **MODES[mode](qd))


@pytest.mark.parametrize("shape,group", [((1, 4096), None), ((4, 4096), 128),
                                         ((3, 5, 64), 16), ((1, 7), None), ((5, 1023), 341),
                                         ((2, 65), 13), ((130, 24), 8), ((64,), None)],
                         ids=str)
@pytest.mark.parametrize("qd", [INT8, FP8], ids=dname)
@pytest.mark.parametrize("xd", [BF16, F32], ids=dname)
def test_shapes(xd, qd, shape, group):
    rng = np.random.default_rng(2)
    x = data(rng, shape, xd)
    w, b = params(rng, shape[-1], xd)
    for op in ("rms", "layer"):
        check(op, x, w, b, qd, group_size=group)
        check(op, x, w, b, qd, static_scale=0.03)


@pytest.mark.parametrize("op", ["rms", "layer"])
@pytest.mark.parametrize("qd", [INT8, FP8], ids=dname)
@pytest.mark.parametrize("xd", XDTYPES, ids=dname)
def test_residual_is_added_in_place_first(xd, qd, op):
    rng = np.random.default_rng(3)
    x = data(rng, (5, 256), xd)
    res = data(rng, (5, 256), xd, loc=2.0)
    w, b = params(rng, 256, xd)
    before = res.copy()
    check(op, x, w, b, qd, residual=res, group_size=64)
    assert not np.array_equal(res.view(np.uint8), before.view(np.uint8))
    res2 = before.copy()
    check(op, x, w, b, qd, residual=res2, static_scale=0.05)


@pytest.mark.parametrize("qd", [INT8, FP8], ids=dname)
def test_residual_views_are_updated(qd):
    """A residual whose rows the kernels cannot read in place (a copy is normalized and
    written back) and one they can (a row stride)."""
    rng = np.random.default_rng(4)
    x = data(rng, (4, 96), F32)
    w, b = params(rng, 96, F32)
    big = data(rng, (4, 192), F32)
    before = big.copy()
    check("rms", x, w, b, qd, residual=big[:, ::2])
    assert_identical(big[:, 1::2], before[:, 1::2])
    big2 = before.copy()
    check("layer", x, w, b, qd, residual=big2[:, 10:106])
    assert_identical(big2[:, :10], before[:, :10])
    assert_identical(big2[:, 106:], before[:, 106:])


@pytest.mark.parametrize("qd", [INT8, FP8], ids=dname)
@pytest.mark.parametrize("xd", XDTYPES, ids=dname)
def test_offset_one(xd, qd):
    rng = np.random.default_rng(5)
    x = data(rng, (3, 300), xd)
    w = (0.1 * rng.standard_normal(300)).astype(xd)
    for op in ("rms", "layer"):
        check(op, x, w, w, qd, offset=1.0)
        check(op, x, w, w, qd, offset=1.0, static_scale=0.02)


@pytest.mark.parametrize("qd", [INT8, FP8], ids=dname)
@pytest.mark.parametrize("xd", [F32, F64], ids=dname)
def test_large_offsets(xd, qd):
    """Rows of mean 1e4 and standard deviation 1 (the float32 fold keeps the mean's
    residual)."""
    rng = np.random.default_rng(6)
    x = (1e4 + rng.standard_normal((4, 1024))).astype(xd)
    w, b = params(rng, 1024, xd)
    check("layer", x, w, b, qd)
    check("layer", x, w, b, qd, group_size=256)
    check("rms", x, w, b, qd)


@pytest.mark.parametrize("qd", [INT8, FP8], ids=dname)
def test_strided_x(qd):
    rng = np.random.default_rng(7)
    big = data(rng, (6, 256), F16)
    w, b = params(rng, 128, F16)
    for x in (big[:, ::2], big[:, 64:192], big[::2, :128], big.T[:128].T):
        for op in ("rms", "layer"):
            check(op, x, w, b, qd)


@pytest.mark.parametrize("qd", [INT8, FP8], ids=dname)
@pytest.mark.parametrize("xd", [BF16, F32], ids=dname)
def test_serial_and_parallel_paths_give_the_same_bits(xd, qd):
    rng = np.random.default_rng(8)
    x = data(rng, (100, 1024), xd)
    w, b = params(rng, 1024, xd)
    for op in ("rms", "layer"):
        for kw in ({}, {"group_size": 128}, {"static_scale": 0.02}):
            serial = check(op, x, w, b, qd, path="serial", **kw)
            parallel = check(op, x, w, b, qd, path="parallel", **kw)
            for a, b_ in zip(serial, parallel, strict=True):
                assert_identical(a, b_)


@pytest.mark.parametrize("path", ["serial", "parallel"])
@pytest.mark.parametrize("xd", XDTYPES, ids=dname)
def test_every_value_is_the_rounded_quotient_of_the_kernels_own(xd, path):
    """Each quantized value is the correctly rounded value of the kernel's own quotient
    ``y / s`` (computed by the twin from the kernel's statistics)."""
    rng = np.random.default_rng(9)
    x = data(rng, (16, 384), xd)
    w, b = params(rng, 384, xd)
    rows = x.reshape(16, 384)
    for qd in (INT8, FP8):
        for op, static, group in (("rms", None, None), ("layer", None, 96),
                                  ("layer", 0.01, None)):
            bb = b if op == "layer" else None
            q, _ = call(op, x, w, bb, dtype=qd, static_scale=static, group_size=group,
                        path=path)
            q2 = np.empty((16, 384), np.uint8)
            s2 = np.empty((16, 384 // (group or 384)), np.float32)
            mean, var, _ = ENGINE.quantized_rows(rows, w, bb, None, q2, s2, 1e-6,
                                                 op == "layer", 0.0, qd == FP8, static,
                                                 group or 384, None, FLOOR[qd], path)
            v, _ = twin.quotients(rows, w, bb, 1e-6, op == "layer", 0.0, qd == FP8, static,
                                  group or 384, None, FLOOR[qd], mean, var)
            v = v.reshape(16, 384).astype(np.float64)  # exact: float32 widens exactly
            want = fp8_nearest_even(v) if qd == FP8 else int8_nearest_even(v) + 0.0
            assert_identical(q.astype(np.float64), want)


# --- hostile input --------------------------------------------------------------------


@pytest.mark.parametrize("path", ["serial", "parallel"])
@pytest.mark.parametrize("xd", XDTYPES, ids=dname)
def test_zero_rows_take_the_floor(xd, path):
    rng = np.random.default_rng(10)
    x = data(rng, (4, 64), xd)
    x[1] = 0
    w, _ = params(rng, 64, xd)
    for qd in (INT8, FP8):
        for op in ("rms", "layer"):
            q, s = check(op, x, w, None, qd, path=path, group_size=16)
            assert (s[1] == np.float32(FLOOR[qd])).all()
            assert (q[1].astype(np.float64) == 0).all()


@pytest.mark.parametrize("path", ["serial", "parallel"])
@pytest.mark.parametrize("xd", XDTYPES, ids=dname)
def test_nan_and_inf(xd, path):
    """float8: NaN stays in its row (NaN where y is NaN, scales from the other values);
    int8 raises ValueError naming x."""
    rng = np.random.default_rng(11)
    x = data(rng, (4, 64), xd)
    x[1, 3] = np.nan
    x[2, 5] = np.inf
    w, b = params(rng, 64, xd)
    for op in ("rms", "layer"):
        bb = b if op == "layer" else None
        q, s = call(op, x, w, bb, dtype=FP8, path=path)
        qv = q.astype(np.float64)
        assert np.isnan(qv[1]).all() and np.isfinite(qv[[0, 3]]).all()
        assert np.isnan(qv[2, 5])
        assert np.isfinite(s).all() and (s > 0).all()
        # rows 0 and 3 as without the bad rows
        q_ok, _ = call(op, x[[0, 3]], w, bb, dtype=FP8, path=path)
        assert_identical(q[[0, 3]].view(np.uint8), q_ok.view(np.uint8))
        rows = x.reshape(4, 64)
        q2, s2 = np.empty((4, 64), np.uint8), np.empty((4, 1), np.float32)
        mean, var, _ = ENGINE.quantized_rows(rows, w, bb, None, q2, s2, 1e-6, op == "layer",
                                             0.0, True, None, 64, None, FLOOR[FP8], path)
        q3, s3 = np.empty_like(q2), np.empty_like(s2)
        twin.quantize_rows_from(rows, w, bb, q3, s3, 1e-6, op == "layer", 0.0, True, None, 64,
                                None, FLOOR[FP8], mean, var)
        assert_identical(q3, q2)
        assert_identical(s3, s2)
        with pytest.raises(ValueError, match=r"x has NaN quotients"):
            call(op, x, w, bb, dtype=INT8, path=path)
        with pytest.raises(ValueError, match=r"x has NaN quotients"):
            call(op, x, w, bb, dtype=INT8, path=path, static_scale=0.1)


def test_the_numpy_twin_against_the_oracle():
    rng = np.random.default_rng(12)
    for xd in XDTYPES:
        x = data(rng, (4, 200), xd)
        w, b = params(rng, 200, xd)
        res = data(rng, (4, 200), xd)
        for qd in (INT8, FP8):
            for op in ("rms", "layer"):
                bb = b if op == "layer" else None
                r = res.copy()
                q, s = call(op, x, w, bb, engine=NUMPY_ENGINE, dtype=qd, group_size=50,
                            residual=r)
                assert_identical(r, residual_sum(x, res))
                want, s_o, v, terms = oracle(r.reshape(4, 200), w, bb, op == "layer", 1e-6,
                                             0.0, qd, None, 50, None)
                assert_scales(s, s_o, xd)
                assert_quantized(q.reshape(4, 200), want, v, terms, qd, xd)


def test_empty_rows():
    x = np.empty((0, 64), np.float32)
    q, s = spec.quantized_rms_normalization(x, np.ones(64, np.float32), dtype=INT8,
                                            engine=ENGINE)
    assert q.shape == (0, 64) and q.dtype == INT8 and s.shape == (0, 1)


# --- errors ---------------------------------------------------------------------------


def test_errors():
    import normkernels as nk

    x = np.ones((2, 8), np.float32)
    w = np.ones(8, np.float32)
    f = nk.quantized_rms_normalization
    g = nk.quantized_layer_normalization
    with pytest.raises(TypeError, match=r"dtype must be numpy\.int8 or ml_dtypes\.float8_e4m3fn"):
        f(x, w, dtype=np.float16)
    with pytest.raises(TypeError, match="dtype must be"):
        f(x, w, dtype="no such dtype")
    with pytest.raises(TypeError, match="x has dtype int32"):
        f(x.astype(np.int32), w, dtype=INT8)
    with pytest.raises(TypeError, match="weight must have x's dtype float32"):
        f(x, w.astype(np.float64), dtype=INT8)
    with pytest.raises(ValueError, match=r"weight must have shape \(hidden,\) = \(8,\)"):
        f(x, np.ones(7, np.float32), dtype=INT8)
    with pytest.raises(TypeError, match="bias must have x's dtype"):
        g(x, w, w.astype(np.float16), dtype=INT8)
    with pytest.raises(ValueError, match="bias must have shape"):
        g(x, w, np.ones((1, 8), np.float32), dtype=INT8)
    with pytest.raises(ValueError, match="rank >= 1"):
        f(np.float32(1), w, dtype=INT8)
    with pytest.raises(ValueError, match="rows of zero elements"):
        f(np.ones((2, 0), np.float32), np.ones(0, np.float32), dtype=INT8)
    for bad in (0.0, -1.0, np.inf, 1e-50, 1e-39, 1e40):
        with pytest.raises(ValueError, match="static_scale must be"):
            f(x, w, dtype=FP8, static_scale=bad)
    with pytest.raises(TypeError, match="static_scale must be a float"):
        f(x, w, dtype=FP8, static_scale="1")
    with pytest.raises(ValueError, match="scale_ub must be"):
        f(x, w, dtype=FP8, scale_ub=0.0)
    with pytest.raises(ValueError, match="scale_ub applies to dynamic scales only"):
        f(x, w, dtype=FP8, scale_ub=1.0, static_scale=1.0)
    with pytest.raises(ValueError, match="group_size applies to dynamic scales only"):
        f(x, w, dtype=FP8, group_size=4, static_scale=1.0)
    with pytest.raises(ValueError, match="group_size must be a positive divisor of hidden"):
        f(x, w, dtype=FP8, group_size=3)
    with pytest.raises(ValueError, match="group_size must be a positive divisor"):
        f(x, w, dtype=FP8, group_size=0)
    with pytest.raises(TypeError, match="group_size must be an int"):
        f(x, w, dtype=FP8, group_size=2.0)
    with pytest.raises(ValueError, match="epsilon must be >= 0"):
        f(x, w, dtype=FP8, epsilon=-1.0)
    with pytest.raises(ValueError, match="offset must be finite"):
        f(x, w, dtype=FP8, offset=np.nan)
    with pytest.raises(TypeError, match=r"residual must be a numpy\.ndarray"):
        f(x, w, dtype=FP8, residual=[[1.0] * 8] * 2)
    with pytest.raises(TypeError, match="residual must have x's dtype float32"):
        f(x, w, dtype=FP8, residual=np.ones((2, 8), np.float64))
    with pytest.raises(ValueError, match=r"residual must have x's shape \(2, 8\)"):
        f(x, w, dtype=FP8, residual=np.ones((2, 9), np.float32))
    ro = np.ones((2, 8), np.float32)
    ro.flags.writeable = False
    with pytest.raises(ValueError, match="residual is read-only"):
        f(x, w, dtype=FP8, residual=ro)
    big = np.ones((2, 16), np.float32)
    with pytest.raises(ValueError, match="residual shares memory with x"):
        f(big[:, :8], w, dtype=FP8, residual=big[:, 4:12])
    with pytest.raises(ValueError, match="residual shares memory with x"):
        f(x, w, dtype=FP8, residual=x)
    with pytest.raises(ValueError, match="path must be one of"):
        spec.quantized_rms_normalization(x, w, dtype=FP8, engine=ENGINE, path="fast")


def test_import_compiles_nothing():
    code = ("import normkernels; normkernels.quantized_rms_normalization\n"
            "from numba.core.dispatcher import Dispatcher\n"
            "from normkernels.kernels import quantize\n"
            "ks = [k for k in vars(quantize).values() if isinstance(k, Dispatcher)]\n"
            "assert len(ks) >= 4, ks\n"
            "print(sum(len(k.signatures) for k in ks))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True)
    assert out.stdout.strip() == "0"


@pytest.mark.parametrize("path", ["serial", "parallel"])
def test_infinite_y_and_scale(path):
    """y overflows float32 (a huge weight): the dynamic scale is infinite; float8 gives
    NaN where y is infinite (inf / inf) and zeros elsewhere, int8 raises."""
    rng = np.random.default_rng(13)
    x = data(rng, (3, 64), F32)
    w = np.full(64, 3e38, np.float32)
    w[::2] = 1.0
    q, s = call("rms", x, w, None, dtype=FP8, path=path)
    assert np.isinf(s).all()
    qv = q.astype(np.float64)
    y = x.astype(np.float64) / np.sqrt((x.astype(np.float64) ** 2).mean(1, keepdims=True))
    with np.errstate(over="ignore"):
        big = np.isinf((y * w).astype(np.float32))
    assert big.any() and np.isnan(qv[big]).all() and (qv[~big] == 0).all()
    with pytest.raises(ValueError, match=r"x has NaN quotients"):
        call("rms", x, w, None, dtype=INT8, path=path)
    q8, _ = call("rms", x, w, None, dtype=INT8, path=path, scale_ub=1e30)
    assert (q8.astype(np.int64)[big] * np.sign(y[big]) >= 127).all()

"""Row normalizations with quantized outputs: vLLM's fused ``rms_norm_*_quant``.

Per row ``r`` of ``K`` elements (flat storage arrays and row strides, as
:mod:`normkernels.kernels.rows`):

1. with a residual: ``res[r] = round_T(x[r] + res[r])`` (the sum in the compute dtype,
   rounded once to the storage dtype), and the row normalized is ``res[r]``;
2. float64 statistics (:func:`normkernels.kernels.rows.row_statistics`), folded into
   compute-dtype scalars ``m, a, c`` by the rule of
   :func:`normkernels.kernels.rows.fold_row` (here in the compute dtype: float32, or
   float64 for float64 X);
3. ``y = ((x - m) * a + c) * wt[k] + bt[k]`` in the compute dtype, kept in a per-row
   scratch (never rounded to X's dtype), with ``wt = offset + w`` and ``bt = b`` (or
   ``-0.0``: none), and ``max |y|`` per group of ``G`` columns;
4. per group the scale ``s``: the static one, or ``float32(max|y| / qmax)`` clamped
   above by ``scale_ub`` and below by ``floor``; then the quotient ``v`` in the
   compute dtype, ``y * (1 / s)`` for int8 and ``y / s`` for float8 (vLLM's kernels:
   the inverted scale for int8, the division for float8 "to match FBGemm"), and
5. ``v`` quantized into ``q`` (uint8 storage): int8 rounds half to even and saturates
   to [-128, 127] (a NaN stored as 127; the groups holding one are counted in
   ``nans[r]``: the caller raises);
   float8_e4m3fn saturates to +-448 and rounds to nearest even from the bits
   (:func:`fp8_bits`), NaN stays NaN (``sign | 0x7f``).

y is kept in a per-row scratch between the maximum and the quotient: recomputing it
there from X (the same bits) was slower (512 x 4096 bfloat16 to int8 on one thread:
0.45 ns per element against 0.30; float8 0.56 against 0.40). A static scale takes the
same two passes (its maximum finds the NaNs of int8): one fused pass, y then its
quotient, was slower still for float8 (0.56 ns an element against 0.51).
"""

import math

import numpy as np
from numba import njit, prange, types
from numba.core.extending import intrinsic, overload

import normkernels.kernels.cache  # noqa: F401  (registers the cache locators before any @njit)
from normkernels.kernels.cache import serial_twin
from normkernels.kernels.elements import compute_empty, load, store
from normkernels.kernels.options import (
    HELPER_OPTIONS,
    INLINE_OPTIONS,
    KERNEL_OPTIONS,
    OVERLOAD_OPTIONS,
)
from normkernels.kernels.rows import row_statistics

INT8_MAX = 127.0
# the overloads below are compiled functions, not inlined into Numba's IR: inlined, the
# phi nodes of their selects tripped Numba's IR scope check (NumbaIRAssumptionWarning)
# on a cold cache; LLVM inlines them all the same (the loops stay vectorised)
FP8_MAX = 448.0


def _bitcast(source, target):
    def typer(typingctx, value):
        if value != source:
            return None

        def codegen(context, builder, sig, args):
            return builder.bitcast(args[0], context.get_value_type(target))

        return target(source), codegen

    return intrinsic(typer)


f32_bits = _bitcast(types.float32, types.uint32)
bits_f32 = _bitcast(types.uint32, types.float32)
f64_bits = _bitcast(types.float64, types.uint64)
bits_f64 = _bitcast(types.uint64, types.float64)


@njit(**KERNEL_OPTIONS)
def fp8_from_f32(v):
    """float8_e4m3fn bits of float32 ``v``: saturated to +-448 (infinities too), rounded
    to nearest even; NaN -> ``sign | 0x7f``. Normal results (>= 2**-6) round the 20
    dropped significand bits with ``0x7ffff + lsb`` and rebias the exponent (127 ->
    7); smaller ones come from the float add ``|v| + 2**14``, whose ulp is the e4m3
    subnormal step 2**-9. Both are computed and one selected (no branch: the loop
    vectorises)."""
    u = np.uint32(f32_bits(v))
    sign = np.uint32((u >> np.uint32(24)) & np.uint32(0x80))
    a = np.uint32(u & np.uint32(0x7FFFFFFF))
    nan = a > np.uint32(0x7F800000)
    a = min(a, np.uint32(0x43E00000))
    lsb = np.uint32((a >> np.uint32(20)) & np.uint32(1))
    normal = np.uint32(np.uint32((a + np.uint32(0x7FFFF) + lsb) >> np.uint32(20))
                       - np.uint32(120 << 3))
    tiny = np.uint32(np.uint32(f32_bits(bits_f32(a) + np.float32(16384.0)))
                     - np.uint32(0x46800000))
    r = normal if a >= np.uint32(0x3C800000) else tiny
    r = np.uint32(0x7F) if nan else r
    return np.uint8(sign | r)


@njit(**HELPER_OPTIONS)
def fp8_from_f64(v):
    """:func:`fp8_from_f32` for float64 ``v`` (49 dropped bits; the subnormal add
    ``|v| + 2**43``), one rounding from float64."""
    u = f64_bits(v)
    sign = np.uint64((u >> np.uint64(56)) & np.uint64(0x80))
    a = np.uint64(u & np.uint64(0x7FFFFFFFFFFFFFFF))
    nan = a > np.uint64(0x7FF0000000000000)
    a = min(a, np.uint64(0x407C000000000000))
    lsb = np.uint64((a >> np.uint64(49)) & np.uint64(1))
    normal = np.uint64(np.uint64((a + np.uint64((1 << 48) - 1) + lsb) >> np.uint64(49))
                       - np.uint64(1016 << 3))
    tiny = np.uint64(f64_bits(bits_f64(a) + 8796093022208.0) - np.uint64(1066 << 52))
    r = normal if a >= np.uint64(0x3F90000000000000) else tiny
    r = np.uint64(0x7F) if nan else r
    return np.uint8(sign | r)


def fp8_bits(v):
    """float8_e4m3fn bits of a float32 or float64 scalar; ``@njit`` code only."""
    raise NotImplementedError("fp8_bits is only callable from @njit code")


@overload(fp8_bits, jit_options=OVERLOAD_OPTIONS)
def _fp8_bits_impl(v):
    if v == types.float32:
        return lambda v: fp8_from_f32(v)
    if v == types.float64:
        return lambda v: fp8_from_f64(v)
    return None


def int8_round(v):
    """``v`` (float32 or float64) clipped to [-128, 127] (NaN -> 127) and rounded half
    to even, as an integer; ``@njit`` code only."""
    raise NotImplementedError("int8_round is only callable from @njit code")


@overload(int8_round, jit_options=OVERLOAD_OPTIONS)
def _int8_round_impl(v):
    if v not in (types.float32, types.float64):
        return None
    magic = 12582912.0 if v == types.float32 else 6755399441055744.0  # 1.5 * 2**(p - 1)
    cast = np.float32 if v == types.float32 else np.float64

    def impl(v):
        c = v if v < cast(INT8_MAX) else cast(INT8_MAX)
        c = c if c > cast(-128.0) else cast(-128.0)
        return np.int32((c + cast(magic)) - cast(magic))

    return impl


def abs_bits(v):
    """The bits of ``|v|`` (float32 -> uint32, float64 -> uint64): ordered as the
    magnitudes, NaNs above infinity; ``@njit`` code only."""
    raise NotImplementedError("abs_bits is only callable from @njit code")


@overload(abs_bits, inline="always", jit_options=OVERLOAD_OPTIONS)
def _abs_bits_impl(v):
    if v == types.float32:
        return lambda v: np.uint32(f32_bits(v) & np.uint32(0x7FFFFFFF))
    if v == types.float64:
        return lambda v: np.uint64(f64_bits(v) & np.uint64(0x7FFFFFFFFFFFFFFF))
    return None


def magnitude(bits, like):
    """The float of ``like``'s type whose bits are ``bits`` (``None`` when they are a
    NaN's); ``@njit`` code only."""
    raise NotImplementedError("magnitude is only callable from @njit code")


@overload(magnitude, inline="always", jit_options=OVERLOAD_OPTIONS)
def _magnitude_impl(bits, like):
    if like == types.float32:
        return lambda bits, like: bits_f32(np.uint32(bits))
    if like == types.float64:
        return lambda bits, like: bits_f64(np.uint64(bits))
    return None


@njit(**INLINE_OPTIONS)
def _add_residual(x, xo, res, ro, K):
    """``res[ro:ro+K] = round_T(x[xo:][:K] + res[ro:][:K])`` (slices from 0)."""
    xs, rs = x[xo:xo + K], res[ro:ro + K]
    for i in range(K):
        store(rs, i, load(xs, i) + load(rs, i))


@njit(**INLINE_OPTIONS)
def _abs_max(ys, lo, hi, zero):
    """``max |ys[lo:hi]|`` ignoring NaNs (a row with NaNs: the slow way)."""
    best = zero
    for i in range(lo, hi):
        t = abs(ys[i])
        best = t if t > best else best
    return best


@njit(**INLINE_OPTIONS)
def _row(x, xo, res, ro, K, G, epsilon, centered, w, off, b, fp8, static, scale_ub, floor, q,
         qo, scales, so, ys, f):
    """Row ``x[xo:]`` (after the residual add): ``(mean, var, nans)``, the float64
    statistics and the number of groups with a NaN quotient (int8)."""
    src, sr = x, xo
    if res.size:
        _add_residual(x, xo, res, ro, K)
        src, sr = res, ro
    mu, v = row_statistics(src, sr, K, centered)
    inv = 1.0 / math.sqrt(v + epsilon)  # the fold of rows.fold_row, in the compute dtype
    f[1] = inv
    f[0] = mu if centered else 0.0
    f[2] = -0.0
    if centered and f.itemsize == 4 and math.isfinite(f[0]):
        f[2] = -((mu - np.float64(f[0])) * inv)
    f[4] = 0.0
    qmax = FP8_MAX if fp8 else INT8_MAX
    count = 0
    # Per group of G columns: y = ((x - m) * a + c) * (off + w) + b (not centered: m = 0,
    # c = -0.0, no bias, so the same bits as x * a * (off + w), computed so) into the
    # scratch ys, and the largest bits of |y| (abs_bits: an integer maximum, which
    # vectorises without fast-math); then each group's scale and multiplier; then the
    # quotients. Three passes over the groups, so that the scalar work between a group's
    # maximum and its quotients (two float64 divisions, the clamps) overlaps across
    # groups. The loops are written here, indexing the row's arrays with unsigned
    # offsets (no wrap-around test: they vectorise), not in helpers nor on slices: an
    # inlined helper's array arguments, like a slice, cost atomic reference counts per
    # group (groups of 32: 1.9 ns an element against 0.35).
    ng = K // G
    xs, qs = src[sr:sr + K], q[qo:qo + K]
    m, a, c = f[0], f[1], f[2]
    for g in range(ng):
        top = abs_bits(f[4])  # f[4] is 0: zero in the bits' type
        if centered:
            for i in range(G):
                j = np.uint64(g * G + i)
                y = ((load(xs, j) - m) * a + c) * (off + load(w, j)) + load(b, j)
                ys[j] = y
                top = max(top, abs_bits(y))
        else:
            for i in range(G):
                j = np.uint64(g * G + i)
                y = (load(xs, j) * a) * (off + load(w, j))
                ys[j] = y
                top = max(top, abs_bits(y))
        f[5 + g] = magnitude(top, f[0])
    for g in range(ng):
        amax = f[5 + g]
        top_nan = amax != amax
        if top_nan:
            amax = _abs_max(ys, g * G, g * G + G, f[4])
        if static != 0.0:  # one group (the spec layer allows no group_size)
            s = static
        else:
            s = np.float32(np.float64(amax) / qmax)
            s = s if s < scale_ub else scale_ub
            s = s if s > floor else floor
            scales[so + g] = s
        # the multiplier: 1 / s for int8 (vLLM's inverted scale), s itself for float8
        # (a division: vLLM's "to match FBGemm")
        f[5 + ng + g] = np.float64(s) if fp8 else 1.0 / np.float64(s)
        # a NaN quotient: a NaN y, or inf * 0 (an infinite y and scale; the spec layer
        # keeps 1 / s finite): counted per group, without a test per element
        if not fp8:
            count += top_nan or math.isnan(amax * f[5 + ng + g])
    for g in range(ng):
        d = f[5 + ng + g]
        if fp8:
            for i in range(G):
                j = np.uint64(g * G + i)
                qs[j] = fp8_bits(ys[j] / d)
        else:
            for i in range(G):
                j = np.uint64(g * G + i)
                qs[j] = np.uint8(int8_round(ys[j] * d))
    return mu, v, count


@njit(**INLINE_OPTIONS)
def _tables(x, w, b, offset, K):
    """``wt = offset + w`` (offset rounded to the compute dtype first) and ``bt = b``
    (``-0.0`` when ``b`` is empty) in the compute dtype."""
    wt, bt = compute_empty(x, K), compute_empty(x, K)
    for k in range(K):
        wt[k] = offset
        wt[k] = wt[k] + load(w, k)
        bt[k] = load(b, k) if b.size else -0.0
    return wt, bt


@njit(**KERNEL_OPTIONS)
def prepare(x, w, b, offset, K):
    """:func:`_tables` for the parallel kernel, not inlined in it."""
    return _tables(x, w, b, offset, K)


@njit(**HELPER_OPTIONS)
def quantize_item(x, xr, res, rr, K, G, epsilon, centered, wt, bt, fp8, static, scale_ub,
                  floor, q, scales, mean, var, nans, first, last):
    """Rows ``first..last-1`` of :func:`quantize_rows`. The tables hold ``offset + w``
    already: the offset added here is ``-0.0``, which changes no bits."""
    ys = compute_empty(x, K)
    f = compute_empty(x, 5 + 2 * (K // G))
    f[0] = -0.0
    off = f[0]
    ng = K // G
    for r in range(first, last):
        mean[r], var[r], nans[r] = _row(
            x, r * xr, res, r * rr, K, G, epsilon, centered, wt, off, bt, fp8, static,
            scale_ub, floor, q, r * K, scales, r * ng if static == 0.0 else 0, ys, f)


@njit(parallel=True, **KERNEL_OPTIONS)
def quantize_rows(x, xr, res, rr, w, b, K, G, epsilon, centered, offset, fp8, static, scale_ub,
                  floor, q, scales, mean, var, nans, rows_per_item):
    """Every row (``M = mean.size``), items of ``rows_per_item`` rows in parallel.

    ``x``: storage, row ``r`` at ``r * xr``; ``res``: the residual (X's storage dtype,
    row ``r`` at ``r * rr``; empty: none), updated in place; ``w``, ``b``: ``K`` values
    of X's storage dtype (``b`` empty: none); ``offset`` added to ``w``; ``G`` the group
    size (a divisor of ``K``); ``fp8``: float8_e4m3fn (else int8); ``static``: the
    static scale (float32; 0: dynamic scales into ``scales[r * (K // G) + g]``);
    ``scale_ub``, ``floor``: the dynamic scale's clamps (float32); ``q``: contiguous
    ``M x K`` uint8; ``mean``, ``var``: the float64 statistics (var: the mean square
    when not ``centered``); ``nans``: per row, the groups with a NaN quotient (int8)."""
    M = mean.size
    wt, bt = prepare(x, w, b, offset, K)
    for item in prange((M + rows_per_item - 1) // rows_per_item):
        first = item * rows_per_item
        quantize_item(x, xr, res, rr, K, G, epsilon, centered, wt, bt, fp8, static, scale_ub,
                      floor, q, scales, mean, var, nans, first, min(M, first + rows_per_item))


quantize_rows_serial = serial_twin(quantize_rows, **KERNEL_OPTIONS)


@njit(**KERNEL_OPTIONS)
def quantize_rows_table_free(x, xr, res, rr, w, b, K, G, epsilon, centered, offset, fp8, static,
                             scale_ub, floor, q, scales, mean, var):
    """:func:`quantize_rows` of a few rows (``M = q.size // K``) on one thread, without
    the column tables: ``offset + w`` and ``b`` are read from the storage arrays for
    every row (the same bits: the tables hold those values). At a decode step, one row
    of 4096, building the tables cost more than the row. ``b`` is read only when
    ``centered``: there the caller passes ``K`` values of ``-0.0`` for no bias (which
    adds nothing). Returns the number of groups with a NaN quotient (int8); the
    statistics go to ``mean`` and ``var`` unless they are empty (a plan's call, which
    does not return them)."""
    ys = compute_empty(x, K)
    f = compute_empty(x, 5 + 2 * (K // G))
    ng = K // G
    count = 0
    for r in range(q.size // K):
        mu, v, nans = _row(x, r * xr, res, r * rr, K, G, epsilon, centered, w, offset, b,
                           fp8, static, scale_ub, floor, q, r * K, scales,
                           r * ng if static == 0.0 else 0, ys, f)
        count += nans
        if mean.size:
            mean[r], var[r] = mu, v
    return count

"""LpNormalization: ``y = x / ||x||_p`` along one axis (p = 1 or 2).

X is seen as ``(outer, K, inner)`` C-contiguous storage, ``K`` the length of the
normalized axis. Norms are accumulated in float64 for every dtype, ``y`` is computed in
float64 and rounded once to X's dtype (:func:`store_rounded`; 16-bit outputs by
round-to-odd through float32, so the two roundings act as one).

Two shapes of loop:

* **rows** (``inner == 1``): the vectors are contiguous rows of ``K``. Work items are
  blocks of rows; each row is summed (one read, which leaves it in cache) then scaled.
* **columns** (``inner > 1``): the vectors are strided columns. A work item is a block
  of outer indices times a chunk of at most ``COLUMN_CHUNK`` columns: the ``K`` rows
  of the chunk are added into float64 per-column sums (vectorised across the columns;
  each column's sum runs in order of ``k``), the sums are folded, then the ``K`` rows
  are scaled while the chunk is still in cache.

Per vector (:func:`fold`): the norm ``r`` and a power-of-two prescale ``s`` (1 when
the float64 sum is in range), and ``y = (x * s) / r`` (float64 X) or ``(x * s) *
(1 / r)`` (narrower X: the extra float64 rounding is far below half an ulp of the
output). A float64 sum that overflowed or fell below ``TINY`` while the vector is
finite and nonzero is recomputed from the vector scaled by a power of two near
``1 / max|x|`` (as BLAS nrm2 and hypot do): [1e200, 1e200] gives 0.7071... and
subnormal vectors normalize to full precision. Only float64 X can get there (the
squares of float32 numbers lie within float64's range). A zero vector gives zeros
(``s = 0``: ``x * 0`` keeps the sign of each zero), a NaN gives NaN in its vector
only, and an infinite element gives the IEEE ``x / inf`` of the formula.
"""

import math

import numpy as np
from llvmlite import ir
from numba import njit, prange, types
from numba.core.extending import intrinsic, overload

import normkernels.kernels.cache  # noqa: F401  (registers the cache locators before any @njit)
from normkernels.kernels.cache import serial_twin
from normkernels.kernels.elements import load, store
from normkernels.kernels.lanes import absolute_sum, shifted_sums
from normkernels.kernels.options import (
    HELPER_OPTIONS,
    INLINE_OPTIONS,
    KERNEL_OPTIONS,
    OVERLOAD_OPTIONS,
    SHORT_ROW,
)

_INLINE = INLINE_OPTIONS
COLUMN_CHUNK = 512  # columns per work item of the columns loop (float64 sums: 4 KB)
TINY = 1e-290  # a float64 sum below this may have lost digits to underflow: rescale
HUGE = 1.7976931348623157e308  # float64's largest finite number
PRESCALE_LIMIT = 1000  # |log2| of the prescale: 2**1073 would overflow (subnormal max|x|)


# --- rounding float64 results once to the output's dtype ---


@intrinsic
def _f32_bits(typingctx, value):
    if value != types.float32:
        return None

    def codegen(context, builder, sig, args):
        return builder.bitcast(args[0], ir.IntType(32))

    return types.int32(types.float32), codegen


@intrinsic
def _bits_f32(typingctx, bits):
    if bits != types.int32:
        return None

    def codegen(context, builder, sig, args):
        return builder.bitcast(args[0], ir.FloatType())

    return types.float32(types.int32), codegen


@njit(**_INLINE)
def round_to_odd_f32(v):
    """float64 ``v`` rounded to float32 by round-to-odd: an inexact result gets the
    neighbour with an odd last bit. Rounding that to a format of at most 22 bits
    (float16: 11, bfloat16: 8) to nearest even is then the correct rounding of ``v``
    itself; plain float32 rounding first would round twice (``1 + 2**-8 + 2**-40``
    would become bfloat16 1, not 1 + 2**-7)."""
    f = np.float32(v)
    back = np.float64(f)
    bits = _f32_bits(f)
    step = np.int32(0)
    if back != v and v == v and (bits & 1) == 0:  # inexact (not NaN), even: the odd one
        step = np.int32(1) if abs(v) > abs(back) else np.int32(-1)  # magnitude bits
    return _bits_f32(np.int32(bits + step))


def store_rounded(arr, i, value):
    """Write float64 ``value`` into element ``i`` of a storage array, rounded once to
    nearest even (``@njit`` code only)."""
    raise NotImplementedError("store_rounded is only callable from @njit code")


@overload(store_rounded, inline="always", jit_options=OVERLOAD_OPTIONS)
def _store_rounded_impl(arr, i, value):
    if arr.dtype == types.float64:

        def impl(arr, i, value):
            arr[i] = value

        return impl
    if arr.dtype == types.float32:

        def impl(arr, i, value):
            arr[i] = np.float32(value)

        return impl
    if arr.dtype in (types.uint16, types.int16):

        def impl(arr, i, value):
            store(arr, i, round_to_odd_f32(value))

        return impl
    return None


def _quotient(arr, v, r, inv):
    raise NotImplementedError("_quotient is only callable from @njit code")


@overload(_quotient, inline="always", jit_options=OVERLOAD_OPTIONS)
def _quotient_impl(arr, v, r, inv):
    """``v / r`` for float64 storage (one rounding: float64 outputs), ``v * inv``
    (``inv = 1 / r``) for narrower storage, where the second float64 rounding is far
    below the output's half ulp and a product is cheaper than a division."""
    if arr.dtype == types.float64:
        return lambda arr, v, r, inv: v / r
    return lambda arr, v, r, inv: v * inv


# --- per vector: the sum, the fold, the scale ---


@njit(**HELPER_OPTIONS)
def _sum(x, o, n, p):
    """``sum |x|`` (p = 1) or ``sum x**2`` of ``x[o:o+n]`` in float64, in lanes
    (:mod:`normkernels.kernels.lanes`)."""
    xs = x[o:o + n]
    if p == 1:
        return absolute_sum(xs)
    return shifted_sums(xs, 0.0)[1]


@njit(**_INLINE)
def _short_sum(x, o, n, p):
    """:func:`_sum` for rows shorter than ``SHORT_ROW``, inlined: a call costs more
    than such a row."""
    total = 0.0
    if p == 1:
        for i in range(n):
            total += abs(np.float64(load(x, o + i)))
    else:
        for i in range(n):
            v = np.float64(load(x, o + i))
            total += v * v
    return total


@njit(**HELPER_OPTIONS)
def _rescaled(x, o, step, n, p, total):
    """``(s, r)`` of the vector ``x[o + k * step]`` (``k < n``) whose float64 sum
    ``total`` overflowed or is below ``TINY``: zero vector ``(0, 1)``; an infinite
    element ``(1, norm)`` (IEEE); else ``s`` the power of two taking max|x| near 1 and
    ``r`` the norm of ``x * s`` (exact products but where the output is itself near
    float64's subnormal range). Rare, so scalar and strided."""
    m = 0.0
    for k in range(n):
        a = abs(np.float64(load(x, o + k * step)))
        if a > m:
            m = a
    if m == 0.0:
        return 0.0, 1.0
    if m > HUGE:
        return 1.0, (math.sqrt(total) if p == 2 else total)
    e = math.frexp(m)[1]
    s = math.ldexp(1.0, min(PRESCALE_LIMIT, max(-PRESCALE_LIMIT, -e)))
    t = 0.0
    for k in range(n):
        v = np.float64(load(x, o + k * step)) * s
        t += abs(v) if p == 1 else v * v
    return s, (math.sqrt(t) if p == 2 else t)


@njit(**_INLINE)
def fold(x, o, step, n, p, total):
    """``(s, r)`` of a vector from its float64 sum: ``y = (x * s) / r``. A NaN sum
    fails both tests and gives NaN."""
    if total > HUGE or total < TINY:
        return _rescaled(x, o, step, n, p, total)
    return 1.0, (math.sqrt(total) if p == 2 else total)


@njit(**KERNEL_OPTIONS)
def _scale(x, y, o, n, s, r):
    """``y[o:o+n] = (x * s) / r`` (one slice each, indexed from 0: vectorised)."""
    xs, ys = x[o:o + n], y[o:o + n]
    inv = 1.0 / r
    for i in range(n):
        store_rounded(ys, i, _quotient(xs, np.float64(load(xs, i)) * s, r, inv))


@njit(**_INLINE)
def _short_scale(x, y, o, n, s, r):
    inv = 1.0 / r
    for i in range(n):
        store_rounded(y, o + i, _quotient(x, np.float64(load(x, o + i)) * s, r, inv))


# --- rows: inner == 1 ---


@njit(**_INLINE)
def _rows(x, y, K, p, first, last):
    """Rows ``first..last-1``: each is summed, which brings it into cache, then
    scaled from there."""
    if K < SHORT_ROW:
        for row in range(first, last):
            o = row * K
            s, r = fold(x, o, 1, K, p, _short_sum(x, o, K, p))
            _short_scale(x, y, o, K, s, r)
        return
    for row in range(first, last):
        o = row * K
        s, r = fold(x, o, 1, K, p, _sum(x, o, K, p))
        _scale(x, y, o, K, s, r)


@njit(parallel=True, **KERNEL_OPTIONS)
def rows_parallel(x, y, K, p, rows_per_item):
    """Every row of ``K`` (``x.size // K`` rows), items of ``rows_per_item`` rows in
    parallel; ``y`` may be ``x``."""
    M = x.size // K
    for item in prange((M + rows_per_item - 1) // rows_per_item):
        first = item * rows_per_item
        _rows(x, y, K, p, first, min(M, first + rows_per_item))


rows_serial = serial_twin(rows_parallel, **KERNEL_OPTIONS)


# --- columns: inner > 1 ---


@njit(**HELPER_OPTIONS)
def _add_row(x, o, w, p, acc):
    """``acc[j] += |x[o + j]|`` or ``x[o + j]**2``, ``j < w``: vectorised across the
    columns, so each column's sum is in order of the rows, without reassociation."""
    xs = x[o:o + w]
    if p == 1:
        for j in range(w):
            acc[j] += abs(np.float64(load(xs, j)))
    else:
        for j in range(w):
            v = np.float64(load(xs, j))
            acc[j] += v * v


@njit(**HELPER_OPTIONS)
def _scale_row(x, y, o, w, s, r, inv):
    """``y[o + j] = (x[o + j] * s[j]) / r[j]`` (``* inv[j]`` for narrow storage)."""
    xs, ys = x[o:o + w], y[o:o + w]
    for j in range(w):
        store_rounded(ys, j, _quotient(xs, np.float64(load(xs, j)) * s[j], r[j], inv[j]))


@njit(**HELPER_OPTIONS)
def _column_item(x, y, K, inner, first, last, c0, w, p):
    """Outer indices ``first..last-1``, columns ``c0..c0+w-1``: the float64 column
    sums over the ``K`` rows, their fold, then the scale of the same rows (still in
    cache). Its own function: scratch arrays made inside a parallel kernel's body
    would become parallel regions of their own (see ``_prepare`` in kernels/rows.py)."""
    acc, s, r, inv = np.empty(w), np.empty(w), np.empty(w), np.empty(w)
    for ob in range(first, last):
        base = ob * K * inner + c0
        for j in range(w):
            acc[j] = 0.0
        for k in range(K):
            _add_row(x, base + k * inner, w, p, acc)
        for j in range(w):
            s[j], r[j] = fold(x, base + j, inner, K, p, acc[j])
            inv[j] = 1.0 / r[j]
        for k in range(K):
            _scale_row(x, y, base + k * inner, w, s, r, inv)


@njit(parallel=True, **KERNEL_OPTIONS)
def columns_parallel(x, y, outer, K, inner, p, chunk, outer_per_item):
    """Every column vector of ``(outer, K, inner)`` storage; items of
    ``outer_per_item`` outer indices times ``chunk`` columns in parallel; ``y`` may
    be ``x``."""
    chunks = (inner + chunk - 1) // chunk
    blocks = (outer + outer_per_item - 1) // outer_per_item
    for item in prange(blocks * chunks):
        block, c = item // chunks, item % chunks
        first = block * outer_per_item
        c0 = c * chunk
        _column_item(x, y, K, inner, first, min(outer, first + outer_per_item), c0,
                     min(chunk, inner - c0), p)


columns_serial = serial_twin(columns_parallel, **KERNEL_OPTIONS)

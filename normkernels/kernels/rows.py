"""Row normalizations: statistics per row, parameters per column.

X is ``M`` rows of ``K`` elements. The kernels take flat storage arrays and row
strides (in elements: row ``r`` of ``x`` is ``x[r * xr : r * xr + K]``) and index
them with offsets, never slices: a slice per row costs reference counting, which
made a row of 4 elements cost 120 ns. Per row the kernels compute float64
statistics, fold them into row scalars ``m, a, c`` and write

    ``y = act(((x - m) * a + c) * s[k] + b[k] + res)``

with column tables ``s`` (scale) and ``b`` (bias), a residual ``res`` (None: none)
and an activation ``act`` (``activations.NONE``: none), the last three arguments of
every kernel being ``rr, res, act`` (row ``r`` of ``res`` at ``r * rr``). The fold's
rule is :func:`normkernels.reference.fold_rows` (``c``: the mean's residual where
``m`` is rounded; ``m = 0``, ``c = -0.0`` uncentred); the arithmetic, float32 lanes
for float32 rows on FMA targets included, is :mod:`normkernels.kernels.row_vectors`.

Statistics of a row: chunks of ``PLANE_CHUNK`` elements (float64 sub-blocks of one
pass over deviations from a shift, as the per-channel statistics; or the sum of
squares), merged in order with Chan's formula.

Two shapes of work:

* **fused rows** (the usual case): work items are blocks of rows; each block (about
  ``BLOCK_ELEMENTS``) is reduced row by row, folded, and normalized while it is in
  L2, so X is read from memory once. With ``skip`` (onnxruntime's
  SkipLayerNormalization) the rows are first ``x + skip + bias``, written to ``sums``
  (the operator's fourth output) or to scratch rows, and normalized from there.
* **split rows** (fewer rows than threads): :func:`moment_partials` or
  :func:`square_partials` over (row, chunk) items, merged per row in order, then
  :func:`normalize_parallel` over (row, column run) items. The row is read twice.

A row's statistics are the same chunk results merged in the same order on both, so
the choice (which depends on the thread count) never changes a bit.
"""

import math

import numpy as np
from numba import njit, prange, types
from numba.core.extending import intrinsic, overload

import normkernels.kernels.cache  # noqa: F401  (registers the cache locators before any @njit)
from normkernels.kernels.activations import activate, with_residual
from normkernels.kernels.elements import (
    item_bytes,
    load,
    rounding,
    row_compute_empty,
    row_load,
    row_table_empty,
    store,
)
from normkernels.kernels.lanes import shifted_sums
from normkernels.kernels.options import (
    HELPER_OPTIONS,
    INLINE_OPTIONS,
    KERNEL_OPTIONS,
    OVERLOAD_OPTIONS,
    SHORT_ROW,
    VECTOR_BYTES,
)
from normkernels.kernels.row_vectors import (
    scalar_normalize_row,
    stream_row,
    streams,
    vector_row,
    well_scaled,
)
from normkernels.kernels.scale_shift import store_fence
from normkernels.kernels.statistics import (
    NARROW_RUN,
    PLANE_CHUNK,
    SUB_BLOCK,
    chan_merge,
    narrow_span,
    wide_span,
)

_INLINE = INLINE_OPTIONS
BLOCK_ELEMENTS = 1 << 15  # rows reduced, folded and normalized together (in L2)


@njit(**HELPER_OPTIONS)
def _wide_moments(xs):
    """(mean, M2) in float64, by the per-channel statistics' rule: sub-blocks of
    ``SUB_BLOCK`` in one pass over deviations from their first element (two passes
    where that cancels), merged in order: one read of the row (docs/design.md)."""
    n, mean, m2 = 0, 0.0, 0.0
    for lo in range(0, xs.size, SUB_BLOCK):
        hi = min(xs.size, lo + SUB_BLOCK)
        mean_b, m2_b = wide_span(xs[lo:hi])
        n, mean, m2 = chan_merge(n, mean, m2, hi - lo, mean_b, m2_b)
    return mean, m2


@njit(**HELPER_OPTIONS)
def _span_squares(xs):
    """``(ok, sum of squares)`` of 16-bit ``xs`` in float32 runs joined in float64;
    not ``ok`` when not finite (squares beyond float32's range too)."""
    total = 0.0
    for lo in range(0, xs.size, NARROW_RUN):
        total += np.float64(shifted_sums(xs[lo:min(xs.size, lo + NARROW_RUN)],
                                         np.float32(0.0))[1])
    return math.isfinite(total), total


def _narrow_squares(xs):
    """:func:`_span_squares` for 16-bit X, ``(False, 0)`` for other dtypes, chosen by
    type when a kernel compiles (as ``statistics._narrow_span``); ``@njit`` only."""
    raise NotImplementedError("_narrow_squares is only callable from @njit code")


@overload(_narrow_squares, jit_options=OVERLOAD_OPTIONS)
def _narrow_squares_impl(xs):
    if isinstance(xs, types.Array) and xs.dtype.bitwidth == 16:
        return lambda xs: _span_squares(xs)
    return lambda xs: (False, 0.0)


@njit(**HELPER_OPTIONS)
def _wide_squares(xs):
    return shifted_sums(xs, 0.0)[1]


# The reductions slice once per call and index the slice from 0: with ``x[o + i]``
# Numba wraps negative indices and LLVM did not vectorise (10x slower).


@njit(**HELPER_OPTIONS)
def chunk_moments(x, o, n):
    """(mean, M2) of ``x[o:o+n]``: float32 arithmetic (``statistics._span_narrow``:
    shifted sums in float32 runs joined in float64, float64 passes where they cancel or
    overflow) for 16-bit X (twice the elements per byte: the float64 passes made bfloat16 rows
    compute-bound, 65 us against 45 for 64 rows of 4096), float64 passes for float32
    and float64 X (float32 runs gained 5% there and cost the float64 accuracy) or
    where float32 overflows."""
    xs = x[o:o + n]
    ok, mean, q = narrow_span(xs)  # the other statistics' 16-bit path
    if ok:
        return mean, q
    return _wide_moments(xs)


@njit(**HELPER_OPTIONS)
def chunk_squares(x, o, n):
    """Sum of squares of ``x[o:o+n]``: float32 runs for 16-bit X (as
    :func:`chunk_moments`), else float64, or float64 where float32 overflows."""
    xs = x[o:o + n]
    ok, total = _narrow_squares(xs)
    if ok:
        return total
    return _wide_squares(xs)


@njit(**_INLINE)
def _short_statistics(x, o, K, centered):
    """(mean, var) of a row shorter than ``SHORT_ROW``: plain float64 passes, inlined
    (a call of :func:`chunk_moments` cost 15 ns, a row of 4 elements 2 ns inlined)."""
    if not centered:
        total = 0.0
        for i in range(K):
            v = np.float64(load(x, o + i))
            total += v * v
        return 0.0, total / K
    total = 0.0
    for i in range(K):
        total += np.float64(load(x, o + i))
    mu = total / K
    q = 0.0
    for i in range(K):
        d = np.float64(load(x, o + i)) - mu
        q += d * d
    return mu, q / K


@njit(**_INLINE)
def row_statistics(x, o, K, centered):
    """(mean, var) of row ``x[o:o+K]``: the population variance, or the mean square
    when not ``centered`` (mean 0); chunk by chunk, merged in order."""
    if K < SHORT_ROW:
        return _short_statistics(x, o, K, centered)
    if not centered:
        total = 0.0
        for lo in range(0, K, PLANE_CHUNK):
            total += chunk_squares(x, o + lo, min(K - lo, PLANE_CHUNK))
        return 0.0, total / K
    n, mu, q = 0, 0.0, 0.0
    for lo in range(0, K, PLANE_CHUNK):
        size = min(K - lo, PLANE_CHUNK)
        mean_k, m2_k = chunk_moments(x, o + lo, size)
        n, mu, q = chan_merge(n, mu, q, size, mean_k, m2_k)
    return mu, q / K


@njit(**_INLINE)
def fold_row(mean, var, epsilon, centered, m, a, c, r):
    """Entry ``r`` of the row scalars (rule: :func:`normkernels.reference.fold_rows`)."""
    inv = 1.0 / math.sqrt(var + epsilon)
    a[r] = inv
    if not centered:
        m[r] = 0.0
        c[r] = -0.0
        return
    m[r] = mean
    if m.itemsize == 8 or not math.isfinite(m[r]):
        c[r] = -0.0
    else:
        c[r] = -((mean - np.float64(m[r])) * inv)


def _activated(y, act, value):
    """``act`` of the row arithmetic's ``value`` for storage array ``y``: in float32 for
    float32 storage (the value rounded first, as the vectors round it), else in
    ``value``'s dtype; ``value`` itself without an activation; ``@njit`` only."""
    raise NotImplementedError("_activated is only callable from @njit code")


@overload(_activated, inline="always", jit_options=OVERLOAD_OPTIONS)
def _activated_impl(y, act, value):
    if act.kind == "none":
        return lambda y, act, value: value
    if y.dtype == types.float32:
        return lambda y, act, value: activate(act, np.float32(value))
    return lambda y, act, value: activate(act, value)


@intrinsic
def _normalized(typingctx, y, act, value):
    """The normalized ``value`` as the scale multiplies it: rounded to y's storage
    dtype first under ``act``'s "llama" rounding, else itself."""
    if act.rounding != "llama":
        return value(y, act, value), lambda context, builder, sig, args: args[2]
    found = rounding(y, value)
    if found is None:
        return None
    result, build = found
    return result(y, act, value), lambda context, builder, sig, args: build(context, builder,
                                                                            args[2])


def _scalar_run(x, xo, y, yo, n, m, a, c, s, b, j, ro, res, act):
    """``n`` elements one by one, as the vectors compute them; ``@njit`` only."""
    raise NotImplementedError("_scalar_run is only callable from @njit code")


@overload(_scalar_run, inline="always", jit_options=OVERLOAD_OPTIONS)
def _scalar_run_impl(x, xo, y, yo, n, m, a, c, s, b, j, ro, res, act):
    if y.dtype == types.float32:  # float32 lanes with FMA: the vectors' IR, one lane
        def run(x, xo, y, yo, n, m, a, c, s, b, j, ro, res, act):
            for i in range(n):
                scalar_normalize_row(x, xo + i, y, yo + i, m, a, c, s, b, j + i, ro + i, res,
                                     act)
        return run

    def run(x, xo, y, yo, n, m, a, c, s, b, j, ro, res, act):
        for i in range(n):
            v = _normalized(y, act, (row_load(x, xo + i) - m) * a + c) * s[j + i] + b[j + i]
            store(y, yo + i, _activated(y, act, with_residual(res, ro + i, v)))
    return run


@njit(**_INLINE)
def normalize_run(x, xo, y, yo, n, m, a, c, s, b, j, vector, ro, res, act):
    """``n`` elements of a row from ``x[xo]`` into ``y[yo]``, columns from ``j``, the
    residual (None: none) from ``res[ro]``, then ``act``: a scalar head to 64-byte
    alignment of ``y`` where ``vector`` streams (ordinary stores need none: unaligned
    ones cost less than a head of scalar activations), vectors, scalar tail."""
    size = item_bytes(y)  # a constant: y.itemsize is read at run time (a division per row)
    width = VECTOR_BYTES // size
    misalignment = (y.ctypes.data + yo * size) & (VECTOR_BYTES - 1) if streams(vector) else 0
    head = 0 if misalignment == 0 else min(n, (VECTOR_BYTES - misalignment) // size)
    body = head + (n - head) // width * width
    _scalar_run(x, xo, y, yo, head, m, a, c, s, b, j, ro, res, act)
    if well_scaled(y, m, a):  # the same loop twice: see row_vectors.well_scaled
        for i in range(head, body, width):
            vector(x, xo + i, y, yo + i, m, a, c, s, b, j + i, ro + i, res, act)
    else:
        for i in range(head, body, width):
            vector(x, xo + i, y, yo + i, m, a, c, s, b, j + i, ro + i, res, act)
    _scalar_run(x, xo + body, y, yo + body, n - body, m, a, c, s, b, j + body, ro + body, res,
                act)


@njit(**HELPER_OPTIONS)
def _add_row(x, xo, skip, so, bias, dest, do, K):
    """``dest[do:do+K] = x[xo:][:K] + skip[so:][:K] + bias``, rounded once. Slices
    indexed from 0 in a function of its own: with offsets the loop stayed scalar
    (SkipLayerNormalization of 8192 x 4096 took 4x LayerNormalization)."""
    xs, ss, ds = x[xo:xo + K], skip[so:so + K], dest[do:do + K]
    for i in range(K):
        store(ds, i, (row_load(xs, i) + row_load(ss, i)) + bias[i])


@njit(**_INLINE)
def _block(src, base, stride, y, yr, K, first, last, s, b, epsilon, centered, mean, var, m, a,
           c, vector, rr, res, act):
    """Rows ``first..last-1`` (in cache together; row ``r`` is ``src[base + r *
    stride:][:K]``, its residual ``res[r * rr:][:K]``): statistics of each row, the fold
    of them all, then normalize each row. Three loops, not one: the division and square
    root of the fold then pipeline across rows (a row of 4 elements: 15 ns against 83)."""
    for r in range(first, last):
        mean[r], var[r] = row_statistics(src, base + r * stride, K, centered)
    for r in range(first, last):
        fold_row(mean[r], var[r], epsilon, centered, m, a, c, r)
    for r in range(first, last):
        normalize_run(src, base + r * stride, y, r * yr, K, m[r], a[r], c[r], s, b, 0, vector,
                      r * rr, res, act)


@njit(**_INLINE)
def _rows(x, xr, y, yr, K, first, last, s, b, epsilon, centered, mean, var, m, a, c, skip,
          bias, sums, vector, rr, res, act):
    """Rows ``first..last-1``, fused, in blocks of about ``BLOCK_ELEMENTS``. With skip,
    each block's sums are written first (to ``sums``, or to scratch rows) and the
    block is normalized from them. ``skip`` None or empty means no skip: the serial
    kernels take None (a type of its own: the skip code is then not compiled, and a
    first call compiles less), the parallel ones an empty array (one compile serves
    both)."""
    per_block = max(1, BLOCK_ELEMENTS // K)
    if skip is None or skip.size == 0:
        for lo in range(first, last, per_block):
            _block(x, 0, xr, y, yr, K, lo, min(last, lo + per_block), s, b, epsilon, centered,
                   mean, var, m, a, c, vector, rr, res, act)
        return
    n_skip = skip.size // K
    dest = np.empty(min(per_block, last - first) * K, x.dtype) if sums.size == 0 else sums
    for lo in range(first, last, per_block):
        hi = min(last, lo + per_block)
        base = -lo * K if sums.size == 0 else 0  # scratch holds this block's rows only
        for r in range(lo, hi):
            _add_row(x, r * xr, skip, (r % n_skip) * K, bias, dest, base + r * K, K)
        _block(dest, base, K, y, yr, K, lo, hi, s, b, epsilon, centered, mean, var, m, a, c,
               vector, rr, res, act)


@njit(**_INLINE)
def column_table(x, p, K):
    """Parameters ``p`` (any storage dtype; empty: none) as ``K`` values per column in
    the table dtype (float64 for float64 X, else float32); none is ``-0.0``, which adds
    nothing (not even to a negative zero)."""
    t = row_table_empty(x, K)
    if p.size == 0:
        t[:] = -0.0
    else:
        for k in range(K):
            t[k] = load(p, k)
    return t


@njit(**_INLINE)
def _tables(x, K, scale, B, bias, M, skip):
    """The column tables (the bias table only with ``skip``) and room for the row
    scalars."""
    return (column_table(x, scale, K), column_table(x, B, K),
            column_table(x, bias, 0 if skip is None or skip.size == 0 else K),
            row_compute_empty(x, M), row_compute_empty(x, M), row_compute_empty(x, M))


@njit(**KERNEL_OPTIONS)
def _prepare(x, K, scale, B, bias, M, skip):
    """:func:`_tables` for the parallel kernels, not inlined there: inside a parallel
    kernel ``t[:] = -0.0`` became a parallel region of its own (120 us a call)."""
    return _tables(x, K, scale, B, bias, M, skip)


@njit(**_INLINE)
def _serial(x, xr, y, yr, K, scale, B, epsilon, centered, mean, var, skip, bias, sums, rr, res,
            act):
    M = mean.size
    s, b, bias_t, m, a, c = _tables(x, K, scale, B, bias, M, skip)
    _rows(x, xr, y, yr, K, 0, M, s, b, epsilon, centered, mean, var, m, a, c, skip, bias_t,
          sums, vector_row, rr, res, act)


# One-thread kernels, one per statistic (``centered`` a constant, so each compiles
# only its own statistics: a first call compiles one).


@njit(**KERNEL_OPTIONS)
def rows_serial(x, xr, y, yr, K, scale, B, epsilon, mean, var, skip, bias, sums, rr, res, act):
    """Every row fused, on one thread: statistics into ``mean[r], var[r]`` (float64),
    Y into ``y``. ``scale``, ``B`` and ``bias`` are ``K`` values (any storage dtype;
    ``B`` and ``bias`` empty: none); ``skip`` (contiguous rows of ``K``; row ``r`` adds
    skip row ``r % rows``) None means no skip; ``sums`` (contiguous ``M x K``) empty
    means the sums are not kept. The epilogue: ``res`` (X's dtype, row ``r`` at ``r *
    rr``; None: none) added to the affine result, then the activation ``act``
    (``activations.NONE``: none): ``y = act(affine + res)``."""
    _serial(x, xr, y, yr, K, scale, B, epsilon, True, mean, var, skip, bias, sums, rr, res, act)


@njit(**KERNEL_OPTIONS)
def rms_rows_serial(x, xr, y, yr, K, scale, B, epsilon, mean, var, skip, bias, sums, rr, res,
                    act):
    """:func:`rows_serial` with the mean square in ``var`` (uncentred: RMS)."""
    _serial(x, xr, y, yr, K, scale, B, epsilon, False, mean, var, skip, bias, sums, rr, res,
            act)


# The parallel kernels call the work of an item as a compiled function: inlined into
# the prange body, the same loops ran 1.5x slower (a block of 64 rows of 768 on one
# thread: 36 us against 24; docs/design.md).


@njit(**HELPER_OPTIONS)
def rows_item(x, xr, y, yr, K, first, last, s, b, epsilon, centered, mean, var, m, a, c, skip,
              bias, sums, rr, res, act):
    """Rows ``first..last-1`` of :func:`rows_parallel` (tables made by the caller)."""
    _rows(x, xr, y, yr, K, first, last, s, b, epsilon, centered, mean, var, m, a, c, skip,
          bias, sums, vector_row, rr, res, act)


@njit(**HELPER_OPTIONS)
def rows_item_streaming(x, xr, y, yr, K, first, last, s, b, epsilon, centered, mean, var, m,
                        a, c, skip, bias, sums, rr, res, act):
    """:func:`rows_item` with streaming stores (fenced)."""
    _rows(x, xr, y, yr, K, first, last, s, b, epsilon, centered, mean, var, m, a, c, skip,
          bias, sums, stream_row, rr, res, act)
    store_fence()


@njit(parallel=True, **KERNEL_OPTIONS)
def rows_parallel(x, xr, y, yr, K, scale, B, epsilon, centered, rows_per_item, mean, var, skip,
                  bias, sums, rr, res, act):
    """:func:`rows_serial`, items of ``rows_per_item`` rows in parallel."""
    M = mean.size
    s, b, bias_t, m, a, c = _prepare(x, K, scale, B, bias, M, skip)
    for item in prange((M + rows_per_item - 1) // rows_per_item):
        first = item * rows_per_item
        rows_item(x, xr, y, yr, K, first, min(M, first + rows_per_item), s, b, epsilon,
                  centered, mean, var, m, a, c, skip, bias_t, sums, rr, res, act)


@njit(parallel=True, **KERNEL_OPTIONS)
def rows_streaming(x, xr, y, yr, K, scale, B, epsilon, centered, rows_per_item, mean, var,
                   skip, bias, sums, rr, res, act):
    """:func:`rows_parallel` with streaming stores."""
    M = mean.size
    s, b, bias_t, m, a, c = _prepare(x, K, scale, B, bias, M, skip)
    for item in prange((M + rows_per_item - 1) // rows_per_item):
        first = item * rows_per_item
        rows_item_streaming(x, xr, y, yr, K, first, min(M, first + rows_per_item), s, b,
                            epsilon, centered, mean, var, m, a, c, skip, bias_t, sums, rr, res,
                            act)

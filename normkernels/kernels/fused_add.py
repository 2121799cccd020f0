"""Row normalizations without the row kernels' column tables: the in-place fused
residual add (vLLM's ``fused_add_rms_norm``, serial and parallel), and plain row
normalization of a few rows on one thread (:func:`plain_rows_serial`: RMSNorm of a
decode step's row).

Per row: ``r <- round_T(x + r)``; the row's statistics of the rounded sum by
:func:`normkernels.kernels.rows.row_statistics`, folded into ``m, a, c`` by
:func:`normkernels.kernels.rows.fold_row`; ``x <- round_T(n((r - m) * a + c) * w + b)``,
``n`` the rounding of the normalized value to T under Llama's rounding. That is the
row kernels' arithmetic, operation for operation, on the weight and bias read as they
go (a missing bias is -0.0, which adds nothing, as their empty table): the same bits.
What the loops skip is the tables: converting the weight to a compute-dtype table and
filling two -0.0 tables of ``K`` cost more than the normalization of a row of 4096
(about 2 us a row here, 15 us through the table kernels, on a shared VM).
"""

import numpy as np
from numba import njit, prange, types
from numba.core.extending import overload

import normkernels.kernels.cache  # noqa: F401  (registers the cache locators before any @njit)
from normkernels.kernels.elements import (
    load,
    round_to_storage,
    row_compute_empty,
    row_load,
    store,
)
from normkernels.kernels.options import (
    HELPER_OPTIONS,
    INLINE_OPTIONS,
    KERNEL_OPTIONS,
    OVERLOAD_OPTIONS,
)
from normkernels.kernels.row_vectors import float32_lanes, row_value32
from normkernels.kernels.rows import fold_row, row_statistics


def _param(x, p, i):
    """Parameter ``p[i]`` (any storage dtype) as the row kernels' column tables hold it
    (float64 for float64 x, else float32); ``@njit`` only."""
    raise NotImplementedError("_param is only callable from @njit code")


@overload(_param, inline="always", jit_options=OVERLOAD_OPTIONS)
def _param_impl(x, p, i):
    if x.dtype == types.float64:
        return lambda x, p, i: np.float64(load(p, i))
    return lambda x, p, i: np.float32(load(p, i))


def _value(xs, rs, i, m, a, c, w, B, llama):
    """Y of element ``i`` before its rounding to storage, as the row kernels compute it
    (:mod:`normkernels.kernels.row_vectors`); ``@njit`` only."""
    raise NotImplementedError("_value is only callable from @njit code")


@overload(_value, inline="always", jit_options=OVERLOAD_OPTIONS)
def _value_impl(xs, rs, i, m, a, c, w, B, llama):
    if float32_lanes(xs):  # float32 lanes: Llama's rounding is then no rounding
        def lanes(xs, rs, i, m, a, c, w, B, llama):
            b = _param(xs, B, i) if B.size else np.float32(-0.0)
            return row_value32(load(rs, i), m, a, _param(xs, w, i), b, llama)
        return lanes

    none = np.float64(-0.0) if xs.dtype == types.float64 else np.float32(-0.0)

    def value(xs, rs, i, m, a, c, w, B, llama):
        b = _param(xs, B, i) if B.size else none
        n = (row_load(rs, i) - m) * a + c
        if llama:
            n = round_to_storage(xs, n)
        return n * _param(xs, w, i) + b
    return value


@njit(**HELPER_OPTIONS)
def _add_row(x, xo, r, ro, K):
    # slices indexed from 0: LLVM vectorises the loop (with offsets it stayed scalar).
    # In float32 for float32 T (``load``), not the rows' float64: the correctly rounded
    # sum either way, twice the lanes
    xs, rs = x[xo:xo + K], r[ro:ro + K]
    for i in range(K):
        store(rs, i, load(xs, i) + load(rs, i))


@njit(**HELPER_OPTIONS)
def _normalize_row(x, xo, r, ro, K, w, B, m, a, c, llama):
    """Y of one row (a missing bias ``B`` is -0.0, which adds nothing)."""
    xs, rs = x[xo:xo + K], r[ro:ro + K]
    for i in range(K):
        store(xs, i, _value(xs, rs, i, m, a, c, w, B, llama))


@njit(**HELPER_OPTIONS)
def fused_add_item(x, xr, r, K, w, B, epsilon, centered, llama, mean, var, first, last):
    """Rows ``first..last-1`` of :func:`fused_add_rows_serial`, each added, reduced and
    normalized while it is in L1 (a row of 4096 float32: 16 KB)."""
    m, a, c = row_compute_empty(x, 1), row_compute_empty(x, 1), row_compute_empty(x, 1)
    for row in range(first, last):
        _add_row(x, row * xr, r, row * K, K)
        mean[row], var[row] = row_statistics(r, row * K, K, centered)
        fold_row(mean[row], var[row], epsilon, centered, m, a, c, 0)
        _normalize_row(x, row * xr, r, row * K, K, w, B, m[0], a[0], c[0], llama)


@njit(**KERNEL_OPTIONS)
def fused_add_rows_serial(x, xr, r, K, w, B, epsilon, centered, llama, mean, var):
    """Rows ``0..mean.size-1``: ``x`` row ``i`` at ``i * xr`` (read, then written with
    Y), ``r`` contiguous rows of ``K`` (written with the sums); ``w`` and ``B`` (empty:
    none) the parameters in any storage dtype (widened as the column tables widen
    them); float64 statistics into ``mean`` and ``var`` (the mean square when not
    ``centered``)."""
    fused_add_item(x, xr, r, K, w, B, epsilon, centered, llama, mean, var, 0, mean.size)


@njit(parallel=True, **KERNEL_OPTIONS)
def fused_add_rows_parallel(x, xr, r, K, w, B, epsilon, centered, llama, mean, var,
                            rows_per_item):
    """:func:`fused_add_rows_serial`, items of ``rows_per_item`` rows in parallel (each
    row's arithmetic is its own: the same bits). The table kernels' skip add writes the
    sums to another array than it reads: given the residual as both, LLVM's runtime
    alias check sent the add to its scalar loop (prefill 512 x 4096 float32: 2.7 ms
    against 0.5 ms for RMSNormalization of the same rows)."""
    M = mean.size
    for item in prange((M + rows_per_item - 1) // rows_per_item):
        first = item * rows_per_item
        fused_add_item(x, xr, r, K, w, B, epsilon, centered, llama, mean, var, first,
                       min(M, first + rows_per_item))


@njit(**INLINE_OPTIONS)
def _plain_rows(x, xr, y, yr, K, w, B, epsilon, centered, llama, mean, var):
    """Y of rows ``0..mean.size-1`` (x's row ``i`` at ``i * xr``, y's at ``i * yr``, y of
    x's dtype): the fused add's arithmetic without its add, so the row kernels' bits
    without their column tables, for a few rows where building the tables costs more
    than the rows (RMSNormalization of one row of 4096 at decode). Inlined with
    ``centered`` a constant: each kernel compiles one statistic (a first call with an
    empty cache compiled both, 0.7 s more)."""
    m, a, c = row_compute_empty(x, 1), row_compute_empty(x, 1), row_compute_empty(x, 1)
    for row in range(mean.size):
        mean[row], var[row] = row_statistics(x, row * xr, K, centered)
        fold_row(mean[row], var[row], epsilon, centered, m, a, c, 0)
        _normalize_row(y, row * yr, x, row * xr, K, w, B, m[0], a[0], c[0], llama)


@njit(**KERNEL_OPTIONS)
def plain_rows_serial(x, xr, y, yr, K, w, B, epsilon, llama, mean, var):
    """Layer normalization of a few rows (:func:`_plain_rows`)."""
    _plain_rows(x, xr, y, yr, K, w, B, epsilon, True, llama, mean, var)


@njit(**KERNEL_OPTIONS)
def plain_rms_rows_serial(x, xr, y, yr, K, w, B, epsilon, llama, mean, var):
    """RMS normalization of a few rows (:func:`_plain_rows`; ``var``: the mean square)."""
    _plain_rows(x, xr, y, yr, K, w, B, epsilon, False, llama, mean, var)

"""AdaLN's rows (:func:`normkernels.ada_layer_norm`): the row kernels' fused rows with
column tables per sample.

X is ``M`` C-contiguous rows of ``K`` in samples of ``T`` rows; sample ``n`` (rows ``n
* T`` to ``(n + 1) * T - 1``) is normalized (centred) with its own ``K`` values of the
``N * K`` tables ``scale`` (``1 + scale``) and ``B`` (the shift). Each sample's rows run
through :func:`normkernels.kernels.rows.rows_item` with its slice of the tables, so a
sample's bits are those of :func:`normkernels.kernels.rows.rows_serial` on that sample
with its tables, in one launch for the whole batch (``docs/design.md``, "AdaGroupNorm
and AdaLN backward").
"""

from numba import njit, prange

import normkernels.kernels.cache  # noqa: F401  (registers the cache locators before any @njit)
from normkernels.kernels.elements import row_compute_empty
from normkernels.kernels.options import KERNEL_OPTIONS
from normkernels.kernels.rows import column_table, rows_item, rows_item_streaming


@njit(**KERNEL_OPTIONS)
def _prepare(x, scale, B, M):
    """The tables and row scalars, made outside the parallel loop (inside it ``t[:] =
    v`` becomes a parallel region of its own: rows.py's ``_prepare``)."""
    return (column_table(x, scale, scale.size), column_table(x, B, B.size),
            row_compute_empty(x, M), row_compute_empty(x, M), row_compute_empty(x, M))


@njit(**KERNEL_OPTIONS)
def modulated_rows_serial(x, y, K, T, scale, B, epsilon, mean, var, act):
    """Every sample's rows on one thread (statistics into float64 ``mean``, ``var``;
    ``act``: the rows' marker, no activation)."""
    M = mean.size
    s, b, m, a, c = _prepare(x, scale, B, M)
    none = x[:0]  # no skip, no sums
    for n in range(M // T):
        rows_item(x, K, y, K, K, n * T, (n + 1) * T, s[n * K:(n + 1) * K],
                  b[n * K:(n + 1) * K], epsilon, True, mean, var, m, a, c, none, s[:0], none,
                  0, None, act)


@njit(parallel=True, **KERNEL_OPTIONS)
def modulated_rows_parallel(x, y, K, T, scale, B, epsilon, mean, var, rows_per_item,
                            streaming, act):
    """:func:`modulated_rows_serial`, items of at most ``rows_per_item`` rows of one
    sample in parallel (``streaming``: streaming stores)."""
    M = mean.size
    s, b, m, a, c = _prepare(x, scale, B, M)
    none = x[:0]
    per_sample = (T + rows_per_item - 1) // rows_per_item
    for item in prange((M // T) * per_sample):
        n = item // per_sample
        first = n * T + (item % per_sample) * rows_per_item
        last = min((n + 1) * T, first + rows_per_item)
        sn, bn = s[n * K:(n + 1) * K], b[n * K:(n + 1) * K]
        if streaming:
            rows_item_streaming(x, K, y, K, K, first, last, sn, bn, epsilon, True, mean, var,
                                m, a, c, none, s[:0], none, 0, None, act)
        else:
            rows_item(x, K, y, K, K, first, last, sn, bn, epsilon, True, mean, var, m, a, c,
                      none, s[:0], none, 0, None, act)

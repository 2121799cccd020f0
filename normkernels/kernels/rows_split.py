"""Row normalizations of fewer rows than threads (the split path of
:mod:`normkernels.kernels.rows`): the statistics of each (row, chunk of
``PLANE_CHUNK``) in parallel, merged per row in the order the fused kernels merge
them (so the same bits), then the normalize pass over (row, run of columns) items.
The row is read twice."""

from numba import njit, prange

import normkernels.kernels.cache  # noqa: F401  (registers the cache locators before any @njit)
from normkernels.kernels.cache import serial_twin
from normkernels.kernels.elements import row_compute_empty
from normkernels.kernels.options import HELPER_OPTIONS, INLINE_OPTIONS, KERNEL_OPTIONS
from normkernels.kernels.rows import (
    chunk_moments,
    chunk_squares,
    column_table,
    fold_row,
    normalize_run,
    stream_row,
    vector_row,
)
from normkernels.kernels.scale_shift import store_fence
from normkernels.kernels.statistics import PLANE_CHUNK, chan_merge

_INLINE = INLINE_OPTIONS


@njit(parallel=True, **KERNEL_OPTIONS)
def moment_partials(x, xr, K, part_mean, part_m2):
    """(mean, M2) of every (row, chunk of ``PLANE_CHUNK``): ``part_*[r, k]``."""
    chunks = part_mean.shape[1]
    for item in prange(part_mean.size):
        r = item // chunks
        k = item % chunks
        lo = k * PLANE_CHUNK
        part_mean[r, k], part_m2[r, k] = chunk_moments(x, r * xr + lo, min(K - lo, PLANE_CHUNK))


@njit(parallel=True, **KERNEL_OPTIONS)
def square_partials(x, xr, K, part):
    """Sum of squares of every (row, chunk of ``PLANE_CHUNK``): ``part[r, k]``."""
    chunks = part.shape[1]
    for item in prange(part.size):
        r = item // chunks
        k = item % chunks
        lo = k * PLANE_CHUNK
        part[r, k] = chunk_squares(x, r * xr + lo, min(K - lo, PLANE_CHUNK))


@njit(**KERNEL_OPTIONS)
def merge_partials(part_mean, part_m2, K, centered, mean, var):
    """Per-row ``(mean, var)`` from the chunk partials, merged in order as
    :func:`row_statistics` merges them (``part_mean`` unused when not centred)."""
    for r in range(mean.size):
        if centered:
            n, mu, q = 0, 0.0, 0.0
            for k in range(part_m2.shape[1]):
                size = min(K - k * PLANE_CHUNK, PLANE_CHUNK)
                n, mu, q = chan_merge(n, mu, q, size, part_mean[r, k], part_m2[r, k])
            mean[r], var[r] = mu, q / K
        else:
            total = 0.0
            for k in range(part_m2.shape[1]):
                total += part_m2[r, k]
            mean[r], var[r] = 0.0, total / K


@njit(**HELPER_OPTIONS)
def _fold_all(x, mean, var, epsilon, centered):
    m, a, c = row_compute_empty(x, mean.size), row_compute_empty(x, mean.size), \
        row_compute_empty(x, mean.size)
    for r in range(mean.size):
        fold_row(mean[r], var[r], epsilon, centered, m, a, c, r)
    return m, a, c


@njit(**_INLINE)
def _normalize_item(x, xr, y, yr, K, run, scale, B, m, a, c, item, runs, vector, rr, res, act):
    """Item ``item`` of the (row, run) items: its run of the row, with column tables
    of that run only, widened here (few long rows: tables of the whole row cost two
    more passes over memory the size of X, on one thread), and its epilogue."""
    r = item // runs
    lo = (item % runs) * run
    n = min(K - lo, run)
    s = column_table(x, scale[lo:lo + n], n)
    b = column_table(x, B[lo:lo + n] if B.size > 0 else B, n)
    normalize_run(x, r * xr + lo, y, r * yr + lo, n, m[r], a[r], c[r], s, b, 0, vector,
                  r * rr + lo, res, act)


@njit(parallel=True, **KERNEL_OPTIONS)
def normalize_parallel(x, xr, y, yr, K, run, scale, B, epsilon, centered, mean, var, rr, res,
                       act):
    """Y from the rows' statistics (folded here) over (row, ``run`` columns) items in
    parallel; the epilogue ``rr, res, act`` as :func:`normkernels.kernels.rows.rows_serial`'s."""
    m, a, c = _fold_all(x, mean, var, epsilon, centered)
    runs = (K + run - 1) // run
    for item in prange(m.size * runs):
        _normalize_item(x, xr, y, yr, K, run, scale, B, m, a, c, item, runs, vector_row, rr,
                        res, act)


@njit(parallel=True, **KERNEL_OPTIONS)
def normalize_streaming(x, xr, y, yr, K, run, scale, B, epsilon, centered, mean, var, rr, res,
                        act):
    """:func:`normalize_parallel` with streaming stores."""
    m, a, c = _fold_all(x, mean, var, epsilon, centered)
    runs = (K + run - 1) // run
    for item in prange(m.size * runs):
        _normalize_item(x, xr, y, yr, K, run, scale, B, m, a, c, item, runs, stream_row, rr,
                        res, act)
        store_fence()


# one-thread twin (see normkernels.kernels.cache.serial_twin)
normalize_serial = serial_twin(normalize_parallel, **KERNEL_OPTIONS)

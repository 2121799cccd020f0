"""Backward passes of the per-channel normalizations (BatchNormalization, instance and
group normalization), part one: the reduction over (X, dY). The pass that writes dX,
and the row normalizations' backward, are in :mod:`normkernels.kernels.backward_dx`.

Layout contract as elsewhere: element ``i`` of the flat arrays belongs to channel
``(i // S) % C``. Two shapes of loop, chosen by ``S`` (``GRAD_MIN_PLANE``, which the
dX pass follows too):

* **planes** (``S >= GRAD_MIN_PLANE``: NCX; short planes in few rows, and short
  planes whose rows would be longer than a block, :func:`sums_by_planes`): the work
  items are chunks of
  ``PLANE_CHUNK`` elements of one plane, each giving one partial pair.
* **rows** (small ``S``: NXC, short planes of few channels): X is rows of ``P = C *
  S`` columns; each block of rows is reduced per column (vectorised across the
  columns).

The reduction gives, per channel, ``sum(dY)`` and ``sum(dY * (x - mean))`` in float64
(16-bit inputs widened exactly). Partials are merged in a fixed order (plane by
plane and chunk by chunk, or block by block and column by column), and the partition
depends only on the shape, so the sums are bitwise the same for any thread count.
The fused reductions (``*_moment_sums``) also find the statistics, for instance and
group normalization, reading X and dY once.
"""

import numpy as np
from numba import njit, prange
from numba.extending import register_jitable

import normkernels.kernels.cache  # noqa: F401  (registers the cache locators before any @njit)
from normkernels.kernels.cache import serial_twin
from normkernels.kernels.elements import load
from normkernels.kernels.lanes import paired_sums
from normkernels.kernels.options import HELPER_OPTIONS, INLINE_OPTIONS, KERNEL_OPTIONS
from normkernels.kernels.statistics import (
    CANCELLATION_LIMIT,
    COLUMN_TILE,
    LINE,
    PLANE_CHUNK,
    ROW_UNROLL,
    SUB_BLOCK,
    chan_merge,
    deviation,
    span_two_pass,
)
from normkernels.kernels.vectors import prefetch

GRAD_MIN_PLANE = 256  # planes at least this long are reduced and written plane by plane
ROW_BLOCK_ELEMENTS = 1 << 16  # elements per work item of the rows loops (about)


def by_planes(S, n_rows):
    """Whether a pass over (X, dY) of ``n_rows`` rows of planes of ``S`` goes plane by
    plane: long planes, or short planes in few rows. The rows loop's partials and
    their merge cost about 3 ns a column whatever the rows, which only many rows
    repay (measured on float32 (N, C, S): at (1, 16, 64) the rows loop took 9 us, the
    planes loop 2; at (32, 64, 49) 48 and 50; at (32, 32, 14) 9 and 25)."""
    return S >= GRAD_MIN_PLANE or 2 * n_rows <= S


def sums_by_planes(C, S, n_rows):
    """Whether the (X, dY) reduction goes plane by plane: :func:`by_planes`, or short
    planes of so many channels that a row (``C * S``) exceeds a block. The rows loop
    keeps a float64 partial per (block, column): at one row per block, for (32, 1024,
    14, 14) as many partials as elements, 103 MB written and read back across rows, 23
    ms where the planes loop takes 3."""
    return by_planes(S, n_rows) or C * S > ROW_BLOCK_ELEMENTS


@njit(**HELPER_OPTIONS)
def _span_sums(x, dy, mu):
    """``(sum dy, sum dy * (x - mu))`` of two slices in float64."""
    return paired_sums(x, dy, mu)[2:]


@njit(parallel=True, **KERNEL_OPTIONS)
def plane_sums(x, dy, C, S, mean, part1, part2):
    """Partials of every (plane, chunk): ``part*[p * chunks + k]``, plane ``p`` of
    channel ``p % C`` reduced around ``mean[p % C]``."""
    chunks = (S + PLANE_CHUNK - 1) // PLANE_CHUNK
    for item in prange(part1.size):
        p = item // chunks
        lo = p * S + (item % chunks) * PLANE_CHUNK
        hi = min((p + 1) * S, lo + PLANE_CHUNK)
        part1[item], part2[item] = _span_sums(x[lo:hi], dy[lo:hi], mean[p % C])


@njit(**KERNEL_OPTIONS)
def merge_plane_sums(part1, part2, C, S, total1, total2):
    """Per-channel sums of :func:`plane_sums`' partials, plane by plane and chunk by
    chunk (no reassociation: a fixed order)."""
    chunks = (S + PLANE_CHUNK - 1) // PLANE_CHUNK
    n_planes = part1.size // chunks
    for c in range(C):
        t1 = 0.0
        t2 = 0.0
        for p in range(c, n_planes, C):
            for k in range(p * chunks, (p + 1) * chunks):
                t1 += part1[k]
                t2 += part2[k]
        total1[c] = t1
        total2[c] = t2


@njit(**HELPER_OPTIONS)
def _span_four(x, dy, shift):
    """``(sum d, sum d^2, sum dy, sum dy * d)`` with ``d = x - shift``, float64, in one
    pass over both slices."""
    return paired_sums(x, dy, shift)


@njit(**HELPER_OPTIONS)
def _chunk_moment_sums(x, dy):
    """``(mean, M2, sum dy, sum dy * (x - mean))`` of a chunk, SUB_BLOCK by SUB_BLOCK:
    one pass over X and dY together (both streams in flight) with sums shifted by the
    sub-block's first element, as ``statistics._span`` shifts them (two passes where
    that cancels badly); sub-blocks merged by Chan's formula, their dY sums moved to
    the first sub-block's mean, then to the chunk's."""
    n, mean, m2 = 0, 0.0, 0.0
    ref, t1, t2 = 0.0, 0.0, 0.0
    for lo in range(0, x.size, SUB_BLOCK):
        hi = min(x.size, lo + SUB_BLOCK)
        xs, gs = x[lo:hi], dy[lo:hi]
        k = hi - lo
        shift = np.float64(load(xs, 0))
        if not np.isfinite(shift):  # x - inf would make an infinite mean NaN
            shift = 0.0
        a, b, c, d = _span_four(xs, gs, shift)
        correction = a * a / k
        if correction <= b * CANCELLATION_LIMIT:
            mean_b, m2_b, s1_b, s2_b = shift + a / k, b - correction, c, d - (a / k) * c
        else:
            mean_b, m2_b = span_two_pass(xs)
            s1_b, s2_b = _span_sums(xs, gs, mean_b)
        if lo == 0:
            ref = mean_b
        t1 += s1_b
        t2 += s2_b + (mean_b - ref) * s1_b
        n, mean, m2 = chan_merge(n, mean, m2, k, mean_b, m2_b)
    return mean, m2, t1, t2 - (mean - ref) * t1


@njit(parallel=True, **KERNEL_OPTIONS)
def plane_moment_sums(x, dy, S, part_mean, part_m2, part1, part2):
    """The reduction that also finds the statistics (instance and group normalization):
    per (plane, chunk) the chunk's ``(mean, M2)`` and ``(sum dy, sum dy * (x - mean))``
    around that chunk mean (:func:`_chunk_moment_sums`). X and dY are read once,
    together."""
    chunks = (S + PLANE_CHUNK - 1) // PLANE_CHUNK
    for item in prange(part1.size):
        p = item // chunks
        lo = p * S + (item % chunks) * PLANE_CHUNK
        hi = min((p + 1) * S, lo + PLANE_CHUNK)
        part_mean[item], part_m2[item], part1[item], part2[item] = _chunk_moment_sums(
            x[lo:hi], dy[lo:hi])


@njit(**KERNEL_OPTIONS)
def merge_group_sums(part_mean, part_m2, part1, part2, S, group, count, mean, m2, total1,
                     total2):
    """Per group of ``group`` consecutive planes: ``(count, mean, M2)`` by Chan's merge
    of its chunks in order; per plane: ``sum dy`` and ``sum dy * (x - its group's
    mean)``, each chunk's sum moved from the chunk's mean to the group's (``- (mean -
    chunk mean) * sum dy``: the means are close, so the correction is small)."""
    chunks = (S + PLANE_CHUNK - 1) // PLANE_CHUNK
    n_planes = part1.size // chunks
    for g in range(n_planes // group):
        n, mu, q = 0, 0.0, 0.0
        for k in range(g * group * chunks, (g + 1) * group * chunks):
            size = min(PLANE_CHUNK, S - (k % chunks) * PLANE_CHUNK)
            n, mu, q = chan_merge(n, mu, q, size, part_mean[k], part_m2[k])
        count[g] = n
        mean[g] = mu
        m2[g] = q
        for p in range(g * group, (g + 1) * group):
            t1 = 0.0
            t2 = 0.0
            for k in range(p * chunks, (p + 1) * chunks):
                t1 += part1[k]
                t2 += part2[k] - (mu - part_mean[k]) * part1[k]
            total1[p] = t1
            total2[p] = t2


@register_jitable
def block_rows(n_rows, P):
    """Rows per block of the rows loops (work items, and partials merged in order):
    blocks of at most about ROW_BLOCK_ELEMENTS, an even number of them when more than
    one, of equal size but the last. By the shape alone, so the bits do not depend on
    the thread count; even for two threads: (64, 1280) as 51 + 13 rows took 34 us a
    reduction on 2 threads, as 32 + 32 rows 25 us (docs/design.md)."""
    blocks = -(-(n_rows * P) // ROW_BLOCK_ELEMENTS)
    if blocks > 1:
        blocks += blocks % 2
    return max(1, -(-n_rows // max(1, blocks)))


GRAD_PREFETCH_BYTES = 8192  # row_sums: how far ahead it asks for rows of X and dY


@njit(**INLINE_OPTIONS)
def row_item(item, n_tiles, P, rows_per_block, n_rows):
    """Work item ``item`` of the rows reductions, (row block, tile of COLUMN_TILE
    columns): ``(block, first column, end column, first row, end row)``."""
    blk = item // n_tiles
    j0 = (item % n_tiles) * COLUMN_TILE
    first = blk * rows_per_block
    return blk, j0, min(P, j0 + COLUMN_TILE), first, min(n_rows, first + rows_per_block)


@njit(**INLINE_OPTIONS)
def put_partials(part, blk, j0, values):
    """``part[blk, j0:j0 + values.size] = values``, element by element: a slice
    assignment from an array compiles Numba's shape-mismatch message (string
    formatting, 1.4 s of a first call)."""
    for j in range(values.size):
        part[blk, j0 + j] = values[j]


@njit(parallel=True, **KERNEL_OPTIONS)
def row_sums(x, dy, P, rows_per_block, mu, part1, part2):
    """Partials per (row block, column) of rows of ``P`` columns; ``mu[j]`` is the mean
    of column ``j``'s channel. Work items are (row block, tile of COLUMN_TILE columns);
    each sums into local accumulators, four rows per sweep, and asks for the rows
    GRAD_PREFETCH_BYTES ahead (the shape of ``statistics.row_partials``: short rows are
    many small streams the hardware prefetchers follow late)."""
    n_rows = x.size // P
    n_tiles = (P + COLUMN_TILE - 1) // COLUMN_TILE
    for item in prange(part1.shape[0] * n_tiles):
        blk, j0, j1, first, last = row_item(item, n_tiles, P, rows_per_block, n_rows)
        width = j1 - j0
        m = mu[j0:j1].copy()
        s1 = np.zeros(width)
        s2 = np.zeros(width)
        ahead = max(ROW_UNROLL, GRAD_PREFETCH_BYTES // (P * x.itemsize))
        step = LINE // x.itemsize
        r = first
        while r + ROW_UNROLL <= last:
            if r + ahead < last:
                for k in range(r + ahead, min(last, r + ahead + ROW_UNROLL)):
                    for j in range(k * P + j0, k * P + j1, step):
                        prefetch(x, j)
                        prefetch(dy, j)
            x0, g0 = x[r * P + j0:r * P + j1], dy[r * P + j0:r * P + j1]
            x1, g1 = x[(r + 1) * P + j0:(r + 1) * P + j1], dy[(r + 1) * P + j0:(r + 1) * P + j1]
            x2, g2 = x[(r + 2) * P + j0:(r + 2) * P + j1], dy[(r + 2) * P + j0:(r + 2) * P + j1]
            x3, g3 = x[(r + 3) * P + j0:(r + 3) * P + j1], dy[(r + 3) * P + j0:(r + 3) * P + j1]
            for j in range(width):
                a0 = np.float64(load(g0, j))
                a1 = np.float64(load(g1, j))
                a2 = np.float64(load(g2, j))
                a3 = np.float64(load(g3, j))
                s1[j] += (a0 + a1) + (a2 + a3)
                s2[j] += ((a0 * deviation(x0, j, m[j]) + a1 * deviation(x1, j, m[j]))
                          + (a2 * deviation(x2, j, m[j]) + a3 * deviation(x3, j, m[j])))
            r += ROW_UNROLL
        for tail in range(r, last):
            xr, gr = x[tail * P + j0:tail * P + j1], dy[tail * P + j0:tail * P + j1]
            for j in range(width):
                a = np.float64(load(gr, j))
                s1[j] += a
                s2[j] += a * deviation(xr, j, m[j])
        put_partials(part1, blk, j0, s1)
        put_partials(part2, blk, j0, s2)


@njit(parallel=True, **KERNEL_OPTIONS)
def row_moment_sums(x, dy, P, rows_per_block, part_mean, part_m2, part1, part2):
    """:func:`plane_moment_sums` for rows of ``P`` columns (channels-last samples): per
    (row block, column) the block's column ``(mean, M2)`` by two passes (the block,
    at most ROW_BLOCK_ELEMENTS, is read again from L2) and ``(sum dy, sum dy * (x -
    that mean))``. X and dY are read from memory once."""
    n_rows = x.size // P
    n_tiles = (P + COLUMN_TILE - 1) // COLUMN_TILE
    for item in prange(part1.shape[0] * n_tiles):
        blk, j0, j1, first, last = row_item(item, n_tiles, P, rows_per_block, n_rows)
        width = j1 - j0
        shift = np.empty(width)
        for j in range(width):  # by 0 where infinite: x - inf would make a mean NaN
            value = np.float64(load(x, first * P + j0 + j))
            shift[j] = value if np.isfinite(value) else 0.0
        m = np.zeros(width)
        for r in range(first, last):
            xr = x[r * P + j0:r * P + j1]
            for j in range(width):
                m[j] += deviation(xr, j, shift[j])
        for j in range(width):
            m[j] = shift[j] + m[j] / (last - first)
        q = np.zeros(width)
        s1 = np.zeros(width)
        s2 = np.zeros(width)
        for r in range(first, last):
            xr, gr = x[r * P + j0:r * P + j1], dy[r * P + j0:r * P + j1]
            for j in range(width):
                d = deviation(xr, j, m[j])
                a = np.float64(load(gr, j))
                q[j] += d * d
                s1[j] += a
                s2[j] += a * d
        put_partials(part_mean, blk, j0, m)
        put_partials(part_m2, blk, j0, q)
        put_partials(part1, blk, j0, s1)
        put_partials(part2, blk, j0, s2)


@njit(**KERNEL_OPTIONS)
def merge_row_group_sums(part_mean, part_m2, part1, part2, rows_per_block, n_rows, group,
                         count, mean, m2, total1, total2):
    """Per group of ``group`` consecutive columns: ``(count, mean, M2)`` by Chan's merge
    over row blocks, then columns, in order; per column: ``sum dy`` and ``sum dy * (x -
    its group's mean)``, each block's sum moved from the block's column mean to the
    group's (as :func:`merge_group_sums`)."""
    n_blocks, P = part1.shape
    for g in range(P // group):
        n, mu, q = 0, 0.0, 0.0
        for blk in range(n_blocks):
            size = min(rows_per_block, n_rows - blk * rows_per_block)
            for j in range(g * group, (g + 1) * group):
                n, mu, q = chan_merge(n, mu, q, size, part_mean[blk, j], part_m2[blk, j])
        count[g] = n
        mean[g] = mu
        m2[g] = q
        for j in range(g * group, (g + 1) * group):
            t1 = 0.0
            t2 = 0.0
            for blk in range(n_blocks):
                t1 += part1[blk, j]
                t2 += part2[blk, j] - (mu - part_mean[blk, j]) * part1[blk, j]
            total1[j] = t1
            total2[j] = t2


@njit(**KERNEL_OPTIONS)
def merge_row_sums(part1, part2, C, S, total1, total2):
    """Per-channel sums of :func:`row_sums`' partials (column ``j`` of rows of ``P``
    is channel ``(j // S) % C``): blocks in order, then columns in order."""
    P = part1.shape[1]
    for c in range(C):
        total1[c] = 0.0
        total2[c] = 0.0
    for j in range(P):
        t1 = 0.0
        t2 = 0.0
        for blk in range(part1.shape[0]):
            t1 += part1[blk, j]
            t2 += part2[blk, j]
        c = (j // S) % C
        total1[c] += t1
        total2[c] += t2


# one-thread twins (see normkernels.kernels.cache.serial_twin)
plane_sums_serial = serial_twin(plane_sums, **KERNEL_OPTIONS)
plane_moment_sums_serial = serial_twin(plane_moment_sums, **KERNEL_OPTIONS)
row_sums_serial = serial_twin(row_sums, **KERNEL_OPTIONS)
row_moment_sums_serial = serial_twin(row_moment_sums, **KERNEL_OPTIONS)

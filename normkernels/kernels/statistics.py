"""Per-channel moments (count, mean, M2) in one read of X, deterministic.

The layout contract is the one of :mod:`normkernels.kernels.scale_shift`: element
``i`` of the flat array belongs to channel ``(i // S) % C``. Two kernels:

* **planes** (``S`` large: NCX, and 1-D X as one plane): each fixed-size chunk of a
  plane is reduced in sub-blocks of SUB_BLOCK elements, each in one pass over its
  deviations from its first element (two passes if that cancels badly), and the
  sub-blocks are merged with Chan's formula. One partial per (plane, chunk).
* **rows** (``S`` small: NXC and short NCX planes): X is rows of ``P`` columns
  (``P`` a multiple of ``C * S``); each block of rows is reduced per column,
  vectorised across the columns, by the one-pass shifted method of the planes
  kernel. One partial per (row block, column).

Arithmetic is float64, except that 16-bit X sums short runs in float32 first (see
:func:`_span_narrow`). The partials are then merged in a fixed order (plane by
plane, block by block, column by column), and the partition depends only on the
shape, never on the thread count: the statistics are bitwise identical for any
``NUMBA_NUM_THREADS``.

Welford's update (per element or per row) does not vectorise and a float32 sum and
sum of squares cancels on data with mean 1e4 and std 1; the measurements are in
docs/design.md.
"""

import math

import numpy as np
from numba import njit, prange, types
from numba.core.extending import overload

import normkernels.kernels.cache  # noqa: F401  (registers the cache locators before any @njit)
from normkernels.kernels.cache import serial_twin
from normkernels.kernels.elements import load
from normkernels.kernels.lanes import shifted_sums
from normkernels.kernels.options import INLINE_OPTIONS, KERNEL_OPTIONS, OVERLOAD_OPTIONS
from normkernels.kernels.vectors import prefetch

_INLINE = INLINE_OPTIONS

SUB_BLOCK = 4096  # elements reduced at a time (two passes, when needed, in L1)
NARROW_RUN = 256  # 16-bit X: elements summed in float32 before joining float64 sums
SHIFT_SAMPLE = 32  # 16-bit X: the shift is the mean of this many first elements
NARROW_CANCELLATION_LIMIT = 0.5  # 16-bit X: amplification of rounding at most 2
CANCELLATION_LIMIT = 63.0 / 65.0  # amplification of rounding at most (1+r)/(1-r) = 64
PLANE_CHUNK = 1 << 16  # elements per parallel work item of the planes kernel
COLUMN_TILE = 4096  # columns per work item, so few wide rows still parallelise
ROW_UNROLL = 4  # rows added to the column accumulators per sweep (docs/design.md)
PREFETCH_BYTES = 8192  # row_partials: how far ahead it asks for rows (docs/design.md)
LINE = 64  # bytes per cache line


@njit(**_INLINE)
def chan_merge(n_a, mean_a, m2_a, n_b, mean_b, m2_b):
    """Merge two (count, mean, M2) partials (Chan et al.)."""
    n = n_a + n_b
    if n_b == 0:
        return n_a, mean_a, m2_a
    if n_a == 0:
        return n_b, mean_b, m2_b
    delta = mean_b - mean_a
    mean = mean_a + delta * (n_b / n)
    if not math.isfinite(delta):  # an infinite mean: the weighted mean gives IEEE's
        mean = (mean_a * n_a + mean_b * n_b) / n  # answer (inf, or NaN for inf - inf)
    m2 = m2_a + m2_b + delta * delta * (n_a * (n_b / n))
    return n, mean, m2


@njit(**_INLINE)
def deviation(x, i, shift):
    """``x[i] - shift`` in float64."""
    return np.float64(load(x, i)) - shift


@njit(**_INLINE)
def _passes(x, shift, one_pass):
    """(mean, M2) of a slice from its sums of deviations from ``shift``: in one pass
    (``M2 = sum(d**2) - sum(d)**2 / n``) when ``one_pass`` and that cancels little,
    else two passes (the mean, then the squared deviations from it). A loop around one
    call of ``shifted_sums``: each inlined copy of it was a tenth of a second of a
    first call."""
    n = x.size
    mean_known = False
    while True:
        s1, s2 = shifted_sums(x, shift)
        if mean_known:
            return shift, s2
        correction = s1 * s1 / n
        if one_pass and correction <= s2 * CANCELLATION_LIMIT:
            return shift + s1 / n, s2 - correction
        if math.isfinite(shift):
            shift = shift + s1 / n
            mean_known = True
        else:  # x - inf would turn an infinite mean into NaN: the mean's pass from 0
            shift = 0.0
            one_pass = False


@njit(**_INLINE)
def span_two_pass(x):
    """(mean, M2) of a slice by two passes: sum, then squared deviations."""
    return _passes(x, np.float64(load(x, 0)), False)


@njit(**_INLINE)
def _span_narrow(x):
    """``(ok, mean, M2)`` of a short slice of 16-bit X with float32 arithmetic: sums of
    deviations from a shift (the mean of the first SHIFT_SAMPLE elements) over runs
    of NARROW_RUN elements in float32, joined in float64. Twice as fast as the float64
    path (docs/design.md), which 16-bit X needs: it has twice the elements per byte.

    Error: each deviation and square is rounded once to float32 and each run sums
    NARROW_RUN / LANES32 terms per lane, so M2 is within a few float32 ulps (relative); the
    one-pass correction may amplify that at most 1 / (1 - NARROW_CANCELLATION_LIMIT)
    times. ``ok`` is False (the caller then takes the float64 path) when the
    correction cancels more, and when a sum is not finite (NaN or Inf in X, or a
    bfloat16 deviation above 1.8e19 whose square overflows float32).
    """
    head = min(x.size, SHIFT_SAMPLE)
    total = 0.0
    for i in range(head):
        total += np.float64(load(x, i))
    shift = np.float32(total / head)
    s1 = 0.0
    s2 = 0.0
    for lo in range(0, x.size, NARROW_RUN):
        r1, r2 = shifted_sums(x[lo:min(x.size, lo + NARROW_RUN)], shift)
        s1 += np.float64(r1)
        s2 += np.float64(r2)
    correction = s1 * s1 / x.size
    ok = math.isfinite(s2) and math.isfinite(s1) and correction <= s2 * NARROW_CANCELLATION_LIMIT
    return ok, np.float64(shift) + s1 / x.size, s2 - correction


def narrow_span(x):
    """``(ok, mean, M2)`` by :func:`_span_narrow` for 16-bit X, ``(False, 0, 0)``
    for other dtypes, chosen by type when a kernel compiles: the float32/float64
    kernels then never compile the narrow path (plane_partials compiled in 1.1 s
    instead of 2.1 s for float32). Only callable from @njit code."""
    raise NotImplementedError("narrow_span is only callable from @njit code")


@overload(narrow_span, jit_options=OVERLOAD_OPTIONS)
def _narrow_span_impl(x):
    if isinstance(x, types.Array) and x.dtype.bitwidth == 16:
        return lambda x: _span_narrow(x)
    return lambda x: (False, 0.0, 0.0)


@njit(**_INLINE)
def _span(x):
    """(mean, M2) of a short slice in one pass over deviations from its first element
    (``M2 = sum(d**2) - sum(d)**2 / n``), or two passes when that cancels badly.

    With ``d = x - x[0]`` the cancellation amplifies rounding by ``1 + 2 k**2`` where
    ``x[0]`` is ``k`` standard deviations from the mean; past k of about 5.6 (an
    outlier first) the slice is redone with two passes. A constant slice gives its
    value as mean and M2 = 0 exactly. One pass is the faster (docs/design.md). 16-bit
    X goes through :func:`_span_narrow` first (:func:`narrow_span` selects it by
    type).
    """
    ok, mean, m2 = narrow_span(x)
    if ok:
        return mean, m2
    return wide_span(x)


@njit(**_INLINE)
def wide_span(x):
    """(mean, M2) of a short slice in float64: :func:`_span` without the 16-bit path."""
    return _passes(x, np.float64(load(x, 0)), True)


@njit(**_INLINE)
def chunk_moments(x):
    """(mean, M2) of a slice, sub-block by sub-block."""
    n, mean, m2 = 0, 0.0, 0.0
    for lo in range(0, x.size, SUB_BLOCK):
        hi = min(x.size, lo + SUB_BLOCK)
        mean_b, m2_b = _span(x[lo:hi])
        n, mean, m2 = chan_merge(n, mean, m2, hi - lo, mean_b, m2_b)
    return mean, m2


@njit(parallel=True, **KERNEL_OPTIONS)
def plane_partials(x, S, part_mean, part_m2):
    """Partials of every (plane, chunk): ``part_*[p * chunks + k]`` for chunk ``k``
    of plane ``p`` (``chunks = ceil(S / PLANE_CHUNK)``)."""
    chunks = (S + PLANE_CHUNK - 1) // PLANE_CHUNK
    n_items = (x.size // S) * chunks
    for item in prange(n_items):
        p = item // chunks
        lo = p * S + (item % chunks) * PLANE_CHUNK
        hi = min((p + 1) * S, lo + PLANE_CHUNK)
        part_mean[item], part_m2[item] = chunk_moments(x[lo:hi])


@njit(**KERNEL_OPTIONS)
def merge_planes(part_mean, part_m2, C, S, count, mean, m2):
    """Merge plane partials into per-channel (count, mean, M2), planes in order. One
    thread: short planes with many rows go to the rows kernel, so there are few
    partials here (a parallel version compiled 0.6 s longer)."""
    chunks = (S + PLANE_CHUNK - 1) // PLANE_CHUNK
    n_planes = part_mean.size // chunks
    for c in range(C):
        n, mu, q = 0, 0.0, 0.0
        for p in range(c, n_planes, C):
            for k in range(chunks):
                size = min(PLANE_CHUNK, S - k * PLANE_CHUNK)
                item = p * chunks + k
                n, mu, q = chan_merge(n, mu, q, size, part_mean[item], part_m2[item])
        count[c], mean[c], m2[c] = n, mu, q


@njit(**_INLINE)
def _rows_two_pass(x, P, first, last, j0, mean, m2):
    """Columns ``j0 ...`` of rows ``first..last-1`` by two passes (block in cache),
    shifted by the first row (by 0 where that is infinite: x - inf would turn an
    infinite mean into NaN)."""
    shift = np.empty(mean.size)
    for j in range(mean.size):
        value = np.float64(load(x, first * P + j0 + j))
        shift[j] = value if math.isfinite(value) else 0.0
    mean[:] = 0.0
    m2[:] = 0.0
    for r in range(first, last):
        row = x[r * P + j0:r * P + j0 + mean.size]
        for j in range(row.size):
            mean[j] += deviation(row, j, shift[j])
    inv = 1.0 / (last - first)
    for j in range(mean.size):
        mean[j] = shift[j] + mean[j] * inv
    for r in range(first, last):
        row = x[r * P + j0:r * P + j0 + mean.size]
        for j in range(row.size):
            d = np.float64(load(row, j)) - mean[j]
            m2[j] += d * d


@njit(parallel=True, **KERNEL_OPTIONS)
def row_partials(x, P, rows_per_sample, rows_per_block, part_mean, part_m2):
    """Partials per (row block, column): X is viewed as rows of ``P`` grouped into
    samples of ``rows_per_sample`` rows, each sample cut into blocks of
    ``rows_per_block`` rows (the last one shorter); ``part_*[b, j]`` holds column ``j``
    of block ``b`` (blocks numbered sample by sample). Work items are (row block, tile
    of COLUMN_TILE columns). One pass over deviations from the block's first row
    (vectorised across columns, see :func:`_span`), two passes for a block where that
    cancels badly. Batch statistics use one sample (all rows); instance statistics
    one sample per N."""
    n_samples = x.size // P // rows_per_sample
    blocks_per_sample = part_mean.shape[0] // n_samples
    n_tiles = (P + COLUMN_TILE - 1) // COLUMN_TILE
    for item in prange(part_mean.shape[0] * n_tiles):
        blk = item // n_tiles
        j0 = (item % n_tiles) * COLUMN_TILE
        j1 = min(P, j0 + COLUMN_TILE)
        width = j1 - j0
        sample_first = (blk // blocks_per_sample) * rows_per_sample
        first = sample_first + (blk % blocks_per_sample) * rows_per_block
        last = min(sample_first + rows_per_sample, first + rows_per_block)
        # local accumulators and a float64 copy of the shift row, not the partials'
        # rows (faster: docs/design.md, row_partials)
        shift = np.empty(width)
        for j in range(width):
            shift[j] = np.float64(load(x, first * P + j0 + j))
        s1 = np.zeros(width)
        s2 = np.zeros(width)
        # rows this far ahead are asked for while the sweep works (short rows are many
        # small streams the hardware prefetchers follow late: docs/design.md)
        ahead = max(ROW_UNROLL, PREFETCH_BYTES // (P * x.itemsize))
        step = LINE // x.itemsize
        r = first
        while r + ROW_UNROLL <= last:  # four rows per sweep of the accumulators
            if r + ahead < last:
                for k in range(r + ahead, min(last, r + ahead + ROW_UNROLL)):
                    for j in range(k * P + j0, k * P + j1, step):
                        prefetch(x, j)
            r0 = x[r * P + j0:r * P + j1]
            r1 = x[(r + 1) * P + j0:(r + 1) * P + j1]
            r2 = x[(r + 2) * P + j0:(r + 2) * P + j1]
            r3 = x[(r + 3) * P + j0:(r + 3) * P + j1]
            for j in range(width):
                d0 = deviation(r0, j, shift[j])
                d1 = deviation(r1, j, shift[j])
                d2 = deviation(r2, j, shift[j])
                d3 = deviation(r3, j, shift[j])
                s1[j] += (d0 + d1) + (d2 + d3)
                s2[j] += (d0 * d0 + d1 * d1) + (d2 * d2 + d3 * d3)
            r += ROW_UNROLL
        for tail in range(r, last):
            row = x[tail * P + j0:tail * P + j1]
            for j in range(width):
                d = deviation(row, j, shift[j])
                s1[j] += d
                s2[j] += d * d
        n = last - first
        mean = part_mean[blk, j0:j1]
        m2 = part_m2[blk, j0:j1]
        cancels = False
        for j in range(width):
            correction = s1[j] * s1[j] / n
            if not correction <= s2[j] * CANCELLATION_LIMIT:  # NaN too (an infinite shift)
                cancels = True
            mean[j] = shift[j] + s1[j] / n
            m2[j] = s2[j] - correction
        if cancels:
            _rows_two_pass(x, P, first, last, j0, mean, m2)


@njit(parallel=True, **KERNEL_OPTIONS)
def merge_rows(part_mean, part_m2, n_rows, rows_per_block, C, S, count, mean, m2):
    """Merge row partials into the per-channel (count, mean, M2) given, in parallel
    over channels. A channel's groups (row block, column), visited in a fixed order,
    are combined exactly as groups: ``mean = s + sum(n_g * (mean_g - s)) / n`` and
    ``M2 = sum(M2_g) + sum(n_g * (mean_g - mean)**2)`` (no division per group:
    docs/design.md, merge_rows); the result is then merged (Chan) into the given statistics."""
    n_blocks, P = part_mean.shape
    period = C * S
    for c in prange(C):
        shift = part_mean[0, c * S]  # a constant channel then gets M2 = 0 exactly
        if not math.isfinite(shift):
            shift = 0.0
        n = 0
        total = 0.0
        for b in range(n_blocks):
            size = min(rows_per_block, n_rows - b * rows_per_block)
            for j0 in range(c * S, P, period):
                for j in range(j0, j0 + S):
                    n += size
                    total += size * (part_mean[b, j] - shift)
        mu = shift + total / n
        q = 0.0
        for b in range(n_blocks):
            size = min(rows_per_block, n_rows - b * rows_per_block)
            for j0 in range(c * S, P, period):
                for j in range(j0, j0 + S):
                    d = part_mean[b, j] - mu
                    q += part_m2[b, j] + size * (d * d)
        count[c], mean[c], m2[c] = chan_merge(count[c], mean[c], m2[c], n, mu, q)


# one-thread twins (see normkernels.kernels.cache.serial_twin)
plane_partials_serial = serial_twin(plane_partials, **KERNEL_OPTIONS)
row_partials_serial = serial_twin(row_partials, **KERNEL_OPTIONS)
merge_rows_serial = serial_twin(merge_rows, **KERNEL_OPTIONS)

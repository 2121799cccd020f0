"""Instance and group normalization: statistics per (n, group of ``Cg`` channels;
``Cg = 1`` for instance norm) and the normalize pass.

Layouts as elsewhere: NCX memory is ``N * C`` planes of ``S`` elements (plane
``p = n * C + c``); NXC memory is ``N`` samples of ``R`` rows of ``C`` columns.

* **Fused planes** (NCX): one work item per group (its ``Cg`` planes are contiguous)
  computes its statistics, folds its planes' parameters and normalizes it while it is
  still in L1/L2, with streaming stores for
  large outputs, so X is read from memory once.
* **Split planes** (NCX groups too large for L2 or too small to be worth a work item
  each, or fewer groups than threads; see ``FUSED_MIN_PLANE`` in normkernels.engine.policy): the
  planes kernel of :mod:`normkernels.kernels.statistics` reduces chunks of
  ``PLANE_CHUNK`` in parallel, the chunks are merged per group, then the normalize
  pass of :mod:`normkernels.kernels.scale_shift` runs. The statistics of a group are
  the same chunk partials merged in the same order on both paths, so the two paths
  give bitwise the same Y, and the choice between them (which depends on the thread
  count) never changes a result.
* **Rows** (NXC): row blocks of each sample are reduced per column (the rows kernel
  of :mod:`normkernels.kernels.statistics`), merged per (n, group), then normalized.
"""

import math

import numpy as np
from numba import njit, prange

import normkernels.kernels.cache  # noqa: F401  (registers the cache locators before any @njit)
from normkernels.kernels.activations import residual_slice
from normkernels.kernels.cache import serial_twin
from normkernels.kernels.elements import load
from normkernels.kernels.fold import fold_one
from normkernels.kernels.options import (
    HELPER_OPTIONS,
    INLINE_OPTIONS,
    KERNEL_OPTIONS,
    MIN_PLANE,
)
from normkernels.kernels.scale_shift import (
    planes_range,
    planes_scalar,
    run_tables,
    scale_shift_planes_serial,
    store_fence,
    stream_one,
    stream_split,
    vector_one,
    vector_split,
)
from normkernels.kernels.statistics import PLANE_CHUNK, chan_merge, chunk_moments

_INLINE = INLINE_OPTIONS


@njit(**HELPER_OPTIONS)
def plane_statistics(x):
    """(mean, M2) of one plane: chunks of PLANE_CHUNK reduced as
    :func:`normkernels.kernels.statistics.plane_partials` does, merged in order as
    :func:`normkernels.kernels.statistics.merge_planes` does."""
    n, mu, q = 0, 0.0, 0.0
    for lo in range(0, x.size, PLANE_CHUNK):
        hi = min(x.size, lo + PLANE_CHUNK)
        mean_k, m2_k = chunk_moments(x[lo:hi])
        n, mu, q = chan_merge(n, mu, q, hi - lo, mean_k, m2_k)
    return mu, q


@njit(**_INLINE)
def _fold_group(g, C, Cg, count, scale, B, epsilon, mu, q, m, a, b):
    """Parameters of the ``Cg`` planes of group ``g`` (plane ``p`` is channel
    ``p % C``) from the group's (mean, M2) over ``count`` elements."""
    var = q / count
    for p in range(g * Cg, (g + 1) * Cg):
        c = p % C
        fold_one(np.float64(load(scale, c)), np.float64(load(B, c)), mu, var, epsilon,
                 m, a, b, p)


@njit(**_INLINE)
def _fused_group(x, y, g, C, Cg, S, scale, B, epsilon, mean, m2, m, a, b, streaming, res,
                 act):
    size = Cg * S
    lo = g * size
    hi = lo + size
    mu, q = plane_statistics(x[lo:hi])
    mean[g] = mu
    m2[g] = q
    _fold_group(g, C, Cg, size, scale, B, epsilon, mu, q, m, a, b)
    n_planes = m.size
    if S < MIN_PLANE:
        planes_scalar(x, y, lo, hi, n_planes, S, m, a, b, res, act)
    elif streaming:
        planes_range(x, y, lo, hi, n_planes, S, m, a, b, stream_one, stream_split, res, act)
    else:
        planes_range(x, y, lo, hi, n_planes, S, m, a, b, vector_one, vector_split, res, act)


@njit(**KERNEL_OPTIONS)
def fused_planes_serial(x, y, C, Cg, S, scale, B, epsilon, mean, m2, m, a, b, res, act):
    """Every group ``g`` of ``Cg`` consecutive planes (instance norm: ``Cg = 1``):
    statistics into ``mean[g], m2[g]`` (float64), parameters of its planes ``p`` into
    ``m[p], a[p], b[p]`` (compute dtype); then Y in one planes loop. One thread, for
    tensors that fit in cache: one loop over all planes runs vectors across plane
    boundaries, where a loop per plane pays a scalar head and tail on every plane (a
    call on 16 planes of 8x8: 3.9 us against 1.9 us; same bits)."""
    size = Cg * S
    for g in range(mean.size):
        lo = g * size
        mu, q = plane_statistics(x[lo:lo + size])
        mean[g] = mu
        m2[g] = q
        _fold_group(g, C, Cg, size, scale, B, epsilon, mu, q, m, a, b)
    scale_shift_planes_serial(x, y, m.size, S, m, a, b, res, act)


@njit(parallel=True, **KERNEL_OPTIONS)
def fused_planes_parallel(x, y, C, Cg, S, scale, B, epsilon, mean, m2, m, a, b, res, act):
    """:func:`fused_planes_serial`, groups in parallel."""
    for g in prange(mean.size):
        _fused_group(x, y, g, C, Cg, S, scale, B, epsilon, mean, m2, m, a, b, False, res, act)


@njit(parallel=True, **KERNEL_OPTIONS)
def fused_planes_streaming(x, y, C, Cg, S, scale, B, epsilon, mean, m2, m, a, b, res, act):
    """:func:`fused_planes_parallel` with streaming stores (``S >= MIN_PLANE``)."""
    for g in prange(mean.size):
        _fused_group(x, y, g, C, Cg, S, scale, B, epsilon, mean, m2, m, a, b, True, res, act)
        store_fence()


@njit(**KERNEL_OPTIONS)
def fold_planes(C, Cg, count, scale, B, epsilon, mean, m2, m, a, b):
    """Parameters of every plane ``p`` (channel ``p % C``, group ``p // Cg``) from its
    group's statistics over ``count`` elements, as the fused kernels fold them."""
    for g in range(mean.size):
        _fold_group(g, C, Cg, count, scale, B, epsilon, mean[g], m2[g], m, a, b)


@njit(parallel=True, **KERNEL_OPTIONS)
def merge_sample_rows(part_mean, part_m2, Cg, rows_per_sample, rows_per_block, mean, m2):
    """Per-(n, group) (mean, M2) from :func:`~normkernels.kernels.statistics.row_partials`
    run with one sample per n and ``P = C`` columns, groups of ``Cg`` consecutive
    columns (instance norm: ``Cg = 1``): the blocks of each sample and the columns of
    each group are combined exactly as groups, block by block and column by column
    (see :func:`~normkernels.kernels.statistics.merge_rows`), in parallel over
    (n, group)."""
    C = part_mean.shape[1]
    G = C // Cg
    blocks_per_sample = part_mean.shape[0] * G // mean.size
    count = rows_per_sample * Cg
    for item in prange(mean.size):
        first = (item // G) * blocks_per_sample
        c0 = (item % G) * Cg
        shift = part_mean[first, c0]
        if not math.isfinite(shift):  # keep an infinite mean infinite (not inf - inf)
            shift = 0.0
        total = 0.0
        for k in range(blocks_per_sample):
            size = min(rows_per_block, rows_per_sample - k * rows_per_block)
            for c in range(c0, c0 + Cg):
                total += size * (part_mean[first + k, c] - shift)
        mu = shift + total / count
        q = 0.0
        for k in range(blocks_per_sample):
            size = min(rows_per_block, rows_per_sample - k * rows_per_block)
            for c in range(c0, c0 + Cg):
                d = part_mean[first + k, c] - mu
                q += part_m2[first + k, c] + size * (d * d)
        mean[item] = mu
        m2[item] = q


@njit(parallel=True, **KERNEL_OPTIONS)
def normalize_rows(x, y, C, rows_per_sample, rows_per_block, m, a, b, res, act):
    """NXC: ``y = act((x - m[n, c]) * a[n, c] + b[n, c] + res)`` (parameters flat, ``n * C + c``)
    over blocks of rows in parallel; for samples too small to be worth a launch each."""
    n_samples = m.size // C
    blocks_per_sample = (rows_per_sample + rows_per_block - 1) // rows_per_block
    for item in prange(n_samples * blocks_per_sample):
        n = item // blocks_per_sample
        first = n * rows_per_sample + (item % blocks_per_sample) * rows_per_block
        last = min((n + 1) * rows_per_sample, first + rows_per_block)
        mn = m[n * C:(n + 1) * C]
        an = a[n * C:(n + 1) * C]
        bn = b[n * C:(n + 1) * C]
        for r in range(first, last):
            run_tables(x[r * C:(r + 1) * C], y[r * C:(r + 1) * C], mn, an, bn,
                       residual_slice(res, r * C, (r + 1) * C), act)


# one-thread twins (see normkernels.kernels.cache.serial_twin)
merge_sample_rows_serial = serial_twin(merge_sample_rows, **KERNEL_OPTIONS)
normalize_rows_serial = serial_twin(normalize_rows, **KERNEL_OPTIONS)

"""Fused training pass for NCX: batch statistics, then normalize, channel by channel.

One work item is one channel: its N planes are reduced (the planes moments of
:mod:`normkernels.kernels.moments`, merged in the same order, so the statistics are
bitwise those of ``moments``), its parameters folded (as
:func:`normkernels.ops.common.fold_parameters` does), and its planes normalized while
they are still in L2, with streaming stores for Y so that Y does not evict them.
X is then read from memory about once instead of twice.
"""

import math

import numpy as np
from numba import njit, prange

import normkernels.kernels.cache  # noqa: F401  (registers the cache locators before any @njit)
from normkernels.kernels.moments import PLANE_CHUNK, chan_merge, chunk_moments
from normkernels.kernels.scale_shift import (
    KERNEL_OPTIONS,
    _planes_range,
    _stream_one,
    _stream_split,
    _vector_one,
    _vector_split,
    store_fence,
)

_INLINE = dict(KERNEL_OPTIONS, inline="always")


@njit(**_INLINE)
def _channel(x, y, c, C, S, scale, B, epsilon, count, mean, m2, m, a, b, one, split):
    n_planes = x.size // S
    chunks = (S + PLANE_CHUNK - 1) // PLANE_CHUNK
    n, mu, q = 0, 0.0, 0.0
    for p in range(c, n_planes, C):
        for k in range(chunks):
            lo = p * S + k * PLANE_CHUNK
            hi = min((p + 1) * S, lo + PLANE_CHUNK)
            mean_k, m2_k = chunk_moments(x[lo:hi])
            n, mu, q = chan_merge(n, mu, q, hi - lo, mean_k, m2_k)
    count[c], mean[c], m2[c] = n, mu, q
    # fold exactly as ops.common.fold_parameters does
    a64 = scale[c] / math.sqrt(q / n + epsilon)
    m[c] = mu
    a[c] = a64
    if m.itemsize == 8 or not math.isfinite(m[c]):
        b[c] = B[c]
    else:
        b[c] = B[c] - (mu - np.float64(m[c])) * a64
    for p in range(c, n_planes, C):
        _planes_range(x, y, p * S, (p + 1) * S, C, S, m, a, b, one, split)


@njit(parallel=True, **KERNEL_OPTIONS)
def train_planes(x, y, C, S, scale, B, epsilon, count, mean, m2, m, a, b):
    """Statistics into ``count, mean, m2`` (float64), folded parameters into ``m, a,
    b`` (compute dtype), Y with ordinary stores. ``scale``, ``B``: float64."""
    for c in prange(C):
        _channel(x, y, c, C, S, scale, B, epsilon, count, mean, m2, m, a, b,
                 _vector_one, _vector_split)


@njit(parallel=True, **KERNEL_OPTIONS)
def train_planes_streaming(x, y, C, S, scale, B, epsilon, count, mean, m2, m, a, b):
    """:func:`train_planes` with streaming stores for Y."""
    for c in prange(C):
        _channel(x, y, c, C, S, scale, B, epsilon, count, mean, m2, m, a, b,
                 _stream_one, _stream_split)
        store_fence()

"""Folding the per-channel parameters: ``a = scale / sqrt(var + epsilon)``.

O(C) work, but it runs on every call, so it is a small kernel rather than five NumPy
temporaries and an ``errstate`` (per-call latency of small tensors; see
``scale_over_std`` in docs/design.md). It reads scale and var in any of
the four storage dtypes, computes in float64 and rounds once into ``a``.
"""

import math

import numpy as np
from numba import njit

import normkernels.kernels.cache  # noqa: F401  (registers the cache locators before any @njit)
from normkernels.kernels.elements import load
from normkernels.kernels.options import INLINE_OPTIONS, KERNEL_OPTIONS


@njit(**KERNEL_OPTIONS)
def scale_over_std(scale, var, epsilon, a):
    """``a[c] = scale[c] / sqrt(var[c] + epsilon)`` in float64, rounded into ``a``."""
    for c in range(a.size):
        a[c] = np.float64(load(scale, c)) / math.sqrt(np.float64(load(var, c)) + epsilon)


@njit(**INLINE_OPTIONS)
def fold_one(scale, B, mean, var, epsilon, m, a, b, i):
    """Entry ``i`` of ``(m, a, b)`` from float64 ``scale, B, mean, var``, as
    :func:`normkernels.ops.common.fold_parameters` folds a float64 mean: ``a`` in
    float64 rounded once; ``m`` the rounding of ``mean`` and, when that loses bits,
    the residual ``(mean - m) * a`` folded into ``b``."""
    a64 = scale / math.sqrt(var + epsilon)
    m[i] = mean
    a[i] = a64
    if m.itemsize == 8 or not math.isfinite(m[i]):
        b[i] = B
    else:
        b[i] = B - (mean - np.float64(m[i])) * a64

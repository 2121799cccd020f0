"""Folding one entry of the per-plane parameters of instance normalization (the
rule of :func:`normkernels.reference.fold_parameters`; per-channel inference folds
in :mod:`normkernels.kernels.inference`)."""

import math

import numpy as np
from numba import njit

import normkernels.kernels.cache  # noqa: F401  (registers the cache locators before any @njit)
from normkernels.kernels.options import INLINE_OPTIONS


@njit(**INLINE_OPTIONS)
def fold_one(scale, B, mean, var, epsilon, m, a, b, i):
    """Entry ``i`` of ``(m, a, b)`` from float64 ``scale, B, mean, var``, as
    :func:`normkernels.reference.fold_parameters` folds a float64 mean: ``a`` in
    float64 rounded once; ``m`` the rounding of ``mean`` and, when that loses bits,
    the residual ``(mean - m) * a`` folded into ``b``."""
    a64 = scale / math.sqrt(var + epsilon)
    m[i] = mean
    a[i] = a64
    if m.itemsize == 8 or not math.isfinite(m[i]):
        b[i] = B
    else:
        b[i] = B - (mean - np.float64(m[i])) * a64

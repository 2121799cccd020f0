"""Slow twins: the operators with NumPy loops instead of Numba kernels.

They share the spec layer (argument checks, parameter folding, layouts) with the
public functions and do the same float operations in the same order, so their results
are bit-identical to the kernels'. Read them as the statement of what is computed;
the tests compare the kernels against them and both against an independent float64
oracle written from the specs.
"""

import sys

import numpy as np

from normkernels.kernels.storage import compute_dtype
from normkernels.ops import batch_norm_inference as _bni
from normkernels.ops import batch_normalization as _bn


def scale_shift(x, y, C, S, mean, a, b, path=None):
    """NumPy twin of :func:`normkernels.kernels.dispatch.scale_shift`."""
    cd = compute_dtype(x.dtype)
    with np.errstate(all="ignore"):  # IEEE results (inf, NaN), as the kernels give
        xv = x.reshape(-1, C, S).astype(cd)
        result = (xv - mean[:, None]) * a[:, None] + b[:, None]
        y.reshape(-1, C, S)[...] = result.astype(y.dtype)


def moments(x, C, S):
    """NumPy twin of :func:`normkernels.kernels.dispatch.moments`: per-channel
    ``(count, mean, M2)`` in float64 by two passes (pairwise sums). Not bit-identical
    to the kernels, whose summation order differs."""
    per_channel = np.ascontiguousarray(
        x.reshape(-1, C, S).astype(np.float64).transpose(1, 0, 2)).reshape(C, -1)
    count = np.full(C, per_channel.shape[1], np.int64)
    with np.errstate(all="ignore"):
        mean = per_channel.mean(axis=1) if count[0] else np.zeros(C)
        m2 = ((per_channel - mean[:, None]) ** 2).sum(axis=1)
    return count, mean, m2


_ENGINE = sys.modules[__name__]


def batch_normalization(X, scale, B, input_mean, input_var, **attributes):
    """Slow twin of :func:`normkernels.batch_normalization` (same arguments)."""
    return _bn.batch_normalization(X, scale, B, input_mean, input_var, engine=_ENGINE,
                                   **attributes)


def batch_norm_inference(input, gamma, beta, mean, variance, **attributes):
    """Slow twin of :func:`normkernels.batch_norm_inference` (same arguments)."""
    return _bni.batch_norm_inference(input, gamma, beta, mean, variance, engine=_ENGINE,
                                     **attributes)


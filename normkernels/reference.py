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
from normkernels.ops import common
from normkernels.ops import instance_normalization as _in


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


def _instance_parameters(x, scale, B, epsilon, mean, m2, count):
    reps = mean.size // scale.size
    return common.fold_parameters(np.tile(scale, reps), np.tile(B, reps), mean, m2 / count,
                                  epsilon, x.dtype)


def instance_planes(x, y, C, S, scale, B, epsilon, path=None):
    """NumPy twin of :func:`normkernels.kernels.dispatch.instance_planes` (statistics
    by two passes, so not bit-identical to the kernels)."""
    planes = x.reshape(-1, S).astype(np.float64)
    with np.errstate(all="ignore"):
        mean = planes.mean(axis=1)
        m2 = ((planes - mean[:, None]) ** 2).sum(axis=1)
    m, a, b = _instance_parameters(x, scale, B, epsilon, mean, m2, S)
    scale_shift(x, y, mean.size, S, m, a, b)
    return mean, m2


def instance_rows(x, y, N, C, scale, B, epsilon, path=None):
    """NumPy twin of :func:`normkernels.kernels.dispatch.instance_rows`."""
    # (n, c) planes made contiguous: NumPy sums pairwise only along the last axis
    planes = np.ascontiguousarray(x.reshape(N, -1, C).astype(np.float64).transpose(0, 2, 1))
    R = planes.shape[2]
    with np.errstate(all="ignore"):
        mean = planes.mean(axis=2)
        m2 = ((planes - mean[:, :, None]) ** 2).sum(axis=2)
        m, a, b = _instance_parameters(x, scale, B, epsilon, mean.reshape(-1), m2.reshape(-1), R)
        xv = x.reshape(N, R, C).astype(compute_dtype(x.dtype))
        shape = (N, 1, C)
        result = (xv - m.reshape(shape)) * a.reshape(shape) + b.reshape(shape)
        y.reshape(N, R, C)[...] = result.astype(y.dtype)
    return mean.reshape(-1), m2.reshape(-1)


_ENGINE = sys.modules[__name__]


def batch_normalization(X, scale, B, input_mean, input_var, **attributes):
    """Slow twin of :func:`normkernels.batch_normalization` (same arguments)."""
    return _bn.batch_normalization(X, scale, B, input_mean, input_var, engine=_ENGINE,
                                   **attributes)


def batch_norm_inference(input, gamma, beta, mean, variance, **attributes):
    """Slow twin of :func:`normkernels.batch_norm_inference` (same arguments)."""
    return _bni.batch_norm_inference(input, gamma, beta, mean, variance, engine=_ENGINE,
                                     **attributes)



def instance_normalization(input, scale, B, **attributes):
    """Slow twin of :func:`normkernels.instance_normalization` (same arguments)."""
    return _in.instance_normalization(input, scale, B, engine=_ENGINE, **attributes)

"""Slow twins: the operators with NumPy loops instead of Numba kernels.

They share the spec layer (argument checks, parameter folding, layouts) with the
public functions and do the same float operations in the same order, so their results
are bit-identical to the kernels'. Read them as the statement of what is computed;
the tests compare the kernels against them and both against an independent float64
oracle written from the specs.
"""

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


def batch_normalization(X, scale, B, input_mean, input_var, **attributes):
    """Slow twin of :func:`normkernels.batch_normalization` (same arguments)."""
    return _bn.batch_normalization(X, scale, B, input_mean, input_var, engine=scale_shift,
                                   **attributes)


def batch_norm_inference(input, gamma, beta, mean, variance, **attributes):
    """Slow twin of :func:`normkernels.batch_norm_inference` (same arguments)."""
    return _bni.batch_norm_inference(input, gamma, beta, mean, variance, engine=scale_shift,
                                     **attributes)

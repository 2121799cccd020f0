"""normkernels' loops for users' own Numba code: one-thread jitted functions that an
``@njit`` function (or plain Python) calls on float32 or float64 arrays, with the
numerics of the public functions (the same kernels: bit for bit the same results).

::

    import numba
    from normkernels.numba import layer_norm_row

    @numba.njit
    def my_block(X, scale, bias, Y):
        for r in range(X.shape[0]):
            layer_norm_row(X[r], scale, bias, 1e-5, Y[r])

Each function works on one thread: called from a ``prange`` loop, each iteration runs
its own (no nested parallel region). Arguments are 1-D, C-contiguous float32 or
float64 arrays of one dtype (the output too); the statistics are float64. Nothing
is allocated but a few scalars' worth of scratch. Compiled on first use per dtype
and cached on disk with the package's kernels.
"""

import numpy as np
from numba import njit

import normkernels.kernels.cache  # noqa: F401  (registers the cache locators before any @njit)
from normkernels.kernels import inference, rows
from normkernels.kernels.activations import NONE
from normkernels.kernels.options import KERNEL_OPTIONS

__all__ = ["layer_norm_row", "moments", "normalize_plane", "rms_norm_row"]

_OPTIONS = {k: v for k, v in KERNEL_OPTIONS.items() if k != "nogil"}


@njit(**_OPTIONS)
def _check(x, out, n_params, params_size):
    if x.ndim != 1 or out.ndim != 1 or out.size != x.size:
        raise ValueError("x and out must be 1-D arrays of one size")
    if n_params and params_size != x.size:
        raise ValueError("scale and bias must have x's size (one value per element)")


@njit(**_OPTIONS)
def layer_norm_row(x, scale, bias, epsilon, out):
    """``out = (x - mean) / sqrt(var + epsilon) * scale + bias`` over the row ``x``
    (as :func:`normkernels.layer_normalization` of one row); returns ``(mean, inv_std)``
    in float64."""
    _check(x, out, 1, scale.size)
    if bias.size != x.size:
        raise ValueError("bias must have x's size")
    mean, var = np.empty(1), np.empty(1)
    K = x.size
    rows.rows_serial(x, K, out, K, K, scale, bias, epsilon, mean, var, None, scale[:0],
                     np.empty(0, x.dtype), 0, None, NONE)
    return mean[0], 1.0 / np.sqrt(var[0] + epsilon)


@njit(**_OPTIONS)
def rms_norm_row(x, scale, epsilon, out):
    """``out = x / sqrt(mean(x**2) + epsilon) * scale`` over the row ``x`` (as
    :func:`normkernels.rms_normalization`); returns ``inv_std`` in float64."""
    _check(x, out, 1, scale.size)
    mean, var = np.empty(1), np.empty(1)
    K = x.size
    rows.rms_rows_serial(x, K, out, K, K, scale, scale[:0], epsilon, mean, var, None,
                         scale[:0], np.empty(0, x.dtype), 0, None, NONE)
    return 1.0 / np.sqrt(var[0] + epsilon)


@njit(**_OPTIONS)
def normalize_plane(x, mean, var, scale, bias, epsilon, out):
    """``out = (x - mean) / sqrt(var + epsilon) * scale + bias`` with scalar
    statistics and parameters: one channel's plane of per-channel inference (as
    :func:`normkernels.batch_normalization`)."""
    _check(x, out, 0, 0)
    dtype = x.dtype
    p = np.empty(4, dtype)
    p[0], p[1], p[2], p[3] = scale, bias, mean, var
    inference.normalize_planes_serial(x, out, 1, x.size, p[0:1], p[1:2], p[2:3], p[3:4],
                                      epsilon, False, None, NONE)


@njit(**_OPTIONS)
def moments(x):
    """``(mean, variance)`` of the 1-D span ``x`` in float64 (population variance), as
    the per-channel statistics compute them."""
    if x.ndim != 1:
        raise ValueError("x must be 1-D")
    if x.size == 0:
        return np.nan, np.nan
    return rows.row_statistics(x, 0, x.size, True)

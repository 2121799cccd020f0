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
    in float64.

    Parameters
    ----------
    x : ndarray
        The row: 1-D, C-contiguous, float32 or float64.
    scale, bias : ndarray
        Of x's size and dtype.
    epsilon : float
        Added to the variance.
    out : ndarray
        Written: Y, of x's size and dtype (it may be ``x`` itself).

    Returns
    -------
    mean, inv_std : float
        The row's mean and ``1 / sqrt(var + epsilon)``, float64.

    Raises
    ------
    ValueError
        ``x`` or ``out`` not 1-D, or of different sizes; ``scale`` or ``bias`` not of x's
        size.

    Examples
    --------
    >>> from normkernels.numba import layer_norm_row
    >>> x = np.arange(4, dtype=np.float32)
    >>> out = np.empty_like(x)
    >>> mean, inv_std = layer_norm_row(x, np.ones(4, np.float32), np.zeros(4, np.float32),
    ...                                1e-5, out)
    >>> out
    array([-1.3416, -0.4472,  0.4472,  1.3416], dtype=float32)
    >>> round(mean, 4), round(inv_std, 4)
    (1.5, 0.8944)
    >>> X = x.reshape(1, 4)
    >>> np.array_equal(out, normkernels.layer_normalization(X, np.ones(4, np.float32),
    ...                                                    np.zeros(4, np.float32))[0])
    True
    """
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
    :func:`normkernels.rms_normalization`); returns ``inv_std`` in float64.

    Parameters
    ----------
    x : ndarray
        The row: 1-D, C-contiguous, float32 or float64.
    scale : ndarray
        Of x's size and dtype.
    epsilon : float
        Added to the mean square.
    out : ndarray
        Written: Y, of x's size and dtype (it may be ``x`` itself).

    Returns
    -------
    float
        ``1 / sqrt(mean(x**2) + epsilon)``, float64.

    Raises
    ------
    ValueError
        ``x`` or ``out`` not 1-D, or of different sizes; ``scale`` not of x's size.

    Examples
    --------
    >>> from normkernels.numba import rms_norm_row
    >>> x = np.arange(4, dtype=np.float32)
    >>> out = np.empty_like(x)
    >>> round(rms_norm_row(x, np.full(4, 2.0, np.float32), 1e-5, out), 4)
    0.5345
    >>> out
    array([0.    , 1.069 , 2.1381, 3.2071], dtype=float32)
    >>> want = normkernels.rms_normalization(x.reshape(1, 4), np.full(4, 2.0, np.float32))
    >>> np.array_equal(out, want[0])
    True
    """
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
    :func:`normkernels.batch_normalization`).

    Parameters
    ----------
    x : ndarray
        The plane: 1-D, C-contiguous, float32 or float64.
    mean, var : float
        The channel's statistics.
    scale, bias : float
        The channel's parameters.
    epsilon : float
        Added to the variance.
    out : ndarray
        Written: Y, of x's size and dtype (it may be ``x`` itself).

    Raises
    ------
    ValueError
        ``x`` or ``out`` not 1-D, or of different sizes.

    Examples
    --------
    >>> from normkernels.numba import normalize_plane
    >>> x = np.arange(4, dtype=np.float32)
    >>> out = np.empty_like(x)
    >>> normalize_plane(x, 1.5, 1.25, 2.0, 0.5, 1e-5, out)
    >>> out
    array([-2.1833, -0.3944,  1.3944,  3.1833], dtype=float32)
    >>> np.allclose(out, (x - 1.5) / np.sqrt(1.25 + 1e-5) * 2.0 + 0.5)
    True
    """
    _check(x, out, 0, 0)
    dtype = x.dtype
    p = np.empty(4, dtype)
    p[0], p[1], p[2], p[3] = scale, bias, mean, var
    inference.normalize_planes_serial(x, out, 1, x.size, p[0:1], p[1:2], p[2:3], p[3:4],
                                      epsilon, False, None, NONE)


@njit(**_OPTIONS)
def moments(x):
    """``(mean, variance)`` of the 1-D span ``x`` in float64 (population variance), as
    the per-channel statistics compute them.

    Parameters
    ----------
    x : ndarray
        1-D, float32 or float64.

    Returns
    -------
    mean, var : float
        float64; NaN for an empty ``x``.

    Raises
    ------
    ValueError
        ``x`` is not 1-D.

    Examples
    --------
    >>> from normkernels.numba import moments
    >>> moments(np.arange(4, dtype=np.float32))
    (1.5, 1.25)
    >>> moments(np.array([0.1, 0.2, 0.4]))[0]
    0.2333...
    """
    if x.ndim != 1:
        raise ValueError("x must be 1-D")
    if x.size == 0:
        return np.nan, np.nan
    return rows.row_statistics(x, 0, x.size, True)

"""Independent float64 oracles, written from the specs in ../shared/specs.

Nothing here imports normkernels: these are the statements the kernels are checked
against. Tolerances are derived from the compute dtype's rounding (see ``tolerance``).
"""

import ml_dtypes
import numpy as np

BFLOAT16 = np.dtype(ml_dtypes.bfloat16)


def channel_shape(X, data_format):
    """Shape that broadcasts a length-C vector along X's channel axis."""
    if X.ndim == 1:
        return (1,)
    shape = [1] * X.ndim
    shape[1 if data_format == "NCX" else -1] = -1
    return tuple(shape)


def batch_norm(X, scale, B, mean, var, epsilon, data_format="NCX"):
    """ONNX BatchNormalization inference / oneDNN BatchNormInference in float64:
    ``Y = (X - mean) / sqrt(var + epsilon) * scale + B``."""
    shape = channel_shape(X, data_format)
    f = lambda v: np.asarray(v, dtype=np.float64).reshape(shape)  # noqa: E731
    x = np.asarray(X).astype(np.float64)
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        return (x - f(mean)) / np.sqrt(f(var) + epsilon) * f(scale) + f(B)


# (significand bits, smallest normal exponent) of each float dtype
_FORMATS = {
    np.dtype(np.float16): (10, -14),
    BFLOAT16: (7, -126),
    np.dtype(np.float32): (23, -126),
    np.dtype(np.float64): (52, -1022),
}


def ulp(values, dtype):
    """Spacing of ``dtype`` at each of ``values`` (float64 array)."""
    bits, emin = _FORMATS[np.dtype(dtype)]
    mag = np.abs(np.asarray(values, dtype=np.float64))
    with np.errstate(divide="ignore"):
        exp = np.floor(np.log2(np.where(mag > 0, mag, 1.0)))
    return np.exp2(np.maximum(exp, emin) - bits)


def tolerance(X, scale, B, mean, var, epsilon, data_format, out_dtype, mean_rounded):
    """Allowed |Y - oracle| per element.

    The kernel computes ``(x - m) * a + b`` in the compute dtype (float64 for float64
    X, else float32) with ``a`` and ``m`` and ``b`` rounded once to it: a few units of
    rounding relative to the magnitudes of the terms, plus (``mean_rounded``) the
    rounding of a mean wider than the compute dtype. 16-bit outputs then add one
    rounding to their format: at most 1 ulp of the output dtype.
    """
    compute = np.float64 if np.dtype(out_dtype) == np.float64 else np.float32
    eps = np.finfo(compute).eps
    shape = channel_shape(X, data_format)
    f = lambda v: np.abs(np.asarray(v, dtype=np.float64).reshape(shape))  # noqa: E731
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        a = f(scale) / np.sqrt(np.asarray(var, dtype=np.float64).reshape(shape) + epsilon)
        x = np.asarray(X).astype(np.float64)
        terms = np.abs(x - np.asarray(mean, np.float64).reshape(shape)) * a + f(B)
        if mean_rounded:
            terms = terms + f(mean) * a
        tol = 4 * eps * terms
        if np.dtype(out_dtype).itemsize == 2:
            exact = batch_norm(X, scale, B, mean, var, epsilon, data_format)
            tol = tol + ulp(np.abs(exact) + tol, out_dtype)
    return tol


def batch_statistics(X, data_format="NCX"):
    """Per-channel batch mean and population variance in float64, from a channel-major
    copy (NumPy sums pairwise only along the contiguous axis; summing over outer axes
    is sequential and was measured 1e-12 off on mean 1e4 / std 1 data)."""
    x = np.asarray(X).astype(np.float64)
    if x.ndim == 1:
        x = x.reshape(-1, 1)
    axis = 1 if data_format == "NCX" else x.ndim - 1
    per_channel = np.ascontiguousarray(np.moveaxis(x, axis, 0)).reshape(x.shape[axis], -1)
    with np.errstate(invalid="ignore"):
        mean = per_channel.mean(axis=1)
        dev = per_channel - mean[:, None]
        # corrected two-pass: the second term removes the rounding of the mean
        var = (dev * dev).mean(axis=1) - dev.mean(axis=1) ** 2
    return mean, var


def batch_norm_training(X, scale, B, input_mean, input_var, epsilon, momentum,
                        data_format="NCX"):
    """ONNX BatchNormalization training mode in float64: Y normalized with the batch
    statistics, running statistics ``input * momentum + batch * (1 - momentum)``."""
    mean, var = batch_statistics(X, data_format)
    Y = batch_norm(X, scale, B, mean, var, epsilon, data_format)
    f = lambda v: np.asarray(v, dtype=np.float64)  # noqa: E731
    running_mean = f(input_mean) * momentum + mean * (1 - momentum)
    running_var = f(input_var) * momentum + var * (1 - momentum)
    return Y, running_mean, running_var, mean, var


def instance_statistics(X, data_format="NCX"):
    """Mean and population variance of every (n, c) over the spatial axes, float64,
    shaped to broadcast against X (keepdims). Corrected two-pass from a contiguous
    per-(n, c) copy, as :func:`batch_statistics`."""
    x = np.asarray(X).astype(np.float64)
    if data_format == "NXC":
        x = np.moveaxis(x, -1, 1)
    N, C = x.shape[:2]
    planes = np.ascontiguousarray(x).reshape(N, C, -1)
    with np.errstate(invalid="ignore"):
        mean = planes.mean(axis=2, keepdims=True)
        dev = planes - mean
        var = (dev * dev).mean(axis=2, keepdims=True) - dev.mean(axis=2, keepdims=True) ** 2
    shape = (N, C) + (1,) * (x.ndim - 2)
    mean, var = mean.reshape(shape), var.reshape(shape)
    if data_format == "NXC":
        mean, var = np.moveaxis(mean, 1, -1), np.moveaxis(var, 1, -1)
    return mean, var


def instance_norm(X, scale, B, epsilon, data_format="NCX"):
    """ONNX InstanceNormalization in float64:
    ``y = scale * (x - mean) / sqrt(var + epsilon) + B`` per (n, c)."""
    mean, var = instance_statistics(X, data_format)
    shape = channel_shape(X, data_format)
    f = lambda v: np.asarray(v, dtype=np.float64).reshape(shape)  # noqa: E731
    x = np.asarray(X).astype(np.float64)
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        return f(scale) * (x - mean) / np.sqrt(var + epsilon) + f(B), mean, var


def instance_tolerance(X, scale, B, mean, var, epsilon, data_format, out_dtype):
    """Allowed |Y - oracle| for instance normalization: the rounding model of
    :func:`tolerance` with per-(n, c) statistics (``mean``, ``var`` broadcastable, as
    :func:`instance_statistics` gives them). The mean is rounded to the compute dtype
    and the residual folded into b, so b grows by up to ulp(mean) * a; plus 16 float64
    ulp for the float64 accumulation of the statistics."""
    compute = np.float64 if np.dtype(out_dtype) == np.float64 else np.float32
    eps = np.finfo(compute).eps
    shape = channel_shape(X, data_format)
    f = lambda v: np.abs(np.asarray(v, dtype=np.float64).reshape(shape))  # noqa: E731
    x = np.asarray(X).astype(np.float64)
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        a = f(scale) / np.sqrt(var + epsilon)
        terms = (np.abs(x - mean) + ulp(mean, compute)) * a + f(B)
        tol = 4 * eps * terms + 16 * np.finfo(np.float64).eps * (terms + np.abs(mean) * a)
        if np.dtype(out_dtype).itemsize == 2:
            signed = lambda v: np.asarray(v, dtype=np.float64).reshape(shape)  # noqa: E731
            exact = signed(scale) * (x - mean) / np.sqrt(var + epsilon) + signed(B)
            tol = tol + ulp(np.abs(exact) + tol, out_dtype)
    return tol

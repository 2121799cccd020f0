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

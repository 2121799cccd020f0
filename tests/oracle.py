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

"""How each tensor dtype is stored for, and computed in, the kernels.

NumPy and ml_dtypes only (no Numba): the spec layer, the engine, the kernels' callers
and the tools all take their dtypes from here.
"""

import ml_dtypes
import numpy as np

FLOAT16 = np.dtype(np.float16)
BFLOAT16 = np.dtype(ml_dtypes.bfloat16)
FLOAT32 = np.dtype(np.float32)
FLOAT64 = np.dtype(np.float64)

# dtype -> the dtype Numba sees. 16-bit floats travel as integers of the same width;
# the two 16-bit formats use different integer types so that Numba specialises the
# element conversions (normkernels.kernels.elements) on the type alone.
STORAGE_DTYPE = {
    FLOAT16: np.dtype(np.uint16),
    BFLOAT16: np.dtype(np.int16),
    FLOAT32: FLOAT32,
    FLOAT64: FLOAT64,
}


def compute_dtype(dtype):
    """Arithmetic dtype of the kernels for tensors of ``dtype``: float64 for float64,
    float32 for everything else (float16 and bfloat16 widen exactly to float32)."""
    return FLOAT64 if dtype == FLOAT64 else FLOAT32


def storage_view(arr):
    """``arr`` viewed as its storage dtype (no copy)."""
    dtype = arr.dtype
    if dtype == FLOAT32 or dtype == FLOAT64:
        return arr
    return arr.view(STORAGE_DTYPE[dtype])


def row_compute_dtype(dtype):
    """Arithmetic dtype of the row normalization kernels: float32 for 16-bit tensors,
    float64 otherwise (float32 rows are normalized in float64 and rounded once: the
    float32 chain of the per-channel kernels reached 2.3 ulp)."""
    return FLOAT32 if dtype.itemsize == 2 else FLOAT64

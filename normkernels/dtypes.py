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
    """``arr`` viewed as its storage dtype (no copy), writeable: what every kernel is
    compiled for.

    Numba types an array by its flags too, so a read-only input (``np.frombuffer``,
    a memory map, ``np.broadcast_to``, an ONNX initializer) would compile every kernel
    it reaches a second time, seconds into a server's life, and take Numba's slow
    dispatch on every call. The kernels never write their inputs: a read-only array
    is handed to them as a writeable array over the same memory (:class:`_Memory`),
    or, when small and contiguous, as a copy, so one specialization serves both."""
    if arr.itemsize == 2:  # one attribute, not two dtype comparisons (per-call cost)
        storage = STORAGE_DTYPE.get(arr.dtype)
        if storage is not None:
            arr = arr.view(storage)
    flags = arr.flags
    if flags.writeable:
        return arr
    if flags.c_contiguous and arr.nbytes <= SMALL_COPY_BYTES:
        return arr.copy()  # a parameter vector: copying it costs less than the alias
    return np.asarray(_Memory(arr))


def storage_alias(arr):
    """:func:`storage_view` that never copies: for a bound call, which must read the
    array's memory at every call (a copy would keep the contents of binding time)."""
    if arr.itemsize == 2:
        storage = STORAGE_DTYPE.get(arr.dtype)
        if storage is not None:
            arr = arr.view(storage)
    return arr if arr.flags.writeable else np.asarray(_Memory(arr))


# Read-only arrays up to this size reach the kernels as copies (0.2-0.5 us, measured
# on 64 B to 64 KB) rather than as writeable aliases (about 2.7 us to build).
SMALL_COPY_BYTES = 1 << 16


class _Memory:
    """A read-only array's memory offered to NumPy as writeable (the kernels read it
    only; outputs are checked writeable before they get here). It keeps the array
    alive as long as the view of it lives."""

    __slots__ = ("__array_interface__", "array")

    def __init__(self, arr):
        self.array = arr
        interface = dict(arr.__array_interface__)
        interface["data"] = (interface["data"][0], False)
        self.__array_interface__ = interface


def row_compute_dtype(dtype):
    """Dtype of the row normalization kernels' row scalars and skip sums: float32 for
    16-bit tensors, float64 otherwise (float32 rows then normalize in float32 lanes
    with FMA, or float64 lanes without it: :mod:`normkernels.kernels.row_vectors`)."""
    return FLOAT32 if dtype.itemsize == 2 else FLOAT64


def round_once(values, dtype):
    """float64 ``values`` rounded once (to nearest even) to ``dtype``: 16-bit dtypes
    through float32 by round-to-odd, which makes the two roundings one (ml_dtypes
    rounds float64 to bfloat16 through float32 twice: 1 + 2**-8 + 2**-40 gives 1); the
    rule of :func:`normkernels.kernels.lp.store_rounded`, and of every float64 result the
    spec layer rounds to a narrower dtype."""
    if dtype == FLOAT64:
        return values
    with np.errstate(all="ignore"):
        f = values.astype(np.float32)
        if dtype.itemsize == 4:
            return f
        back = f.astype(np.float64)
        bits = f.view(np.int32)
        step = np.where(np.abs(values) > np.abs(back), 1, -1).astype(np.int32)
        odd = (back != values) & ~np.isnan(values) & ((bits & 1) == 0)
        return np.where(odd, bits + step, bits).astype(np.int32).view(np.float32).astype(dtype)

"""Element loads and stores for every storage dtype, usable inside ``@njit`` code.

Numba cannot type ``np.float16`` or ``ml_dtypes.bfloat16`` arrays, so 16-bit tensors
reach the kernels as integer views (see :mod:`normkernels.kernels.storage`):

=========  ============  ==============
dtype      storage view  compute dtype
=========  ============  ==============
float16    uint16        float32
bfloat16   int16         float32
float32    float32       float32
float64    float64       float64
=========  ============  ==============

``load(arr, i)`` returns element ``i`` widened to the compute dtype and
``store(arr, i, v)`` narrows ``v`` (round to nearest even) into element ``i``. Kernels
are written once against these two functions and Numba specialises them per storage
dtype, so one kernel source serves all four dtypes. The kernels' scalar work (heads
and tails of vector loops, short planes) goes through these; the 64-byte vector
bodies in :mod:`normkernels.kernels.vectors` reuse the IR builders below.

Conversions, and why they look like this (measurements in docs/design.md):

* float16 goes through LLVM's ``half`` type (``fpext``/``fptrunc``): the x86 backend
  emits ``vcvtph2ps``/``vcvtps2ph`` (F16C), exact widening and correctly rounded
  narrowing.
* bfloat16 is done on the bits. Widening is exact (``bits << 16``). Narrowing rounds to
  nearest even on the float32 bits and keeps NaN a (quiet) NaN. LLVM's own ``bfloat``
  truncation (``vcvtneps2bf16``) flushes float32 subnormals to zero, so it is used only
  in the vector bodies, behind a check that sends subnormal lanes here.
"""

import numpy as np
from llvmlite import ir
from numba import types
from numba.core.extending import intrinsic, overload

_I16 = ir.IntType(16)
_I32 = ir.IntType(32)
_F32 = ir.FloatType()


def _splat(value, like):
    """``value`` as a constant of ``like``'s type (a scalar or a vector of it)."""
    if isinstance(like, ir.VectorType):
        return ir.Constant(like, [ir.Constant(like.element, value)] * like.count)
    return ir.Constant(like, value)


def _vec(elem, count):
    return elem if count == 1 else ir.VectorType(elem, count)


# LLVM IR builders shared by the scalar intrinsics here and the vector intrinsics in
# vectors.py. ``count`` is 1 for a scalar, else the vector length.


def widen_f16(builder, bits, count=1):
    """uint16 bits (scalar or vector) -> float32, exact."""
    return builder.fpext(builder.bitcast(bits, _vec(ir.HalfType(), count)), _vec(_F32, count))


def narrow_f16(builder, value, count=1):
    """float32 -> float16 bits, round to nearest even (IEEE fptrunc)."""
    return builder.bitcast(builder.fptrunc(value, _vec(ir.HalfType(), count)), _vec(_I16, count))


def widen_bf16(builder, bits, count=1):
    """int16 bfloat16 bits -> float32, exact: the bits are the float32's high half."""
    wide = builder.zext(bits, _vec(_I32, count))
    return builder.bitcast(builder.shl(wide, _splat(16, wide.type)), _vec(_F32, count))


def narrow_bf16(builder, value, count=1):
    """float32 -> bfloat16 bits, round to nearest even; NaN stays a quiet NaN."""
    bits = builder.bitcast(value, _vec(_I32, count))
    high = builder.lshr(bits, _splat(16, bits.type))
    lsb = builder.and_(high, _splat(1, bits.type))
    bias = builder.add(lsb, _splat(0x7FFF, bits.type))
    rounded = builder.lshr(builder.add(bits, bias), _splat(16, bits.type))
    quiet_nan = builder.or_(high, _splat(0x40, bits.type))
    is_nan = builder.fcmp_unordered("uno", value, value)
    return builder.trunc(builder.select(is_nan, quiet_nan, rounded), _vec(_I16, count))


def _scalar_conversion(source, target, build):
    """A Numba intrinsic converting one ``source`` scalar to ``target`` with
    ``build(builder, value)``."""

    def typer(typingctx, value):
        if value != source:
            return None

        def codegen(context, builder, sig, args):
            return build(builder, args[0])

        return target(source), codegen

    return intrinsic(typer)


f16_to_f32 = _scalar_conversion(types.uint16, types.float32, widen_f16)
f32_to_f16 = _scalar_conversion(types.float32, types.uint16, narrow_f16)
bf16_to_f32 = _scalar_conversion(types.int16, types.float32, widen_bf16)
f32_to_bf16 = _scalar_conversion(types.float32, types.int16, narrow_bf16)


def load(arr, i):
    """Element ``i`` of a storage array, in the compute dtype (pure-Python stub)."""
    raise NotImplementedError("load is only callable from @njit code")


def store(arr, i, value):
    """Write compute-dtype ``value`` into element ``i`` of a storage array (stub)."""
    raise NotImplementedError("store is only callable from @njit code")


@overload(load, inline="always")
def _load_impl(arr, i):
    dtype = arr.dtype
    if dtype == types.uint16:
        return lambda arr, i: f16_to_f32(arr[i])
    if dtype == types.int16:
        return lambda arr, i: bf16_to_f32(arr[i])
    if dtype in (types.float32, types.float64):
        return lambda arr, i: arr[i]
    return None


@overload(store, inline="always")
def _store_impl(arr, i, value):
    dtype = arr.dtype
    if dtype == types.uint16:

        def impl(arr, i, value):
            arr[i] = f32_to_f16(value)

        return impl
    if dtype == types.int16:

        def impl(arr, i, value):
            arr[i] = f32_to_bf16(value)

        return impl
    if dtype in (types.float32, types.float64):

        def impl(arr, i, value):
            arr[i] = value

        return impl
    return None


def compute_empty(arr, n):
    """A new array of ``n`` elements in the compute dtype of storage array ``arr``
    (float64 for float64 storage, else float32); callable from ``@njit`` code only."""
    raise NotImplementedError("compute_empty is only callable from @njit code")


@overload(compute_empty, inline="always")
def _compute_empty_impl(arr, n):
    if arr.dtype == types.float64:
        return lambda arr, n: np.empty(n, np.float64)
    return lambda arr, n: np.empty(n, np.float32)


def item_bytes(arr):
    """``arr.itemsize`` as a compile-time constant (``arr.itemsize`` is read at run
    time, and dividing by it is an integer division on every use); callable from
    ``@njit`` code only."""
    raise NotImplementedError("item_bytes is only callable from @njit code")


@overload(item_bytes, inline="always")
def _item_bytes_impl(arr):
    size = arr.dtype.bitwidth // 8
    return lambda arr: size


def row_compute_empty(arr, n):
    """A new array of ``n`` elements in the row kernels' compute dtype for storage
    array ``arr``: float32 for 16-bit storage, float64 otherwise (float32 rows are
    normalized in float64: Y is then rounded once); ``@njit`` code only."""
    raise NotImplementedError("row_compute_empty is only callable from @njit code")


@overload(row_compute_empty, inline="always")
def _row_compute_empty_impl(arr, n):
    if arr.dtype.bitwidth == 16:
        return lambda arr, n: np.empty(n, np.float32)
    return lambda arr, n: np.empty(n, np.float64)


def row_load(arr, i):
    """Element ``i`` widened to the row kernels' compute dtype (see
    :func:`row_compute_empty`); ``@njit`` code only."""
    raise NotImplementedError("row_load is only callable from @njit code")


@overload(row_load, inline="always")
def _row_load_impl(arr, i):
    if arr.dtype.bitwidth == 16:
        return lambda arr, i: load(arr, i)
    return lambda arr, i: np.float64(arr[i])

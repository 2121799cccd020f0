"""Element loads and stores for every storage dtype, usable inside ``@njit`` code.

Numba cannot type ``np.float16`` or ``ml_dtypes.bfloat16`` arrays, so 16-bit tensors
reach the kernels as integer views (see :mod:`normkernels.dtypes`):

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

Conversions, and why they look like this (measurements in docs/design.md). Each is
decided when a kernel compiles, from what Numba's target CPU has
(:mod:`normkernels.kernels.target`): LLVM lowers a conversion the target has no
instruction for to a compiler-rt call that Numba's JIT cannot link, which aborts the
process. Every path gives the same bits on every target:

* float16 goes through LLVM's ``half`` type (``fpext``/``fptrunc``) where the target
  has the instructions (x86 F16C ``vcvtph2ps``/``vcvtps2ph``, aarch64 ``fcvt``), and
  otherwise through integer operations on the bits that give the same results
  (:func:`widen_f16_bits`, :func:`narrow_f16_bits`): exact widening, narrowing rounded
  to nearest even, overflow to infinity, subnormals exact, a NaN made quiet with its
  payload's high bits kept (as the instructions do).
* bfloat16 is done on the bits. Widening is exact (``bits << 16``). Narrowing rounds to
  nearest even on the float32 bits and keeps NaN a (quiet) NaN. LLVM's own ``bfloat``
  truncation (``vcvtneps2bf16``, on targets with AVX512-BF16 only) flushes float32
  subnormals to zero, so it is used only in the vector bodies, behind a check that
  sends subnormal lanes here.
"""

import numpy as np
from llvmlite import ir
from numba import types
from numba.core.extending import intrinsic, overload

from normkernels.kernels.target import jit_target

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
    """uint16 float16 bits (scalar or vector) -> float32, exact."""
    if not jit_target().f16_native:
        return widen_f16_bits(builder, bits, count)
    return builder.fpext(builder.bitcast(bits, _vec(ir.HalfType(), count)), _vec(_F32, count))


def narrow_f16(builder, value, count=1):
    """float32 -> float16 bits, round to nearest even (IEEE fptrunc)."""
    if not jit_target().f16_native:
        return narrow_f16_bits(builder, value, count)
    return builder.bitcast(builder.fptrunc(value, _vec(ir.HalfType(), count)), _vec(_I16, count))


def widen_f16_bits(builder, bits, count=1):
    """:func:`widen_f16` by integer operations, for targets without half instructions.

    Normal numbers move the exponent and fraction 13 bits up and rebias the exponent
    (15 -> 127); zero and subnormals are ``magnitude * 2**-24``, exact in float32;
    infinities and NaNs get the float32 all-ones exponent, a NaN made quiet (bit 22)
    as ``vcvtph2ps`` and ``fcvt`` do. Three selects, so it vectorises.
    """
    i32 = _vec(_I32, count)
    h = builder.zext(bits, i32)
    magnitude = builder.and_(h, _splat(0x7FFF, i32))
    sign = builder.shl(builder.and_(h, _splat(0x8000, i32)), _splat(16, i32))
    exponent = builder.and_(h, _splat(0x7C00, i32))
    moved = builder.shl(magnitude, _splat(13, i32))
    normal = builder.add(moved, _splat((127 - 15) << 23, i32))
    is_nan = builder.icmp_unsigned(">", magnitude, _splat(0x7C00, i32))
    special = builder.or_(builder.add(moved, _splat((255 - 31) << 23, i32)),
                          builder.select(is_nan, _splat(0x400000, i32), _splat(0, i32)))
    tiny = builder.fmul(builder.sitofp(magnitude, _vec(_F32, count)),
                        _splat(2.0**-24, _vec(_F32, count)))
    tiny = builder.bitcast(tiny, i32)
    is_special = builder.icmp_unsigned("==", exponent, _splat(0x7C00, i32))
    is_tiny = builder.icmp_unsigned("==", exponent, _splat(0, i32))
    bits32 = builder.select(is_special, special, builder.select(is_tiny, tiny, normal))
    return builder.bitcast(builder.or_(bits32, sign), _vec(_F32, count))


def narrow_f16_bits(builder, value, count=1):
    """:func:`narrow_f16` by integer operations, for targets without half instructions.

    On the float32 magnitude ``a``: normal results rebias the exponent (127 -> 15) and
    round the 13 dropped bits to nearest even with the add ``0xfff + lsb`` (a carry
    runs into the exponent, up to infinity); results below 2**-14 come from the float
    add ``a + 0.5``, whose ulp (2**-24) is the float16 subnormal step, so the FPU
    rounds them to nearest even; ``a >= 65520`` (the halfway point past the largest
    float16) is infinity; a NaN keeps its high payload bits with the quiet bit set,
    as ``vcvtps2ph`` and ``fcvt`` do. The sign is put back last.
    """
    i32 = _vec(_I32, count)
    u = builder.bitcast(value, i32)
    a = builder.and_(u, _splat(0x7FFFFFFF, i32))
    sign = builder.and_(builder.lshr(u, _splat(16, i32)), _splat(0x8000, i32))
    lsb = builder.and_(builder.lshr(a, _splat(13, i32)), _splat(1, i32))
    rebiased = builder.add(a, _splat(((15 - 127) << 23) + 0xFFF, i32))
    normal = builder.lshr(builder.add(rebiased, lsb), _splat(13, i32))
    half = _splat(0.5, _vec(_F32, count))
    tiny = builder.fadd(builder.bitcast(a, _vec(_F32, count)), half)
    tiny = builder.sub(builder.bitcast(tiny, i32), _splat(0x3F000000, i32))
    nan = builder.or_(builder.and_(builder.lshr(a, _splat(13, i32)), _splat(0x3FF, i32)),
                      _splat(0x7E00, i32))
    is_nan = builder.icmp_unsigned(">", a, _splat(0x7F800000, i32))
    is_inf = builder.icmp_unsigned(">=", a, _splat(0x477FF000, i32))
    is_tiny = builder.icmp_unsigned("<", a, _splat(0x38800000, i32))
    finite = builder.select(is_tiny, tiny, normal)
    magnitude = builder.select(is_nan, nan, builder.select(is_inf, _splat(0x7C00, i32), finite))
    return builder.trunc(builder.or_(magnitude, sign), _vec(_I16, count))


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


def round_to_storage(arr, value):
    """Row-compute-dtype ``value`` rounded to the dtype storage array ``arr`` holds
    (to nearest even), returned in the row compute dtype; ``@njit`` code only."""
    raise NotImplementedError("round_to_storage is only callable from @njit code")


@overload(round_to_storage, inline="always")
def _round_to_storage_impl(arr, value):
    if arr.dtype == types.uint16:
        return lambda arr, value: f16_to_f32(f32_to_f16(value))
    if arr.dtype == types.int16:
        return lambda arr, value: bf16_to_f32(f32_to_bf16(value))
    if arr.dtype == types.float32:
        return lambda arr, value: np.float64(np.float32(value))
    return lambda arr, value: value

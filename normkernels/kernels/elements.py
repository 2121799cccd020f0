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

import operator

from llvmlite import ir
from numba import types
from numba.core.extending import intrinsic

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


# The element helpers are intrinsics: Numba types an intrinsic with a Python call and
# emits its IR into the caller, where an ``@overload`` (inlined or not) ran a whole
# compile pipeline, LLVM included, for every signature it met (0.05-0.15 s each, a
# fifth of a first call). The element access is Numba's own getitem/setitem lowering,
# so the caller's IR, and its bits and speed, are what ``arr[i]`` gave.


def _storage_array(arr):
    return (isinstance(arr, types.Array) and arr.ndim == 1
            and arr.dtype in (types.uint16, types.int16, types.float32, types.float64))


def _get(context, builder, arrty, idxty, arr, i):
    """``arr[i]`` as Numba lowers it."""
    getitem = context.get_function(operator.getitem, arrty.dtype(arrty, idxty))
    return getitem(builder, (arr, i))


def _widen(context, builder, arrty, value):
    """A storage element in its compute dtype (16-bit -> float32, floats kept)."""
    if arrty.dtype == types.uint16:
        return widen_f16(builder, value)
    if arrty.dtype == types.int16:
        return widen_bf16(builder, value)
    return value


def _compute(arrty):
    return types.float64 if arrty.dtype == types.float64 else types.float32


def load_type(arr, i):
    """The type :func:`load` gives for these argument types (None: not a load)."""
    if not (_storage_array(arr) and isinstance(i, types.Integer)):
        return None
    return _compute(arr)


def load_codegen(context, builder, arrty, idxty, args):
    """The IR of :func:`load` (for intrinsics built on it)."""
    return _widen(context, builder, arrty, _get(context, builder, arrty, idxty, *args))


@intrinsic
def load(typingctx, arr, i):
    """Element ``i`` of a storage array, in the compute dtype."""
    compute = load_type(arr, i)
    if compute is None:
        return None

    def codegen(context, builder, sig, args):
        return load_codegen(context, builder, arr, i, args)

    return compute(arr, i), codegen


@intrinsic
def store(typingctx, arr, i, value):
    """Write compute-dtype ``value`` into element ``i`` of a storage array (16-bit:
    rounded to nearest even; float storage: Numba's cast, as ``arr[i] = value``)."""
    if not (_storage_array(arr) and isinstance(i, types.Integer)):
        return None
    narrow = {types.uint16: narrow_f16, types.int16: narrow_bf16}.get(arr.dtype)
    if narrow is not None and value != types.float32:
        return None
    if narrow is None and not isinstance(value, (types.Float, types.Integer)):
        return None

    def codegen(context, builder, sig, args):
        target, index, v = args
        # as Numba types ``arr[i] = v``: v cast to the array's dtype, then stored
        v = context.cast(builder, v, value, arr.dtype) if narrow is None else narrow(builder, v)
        setitem = context.get_function(operator.setitem, types.none(arr, i, arr.dtype))
        setitem(builder, (target, index, v))
        return context.get_dummy_value()

    return types.none(arr, i, value), codegen


@intrinsic
def item_bytes(typingctx, arr):
    """``arr.itemsize`` as a compile-time constant (``arr.itemsize`` is read at run
    time, and dividing by it is an integer division on every use)."""
    if not isinstance(arr, types.Array):
        return None
    size = arr.dtype.bitwidth // 8

    def codegen(context, builder, sig, args):
        return context.get_constant(types.intp, size)

    return types.intp(arr), codegen


def _empty(typingctx, arr, n, dtype):
    """``np.empty(n, dtype)`` (Numba's allocation, as ``np.empty`` lowers it: without
    compiling ``np.empty``'s overload and its helpers for each new signature)."""
    if not (isinstance(arr, types.Array) and isinstance(n, types.Integer)):
        return None
    result = types.Array(dtype, 1, "C")

    def codegen(context, builder, sig, args):
        from numba.np.arrayobj import _empty_nd_impl  # at compile time, not at import

        size = context.cast(builder, args[1], n, types.intp)
        return _empty_nd_impl(context, builder, result, [size])._getvalue()

    return result(arr, n), codegen


@intrinsic
def compute_empty(typingctx, arr, n):
    """A new array of ``n`` elements in the compute dtype of storage array ``arr``
    (float64 for float64 storage, else float32)."""
    return _empty(typingctx, arr, n, types.float64 if getattr(arr, "dtype", None) ==
                  types.float64 else types.float32)


@intrinsic
def row_compute_empty(typingctx, arr, n):
    """A new array of ``n`` elements in the row kernels' compute dtype for storage
    array ``arr``: float32 for 16-bit storage, float64 otherwise (the row scalars:
    float32 rows split them into float32 lanes' scalars, ``row_vectors``)."""
    bits = getattr(getattr(arr, "dtype", None), "bitwidth", 0)
    return _empty(typingctx, arr, n, types.float32 if bits == 16 else types.float64)


@intrinsic
def row_table_empty(typingctx, arr, n):
    """A new array of ``n`` elements in the row kernels' column-table dtype for storage
    array ``arr``: float64 for float64 storage, else float32 (float32 rows are
    normalized in float32 lanes: :mod:`normkernels.kernels.row_vectors`)."""
    return _empty(typingctx, arr, n, types.float64 if getattr(arr, "dtype", None) ==
                  types.float64 else types.float32)


@intrinsic
def row_load(typingctx, arr, i):
    """Element ``i`` widened to the row kernels' compute dtype (see
    :func:`row_compute_empty`)."""
    if not (_storage_array(arr) and isinstance(i, types.Integer)):
        return None
    compute = types.float32 if arr.dtype.bitwidth == 16 else types.float64

    def codegen(context, builder, sig, args):
        value = _widen(context, builder, arr, _get(context, builder, arr, i, *args))
        return context.cast(builder, value, _compute(arr), compute)

    return compute(arr, i), codegen


def rounding(arr, value):
    """``(type, build)`` of rounding ``value`` (the row compute dtype) to ``arr``'s
    storage dtype and back, ``build(context, builder, v)`` giving its IR; None when
    the types do not fit (16-bit storage takes a float32 value)."""
    if not isinstance(arr, types.Array):
        return None
    if arr.dtype in (types.uint16, types.int16):
        if value != types.float32:
            return None
        narrow, widen = ((narrow_f16, widen_f16) if arr.dtype == types.uint16
                         else (narrow_bf16, widen_bf16))
        return types.float32, lambda context, builder, v: widen(builder, narrow(builder, v))
    if not isinstance(value, types.Float):
        return None
    if arr.dtype == types.float32:

        def build(context, builder, v):
            rounded = context.cast(builder, v, value, types.float32)
            return context.cast(builder, rounded, types.float32, types.float64)

        return types.float64, build
    return value, lambda context, builder, v: v


@intrinsic
def round_to_storage(typingctx, arr, value):
    """Row-compute-dtype ``value`` rounded to the dtype storage array ``arr`` holds
    (to nearest even), returned in the row compute dtype."""
    found = rounding(arr, value)
    if found is None:
        return None
    result, build = found

    def codegen(context, builder, sig, args):
        return build(context, builder, args[1])

    return result(arr, value), codegen

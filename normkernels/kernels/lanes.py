"""Fixed-width lane vectors: reductions whose bits do not depend on the CPU.

A sum that LLVM vectorises itself (fast-math ``reassoc``) is split into as many
partial sums as the target's vector width and unroll choice make, and ``contract``
fuses a multiply and an add only where the target has FMA: the same kernel then
gives other bits on an SSE2, an AVX2 or an AVX-512 machine. The reductions here fix
the order in the source instead. A :class:`Lanes` value is an LLVM vector of
``count`` lanes (16 float64 or 32 float32: 64 or 128 bytes); each lane is summed in
order, with separate multiplies and adds, and the lanes are joined by a fixed
pairwise tree. LLVM maps a vector of any width onto the registers the target has
(two zmm, four ymm or eight xmm for 16 float64) without changing what any lane
computes, so every target gives the same bits, and the kernels need no fast-math.

Use, inside ``@njit`` code::

    acc = zeros(shift)                      # lanes of shift's dtype
    for i in range(0, n - LANES64 + 1, LANES64):   # LANES32 for float32 shift
        d = deviations(x, i, shift)         # widen(x[i:i+count]) - shift
        acc = acc + d
        acc2 = acc2 + d * d
    total = lane_sum(acc)                   # then the tail, in order
"""

import operator

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.core import cgutils
from numba.core.extending import intrinsic, models, register_model
from numba.core.imputils import lower_builtin
from numba.core.typing.templates import AbstractTemplate, infer_global, signature

import normkernels.kernels.cache  # noqa: F401  (registers the cache locators before any @njit)
from normkernels.kernels.elements import load, load_codegen, load_type
from normkernels.kernels.options import INLINE_OPTIONS
from normkernels.kernels.vectors import storage_codec

LANES64 = 16  # float64 lanes of one accumulator (128 bytes)
LANES32 = 32  # float32 lanes of one accumulator (128 bytes)

_F32 = ir.FloatType()
_F64 = ir.DoubleType()


class Lanes(types.Type):
    """``count`` lanes of ``dtype`` (float32 or float64), one LLVM vector."""

    def __init__(self, dtype):
        self.dtype = dtype
        self.count = LANES64 if dtype == types.float64 else LANES32
        super().__init__(name=f"Lanes({dtype} x {self.count})")


@register_model(Lanes)
class _LanesModel(models.PrimitiveModel):
    def __init__(self, dmm, fe_type):
        element = _F64 if fe_type.dtype == types.float64 else _F32
        super().__init__(dmm, fe_type, ir.VectorType(element, fe_type.count))


def _compute(shift):
    return shift if shift in (types.float32, types.float64) else None


def _broadcast(builder, scalar, count):
    vty = ir.VectorType(scalar.type, count)
    first = builder.insert_element(ir.Constant(vty, ir.Undefined), scalar,
                                   ir.Constant(ir.IntType(32), 0))
    return builder.shuffle_vector(first, ir.Constant(vty, ir.Undefined),
                                  ir.Constant(ir.VectorType(ir.IntType(32), count), [0] * count))


@intrinsic
def zeros(typingctx, like):
    """Lanes of zeros in ``like``'s dtype (float32 or float64)."""
    if _compute(like) is None:
        return None
    lanes = Lanes(like)

    def codegen(context, builder, sig, args):
        vty = context.get_value_type(lanes)
        return ir.Constant(vty, [ir.Constant(vty.element, 0.0)] * vty.count)

    return lanes(like), codegen


def load_storage(context, builder, arrty, arr, index, count):
    """IR, for intrinsics built on the lanes: ``arr[index:index + count]`` widened to
    float32 (16-bit storage) or kept."""
    _, elem, widen, _ = storage_codec(arrty.dtype)
    data = context.make_array(arrty)(context, builder, arr).data
    ptr = builder.bitcast(builder.gep(data, [index]), ir.VectorType(elem, count).as_pointer())
    value = builder.load(ptr, align=arrty.dtype.bitwidth // 8)
    return value if widen is None else widen(builder, value, count)


def _loaded_lanes(typingctx, x, index, like):
    if not (isinstance(x, types.Array) and x.ndim == 1 and x.layout in "CF"
            and isinstance(index, types.Integer)
            and _compute(like) is not None and storage_codec(x.dtype) is not None):
        return None
    if x.dtype == types.float64 and like != types.float64:
        return None
    return Lanes(like)


def _widened(context, builder, sig, args):
    """x[i:i+count] in the lanes' dtype (float32 -> float64 exact where asked)."""
    lanes = sig.return_type
    index = context.cast(builder, args[1], sig.args[1], types.intp)
    value = load_storage(context, builder, sig.args[0], args[0], index, lanes.count)
    if lanes.dtype == types.float64 and value.type.element != _F64:
        value = builder.fpext(value, ir.VectorType(_F64, lanes.count))
    return value


@intrinsic
def load_lanes(typingctx, x, index, like):
    """``x[index:index + count]`` in the dtype of ``like`` (16-bit X widens to float32,
    float32 X to float64 when ``like`` is float64: exact)."""
    lanes = _loaded_lanes(typingctx, x, index, like)
    if lanes is None:
        return None
    return lanes(x, index, like), _widened


@intrinsic
def deviations(typingctx, x, index, shift):
    """``x[index:index + count] - shift`` in the dtype of ``shift``."""
    lanes = _loaded_lanes(typingctx, x, index, shift)
    if lanes is None:
        return None

    def codegen(context, builder, sig, args):
        value = _widened(context, builder, sig, args)
        return builder.fsub(value, _broadcast(builder, args[2], lanes.count))

    return lanes(x, index, shift), codegen


def _lanes_operator(op, instruction):
    """``a op b`` lane by lane for two :class:`Lanes` of one type: a typing template
    and a lowering (an ``@overload`` compiled a pipeline per signature for it)."""

    @infer_global(op)
    class _Typer(AbstractTemplate):
        def generic(self, args, kws):
            if len(args) == 2 and not kws and isinstance(args[0], Lanes) and args[0] == args[1]:
                return signature(args[0], *args)
            return None

    @lower_builtin(op, Lanes, Lanes)
    def _lower(context, builder, sig, args):
        return getattr(builder, instruction)(args[0], args[1])


_lanes_operator(operator.add, "fadd")
_lanes_operator(operator.sub, "fsub")
_lanes_operator(operator.mul, "fmul")


@intrinsic
def scaled(typingctx, a, s):
    """``a * s`` for a scalar ``s`` of the lanes' dtype."""
    if not (isinstance(a, Lanes) and s == a.dtype):
        return None

    def codegen(context, builder, sig, args):
        return builder.fmul(args[0], _broadcast(builder, args[1], a.count))

    return a(a, s), codegen


@intrinsic
def shifted(typingctx, a, s):
    """``a - s`` for a scalar ``s`` of the lanes' dtype."""
    if not (isinstance(a, Lanes) and s == a.dtype):
        return None

    def codegen(context, builder, sig, args):
        return builder.fsub(args[0], _broadcast(builder, args[1], a.count))

    return a(a, s), codegen


@intrinsic
def store_lanes(typingctx, arr, index, a):
    """``arr[index:index + count] = a``, rounded once to ``arr``'s dtype (float32 or
    float64 storage: 16-bit narrowing of float64 lanes would round twice, so 16-bit
    arrays are not accepted; their callers keep a scalar loop)."""
    if not (isinstance(arr, types.Array) and arr.ndim == 1 and arr.layout in "CF"
            and isinstance(index, types.Integer) and isinstance(a, Lanes)
            and arr.dtype in (types.float32, types.float64)
            and not (arr.dtype == types.float64 and a.dtype == types.float32)):
        return None

    def codegen(context, builder, sig, args):
        value = args[2]
        elem = _F64 if arr.dtype == types.float64 else _F32
        if value.type.element != elem:
            value = builder.fptrunc(value, ir.VectorType(elem, a.count))
        i = context.cast(builder, args[1], sig.args[1], types.intp)
        data = context.make_array(arr)(context, builder, args[0]).data
        ptr = builder.bitcast(builder.gep(data, [i]), value.type.as_pointer())
        builder.store(value, ptr, align=arr.dtype.bitwidth // 8)
        return context.get_dummy_value()

    return types.void(arr, index, a), codegen


@intrinsic
def lane_sum(typingctx, a):
    """The sum of the lanes by a fixed pairwise tree: halves added lane by lane
    until one lane is left."""
    if not isinstance(a, Lanes):
        return None

    def codegen(context, builder, sig, args):
        value = args[0]
        count = a.count
        i32 = ir.IntType(32)
        while count > 1:
            count //= 2
            undef = ir.Constant(value.type, ir.Undefined)
            low = builder.shuffle_vector(value, undef, ir.Constant(
                ir.VectorType(i32, count), list(range(count))))
            high = builder.shuffle_vector(value, undef, ir.Constant(
                ir.VectorType(i32, count), list(range(count, 2 * count))))
            value = builder.fadd(low, high)
        return builder.extract_element(value, ir.Constant(i32, 0))

    return a.dtype(a), codegen


@intrinsic
def lane_count(typingctx, like):
    """The number of lanes of :class:`Lanes` of ``like``'s dtype, a constant."""
    if _compute(like) is None:
        return None
    count = Lanes(like).count

    def codegen(context, builder, sig, args):
        return context.get_constant(types.intp, count)

    return types.intp(like), codegen


@intrinsic
def widened(typingctx, x, i, like):
    """Element ``i`` of ``x`` in ``like``'s dtype: :func:`load`, then widened to
    float64 where asked (float64 ``x`` only in float64)."""
    if like == types.float32 and x.dtype == types.float64:
        return None
    if like not in (types.float32, types.float64):
        return None
    loaded = load_type(x, i)
    if loaded is None:
        return None

    def codegen(context, builder, sig, args):
        return context.cast(builder, load_codegen(context, builder, x, i, args[:2]),
                            loaded, like)

    return like(x, i, like), codegen


@njit(**INLINE_OPTIONS)
def shifted_sums(x, shift):
    """``(sum(x - shift), sum((x - shift)**2))`` over the contiguous 1-D ``x`` in
    ``shift``'s dtype: lane ``j`` sums elements ``j, j + count, ...`` in order, the
    lanes join by :func:`lane_sum`, the tail adds after them in order. Inlined: a sum
    the caller does not use costs nothing."""
    n = x.size
    count = lane_count(shift)
    a1 = zeros(shift)
    a2 = zeros(shift)
    i = 0
    while i + count <= n:
        d = deviations(x, i, shift)
        a1 = a1 + d
        a2 = a2 + d * d
        i += count
    s1 = lane_sum(a1)
    s2 = lane_sum(a2)
    for k in range(i, n):
        d = widened(x, k, shift) - shift
        s1 += d
        s2 += d * d
    return s1, s2


@njit(**INLINE_OPTIONS)
def paired_sums(x, dy, shift):
    """``(sum d, sum d**2, sum dy, sum dy * d)`` with ``d = x - shift``, over the
    contiguous 1-D ``x`` and ``dy`` in ``shift``'s dtype, in the order of
    :func:`shifted_sums`."""
    n = x.size
    count = lane_count(shift)
    a1 = zeros(shift)
    a2 = zeros(shift)
    a3 = zeros(shift)
    a4 = zeros(shift)
    i = 0
    while i + count <= n:
        d = deviations(x, i, shift)
        g = load_lanes(dy, i, shift)
        a1 = a1 + d
        a2 = a2 + d * d
        a3 = a3 + g
        a4 = a4 + g * d
        i += count
    s1 = lane_sum(a1)
    s2 = lane_sum(a2)
    s3 = lane_sum(a3)
    s4 = lane_sum(a4)
    for k in range(i, n):
        d = widened(x, k, shift) - shift
        g = widened(dy, k, shift)
        s1 += d
        s2 += d * d
        s3 += g
        s4 += g * d
    return s1, s2, s3, s4


@intrinsic
def absolute(typingctx, a):
    """``|a|`` lane by lane (``llvm.fabs``)."""
    if not isinstance(a, Lanes):
        return None

    def codegen(context, builder, sig, args):
        vty = args[0].type
        suffix = f"v{vty.count}f{64 if vty.element == _F64 else 32}"
        fabs = cgutils.get_or_insert_function(builder.module, ir.FunctionType(vty, [vty]),
                                              f"llvm.fabs.{suffix}")
        return builder.call(fabs, [args[0]])

    return a(a), codegen


@njit(**INLINE_OPTIONS)
def absolute_sum(x):
    """``sum |x|`` over the contiguous 1-D ``x`` in float64, in the order of
    :func:`shifted_sums`."""
    n = x.size
    count = lane_count(0.0)
    acc = zeros(0.0)
    i = 0
    while i + count <= n:
        acc = acc + absolute(load_lanes(x, i, 0.0))
        i += count
    total = lane_sum(acc)
    for k in range(i, n):
        total += abs(np.float64(load(x, k)))
    return total

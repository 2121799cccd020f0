"""One 64-byte vector of ``y = (x - mean) * a + B``, written in LLVM IR.

Every vector loop of the kernels runs through these intrinsics: load one 64-byte
group of output elements' worth of X (16 float32, 8 float64 or 32 16-bit values),
widen to the compute dtype, compute ``(x - mean) * a + B`` with plain
``fsub``/``fmul``/``fadd`` (no fast-math, no FMA contraction: bit-for-bit the scalar
arithmetic of :mod:`normkernels.kernels.elements`), narrow, and store the 64 bytes,
either ordinarily or with ``!nontemporal`` (a streaming store: LLVM never emits one
from a plain Numba store). The per-channel parameters come as scalars, as tables
indexed by a phase, or split between two channels at a lane (a vector that straddles
two planes).

Why IR rather than Numba loops: streaming stores need it, and bfloat16 narrowing does
too. Narrowing bfloat16 on the bits (round to nearest even, NaN kept quiet) costs
about eight vector instructions per 16 lanes, which made bfloat16 compute-bound (see
``vectors.narrow_bf16`` in docs/design.md). Here it is
LLVM's ``fptrunc`` to ``bfloat`` (one ``vcvtneps2bf16``) on targets with
AVX512-BF16, which treats subnormal inputs as zero; a vector holding any float32
subnormal takes the exact bit path instead (a branch that is essentially never
taken). Other targets have no instruction for it (LLVM would call compiler-rt, which
the JIT cannot link) and narrow on the bits.

Stores: the 16-bit results are bitcast to float vectors and passed through an empty
inline-asm barrier before the store. Without it LLVM folded the float16 narrowing into
the store (``vcvtps2ph`` to memory) and silently dropped the non-temporal hint.
``tests/test_kernels.py`` checks the assembly of every dtype's streaming kernel for
``vmovnt``. Non-temporal stores are weakly ordered: each worker calls
:func:`store_fence` (``sfence``) after its last streaming store and before the
parallel region ends, so the caller sees every element once the kernel returns.
"""

from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.core.extending import intrinsic

from normkernels.kernels import activations
from normkernels.kernels.activations import epilogue_ok as _epilogue_ok
from normkernels.kernels.elements import narrow_bf16, narrow_f16, widen_bf16, widen_f16
from normkernels.kernels.options import VECTOR_BYTES
from normkernels.kernels.target import jit_target

# Class masks of llvm.is.fpclass (bit 4: negative subnormal, bit 7: positive
# subnormal) and of AVX-512's vfpclassps imm8 (bit 5: denormal, either sign).
FPCLASS_SUBNORMAL = (1 << 4) | (1 << 7)
VFPCLASS_DENORMAL = 1 << 5

_F32 = ir.FloatType()
_F64 = ir.DoubleType()
_I16 = ir.IntType(16)
_I32 = ir.IntType(32)


class _BFloat(ir.types.Type):
    """LLVM's ``bfloat`` type (llvmlite.ir has none)."""

    null = "0.0"

    def __eq__(self, other):
        return isinstance(other, _BFloat)

    def __hash__(self):
        return hash(_BFloat)

    def _to_string(self):
        return "bfloat"


def _subnormal_lanes(builder, value, count):
    """<count x i1>: which float32 lanes of ``value`` are subnormal.

    ``llvm.is.fpclass`` is portable but LLVM lowered it to three integer instructions
    per 16 lanes; with AVX512-DQ one ``vfpclassps`` does it.
    """
    mask_type = ir.VectorType(ir.IntType(1), count)
    if count % 16 or not jit_target().avx512dq:
        fpclass = cgutils.get_or_insert_function(
            builder.module, ir.FunctionType(mask_type, [value.type, _I32]),
            f"llvm.is.fpclass.v{count}f32")
        return builder.call(fpclass, [value, ir.Constant(_I32, FPCLASS_SUBNORMAL)])
    v16 = ir.VectorType(_F32, 16)
    m16 = ir.VectorType(ir.IntType(1), 16)
    fpclass = cgutils.get_or_insert_function(
        builder.module, ir.FunctionType(m16, [v16, _I32]), "llvm.x86.avx512.fpclass.ps.512")
    undef = ir.Constant(value.type, ir.Undefined)
    masks = []
    for k in range(count // 16):
        lanes = ir.Constant(ir.VectorType(_I32, 16), list(range(16 * k, 16 * k + 16)))
        part = builder.shuffle_vector(value, undef, lanes)
        masks.append(builder.call(fpclass, [part, ir.Constant(_I32, VFPCLASS_DENORMAL)]))
    mask = masks[0]
    while len(masks) > 1:  # concatenate pairs of masks
        joined = []
        for lo, hi in zip(masks[::2], masks[1::2], strict=True):
            n = lo.type.count
            both = ir.Constant(ir.VectorType(_I32, 2 * n), list(range(2 * n)))
            joined.append(builder.shuffle_vector(lo, hi, both))
        masks = joined
        mask = masks[0]
    return mask


def _narrow_bf16_vector(builder, value, count):
    """float32 vector -> bfloat16 bits: ``fptrunc`` where the target has AVX512-BF16,
    unless a lane is subnormal; elsewhere the bit rounding of :func:`narrow_bf16`.

    ``fptrunc`` (``vcvtneps2bf16``) turns float32 subnormals into zeros; a vector with
    any subnormal lane takes the exact bit path. Checking the 16-bit results for
    flushed zeros instead cost about ten instructions per 32 lanes; the fpclass test
    costs three. In L1, one thread: 4.7 Gelem/s with the zero check, 5.9 with fpclass
    (float16: 7.2).
    """
    if not jit_target().bf16_native:
        return narrow_bf16(builder, value, count)
    fast = builder.bitcast(builder.fptrunc(value, ir.VectorType(_BFloat(), count)),
                           ir.VectorType(_I16, count))
    flags = builder.bitcast(_subnormal_lanes(builder, value, count), ir.IntType(count))
    any_subnormal = builder.icmp_unsigned("!=", flags, ir.Constant(ir.IntType(count), 0))
    start = builder.block
    with builder.if_then(any_subnormal, likely=False):
        exact = narrow_bf16(builder, value, count)
        exact_block = builder.block
    result = builder.phi(fast.type)
    result.add_incoming(fast, start)
    result.add_incoming(exact, exact_block)
    return result


def storage_codec(dtype):
    """(lanes, element IR type, widen, narrow) of one 64-byte vector of ``dtype``."""
    if dtype == types.float32:
        return 16, _F32, None, None
    if dtype == types.float64:
        return 8, _F64, None, None
    if dtype == types.uint16:
        return 32, _I16, widen_f16, narrow_f16
    if dtype == types.int16:
        return 32, _I16, widen_bf16, _narrow_bf16_vector
    return None


def element_ptr(context, builder, arrty, arr, index):
    data = context.make_array(arrty)(context, builder, arr).data
    return builder.gep(data, [index])


def load_vector(builder, ptr, lanes, elem, align):
    vty = ir.VectorType(elem, lanes)
    return builder.load(builder.bitcast(ptr, vty.as_pointer()), align=align)


def broadcast(builder, scalar, lanes):
    vty = ir.VectorType(scalar.type, lanes)
    undef = ir.Constant(vty, ir.Undefined)
    first = builder.insert_element(undef, scalar, ir.Constant(_I32, 0))
    zeros = ir.Constant(ir.VectorType(_I32, lanes), [0] * lanes)
    return builder.shuffle_vector(first, undef, zeros)


# Argument positions in the intrinsics' signatures (listed at the end of the module):
# (x, y, index, mean, a, b), then ``phase`` for tables, or a second (mean, a, b) and
# ``split`` for a vector straddling two planes.
_PARAMETERS = (3, 4, 5)
_PHASE = 6
_SECOND = 3  # offset from a first parameter to its second-plane counterpart
_SPLIT = 9


def _parameters(context, builder, sig, args, mode, lanes, elem):
    """The (mean, a, b) vectors for one of the three parameter modes."""
    if mode == "tables":
        phase = context.cast(builder, args[_PHASE], sig.args[_PHASE], types.intp)
        return [
            load_vector(builder, element_ptr(context, builder, sig.args[k], args[k], phase),
                         lanes, elem, sig.args[k].dtype.bitwidth // 8)
            for k in _PARAMETERS
        ]
    if mode == "split":
        split = context.cast(builder, args[_SPLIT], sig.args[_SPLIT], types.int32)
        lane = ir.Constant(ir.VectorType(_I32, lanes), list(range(lanes)))
        first = builder.icmp_signed("<", lane, broadcast(builder, split, lanes))
        return [builder.select(first, broadcast(builder, args[k], lanes),
                               broadcast(builder, args[k + _SECOND], lanes))
                for k in _PARAMETERS]
    return [broadcast(builder, args[k], lanes) for k in _PARAMETERS]


def store_vector(context, builder, yty, y, index, value, nontemporal):
    """Store 64 bytes of results at ``y[index]`` (64-byte aligned when streaming)."""
    ptr = element_ptr(context, builder, yty, y, index)
    if not nontemporal:
        builder.store(value, builder.bitcast(ptr, value.type.as_pointer()),
                      align=yty.dtype.bitwidth // 8)
        return
    # 32-byte pieces (ymm) with AVX, 16-byte pieces (xmm: SSE2 movntps) without
    piece_bytes = 32 if jit_target().avx else 16
    if yty.dtype == types.float64:
        piece = ir.VectorType(_F64, piece_bytes // 8)
    else:
        piece = ir.VectorType(_F32, piece_bytes // 4)
    pieces = VECTOR_BYTES // piece_bytes
    value = builder.bitcast(value, ir.VectorType(piece.element, piece.count * pieces))
    ptr = builder.bitcast(ptr, piece.as_pointer())
    barrier = ir.InlineAsm(ir.FunctionType(piece, [piece]), "", "=x,0")
    hint = builder.module.add_metadata([ir.Constant(_I32, 1)])
    undef = ir.Constant(value.type, ir.Undefined)
    for k in range(pieces):
        lanes = ir.Constant(ir.VectorType(_I32, piece.count),
                            [k * piece.count + j for j in range(piece.count)])
        part = builder.call(barrier, [builder.shuffle_vector(value, undef, lanes)])
        store = builder.store(part, builder.gep(ptr, [ir.Constant(_I32, k)]),
                              align=piece_bytes)
        store.set_metadata("nontemporal", hint)


def _codegen(mode, nontemporal):
    def codegen(context, builder, sig, args):
        xty, yty = sig.args[0], sig.args[1]
        index = context.cast(builder, args[2], sig.args[2], types.intp)
        lanes, elem, widen, narrow = storage_codec(yty.dtype)
        xv = load_vector(builder, element_ptr(context, builder, xty, args[0], index),
                          lanes, elem, xty.dtype.bitwidth // 8)
        if widen is not None:
            xv = widen(builder, xv, lanes)
        mean, a, b = _parameters(context, builder, sig, args, mode, lanes, xv.type.element)
        yv = builder.fadd(builder.fmul(builder.fsub(xv, mean), a), b)
        resty = sig.args[-2]
        if isinstance(resty, types.Array):  # a residual added before the activation
            rv = load_vector(builder, element_ptr(context, builder, resty, args[-2], index),
                              lanes, elem, resty.dtype.bitwidth // 8)
            yv = builder.fadd(yv, rv if widen is None else widen(builder, rv, lanes))
        yv = activations.build(builder, sig.args[-1].kind, yv)
        if narrow is not None:
            yv = narrow(builder, yv, lanes)
        store_vector(context, builder, yty, args[1], index, yv, nontemporal)
        return context.get_dummy_value()

    return codegen


def arrays_ok(x, y, index):
    return (isinstance(x, types.Array) and isinstance(y, types.Array) and x.dtype == y.dtype
            and storage_codec(y.dtype) is not None and isinstance(index, types.Integer))


def _compute_type(y):
    return types.float64 if y.dtype == types.float64 else types.float32


def _scalars_intrinsic(nontemporal):
    def typer(typingctx, x, y, index, mean, a, b, res, act):
        if not arrays_ok(x, y, index) or any(t != _compute_type(y) for t in (mean, a, b)):
            return None
        if not _epilogue_ok(y, res, act):
            return None
        return (types.void(x, y, index, mean, a, b, res, act),
                _codegen("scalars", nontemporal))

    return intrinsic(typer)


def _tables_intrinsic(nontemporal):
    def typer(typingctx, x, y, index, mean, a, b, phase, res, act):
        tables = (mean, a, b)
        if not arrays_ok(x, y, index) or not isinstance(phase, types.Integer):
            return None
        if not all(isinstance(t, types.Array) and t.dtype == _compute_type(y) for t in tables):
            return None
        if not _epilogue_ok(y, res, act):
            return None
        return (types.void(x, y, index, mean, a, b, phase, res, act),
                _codegen("tables", nontemporal))

    return intrinsic(typer)


def _split_intrinsic(nontemporal):
    def typer(typingctx, x, y, index, mean0, a0, b0, mean1, a1, b1, split, res, act):
        scalars = (mean0, a0, b0, mean1, a1, b1)
        if not arrays_ok(x, y, index) or not isinstance(split, types.Integer):
            return None
        if any(t != _compute_type(y) for t in scalars) or not _epilogue_ok(y, res, act):
            return None
        return (types.void(x, y, index, *scalars, split, res, act),
                _codegen("split", nontemporal))

    return intrinsic(typer)


def _grad_codegen(tables):
    """``dx[i] = dy[i] * a + (x[i] - m) * b + k`` (one vector each), the backward
    passes' dX, in the compute dtype and in the order of ``kernels.backward_dx._apply_run``
    (the same bits): scalar coefficients, or with ``tables`` vectors of them at
    ``phase``. Stores non-temporally."""

    def codegen(context, builder, sig, args):
        dxty = sig.args[2]
        index = context.cast(builder, args[3], sig.args[3], types.intp)
        lanes, elem, widen, narrow = storage_codec(dxty.dtype)
        xv, dv = (load_vector(builder, element_ptr(context, builder, sig.args[j], args[j],
                                                     index), lanes, elem,
                               sig.args[j].dtype.bitwidth // 8) for j in (0, 1))
        if widen is not None:
            xv, dv = widen(builder, xv, lanes), widen(builder, dv, lanes)
        if tables:
            phase = context.cast(builder, args[8], sig.args[8], types.intp)
            m, a, b, k = (load_vector(builder, element_ptr(context, builder, sig.args[j],
                                                             args[j], phase),
                                       lanes, xv.type.element, sig.args[j].dtype.bitwidth // 8)
                          for j in (4, 5, 6, 7))
        else:
            m, a, b, k = (broadcast(builder, args[j], lanes) for j in (4, 5, 6, 7))
        yv = builder.fadd(builder.fadd(builder.fmul(dv, a),
                                       builder.fmul(builder.fsub(xv, m), b)), k)
        if narrow is not None:
            yv = narrow(builder, yv, lanes)
        store_vector(context, builder, dxty, args[2], index, yv, True)
        return context.get_dummy_value()

    return codegen


@intrinsic
def stream_grad(typingctx, x, dy, dx, index, m, a, b, k):
    if not (arrays_ok(x, dx, index) and isinstance(dy, types.Array) and dy.dtype == dx.dtype):
        return None
    if any(t != _compute_type(dx) for t in (m, a, b, k)):
        return None
    return types.void(x, dy, dx, index, m, a, b, k), _grad_codegen(False)


@intrinsic
def stream_grad_tables(typingctx, x, dy, dx, index, m, a, b, k, phase):
    if not (arrays_ok(x, dx, index) and isinstance(dy, types.Array) and dy.dtype == dx.dtype
            and isinstance(phase, types.Integer)):
        return None
    if not all(isinstance(t, types.Array) and t.dtype == _compute_type(dx)
               for t in (m, a, b, k)):
        return None
    return types.void(x, dy, dx, index, m, a, b, k, phase), _grad_codegen(True)


# ``vector_*`` store ordinarily (any alignment); ``stream_*`` store non-temporally and
# need ``y[index]`` 64-byte aligned. Signatures:
#   *_scale_shift(x, y, index, mean, a, b)                   scalar parameters
#   *_scale_shift_tables(x, y, index, mean, a, b, phase)     tables[phase:phase+L]
#   *_scale_shift_split(x, y, index, m0, a0, b0, m1, a1, b1, split)
#       lanes < split use (m0, a0, b0), the others (m1, a1, b1)
vector_scale_shift = _scalars_intrinsic(False)
stream_scale_shift = _scalars_intrinsic(True)
vector_scale_shift_tables = _tables_intrinsic(False)
stream_scale_shift_tables = _tables_intrinsic(True)
vector_scale_shift_split = _split_intrinsic(False)
stream_scale_shift_split = _split_intrinsic(True)
#   stream_grad(x, dy, dx, i, m, a, b, k)               dx[i] = dy[i] * a + (x[i] - m) * b + k
#   stream_grad_tables(x, dy, dx, i, m, a, b, k, phase)   the same, tables[phase:phase+L]
# (the row normalizations' vector: normkernels.kernels.row_vectors)


@intrinsic
def store_fence(typingctx):
    """``sfence``: order this thread's streaming stores before what follows."""

    def codegen(context, builder, sig, args):
        fnty = ir.FunctionType(ir.VoidType(), [])
        fn = cgutils.get_or_insert_function(builder.module, fnty, "llvm.x86.sse.sfence")
        builder.call(fn, [])
        return context.get_dummy_value()

    return types.void(), codegen


@intrinsic
def prefetch(typingctx, arr, index):
    """Ask for the cache line holding ``arr[index]`` (``llvm.prefetch``: read, high
    locality); ``index`` may lie past the end (a prefetch never faults)."""
    if not isinstance(arr, types.Array) or not isinstance(index, types.Integer):
        return None

    def codegen(context, builder, sig, args):
        array = context.make_array(sig.args[0])(context, builder, args[0])
        i8p = ir.IntType(8).as_pointer()
        address = builder.bitcast(builder.gep(array.data, [args[1]]), i8p)
        i32 = ir.IntType(32)
        fnty = ir.FunctionType(ir.VoidType(), [i8p, i32, i32, i32])
        fn = cgutils.get_or_insert_function(builder.module, fnty, "llvm.prefetch.p0i8")
        builder.call(fn, [address, ir.Constant(i32, 0), ir.Constant(i32, 3),
                          ir.Constant(i32, 1)])
        return context.get_dummy_value()

    return types.void(arr, index), codegen

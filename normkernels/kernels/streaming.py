"""Streaming (non-temporal) stores of one 64-byte vector of ``(x - mean) * a + B``.

LLVM never emits a streaming store from a plain Numba store, so the vector body of
the streaming kernels is written here in LLVM IR: load one 64-byte group of output
elements' worth of X (16 float32, 8 float64 or 32 16-bit values), widen to the compute
dtype, compute ``(x - mean) * a + B`` with plain ``fsub``/``fmul``/``fadd`` (no
fast-math, no FMA contraction: bit-for-bit the same arithmetic as the scalar and
auto-vectorised paths), narrow, and store the 64 bytes with ``!nontemporal``.

The 16-bit results are bitcast to ``<16 x float>`` before the store: storing a
``<32 x i16>`` with the hint was measured to lose it on one attempt (plain vmovdqu),
while a float vector store always became ``vmovntps``. ``tests/test_kernels.py``
checks the generated assembly of every dtype's streaming kernel for ``vmovnt``.

Non-temporal stores are weakly ordered: each worker calls :func:`store_fence`
(``sfence``) after its last streaming store and before the parallel region ends, so
the caller sees every element once the kernel returns.

Measured on (32,64,112,112) float32 with 2 threads: 11.0 ms with ordinary stores,
7.8 ms with these (a parallel memcpy of the same bytes: about 7.5 ms).
"""

from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.core.extending import intrinsic

from normkernels.kernels.elements import narrow_bf16, narrow_f16, widen_bf16, widen_f16

VECTOR_BYTES = 64

_F32 = ir.FloatType()
_F64 = ir.DoubleType()
_I16 = ir.IntType(16)


def _storage_codec(dtype):
    """(lanes, element IR type, widen, narrow) of one 64-byte vector of ``dtype``."""
    if dtype == types.float32:
        return 16, _F32, None, None
    if dtype == types.float64:
        return 8, _F64, None, None
    if dtype == types.uint16:
        return 32, _I16, widen_f16, narrow_f16
    if dtype == types.int16:
        return 32, _I16, widen_bf16, narrow_bf16
    return None


def _element_ptr(context, builder, arrty, arr, index):
    data = context.make_array(arrty)(context, builder, arr).data
    return builder.gep(data, [index])


def _load_vector(builder, ptr, lanes, elem, align):
    vty = ir.VectorType(elem, lanes)
    return builder.load(builder.bitcast(ptr, vty.as_pointer()), align=align)


def _broadcast(builder, scalar, lanes):
    vty = ir.VectorType(scalar.type, lanes)
    undef = ir.Constant(vty, ir.Undefined)
    first = builder.insert_element(undef, scalar, ir.Constant(ir.IntType(32), 0))
    zeros = ir.Constant(ir.VectorType(ir.IntType(32), lanes), [0] * lanes)
    return builder.shuffle_vector(first, undef, zeros)


def _emit(context, builder, sig, args, params):
    """``params``: "scalars" (args 3-5), "tables" (arrays 3-5 at phase arg 6) or
    "split" (lanes below arg 9 take scalars 3-5, the others scalars 6-8)."""
    xty, yty = sig.args[0], sig.args[1]
    x, y, index = args[0], args[1], args[2]
    index = context.cast(builder, index, sig.args[2], types.intp)
    lanes, elem, widen, narrow = _storage_codec(yty.dtype)

    xv = _load_vector(builder, _element_ptr(context, builder, xty, x, index), lanes, elem,
                      xty.dtype.bitwidth // 8)
    if widen is not None:
        xv = widen(builder, xv, lanes)

    if params == "tables":
        phase = context.cast(builder, args[6], sig.args[6], types.intp)
        vectors = []
        for k in (3, 4, 5):
            ptr = _element_ptr(context, builder, sig.args[k], args[k], phase)
            vectors.append(_load_vector(builder, ptr, lanes, xv.type.element,
                                        sig.args[k].dtype.bitwidth // 8))
    elif params == "split":
        split = context.cast(builder, args[9], sig.args[9], types.int32)
        lane = ir.Constant(ir.VectorType(ir.IntType(32), lanes), list(range(lanes)))
        first = builder.icmp_signed("<", lane, _broadcast(builder, split, lanes))
        vectors = [builder.select(first, _broadcast(builder, args[k], lanes),
                                  _broadcast(builder, args[k + 3], lanes)) for k in (3, 4, 5)]
    else:
        vectors = [_broadcast(builder, args[k], lanes) for k in (3, 4, 5)]
    mean, a, b = vectors

    yv = builder.fadd(builder.fmul(builder.fsub(xv, mean), a), b)
    if narrow is not None:
        yv = narrow(builder, yv, lanes)
    # Store as float vectors of 32 bytes each, passed through an empty inline-asm
    # barrier: without it LLVM folds the narrowing into the store (vcvtps2ph to
    # memory) and silently drops the non-temporal hint (seen for float16).
    piece = ir.VectorType(_F64, 4) if yty.dtype == types.float64 else ir.VectorType(_F32, 8)
    pieces = VECTOR_BYTES // 32
    yv = builder.bitcast(yv, ir.VectorType(piece.element, piece.count * pieces))
    yptr = builder.bitcast(_element_ptr(context, builder, yty, y, index), piece.as_pointer())
    barrier = ir.InlineAsm(ir.FunctionType(piece, [piece]), "", "=x,0")
    nontemporal = builder.module.add_metadata([ir.Constant(ir.IntType(32), 1)])
    for k in range(pieces):
        lanes_k = [ir.Constant(ir.IntType(32), k * piece.count + j) for j in range(piece.count)]
        part = builder.shuffle_vector(yv, ir.Constant(yv.type, ir.Undefined), ir.Constant(
            ir.VectorType(ir.IntType(32), piece.count), lanes_k))
        part = builder.call(barrier, [part])
        ptr = builder.gep(yptr, [ir.Constant(ir.IntType(32), k)])
        st = builder.store(part, ptr, align=32)
        st.set_metadata("nontemporal", nontemporal)
    return context.get_dummy_value()


def _check(x, y, index, compute_types):
    if not (isinstance(x, types.Array) and isinstance(y, types.Array)):
        return False
    if x.dtype != y.dtype or _storage_codec(y.dtype) is None:
        return False
    if not isinstance(index, types.Integer):
        return False
    compute = types.float64 if y.dtype == types.float64 else types.float32
    return all(t == compute for t in compute_types)


@intrinsic
def stream_scale_shift(typingctx, x, y, index, mean, a, b):
    """Store ``(x[index:index+L] - mean) * a + b`` into ``y[index:index+L]``, streaming.

    ``L = 64 // y.itemsize``; ``y[index]`` must be 64-byte aligned; ``mean, a, b``
    are scalars of the compute dtype.
    """
    if not _check(x, y, index, (mean, a, b)):
        return None

    def codegen(context, builder, sig, args):
        return _emit(context, builder, sig, args, "scalars")

    return types.void(x, y, index, mean, a, b), codegen


@intrinsic
def stream_scale_shift_tables(typingctx, x, y, index, mean, a, b, phase):
    """Like :func:`stream_scale_shift` with per-element parameters ``mean[phase:phase+L]``
    (and the same slices of ``a`` and ``b``), arrays of the compute dtype."""
    arrays = (mean, a, b)
    if not all(isinstance(t, types.Array) for t in arrays):
        return None
    if not _check(x, y, index, tuple(t.dtype for t in arrays)):
        return None
    if not isinstance(phase, types.Integer):
        return None

    def codegen(context, builder, sig, args):
        return _emit(context, builder, sig, args, "tables")

    return types.void(x, y, index, mean, a, b, phase), codegen


@intrinsic
def stream_scale_shift_split(typingctx, x, y, index, mean0, a0, b0, mean1, a1, b1, split):
    """Like :func:`stream_scale_shift` for a vector that straddles two channels'
    planes: lanes ``< split`` use ``(mean0, a0, b0)``, the others ``(mean1, a1, b1)``."""
    if not _check(x, y, index, (mean0, a0, b0, mean1, a1, b1)):
        return None
    if not isinstance(split, types.Integer):
        return None

    def codegen(context, builder, sig, args):
        return _emit(context, builder, sig, args, "split")

    return types.void(x, y, index, mean0, a0, b0, mean1, a1, b1, split), codegen


@intrinsic
def store_fence(typingctx):
    """``sfence``: order this thread's streaming stores before what follows."""

    def codegen(context, builder, sig, args):
        fnty = ir.FunctionType(ir.VoidType(), [])
        fn = cgutils.get_or_insert_function(builder.module, fnty, "llvm.x86.sse.sfence")
        builder.call(fn, [])
        return context.get_dummy_value()

    return types.void(), codegen

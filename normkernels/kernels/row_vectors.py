"""One 64-byte vector of a row normalization's output, written in LLVM IR:

    ``y[yi] = act(((x[xi] - m) * a + c) * s[j] + b[j] + res[ri])``

with the row's scalars ``m, a, c`` and column tables ``s`` (scale), ``b`` (bias); the
residual ``res`` (None: none) and the activation ``act``
(:mod:`normkernels.kernels.activations`) are the epilogue. The loads, widenings,
narrowings and stores (streaming or not) are those of
:mod:`normkernels.kernels.vectors`; only ``fsub``/``fmul``/``fadd``, no FMA
contraction, so a vector gives the bits of the scalar loop of
:func:`normkernels.kernels.rows.normalize_run`.

Arithmetic (:func:`_row_compute_type`): float32 for 16-bit storage, else float64;
float32 rows are normalized in float64 and rounded once. The residual is added in that
arithmetic (its float32 or 16-bit values widened exactly); the activation then runs in
the activations' compute dtype (float32 for 16-bit and float32 storage, float64 for
float64: the value is rounded to float32 first for float32 storage, as the other
operators' epilogues see it), and its result is Y's one rounding for 16-bit storage.
Without an epilogue (``res`` None, ``act`` NONE) the IR is the plain normalization's.
"""

from llvmlite import ir
from numba import types
from numba.core.extending import intrinsic

from normkernels.kernels import activations
from normkernels.kernels.activations import epilogue_ok
from normkernels.kernels.vectors import (
    arrays_ok,
    broadcast,
    element_ptr,
    load_vector,
    storage_codec,
    store_vector,
)

_F32 = ir.FloatType()
_F64 = ir.DoubleType()

# argument positions: (x, xi, y, yi, m, a, c, s, b, j, ri, res, act)
_INDICES = (1, 3, 9, 10)
_SCALARS = (4, 5, 6)
_TABLES = (7, 8)
_RES = 11


def _row_compute_type(y):
    """The row kernels' arithmetic: float32 for 16-bit storage, else float64 (float32
    rows are normalized in float64 and rounded once)."""
    return types.float32 if y.dtype.bitwidth == 16 else types.float64


def _row_codegen(nontemporal):
    def codegen(context, builder, sig, args):
        yty = sig.args[2]
        xi, yi, j, ri = (context.cast(builder, args[k], sig.args[k], types.intp)
                         for k in _INDICES)
        lanes, elem, widen, narrow = storage_codec(yty.dtype)
        wide = yty.dtype == types.float32  # float32 storage, float64 arithmetic

        def load(k, index):  # a vector of storage array k, in the arithmetic's dtype
            v = load_vector(builder, element_ptr(context, builder, sig.args[k], args[k],
                                                   index),
                             lanes, elem, sig.args[k].dtype.bitwidth // 8)
            if widen is not None:
                v = widen(builder, v, lanes)
            return builder.fpext(v, ir.VectorType(_F64, lanes)) if wide else v

        xv = load(0, xi)
        m, a, c = (broadcast(builder, args[k], lanes) for k in _SCALARS)
        s, b = (load_vector(builder, element_ptr(context, builder, sig.args[k], args[k], j),
                             lanes, xv.type.element, sig.args[k].dtype.bitwidth // 8)
                for k in _TABLES)
        normalized = builder.fmul(builder.fsub(xv, m), a)
        if xv.type.element != _F64:  # float64 arithmetic: c is -0.0, which adds nothing
            normalized = builder.fadd(normalized, c)
        if sig.args[-1].rounding == "llama":  # rounded to Y's dtype before the scale
            if wide:
                normalized = builder.fpext(builder.fptrunc(normalized, ir.VectorType(_F32, lanes)),
                                           normalized.type)
            elif narrow is not None:
                normalized = widen(builder, narrow(builder, normalized, lanes), lanes)
        yv = builder.fadd(builder.fmul(normalized, s), b)
        if isinstance(sig.args[_RES], types.Array):  # the residual, before the activation
            yv = builder.fadd(yv, load(_RES, ri))
        if wide:
            yv = builder.fptrunc(yv, ir.VectorType(_F32, lanes))
        yv = activations.build(builder, sig.args[-1].kind, yv)
        if narrow is not None:
            yv = narrow(builder, yv, lanes)
        store_vector(context, builder, yty, args[2], yi, yv, nontemporal)
        return context.get_dummy_value()

    return codegen


def _row_intrinsic(nontemporal):
    def typer(typingctx, x, xi, y, yi, m, a, c, s, b, j, ri, res, act):
        if not arrays_ok(x, y, xi) or not all(isinstance(t, types.Integer)
                                               for t in (yi, j, ri)):
            return None
        if any(t != _row_compute_type(y) for t in (m, a, c)):
            return None
        if not all(isinstance(t, types.Array) and t.dtype == _row_compute_type(y)
                   for t in (s, b)):
            return None
        if not epilogue_ok(y, res, act):
            return None
        return (types.void(x, xi, y, yi, m, a, c, s, b, j, ri, res, act),
                _row_codegen(nontemporal))

    return intrinsic(typer)


# ``vector_*`` store ordinarily (any alignment), ``stream_*`` non-temporally (``y[yi]``
# 64-byte aligned):
#   *_normalize_row(x, xi, y, yi, m, a, c, s, b, j, ri, res, act)
#       y[yi] = act(((x[xi] - m) * a + c) * s[j] + b[j] + res[ri])   (res None: no add)
vector_normalize_row = _row_intrinsic(False)
stream_normalize_row = _row_intrinsic(True)

"""One 64-byte vector of a row normalization's output, written in LLVM IR:

    ``y[yi] = act(((x[xi] - m) * a + c) * s[j] + b[j] + res[ri])``

with the row's scalars ``m, a, c`` and column tables ``s`` (scale), ``b`` (bias); the
residual ``res`` (None: none) and the activation ``act``
(:mod:`normkernels.kernels.activations`) are the epilogue. The loads, widenings,
narrowings and stores (streaming or not) are those of
:mod:`normkernels.kernels.vectors`; a vector computes what a scalar element does
(:func:`normkernels.kernels.rows.normalize_run`: the same ops, or this IR on one lane).

Arithmetic:

* **16-bit storage**: float32, ``fsub``/``fmul``/``fadd``, Y rounded once.
* **float64 storage**: float64, ``c`` is ``-0.0``.
* **float32 storage, target with FMA**: float32 lanes. The float64 ``m`` and ``a``
  become float32 ``m``, ``a_hi + a_lo`` (48 bits of ``a``) and the mean's residual
  ``c``; ``n = fma(x - m, a_hi, fma(x - m, a_lo, c))`` is within ``2 u |n|`` of the
  exact normalized value and ``y = fma(n, s, b)`` adds one rounding (docs/design.md,
  "Float32 rows in float32 lanes"). Twice the lanes per instruction of float64, half
  the table bytes.
* **float32 storage, no FMA** (x86-64 before v3): float64 lanes and one rounding, as
  ``llvm.fma`` would be a libm call per element there: other bits than FMA targets,
  within the same bound (half an ulp).

The residual is added in that arithmetic; the activation then runs in the activations'
compute dtype (float32 for 16-bit and float32 storage, float64 for float64), and its
result is Y's one rounding for 16-bit storage. Without an epilogue (``res`` None,
``act`` NONE) the IR is the plain normalization's.
"""

from llvmlite import ir
from numba import njit, types
from numba.core import cgutils
from numba.core.extending import intrinsic, overload

import normkernels.kernels.cache  # noqa: F401  (registers the cache locators before any @njit)
from normkernels.kernels import activations
from normkernels.kernels.activations import epilogue_ok
from normkernels.kernels.options import INLINE_OPTIONS, OVERLOAD_OPTIONS
from normkernels.kernels.target import jit_target
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
    """The row scalars' dtype: float32 for 16-bit storage, else float64 (the fold's
    float64 values; float32 storage splits them in :func:`_float32_scalars`)."""
    return types.float32 if y.dtype.bitwidth == 16 else types.float64


def _table_type(y):
    """The column tables' dtype: float64 for float64 storage, else float32."""
    return types.float64 if y.dtype == types.float64 else types.float32


def _fma(builder, a, b, c):
    """``a * b + c`` rounded once (``llvm.fma``) on float32 vectors."""
    vty = a.type
    fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(vty, [vty] * 3),
                                        f"llvm.fma.v{vty.count}f32")
    return builder.call(fn, [a, b, c])


def _float32_scalars(builder, m, a, lanes):
    """Float32 storage: the float64 row scalars as float32 vectors ``m, a_hi, a_lo, c``
    with ``a_hi + a_lo = a`` to 48 bits and ``c = -(m - round(m)) * a``, the mean's
    residual (``-0.0`` where the mean is not finite, as the fold's rule). Loop
    invariant: LLVM hoists it out of the row's loop."""
    m32 = builder.fptrunc(m, _F32)
    a_hi = builder.fptrunc(a, _F32)
    a_lo = builder.fptrunc(builder.fsub(a, builder.fpext(a_hi, _F64)), _F32)
    rest = builder.fsub(m, builder.fpext(m32, _F64))
    residual = builder.fptrunc(builder.fmul(builder.fsub(ir.Constant(_F64, -0.0), rest), a),
                               _F32)
    finite = builder.fcmp_ordered("==", rest, rest)
    c32 = builder.select(finite, residual, ir.Constant(_F32, -0.0))
    return tuple(broadcast(builder, v, lanes) for v in (m32, a_hi, a_lo, c32))


LANES_LIMIT = 2.0 ** 100  # float32 lanes where |m| and 1 / a are below it, a too


def _well_scaled(builder, m, a):
    """The ``i1`` "this row takes float32 lanes" of float64 row scalars ``m``, ``a``."""
    limit = ir.Constant(_F64, LANES_LIMIT)
    fabs = cgutils.get_or_insert_function(builder.module, ir.FunctionType(_F64, [_F64]),
                                          "llvm.fabs.f64")
    return builder.and_(builder.and_(builder.fcmp_ordered("<", builder.call(fabs, [m]), limit),
                                     builder.fcmp_ordered("<", a, limit)),
                        builder.fcmp_ordered(">", a, ir.Constant(_F64, 1.0 / LANES_LIMIT)))


@intrinsic
def well_scaled(typingctx, y, m, a):
    """Whether a row of storage ``y`` with scalars ``m``, ``a`` takes float32 lanes (True
    for every storage without the choice). A row loop branches on it once, around its
    vectors: the same comparison inside each vector then folds (LLVM propagates the
    branch's condition), so neither loop tests it per vector (a small gain: LLVM still
    takes the activations' constants from memory broadcasts; docs/design.md)."""
    if not isinstance(y, types.Array):
        return None
    choice = float32_lanes(y) and m == types.float64 and a == types.float64

    def codegen(context, builder, sig, args):
        if choice:
            return _well_scaled(builder, args[1], args[2])
        return ir.Constant(ir.IntType(1), 1)

    return types.boolean(y, m, a), codegen


def _float32_row(builder, xv, m, a, s, b, llama, res):
    """The float32 storage's Y before its activation, from float32 vectors ``xv``, ``s``,
    ``b``, ``res`` (None: none) and the float64 row scalars ``m``, ``a`` (the fold's
    ``c`` is -0.0 for them: the residual is made here): float32 lanes where the
    row is well scaled (:data:`LANES_LIMIT`: ``x - m`` cannot overflow, ``a`` fits
    float32 with room), else float64 lanes and one rounding (``llama``, an ``i1`` or a
    bool: the normalized value rounded to float32 first). A branch per vector on a row
    constant, never taken on ordinary rows."""
    lanes = xv.type.count
    with builder.if_else(_well_scaled(builder, m, a), likely=True) as (lanes32, lanes64):
        with lanes32:
            m32, a_hi, a_lo, c32 = _float32_scalars(builder, m, a, lanes)
            t = builder.fsub(xv, m32)
            y32 = _fma(builder, _fma(builder, t, a_hi, _fma(builder, t, a_lo, c32)), s, b)
            if res is not None:
                y32 = builder.fadd(y32, res)
            from32 = builder.block
        with lanes64:
            y64 = _float64_lanes(builder, xv, m, a, s, b, llama, res)
            from64 = builder.block
    y = builder.phi(xv.type)
    y.add_incoming(y32, from32)
    y.add_incoming(y64, from64)
    return y


def _float64_lanes(builder, xv, m, a, s, b, llama, res):
    """Float32 storage's Y before its activation in float64 lanes (ill-scaled rows, and
    every row on targets without FMA), rounded once to float32: float32 vectors ``xv``,
    ``s``, ``b``, ``res`` (None: none), float64 row scalars ``m``, ``a`` (``llama``, an
    ``i1`` or a bool: the normalized value rounded to float32 first)."""
    lanes = xv.type.count
    v64 = ir.VectorType(_F64, lanes)
    n = builder.fmul(builder.fsub(builder.fpext(xv, v64), broadcast(builder, m, lanes)),
                     broadcast(builder, a, lanes))
    rounded = builder.fpext(builder.fptrunc(n, xv.type), v64)
    if isinstance(llama, ir.Value):
        n = builder.select(llama, rounded, n)
    elif llama:
        n = rounded
    y64 = builder.fadd(builder.fmul(n, builder.fpext(s, v64)), builder.fpext(b, v64))
    if res is not None:
        y64 = builder.fadd(y64, builder.fpext(res, v64))
    return builder.fptrunc(y64, xv.type)


@intrinsic
def row_value32(typingctx, x, m, a, s, b, llama):
    """Y of one float32 element ``x`` with its scale ``s`` and bias ``b`` (float32;
    -0.0: none) and the float64 row scalars, as the row vectors compute it (one lane
    of :func:`_float32_row`; ``llama`` a bool): for loops without column tables."""
    if any(t != types.float32 for t in (x, s, b)) or any(t != types.float64 for t in (m, a)):
        return None
    if not isinstance(llama, types.Boolean):
        return None

    def codegen(context, builder, sig, args):
        x1, s1, b1 = (broadcast(builder, args[k], 1) for k in (0, 3, 4))
        llama1 = args[5]
        if llama1.type != ir.IntType(1):
            llama1 = builder.icmp_unsigned("!=", llama1, ir.Constant(llama1.type, 0))
        y = _float32_row(builder, x1, args[1], args[2], s1, b1, llama1, None)
        return builder.extract_element(y, ir.Constant(ir.IntType(32), 0))

    return types.float32(x, m, a, s, b, llama), codegen


def float32_lanes(y):
    """True when float32 storage ``y`` is normalized in float32 lanes: the target has
    FMA. Without it, float64 lanes and one rounding (``llvm.fma`` would be a libm call
    per element there, 10x slower): other bits than FMA targets, within the bound."""
    return y.dtype == types.float32 and jit_target().fma


def _row_codegen(nontemporal, scalar):
    def codegen(context, builder, sig, args):
        yty = sig.args[2]
        xi, yi, j, ri = (context.cast(builder, args[k], sig.args[k], types.intp)
                         for k in _INDICES)
        lanes, elem, widen, narrow = storage_codec(yty.dtype)
        lanes = 1 if scalar else lanes
        narrow_lanes = float32_lanes(yty)
        wide = yty.dtype == types.float32 and not narrow_lanes  # float64 arithmetic

        def load(k, index, elem=elem):  # a vector of array k, in its storage's arithmetic
            v = load_vector(builder, element_ptr(context, builder, sig.args[k], args[k],
                                                   index),
                             lanes, elem, sig.args[k].dtype.bitwidth // 8)
            if widen is not None and sig.args[k].dtype.bitwidth == 16:
                v = widen(builder, v, lanes)
            return v

        xv = load(0, xi)
        table = _F64 if yty.dtype == types.float64 else _F32
        s, b = (load(k, j, table) for k in _TABLES)
        res = load(_RES, ri) if isinstance(sig.args[_RES], types.Array) else None
        llama = sig.args[-1].rounding == "llama"
        if narrow_lanes:
            # a = a_hi + a_lo makes the normalized value one rounding of (x - m) * a + c
            # (error analysis: docs/design.md, "Float32 rows in float32 lanes")
            yv = _float32_row(builder, xv, args[_SCALARS[0]], args[_SCALARS[1]], s, b,
                              llama, res)
        elif wide:  # float32 storage without FMA: the ill-scaled rows' formula (c is -0.0)
            yv = _float64_lanes(builder, xv, args[_SCALARS[0]], args[_SCALARS[1]], s, b,
                                llama, res)
        else:
            m, a, c = (broadcast(builder, args[k], lanes) for k in _SCALARS)
            normalized = builder.fmul(builder.fsub(xv, m), a)
            if xv.type.element != _F64:  # float64 arithmetic: c is -0.0, which adds nothing
                normalized = builder.fadd(normalized, c)
            if llama and narrow is not None:  # rounded to Y's dtype before the scale
                normalized = widen(builder, narrow(builder, normalized, lanes), lanes)
            yv = builder.fadd(builder.fmul(normalized, s), b)
            if res is not None:  # the residual, before the activation
                yv = builder.fadd(yv, res)
        yv = activations.build(builder, sig.args[-1].kind, yv)
        if narrow is not None:
            yv = narrow(builder, yv, lanes)
        store_vector(context, builder, yty, args[2], yi, yv, nontemporal)
        return context.get_dummy_value()

    return codegen


def _row_intrinsic(nontemporal, scalar=False):
    def typer(typingctx, x, xi, y, yi, m, a, c, s, b, j, ri, res, act):
        if not arrays_ok(x, y, xi) or not all(isinstance(t, types.Integer)
                                               for t in (yi, j, ri)):
            return None
        if any(t != _row_compute_type(y) for t in (m, a, c)):
            return None
        if not all(isinstance(t, types.Array) and t.dtype == _table_type(y)
                   for t in (s, b)):
            return None
        if not epilogue_ok(y, res, act):
            return None
        return (types.void(x, xi, y, yi, m, a, c, s, b, j, ri, res, act),
                _row_codegen(nontemporal, scalar))

    return intrinsic(typer)


# ``vector_*`` store ordinarily (any alignment), ``stream_*`` non-temporally (``y[yi]``
# 64-byte aligned):
#   *_normalize_row(x, xi, y, yi, m, a, c, s, b, j, ri, res, act)
#       y[yi] = act(((x[xi] - m) * a + c) * s[j] + b[j] + res[ri])   (res None: no add)
vector_normalize_row = _row_intrinsic(False)
stream_normalize_row = _row_intrinsic(True)
# one element (float32 storage's heads and tails: the vectors' arithmetic, lane by lane)
scalar_normalize_row = _row_intrinsic(False, scalar=True)


# the row loops take these as their ``vector`` argument (a function value: not an
# intrinsic, which Numba cannot pass)
@njit(**INLINE_OPTIONS)
def vector_row(x, xi, y, yi, m, a, c, s, b, j, ri, res, act):
    vector_normalize_row(x, xi, y, yi, m, a, c, s, b, j, ri, res, act)


@njit(**INLINE_OPTIONS)
def stream_row(x, xi, y, yi, m, a, c, s, b, j, ri, res, act):
    stream_normalize_row(x, xi, y, yi, m, a, c, s, b, j, ri, res, act)


def streams(vector):
    """Whether the row loop's ``vector`` (:func:`vector_row` or :func:`stream_row`) stores
    non-temporally (64-byte aligned stores only); ``@njit`` only."""
    raise NotImplementedError("streams is only callable from @njit code")


@overload(streams, inline="always", jit_options=OVERLOAD_OPTIONS)
def _streams(vector):
    streaming = isinstance(vector, types.Dispatcher) and vector.dispatcher is stream_row
    return lambda vector: streaming

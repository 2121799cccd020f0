"""Activation epilogues: ReLU, SiLU and GELU (tanh form and exact) applied to a
normalization's result while it is in registers, before it is rounded to the output
dtype.

A kernel takes the activation as an argument ``act`` whose Numba *type* names it
(:class:`ActivationType`): each kernel compiles once per (dtype, layout, activation),
and code for an activation is only generated where it is asked for (``NONE`` adds no
instruction). The same IR builder (:func:`build`) serves the 64-byte vector bodies of
:mod:`normkernels.kernels.vectors` and the scalar heads and tails (:func:`activate`), so
a result does not depend on where in a row its element falls, nor on the CPU: only
``fadd``/``fsub``/``fmul``/``fdiv``/``fneg``, comparisons, selects and integer
operations on the bits (exponents; erf.py's splits), no FMA contraction, no library
call (a libm ``expf`` would not vectorise, and its bits differ between libms).

Definitions (PyTorch's, which every peer uses), in the compute dtype (float32 for
16-bit and float32 X, float64 for float64 X):

* ``relu(y) = max(y, 0)``, NaN kept (``y < 0 ? 0 : y``);
* ``silu(y) = y * sigmoid(y)``;
* ``gelu_tanh(y) = 0.5 y (1 + tanh(sqrt(2 / pi) (y + 0.044715 y^3)))``, evaluated as
  ``y * sigmoid(2 u)`` (``0.5 (1 + tanh(u)) = sigmoid(2 u)``, which does not cancel
  where ``tanh(u)`` is near -1);
* ``gelu(y) = 0.5 y (1 + erf(y / sqrt 2)) = y Phi(y)`` (``approximate="none"``), built
  by :mod:`normkernels.kernels.erf`: fdlibm's erf/erfc rational approximations, with
  ``Phi`` of negative y from erfc (never ``1 + erf``, which cancels), erfc's
  ``exp(-x^2)`` from an exactly split ``x^2`` (one exponential, reduced as below with
  the split's parts), and ``gelu(y) = y + gelu(-y)`` above 0.

``sigmoid(z)`` is ``1 / (1 + e)`` for ``z >= 0`` and ``e / (1 + e)`` below, with ``e =
exp(-|z|)``: the exponential only ever sees arguments <= 0, so it cannot overflow,
and ``exp`` of less than -104 (float32; -746 float64) is 0. ``exp(t)``: Cody-Waite
reduction ``t = k ln2 + r`` (``|r| <= ln2 / 2``; ``k`` rounded by adding and
subtracting 1.5 * 2^23 or 2^52), Cephes' polynomial (float32: degree 7, within 1 ulp;
float64: its Pade form ``1 + 2 r P / (Q - r P)``), and ``2^k`` as two exponent-bit
factors (``k`` down to -150 or -1076 stays within the normal range in each factor;
the last product rounds once into the subnormals). Error of an activated result
(tests/oracle.py): at most ``ACTIVATION_ULPS`` units of the compute dtype's roundoff
relative to ``|y| * max(1, sigmoid)``, on top of the propagated error of ``y``
(the activations' slopes are within [-0.13, 1.13]); exact GELU's within
``ACTIVATION_ULPS`` units relative to ``|gelu(y)|`` itself (no argument's rounding is
amplified; measured 3.9 float32, 4.2 float64 against a long-double evaluation) plus the
subnormal floor.

Non-finite values: ``silu(+inf) = inf``, ``silu(-inf) = -inf * 0 = NaN``,
``gelu_tanh(-inf)`` and ``gelu(-inf)`` NaN as in PyTorch; ``gelu(y)`` is -0.0 below
the compute dtype's underflow (-14.4 float32, -38.6 float64); NaN stays NaN.
"""

import math

from llvmlite import ir
from numba import types
from numba.core.extending import (
    NativeValue,
    intrinsic,
    models,
    overload,
    register_model,
    typeof_impl,
    unbox,
)
from numba.core.imputils import lower_constant

from normkernels.kernels import erf
from normkernels.kernels.options import OVERLOAD_OPTIONS

KINDS = ("none", "relu", "silu", "gelu_tanh", "gelu")
ACTIVATION_ULPS = 8  # tests: the activation's own error bound, in units of roundoff

_F32 = ir.FloatType()
_F64 = ir.DoubleType()
_I32 = ir.IntType(32)
_I64 = ir.IntType(64)


ROUNDINGS = ("once", "llama")


class Activation:
    """A marker passed to kernels as ``act``; its Numba type says which activation, and
    for the row kernels where the normalized value is rounded: ``"once"`` (Y's one
    rounding) or ``"llama"`` (the normalized value rounded to Y's dtype before the
    scale multiplies it, as Hugging Face's LlamaRMSNorm and vLLM; the row kernels
    only)."""

    __slots__ = ("kind", "rounding")

    def __init__(self, kind, rounding="once"):
        if kind not in KINDS:
            raise ValueError(f"no activation {kind!r} (activations: {', '.join(KINDS)})")
        if rounding not in ROUNDINGS:
            raise ValueError(f"no rounding {rounding!r} (roundings: {', '.join(ROUNDINGS)})")
        self.kind = kind
        self.rounding = rounding

    def __repr__(self):
        return (f"Activation({self.kind!r})" if self.rounding == "once"
                else f"Activation({self.kind!r}, {self.rounding!r})")

    def __reduce__(self):
        return (for_kind, (self.kind, self.rounding))


_BY_KIND = {(kind, r): Activation(kind, r) for kind in KINDS for r in ROUNDINGS}
NONE = _BY_KIND["none", "once"]
RELU = _BY_KIND["relu", "once"]
SILU = _BY_KIND["silu", "once"]
GELU_TANH = _BY_KIND["gelu_tanh", "once"]
GELU = _BY_KIND["gelu", "once"]


def marker(act, rounding="once"):
    """``act``'s marker: a marker itself, or a name (None: :data:`NONE`), as the spec
    layer passes it (the spec modules import no kernel module); with ``rounding``
    (see :class:`Activation`)."""
    if isinstance(act, Activation):
        return act if act.rounding == rounding else for_kind(act.kind, rounding)
    return for_kind(act, rounding)


def for_kind(kind, rounding="once"):
    """The marker of ``kind`` (None: :data:`NONE`) with ``rounding``."""
    if kind is None:
        kind = "none"
    try:
        return _BY_KIND[kind, rounding]
    except (KeyError, TypeError):
        if rounding not in ROUNDINGS:
            raise ValueError(f"no rounding {rounding!r} (roundings: "
                             f"{', '.join(ROUNDINGS)})") from None
        raise ValueError(f"no activation {kind!r} (activations: None, "
                         f"{', '.join(KINDS[1:])})") from None


class ActivationType(types.Type):
    def __init__(self, kind, rounding="once"):
        self.kind = kind
        self.rounding = rounding
        super().__init__(name=f"Activation({kind})" if rounding == "once"
                         else f"Activation({kind}, {rounding})")


@register_model(ActivationType)
class _ActivationModel(models.OpaqueModel):
    pass


_TYPES = {}  # (kind, rounding) -> its type: the dispatcher types a marker per call


@typeof_impl.register(Activation)
def _typeof_activation(val, c):
    key = val.kind, val.rounding
    typ = _TYPES.get(key)
    if typ is None:
        typ = _TYPES[key] = ActivationType(*key)
    return typ


@unbox(ActivationType)
def _unbox_activation(typ, obj, c):
    return NativeValue(c.context.get_dummy_value())


# --- IR ---------------------------------------------------------------------------------


def constant(value_type, x):
    """A constant of ``value_type`` (a float or integer type, scalar or vector: every
    lane ``x``)."""
    if isinstance(value_type, ir.VectorType):
        return ir.Constant(value_type, [ir.Constant(value_type.element, x)] * value_type.count)
    return ir.Constant(value_type, x)


def _int_type(value_type):
    """The integer type (scalar or vector) with the float type's width."""
    element = value_type.element if isinstance(value_type, ir.VectorType) else value_type
    bits = _I64 if element == _F64 else _I32
    if isinstance(value_type, ir.VectorType):
        return ir.VectorType(bits, value_type.count)
    return bits


def _is_double(value_type):
    element = value_type.element if isinstance(value_type, ir.VectorType) else value_type
    return element == _F64


# float32: Cephes expf; float64: Cephes exp (Pade form)
_F32_EXP = dict(low=-104.0, magic=12582912.0, ln2_hi=0.693359375, ln2_lo=-2.12194440e-4,
                poly=(1.9875691500e-4, 1.3981999507e-3, 8.3334519073e-3, 4.1665795894e-2,
                      1.6666665459e-1, 5.0000001201e-1), bias=127, mantissa=23)
_F64_EXP = dict(low=-746.0, magic=6755399441055744.0, ln2_hi=6.93145751953125e-1,
                ln2_lo=1.42860682030941723212e-6,
                p=(1.26177193074810590878e-4, 3.02994407707441961300e-2,
                   9.99999999999999999910e-1),
                q=(3.00198505138664455042e-6, 2.52448340349684104192e-3,
                   2.27265548208155028766e-1, 2.00000000000000000009e0),
                bias=1023, mantissa=52)


def _horner(builder, x, coefficients):
    ty = x.type
    acc = constant(ty, coefficients[0])
    for c in coefficients[1:]:
        acc = builder.fadd(builder.fmul(acc, x), constant(ty, c))
    return acc


def exp_nonpositive(builder, t):
    """``exp(t)`` for ``t <= 0`` (a NaN gives some finite value: callers multiply it by
    the NaN they came from); 0 below the dtype's ``low``: ``t`` is clamped there, and
    ``exp(low)`` is below half the smallest subnormal (``2^-150``, ``2^-1075``), so the
    last product rounds it to 0."""
    ty = t.type
    k_ = _F64_EXP if _is_double(ty) else _F32_EXP
    low = constant(ty, k_["low"])
    below = builder.fcmp_ordered("<", t, low)
    ordered = builder.fcmp_ordered("==", t, t)
    # clamp into [low, 0]; a NaN becomes 0 (fptosi of NaN would be poison)
    u = builder.select(below, low, builder.select(ordered, t, constant(ty, 0.0)))
    magic = constant(ty, k_["magic"])
    k = builder.fsub(builder.fadd(builder.fmul(u, constant(ty, 1.0 / math.log(2.0))), magic),
                     magic)
    r = builder.fsub(builder.fsub(u, builder.fmul(k, constant(ty, k_["ln2_hi"]))),
                     builder.fmul(k, constant(ty, k_["ln2_lo"])))
    return _exp_reduced(builder, k, r)


def _exp_reduced(builder, k, r):
    """``exp(r) 2^k`` for ``|r| <= ln2 / 2`` (a little more is harmless) and an integral
    ``k`` (a float) from -2 * (bias - 1) to 0: the polynomial, then the two exponent-bit
    factors (the last product rounds once into the subnormals)."""
    ty = r.type
    k_ = _F64_EXP if _is_double(ty) else _F32_EXP
    one = constant(ty, 1.0)
    if _is_double(ty):
        rr = builder.fmul(r, r)
        px = builder.fmul(r, _horner(builder, rr, k_["p"]))
        qx = _horner(builder, rr, k_["q"])
        e = builder.fadd(one, builder.fmul(constant(ty, 2.0),
                                           builder.fdiv(px, builder.fsub(qx, px))))
    else:
        rr = builder.fmul(r, r)
        e = builder.fadd(builder.fadd(builder.fmul(_horner(builder, r, k_["poly"]), rr), r),
                         one)
    # 2^k as 2^k1 * 2^k2, k1 = k >> 1: each factor a normal number
    ity = _int_type(ty)
    ki = builder.fptosi(k, ity)
    k1 = builder.ashr(ki, constant(ity, 1))
    k2 = builder.sub(ki, k1)
    shift = constant(ity, k_["mantissa"])
    bias = constant(ity, k_["bias"])
    f1 = builder.bitcast(builder.shl(builder.add(k1, bias), shift), ty)
    f2 = builder.bitcast(builder.shl(builder.add(k2, bias), shift), ty)
    return builder.fmul(builder.fmul(e, f1), f2)


def sigmoid(builder, z):
    """``1 / (1 + e)`` (z >= 0) or ``e / (1 + e)`` with ``e = exp(-|z|)``."""
    ty = z.type
    zero = constant(ty, 0.0)
    positive = builder.fcmp_ordered(">", z, zero)
    e = exp_nonpositive(builder, builder.select(positive, builder.fsub(zero, z), z))  # -|z|
    denominator = builder.fadd(constant(ty, 1.0), e)
    numerator = builder.select(builder.fcmp_ordered(">=", z, zero), constant(ty, 1.0), e)
    return builder.fdiv(numerator, denominator)


GELU_A = math.sqrt(2.0 / math.pi)
GELU_B = 0.044715


def build(builder, kind, y):
    """IR of the activation ``kind`` on ``y`` (a float or double, scalar or vector)."""
    if kind == "none":
        return y
    ty = y.type
    if kind == "relu":
        return builder.select(builder.fcmp_ordered("<", y, constant(ty, 0.0)),
                              constant(ty, 0.0), y)
    if kind == "silu":
        return builder.fmul(y, sigmoid(builder, y))
    if kind == "gelu_tanh":
        cube = builder.fmul(builder.fmul(y, y), y)
        inner = builder.fadd(y, builder.fmul(constant(ty, GELU_B), cube))
        two_u = builder.fmul(constant(ty, 2.0 * GELU_A), inner)
        return builder.fmul(y, sigmoid(builder, two_u))
    if kind == "gelu":
        return erf.gelu(builder, y, _exp_reduced, _F64_EXP if _is_double(ty) else _F32_EXP)
    raise ValueError(f"no activation {kind!r}")


@intrinsic
def activate(typingctx, act, value):
    """``act`` applied to the scalar ``value`` (float32 or float64), as the vector
    bodies apply it."""
    if not (isinstance(act, ActivationType) and value in (types.float32, types.float64)):
        return None

    def codegen(context, builder, sig, args):
        return build(builder, act.kind, args[1])

    return value(act, value), codegen


@lower_constant(ActivationType)
def _constant_activation(context, builder, ty, pyval):
    """A marker used as a global inside a kernel (``activations.NONE``)."""
    return context.get_dummy_value()


# --- the residual added before the activation (None: none) ----------------------------


def epilogue_ok(y, res, act):
    """Types of an epilogue: ``res`` none or an array of y's dtype (a residual), ``act``
    an activation (for the vector intrinsics' typers)."""
    if not isinstance(act, ActivationType):
        return False
    return isinstance(res, types.NoneType) or (isinstance(res, types.Array)
                                               and res.dtype == y.dtype)


def residual_slice(res, lo, hi):
    """``res[lo:hi]``, or None when ``res`` is None; ``@njit`` only."""
    raise NotImplementedError("residual_slice is only callable from @njit code")


@intrinsic
def with_residual(typingctx, res, i, value):
    """``value + res[i]`` (``res[i]`` loaded in its compute dtype, the sum in the wider
    of the two, as Numba types ``value + load(res, i)``), or ``value`` when ``res`` is
    None. An intrinsic: an ``@overload`` compiled a pipeline for each signature."""
    if isinstance(res, types.NoneType):
        return value(res, i, value), lambda context, builder, sig, args: args[2]
    from normkernels.kernels.elements import load_codegen, load_type

    loaded = load_type(res, i)
    if loaded is None or not isinstance(value, types.Float):
        return None
    total = types.float64 if types.float64 in (loaded, value) else types.float32

    def codegen(context, builder, sig, args):
        element = load_codegen(context, builder, res, i, args[:2])
        return builder.fadd(context.cast(builder, args[2], value, total),
                            context.cast(builder, element, loaded, total))

    return total(res, i, value), codegen


@overload(residual_slice, inline="always", jit_options=OVERLOAD_OPTIONS)
def _residual_slice(res, lo, hi):
    if isinstance(res, types.NoneType):
        return lambda res, lo, hi: None
    return lambda res, lo, hi: res[lo:hi]

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
and ``exp`` of less than -104 (float32; -746 float64) is 0. ``y * sigmoid(z)`` (SiLU,
GELU-tanh) is one division, ``y / (1 + e)`` or ``(y e) / (1 + e)``: no product
rounded after it. ``exp(t)``: Cody-Waite reduction ``t = k ln2 + r`` (``|r| <= ln2 /
2``; ``k`` rounded by adding and subtracting 1.5 * 2^23 or 2^52, offset by ``K``), a
polynomial (float32: ``1 + r + r^2 P(r)``, P of degree 4 fitted to exp on the
reduced range, 0.08 ulp, evaluated in Estrin's order; float64: Cephes' Pade form ``1 +
2 r P / (Q - r P)``), and ``2^k`` as ``e 2^(k + K)`` (``k + K`` added to e's exponent
bits: the rounding constant's low bits are ``k + K``, shifted into place) times the
constant ``2^-K`` (``K`` 100 float32, 1000 float64): ``e 2^(k + K)`` is a normal
number for every ``k`` the callers make, so the last product rounds once, into the
subnormals where it goes there. About 30 vector instructions per 16 float32 SiLU
results (docs/design.md, "Smooth activations"). Error of an activated result
(tests/oracle.py): at most ``ACTIVATION_ULPS`` units of the compute dtype's roundoff
relative to ``|y| * max(1, sigmoid)``, on top of the propagated error of ``y``
(the activations' slopes are within [-0.13, 1.13]); SiLU and GELU-tanh within
``SIGMOID_ULPS`` (measured 2.0 and 2.1 float32); exact GELU's within
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
SIGMOID_ULPS = 4  # the same for SiLU and GELU-tanh (y times a sigmoid)

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


# float32: exp(r) = 1 + r + r^2 P(r), P's coefficients (low degree first) fitted to
# (exp(r) - 1 - r) / r^2 for the least relative error on |r| <= 1.01 ln2 / 2 (0.08 ulp
# with these float32 values); float64: Cephes exp (Pade form). ``offset``: K of 2^(k + K).
_F32_EXP = dict(low=-104.0, magic=12582912.0, ln2_hi=0.693359375, ln2_lo=-2.12194440e-4,
                poly=(0.4999999403953552, 0.16666515171527863, 0.04166845604777336,
                      0.008369418792426586, 0.0013813142431899905),
                mantissa=23, offset=100)
_F64_EXP = dict(low=-746.0, magic=6755399441055744.0, ln2_hi=6.93145751953125e-1,
                ln2_lo=1.42860682030941723212e-6,
                p=(1.26177193074810590878e-4, 3.02994407707441961300e-2,
                   9.99999999999999999910e-1),
                q=(3.00198505138664455042e-6, 2.52448340349684104192e-3,
                   2.27265548208155028766e-1, 2.00000000000000000009e0),
                mantissa=52, offset=1000)


def _horner(builder, x, coefficients):
    ty = x.type
    acc = constant(ty, coefficients[0])
    for c in coefficients[1:]:
        acc = builder.fadd(builder.fmul(acc, x), constant(ty, c))
    return acc


def _neg_abs(builder, z):
    """``-|z|``: z with its sign bit set (NaN stays NaN)."""
    ty = z.type
    ity = _int_type(ty)
    sign = -(1 << 63) if _is_double(ty) else -(1 << 31)
    return builder.bitcast(builder.or_(builder.bitcast(z, ity), constant(ity, sign)), ty)


def exp_nonpositive(builder, t):
    """``exp(t)`` for ``t <= 0`` (a NaN gives some finite value: callers multiply it by
    the NaN they came from); 0 below the dtype's ``low``: ``t`` is clamped there, and
    ``exp(low)`` is below half the smallest subnormal (``2^-150``, ``2^-1075``), so the
    last product rounds it to 0."""
    ty = t.type
    k_ = _F64_EXP if _is_double(ty) else _F32_EXP
    low = constant(ty, k_["low"])
    # clamp into [low, 0]; a NaN becomes low (fails the ordered comparison)
    u = builder.select(builder.fcmp_ordered(">=", t, low), t, low)
    # k + K rounded by the magic constant: its low bits are then k + K
    magic = constant(ty, k_["magic"] + k_["offset"])
    rounded = builder.fadd(builder.fmul(u, constant(ty, 1.0 / math.log(2.0))), magic)
    k = builder.fsub(rounded, magic)
    r = builder.fsub(builder.fsub(u, builder.fmul(k, constant(ty, k_["ln2_hi"]))),
                     builder.fmul(k, constant(ty, k_["ln2_lo"])))
    ity = _int_type(ty)
    bits = builder.shl(builder.bitcast(rounded, ity), constant(ity, k_["mantissa"]))
    return _scaled(builder, _exp_polynomial(builder, r), bits)


def _exp_polynomial(builder, r):
    """``exp(r)`` for ``|r| <= ln2 / 2`` (a little more is harmless)."""
    ty = r.type
    one = constant(ty, 1.0)
    rr = builder.fmul(r, r)
    if _is_double(ty):
        k_ = _F64_EXP
        px = builder.fmul(r, _horner(builder, rr, k_["p"]))
        qx = _horner(builder, rr, k_["q"])
        return builder.fadd(one, builder.fmul(constant(ty, 2.0),
                                              builder.fdiv(px, builder.fsub(qx, px))))
    c2, c3, c4, c5, c6 = (constant(ty, c) for c in _F32_EXP["poly"])
    # Estrin's order: three independent products, not Horner's chain of four
    p = builder.fadd(builder.fadd(builder.fadd(c2, builder.fmul(c3, r)),
                                  builder.fmul(rr, builder.fadd(c4, builder.fmul(c5, r)))),
                     builder.fmul(builder.fmul(rr, rr), c6))
    return builder.fadd(builder.fadd(builder.fmul(p, rr), r), one)


def _scaled(builder, e, bits):
    """``e 2^k`` from ``bits = (k + K) << mantissa``: ``e 2^(k + K)`` on the exponent bits
    (a normal number: e is within [0.7, 1.42] and ``k + K`` within the exponent's
    range), then ``2^-K``, one rounding."""
    ty = e.type
    ity = _int_type(ty)
    k_ = _F64_EXP if _is_double(ty) else _F32_EXP
    moved = builder.bitcast(builder.add(builder.bitcast(e, ity), bits), ty)
    return builder.fmul(moved, constant(ty, 2.0 ** -k_["offset"]))


def _exp_reduced(builder, k, r):
    """``exp(r) 2^k`` for ``|r| <= ln2 / 2`` (a little more is harmless) and an integral
    ``k`` (a float) from ``-125 - K`` to 0 (float64 ``-1021 - K``)."""
    ty = r.type
    ity = _int_type(ty)
    k_ = _F64_EXP if _is_double(ty) else _F32_EXP
    shifted = builder.add(builder.fptosi(k, ity), constant(ity, k_["offset"]))
    bits = builder.shl(shifted, constant(ity, k_["mantissa"]))
    return _scaled(builder, _exp_polynomial(builder, r), bits)


def _sigmoid_parts(builder, z):
    """``e = exp(-|z|)``, ``1 + e`` and whether ``z >= 0``."""
    e = exp_nonpositive(builder, _neg_abs(builder, z))
    above = builder.fcmp_ordered(">=", z, constant(z.type, 0.0))
    return e, builder.fadd(constant(z.type, 1.0), e), above


def sigmoid(builder, z):
    """``1 / (1 + e)`` (z >= 0) or ``e / (1 + e)`` with ``e = exp(-|z|)``."""
    e, denominator, above = _sigmoid_parts(builder, z)
    return builder.fdiv(builder.select(above, constant(z.type, 1.0), e), denominator)


def times_sigmoid(builder, y, z):
    """``y sigmoid(z)`` as one division: ``y / (1 + e)`` (z >= 0) or ``(y e) / (1 + e)``
    (a NaN z takes the second: ``y e`` is then NaN, as y is where z is NaN)."""
    e, denominator, above = _sigmoid_parts(builder, z)
    return builder.fdiv(builder.select(above, y, builder.fmul(y, e)), denominator)


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
        return times_sigmoid(builder, y, y)
    if kind == "gelu_tanh":
        cube = builder.fmul(builder.fmul(y, y), y)
        inner = builder.fadd(y, builder.fmul(constant(ty, GELU_B), cube))
        two_u = builder.fmul(constant(ty, 2.0 * GELU_A), inner)
        return times_sigmoid(builder, y, two_u)
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

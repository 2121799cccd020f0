"""GELU's exact form, ``gelu(y) = y Phi(y) = 0.5 y (1 + erf(y / sqrt 2))``, in LLVM IR for
:mod:`normkernels.kernels.activations` (which passes in its exponential: this module
imports no other).

The same rules as the other activations: ``fadd``/``fsub``/``fmul``/``fdiv``,
comparisons, selects, integer operations on the bits, no FMA, no library call; every
branch computed and the result selected, so a vector body and the scalar loop give the
same bits. float32 and float64 share the method and the coefficients (rounded to the
compute dtype).

Method. ``g = gelu(-t)`` for ``t = |y|``, then ``gelu(y) = y + g`` for ``y >= 0``
(``gelu(y) - gelu(-y) = y``; ``|g| <= Phi(-t) / Phi(t) |y + g|``, so g's error does not
grow). ``x = t / sqrt 2`` is never rounded where its rounding would be amplified: ``t``
is split as ``th + tl`` with ``th`` the top half of t's bits, so ``th * c`` (``c`` split
the same way) and ``th * th`` are exact. fdlibm's s_erf.c (Sun Microsystems, 1993)
supplies the intervals (in x) and the rational approximations (coefficients below as
published, checked against their hex forms; approximation errors 2^-57.9 or less):

* ``x < 0.84375``: ``erf(x) = x + x R(x^2)``; with ``x / 2 = t (h + l)`` (``h`` the
  head of ``1 / (2 sqrt 2)``, ``l`` its tail), ``Phi(-t) = (0.5 - th h) - ((tl h + t l)
  + (x / 2) R)``: ``0.5 - th h`` is exact, so the cancelling difference (down to 0.116)
  has no rounded operand;
* ``0.84375 <= x < 1.25``: ``erf(x) = erx + P(s) / Q(s)``, ``s = x - 1 = (2 th h - 1) +
  2 (tl h + t l)`` (the first difference exact), ``Phi(-t) = 0.5 (1 - erx) - 0.5 P /
  Q``; ``g = -t Phi(-t)`` in both (one rational: each lane selects its coefficients);
* ``x >= 1.25``: ``erfc(x) = exp(-x^2 - 0.5625 + R(1/x^2) / S(1/x^2)) / x`` (two
  coefficient sets, split at ``x = 1/0.35``, selected per lane; evaluated as ``z^8 R(1/z)
  / (z^8 S(1/z))``, polynomials in ``z = x^2``: no reciprocal), so ``g = -exp(-th^2/2 -
  0.5625 - ln(2)/2 + R/S - tl (t + th) / 2)``: one exponential, reduced as
  ``((-th^2/2 - k ln2_hi) - K_hi) + R/S - (k ln2_lo + tl (t + th) / 2 + K_lo)`` (the
  first two steps exact), never ``exp(-x^2)`` of a rounded ``x^2`` (its error would
  grow as ``x^2``).

``t`` is clamped at 40 (float64; 15 float32), past which ``gelu`` is ``y`` above 0 and
underflows to -0 below; beyond it ``y * (y > 0)`` is the result: ``gelu(inf) = inf``,
``gelu(-inf) = NaN`` (PyTorch's), NaN stays NaN. Error (tests/test_gelu.py): within
ACTIVATION_ULPS units of roundoff of the compute dtype relative to ``|gelu(y)|``, plus
the subnormal floor.
"""

from decimal import Decimal, localcontext
from fractions import Fraction

from llvmlite import ir

_F32 = ir.FloatType()
_F64 = ir.DoubleType()

# fdlibm s_erf.c
_ERX = 8.45062911510467529297e-01  # erf(1) rounded to 24 bits
# erf(x) = x + x * PP(x^2) / QQ(x^2) on [0, 0.84375]
_PP = (1.28379167095512558561e-01, -3.25042107247001499370e-01,
       -2.84817495755985104766e-02, -5.77027029648944159157e-03,
       -2.37630166566501626084e-05)
_QQ = (1.0, 3.97917223959155352819e-01, 6.50222499887672944485e-02,
       5.08130628187576562776e-03, 1.32494738004321644526e-04,
       -3.96022827877536812320e-06)
# erf(1 + s) = erx + PA(s) / QA(s) on [0.84375, 1.25]
_PA = (-2.36211856075265944077e-03, 4.14856118683748331666e-01,
       -3.72207876035701323847e-01, 3.18346619901161753674e-01,
       -1.10894694282396677476e-01, 3.54783043256182359371e-02,
       -2.16637559486879084300e-03)
_QA = (1.0, 1.06420880400844228286e-01, 5.40397917702171048937e-01,
       7.18286544141962662868e-02, 1.26171219808761642112e-01,
       1.36370839120290507362e-02, 1.19844998467991074170e-02)
# log(x erfc(x)) + x^2 + 0.5625 = RA(s) / SA(s), s = 1 / x^2, on [1.25, 1/0.35]
_RA = (-9.86494403484714822705e-03, -6.93858572707181764372e-01,
       -1.05586262253232909814e+01, -6.23753324503260060396e+01,
       -1.62396669462573470355e+02, -1.84605092906711035994e+02,
       -8.12874355063065934246e+01, -9.81432934416914548592e+00)
_SA = (1.0, 1.96512716674392571292e+01, 1.37657754143519042600e+02,
       4.34565877475229228821e+02, 6.45387271733267880336e+02,
       4.29008140027567833386e+02, 1.08635005541779435134e+02,
       6.57024977031928170135e+00, -6.04244152148580987438e-02)
# the same, RB(s) / SB(s), on [1/0.35, 28]
_RB = (-9.86494292470009928597e-03, -7.99283237680523006574e-01,
       -1.77579549177547519889e+01, -1.60636384855821916062e+02,
       -6.37566443368389627722e+02, -1.02509513161107724954e+03,
       -4.83519191608651397019e+02)
_SB = (1.0, 3.03380607434824582924e+01, 3.25792512996573918826e+02,
       1.53672958608443695994e+03, 3.19985821950859553908e+03,
       2.55305040643316442583e+03, 4.74528541206955367215e+02,
       -2.24409524465858183362e+01)


def _pad(coefficients, n):
    """Highest power first, zeros above the polynomial's degree, ``n`` in all."""
    return (0.0,) * (n - len(coefficients)) + tuple(reversed(coefficients))


# the rationals as highest-first Horner lists, the two sets of each pair the same length
# (a lane takes its set by a select): in v (x^2 or s) for erf, in z = x^2 for erfc
_NUM_A, _NUM_B = _pad(_PP, 7), _pad(_PA, 7)
_DEN_A, _DEN_B = _pad(_QQ, 7), _pad(_QA, 7)
_NUM_C, _NUM_D = _RA, (*_RB, 0.0)  # times z: z^8 R(1/z)
_DEN_C, _DEN_D = _SA, (*_SB, 0.0)  # z^8 S(1/z)


def _round_bits(value, keep):
    """``value`` (exact: a Fraction) rounded to ``keep`` significant bits."""
    e = 0
    while 2 ** (e + 1) <= abs(value):
        e += 1
    while 2 ** e > abs(value):
        e -= 1
    scale = Fraction(2) ** (keep - 1 - e)
    return Fraction(round(value * scale)) / scale


def _constants(head_bits, significand, t_max):
    """One compute dtype's constants: ``c/2 = 1 / (2 sqrt 2)`` as a head of
    ``head_bits`` bits (times th's ``head_bits`` bits: exact) and a tail, ``K = 0.5625 +
    ln(2) / 2`` as the dtype's nearest and a tail, th's mask, the clamp of t."""
    with localcontext() as ctx:
        ctx.prec = 60
        half_c = Fraction(Decimal(2).sqrt() / 4)
        k = Fraction(Decimal("0.5625") + Decimal(2).ln() / 2)
    half_c_hi, k_hi = _round_bits(half_c, head_bits), _round_bits(k, significand)
    return dict(half_c_hi=float(half_c_hi), half_c_lo=float(half_c - half_c_hi),
                k_hi=float(k_hi), k_lo=float(k - k_hi), mask=-(1 << (significand - head_bits)),
                t_max=t_max)


_SQRT2 = 2.0 ** 0.5
# 26 of float64's 53 bits and 12 of float32's 24 in th and in c/2's head (products exact)
_CONST = {_F64: _constants(26, 53, 40.0), _F32: _constants(12, 24, 15.0)}
_T_A, _T_B, _T_C = 0.84375 * _SQRT2, 1.25 * _SQRT2, _SQRT2 / 0.35  # the intervals, in t


def _element(ty):
    return ty.element if isinstance(ty, ir.VectorType) else ty


def _splat(ty, x):
    if isinstance(ty, ir.VectorType):
        return ir.Constant(ty, [ir.Constant(ty.element, x)] * ty.count)
    return ir.Constant(ty, x)


def _int_type(ty):
    bits = ir.IntType(64 if _element(ty) == _F64 else 32)
    return ir.VectorType(bits, ty.count) if isinstance(ty, ir.VectorType) else bits


def _horner_either(builder, v, first, set_a, set_b):
    """Horner's rule in ``v`` on the coefficients ``set_a`` where ``first`` holds, else
    ``set_b`` (highest power first)."""
    ty = v.type

    def coefficient(a, b):
        if a == b:
            return _splat(ty, a)
        return builder.select(first, _splat(ty, a), _splat(ty, b))

    acc = coefficient(set_a[0], set_b[0])
    for a, b in zip(set_a[1:], set_b[1:], strict=True):
        acc = builder.fadd(builder.fmul(acc, v), coefficient(a, b))
    return acc


def gelu(builder, y, exp_reduced, exp_constants):
    """IR of ``gelu(y)``; ``exp_reduced(builder, k, r)`` is ``exp(r) 2^k`` and
    ``exp_constants`` its ``magic``, ``ln2_hi``, ``ln2_lo`` (Cody-Waite)."""
    ty = y.type
    c = _CONST[_element(ty)]

    def k_(x):
        return _splat(ty, x)

    zero = k_(0.0)
    positive = builder.fcmp_ordered(">", y, zero)
    w = builder.select(positive, builder.fsub(zero, y), y)  # -|y| (-0.0 kept)
    t = builder.fsub(zero, w)
    inside = builder.fcmp_ordered("<", t, k_(c["t_max"]))  # false for NaN
    t = builder.select(inside, t, k_(c["t_max"]))
    # t = th + tl, th: t with its low mantissa bits cleared
    ity = _int_type(ty)
    th = builder.bitcast(builder.and_(builder.bitcast(t, ity), _splat(ity, c["mask"])), ty)
    tl = builder.fsub(t, th)
    p1 = builder.fmul(th, k_(c["half_c_hi"]))  # exact
    p2 = builder.fadd(builder.fmul(tl, k_(c["half_c_hi"])), builder.fmul(t, k_(c["half_c_lo"])))
    half_x = builder.fadd(p1, p2)
    z = builder.fmul(builder.fmul(t, t), k_(0.5))  # x^2

    # one division: erf's rational below x = 1.25 (in x^2 or s = x - 1), erfc's above
    in_a = builder.fcmp_ordered("<", t, k_(_T_A))
    in_erfc = builder.fcmp_ordered(">=", t, k_(_T_B))
    in_c = builder.fcmp_ordered("<", t, k_(_T_C))
    s = builder.fadd(builder.fsub(builder.fmul(p1, k_(2.0)), k_(1.0)),
                     builder.fmul(p2, k_(2.0)))  # x - 1
    v = builder.select(in_a, z, s)
    num = builder.select(in_erfc,
                         builder.fmul(_horner_either(builder, z, in_c, _NUM_C, _NUM_D), z),
                         _horner_either(builder, v, in_a, _NUM_A, _NUM_B))
    den = builder.select(in_erfc, _horner_either(builder, z, in_c, _DEN_C, _DEN_D),
                         _horner_either(builder, v, in_a, _DEN_A, _DEN_B))
    ratio = builder.fdiv(num, den)

    # x < 1.25: Phi(-t) from erf
    head = builder.select(in_a, builder.fsub(k_(0.5), p1), k_(0.5 * (1.0 - _ERX)))
    tail = builder.select(in_a, p2, zero)
    weight = builder.select(in_a, half_x, k_(0.5))
    phi = builder.fsub(head, builder.fadd(tail, builder.fmul(weight, ratio)))
    g_erf = builder.fmul(w, phi)

    # x >= 1.25: -exp(-x^2 - 0.5625 - ln(2)/2 + R/S), R/S the ratio (finite anywhere)
    rs = ratio
    a = builder.fmul(builder.fmul(th, th), k_(-0.5))  # exact
    m = builder.fmul(builder.fmul(tl, builder.fadd(t, th)), k_(0.5))
    magic = k_(exp_constants["magic"])
    approx = builder.fadd(a, builder.fsub(rs, k_(c["k_hi"])))
    kf = builder.fsub(builder.fadd(builder.fmul(approx, k_(1.4426950408889634)), magic),
                      magic)
    r = builder.fsub(builder.fsub(a, builder.fmul(kf, k_(exp_constants["ln2_hi"]))),
                     k_(c["k_hi"]))  # exact
    small = builder.fadd(builder.fadd(builder.fmul(kf, k_(exp_constants["ln2_lo"])), m),
                         k_(c["k_lo"]))
    r = builder.fsub(builder.fadd(r, rs), small)
    g_erfc = builder.fneg(exp_reduced(builder, kf, r))

    g = builder.select(in_erfc, g_erfc, g_erf)
    result = builder.select(builder.fcmp_ordered(">=", y, zero), builder.fadd(y, g), g)
    step = builder.select(positive, k_(1.0), zero)
    return builder.select(inside, result, builder.fmul(y, step))

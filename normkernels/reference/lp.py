"""The float64 rules of the Lp and LRN kernels, in NumPy, for the slow twins
(:mod:`normkernels.reference`): Lp's fold of a vector's norm (:func:`lp_fold`), the
 the C library's ``pow`` (:func:`c_pow`, LRN's
``base ** beta``). Each states the rule of the kernel it names.
"""

import math

import numpy as np

LP_TINY = 1e-290  # the kernels' thresholds (normkernels.kernels.lp)
LP_PRESCALE_LIMIT = 1000


def lp_fold(v, p):
    """Per vector of float64 ``v`` (``outer x K x inner``, along axis 1) ``(s, r)`` with
    ``y = (v * s) / r``: the rule of :func:`normkernels.kernels.lp.fold`. ``s = 1``
    and ``r`` the norm when the float64 sum is finite and at least ``LP_TINY``;
    otherwise a zero vector has ``(0, 1)``, one with an infinite element ``(1,
    norm)``, and a finite one ``s`` a power of two taking max|v| near 1 and ``r`` the
    norm of ``v * s``."""
    with np.errstate(all="ignore"):
        total = (np.abs(v) if p == 1 else v * v).sum(axis=1, keepdims=True)
        s = np.ones_like(total)
        r = np.sqrt(total) if p == 2 else total
        redo = (total > np.finfo(np.float64).max) | (total < LP_TINY)
        if not redo.any():
            return s, r
        m = np.where(np.isnan(v), 0.0, np.abs(v)).max(axis=1, keepdims=True)
        zero = redo & (m == 0)
        scaled = redo & (m > 0) & np.isfinite(m)
        e = np.frexp(np.where(scaled, m, 1.0))[1]
        s_new = np.ldexp(1.0, np.clip(-e, -LP_PRESCALE_LIMIT, LP_PRESCALE_LIMIT))
        vs = v * s_new
        t = (np.abs(vs) if p == 1 else vs * vs).sum(axis=1, keepdims=True)
        r_new = np.sqrt(t) if p == 2 else t
        s = np.where(scaled, s_new, np.where(zero, 0.0, s))
        r = np.where(scaled, r_new, np.where(zero, 1.0, r))
    return s, r


def _c_pow(b, e):
    """The C library's ``pow(b, e)``: ``math.pow``, with C99's results where it raises."""
    try:
        return math.pow(b, e)
    except OverflowError:
        odd = e == math.floor(e) and math.fmod(e, 2.0) != 0.0
        return -math.inf if b < 0 and odd else math.inf
    except ValueError:  # zero to a negative power, or a negative base to a fraction
        if b == 0:
            odd = e == math.floor(e) and math.fmod(e, 2.0) != 0.0
            return math.copysign(math.inf, b) if odd else math.inf
        return math.nan


_c_pow_ufunc = np.frompyfunc(_c_pow, 2, 1)


def c_pow(base, e):
    """Elementwise C-library ``pow`` of a float64 array (NumPy's ``power`` may use
    other approximations: SIMD pow differs from libm in the last bit)."""
    return np.asarray(_c_pow_ufunc(base, e), dtype=np.float64)

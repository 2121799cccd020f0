"""Inference in compiled code from the raw parameters: fold, then normalize.

Folding is O(C) but runs on every call; in NumPy it costs several microseconds of
temporaries, more than the whole normalize pass of a small tensor. :func:`fold`
states the folding rule of :func:`normkernels.reference.fold_parameters` (the NumPy
twin's) in a loop, bit for bit; :func:`normalize_planes_serial` and
:func:`normalize_periodic_serial` fold and run the one-thread loop in one call, so a
small tensor costs one compiled call.
"""

import math

import numpy as np
from numba import njit

import normkernels.kernels.cache  # noqa: F401  (registers the cache locators before any @njit)
from normkernels.kernels.elements import compute_empty, load
from normkernels.kernels.options import INLINE_OPTIONS, KERNEL_OPTIONS, TABLE_PAD
from normkernels.kernels.scale_shift import (
    scale_shift_periodic_serial,
    scale_shift_planes_serial,
)


@njit(**INLINE_OPTIONS)
def _extent(p):
    """Bytes ``[lo, hi)`` spanned by 1-D ``p`` (its stride may be negative)."""
    lo = p.ctypes.data
    span = (p.size - 1) * p.strides[0]
    if span < 0:
        return lo + span, lo + p.itemsize
    return lo, lo + span + p.itemsize


@njit(**INLINE_OPTIONS)
def _overlaps(y, p):
    lo, hi = _extent(p)
    y_lo = y.ctypes.data
    return p.size > 0 and lo < y_lo + y.size * y.itemsize and y_lo < hi


@njit(**INLINE_OPTIONS)
def shares_input(x, y, scale, B, mean, var):
    """Whether contiguous ``y`` may share memory with an input other than by being
    ``x`` exactly (bounds only, as ``numpy.may_share_memory``): a call plan then
    hands the call to the full checks, which say whether it really does."""
    if x.ctypes.data != y.ctypes.data and _overlaps(y, x):
        return True
    return _overlaps(y, scale) or _overlaps(y, B) or _overlaps(y, mean) or _overlaps(y, var)


@njit(**INLINE_OPTIONS)
def fold(scale, B, mean, var, epsilon, m, a, b):
    """``(m, a, b)`` in the compute dtype such that ``(x - m) * a + b`` is
    ``(x - mean) * scale / sqrt(var + epsilon) + B``: ``a`` in float64 rounded once;
    ``m`` the rounding of ``mean`` and, when mean is wider than the compute dtype, the
    residual ``(mean - m) * a`` folded into ``b`` in float64 (zero where ``m`` is not
    finite). Parameters in any storage dtype."""
    wide = mean.itemsize > m.itemsize  # a float64 mean for float32 compute
    for c in range(m.size):
        a64 = np.float64(load(scale, c)) / math.sqrt(np.float64(load(var, c)) + epsilon)
        a[c] = a64
        mean_c = load(mean, c)
        m[c] = mean_c
        if wide:
            residual = np.float64(mean_c) - np.float64(m[c]) if math.isfinite(m[c]) else 0.0
            b[c] = np.float64(load(B, c)) - residual * a64
        else:
            b[c] = load(B, c)


@njit(**INLINE_OPTIONS)
def _folded(x, C, scale, B, mean, var, epsilon):
    m, a, b = compute_empty(x, C), compute_empty(x, C), compute_empty(x, C)
    fold(scale, B, mean, var, epsilon, m, a, b)
    return m, a, b


# The one-thread inference kernels: with ``guard``, first :func:`shares_input`, and
# when it finds an overlap, return False having written nothing; then fold and run
# the loop. One kernel per loop shape, so a first call compiles only the loop it runs.


@njit(**KERNEL_OPTIONS)
def normalize_planes_serial(x, y, C, S, scale, B, mean, var, epsilon, guard, res, act):
    """Fold, then ``y = act((x - m) * a + b + res)`` on one thread by the planes loop."""
    if guard and shares_input(x, y, scale, B, mean, var):
        return False
    m, a, b = _folded(x, C, scale, B, mean, var, epsilon)
    scale_shift_planes_serial(x, y, C, S, m, a, b, res, act)
    return True


@njit(**KERNEL_OPTIONS)
def normalize_periodic_serial(x, y, C, S, scale, B, mean, var, epsilon, period, guard, res,
                              act):
    """Fold, then the periodic loop over tables of ``period`` entries (a multiple of
    ``C * S``) plus ``TABLE_PAD`` of wrap-around, built here."""
    if guard and shares_input(x, y, scale, B, mean, var):
        return False
    m, a, b = _folded(x, C, scale, B, mean, var, epsilon)
    n = period + TABLE_PAD
    mt, at, bt = compute_empty(x, n), compute_empty(x, n), compute_empty(x, n)
    fill_tables(C, S, m, a, b, mt, at, bt)
    scale_shift_periodic_serial(x, y, period, mt, at, bt, res, act)
    return True


@njit(**INLINE_OPTIONS)
def fill_tables(C, S, m, a, b, mt, at, bt):
    """Parameter tables of the periodic loop: entry ``i`` holds channel
    ``(i // S) % C``'s parameters (a compiled loop: the NumPy gather cost 15 us per call
    for 2048 channels)."""
    for i in range(mt.size):
        c = (i // S) % C
        mt[i], at[i], bt[i] = m[c], a[c], b[c]


@njit(**KERNEL_OPTIONS)
def running(previous, batch, momentum, out):
    """``out = previous * momentum + batch * (1 - momentum)`` in float64, rounded once
    into ``out`` (float32 or float64: a 16-bit ``out`` would round twice here)."""
    keep = 1.0 - momentum
    for c in range(out.size):
        out[c] = np.float64(load(previous, c)) * momentum + batch[c] * keep

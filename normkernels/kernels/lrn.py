"""LRN (local response normalization across channels).

Per element: ``y = x / (bias + coef * square_sum) ** beta`` with ``coef = alpha / size``
and ``square_sum`` the sum of ``x**2`` over the channels ``c - (size - 1) // 2 ..
c + size // 2`` that exist (ONNX's window; missing channels count as zeros). All in
float64 for every dtype (squares of float32 numbers are exact there), rounded once to
X's dtype (:func:`normkernels.kernels.lp.store_rounded`).

The window is summed directly, in ascending channel order starting from 0.0, for
every element: a running sum (add the entering channel, subtract the leaving one) is
O(1) per element but cancels when a large channel leaves the window next to small
ones. Both layouts and the NumPy twin add in the same order, so they agree bit for bit.

``power``: ``b ** beta`` by ``math.pow`` (the C library's pow); with ``fast`` (the
engine sets it for beta = 0.75 and narrower than float64 X) ``sqrt(b) *
sqrt(sqrt(b))``, within 2 float64 ulps of it and far cheaper: harmless after the
rounding to float32 or 16 bits.

* **planes** (channels-first memory, ``N x C x S``): a work item is one sample and a
  chunk of ``w`` spatial positions: the squares of the chunk for all ``C`` channels go
  to float64 scratch (``C x w``), then each channel's window sums are added row by row
  (vectorised across the chunk) and its outputs written.
* **rows** (channels-last memory, ``M`` rows of ``C``): a work item is a block of
  rows; per row the squares, then the window sums as ``size`` shifted adds
  (vectorised across the channels; each channel still adds in ascending order).

``y`` may be ``x``: an item reads all its squares before writing, and each output
element's ``x`` is read just before it is overwritten.
"""

import math

import numpy as np
from numba import njit, prange

import normkernels.kernels.cache  # noqa: F401  (registers the cache locators before any @njit)
from normkernels.kernels.cache import serial_twin
from normkernels.kernels.elements import load
from normkernels.kernels.lp import store_rounded
from normkernels.kernels.options import HELPER_OPTIONS, INLINE_OPTIONS, KERNEL_OPTIONS

_INLINE = INLINE_OPTIONS


@njit(**_INLINE)
def power(b, beta, fast):
    """``b ** beta`` (see the module docstring)."""
    if fast:
        r = math.sqrt(b)
        return r * math.sqrt(r)
    return math.pow(b, beta)


@njit(**HELPER_OPTIONS)
def _squares(x, o, w, sq, so):
    """``sq[so + j] = x[o + j] ** 2`` in float64 (slices indexed from 0: vectorised)."""
    xs, dest = x[o:o + w], sq[so:so + w]
    for j in range(w):
        v = np.float64(load(xs, j))
        dest[j] = v * v


@njit(**HELPER_OPTIONS)
def _window(sq, lo, hi, w, ss):
    """``ss[j] = sum(sq[i * w + j] for i in lo..hi)``, ascending from 0.0, vectorised
    across ``j``."""
    for j in range(w):
        ss[j] = 0.0
    for i in range(lo, hi + 1):
        row = sq[i * w:(i + 1) * w]
        for j in range(w):
            ss[j] += row[j]


@njit(**KERNEL_OPTIONS)
def _outputs(x, y, o, w, ss, coef, bias, beta, fast):
    """``y[o + j] = x[o + j] / power(bias + coef * ss[j], beta)``."""
    xs, ys = x[o:o + w], y[o:o + w]
    for j in range(w):
        store_rounded(ys, j, np.float64(load(xs, j)) / power(bias + coef * ss[j], beta, fast))


@njit(**HELPER_OPTIONS)
def _plane_item(x, y, C, S, n, s0, w, size, coef, bias, beta, fast):
    """Sample ``n``, spatial positions ``s0..s0+w-1``, every channel. Its own function:
    scratch arrays made inside a parallel kernel's body would become parallel regions
    of their own (see ``_prepare`` in kernels/rows.py)."""
    sq, ss = np.empty(C * w), np.empty(w)
    base = n * C * S + s0
    for c in range(C):
        _squares(x, base + c * S, w, sq, c * w)
    below, above = (size - 1) // 2, size // 2
    for c in range(C):
        _window(sq, max(0, c - below), min(C - 1, c + above), w, ss)
        _outputs(x, y, base + c * S, w, ss, coef, bias, beta, fast)


@njit(parallel=True, **KERNEL_OPTIONS)
def planes_parallel(x, y, C, S, chunk, size, coef, bias, beta, fast):
    """Channels-first storage (``x.size // (C * S)`` samples of ``C`` planes of
    ``S``): items of one sample and ``chunk`` spatial positions, in parallel."""
    N = x.size // (C * S)
    chunks = (S + chunk - 1) // chunk
    for item in prange(N * chunks):
        n, k = item // chunks, item % chunks
        s0 = k * chunk
        _plane_item(x, y, C, S, n, s0, min(chunk, S - s0), size, coef, bias, beta, fast)


planes_serial = serial_twin(planes_parallel, **KERNEL_OPTIONS)


@njit(**HELPER_OPTIONS)
def _shifted_add(sq, d, C, ss):
    """``ss[c] += sq[c + d]`` for the channels ``c`` with ``0 <= c + d < C`` (slices
    from 0: vectorised)."""
    lo, hi = max(0, -d), min(C, C - d)
    if hi <= lo:
        return
    src, dest = sq[lo + d:hi + d], ss[lo:hi]
    for j in range(hi - lo):
        dest[j] += src[j]


@njit(**HELPER_OPTIONS)
def _row_block(x, y, C, first, last, size, coef, bias, beta, fast):
    """Rows ``first..last-1``: per row its squares, the window sums as shifted adds in
    ascending channel order (the order of the planes loop), then the outputs."""
    sq, ss = np.empty(C), np.empty(C)
    below, above = (size - 1) // 2, size // 2
    for r in range(first, last):
        o = r * C
        _squares(x, o, C, sq, 0)
        for c in range(C):
            ss[c] = 0.0
        for d in range(-below, above + 1):
            _shifted_add(sq, d, C, ss)
        _outputs(x, y, o, C, ss, coef, bias, beta, fast)


@njit(parallel=True, **KERNEL_OPTIONS)
def rows_parallel(x, y, C, rows_per_item, size, coef, bias, beta, fast):
    """Channels-last storage (``x.size // C`` rows of ``C`` channels): items of
    ``rows_per_item`` rows in parallel."""
    M = x.size // C
    for item in prange((M + rows_per_item - 1) // rows_per_item):
        first = item * rows_per_item
        _row_block(x, y, C, first, min(M, first + rows_per_item), size, coef, bias, beta, fast)


rows_serial = serial_twin(rows_parallel, **KERNEL_OPTIONS)

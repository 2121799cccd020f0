"""Per-head RMSNorm of q and k in a packed qkv (Qwen3, OLMo-2 per head, Gemma-3), in
place.

Row ``r`` of the flat storage array ``x`` (at ``r * xr``) holds ``nq`` q heads, then
``nk`` k heads, then the v heads (never read nor written), each ``D`` contiguous
elements. Per head: the float64 mean square (:func:`normkernels.kernels.rows.
row_statistics`), ``a = 1 / sqrt(ms + epsilon)`` rounded once to the compute dtype
(float32 for 16-bit and float32 X, float64 for float64 X; the dtype of the weight
tables ``qw`` and ``kw``), then per element, in place:

* ``llama`` False (the package's rule): ``x = round_T((x * a) * w)``;
* ``llama`` True (Hugging Face's ``Qwen3RMSNorm``: ``weight * h.to(input_dtype)``):
  ``x = round_T(x * a)`` first, then ``x = round_T(x * w)`` (the product of two values
  of T is exact in float32, so this is torch's ``T * T``).

A row's statistics are all read before any of its elements is written.
"""

import math

import numpy as np
from numba import njit, prange

import normkernels.kernels.cache  # noqa: F401  (registers the cache locators before any @njit)
from normkernels.kernels.cache import serial_twin
from normkernels.kernels.elements import load, store
from normkernels.kernels.options import INLINE_OPTIONS, KERNEL_OPTIONS
from normkernels.kernels.rows import row_statistics


@njit(**INLINE_OPTIONS)
def _scale(xs, a, w, llama):
    """The elements of one head (``xs``, a slice indexed from 0: an offset index
    blocked vectorisation)."""
    if llama:
        for i in range(xs.size):
            store(xs, i, load(xs, i) * a)
        for i in range(xs.size):
            store(xs, i, load(xs, i) * w[i])
    else:
        for i in range(xs.size):
            store(xs, i, (load(xs, i) * a) * w[i])


@njit(**INLINE_OPTIONS)
def _rows(x, xr, qw, kw, nq, nk, epsilon, llama, var, first, last):
    """Per row three loops over its heads: the statistics, the scalars ``a``, the
    elements (the square roots and divisions then pipeline across heads rather than
    wait between a head's statistics and its elements: 1.2 ms against 0.8 for 512
    tokens of Qwen3-8B on one thread)."""
    D = qw.size
    H = nq + nk
    a = np.empty(H, qw.dtype)
    for r in range(first, last):
        o, j = r * xr, r * H
        for h in range(H):
            var[j + h] = row_statistics(x, o + h * D, D, False)[1]
        for h in range(H):
            a[h] = 1.0 / math.sqrt(var[j + h] + epsilon)
        for h in range(nq):
            _scale(x[o + h * D:o + h * D + D], a[h], qw, llama)
        for h in range(nq, H):
            _scale(x[o + h * D:o + h * D + D], a[h], kw, llama)


@njit(**KERNEL_OPTIONS)
def _item(x, xr, qw, kw, nq, nk, epsilon, llama, var, first, last):
    _rows(x, xr, qw, kw, nq, nk, epsilon, llama, var, first, last)


@njit(parallel=True, **KERNEL_OPTIONS)
def qk_norm_parallel(x, xr, M, qw, kw, nq, nk, epsilon, llama, var, per_item):
    """The ``M`` rows, blocks of ``per_item`` rows in parallel (no bit depends on it);
    the mean square of each head into ``var`` (float64, ``M * (nq + nk)``, row-major)."""
    for item in prange((M + per_item - 1) // per_item):
        first = item * per_item
        _item(x, xr, qw, kw, nq, nk, epsilon, llama, var, first, min(M, first + per_item))


qk_norm_serial = serial_twin(qk_norm_parallel, **KERNEL_OPTIONS)  # one thread, same bits

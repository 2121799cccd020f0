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

Why the loops look like this (one thread, 512 tokens of Qwen3-8B, bfloat16, on a busy
2-core VM): ``row_statistics`` per head cost 50 ns of its 128 elements (a call of
``chunk_squares`` and a slice per head; 1.04 ms for the statistics of the 20480
heads); :func:`_head_squares` repeats its arithmetic inline on offsets (the same lanes
in the same order: the same bits), 0.31 ms. The elements went through scalar
``load``/``store`` on a slice per head (0.48 ms, bfloat16 rounded on the bits);
:func:`_scaled_once` and :func:`_scaled_llama` do 64 bytes at a time with the vector
conversions of :mod:`normkernels.kernels.vectors` (``vcvtneps2bf16`` where the CPU has
it, the bit rounding elsewhere: the same bits). The whole kernel, rows in L1: 79 -> 26
ns a head (float16 68 -> 21, float32 45 -> 23).
"""

import math

import numpy as np
from numba import njit, prange, types
from numba.core.extending import intrinsic, overload

import normkernels.kernels.cache  # noqa: F401  (registers the cache locators before any @njit)
from normkernels.kernels.cache import serial_twin
from normkernels.kernels.elements import load, store
from normkernels.kernels.lanes import deviations, lane_count, lane_sum, widened, zeros
from normkernels.kernels.options import (
    HELPER_OPTIONS,
    INLINE_OPTIONS,
    KERNEL_OPTIONS,
    OVERLOAD_OPTIONS,
    SHORT_ROW,
)
from normkernels.kernels.rows import row_statistics
from normkernels.kernels.statistics import NARROW_RUN, PLANE_CHUNK
from normkernels.kernels.vectors import (
    broadcast,
    element_ptr,
    load_vector,
    storage_codec,
    store_vector,
)


def _scaled_codegen(llama):
    """One 64-byte vector of a head in place: ``x = round_T((x * a) * w)``, or with
    ``llama`` ``round_T(round_T(x * a) * w)``; plain ``fmul`` (no FMA), the rounding of
    :func:`normkernels.kernels.elements.store`."""

    def codegen(context, builder, sig, args):
        xty, _, _, wty, _ = sig.args
        index = context.cast(builder, args[1], sig.args[1], types.intp)
        phase = context.cast(builder, args[4], sig.args[4], types.intp)
        lanes, elem, widen, narrow = storage_codec(xty.dtype)
        xv = load_vector(builder, element_ptr(context, builder, xty, args[0], index),
                         lanes, elem, xty.dtype.bitwidth // 8)
        if widen is not None:
            xv = widen(builder, xv, lanes)
        wv = load_vector(builder, element_ptr(context, builder, wty, args[3], phase),
                         lanes, xv.type.element, wty.dtype.bitwidth // 8)
        h = builder.fmul(xv, broadcast(builder, args[2], lanes))
        if llama and narrow is not None:
            h = widen(builder, narrow(builder, h, lanes), lanes)
        y = builder.fmul(h, wv)
        if narrow is not None:
            y = narrow(builder, y, lanes)
        store_vector(context, builder, xty, args[0], index, y, False)
        return context.get_dummy_value()

    return codegen


def _scaled_intrinsic(llama):
    def typer(typingctx, x, index, a, w, phase):
        if not (isinstance(x, types.Array) and storage_codec(x.dtype) is not None
                and isinstance(index, types.Integer) and isinstance(phase, types.Integer)):
            return None
        compute = types.float64 if x.dtype == types.float64 else types.float32
        if a != compute or not (isinstance(w, types.Array) and w.dtype == compute):
            return None
        return types.void(x, index, a, w, phase), _scaled_codegen(llama)

    return intrinsic(typer)


_scaled_once = _scaled_intrinsic(False)
_scaled_llama = _scaled_intrinsic(True)


def _vector_lanes(x):
    """Elements of ``x``'s storage dtype in one 64-byte vector (``@njit`` only)."""
    raise NotImplementedError("_vector_lanes is only callable from @njit code")


@overload(_vector_lanes, inline="always", jit_options=OVERLOAD_OPTIONS)
def _vector_lanes_impl(x):
    lanes = storage_codec(x.dtype)[0]
    return lambda x: lanes


@njit(**INLINE_OPTIONS)
def _scale(x, p, D, a, w, llama):
    """The ``D`` elements of the head at ``x[p]``: whole vectors, then the tail
    element by element (the same arithmetic)."""
    L = _vector_lanes(x)
    n = D - D % L
    if llama:
        for i in range(0, n, L):
            _scaled_llama(x, p + i, a, w, i)
        for i in range(n, D):
            store(x, p + i, load(x, p + i) * a)
            store(x, p + i, load(x, p + i) * w[i])
    else:
        for i in range(0, n, L):
            _scaled_once(x, p + i, a, w, i)
        for i in range(n, D):
            store(x, p + i, (load(x, p + i) * a) * w[i])


def _head_squares(x, p, D):
    """The sum of squares of ``x[p:p + D]`` as ``chunk_squares`` forms it for one chunk
    (``SHORT_ROW <= D <= PLANE_CHUNK``), not finite where it would fall back to
    float64 (``@njit`` only)."""
    raise NotImplementedError("_head_squares is only callable from @njit code")


@njit(**INLINE_OPTIONS)
def _narrow_head_squares(x, p, D):
    """16-bit X: runs of ``NARROW_RUN`` summed in float32 lanes (``lanes.shifted_sums``
    with shift 0), joined in float64, in order (``rows._span_squares``)."""
    z = np.float32(0.0)
    count = lane_count(z)
    total = 0.0
    for lo in range(0, D, NARROW_RUN):
        n = min(D - lo, NARROW_RUN)
        acc = zeros(z)
        i = 0
        while i + count <= n:
            d = deviations(x, p + lo + i, z)
            acc = acc + d * d
            i += count
        s = lane_sum(acc)
        for k in range(i, n):
            d = widened(x, p + lo + k, z) - z
            s += d * d
        total += np.float64(s)
    return total


@njit(**INLINE_OPTIONS)
def _wide_head_squares(x, p, D):
    """float32 and float64 X: float64 lanes over the chunk (``rows._wide_squares``)."""
    z = 0.0
    count = lane_count(z)
    acc = zeros(z)
    i = 0
    while i + count <= D:
        d = deviations(x, p + i, z)
        acc = acc + d * d
        i += count
    s = lane_sum(acc)
    for k in range(i, D):
        d = widened(x, p + k, z) - z
        s += d * d
    return s


@overload(_head_squares, inline="always", jit_options=OVERLOAD_OPTIONS)
def _head_squares_impl(x, p, D):
    if x.dtype.bitwidth == 16:
        return lambda x, p, D: _narrow_head_squares(x, p, D)
    return lambda x, p, D: _wide_head_squares(x, p, D)


@njit(**INLINE_OPTIONS)
def _rows(x, xr, qw, kw, nq, nk, epsilon, llama, var, first, last):
    """Per row four loops over its heads: the statistics inline, ``row_statistics``
    where they do not apply, the scalars ``a``, the elements (the square roots and
    divisions then pipeline across heads rather than wait between a head's statistics
    and its elements: 1.2 ms against 0.8 for 512 tokens of Qwen3-8B on one thread,
    before the inline statistics). ``row_statistics`` has a loop of its own: in the
    loop of the inline sums, though never called, it made that loop 16 ns a head
    against 7 (bfloat16, 128 elements)."""
    D = qw.size
    H = nq + nk
    a = np.empty(H, qw.dtype)
    inline = SHORT_ROW <= D <= PLANE_CHUNK  # row_statistics then sums one chunk
    for r in range(first, last):
        o, j = r * xr, r * H
        if inline:
            for h in range(H):
                var[j + h] = (0.0 + _head_squares(x, o + h * D, D)) / D
        for h in range(H):  # not inline, or float32 sums that overflowed (16-bit X)
            if not (inline and math.isfinite(var[j + h])):
                var[j + h] = row_statistics(x, o + h * D, D, False)[1]
        for h in range(H):
            a[h] = 1.0 / math.sqrt(var[j + h] + epsilon)
        for h in range(nq):
            _scale(x, o + h * D, D, a[h], qw, llama)
        for h in range(nq, H):
            _scale(x, o + h * D, D, a[h], kw, llama)


@njit(**HELPER_OPTIONS)
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

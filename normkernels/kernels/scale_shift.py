"""Fused normalize-scale-shift loops: ``y = act((x - mean) * a + B)`` per channel.

Every kernel here takes flat, C-contiguous storage arrays ``x`` and ``y`` (see
:mod:`normkernels.dtypes`; ``y`` may be ``x``) and per-channel parameters
already folded by the spec layer into the compute dtype (float32, or float64 for
float64 storage): ``mean``, ``a = scale / sqrt(var + epsilon)`` and ``B``.

Two shapes of loop cover every layout:

* **planes** -- X is a sequence of contiguous planes of ``S`` elements, plane ``p``
  belonging to channel ``p % C`` (NCX). The parameters are scalars; a vector that
  straddles two planes takes each lane's parameters from its own plane, so short
  planes (7x7) cost no scalar head and tail each. Needs ``S >= 32`` (a 64-byte
  vector then straddles at most two planes).
* **periodic** -- the parameters repeat with period ``P`` along the flat array:
  NXC (``P = C``: element ``i`` is channel ``i % C``), and NCX with ``S < 32``
  (``P = C * S``). The spec layer expands the parameters into tables of one period
  plus one vector of wrap-around, so a vector reads its parameters from the tables at
  its phase and the channel index never enters the per-element arithmetic.

Each comes in three variants, compiled separately and only when used: serial (small
tensors, where a parallel launch costs more than the loop),
parallel over fixed-size blocks, and streaming (parallel, with non-temporal stores
and an ``sfence`` per block; x86-64 only). All vector work goes through the
intrinsics of :mod:`normkernels.kernels.vectors` and all scalar work (heads and
tails up to 64-byte alignment) through :mod:`normkernels.kernels.elements`, so the
three variants give identical results.

``act`` is an activation epilogue (:mod:`normkernels.kernels.activations`; ``NONE``:
none) and ``res`` a residual of Y's shape and dtype added to the affine result before
it (None: none; oneDNN's norm-add-relu), both in the compute dtype before Y is rounded
to its dtype.

The ``(x - mean) * a + B`` form is deliberate: folding to ``x * a + (B - mean * a)``
saves one subtraction but cancels catastrophically when ``|mean| >> std``.
"""

from numba import njit, prange

import normkernels.kernels.cache  # noqa: F401  (registers the cache locators before any @njit)
from normkernels.kernels.activations import activate, residual_slice, with_residual
from normkernels.kernels.elements import load, store
from normkernels.kernels.options import INLINE_OPTIONS, KERNEL_OPTIONS, MIN_PLANE, VECTOR_BYTES
from normkernels.kernels.vectors import (
    store_fence,
    stream_scale_shift,
    stream_scale_shift_split,
    stream_scale_shift_tables,
    vector_scale_shift,
    vector_scale_shift_split,
    vector_scale_shift_tables,
)

_INLINE = INLINE_OPTIONS

# Parallel kernels take the elements per work item as ``block`` (chosen by
# normkernels.engine.policy.block_size, a multiple of every vector length).


@njit(**_INLINE)
def elements_to_alignment(y):
    """How many elements from ``y[0]`` to the next 64-byte boundary (``y`` aligned)."""
    misalignment = y.ctypes.data & (VECTOR_BYTES - 1)
    if misalignment == 0:
        return 0
    return (VECTOR_BYTES - misalignment) // y.itemsize


@njit(**_INLINE)
def _blocks(y, block):
    """Parallel work items of ``block`` elements: ``(first, count)``.

    Block 0 is ``[0, first + block)`` and block ``k`` starts at ``first + k * block``,
    ``first`` being the offset of the first 64-byte boundary in ``y``: every block but
    the first starts aligned and every block but the last ends aligned, so only those
    two run scalar heads and tails (see ``scale_shift._blocks`` in docs/design.md).
    """
    n = y.size
    first = min(n, elements_to_alignment(y))
    return first, max(1, (n - first + block - 1) // block)


@njit(**_INLINE)
def _block_bounds(blk, first, n, block):
    lo = 0 if blk == 0 else first + blk * block
    return lo, min(n, first + (blk + 1) * block)


# Scalar loops (heads, tails, and planes shorter than MIN_PLANE) index slices from 0
# rather than ``x[i] for i in range(lo, hi)``: with an unknown ``lo`` Numba must allow
# negative indices and LLVM does not vectorise.


@njit(**_INLINE)
def _run(x, y, m, a, b, res, act):
    """``y = act((x - m) * a + b + res)`` over equal-length slices, scalar parameters."""
    for i in range(x.size):
        store(y, i, activate(act, with_residual(res, i, (load(x, i) - m) * a + b)))


@njit(**_INLINE)
def run_tables(x, y, mean, a, b, res, act):
    """``y = act((x - mean) * a + b + res)`` elementwise over slices (tables may be
    longer)."""
    for i in range(x.size):
        store(y, i, activate(act, with_residual(res, i, (load(x, i) - mean[i]) * a[i] + b[i])))


@njit(**_INLINE)
def planes_scalar(x, y, lo, hi, C, S, mean, a, b, res, act):
    """Elements ``lo..hi-1`` of planes of ``S``, one plane segment at a time."""
    while lo < hi:
        plane = lo // S
        end = min(hi, (plane + 1) * S)
        c = plane % C
        _run(x[lo:end], y[lo:end], mean[c], a[c], b[c], residual_slice(res, lo, end), act)
        lo = end


@njit(**_INLINE)
def stream_one(x, y, i, m, a, b, res, act):
    stream_scale_shift(x, y, i, m, a, b, res, act)


@njit(**_INLINE)
def stream_split(x, y, i, m0, a0, b0, m1, a1, b1, split, res, act):
    stream_scale_shift_split(x, y, i, m0, a0, b0, m1, a1, b1, split, res, act)


@njit(**_INLINE)
def _stream_tables(x, y, i, mean, a, b, phase, res, act):
    stream_scale_shift_tables(x, y, i, mean, a, b, phase, res, act)


@njit(**_INLINE)
def vector_one(x, y, i, m, a, b, res, act):
    vector_scale_shift(x, y, i, m, a, b, res, act)


@njit(**_INLINE)
def vector_split(x, y, i, m0, a0, b0, m1, a1, b1, split, res, act):
    vector_scale_shift_split(x, y, i, m0, a0, b0, m1, a1, b1, split, res, act)


@njit(**_INLINE)
def _vector_tables(x, y, i, mean, a, b, phase, res, act):
    vector_scale_shift_tables(x, y, i, mean, a, b, phase, res, act)


# The loops below take their vector operations as arguments (``vector_*`` or
# ``stream_*``): Numba specialises on the function passed, so the store kind is
# fixed at compile time and the streaming code is compiled only for the streaming
# kernels.


@njit(**_INLINE)
def planes_range(x, y, lo, hi, C, S, mean, a, b, one, split, res, act):
    """Elements ``lo..hi-1`` of planes of ``S >= MIN_PLANE``: scalar head to 64-byte
    alignment, vectors across plane boundaries, scalar tail."""
    width = VECTOR_BYTES // y.itemsize
    head = min(hi - lo, elements_to_alignment(y[lo:hi]))
    body_end = lo + head + (hi - lo - head) // width * width
    planes_scalar(x, y, lo, lo + head, C, S, mean, a, b, res, act)
    i = lo + head
    plane = i // S
    c = plane % C
    boundary = (plane + 1) * S
    while i < body_end:
        # the vectors that lie inside the current plane, in a tight loop
        inner_end = min(body_end, i + (boundary - i) // width * width)
        m, ac, bc = mean[c], a[c], b[c]
        for j in range(i, inner_end, width):
            one(x, y, j, m, ac, bc, res, act)
        i = inner_end
        c_next = c + 1 if c + 1 < C else 0
        if i < boundary and i < body_end:  # one vector straddles two planes
            split(x, y, i, m, ac, bc, mean[c_next], a[c_next], b[c_next], boundary - i, res,
                  act)
            i += width
        if i >= boundary:
            c = c_next
            boundary += S
    planes_scalar(x, y, body_end, hi, C, S, mean, a, b, res, act)


@njit(**_INLINE)
def _periodic_range(x, y, lo, hi, P, mean, a, b, tables, res, act):
    """Elements ``lo..hi-1`` with parameter tables of period ``P``. The tables hold at
    least ``P + 32`` entries and ``P >= 32``, so a vector starting at any phase reads
    inside them and one subtraction of ``P`` wraps the phase."""
    width = VECTOR_BYTES // y.itemsize
    xs = x[lo:hi]
    ys = y[lo:hi]
    rs = residual_slice(res, lo, hi)
    n = hi - lo
    phase = lo % P
    head = min(n, elements_to_alignment(ys))
    body = head + (n - head) // width * width
    run_tables(xs[:head], ys[:head], mean[phase:], a[phase:], b[phase:],
               residual_slice(rs, 0, head), act)
    phase += head
    if phase >= P:
        phase -= P
    for i in range(head, body, width):
        tables(xs, ys, i, mean, a, b, phase, rs, act)
        phase += width
        if phase >= P:
            phase -= P
    run_tables(xs[body:], ys[body:], mean[phase:], a[phase:], b[phase:],
               residual_slice(rs, body, n), act)


@njit(**_INLINE)
def scale_shift_planes_serial(x, y, C, S, mean, a, b, res, act):
    """``y[i] = act((x[i] - mean[c]) * a[c] + b[c])``, ``c = (i // S) % C``; one
    thread."""
    if S >= MIN_PLANE:
        planes_range(x, y, 0, x.size, C, S, mean, a, b, vector_one, vector_split, res, act)
    else:
        planes_scalar(x, y, 0, x.size, C, S, mean, a, b, res, act)


@njit(parallel=True, **KERNEL_OPTIONS)
def scale_shift_planes_parallel(x, y, C, S, mean, a, b, block, res, act):
    """Parallel :func:`scale_shift_planes_serial`."""
    n = x.size
    first, n_blocks = _blocks(y, block)
    for blk in prange(n_blocks):
        lo, hi = _block_bounds(blk, first, n, block)
        if S >= MIN_PLANE:
            planes_range(x, y, lo, hi, C, S, mean, a, b, vector_one, vector_split, res, act)
        else:
            planes_scalar(x, y, lo, hi, C, S, mean, a, b, res, act)


@njit(parallel=True, **KERNEL_OPTIONS)
def scale_shift_planes_streaming(x, y, C, S, mean, a, b, block, res, act):
    """:func:`scale_shift_planes_parallel` with streaming stores; ``S >= MIN_PLANE``
    and ``y`` aligned to its itemsize."""
    n = x.size
    first, n_blocks = _blocks(y, block)
    for blk in prange(n_blocks):
        lo, hi = _block_bounds(blk, first, n, block)
        planes_range(x, y, lo, hi, C, S, mean, a, b, stream_one, stream_split, res, act)
        store_fence()


@njit(**_INLINE)
def scale_shift_periodic_serial(x, y, P, mean, a, b, res, act):
    """``y[i] = act((x[i] - mean[i % P]) * a[i % P] + b[i % P])``; one thread."""
    _periodic_range(x, y, 0, x.size, P, mean, a, b, _vector_tables, res, act)


@njit(parallel=True, **KERNEL_OPTIONS)
def scale_shift_periodic_parallel(x, y, P, mean, a, b, block, res, act):
    """Parallel :func:`scale_shift_periodic_serial`."""
    n = x.size
    first, n_blocks = _blocks(y, block)
    for blk in prange(n_blocks):
        lo, hi = _block_bounds(blk, first, n, block)
        _periodic_range(x, y, lo, hi, P, mean, a, b, _vector_tables, res, act)


@njit(parallel=True, **KERNEL_OPTIONS)
def scale_shift_periodic_streaming(x, y, P, mean, a, b, block, res, act):
    """:func:`scale_shift_periodic_parallel` with streaming stores."""
    n = x.size
    first, n_blocks = _blocks(y, block)
    for blk in prange(n_blocks):
        lo, hi = _block_bounds(blk, first, n, block)
        _periodic_range(x, y, lo, hi, P, mean, a, b, _stream_tables, res, act)
        store_fence()

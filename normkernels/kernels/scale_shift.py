"""Fused normalize-scale-shift loops: ``y = (x - mean) * a + B`` per channel.

Every kernel here takes flat, C-contiguous storage arrays ``x`` and ``y`` (see
:mod:`normkernels.kernels.storage`; ``y`` may be ``x``) and per-channel parameters
already folded by the spec layer into the compute dtype (float32, or float64 for
float64 storage): ``mean``, ``a = scale / sqrt(var + epsilon)`` and ``B``.

Two shapes of loop cover every layout:

* **planes** -- X is a sequence of contiguous planes of ``S`` elements, plane ``p``
  belonging to channel ``p % C`` (NCX with a large spatial size ``S``). The
  parameters are scalars in the inner loop.
* **periodic** -- the parameters repeat with period ``P`` along the flat array:
  NXC (``P = C``: element ``i`` is channel ``i % C``), and NCX with a small spatial
  size (``P = C * S``), where planes are too short for a loop of their own. The spec
  layer expands the parameters into tables of one period (plus one vector of
  wrap-around), so the inner loop is a plain vectorisable loop over the table and the
  channel index never enters the per-element arithmetic (no modulo per element).

Each shape has a serial kernel (small tensors: a parallel launch costs about 4 us
here, a serial call about 0.5 us) and a parallel kernel over fixed-size blocks, whose
``streaming`` flag writes Y with non-temporal stores (large outputs). The three paths
perform the same float operations on every element, so they give identical results.

The ``(x - mean) * a + B`` form is deliberate: folding to ``x * a + (B - mean * a)``
saves one subtraction but cancels catastrophically when ``|mean| >> std``.
"""

from numba import njit, prange

import normkernels.kernels.cache  # noqa: F401  (registers the cache locators before any @njit)
from normkernels.kernels.elements import load, store
from normkernels.kernels.streaming import (
    VECTOR_BYTES,
    store_fence,
    stream_scale_shift,
    stream_scale_shift_split,
    stream_scale_shift_tables,
)

# Settings for every kernel, set once. No fastmath: NaN and Inf must propagate, and
# FMA contraction would make the vector and scalar paths round differently.
KERNEL_OPTIONS = dict(cache=True, nogil=True, error_model="numpy", boundscheck=False)

# Elements per parallel work item: large enough to amortise the scheduling and the
# sfence, small enough to balance 2-64 threads on the benchmark shapes. A multiple of
# every vector length, so all blocks start at the same offset from 64-byte alignment.
BLOCK_ELEMENTS = 1 << 16


@njit(inline="always", **KERNEL_OPTIONS)
def _elements_to_alignment(y):
    """How many elements from ``y[0]`` to the next 64-byte boundary (``y`` aligned)."""
    misalignment = y.ctypes.data & (VECTOR_BYTES - 1)
    if misalignment == 0:
        return 0
    return (VECTOR_BYTES - misalignment) // y.itemsize


# The innermost loops index slices from 0 rather than ``x[i] for i in range(lo, hi)``:
# with an unknown ``lo`` Numba must allow negative indices (wraparound) and LLVM did
# not vectorise; measured on 51 MB float32, 15.0 ms with ``range(lo, hi)`` against
# 6.9 ms over slices.


@njit(inline="always", **KERNEL_OPTIONS)
def _run(x, y, m, a, b):
    """``y = (x - m) * a + b`` over equal-length slices, scalar parameters."""
    for i in range(x.size):
        store(y, i, (load(x, i) - m) * a + b)


@njit(inline="always", **KERNEL_OPTIONS)
def _run_tables(x, y, mean, a, b):
    """``y = (x - mean) * a + b`` elementwise over equal-length slices."""
    for i in range(x.size):
        store(y, i, (load(x, i) - mean[i]) * a[i] + b[i])


@njit(inline="always", **KERNEL_OPTIONS)
def _planes_range(x, y, lo, hi, C, S, mean, a, b):
    """Elements ``lo..hi-1`` of planes of ``S`` (plane ``p`` is channel ``p % C``),
    one plane segment at a time, ordinary stores."""
    while lo < hi:
        plane = lo // S
        end = min(hi, (plane + 1) * S)
        c = plane % C
        _run(x[lo:end], y[lo:end], mean[c], a[c], b[c])
        lo = end


@njit(inline="always", **KERNEL_OPTIONS)
def _planes_range_streaming(x, y, lo, hi, C, S, mean, a, b):
    """:func:`_planes_range` with streaming stores; needs ``S >= 32`` (a vector then
    straddles at most two planes).

    The vectors run across plane boundaries: one that straddles two planes takes
    each lane's parameters from its own plane (``stream_scale_shift_split``), so a
    plane costs no scalar head and tail of its own. Per-plane heads and tails were
    measured first: (64,2048,7,7) f32 ran at 2.83 ms against 1.65 ms cached.
    """
    width = VECTOR_BYTES // y.itemsize
    head = min(hi - lo, _elements_to_alignment(y[lo:hi]))
    body_end = lo + head + (hi - lo - head) // width * width
    _planes_range(x, y, lo, lo + head, C, S, mean, a, b)
    i = lo + head
    plane = i // S
    c = plane % C
    boundary = (plane + 1) * S
    while i < body_end:
        inside = boundary - i
        if inside >= width:
            stream_scale_shift(x, y, i, mean[c], a[c], b[c])
        else:
            c_next = c + 1 if c + 1 < C else 0
            stream_scale_shift_split(x, y, i, mean[c], a[c], b[c],
                                     mean[c_next], a[c_next], b[c_next], inside)
        i += width
        if i >= boundary:
            c = c + 1 if c + 1 < C else 0
            boundary += S
    _planes_range(x, y, body_end, hi, C, S, mean, a, b)
    store_fence()


@njit(inline="always", **KERNEL_OPTIONS)
def _periodic(x, y, P, mean, a, b):
    """``x``, ``y``: slices starting at phase 0 of tables of period ``P``."""
    i = 0
    n = x.size
    while i + P <= n:
        _run_tables(x[i:i + P], y[i:i + P], mean, a, b)
        i += P
    _run_tables(x[i:], y[i:], mean, a, b)


@njit(inline="always", **KERNEL_OPTIONS)
def _periodic_range(x, y, lo, hi, P, mean, a, b):
    """Elements ``lo..hi-1`` with parameter tables of period ``P``, ordinary stores."""
    phase = lo % P
    first = min(hi, lo + P - phase)  # end of the period that ``lo`` falls in
    _run_tables(x[lo:first], y[lo:first], mean[phase:], a[phase:], b[phase:])
    _periodic(x[first:hi], y[first:hi], P, mean, a, b)


@njit(inline="always", **KERNEL_OPTIONS)
def _periodic_range_streaming(x, y, lo, hi, P, mean, a, b):
    """Like :func:`_periodic_range`, with streaming stores. The tables hold at least
    ``P + 32`` entries and ``P >= 32``, so a vector starting at any phase stays
    inside them and one subtraction of ``P`` wraps the phase."""
    width = VECTOR_BYTES // y.itemsize
    xs = x[lo:hi]
    ys = y[lo:hi]
    n = hi - lo
    phase = lo % P
    head = min(n, _elements_to_alignment(ys))
    body = head + (n - head) // width * width
    _run_tables(xs[:head], ys[:head], mean[phase:], a[phase:], b[phase:])
    phase += head
    if phase >= P:
        phase -= P
    for i in range(head, body, width):
        stream_scale_shift_tables(xs, ys, i, mean, a, b, phase)
        phase += width
        if phase >= P:
            phase -= P
    _run_tables(xs[body:], ys[body:], mean[phase:], a[phase:], b[phase:])
    store_fence()


@njit(**KERNEL_OPTIONS)
def scale_shift_planes_serial(x, y, C, S, mean, a, b):
    """``y = (x - mean[c]) * a[c] + b[c]`` over planes of ``S`` elements, one thread."""
    _planes_range(x, y, 0, x.size, C, S, mean, a, b)


@njit(parallel=True, **KERNEL_OPTIONS)
def scale_shift_planes_parallel(x, y, C, S, mean, a, b, streaming):
    """Parallel :func:`scale_shift_planes_serial`; ``streaming`` selects non-temporal
    stores for Y."""
    n = x.size
    n_blocks = (n + BLOCK_ELEMENTS - 1) // BLOCK_ELEMENTS
    for blk in prange(n_blocks):
        lo = blk * BLOCK_ELEMENTS
        hi = min(n, lo + BLOCK_ELEMENTS)
        if streaming:
            _planes_range_streaming(x, y, lo, hi, C, S, mean, a, b)
        else:
            _planes_range(x, y, lo, hi, C, S, mean, a, b)


@njit(**KERNEL_OPTIONS)
def scale_shift_periodic_serial(x, y, P, mean, a, b):
    """``y[i] = (x[i] - mean[i % P]) * a[i % P] + b[i % P]``, one thread."""
    _periodic(x, y, P, mean, a, b)


@njit(parallel=True, **KERNEL_OPTIONS)
def scale_shift_periodic_parallel(x, y, P, mean, a, b, streaming):
    """Parallel :func:`scale_shift_periodic_serial`; ``streaming`` selects
    non-temporal stores for Y."""
    n = x.size
    n_blocks = (n + BLOCK_ELEMENTS - 1) // BLOCK_ELEMENTS
    for blk in prange(n_blocks):
        lo = blk * BLOCK_ELEMENTS
        hi = min(n, lo + BLOCK_ELEMENTS)
        if streaming:
            _periodic_range_streaming(x, y, lo, hi, P, mean, a, b)
        else:
            _periodic_range(x, y, lo, hi, P, mean, a, b)


"""The launch sequences the Numba engine's methods share: the scale-shift loops
(planes or periodic parameter tables, on each path) and the per-channel statistics
(partials by planes, by rows or by samples, then their merge).

Each takes flat storage views and a resolved path; the caller
(:class:`normkernels.engine.numba_engine.NumbaEngine`) has chosen the route. Parallel
kernels have one-thread twins (same source, same bits) that run on the serial path
(:func:`kernel_for`).
"""

import numpy as np

from normkernels.dtypes import row_compute_dtype, storage_view
from normkernels.engine import policy
from normkernels.engine.lazy import lazy
from normkernels.engine.policy import took
from normkernels.engine.threads import launch_guard
from normkernels.kernels.activations import NONE, marker
from normkernels.kernels.options import MIN_PLANE

# kernel modules: imported at first use (engine/lazy.py)
inference = lazy(__name__, "inference")
instance = lazy(__name__, "instance")
loops = lazy(__name__, "loops", "scale_shift")
reductions = lazy(__name__, "reductions", "statistics")


def parameter_tables(C, S, mean, a, b):
    """Per-element parameter tables of one period (``P`` elements) plus padding."""
    period, pad = policy.table_period(C, S)
    tables = np.empty((3, period + pad), mean.dtype)
    inference.fill_tables(C, S, mean, a, b, *tables)
    return period, *tables


def kernel_for(parallel, serial, path):
    """The parallel kernel, or on the serial path its one-thread twin."""
    return serial if path == "serial" else parallel


def _planes_loop(S):
    return "planes" if S >= MIN_PLANE else "short-planes"


def scale_shift_loops(xs, ys, C, S, mean, a, b, path, act=NONE, res=None):
    if policy.use_planes(C, S, mean.itemsize):
        loop = _planes_loop(S)
        if path == "serial":
            took("scale_shift", loop, "serial")
            loops.scale_shift_planes_serial(xs, ys, C, S, mean, a, b, res, act)
        elif path == "streaming" and S >= MIN_PLANE:
            took("scale_shift", "planes", "streaming")
            loops.scale_shift_planes_streaming(xs, ys, C, S, mean, a, b,
                                               policy.block_size(xs.size), res, act)
        else:
            took("scale_shift", loop, "parallel")
            loops.scale_shift_planes_parallel(xs, ys, C, S, mean, a, b,
                                              policy.block_size(xs.size), res, act)
        return
    took("scale_shift", "periodic", path)
    period, mean_t, a_t, b_t = parameter_tables(C, S, mean, a, b)
    if path == "serial":
        loops.scale_shift_periodic_serial(xs, ys, period, mean_t, a_t, b_t, res, act)
    elif path == "streaming":
        loops.scale_shift_periodic_streaming(xs, ys, period, mean_t, a_t, b_t,
                                             policy.block_size(xs.size), res, act)
    else:
        loops.scale_shift_periodic_parallel(xs, ys, period, mean_t, a_t, b_t,
                                            policy.block_size(xs.size), res, act)


def plane_moments(xs, C, S, count, mean, m2, path):
    """Per-channel statistics by the planes kernel: partials per (plane, chunk),
    merged plane by plane (channel ``p % C`` of plane ``p``)."""
    chunks = -(-S // reductions.PLANE_CHUNK)
    part_mean = np.empty(xs.size // S * chunks)
    part_m2 = np.empty_like(part_mean)
    with launch_guard(path):
        kernel_for(reductions.plane_partials, reductions.plane_partials_serial, path)(
            xs, S, part_mean, part_m2)
    reductions.merge_planes(part_mean, part_m2, C, S, count, mean, m2)


def sample_block_rows(N, C, R):
    """Rows per block of the per-sample statistics (and of the one-launch normalize)."""
    return policy.sample_block_rows(N, C, R, reductions.COLUMN_TILE)


def sample_moments(xs, N, C, R, group, mean, m2, path, batch=None):
    """Per-(n, group) (mean, M2) of NXC memory (``N`` samples of ``R`` rows of ``C``):
    column partials per block of rows, merged per group in order. The blocks are those
    of a batch of ``batch`` samples (default ``N``): one sample of a batch, run alone,
    gets the partials, so the bits, of the whole batch's call."""
    rows = sample_block_rows(batch or N, C, R)
    part_mean = np.empty((N * -(-R // rows), C))
    part_m2 = np.empty_like(part_mean)
    with launch_guard(path):
        kernel_for(reductions.row_partials, reductions.row_partials_serial, path)(
            xs, C, R, rows, part_mean, part_m2)
        kernel_for(instance.merge_sample_rows, instance.merge_sample_rows_serial, path)(
            part_mean, part_m2, group, R, rows, mean, m2)


def row_moments(xs, P, C, S, count, mean, m2, path):
    n_rows = xs.size // P
    if n_rows == 0:
        return
    rows = policy.rows_per_block(P, reductions.COLUMN_TILE)
    n_blocks = -(-n_rows // rows)
    part_mean = np.empty((n_blocks, P))
    part_m2 = np.empty((n_blocks, P))
    with launch_guard(path):
        kernel_for(reductions.row_partials, reductions.row_partials_serial, path)(
            xs, P, n_rows, rows, part_mean, part_m2)
        kernel_for(reductions.merge_rows, reductions.merge_rows_serial, path)(
            part_mean, part_m2, n_rows, rows, C, S, count, mean, m2)


_NOTHING = {}


def nothing(dtype):
    """An empty writeable array of ``dtype`` (one per dtype, shared: it holds nothing)."""
    empty = _NOTHING.get(dtype)
    if empty is None:
        empty = _NOTHING[dtype] = np.empty(0, dtype)
    return empty


def column(p):
    """Per-column parameters for the row kernels: C-contiguous, storage dtype (the
    kernels widen them)."""
    return storage_view(p if p.flags.c_contiguous else np.ascontiguousarray(p))


def flat_rows(a, view=storage_view):
    """``(flat, row_stride)``: 2-D ``a`` (rows contiguous) as one flat storage array
    from its first element to its last (``view`` of it), and the row stride in
    elements."""
    if a.flags.c_contiguous:
        return view(a).ravel(), a.shape[1]
    stride = a.strides[0] // a.itemsize
    n = (a.shape[0] - 1) * stride + a.shape[1] if a.size else 0
    flat = np.lib.stride_tricks.as_strided(a, shape=(n,), strides=(a.itemsize,))
    return view(flat), stride


def row_epilogue(act, res, rounding="once"):
    """The row kernels' last arguments ``rr, res, act``: ``res`` (None, or ``M x K`` rows
    each contiguous, as x's) flat, and its row stride; the activation's marker, which
    also carries the ``rounding`` of the normalized value ("once" or "llama")."""
    rs, rr = (None, 0) if res is None else flat_rows(res)
    return rr, rs, marker(act, rounding)


def add_skip(x, skip, bias, target):
    """``target = x + skip + bias`` per row (skip rows repeating), rounded once to
    x's dtype: the arithmetic of the fused kernel's skip add."""
    cd = row_compute_dtype(x.dtype)
    reps = x.shape[0] // skip.shape[0]
    with np.errstate(all="ignore"):
        total = (x.astype(cd).reshape(reps, skip.shape[0], -1) + skip.astype(cd)).reshape(x.shape)
        if bias is not None:
            total += bias.astype(cd)
        target[...] = total.astype(x.dtype)


# up to this many rows a serial row normalization skips the column tables
TABLE_FREE_ROWS = 16


def table_free(x, y, skip, sums, act, res):
    """Does :func:`normkernels.kernels.fused_add.plain_rows_serial` run this serial call
    (a few rows, no skip input, no epilogue, Y of X's dtype)? Its bits are the table
    kernels'. Building their column tables costs more than a few rows (one row of 4096:
    5 against 20 us); over many short rows the tables pay for themselves (256 rows of
    256: 140 against 94 us), see docs/design.md."""
    return (x.shape[0] <= TABLE_FREE_ROWS and skip is None and sums is None and res is None
            and y.dtype == x.dtype and marker(act).kind == "none")


def in_place_add(x, y, scale, B, skip, bias, sums, act, res):
    """Is this the in-place fused add (vLLM's ``fused_add_rms_norm``: y is x, the sums
    overwrite skip, no bias or epilogue), which
    :func:`normkernels.kernels.fused_add.fused_add_rows_serial` runs without tables?"""
    return (y is x and sums is not None and sums is skip and bias is None and res is None
            and marker(act).kind == "none")

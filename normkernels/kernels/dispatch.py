"""Pick the loop and the execution path for one normalize-scale-shift.

The spec layer hands over flat C-contiguous tensors in which element ``i`` belongs to
channel ``(i // S) % C`` (NCX: ``S`` is the spatial size; NXC: ``S = 1``) and
per-channel ``mean``, ``a``, ``B`` in the compute dtype. Thresholds below were
measured on this project's 2-core benchmark machine; every path gives identical
results, so they only move time.
"""

import contextlib
import functools
import os
import platform
import threading

import numba
import numpy as np

from normkernels.kernels import instance
from normkernels.kernels import moments as reductions
from normkernels.kernels import scale_shift as loops
from normkernels.kernels.storage import compute_dtype, storage_view

PATHS = ("serial", "parallel", "streaming")

# Every way a call can run, by name. Each decision below reports the route it takes
# to ``_trace`` when a test has set one: tests/test_paths.py runs a case per route
# against the float64 oracle and fails on a route (or a kernel launched here) that
# has no case, so a path added later cannot go untested.
ROUTES = (
    "scale_shift/planes/serial", "scale_shift/planes/parallel",
    "scale_shift/planes/streaming", "scale_shift/short-planes/serial",
    "scale_shift/short-planes/parallel", "scale_shift/periodic/serial",
    "scale_shift/periodic/parallel", "scale_shift/periodic/streaming",
    "moments/planes", "moments/rows",
    "instance_planes/fused/serial", "instance_planes/fused/parallel",
    "instance_planes/fused/streaming", "instance_planes/fused-short/serial",
    "instance_planes/fused-short/parallel", "instance_planes/split",
    "instance_rows/per-sample", "instance_rows/one-launch",
    "one-thread",  # a forked child: serial kernels and one-thread twins
)
_trace = None


def _took(*parts):
    """Report the route ``"/".join(parts)``; joined only when a test is listening, so
    an ordinary call pays one function call here, no string formatting."""
    if _trace is not None:
        _trace("/".join(parts))

# --- where parallel launches are allowed, and serialised ---
# Numba terminates a child forked from a process that used its GNU OpenMP layer on the
# child's first parallel call ("fork() called from a process already using GNU
# OpenMP"). Such a child runs every kernel on one thread instead: the serial kernels
# and the one-thread twins of the parallel ones give the same bits.
_forked_from_openmp = False


def _after_fork_in_child():
    global _forked_from_openmp
    try:
        _forked_from_openmp = numba.threading_layer() == "omp"
    except ValueError:  # no parallel launch in the parent: nothing to avoid
        pass


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


def parallel_allowed():
    """False in a child forked after GNU OpenMP ran in the parent."""
    return not _forked_from_openmp


# Numba's workqueue layer aborts the process when two threads launch parallel kernels
# at once; under it (and until the layer is known) launches are serialised here.
_LAUNCH_LOCK = threading.RLock()
_layer = None


def _launch_guard():
    global _layer
    if _layer is None:
        try:
            _layer = numba.threading_layer()
        except ValueError:  # not started yet: serialise the first launch
            return _LAUNCH_LOCK
    return _LAUNCH_LOCK if _layer == "workqueue" else contextlib.nullcontext()


def _pick(parallel, serial):
    if parallel_allowed():
        return parallel
    _took("one-thread")
    return serial

# A parallel launch costs about 4 us here and a serial call about 0.5 us: below this
# many elements one thread wins. Measured (f32, in cache, serial / parallel us):
# 32K 4.2 / 7.6, 64K 8.8 / 9.6, 128K 16.5 / 13.8, 256K 38.9 / 17.6.
SERIAL_MAX_ELEMENTS = 1 << 16

# Streaming stores pay once Y is a few MB: with cold caches (32,64,112,112) f32 took
# 5.5 ms streaming against 6.6 ms with ordinary stores, f16 3.3 against 3.5, bf16 4.4
# against 4.6; (4096,1024) f32 (16 MB) 1.0 against 1.2; and warm, (1024,1024) f32
# (4 MB) 0.135 against 0.153 ms. Below 4 MB Y may well still be in cache.
STREAMING_MIN_BYTES = 4 << 20

# Loop choice for NCX, measured with cold caches on float32 (ms; 2 threads; "NT":
# streaming stores; periodic includes building its tables, as every call must):
#   shape             planes  planes+NT  periodic  periodic+NT  copy
#   (64,2048,7,7)      1.88     1.58       3.13       2.76      1.54
#   (32,1024,14,14)    1.60     1.21       4.03       3.48      1.57
#   (32,512,28,28)     3.18     2.20       7.94       7.08      3.16
#   (32,128,56,56)     3.23     2.51       7.95       7.03      3.18
# So planes serve every S >= 32 (the planes loop needs S >= 32: a 64-byte vector then
# straddles at most two planes). Shorter runs use periodic tables while they stay in
# L2; planes of 1 element (2-D input as planes) ran 20x slower than periodic.
TABLES_MAX_BYTES = 3 << 19  # 1.5 MB

# Parameter tables cover a whole number of periods of at least this many elements,
# so the inner loop is long enough to vectorise well even for C = 1 or 3; plus
# TABLE_PAD entries of wrap-around so a 64-byte vector (up to 32 elements) starting
# at any phase reads inside the table.
MIN_TABLE_PERIOD = 256
TABLE_PAD = 32
# Longer tables were measured and rejected: (32,112,112,64) bfloat16 NXC streaming ran
# 2.69 ms with 256-entry tables, 2.91 with 1024 and 3.27 with 4096 (float32: 4.7, 4.5,
# 4.8), and building them is per-call work.


@functools.cache
def streaming_supported():
    """Streaming stores need x86-64 with AVX (the kernels use 32-byte pieces)."""
    if platform.machine().lower() not in ("x86_64", "amd64"):
        return False
    from llvmlite import binding

    features = binding.get_host_cpu_features()
    return bool(features.get("avx", False))


def choose_path(y):
    """The path for writing ``y`` (a storage array): serial, parallel or streaming."""
    if y.size <= SERIAL_MAX_ELEMENTS:
        return "serial"
    if y.nbytes >= STREAMING_MIN_BYTES and y.flags.aligned and streaming_supported():
        return "streaming"
    return "parallel"


def block_size(n):
    """Elements per parallel work item for ``n`` elements: BLOCK_ELEMENTS, or less so
    that each thread gets about four blocks (a multiple of 64 elements)."""
    per_thread = -(-n // (4 * numba.get_num_threads()))
    block = -(-per_thread // 64) * 64
    return min(loops.BLOCK_ELEMENTS, max(loops.MIN_BLOCK_ELEMENTS, block))


def use_planes(C, S, itemsize):
    """Planes loop (else periodic) for runs of ``S`` elements per channel."""
    if S >= loops.MIN_PLANE:
        return True
    return S > 1 and 3 * C * S * itemsize > TABLES_MAX_BYTES


def parameter_tables(C, S, mean, a, b):
    """Per-element parameter tables of one period (``P`` elements) plus padding."""
    period = C * S
    period *= -(-MIN_TABLE_PERIOD // period)
    channel = (np.arange(period + TABLE_PAD) // S) % C
    return period, mean[channel], a[channel], b[channel]


def _checked_path(ys, path):
    """``path``, or the one :func:`choose_path` picks; streaming falls back to
    parallel where it cannot run."""
    if path is not None and path not in PATHS:
        raise ValueError(f"path must be one of {PATHS}, got {path!r}")
    if not parallel_allowed():
        _took("one-thread")
        return "serial"
    if path is None:
        return choose_path(ys)
    if path == "streaming" and not (streaming_supported() and ys.flags.aligned):
        return "parallel"
    return path


def scale_shift(x, y, C, S, mean, a, b, path=None):
    """``y = (x - mean[c]) * a[c] + b[c]`` with ``c = (i // S) % C`` for flat index ``i``.

    Parameters
    ----------
    x, y : ndarray
        C-contiguous tensors of the same dtype and size, in any of the four float
        dtypes; ``y`` may be ``x``.
    C, S : int
        Channels and the run length of one channel (see the module docstring).
    mean, a, b : ndarray
        Length-``C`` parameters in the compute dtype of ``x``.
    path : {"serial", "parallel", "streaming"}, optional
        Force an execution path (tests and benchmarks); chosen by size by default.
    """
    if not (x.flags.c_contiguous and y.flags.c_contiguous):
        raise ValueError("scale_shift: x and y must be C-contiguous")
    xs = storage_view(x.reshape(-1))
    ys = storage_view(y.reshape(-1))
    path = _checked_path(ys, path)
    with contextlib.nullcontext() if path == "serial" else _launch_guard():
        _scale_shift(xs, ys, C, S, mean, a, b, path)


def _scale_shift(xs, ys, C, S, mean, a, b, path):
    if use_planes(C, S, mean.itemsize):
        loop = "planes" if S >= loops.MIN_PLANE else "short-planes"
        if path == "serial":
            _took("scale_shift", loop, "serial")
            loops.scale_shift_planes_serial(xs, ys, C, S, mean, a, b)
        elif path == "streaming" and S >= loops.MIN_PLANE:
            _took("scale_shift", "planes", "streaming")
            loops.scale_shift_planes_streaming(xs, ys, C, S, mean, a, b, block_size(xs.size))
        else:
            _took("scale_shift", loop, "parallel")
            loops.scale_shift_planes_parallel(xs, ys, C, S, mean, a, b, block_size(xs.size))
        return
    _took("scale_shift", "periodic", path)
    period, mean_t, a_t, b_t = parameter_tables(C, S, mean, a, b)
    if path == "serial":
        loops.scale_shift_periodic_serial(xs, ys, period, mean_t, a_t, b_t)
    elif path == "streaming":
        loops.scale_shift_periodic_streaming(xs, ys, period, mean_t, a_t, b_t,
                                             block_size(xs.size))
    else:
        loops.scale_shift_periodic_parallel(xs, ys, period, mean_t, a_t, b_t,
                                            block_size(xs.size))


# Rows narrower than this are widened to a multiple of C * S columns, so the
# per-column loop of the rows kernel has something to vectorise (NXC with C = 3).
MIN_ROW_COLUMNS = 64
# Planes kernel or rows kernel for NCX statistics. The planes kernel pays per plane
# (a partial and a merge each), the rows kernel per row block (two float64 partials
# per column): with N = 64, S = 49 (64,2048,7,7) rows took 1.7 ms against planes
# 3.7 ms (a read-only sum: 1.1 ms), planes won from S = 784; with N = 8 the rows
# kernel's partials outweigh X and planes won at every S >= 49.
MOMENTS_MIN_PLANE = 32
MOMENTS_SHORT_PLANE = 512
MOMENTS_MIN_ROWS = 32


def moments(x, C, S):
    """Per-channel ``(count, mean, M2)`` of a C-contiguous tensor (float64, int64),
    channel ``(i // S) % C`` for flat index ``i``; bitwise independent of threads."""
    if not x.flags.c_contiguous:
        raise ValueError("moments: x must be C-contiguous")
    xs = storage_view(x.reshape(-1))
    count = np.zeros(C, np.int64)
    mean = np.zeros(C)
    m2 = np.zeros(C)
    if C == 1:
        S = xs.size  # one channel: the whole tensor is one plane
    n_rows = xs.size // (C * S)
    if S >= MOMENTS_MIN_PLANE and (S >= MOMENTS_SHORT_PLANE or n_rows < MOMENTS_MIN_ROWS):
        _took("moments", "planes")
        _plane_moments(xs, C, S, count, mean, m2)
        return count, mean, m2
    _took("moments", "rows")
    period = C * S
    width = period * -(-MIN_ROW_COLUMNS // period)
    wide_rows = xs.size // width
    _row_moments(xs[:wide_rows * width], width, C, S, count, mean, m2)
    _row_moments(xs[wide_rows * width:], period, C, S, count, mean, m2)
    return count, mean, m2


def _plane_moments(xs, C, S, count, mean, m2):
    """Per-channel statistics by the planes kernel: partials per (plane, chunk) in
    parallel, merged plane by plane (channel ``p % C`` of plane ``p``)."""
    chunks = -(-S // reductions.PLANE_CHUNK)
    part_mean = np.empty(xs.size // S * chunks)
    part_m2 = np.empty_like(part_mean)
    with _launch_guard():
        _pick(reductions.plane_partials, reductions.plane_partials_serial)(
            xs, S, part_mean, part_m2)
    reductions.merge_planes(part_mean, part_m2, C, S, count, mean, m2)


def _row_moments(xs, P, C, S, count, mean, m2):
    n_rows = xs.size // P
    if n_rows == 0:
        return
    tile = min(P, reductions.COLUMN_TILE)
    rows_per_block = max(reductions.MIN_ROWS_PER_BLOCK, reductions.ROW_BLOCK_ELEMENTS // tile)
    n_blocks = -(-n_rows // rows_per_block)
    part_mean = np.empty((n_blocks, P))
    part_m2 = np.empty((n_blocks, P))
    with _launch_guard():
        _pick(reductions.row_partials, reductions.row_partials_serial)(
            xs, P, n_rows, rows_per_block, part_mean, part_m2)
        _pick(reductions.merge_rows, reductions.merge_rows_serial)(
            part_mean, part_m2, n_rows, rows_per_block, C, S, count, mean, m2)


# Instance normalization, NCX: one plane per work item (statistics, then normalize
# while the plane is in L2) for planes of FUSED_MIN_PLANE elements up to
# FUSED_MAX_PLANE_BYTES; larger planes, or fewer planes than twice the threads, are
# split into chunks across the threads, and smaller planes go through the two passes
# too (per-plane work dominates there). Measured, f32, cold caches, ms (fused/split):
# (32,256,14,14) 1.14/0.87, (32,256,16,16) 1.21/0.97, (32,128,28,28) 0.97/1.29,
# (32,64,56,56) 1.99/2.38, (8,64,256,256) 9.9/10.6.
# Measured and rejected: prefetching the next plane into L2 while normalizing one
# (2.1x BN inference against 1.8x on (8,64,256,256)), and each thread reducing plane
# p + 1 sub-block by sub-block while it normalizes plane p (1.96x against 1.63x).
FUSED_MIN_PLANE = 512
FUSED_MAX_PLANE_BYTES = 1 << 20


def instance_planes(x, y, C, S, scale, B, epsilon, path=None):
    """Instance normalization of NCX memory: ``N * C`` planes of ``S`` elements,
    plane ``p`` of channel ``p % C``, normalized with its own mean and population
    variance; writes ``y`` and returns the per-plane ``(mean, M2)`` (float64).
    ``scale``, ``B``: length ``C``, any storage dtype. Bitwise independent of the
    thread count and of ``path``."""
    xs = storage_view(x.reshape(-1))
    ys = storage_view(y.reshape(-1))
    n_planes = xs.size // S
    cd = compute_dtype(x.dtype)
    mean, m2 = np.empty(n_planes), np.empty(n_planes)
    m, a, b = np.empty(n_planes, cd), np.empty(n_planes, cd), np.empty(n_planes, cd)
    args = (C, S, storage_view(scale), storage_view(B), float(epsilon), mean, m2, m, a, b)
    path = _checked_path(ys, path)
    split = S >= loops.MIN_PLANE and path != "serial" and (
        S < FUSED_MIN_PLANE or S * xs.itemsize > FUSED_MAX_PLANE_BYTES
        or n_planes < 2 * numba.get_num_threads())
    fused = "fused" if S >= loops.MIN_PLANE else "fused-short"
    if split:
        _took("instance_planes", "split")
        _plane_moments(xs, n_planes, S, np.zeros(n_planes, np.int64), mean, m2)
        instance.fold_planes(C, S, *args[2:5], mean, m2, m, a, b)
        scale_shift(x, y, n_planes, S, m, a, b, path)
    elif path == "serial":
        _took("instance_planes", fused, "serial")
        instance.fused_planes_serial(xs, ys, *args)
    elif path == "streaming" and S >= loops.MIN_PLANE:
        _took("instance_planes", "fused", "streaming")
        with _launch_guard():
            instance.fused_planes_streaming(xs, ys, *args)
    else:
        _took("instance_planes", fused, "parallel")
        with _launch_guard():
            instance.fused_planes_parallel(xs, ys, *args)
    return mean, m2


# Instance normalization, NXC: samples of at least this many elements are normalized
# by one scale_shift call each (streaming stores, parameter tables); smaller ones by
# one launch over all samples. Measured (f32, ms, 64K / 1M / never): (32,28,28,128)
# 2.12/1.55/1.64, (8,256,256,64) 13.6/14.0/15.9, (32,14,14,256) 0.77/0.70/0.94.
SAMPLE_CALL_MIN_ELEMENTS = 1 << 20
# Rows accumulated one after another per column before a (exact) merge: the rounding
# of a sequential float64 sum grows with its length. 131072 rows of C = 2 put the
# mean 4e-14 relative off on std-2 data; batch statistics never exceed this anyway
# (their rows are at least 64 columns wide).
MAX_ROWS_PER_BLOCK = 4096


def instance_rows(x, y, N, C, scale, B, epsilon, path=None):
    """Instance normalization of NXC memory: ``N`` samples of ``R`` rows of ``C``
    columns, each (n, c) normalized with its own statistics over the R rows; writes
    ``y`` and returns the per-(n, c) ``(mean, M2)`` (float64, flat ``n * C + c``)."""
    xs = storage_view(x.reshape(-1))
    ys = storage_view(y.reshape(-1))
    R = xs.size // (N * C)
    tile = min(C, reductions.COLUMN_TILE)
    rows_per_block = min(R, MAX_ROWS_PER_BLOCK, max(reductions.MIN_ROWS_PER_BLOCK,
                                                    reductions.ROW_BLOCK_ELEMENTS // tile))
    blocks = -(-R // rows_per_block)
    part_mean = np.empty((N * blocks, C))
    part_m2 = np.empty_like(part_mean)
    with _launch_guard():
        _pick(reductions.row_partials, reductions.row_partials_serial)(
            xs, C, R, rows_per_block, part_mean, part_m2)
    mean, m2 = np.empty(N * C), np.empty(N * C)
    with _launch_guard():
        _pick(instance.merge_sample_rows, instance.merge_sample_rows_serial)(
            part_mean, part_m2, R, rows_per_block, mean, m2)
    cd = compute_dtype(x.dtype)
    m, a, b = np.empty(N * C, cd), np.empty(N * C, cd), np.empty(N * C, cd)
    instance.fold_planes(C, R, storage_view(scale), storage_view(B), float(epsilon), mean, m2,
                         m, a, b)
    if R * C >= SAMPLE_CALL_MIN_ELEMENTS:
        _took("instance_rows", "per-sample")
        x2, y2 = x.reshape(N, R * C), y.reshape(N, R * C)
        for n in range(N):
            cs = slice(n * C, (n + 1) * C)
            scale_shift(x2[n], y2[n], C, 1, m[cs], a[cs], b[cs], path)
    else:
        _took("instance_rows", "one-launch")
        with _launch_guard():
            _pick(instance.normalize_rows, instance.normalize_rows_serial)(
                xs, ys, C, R, rows_per_block, m, a, b)
    return mean, m2

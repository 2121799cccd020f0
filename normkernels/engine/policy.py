"""Execution policy of the Numba engine: which loop and which path serve a call.

Every path gives the same bits, so these thresholds only move time. Each states its
rule here; the measurements that chose it, and the alternatives measured and
rejected, are in ``docs/design.md`` under the constant's name. Editing a value here
keeps the compiled kernels (the kernel cache covers ``normkernels/kernels/`` only).
"""

import functools
import glob
import os

from normkernels.engine import PATHS, threads
from normkernels.kernels.options import MAX_LANES, MIN_PLANE, SHORT_ROW, TABLE_PAD

# --- routes: every way a call can run, by name ---
# Each decision of the engine reports the route it takes to ``_trace`` when a test
# has set one: tests/test_paths.py runs a case per route against the float64 oracle
# and fails on a route (or a kernel launched by the engine) that has no case.
ROUTES = (
    "scale_shift/planes/serial", "scale_shift/planes/parallel",
    "scale_shift/planes/streaming", "scale_shift/short-planes/serial",
    "scale_shift/short-planes/parallel", "scale_shift/periodic/serial",
    "scale_shift/periodic/parallel", "scale_shift/periodic/streaming",
    "moments/planes/serial", "moments/planes/parallel",
    "moments/rows/serial", "moments/rows/parallel",
    "instance_planes/fused/serial", "instance_planes/fused/parallel",
    "instance_planes/fused/streaming", "instance_planes/fused-short/serial",
    "instance_planes/fused-short/parallel", "instance_planes/split",
    "instance_rows/per-sample", "instance_rows/one-launch/serial",
    "instance_rows/one-launch/parallel",
    "rows/fused/serial", "rows/fused/parallel", "rows/fused/streaming",
    "rows/split/parallel", "rows/split/streaming",
    "rows/fused add/serial", "rows/fused add/parallel", "rows/fused add/streaming",
    "rows/table-free/serial",
    "rows/from-statistics/serial", "rows/from-statistics/parallel",
    "rows/from-statistics/streaming",
    "one-thread",  # a forked child: every call on the serial path
    "lp/rows/serial", "lp/rows/parallel", "lp/columns/serial", "lp/columns/parallel",
    "lrn/planes/serial", "lrn/planes/parallel", "lrn/rows/serial", "lrn/rows/parallel",
    "grad_sums/planes/serial", "grad_sums/planes/parallel", "grad_sums/fused-planes/serial",
    "grad_sums/fused-planes/parallel", "grad_sums/fused-rows/serial",
    "grad_sums/fused-rows/parallel", "grad_sums/rows/serial",
    "grad_sums/rows/parallel", "grad_apply/planes/serial", "grad_apply/planes/parallel",
    "grad_apply/planes/streaming", "grad_apply/rows/serial", "grad_apply/rows/parallel",
    "grad_apply/rows/streaming",
    "rows_backward/serial", "rows_backward/parallel",
    # AdaLN's rows, every sample in one launch (numba_gated.py)
    "rows/modulated/serial", "rows/modulated/parallel", "rows/modulated/streaming",
    "rows_backward/modulated/serial", "rows_backward/modulated/parallel",
    # issue 32's kernels: no streaming loop (the streaming path runs the parallel one)
    "gated_rms/serial", "gated_rms/parallel", "gated_rms_backward/serial",
    "gated_rms_backward/parallel", "qk_norm/serial", "qk_norm/parallel",
    "quantized_rows/serial", "quantized_rows/parallel", "quantized_rows/table-free/serial",
    # the epilogues' elementwise gradients (numba_gradients.py): no streaming loop either
    "activation_grad/serial", "activation_grad/parallel", "relu_mask/serial",
    "relu_mask/parallel", "gated_backward/serial", "gated_backward/parallel",
    # the fused epilogue backward (numba_gradients.py): rows has no streaming loop
    "epilogue_sums/planes/serial", "epilogue_sums/planes/parallel",
    "epilogue_sums/rows/serial", "epilogue_sums/rows/parallel",
    "epilogue_apply/planes/serial", "epilogue_apply/planes/parallel",
    "epilogue_apply/planes/streaming", "epilogue_apply/rows/serial",
    "epilogue_apply/rows/parallel",
)
_trace = None


def took(*parts):
    """Report the route ``"/".join(parts)``; joined only when a test is listening, so
    an ordinary call pays one function call here, no string formatting."""
    if _trace is not None:
        _trace("/".join(parts))


# --- paths ---
# One thread up to this many elements: a parallel launch costs more than the loop.
SERIAL_MAX_ELEMENTS = 1 << 16
# The same for per-channel inference (a normalize pass and nothing else), apart
# because the trade-off differs: with recently active workers parallel wins from
# about 100K elements; after a pause, waking them costs about 100 us on this VM and
# serial wins up to about 1M (docs/design.md). Set for warm data.
NORMALIZE_SERIAL_MAX_ELEMENTS = 1 << 16
# While Numba's workers sleep (no parallel launch in the last
# threads.AWAKE_SECONDS), waking them costs 25-40 us on this VM, 150 us after 10 ms
# idle: per-channel inference (the engine's inference, which asks for this rule) up
# to this many times its serial limit runs on one thread (on 2 threads; fewer with
# more, see asleep_serial_max). Not for the statistics families: their serial loops
# are slower per element (instance norm on 7x7 planes: 150 us serial against 60 us
# parallel at 100K elements). Measured in docs/design.md.
ASLEEP_SERIAL_FACTOR = 16
# Streaming (non-temporal) stores only when a call's traffic (X read plus Y written)
# exceeds the last-level cache: below, ordinary stores leave Y in cache for the next
# layer, and streaming would send it to memory (measured 1.9x slower warm).
STREAMING_ENV = "NORMKERNELS_STREAMING"  # auto (the rule above) | always | never
STREAMING_CHOICES = ("auto", "always", "never")
DEFAULT_CACHE_BYTES = 8 << 20  # when the machine does not say (a safe underestimate)
_CACHE_DIR = "/sys/devices/system/cpu/cpu0/cache"


@functools.cache
def last_level_cache_bytes():
    """Size of the largest data (or unified) cache of CPU 0, from sysfs, else from
    ``sysconf``, else :data:`DEFAULT_CACHE_BYTES`."""
    sizes = []
    for index in glob.glob(os.path.join(_CACHE_DIR, "index*")):
        try:
            with open(os.path.join(index, "type")) as f:
                kind = f.read().strip()
            with open(os.path.join(index, "size")) as f:
                size = f.read().strip()
        except OSError:
            continue
        if kind in ("Data", "Unified"):
            sizes.append(parse_size(size))
    if not sizes:
        for name in ("SC_LEVEL3_CACHE_SIZE", "SC_LEVEL2_CACHE_SIZE"):
            try:
                sizes.append(os.sysconf(name))
            except (ValueError, OSError, AttributeError):
                pass
    best = max((s for s in sizes if s and s > 0), default=0)
    return best or DEFAULT_CACHE_BYTES


def parse_size(text):
    """sysfs cache sizes: "32768K", "1M", or plain bytes; 0 when unreadable."""
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    text = text.strip().upper()
    scale = units.get(text[-1:], 1)
    digits = text[:-1] if text[-1:] in units else text
    return int(digits) * scale if digits.isdigit() else 0


def streaming_mode():
    """The store policy from ``NORMKERNELS_STREAMING`` (read per call: a user may set it
    at run time); a value outside :data:`STREAMING_CHOICES` is an error."""
    mode = os.environ.get(STREAMING_ENV, "auto").strip().lower() or "auto"
    if mode not in STREAMING_CHOICES:
        raise ValueError(f"environment variable {STREAMING_ENV} must be one of "
                         f"{', '.join(STREAMING_CHOICES)}, got {mode!r}")
    return mode


def streaming_supported():
    """Streaming stores need an x86-64 target (``movnt*`` and ``sfence``, SSE2: every
    x86-64): the JIT's target, which ``NUMBA_CPU_NAME`` may set apart from the host."""
    from normkernels.kernels.target import jit_target

    return jit_target().x86


def wants_streaming(nbytes, arrays=2):
    """Streaming stores for an output of ``nbytes`` (its ``arrays - 1`` inputs as
    large): by the store policy, auto meaning the arrays together exceed the last-level
    cache."""
    mode = streaming_mode()
    if mode == "auto":
        return arrays * nbytes > last_level_cache_bytes()
    return mode == "always"


def choose_path(arr, serial_max=None, asleep_rule=False, arrays=2):
    """The path for a call over ``arr`` (a storage array): serial up to
    ``serial_max`` elements (default :data:`SERIAL_MAX_ELEMENTS`), and with
    ``asleep_rule`` up to :func:`asleep_serial_max` of it while the workers sleep;
    else parallel or streaming (streaming only for an output)."""
    limit = SERIAL_MAX_ELEMENTS if serial_max is None else serial_max
    n = arr.size
    if n <= limit or (asleep_rule and n <= asleep_serial_max(limit)
                      and not threads.workers_awake()):
        return "serial"
    if wants_streaming(arr.nbytes, arrays) and arr.flags.aligned and streaming_supported():
        return "streaming"
    return "parallel"


def asleep_serial_max(limit):
    """The serial limit when the workers sleep: waking them costs what one thread
    does on ``ASLEEP_SERIAL_FACTOR`` times ``limit`` elements, spread over the others."""
    threads_ = threads.count()
    if threads_ < 2:
        return limit
    return max(limit, limit * ASLEEP_SERIAL_FACTOR // (2 * (threads_ - 1)))


def resolve_path(arr, path, serial_max=None, asleep_rule=False, arrays=2):
    """``path`` checked, or the one :func:`choose_path` picks for ``arr`` (an output
    written from ``arrays - 1`` inputs of its size); "serial" in a forked child (see
    :mod:`normkernels.engine.threads`); streaming falls back to parallel where it
    cannot run."""
    if path is not None and path not in PATHS:
        raise ValueError(f"path must be one of {PATHS}, got {path!r}")
    if not threads.parallel_allowed():
        took("one-thread")
        return "serial"
    if path is None:
        return choose_path(arr, serial_max, asleep_rule, arrays)
    if path == "streaming" and not (streaming_supported() and arr.flags.aligned):
        return "parallel"
    return path


def loop_path(arr, path, arrays=2):
    """:func:`resolve_path` for the kernels that have no streaming loop: "serial" or
    "parallel" (streaming runs the parallel kernel)."""
    return "serial" if resolve_path(arr, path, arrays=arrays) == "serial" else "parallel"


# --- the normalize loop ---
# Elements per parallel work item: at most BLOCK_ELEMENTS, at least
# MIN_BLOCK_ELEMENTS, else about four blocks per thread; a multiple of 64 elements
# (every vector length).
BLOCK_ELEMENTS = 1 << 16
MIN_BLOCK_ELEMENTS = 1 << 12
# Runs shorter than MIN_PLANE use the periodic loop while its three parameter tables
# stay within this many bytes (in L2); beyond, the planes loop with scalar runs.
TABLES_MAX_BYTES = 3 << 19
# Parameter tables cover a whole number of periods of at least this many elements
# (the inner loop then vectorises even for C = 1 or 3), plus TABLE_PAD entries of
# wrap-around.
MIN_TABLE_PERIOD = 256


def block_size(n):
    """Elements per parallel work item for ``n`` elements."""
    per_thread = -(-n // (4 * threads.count()))
    block = -(-per_thread // 64) * 64
    return min(BLOCK_ELEMENTS, max(MIN_BLOCK_ELEMENTS, block))


def use_planes(C, S, itemsize):
    """Planes loop (else periodic) for runs of ``S`` elements per channel."""
    if S >= MIN_PLANE:
        return True
    return S > 1 and 3 * C * S * itemsize > TABLES_MAX_BYTES


def inference_period(C, S, itemsize, n):
    """The serial inference kernel's loop for ``n`` elements of ``itemsize``: 0 for
    the planes loop (scalar for planes shorter than a vector, and for X shorter than
    a vector: no tables to build), else the period of its parameter tables; reports
    the route."""
    if n < MAX_LANES:
        took("scale_shift", "short-planes", "serial")
        return 0
    if use_planes(C, S, 8 if itemsize == 8 else 4):
        took("scale_shift", "planes" if S >= MIN_PLANE else "short-planes", "serial")
        return 0
    took("scale_shift", "periodic", "serial")
    return table_period(C, S)[0]


def table_period(C, S):
    """Entries of one parameter table before its padding: a multiple of ``C * S``."""
    period = C * S
    return period * -(-MIN_TABLE_PERIOD // period), TABLE_PAD


# --- statistics ---
# Rows narrower than this are widened to a multiple of C * S columns, so the
# per-column loop of the rows kernel has something to vectorise (NXC with C = 3).
MIN_ROW_COLUMNS = 64
# Planes kernel (else rows kernel) for runs of S >= MOMENTS_MIN_PLANE when
# S >= MOMENTS_SHORT_PLANE or there are fewer than MOMENTS_MIN_ROWS rows.
MOMENTS_MIN_PLANE = 32
MOMENTS_SHORT_PLANE = 512
MOMENTS_MIN_ROWS = 32
# Row blocks of the rows kernel hold about ROW_BLOCK_ELEMENTS per column tile and at
# least MIN_ROWS_PER_BLOCK rows (bounding the partials to 1/16 of X's elements); at
# most MAX_ROWS_PER_BLOCK rows for instance statistics, whose sequential float64
# column sums would otherwise grow long.
ROW_BLOCK_ELEMENTS = 1 << 18
MIN_ROWS_PER_BLOCK = 16
MAX_ROWS_PER_BLOCK = 4096


def use_plane_moments(S, n_rows):
    return S >= MOMENTS_MIN_PLANE and (S >= MOMENTS_SHORT_PLANE or n_rows < MOMENTS_MIN_ROWS)


def rows_per_block(width, column_tile, most=None):
    """Rows per block of the rows kernel for rows of ``width`` columns."""
    rows = max(MIN_ROWS_PER_BLOCK, ROW_BLOCK_ELEMENTS // min(width, column_tile))
    return rows if most is None else min(most, rows)


# Instance and group statistics of NXC samples: about MIN_SAMPLE_BLOCKS row blocks of
# a power of two rows over the N samples where MIN_ROWS_PER_BLOCK allows, so a batch
# of one sample of few wide rows is several work items (GroupNorm of (1, 2560, 8, 8)
# was one: one thread). A function of the shape only: the blocks are the merge order,
# so the bits; powers of two keep the means of dyadic data exact (s1 / 22 is not).
MIN_SAMPLE_BLOCKS = 8


def sample_block_rows(N, C, R, column_tile):
    """Rows per block of the per-sample statistics of ``N`` samples of ``R`` rows of
    ``C``."""
    rows = rows_per_block(C, column_tile, most=min(R, MAX_ROWS_PER_BLOCK))
    per_sample = -(-MIN_SAMPLE_BLOCKS // max(N, 1))
    split = 1 << (-(-R // per_sample) - 1).bit_length()
    return max(min(rows, split), min(R, MIN_ROWS_PER_BLOCK))


def sample_normalize_rows(N, C, R):
    """Rows per work item of the one-launch NXC normalize of ``N`` samples of ``R`` rows
    of ``C`` (no bit depends on it): about BLOCK_ELEMENTS elements, at least four items
    per thread where there are rows for them."""
    return max(1, min(R, BLOCK_ELEMENTS // max(C, 1), -(-N * R // (4 * threads.count()))))


# --- instance normalization ---
# NCX: one plane per work item (statistics, then normalize while the plane is in L2)
# for planes of FUSED_MIN_PLANE elements up to FUSED_MAX_PLANE_BYTES and at least
# twice as many planes as threads; otherwise statistics and normalize are split
# across the threads.
FUSED_MIN_PLANE = 512
FUSED_MAX_PLANE_BYTES = 1 << 20
# NXC: samples of at least this many elements get one normalize call each
# (streaming stores, parameter tables); smaller ones one launch over all samples.
SAMPLE_CALL_MIN_ELEMENTS = 1 << 20


def split_instance_planes(n_planes, S, itemsize, path):
    """Split statistics and normalize (else fused per plane) for NCX instance norm."""
    return S >= MIN_PLANE and path != "serial" and (
        S < FUSED_MIN_PLANE or S * itemsize > FUSED_MAX_PLANE_BYTES
        or n_planes < 2 * threads.count())


# --- row normalizations ---
# Rows per work item of the fused kernel: about ROWS_ITEM_ELEMENTS elements, at most
# a quarter of each thread's share (load balance), at least one row.
ROWS_ITEM_ELEMENTS = 1 << 15
# Fewer rows than this many per thread: statistics and normalize split by column
# chunks (a row per thread would leave threads idle); the row is then read twice.
SPLIT_ROWS_PER_THREAD = 2
SPLIT_RUN = 1 << 14  # columns per normalize work item of the split path


def rows_per_item(M, K):
    threads_ = threads.count()
    return max(1, min(ROWS_ITEM_ELEMENTS // max(K, 1), M // (4 * threads_)))


def split_rows(M, K, path):
    """Split statistics and normalize (else fused rows) for a row normalization; never
    for rows shorter than ``SHORT_ROW``, whose statistics only the fused kernel
    computes (no work worth splitting)."""
    return (path != "serial" and K >= SHORT_ROW
            and M < SPLIT_ROWS_PER_THREAD * threads.count())


# --- LpNormalization and LRN ---
# No streaming loop: both read an item's inputs twice (the norm or the squares, then
# the outputs) from cache, and their outputs go through ordinary stores; the
# streaming path runs the parallel kernels.
# LRN over channels-first memory: squares of a chunk of spatial positions for all C
# channels are kept in float64 scratch of at most LRN_SCRATCH_ELEMENTS (256 KB, in
# L2), chunks of at least LRN_MIN_CHUNK positions (a multiple of every vector length).
LRN_SCRATCH_ELEMENTS = 1 << 15
LRN_MIN_CHUNK = 64


def lrn_chunk(N, C, S):
    """Spatial positions per LRN work item: the scratch bound, split further so that
    there are about four items per thread, never below ``LRN_MIN_CHUNK``."""
    chunk = max(LRN_MIN_CHUNK, LRN_SCRATCH_ELEMENTS // max(C, 1))
    per_sample = -(-4 * threads.count() // max(N, 1))
    chunk = min(chunk, max(LRN_MIN_CHUNK, -(-S // per_sample)))
    return min(S, -(-chunk // 64) * 64)

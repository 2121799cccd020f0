"""Benchmark workloads: what is timed, and beside what.

One table (:data:`WORKLOADS`) feeds the ``normkernels bench`` command and the
pytest-benchmark cases in the repository's ``benchmarks/`` directory. Every row is timed
against baselines run in the same process with interleaved repeats (A B C A B C ...)
and reported as medians (the timing harness: :mod:`normkernels.bench.harness`), so a
shared, noisy machine shifts all of them together and the ratios hold:

* ``copy``: a copy of the same bytes (the roofline: Y = X cannot be faster;
  parallel, one thread below 1 MB),
* ``read``: a parallel read-only sum over X (the roofline of moments, which write no Y),
* ``add``: for backward passes, which read X and dY and write dX, a parallel ``dX = X +
  dY`` over the same arrays (their roofline: two arrays read and one written; one
  thread below 1 MB),
* ``axpb``: a plain parallel ``y = a * x + b`` loop over the same array,
* ``numpy``: the NumPy formula a user would write.

(The baselines' loops: :mod:`normkernels.bench.baselines`.)

GB/s counts the bytes each candidate moves: the operator's (:func:`streams` X-sized
arrays) for normkernels and the peers, a baseline's own for a baseline.
"""

import time
from dataclasses import dataclass

import numpy as np

from normkernels.bench.baselines import baseline_calls as baseline_calls  # re-exported
from normkernels.bench.harness import CACHE_STATES as CACHE_STATES  # re-exported
from normkernels.bench.harness import (
    SMALL_WORKLOAD_BYTES,
    cache_state,
    max_relative_error,
    timed_medians,
)
from normkernels.bench.harness import CacheFlusher as CacheFlusher  # re-exported
from normkernels.bench.harness import flusher as flusher  # re-exported
from normkernels.dtypes import BFLOAT16, FLOAT16, FLOAT32, FLOAT64
from normkernels.operators import BACKWARD, OPERATORS, YARDSTICK, operator

DTYPES = {"float16": FLOAT16, "bfloat16": BFLOAT16, "float32": FLOAT32, "float64": FLOAT64}
LAYOUTS = ("NCX", "NXC")


@dataclass(frozen=True)
class Workload:
    name: str
    op: str  # a key of normkernels.operators.OPERATORS
    shape: tuple  # in NCX order: (N, C, *spatial)
    dtype: str
    data_format: str = "NCX"
    mode: str = "inference"

    @property
    def operator(self):
        return operator(self.op)

    @property
    def layout_shape(self):
        """X's shape: the NCX shape, channels moved last for NXC (row normalizations:
        the shape as given, whatever the layout)."""
        if self.data_format == "NXC" and len(self.shape) > 2 and not self.operator.rows:
            return (self.shape[0], *self.shape[2:], self.shape[1])
        return self.shape

    @property
    def channels(self):
        """Parameters per vector: C, or the row length of a row normalization."""
        return self.operator.columns(self.shape)

    @property
    def channel_axis(self):
        ndim = len(self.shape)
        return 1 if self.data_format == "NCX" or ndim <= 2 else ndim - 1


STEM, LAST = (32, 64, 112, 112), (64, 2048, 7, 7)
DIT = (8, 1024, 1152)  # (samples, tokens, hidden): DiT-XL/2 at 512x512
WORKLOADS = [
    Workload("resnet-stem-f32-ncx", "batchnorm", STEM, "float32", "NCX"),
    Workload("resnet-stem-f32-nxc", "batchnorm", STEM, "float32", "NXC"),
    Workload("resnet-stem-f16-ncx", "batchnorm", STEM, "float16", "NCX"),
    Workload("resnet-stem-bf16-ncx", "batchnorm", STEM, "bfloat16", "NCX"),
    Workload("resnet-stem-bf16-nxc-onednn", "batchnorm-inference", STEM, "bfloat16", "NXC"),
    Workload("resnet-last-f32", "batchnorm", LAST, "float32", "NCX"),
    Workload("dense-f32", "batchnorm", (4096, 1024), "float32", "NCX"),
    Workload("tiny-f32", "batchnorm", (1, 16, 8, 8), "float32", "NCX"),
    Workload("train-resnet-stem-f32-ncx", "batchnorm", STEM, "float32", "NCX", "training"),
    Workload("train-resnet-stem-f32-nxc", "batchnorm", STEM, "float32", "NXC", "training"),
    Workload("train-resnet-last-f32", "batchnorm", LAST, "float32", "NCX", "training"),
    Workload("train-resnet-stem-bf16-nxc-onednn", "batchnorm-training-onednn", STEM,
             "bfloat16", "NXC", "training"),
    Workload("moments-resnet-stem-f32-ncx", "moments", STEM, "float32", "NCX"),
    Workload("moments-resnet-stem-f32-nxc", "moments", STEM, "float32", "NXC"),
    Workload("instnorm-style-f32-ncx", "instancenorm", (8, 64, 256, 256), "float32", "NCX"),
    Workload("instnorm-style-f32-nxc", "instancenorm", (8, 64, 256, 256), "float32", "NXC"),
    Workload("instnorm-512-f32", "instancenorm", (1, 32, 512, 512), "float32", "NCX"),
    Workload("instnorm-512-f16", "instancenorm", (1, 32, 512, 512), "float16", "NCX"),
    Workload("instnorm-512-bf16", "instancenorm", (1, 32, 512, 512), "bfloat16", "NCX"),
    Workload("instnorm-14x14-f32", "instancenorm", (32, 256, 14, 14), "float32", "NCX"),
    # row normalizations: (rows, hidden); the shapes and a warm one (BERT-base)
    Workload("layernorm-8192x4096-f32", "layernorm", (8192, 4096), "float32"),
    Workload("layernorm-16384x768-f32", "layernorm", (16384, 768), "float32"),
    Workload("layernorm-128x768-f32", "layernorm", (128, 768), "float32"),
    Workload("layernorm-8192x4096-f16", "layernorm", (8192, 4096), "float16"),
    Workload("layernorm-8192x4096-bf16", "layernorm", (8192, 4096), "bfloat16"),
    Workload("rmsnorm-8192x4096-f32", "rmsnorm", (8192, 4096), "float32"),
    Workload("rmsnorm-16384x768-f32", "rmsnorm", (16384, 768), "float32"),
    Workload("rmsnorm-128x768-f32", "rmsnorm", (128, 768), "float32"),
    Workload("rmsnorm-8192x4096-bf16", "rmsnorm", (8192, 4096), "bfloat16"),
    Workload("skip-layernorm-8192x4096-f32", "skip-layernorm", (8192, 4096), "float32"),
    Workload("skip-layernorm-128x768-f32", "skip-layernorm", (128, 768), "float32"),
    # group normalizations: a Stable Diffusion U-Net block and a style-transfer layer
    Workload("groupnorm-sd-f32-ncx", "groupnorm", (2, 320, 64, 64), "float32", "NCX"),
    Workload("groupnorm-sd-f32-nxc", "groupnorm", (2, 320, 64, 64), "float32", "NXC"),
    Workload("groupnorm-style-f32-ncx", "groupnorm", (8, 64, 256, 256), "float32", "NCX"),
    Workload("groupnorm-style-f32-nxc", "groupnorm", (8, 64, 256, 256), "float32", "NXC"),
    Workload("groupnorm-style-f16-ncx", "groupnorm", (8, 64, 256, 256), "float16", "NCX"),
    Workload("groupnorm-style-bf16-ncx", "groupnorm", (8, 64, 256, 256), "bfloat16", "NCX"),
    Workload("groupnorm-sd-bf16-nxc-onednn", "groupnorm-onednn", (2, 320, 64, 64), "bfloat16",
             "NXC"),
    # onnxruntime's GroupNorm with SiLU (diffusion UNet/VAE blocks) and SkipGroupNorm
    Workload("groupnorm-silu-512x64x64-f32-ncx", "groupnorm-ort", (1, 512, 64, 64), "float32",
             "NCX"),
    Workload("groupnorm-silu-512x64x64-f32-nxc", "groupnorm-ort", (1, 512, 64, 64), "float32",
             "NXC"),
    Workload("groupnorm-silu-128x256x256-f32-nxc", "groupnorm-ort", (1, 128, 256, 256),
             "float32", "NXC"),
    Workload("skip-groupnorm-silu-sd-f32-nxc", "skip-groupnorm-ort", (2, 320, 64, 64),
             "float32", "NXC"),
    # diffusion models' per-sample modulation: DiT-XL/2's AdaLN (256 tokens of 1152 at
    # 256x256, 1024 at 512x512), diffusers' AdaGroupNorm in UNet/VAE blocks; small ones
    Workload("ada-layernorm-dit-8x1024x1152-f32", "ada-layernorm", DIT, "float32"),
    Workload("ada-layernorm-dit-8x1024x1152-bf16", "ada-layernorm", DIT, "bfloat16"),
    Workload("ada-layernorm-1x128x768-f32", "ada-layernorm", (1, 128, 768), "float32"),
    Workload("ada-groupnorm-512x64x64-f32-ncx", "ada-groupnorm", (1, 512, 64, 64), "float32"),
    Workload("ada-groupnorm-512x64x64-f32-nxc", "ada-groupnorm", (1, 512, 64, 64), "float32",
             "NXC"),
    Workload("ada-groupnorm-128x256x256-f32-ncx", "ada-groupnorm", (1, 128, 256, 256),
             "float32"),
    Workload("ada-groupnorm-128x256x256-f32-nxc", "ada-groupnorm", (1, 128, 256, 256),
             "float32", "NXC"),
    Workload("ada-groupnorm-tiny-f32", "ada-groupnorm", (1, 16, 8, 8), "float32"),
    # LLM serving: decode's (1, 4096) and (4, 4096) rows, prefill's (512, 4096)
    *[Workload(f"{op}-{rows}x4096-{short}", op, (rows, 4096), dtype)
      for op in ("fused-add-rmsnorm", "gated-rmsnorm", "quantized-rmsnorm")
      for rows in (1, 4, 512) for short, dtype in (("f32", "float32"), ("bf16", "bfloat16"))],
    Workload("fused-add-layernorm-512x4096-f32", "fused-add-layernorm", (512, 4096), "float32"),
    Workload("qk-rmsnorm-512x6144-f32", "qk-rmsnorm", (512, 6144), "float32"),
    Workload("qk-rmsnorm-512x6144-bf16", "qk-rmsnorm", (512, 6144), "bfloat16"),
    Workload("quantized-layernorm-512x4096-f32", "quantized-layernorm", (512, 4096),
             "float32"),
    Workload("mvn-resnet-stem-f32", "mvn", STEM, "float32", "NCX"),
    Workload("lpnorm-8192x4096-f32", "lpnorm", (8192, 4096), "float32"),
    Workload("lrn-32x64x56x56-f32", "lrn", (32, 64, 56, 56), "float32", "NCX"),
    Workload("lrn-32x64x56x56-f32-nxc", "lrn", (32, 64, 56, 56), "float32", "NXC"),
    # backward passes (dX, dscale, dB from dY and X; BN: training, the batch statistics)
    Workload("backward-resnet-stem-f32-ncx", "batchnorm", STEM, "float32", "NCX", BACKWARD),
    Workload("backward-resnet-stem-f32-nxc", "batchnorm", STEM, "float32", "NXC", BACKWARD),
    Workload("backward-resnet-stem-f16-ncx", "batchnorm", STEM, "float16", "NCX", BACKWARD),
    Workload("backward-resnet-stem-bf16-ncx", "batchnorm", STEM, "bfloat16", "NCX", BACKWARD),
    Workload("backward-4x8x32x32-f32", "batchnorm", (4, 8, 32, 32), "float32", "NCX", BACKWARD),
    Workload("backward-resnet-stem-bf16-nxc-onednn", "batchnorm-training-onednn", STEM,
             "bfloat16", "NXC", BACKWARD),
    Workload("backward-instnorm-style-f32-ncx", "instancenorm", (8, 64, 256, 256), "float32",
             "NCX", BACKWARD),
    Workload("backward-groupnorm-style-f32-ncx", "groupnorm", (8, 64, 256, 256), "float32",
             "NCX", BACKWARD),
    Workload("backward-groupnorm-style-f32-nxc", "groupnorm", (8, 64, 256, 256), "float32",
             "NXC", BACKWARD),
    Workload("backward-groupnorm-sd-f32-ncx", "groupnorm", (2, 320, 64, 64), "float32", "NCX",
             BACKWARD),
    Workload("backward-layernorm-8192x4096-f32", "layernorm", (8192, 4096), "float32",
             mode=BACKWARD),
    Workload("backward-layernorm-16384x768-f32", "layernorm", (16384, 768), "float32",
             mode=BACKWARD),
    Workload("backward-layernorm-128x768-f32", "layernorm", (128, 768), "float32",
             mode=BACKWARD),
    Workload("backward-rmsnorm-8192x4096-f32", "rmsnorm", (8192, 4096), "float32",
             mode=BACKWARD),
    Workload("backward-ada-layernorm-dit-8x1024x1152-f32", "ada-layernorm", DIT, "float32",
             mode=BACKWARD),
    Workload("backward-ada-groupnorm-512x64x64-f32-ncx", "ada-groupnorm", (1, 512, 64, 64),
             "float32", mode=BACKWARD),
    Workload("backward-ada-groupnorm-512x64x64-f32-nxc", "ada-groupnorm", (1, 512, 64, 64),
             "float32", "NXC", BACKWARD),
]
WORKLOADS_BY_NAME = {w.name: w for w in WORKLOADS}

SUITES = {
    # the standard set: BN inference in each dtype and layout, training, the shapes
    # at the ends of ResNet, a dense layer, instance norm, and per-call latency
    "default": ["resnet-stem-f32-ncx", "resnet-stem-f32-nxc", "resnet-stem-f16-ncx",
                "resnet-stem-bf16-ncx", "resnet-stem-bf16-nxc-onednn",
                "train-resnet-stem-f32-ncx", "train-resnet-stem-f32-nxc", "resnet-last-f32",
                "dense-f32", "instnorm-style-f32-ncx", "tiny-f32", "layernorm-16384x768-f32",
                "layernorm-128x768-f32"],
    "quick": ["resnet-stem-f32-ncx", "train-resnet-stem-f32-ncx", "instnorm-512-f32",
              "tiny-f32"],
    "rows": [w.name for w in WORKLOADS if w.operator.rows and w.mode != BACKWARD],
    "groups": [w.name for w in WORKLOADS if w.operator.family in ("group", "mvn", "lp", "lrn")
               and w.mode != BACKWARD],
    # the backward passes (16-bit BN beside float32: the same GB/s is the aim)
    "backward": [w.name for w in WORKLOADS if w.mode == BACKWARD],
    # diffusion blocks: GroupNorm with SiLU, per-sample modulation (AdaLN, AdaGroupNorm)
    "diffusion": [w.name for w in WORKLOADS if w.operator.per_sample or
                  w.operator.epilogue == "silu"],
    # LLM serving: the fused add in place, the gated RMSNorm, quantized outputs
    "llm": [w.name for w in WORKLOADS if w.operator.in_place or w.operator.quantized
            or w.operator.epilogue == "silu gate"],  # QK-norm is in place too
    "all": [w.name for w in WORKLOADS],
}


def custom_workload(op="batchnorm", mode="inference", shape=(32, 64, 112, 112),
                    dtype="float32", layout="NCX"):
    """A workload from the command line's flags (``shape`` in N, C, spatial order)."""
    if op not in OPERATORS:
        raise ValueError(f"--op must be one of {', '.join(OPERATORS)}, got {op!r}")
    if mode not in OPERATORS[op].modes:
        raise ValueError(f"--op {op} has no --mode {mode} (its modes: "
                         f"{', '.join(OPERATORS[op].modes)})")
    if dtype not in DTYPES:
        raise ValueError(f"--dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")
    if layout not in OPERATORS[op].layouts:
        raise ValueError(f"--layout must be one of {', '.join(OPERATORS[op].layouts)} for "
                         f"--op {op}, got {layout!r}")
    shape = tuple(int(v) for v in shape)
    name = f"{op}-{mode}-{'x'.join(map(str, shape))}-{dtype}-{layout}".lower()
    return Workload(name, op, shape, dtype, layout, mode)


def make_inputs(workload, seed=0):
    """X and the per-channel parameters of a workload (see ``Operator.params``; mode
    backward: dY first, then the backward's parameters)."""
    rng = np.random.default_rng(seed)
    dtype = DTYPES[workload.dtype]
    X = rng.standard_normal(workload.layout_shape, dtype=np.float32).astype(dtype)
    return X, workload.operator.params(rng, workload.channels, dtype, workload.layout_shape,
                                       workload.mode, X, workload.channel_axis)


def normkernels_call(workload, X, params, out, mode=None):
    """The normkernels call of a workload (``mode`` overrides the workload's)."""
    return workload.operator.bound(X, params, mode or workload.mode, workload.data_format, out)


def inference_call(workload, X, params, out):
    """BN inference on the workload's tensor, the yardstick of training and instance
    normalization (``over_inference``); None for BN inference itself."""
    if workload.mode not in workload.operator.over_inference:
        return None
    bn = operator(YARDSTICK)
    p = bn.params(np.random.default_rng(0), workload.channels, DTYPES[workload.dtype])
    return bn.bound(X, p, "inference", workload.data_format, out)


def numpy_call(workload, X, params, dtype=None):
    """What a NumPy user would write, in X's dtype (or ``dtype``): the operator's
    formula. Returns a callable giving Y, (mean, var) for moments, dX for backward."""
    dtype = X.dtype if dtype is None else np.dtype(dtype)
    op = workload.operator

    def quiet():  # float16 overflows in NumPy (instance norm of 512x512): that is its result
        with np.errstate(all="ignore"):
            return op.formula(X, params, workload.mode, workload.channel_axis, dtype)

    return quiet


# X-sized arrays a baseline moves per call (BN inference, the yardstick: X and Y)
BASELINE_STREAMS = {"copy": 2, "axpb": 2, "read": 1, "add": 3, "inference": 2}
# by the operator's streams (a fused add's 4 against the add's 3: by bandwidth)
ROOFLINES = {1: "read", 2: "copy", 3: "add", 4: "add"}


def streams(workload):
    """X-sized arrays one call of the workload moves: the record's ``streams`` (a fused
    add reads and writes X and the residual: 4), 1 for moments (X read), 3 for a
    backward pass (X and dY read, dX written), else 2 (X read, Y written)."""
    if workload.operator.streams is not None and workload.mode != BACKWARD:
        return workload.operator.streams
    if workload.operator.reads_only:
        return 1
    return 3 if workload.mode == BACKWARD else 2


def roofline(workload):
    """The baseline that bounds the workload: a parallel read (moments), copy (X to
    Y) or add (dX = X + dY: backward), of the same arrays."""
    return ROOFLINES[streams(workload)]


def moved_bytes(workload, X, candidate="normkernels"):
    """Bytes a candidate moves per call: a baseline's own streams, else the
    workload's (normkernels and the peers compute the same thing)."""
    return BASELINE_STREAMS.get(candidate, streams(workload)) * X.nbytes


def gbps(workload, X, seconds):
    """{candidate: GB/s} from {candidate: seconds}, each by :func:`moved_bytes`."""
    return {k: moved_bytes(workload, X, k) / v / 1e9 for k, v in seconds.items()}


def comparison_calls(workload, X, params, peers, threads,
                     baselines=("copy", "read", "axpb", "add"), yardstick=True):
    """What normkernels is timed beside, as {name: call}, and {peer: reason} for the
    peers that cannot run: the ``baselines`` asked for (no ``axpb`` for operators
    without Y, ``add`` for backward passes only, on X and dY), BN inference for the
    ``over_inference`` modes (with ``yardstick``), and the ``peers``."""
    from normkernels.bench.peers import PEERS, Unavailable

    calls = {}
    if baselines:
        # the add's second input: dY, or the skip (gate, residual) of X's shape
        dY = params[0] if workload.mode == BACKWARD or roofline(workload) == "add" else None
        available = baseline_calls(X, np.empty_like(X), dY)
        for name in baselines:
            if name in available and not (name == "axpb" and workload.operator.reads_only):
                calls[name] = available[name]
    inference = inference_call(workload, X, params, np.empty_like(X)) if yardstick else None
    if inference is not None:
        calls["inference"] = inference
    skipped = {}
    for name in peers:
        try:
            calls[name] = PEERS[name](workload, X, params, threads)
        except Unavailable as exc:
            skipped[name] = str(exc)
    return calls, skipped


def run_workload(workload, repeat=20, warmup=2, peers=("numpy",), threads=None,
                 budget_seconds=60, cache=None):
    """Time one workload beside the roofline baselines and the peers; returns a dict.

    Baselines: ``copy`` (a parallel copy of the bytes of X into Y), ``read`` (a parallel
    read-only sum over X), ``axpb`` (a plain parallel ``y = a*x + b``) and for backward
    passes ``add`` (a parallel ``dX = X + dY``); the roofline (:func:`roofline`) is
    ``copy`` for operators that write Y, ``read`` for moments and ``add`` for backward
    passes (X and dY read, dX written). ``bytes`` is what the operator moves
    (:func:`streams` times X's bytes) and ``gbps`` each candidate's bytes per second
    (:func:`moved_bytes`). The ``over_inference`` modes (training, instance
    normalization, backward passes) are also timed against BN inference on the same
    tensor. Peers (see :mod:`normkernels.bench.peers`) that cannot run are listed in
    ``skipped`` with the reason; every peer's Y (dX for backward) is checked against
    normkernels' (``agreement``: max relative difference) and normkernels' against
    the formula in float64 (``max_rel_err``). ``cache``: warm, cold or None (by size,
    see :func:`cache_state`); the result's ``cache`` says which.
    """
    import numba

    threads = threads or numba.get_num_threads()
    X, params = make_inputs(workload)
    out = np.empty_like(X)
    nk = normkernels_call(workload, X, params, out)
    t0 = time.perf_counter()
    result_nk = nk()
    first_call = time.perf_counter() - t0
    if workload.operator.in_place:  # the timed calls write its buffers again
        result_nk = tuple(a.copy() for a in result_nk)
    limit = roofline(workload)
    others, skipped = comparison_calls(workload, X, params, peers, threads)
    calls = {"normkernels": nk, **others}
    cache = cache_state(cache, X.nbytes)
    # many short warm calls give a steady median; cold ones are slower and steadier
    small = cache == "warm" and X.nbytes < SMALL_WORKLOAD_BYTES
    medians = timed_medians(calls, cache, repeat * (50 if small else 1), warmup,
                            budget_seconds=budget_seconds)
    nbytes = moved_bytes(workload, X)
    nk_time = medians["normkernels"]
    result = {
        "workload": workload.name, "op": workload.op, "mode": workload.mode,
        "shape": list(workload.layout_shape),
        "dtype": workload.dtype, "data_format": workload.data_format, "bytes": nbytes,
        "threads": threads, "cache": cache, "first_call_s": first_call,
        "seconds": medians,
        "gbps": gbps(workload, X, medians),
        "roofline": limit,
        "pct_of_roofline": 100.0 * medians[limit] / nk_time * nbytes / moved_bytes(
            workload, X, limit),
        "pct_of_copy": 100.0 * medians["copy"] / nk_time,
        "pct_of_read": 100.0 * medians["read"] / nk_time,
        "ratios": {name: medians[name] / nk_time for name in peers if name in medians},
        "skipped": skipped,
    }
    if "axpb" in medians:
        result["pct_of_axpb"] = 100.0 * medians["axpb"] / nk_time
    if "inference" in medians:
        result["over_inference"] = nk_time / medians["inference"]
    exact = numpy_call(workload, X, params, np.float64)()
    result["max_rel_err"] = {"normkernels": _error(workload, result_nk, exact)}
    result["agreement"] = {}
    for name in result["ratios"]:
        theirs = calls[name]()
        result["agreement"][name] = agreement(workload, theirs, result_nk)
        if name == "numpy":
            result["max_rel_err"]["numpy"] = _error(workload, theirs, exact)
    if "numpy" in result["ratios"]:
        result["numpy_over_normkernels"] = result["ratios"]["numpy"]
    return result


def agreement(workload, theirs, ours):
    """Max relative difference of a peer's result from normkernels' (``ours``, what
    its call returned): Y (dX for backward), or mean and variance for moments."""
    if isinstance(ours, tuple) and not workload.operator.tuple_output:
        ours = ours[0]
    if workload.operator.quantized:  # q within one step (their rounding's ties), scales
        step = np.abs(theirs[0].astype(np.float64) - ours[0]) - 1
        return max(float(np.max(np.maximum(step, 0) / np.maximum(np.abs(ours[0]), 1),
                                initial=0.0)), max_relative_error(theirs[1], ours[1]))
    return _error(workload, theirs, ours)


def _error(workload, got, exact):
    if workload.operator.quantized and got[0].dtype != exact[0].dtype:  # q: integers
        return max(_rounding_error(got[0], exact[0]), max_relative_error(got[1], exact[1]))
    if workload.operator.tuple_output:
        return max(max_relative_error(g, e) for g, e in zip(got, exact, strict=True))
    if isinstance(got, tuple):
        got = got[0]
    return max_relative_error(got, exact)




def _rounding_error(q, exact):
    """The relative error of quantized values beyond the half step of their rounding
    to integers (``exact``: the formula's q before it): 0 when correctly rounded."""
    e = np.asarray(exact, np.float64)
    beyond = np.maximum(np.abs(np.asarray(q, np.float64) - e) - 0.5, 0.0)
    return float(np.max(beyond / np.maximum(np.abs(e), 1.0), initial=0.0))

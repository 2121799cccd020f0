"""Every execution path of every operator against the float64 oracle.

The Numba engine names each way a call can run (``policy.ROUTES``) and reports the
routes it takes. Each case below forces one or more routes (by ``path=``, by shape, by
a policy threshold, or as a forked child running one-thread twins), checks that
the routes were really taken, and compares every output with the oracle, on data
with different statistics per sample and channel (a mix-up of samples or channels
is far outside the tolerance). ``test_every_route_has_a_case`` and
``test_every_kernel_has_a_case`` fail when a route or a kernel launched by the
engine has no case, so a path added later cannot go untested.
"""

import ast
import inspect
from dataclasses import dataclass, field, replace

import numpy as np
import pytest
import test_epilogue_backward as epilogue_tests
import test_gated as gated_tests
import test_qk_norm as qk_tests
import test_quantized as quantized_tests
from arrays import FLOAT_IDS, FLOATS, assert_identical, to_layout
from numba.core.dispatcher import Dispatcher
from oracle import (
    assert_close,
    backward_tolerance,
    batch_norm,
    batch_statistics,
    compute_dtype,
    gamma,
    group_norm,
    group_tolerance,
    instance_norm,
    instance_tolerance,
    lp_oracle,
    lrn_oracle,
    mean_variance_norm,
    mvn_tolerance,
    normalization_backward,
    rounded_statistic_tolerance,
    row_norm,
    row_tolerance,
    statistics_tolerance,
    tolerance,
    training_tolerance,
    ulp,
    ulp_close,
)

from normkernels import reference
from normkernels.engine import (
    PATHS,
    Engine,
    numba_gated,
    numba_gradients,
    numba_launch,
    numba_quantized,
    policy,
    threads,
)
from normkernels.engine import numba_engine as engine_module
from normkernels.engine.numba_engine import ENGINE
from normkernels.kernels import (
    activation_grad,
    backward_dx,
    backward_sums,
    epilogue_grad,
    fused_add,
    quantize,
)
from normkernels.kernels import backward_small as small_kernels
from normkernels.kernels import gated as gated_kernels
from normkernels.kernels import inference as inference_kernels
from normkernels.kernels import instance as instance_kernels
from normkernels.kernels import lp as lp_kernels
from normkernels.kernels import lrn as lrn_kernels
from normkernels.kernels import modulated as modulated_kernels
from normkernels.kernels import qk_norm as qk_kernels
from normkernels.kernels import rows as rows_kernels
from normkernels.kernels import scale_shift as scale_shift_kernels
from normkernels.kernels import skip_sums as skip_kernels
from normkernels.kernels import statistics as statistics_kernels
from normkernels.ops import backward as backward_spec
from normkernels.ops import batch_norm_inference as bni_spec
from normkernels.ops import batch_normalization as bn_spec
from normkernels.ops import common, plans
from normkernels.ops import fused_add as fused_add_spec
from normkernels.ops import gated as gated_spec
from normkernels.ops import group_normalization as gn_spec
from normkernels.ops import instance_normalization as in_spec
from normkernels.ops import layer_normalization as ln_spec
from normkernels.ops import lp_normalization as lp_spec
from normkernels.ops import lrn as lrn_spec
from normkernels.ops import mean_variance_normalization as mvn_spec
from normkernels.ops import modulated as ada_spec
from normkernels.ops import moments as moments_spec
from normkernels.ops import qk_norm as qk_spec
from normkernels.ops import quantized as quantized_spec
from normkernels.ops import rms_normalization as rms_spec
from normkernels.ops import skip_layer_normalization as skip_spec
from normkernels.reference import quantized as reference_quantized

F16, BF16, F32, F64 = FLOATS
EPS = 1e-3
KERNEL_MODULES = {"loops": scale_shift_kernels, "reductions": statistics_kernels,
                  "instance": instance_kernels, "inference": inference_kernels,
                  "rows": rows_kernels, "lp_kernels": lp_kernels, "lrn_kernels": lrn_kernels,
                  "backward_sums": backward_sums, "backward_dx": backward_dx,
                  "fused_add": fused_add, "gated_kernels": gated_kernels,
                  "qk_kernels": qk_kernels, "quantize": quantize,
                  "activation_grad": activation_grad, "skip_kernels": skip_kernels,
                  "epilogue_grad": epilogue_grad, "small": small_kernels,
                  "modulated": modulated_kernels}


def fused_steps(name, args):
    """The kernels a one-call backward of backward_small runs (from compiled code, so
    no wrapper sees them), by its route tags."""
    if name.startswith("small.channel_backward"):
        stats, (sums, apply, par) = None, args[10:13]
    else:
        stats, sums, apply, par = args[12:16]
    serial = "_serial" if par.ndim == 1 else ""
    if stats is not None and stats.ndim == 1:  # the statistics recomputed
        reduce, merge = (("plane_moment_sums", "merge_group_sums") if sums.ndim == 1 else
                         ("row_moment_sums", "merge_row_group_sums"))
    else:
        reduce, merge = (("plane_sums", "merge_plane_sums") if sums.ndim == 1 else
                         ("row_sums", "merge_row_sums"))
    dx = "apply_planes" if apply.ndim == 1 else "apply_rows"
    return {f"backward_sums.{reduce}{serial}", f"backward_sums.{merge}",
            f"backward_dx.{dx}{serial}"}


@dataclass(frozen=True)
class Case:
    # bn | onednn | training | instance | moments | normalize | bn-planned, and the row
    # normalizations layer | rms | skip (ncx_shape is then X's shape, normalized from
    # axis -2 for 3-D X, else the last axis)
    op: str
    ncx_shape: tuple
    data_format: str
    routes: frozenset  # routes the case must take
    path: str = None
    forked: bool = False  # run as a child forked after GNU OpenMP ran
    patch: dict = field(default_factory=dict)  # policy thresholds for this case


def case(op, shape, fmt, routes, **kw):
    return Case(op, shape, fmt, frozenset(routes), **kw)


NO_TABLES = {"TABLES_MAX_BYTES": 0}  # short planes take the planes loop
PER_SAMPLE = {"SAMPLE_CALL_MIN_ELEMENTS": 1}

CASES = {
    # the engine's normalize pass alone, on parameters folded by the twin (the operators'
    # serial calls fold and normalize in one compiled call)
    "normalize-planes-serial": case("normalize", (2, 3, 9, 11), "NCX",
                                    ["scale_shift/planes/serial"], path="serial"),
    # a planned call (the second with its key): the plan's bounds guard runs
    "bn-planned-parallel": case("bn-planned", (2, 3, 9, 11), "NCX",
                                ["scale_shift/planes/parallel"],
                                patch={"NORMALIZE_SERIAL_MAX_ELEMENTS": 0}),
    # BatchNormalization inference: the normalize loops
    **{f"bn-planes-{p}": case("bn", (2, 3, 9, 11), "NCX", [f"scale_shift/planes/{p}"], path=p)
       for p in PATHS},
    **{f"bn-periodic-{p}": case("bn", (2, 3, 9, 11), "NXC", [f"scale_shift/periodic/{p}"],
                                path=p) for p in PATHS},
    "bn-periodic-short-ncx-planes": case("bn", (3, 5, 3, 3), "NCX",
                                         ["scale_shift/periodic/parallel"], path="parallel"),
    "bn-short-planes-serial": case("bn", (3, 5, 3, 3), "NCX",
                                   ["scale_shift/short-planes/serial"], path="serial",
                                   patch=NO_TABLES),
    "bn-short-planes-parallel": case("bn", (3, 5, 3, 3), "NCX",
                                     ["scale_shift/short-planes/parallel"], path="streaming",
                                     patch=NO_TABLES),
    "bn-1d": case("bn", (1001,), "NCX", ["scale_shift/periodic/parallel"], path="parallel"),
    "bn-planes-forked": case("bn", (2, 3, 9, 11), "NCX",
                             ["one-thread", "scale_shift/planes/serial"], path="streaming",
                             forked=True),
    "bn-periodic-forked": case("bn", (2, 3, 9, 11), "NXC",
                               ["one-thread", "scale_shift/periodic/serial"], forked=True),
    "onednn-periodic-streaming": case("onednn", (2, 3, 9, 11), "NXC",
                                      ["scale_shift/periodic/streaming"], path="streaming"),
    "onednn-planes-parallel": case("onednn", (2, 3, 9, 11), "NCX",
                                   ["scale_shift/planes/parallel"], path="parallel"),
    # training: batch statistics by planes (long planes) or rows (NXC, short planes)
    "training-planes": case("training", (2, 3, 24, 24), "NCX",
                            ["moments/planes/parallel", "scale_shift/planes/parallel"],
                            path="parallel"),
    "training-planes-chunks": case("training", (1, 2, 300, 300), "NCX",  # 2 chunks a plane
                                   ["moments/planes/parallel", "scale_shift/planes/streaming"],
                                   path="streaming"),
    "training-rows-short-planes": case("training", (40, 3, 7, 7), "NCX",
                                       ["moments/rows/serial", "scale_shift/planes/serial"],
                                       path="serial"),
    "training-rows-nxc": case("training", (5, 3, 9, 11), "NXC",
                              ["moments/rows/parallel", "scale_shift/periodic/streaming"],
                              path="streaming"),
    "training-rows-wide": case("training", (33, 7, 5, 3), "NXC",  # rows widened to 63 + rest
                               ["moments/rows/parallel", "scale_shift/periodic/parallel"],
                               path="parallel"),
    "training-1d": case("training", (70001,), "NCX", ["moments/planes/parallel"]),
    "training-planes-forked": case("training", (2, 3, 24, 24), "NCX",
                                   ["one-thread", "moments/planes/serial",
                                    "scale_shift/planes/serial"], forked=True),
    "training-rows-forked": case("training", (5, 3, 9, 11), "NXC",
                                 ["one-thread", "moments/rows/serial",
                                  "scale_shift/periodic/serial"],
                                 forked=True),
    # moments alone
    "moments-planes-serial": case("moments", (3, 4, 24, 24), "NCX", ["moments/planes/serial"]),
    "moments-planes-parallel": case("moments", (3, 4, 24, 24), "NCX",
                                    ["moments/planes/parallel"], path="streaming"),
    "moments-rows-serial": case("moments", (3, 24, 24, 4), "NXC", ["moments/rows/serial"]),
    "moments-rows-parallel": case("moments", (3, 24, 24, 4), "NXC", ["moments/rows/parallel"],
                                  path="parallel"),
    "moments-rows-forked": case("moments", (40, 3, 7, 7), "NCX",
                                ["one-thread", "moments/rows/serial"], path="parallel",
                                forked=True),
    # instance normalization, NCX: fused per plane, or split (planes too small, too
    # large or too few), and NXC: one launch or a call per sample
    **{f"instance-fused-{p}": case("instance", (4, 3, 24, 24), "NCX",
                                   [f"instance_planes/fused/{p}"], path=p)
       for p in PATHS},
    "instance-fused-short-serial": case("instance", (2, 3, 5, 5), "NCX",
                                        ["instance_planes/fused-short/serial"], path="serial"),
    "instance-fused-short-parallel": case("instance", (2, 3, 5, 5), "NCX",
                                          ["instance_planes/fused-short/parallel"],
                                          path="streaming"),
    "instance-split-parallel": case("instance", (2, 3, 10, 10), "NCX",
                                    ["instance_planes/split", "scale_shift/planes/parallel"],
                                    path="parallel"),
    "instance-split-chunks": case("instance", (1, 2, 300, 300), "NCX",
                                  ["instance_planes/split", "scale_shift/planes/streaming"],
                                  path="streaming"),
    "instance-rows-one-launch-serial": case("instance", (3, 4, 9, 11), "NXC",
                                            ["instance_rows/one-launch/serial"]),
    "instance-rows-one-launch-parallel": case("instance", (3, 4, 9, 11), "NXC",
                                              ["instance_rows/one-launch/parallel"],
                                              path="streaming"),
    "instance-rows-per-sample": case("instance", (3, 4, 9, 11), "NXC",
                                     ["instance_rows/per-sample",
                                      "scale_shift/periodic/streaming"],
                                     path="streaming", patch=PER_SAMPLE),
    "instance-fused-forked": case("instance", (4, 3, 24, 24), "NCX",
                                  ["one-thread", "instance_planes/fused/serial"],
                                  path="parallel", forked=True),
    "instance-rows-forked": case("instance", (3, 4, 9, 11), "NXC",
                                 ["one-thread", "instance_rows/one-launch/serial"],
                                 forked=True),
    "instance-rows-per-sample-forked": case("instance", (3, 4, 9, 11), "NXC",
                                            ["one-thread", "instance_rows/per-sample",
                                             "scale_shift/periodic/serial"],
                                            forked=True, patch=PER_SAMPLE),
}

# row normalizations: rows of 100 (statistics in chunks of the blocked reductions), of
# 7 (the short-row statistics), one row (the split path, 2 chunks), a strided view
ROWS = (6, 5, 100)
MANY_ROWS = (20, 5, 100)  # more rows than the serial table-free kernel takes
SPLIT = {"SPLIT_ROWS_PER_THREAD": 1 << 20}  # every row count splits
CASES.update({
    **{f"layer-fused-{p}": case("layer", MANY_ROWS if p == "serial" else ROWS, "NCX",
                                [f"rows/fused/{p}"], path=p)
       for p in PATHS},
    # a few rows on one thread: no column tables (kernels/fused_add.py), the same bits
    "layer-table-free-serial": case("layer", ROWS, "NCX", ["rows/table-free/serial"],
                                    path="serial"),
    "rms-table-free-serial": case("rms", ROWS, "NCX", ["rows/table-free/serial"],
                                  path="serial"),
    "rms-table-free-decode": case("rms", (1, 4096), "NCX", ["rows/table-free/serial"],
                                  path="serial"),
    "layer-short-rows": case("layer", (40, 7), "NCX", ["rows/fused/parallel"], path="parallel"),
    "layer-split-parallel": case("layer", (1, 70001), "NCX", ["rows/split/parallel"],
                                 path="parallel"),
    "layer-split-streaming": case("layer", (3, 2, 50), "NCX", ["rows/split/streaming"],
                                  path="streaming", patch=SPLIT),
    "layer-forked": case("layer", MANY_ROWS, "NCX", ["one-thread", "rows/fused/serial"],
                         path="parallel", forked=True),
    "rms-fused-serial": case("rms", MANY_ROWS, "NCX", ["rows/fused/serial"], path="serial"),
    "rms-short-rows-serial": case("rms", (40, 7), "NCX", ["rows/fused/serial"], path="serial"),
    "rms-fused-streaming": case("rms", ROWS, "NCX", ["rows/fused/streaming"], path="streaming"),
    "rms-split-parallel": case("rms", (1, 70001), "NCX", ["rows/split/parallel"],
                               path="parallel"),
    "skip-fused-parallel": case("skip", ROWS, "NCX", ["rows/fused/parallel"], path="parallel"),
    "skip-fused-serial": case("skip", (40, 7), "NCX", ["rows/fused/serial"], path="serial"),
    "skip-split-parallel": case("skip", (2, 3, 100), "NCX", ["rows/split/parallel"],
                                path="parallel", patch=SPLIT),
    # vLLM's in-place fused add (the residual as skip and sums): its table-free kernels
    "fused-add-serial": case("fused-add", (40, 7), "NCX", ["rows/fused add/serial"],
                             path="serial"),
    **{f"fused-add-{p}": case("fused-add", ROWS, "NCX", [f"rows/fused add/{p}"], path=p)
       for p in ("parallel", "streaming")},
    "fused-add-split-parallel": case("fused-add", (2, 3, 100), "NCX", ["rows/split/parallel"],
                                     path="parallel", patch=SPLIT),
    # the normalize pass alone from given statistics (chunked rows in normkernels.dask)
    **{f"rows-from-statistics-{p}": case("rows-stats", (12, 100), "NCX",
                                         [f"rows/from-statistics/{p}"], path=p)
       for p in PATHS},
})
ROW_OPS = ("layer", "rms", "skip", "fused-add", "rows-stats", "rows-grad")
CASES.update({f"rows-grad-{p}": case("rows-grad", (12, 100), "NCX", [f"rows_backward/{p}"],
                                     path=p) for p in ("serial", "parallel")})

# group normalization (groups of 2 channels: instance normalization's loops), MVN (the
# moments and normalize loops), LpNormalization (rows: the last axis of 2-D X; columns:
# axis 1) and LRN (planes: NCX; rows: NXC)
CASES.update({
    **{f"group-fused-{p}": case("group", (4, 6, 24, 24), "NCX", [f"instance_planes/fused/{p}"],
                                path=p) for p in PATHS},
    "group-fused-short": case("group", (2, 6, 3, 3), "NCX",
                              ["instance_planes/fused-short/parallel"], path="parallel"),
    "group-split": case("group", (1, 4, 300, 300), "NCX",  # 2 groups, 3 chunks each
                        ["instance_planes/split", "scale_shift/planes/streaming"],
                        path="streaming"),
    "group-rows-serial": case("group", (3, 6, 9, 11), "NXC", ["instance_rows/one-launch/serial"],
                              path="serial"),
    "group-rows-parallel": case("group", (3, 6, 9, 11), "NXC",
                                ["instance_rows/one-launch/parallel"], path="parallel"),
    "group-rows-per-sample": case("group", (3, 6, 9, 11), "NXC",
                                  ["instance_rows/per-sample", "scale_shift/periodic/parallel"],
                                  path="parallel", patch=PER_SAMPLE),
    "mvn-planes": case("mvn", (3, 4, 24, 24), "NCX",
                       ["moments/planes/parallel", "scale_shift/planes/parallel"],
                       path="parallel"),
    "mvn-rows": case("mvn", (40, 3, 7, 7), "NCX",
                     ["moments/rows/serial", "scale_shift/planes/serial"], path="serial"),
    **{f"lp-rows-{p}": case("lp", (6, 70), "NCX", [f"lp/rows/{p}"], path=p)
       for p in ("serial", "parallel")},
    **{f"lp-columns-{p}": case("lp", (3, 5, 40), "NCX", [f"lp/columns/{p}"], path=p)
       for p in ("serial", "parallel")},
    **{f"lrn-planes-{p}": case("lrn", (3, 6, 70), "NCX", [f"lrn/planes/{p}"], path=p)
       for p in ("serial", "parallel")},
    **{f"lrn-rows-{p}": case("lrn", (3, 6, 70), "NXC", [f"lrn/rows/{p}"], path=p)
       for p in ("serial", "parallel")},
})
GROUP_OPS = ("group", "mvn", "lp", "lrn")

# backward passes: the reduction over (X, dY) and the dX pass, by planes (NCX) and rows
CASES.update({
    **{f"grad-planes-{p}": case("grad", (3, 4, 17, 19), "NCX",
                                [f"grad_sums/planes/{'parallel' if p == 'streaming' else p}",
                                 f"grad_apply/planes/{p}"], path=p)
       for p in ("serial", "parallel", "streaming")},
    **{f"group-grad-planes-{p}": case("group-grad", (3, 4, 17, 19), "NCX",
                                      [f"grad_sums/fused-planes/{p}", f"grad_apply/planes/{p}"],
                                      path=p)
       for p in ("serial", "parallel")},
    **{f"group-grad-rows-{p}": case("group-grad", (3, 4, 9, 11), "NXC",
                                    [f"grad_sums/fused-rows/{p}", f"grad_apply/rows/{p}"],
                                    path=p)
       for p in ("serial", "parallel")},
    **{f"grad-rows-{p}": case("grad", (3, 4, 9, 11), "NXC",
                              [f"grad_sums/rows/{'parallel' if p == 'streaming' else p}",
                               f"grad_apply/rows/{p}"], path=p)
       for p in ("serial", "parallel", "streaming")},
})

# issue 32's kernels: the gated RMSNorm (groups of 32, a row-strided view; its backward
# on rows of 1024 in two work items), QK-norm (in place on a row-strided qkv) and the
# quantized rows (int8 RMS with a scale per row, float8 LayerNorm with a scale per 64
# columns). Each has a serial and a parallel loop; streaming runs the parallel one. 19
# rows: the last work item is short (policy.rows_per_item: 2 rows an item on 2 threads).
LLM_SHAPES = {"gated": (19, 96), "gated-grad": (40, 1024), "qk": (19, 3, 1, 24),
              "quant-int8": (19, 256), "quant-fp8": (19, 256)}
LLM_ROUTES = {"gated": "gated_rms", "gated-grad": "gated_rms_backward", "qk": "qk_norm",
              "quant-int8": "quantized_rows", "quant-fp8": "quantized_rows"}
LLM_OPS = tuple(LLM_SHAPES)
LLM_EPS = 1e-6  # the epsilon of test_gated's backward oracle
CASES.update({
    **{f"{op}-{p}": case(op, LLM_SHAPES[op], "NCX",
                         [f"{LLM_ROUTES[op]}/{'serial' if p == 'serial' else 'parallel'}"],
                         path=p)
       for op in LLM_OPS for p in PATHS},
    **{f"{op}-forked": case(op, LLM_SHAPES[op], "NCX", ["one-thread",
                                                       f"{LLM_ROUTES[op]}/serial"],
                            path="parallel", forked=True)
       for op in ("gated", "gated-grad", "qk", "quant-fp8")},
    # up to numba_launch.TABLE_FREE_ROWS rows on the serial path (a decode step): the
    # quantized rows without column tables, the bits of the table kernels
    **{f"{op}-table-free": case(op, (5, 256), "NCX", ["quantized_rows/table-free/serial"],
                                path="serial")
       for op in ("quant-int8", "quant-fp8")},
    "quant-int8-table-free-forked": case("quant-int8", (5, 256), "NCX",
                                         ["one-thread", "quantized_rows/table-free/serial"],
                                         path="parallel", forked=True),
})

# the epilogues' elementwise gradients: BatchNormalization's backward through SiLU and
# through ReLU (its mask from Z, recomputed from B), and AdaLN's backward with the gated
# residual (the gradient dS of S given): test_epilogue_backward's oracle for the first
# two, a float64 one here for AdaLN (its test there needs torch). None has a streaming
# loop. 3 samples: AdaLN's work items are samples, the last one alone on 2 threads.
# the epilogues' backward: the fused passes (training: dZ made inside the reduction and
# dX pass; the smooth activation's dZ kept in dX by the reduction, on 32 and 64 bits, so
# only its reduction is named), the elementwise gradients (eval: dZ made, then scaled)
# (act-grad, relu-grad: short planes in many rows, the rows loops)
EPILOGUE_SHAPES = {"act-grad": (13, 4, 3, 3), "relu-grad": (13, 4, 3, 3),
                   "relu-planes-grad": (2, 3, 17, 19), "act-eval": (3, 4, 9, 11),
                   "relu-eval": (3, 4, 9, 11), "ada-grad": (3, 7, 40), "ada": (3, 7, 40)}


def epilogue_routes(op, path):
    one = "serial" if path == "serial" else "parallel"
    return {"act-grad": [f"epilogue_sums/rows/{one}"],
            "relu-grad": [f"epilogue_sums/rows/{one}", f"epilogue_apply/rows/{one}"],
            "relu-planes-grad": [f"epilogue_sums/planes/{one}",
                                 f"epilogue_apply/planes/{path}"],
            "act-eval": [f"activation_grad/{one}"], "relu-eval": [f"relu_mask/{one}"],
            "ada-grad": [f"gated_backward/{one}", f"rows_backward/modulated/{one}"],
            "ada": [f"rows/modulated/{path}"]}[op]


EPILOGUE_OPS = tuple(EPILOGUE_SHAPES)
EPILOGUE_EPS = epilogue_tests.EPS  # the epsilon of its oracle's bound of Z
CASES.update({
    **{f"{op}-{p}": case(op, EPILOGUE_SHAPES[op], "NCX", epilogue_routes(op, p), path=p)
       for op in EPILOGUE_OPS for p in PATHS},
    **{f"{op}-forked": case(op, EPILOGUE_SHAPES[op], "NCX",
                            ["one-thread", *epilogue_routes(op, "serial")], path="parallel",
                            forked=True)
       for op in EPILOGUE_OPS},
})

DTYPES = {"layer": FLOATS, "rms": FLOATS, "skip": FLOATS, "fused-add": FLOATS,
          "rows-stats": FLOATS,
          "rows-grad": FLOATS,
          "bn": FLOATS, "training": FLOATS,
          "moments": FLOATS, "instance": FLOATS,
          "onednn": [F16, BF16, F32], "normalize": FLOATS, "bn-planned": FLOATS,
          "group": FLOATS, "mvn": FLOATS, "lp": FLOATS, "lrn": FLOATS, "grad": FLOATS,
          "group-grad": FLOATS, **{op: FLOATS for op in LLM_OPS + EPILOGUE_OPS}}
CASES_BY_DTYPE = [pytest.param(name, dtype, id=f"{name}-{FLOAT_IDS[FLOATS.index(dtype)]}")
                  for name, c in CASES.items() for dtype in DTYPES[c.op]]


def row_axis(shape):
    return len(shape) - 2 if len(shape) == 3 else len(shape) - 1


def row_data(rng, case, dtype):
    """X whose every row has its own mean and spread (a strided view for 3-D shapes),
    and per-column parameters (scale of both signs, B; for skip: skip and bias)."""
    shape = case.ncx_shape
    a = row_axis(shape)
    lead = shape[:a] + (1,) * (len(shape) - a)
    X = rng.standard_normal(shape) * rng.uniform(0.5, 2, lead) + rng.uniform(-3, 3, lead)
    if len(shape) == 3:  # every other row of a larger array
        big = np.empty((shape[0], 2 * shape[1], shape[2]), dtype)
        big[:, ::2] = X
        X = big[:, ::2]
    else:
        X = X.astype(dtype)
    cols = shape[a:]
    params = [rng.uniform(0.5, 2, cols) * rng.choice([-1, 1], cols), rng.standard_normal(cols)]
    if case.op in ("skip", "fused-add"):  # the fused add has no bias: 0
        params = [rng.standard_normal(shape[-1:]) * 0.5 * (case.op == "skip"),
                  rng.standard_normal(shape) * 0.5, rng.uniform(0.5, 2, shape[-1:]),
                  rng.standard_normal(shape[-1:])]
    return X, params


def data(rng, case, dtype):
    """X whose every (n, c) has its own mean and spread, and per-channel parameters
    (scale of both signs, B, mean, var) all different."""
    if case.op in ROW_OPS:
        return row_data(rng, case, dtype)
    if case.op in LLM_OPS:
        return llm_data(rng, case, dtype)
    if case.op in ("ada", "ada-grad"):
        return ada_data(rng, case, dtype)
    shape = to_layout(case.ncx_shape, case.data_format)
    N = shape[0]
    C = 1 if len(shape) == 1 else case.ncx_shape[1]
    offsets = rng.uniform(-3, 3, (N, C))
    spreads = rng.uniform(0.5, 2, (N, C))
    if len(shape) == 1:
        X = rng.standard_normal(shape) * spreads[0, 0] + offsets[0, 0]
    else:
        axis = 1 if case.data_format == "NCX" else len(shape) - 1
        bshape = [1] * len(shape)
        bshape[0], bshape[axis] = N, C
        X = (rng.standard_normal(shape) * spreads.reshape(bshape) + offsets.reshape(bshape))
    scale = rng.uniform(0.5, 2, C) * rng.choice([-1, 1], C)
    params = [scale, rng.standard_normal(C), rng.uniform(-2, 2, C), rng.uniform(0.25, 4, C)]
    return X.astype(dtype), params


def llm_data(rng, case, dtype):
    """M x W rows (W: the qkv width for QK-norm), each with its own mean and spread, as
    every other row of a larger array for the gated forward and QK-norm; parameters:
    the gate, weight and bias (gated), the q and k weights (QK-norm), weight and bias
    (quantized)."""
    if case.op == "qk":
        M, nq, nkv, D = case.ncx_shape
        shape = (M, (nq + 2 * nkv) * D)
    else:
        shape = case.ncx_shape
    M, K = shape
    X = rng.standard_normal(shape) * rng.uniform(0.5, 2, (M, 1)) + rng.uniform(-1, 1, (M, 1))
    if case.op in ("gated", "qk"):
        big = np.zeros((2 * M, K), dtype)
        big[::2] = X
        X = big[::2]
    else:
        X = X.astype(dtype)
    if case.op == "qk":
        D = case.ncx_shape[3]
        return X, [rng.uniform(0.5, 2, D), rng.uniform(0.5, 2, D) * rng.choice([-1, 1], D)]
    weight = rng.uniform(0.5, 2, K) * rng.choice([-1, 1], K)
    if case.op.startswith("quant"):
        return X, [1 + 0.3 * rng.standard_normal(K), 0.2 * rng.standard_normal(K)]
    return X, [rng.standard_normal(shape) * 3, weight, rng.standard_normal(K)]


def ada_data(rng, case, dtype):
    """AdaLN's X (``N x T x C``, each row with its own mean and spread) and parameters:
    shift, scale and gate per sample and column, the residual and dS of X's shape."""
    N, T, C = case.ncx_shape
    X = (rng.standard_normal((N, T, C)) * rng.uniform(0.5, 2, (N, T, 1))
         + rng.uniform(-1, 1, (N, T, 1)))
    return X.astype(dtype), [rng.standard_normal((N, C)), 0.5 * rng.standard_normal((N, C)),
                             rng.standard_normal((N, T, C)), rng.standard_normal((N, C)),
                             rng.standard_normal((N, T, C))]


def run_epilogue(case, X, params, dtype, engine):
    """An epilogue gradient's operator (dY: X's reversal along the samples)."""
    kw = dict(engine=engine, path=case.path)
    if case.op == "ada":  # the forward with the gated residual: (Y, S)
        shift, scale, R, gate, _ = p = [v.astype(dtype) for v in params]
        return ada_spec.ada_layer_norm(X, shift, scale, epsilon=EPILOGUE_EPS, residual=R,
                                       gate=gate, **kw), p
    if case.op == "ada-grad":  # shift, scale, residual, gate, dS
        p = [v.astype(dtype) for v in params]
        shift, scale, R, gate, dS = p
        return ada_spec.ada_layer_norm_backward(X[::-1].copy(), X, shift, scale,
                                                epsilon=EPILOGUE_EPS, residual=R, gate=gate,
                                                dS=dS, **kw), p
    # scale, B, and the batch statistics of X
    p = [params[0].astype(dtype), params[1].astype(dtype), *grad_statistics(X, case.data_format)]
    return backward_spec.batch_normalization_backward(
        X[::-1].copy(), X, p[0], p[2], p[3], epsilon=EPILOGUE_EPS, data_format=case.data_format,
        activation="silu" if case.op.startswith("act") else "relu", B=p[1],
        training=not case.op.endswith("eval"), **kw), p


def check_epilogue_with_oracle(case, X, params, result):
    """BatchNormalization's: test_epilogue_backward's float64 oracle and bounds.
    AdaLN's: from S as the forward rounds it (``dR = dLN + dS``, ``dX = gate dR``, ``dgate``
    the sum of ``dR X`` over a sample's rows), dLN the row backward of S with ``1 +
    scale``; dLN within :func:`backward_tolerance` in the compute dtype, one rounding
    for the add in it, one to each output's dtype."""
    if case.op == "ada":  # Y: the row normalization of S as returned, per-sample tables
        shift, scale, R, gate, _ = params
        Y, S = result
        N, T, C = X.shape
        exact_s = R.astype(F64) + gate.astype(F64)[:, None, :] * X.astype(F64)
        assert_close(S, exact_s, 0.5 * ulp(exact_s, X.dtype) + 2.0**-24 * np.abs(exact_s), "S")
        s = 1 + scale.astype(F64)[:, None, :]
        exact, mean, var = row_norm(S, s, shift.astype(F64)[:, None, :], EPILOGUE_EPS)
        assert_close(Y, exact, row_tolerance(S, s, shift.astype(F64)[:, None, :], mean, var,
                                             EPILOGUE_EPS, X.dtype), "Y")
        return
    if case.op != "ada-grad":
        scale, B, mean, var = params
        fmt = case.data_format
        want = epilogue_tests.expected(
            "silu" if case.op.startswith("act") else "relu", X[::-1], X, scale, B, None, mean,
            1 / np.sqrt(var + EPILOGUE_EPS),
            epilogue_tests.z_bound(X, scale, B, None, mean, var, fmt), fmt, None,
            training=not case.op.endswith("eval"))
        epilogue_tests.check(result, want, case.op, X.dtype)
        return
    shift, scale, R, gate, dS = params
    dX, dR, dgate, dshift, dscale = result
    N, T, C = X.shape
    S = ada_spec.ada_layer_norm(X, shift, scale, epsilon=EPILOGUE_EPS, residual=R, gate=gate,
                                engine=ENGINE)[1]
    s, dy = S.astype(F64).reshape(N * T, C), X[::-1].astype(F64).reshape(N * T, C)
    cd = compute_dtype(X.dtype)
    with np.errstate(all="ignore"):
        mean = s.mean(axis=1, keepdims=True)
        r = 1 / np.sqrt(s.var(axis=1, keepdims=True) + EPILOGUE_EPS)
        gam = np.repeat(1 + scale.astype(F64), T, axis=0)
        dln, dyx = normalization_backward(dy, s, gam, mean, r, 1)
        total = dln + dS.astype(F64).reshape(N * T, C)
        # the bound of g = dY (1 + scale) with scale 1: 1 + scale varies along a row
        t_tol = (backward_tolerance(dy * gam, s, 1.0, mean, r, 1, dln, cd)
                 + gamma(1, cd) * np.abs(total))
        g = np.repeat(gate.astype(F64), T, axis=0)
        x = X.astype(F64).reshape(N * T, C)
        exact_dgate = (total * x).reshape(N, T, C).sum(axis=1)
        dgate_tol = (np.abs(t_tol * x).reshape(N, T, C).sum(axis=1)
                     + 0.5 * ulp(np.abs(exact_dgate), gate.dtype))
    assert_close(dR.reshape(N * T, C), total, t_tol + 0.5 * ulp(np.abs(total) + t_tol, X.dtype),
                 "dR")
    gt = np.abs(g) * t_tol + gamma(1, cd) * np.abs(g * total)
    assert_close(dX.reshape(N * T, C), g * total, gt + 0.5 * ulp(np.abs(g * total) + gt, X.dtype),
                 "dX")
    assert_close(dgate, exact_dgate, dgate_tol, "dgate")
    for got, want, what in ((dshift, dy, "dshift"), (dscale, dyx, "dscale")):
        exact = want.reshape(N, T, C).sum(axis=1)
        assert_close(got, exact, 1e-10 * np.abs(want).reshape(N, T, C).sum(axis=1)
                     + 0.5 * ulp(np.abs(exact), got.dtype), what)


def llm_args(case, X):
    """``(group or head size, norm_before_gate or q dtype)`` of an LLM case."""
    if case.op.startswith("quant"):
        return (X.shape[1], quantized_tests.INT8) if case.op == "quant-int8" else (
            64, quantized_tests.FP8)
    if case.op == "qk":
        return case.ncx_shape[3], None
    return (32, True) if case.op == "gated" else (256, False)


def run_llm(case, X, params, dtype, engine):
    p = [None if v is None else v.astype(dtype) for v in params]
    kw = dict(engine=engine, path=case.path)
    size, flag = llm_args(case, X)
    if case.op == "gated":
        return gated_spec.gated_rms_normalization(X, *p, epsilon=LLM_EPS, group_size=size,
                                                  norm_before_gate=flag, **kw), p
    if case.op == "gated-grad":  # dY: X's rows reversed
        return gated_spec.gated_rms_normalization_backward(
            X[::-1].copy(), X, *p, epsilon=LLM_EPS, group_size=size, norm_before_gate=flag,
            **kw), p
    if case.op == "qk":  # in place on a row-strided copy
        _, nq, nkv, D = case.ncx_shape
        qkv = np.zeros((X.shape[0], 2 * X.shape[1]), dtype)[:, :X.shape[1]]
        qkv[...] = X
        return qk_spec.qk_rms_normalization(qkv, *p, num_q_heads=nq, num_kv_heads=nkv,
                                            head_dim=D, epsilon=LLM_EPS, **kw), p
    if case.op == "quant-int8":
        return quantized_spec.quantized_rms_normalization(X, p[0], dtype=flag, epsilon=LLM_EPS,
                                                          **kw), [p[0], None]
    return quantized_spec.quantized_layer_normalization(X, *p, dtype=flag, epsilon=LLM_EPS,
                                                        group_size=size, **kw), p


def check_llm_with_oracle(case, X, params, result):
    """test_gated's, test_qk_norm's and test_quantized's float64 oracles and bounds."""
    size, flag = llm_args(case, X)
    if case.op == "gated":
        exact, tol = gated_tests.tolerance(X, *params, size, LLM_EPS, flag, X.dtype)
        assert_close(result, exact, tol)
    elif case.op == "gated-grad":
        gated_tests.check_backward(result, X[::-1], X, *params, size, flag)
    elif case.op == "qk":
        _, nq, nkv, D = case.ncx_shape
        xh, w = qk_tests.oracle(X, *params, nq, nkv, D, LLM_EPS)
        exact = xh * w
        qk, v = qk_tests.qk_parts(result, nq, nkv, D)
        tol = 8 * qk_tests.u_c(X.dtype) * np.abs(exact) + 0.5 * ulp(exact, X.dtype) * (
            X.itemsize < 8)
        assert_close(qk.reshape(exact.shape), exact, tol + 1e-300)
        assert_identical(v, qk_tests.qk_parts(X, nq, nkv, D)[1])  # v heads untouched
    else:
        q, scales = result
        w, b = params
        with np.errstate(all="ignore"):  # NaN and Inf rows (test_route_special_values)
            want, s, v, terms = quantized_tests.oracle(X, w, b, b is not None, LLM_EPS, 0.0,
                                                       flag, None, size, None)
        finite = np.isfinite(X.astype(F64)).all(axis=1)  # rows of NaN or Inf: not compared
        quantized_tests.assert_scales(scales[finite], s[finite], X.dtype)
        quantized_tests.assert_quantized(q[finite], want[finite], v[finite], terms[finite],
                                         flag, X.dtype)


def run(case, X, params, dtype, engine=ENGINE):
    """The case's operator through its spec layer with ``engine`` (the Numba kernels
    by default)."""
    if case.op in LLM_OPS:
        return run_llm(case, X, params, dtype, engine)
    if case.op in EPILOGUE_OPS:
        return run_epilogue(case, X, params, dtype, engine)
    kw = dict(data_format=case.data_format, engine=engine, path=case.path)
    if case.op in ROW_OPS:
        p = [v.astype(dtype) for v in params]
        kw = dict(engine=engine, path=case.path)
        if case.op == "layer":
            return ln_spec.layer_normalization(X, *p, axis=row_axis(X.shape), epsilon=EPS,
                                               num_outputs=3, **kw), p
        if case.op == "rms":
            return rms_spec.rms_normalization(X, p[0], axis=row_axis(X.shape), epsilon=EPS,
                                              **kw), p[:1]
        if case.op == "rows-grad":  # dY: X's rows reversed
            return backward_spec.layer_normalization_backward(X[::-1].copy(), X, p[0],
                                                              epsilon=EPS, **kw), p[:1]
        if case.op == "rows-stats":  # the float64 statistics of the oracle
            _, mean, var = row_norm(X, 1.0, None, EPS)
            Y = np.empty_like(X)
            engine.rows_from_statistics(X, Y, p[0], p[1], EPS, True, mean.ravel(), var.ravel(),
                                        case.path)
            return Y, p
        bias, skip, gamma, beta = p
        if case.op == "fused-add":  # in place on copies: (Y, the sums)
            Y, sums = X.copy(), skip.copy()
            fused_add_spec.fused_add_layer_norm(Y, sums, gamma, beta, epsilon=EPS, **kw)
            return (Y, sums), p
        return skip_spec.skip_layer_normalization(X, skip, gamma, beta, bias, epsilon=EPS,
                                                  num_outputs=4, **kw), p
    if case.op == "bn":
        p = [v.astype(dtype) for v in params]
        return bn_spec.batch_normalization(X, *p, epsilon=EPS, **kw), p
    if case.op == "bn-planned":
        p = [v.astype(dtype) for v in params]
        plans.clear()
        kw.update(path=None, out=np.empty_like(X))
        bn_spec.batch_normalization(X, *p, epsilon=EPS, **kw)  # leaves the plan
        return bn_spec.batch_normalization(X, *p, epsilon=EPS, **kw), p
    if case.op == "normalize":
        p = [v.astype(dtype) for v in params]
        m, a, b = reference.fold_parameters(*p, EPS, X.dtype)
        return common.map_layout(X, case.data_format, None, lambda x, y, C, S: engine.scale_shift(
            x, y, C, S, m, a, b, case.path)), p
    if case.op == "onednn":
        p = [v.astype(BF16 if dtype == BF16 else F32) for v in params]
        return bni_spec.batch_norm_inference(X, *p, epsilon=EPS, **kw), p
    if case.op == "training":
        p = [v.astype(dtype) for v in params]
        return bn_spec.batch_normalization(X, *p, epsilon=EPS, momentum=0.75, training_mode=1,
                                           **kw), p
    if case.op == "instance":
        p = [v.astype(dtype) for v in params[:2]]
        return in_spec.instance_normalization(X, *p, epsilon=EPS, **kw), p
    if case.op == "grad":  # dY: X's reversal; the batch statistics of X
        p = [params[0].astype(F32), *grad_statistics(X, case.data_format)]
        return backward_spec.batch_normalization_backward(X[::-1].copy(), X, *p, epsilon=EPS,
                                                          **kw), p
    if case.op == "group-grad":  # dY: X's reversal; groups of two channels
        p = [params[0].astype(dtype)]
        return backward_spec.group_normalization_backward(
            X[::-1].copy(), X, p[0], num_groups=case.ncx_shape[1] // 2, epsilon=EPS, **kw), p
    if case.op == "group":
        p = [v.astype(dtype) for v in params[:2]]
        groups = case.ncx_shape[1] // 2
        return gn_spec.group_normalization(X, *p, num_groups=groups, epsilon=EPS, **kw), p
    if case.op == "mvn":
        del kw["data_format"]
        return mvn_spec.mean_variance_normalization(X, **kw), []
    if case.op == "lp":
        del kw["data_format"]
        return lp_spec.lp_normalization(X, axis=lp_axis(X), p=2, **kw), []
    if case.op == "lrn":
        return lrn_spec.lrn(X, size=4, alpha=0.9, **kw), []
    return moments_spec.partial_statistics(X, case.data_format, engine, path=case.path), []


def _group_view(A, fmt):
    """``A`` (N x C x ... or N x ... x C) as float64 (N, C // 2, 2 * spatial) in channel
    order: the statistic groups of two channels of the group-grad cases."""
    a = np.moveaxis(A, -1, 1) if fmt == "NXC" else A
    return a.astype(F64).reshape(a.shape[0], a.shape[1] // 2, -1)


def grad_statistics(X, fmt):
    """The float64 batch mean and population variance of every channel of X."""
    x = np.moveaxis(X.astype(F64), -1, 1) if fmt == "NXC" else X.astype(F64)
    axes = (0, *range(2, x.ndim))
    with np.errstate(all="ignore"):
        return x.mean(axis=axes), x.var(axis=axes)


def lp_axis(X):
    return X.ndim - 1 if X.ndim == 2 else 1


def check_rows_with_oracle(case, X, params, result):
    a = row_axis(X.shape)
    if case.op == "rows-grad":
        x, dy = X.astype(F64), X[::-1].astype(F64)
        with np.errstate(all="ignore"):
            mean = x.mean(axis=1, keepdims=True)
            r = 1 / np.sqrt(x.var(axis=1, keepdims=True) + EPS)
        s = params[0].astype(F64)
        exact, dyx = normalization_backward(dy, x, s, mean, r, 1)
        assert_close(result[0], exact, backward_tolerance(dy, x, s, mean, r, 1, exact, X.dtype))
        dB = dy.sum(axis=0)  # float64, rounded once to scale's dtype (X's here)
        assert_close(result[2], dB, 1e-12 * np.abs(dy).sum(axis=0)
                     + 0.5 * ulp(np.abs(dB), X.dtype), "dB")
        dscale = dyx.sum(axis=0)
        assert_close(result[1], dscale, 1e-10 * np.abs(dyx).sum(axis=0)
                     + 0.5 * ulp(np.abs(dscale), X.dtype), "dscale")
        return
    if case.op == "rows-stats":
        y, mean, var = row_norm(X, params[0], params[1], EPS, a)
        assert_close(result, y, tolerance(X, np.broadcast_to(params[0], X.shape),
                                          np.broadcast_to(params[1], X.shape), mean, var, EPS,
                                          "NCX", X.dtype, mean_rounded=X.dtype != np.float64))
        return
    if case.op == "rms":
        y, mean, var = row_norm(X, params[0], None, EPS, a, centered=False)
        assert_close(result, y, row_tolerance(X, params[0], None, mean, var, EPS, X.dtype,
                                              centered=False))
        return
    if case.op in ("skip", "fused-add"):
        bias, skip, weight, beta = params
        Y, mean_out, inv_out, sums = result if case.op == "skip" else (result[0], None, None,
                                                                       result[1])
        terms = [v.astype(np.float64) for v in (X, skip, bias)]
        exact_sums = (terms[0] + terms[1]) + terms[2]
        # two roundings in the compute dtype (of terms that may cancel), one to X's dtype
        arithmetic = gamma(2, compute_dtype(X.dtype)) * sum(np.abs(t) for t in terms)
        assert_close(sums, exact_sums, rounded_statistic_tolerance(exact_sums, X.dtype,
                                                                   arithmetic),
                     "input_skip_bias_sum")
        X, scale, B = sums, weight, beta  # the normalization is of the rounded sums
        a = X.ndim - 1  # over the last axis
    else:
        Y, mean_out, inv_out = result
        scale, B = params
    y, mean, var = row_norm(X, scale, B, EPS, a)
    assert_close(Y, y, row_tolerance(X, scale, B, mean, var, EPS, X.dtype))
    if mean_out is None:  # the fused add returns no statistics
        return
    d_mean, d_var = statistics_tolerance(mean, var, X.dtype)
    assert_close(mean_out, mean, rounded_statistic_tolerance(mean, mean_out.dtype, d_mean),
                 "Mean")
    inv = 1 / np.sqrt(var + EPS)
    assert_close(inv_out, inv, rounded_statistic_tolerance(inv, inv_out.dtype,
                                                           inv * d_var / (var + EPS)),
                 "InvStdDev")


def check_with_oracle(case, X, params, result):
    fmt = case.data_format
    if case.op in ROW_OPS:
        check_rows_with_oracle(case, X, params, result)
    elif case.op in LLM_OPS:
        check_llm_with_oracle(case, X, params, result)
    elif case.op in EPILOGUE_OPS:
        check_epilogue_with_oracle(case, X, params, result)
    elif case.op in ("bn", "onednn", "normalize", "bn-planned"):
        assert_close(result, batch_norm(X, *params, EPS, fmt),
                     tolerance(X, *params, EPS, fmt, X.dtype))
    elif case.op == "training":
        Y, running_mean, running_var = result
        mean, var = batch_statistics(X, fmt)
        assert_close(Y, batch_norm(X, params[0], params[1], mean, var, EPS, fmt),
                     training_tolerance(X, params[0], params[1], mean, var, EPS, fmt))
        d_mean, d_var = statistics_tolerance(mean, var, X.dtype)
        for got, given, exact, err in [(running_mean, params[2], mean, d_mean),
                                       (running_var, params[3], var, d_var)]:
            blend = given.astype(np.float64) * 0.75 + exact * 0.25
            assert_close(got, blend, rounded_statistic_tolerance(blend, got.dtype, 0.25 * err),
                         "running statistic")
    elif case.op == "instance":
        exact, mean, var = instance_norm(X, *params, EPS, fmt)
        assert_close(result, exact, instance_tolerance(X, *params, mean, var, EPS, fmt, X.dtype))
    elif case.op == "grad":
        dX, dscale, dB = result
        x, dy = X.astype(F64), X[::-1].astype(F64)
        if fmt == "NXC":
            x, dy = np.moveaxis(x, -1, 1), np.moveaxis(dy, -1, 1)
        C = x.shape[1]
        shape, axes = (1, C) + (1,) * (x.ndim - 2), (0, *range(2, x.ndim))
        mean, var = params[1].reshape(shape), params[2].reshape(shape)
        s, r = params[0].astype(F64).reshape(shape), 1 / np.sqrt(var + EPS)
        exact, dyx = normalization_backward(dy, x, s, mean, r, axes)
        tol = backward_tolerance(dy, x, s, mean, r, axes, exact, X.dtype)
        back = (lambda v: np.moveaxis(v, 1, -1)) if fmt == "NXC" else (lambda v: v)
        assert_close(dX, back(exact), back(tol), "dX")
        assert_close(dB, dy.sum(axis=axes), 1e-6 * np.abs(dy).sum(axis=axes), "dB")
        assert_close(dscale, dyx.sum(axis=axes), 1e-6 * np.abs(dyx).sum(axis=axes), "dscale")
    elif case.op == "group-grad":
        dX, dscale, dB = result
        x, dy = _group_view(X, fmt), _group_view(X[::-1], fmt)
        with np.errstate(all="ignore"):
            mean = x.mean(axis=2, keepdims=True)
            r = 1 / np.sqrt(x.var(axis=2, keepdims=True) + EPS)
        C = X.shape[1] if fmt == "NCX" else X.shape[-1]
        s = np.broadcast_to(np.repeat(params[0].astype(F64), x.shape[2] // (C // x.shape[1]))
                            .reshape(x.shape[1], -1), x.shape)
        exact, dyx = normalization_backward(dy, x, s, mean, r, 2)
        # the bound of g = dY * scale with scale 1: the scale varies inside a group,
        # and K = -r <g> carries the group's mean of g, not one channel's scale times <dY>
        tol = backward_tolerance(dy * s, x, 1.0, mean, r, 2, exact, X.dtype)
        assert_close(_group_view(dX, fmt), exact, tol, "dX")
        per_channel = dyx.reshape(x.shape[0], C, -1).sum(axis=(0, 2))
        assert_close(dscale, per_channel, 1e-6 * np.abs(dyx).reshape(x.shape[0], C, -1).sum(
            axis=(0, 2)) + 0.5 * ulp(np.abs(per_channel), X.dtype), "dscale")
        dB_exact = dy.reshape(x.shape[0], C, -1).sum(axis=(0, 2))
        assert_close(dB, dB_exact, 1e-6 * np.abs(dy).reshape(x.shape[0], C, -1).sum(axis=(0, 2))
                     + 0.5 * ulp(np.abs(dB_exact), X.dtype), "dB")
    elif case.op == "group":
        exact, mean, var, s, b = group_norm(X, *params, case.ncx_shape[1] // 2, EPS, fmt)
        assert_close(result, exact, group_tolerance(X, s, b, mean, var, EPS, fmt, X.dtype))
    elif case.op == "mvn":
        exact, mean, var = mean_variance_norm(X, (0, 2, 3))
        assert_close(result, exact, mvn_tolerance(X, mean, var, X.dtype))
    elif case.op == "lp":
        ulp_close(result, lp_oracle(X, lp_axis(X), 2), X.dtype, terms=X.shape[lp_axis(X)])
    elif case.op == "lrn":
        ulp_close(result, lrn_oracle(X, 4, 0.9, 0.75, 1.0, fmt), X.dtype, terms=6)
    else:
        mean, var = batch_statistics(X, fmt)
        d_mean, d_var = statistics_tolerance(mean, var, X.dtype)
        assert_close(result.mean, mean, d_mean, "mean")
        assert_close(result.M2 / result.count, var, d_var, "variance")


def _outputs(result):
    if isinstance(result, tuple):
        return result
    return (result,)


@pytest.fixture
def routes_taken(monkeypatch):
    taken = []
    monkeypatch.setattr(policy, "_trace", taken.append)
    return taken


def arrange(monkeypatch, case):
    # routes by size as the thresholds state them, whether or not the workers sleep
    # (the sleeping-workers rule has its own tests in test_policy.py)
    monkeypatch.setattr(policy, "ASLEEP_SERIAL_FACTOR", 0)
    for name, value in case.patch.items():
        assert hasattr(policy, name), name
        monkeypatch.setattr(policy, name, value)
    monkeypatch.setattr(threads, "_forked_from_openmp", case.forked)
    # the routes the cases name are those of two or more threads: on one core (a CPU
    # affinity of one) Numba starts one thread, and the split paths were never taken
    count = threads.count
    monkeypatch.setattr(threads, "count", lambda: max(2, count()))


@pytest.mark.parametrize("name,dtype", CASES_BY_DTYPE)
def test_route_matches_oracle(rng, monkeypatch, routes_taken, name, dtype):
    case = CASES[name]
    X, params = data(rng, case, dtype)
    before = X.copy()
    arrange(monkeypatch, case)
    result, params = run(case, X, params, dtype)
    assert case.routes <= set(routes_taken), f"took {sorted(set(routes_taken))}"
    assert set(routes_taken) <= set(policy.ROUTES), "a route missing from policy.ROUTES"
    assert_identical(X, before)
    check_with_oracle(case, X, params, result)
    if case.forked:  # one-thread twins give the bits of the parallel kernels
        monkeypatch.setattr(threads, "_forked_from_openmp", False)
        again, _ = run(case, X, params, dtype)
        for got, want in zip(_outputs(result), _outputs(again), strict=True):
            assert_identical(np.asarray(got), np.asarray(want))


def plant_special_values(X, data_format):
    """NaN in one (n, c), +Inf in another and -Inf in a third (NCX terms)."""
    if X.ndim == 1:
        X[[3, 10]] = [np.nan, np.inf]
        return
    ncx = np.moveaxis(X, -1, 1) if data_format == "NXC" else X  # a view
    N, C = ncx.shape[:2]
    ncx.reshape(N, C, -1)[N - 1, 1 % C, 0] = np.nan
    ncx.reshape(N, C, -1)[0, 2 % C, -1] = np.inf
    ncx.reshape(N, C, -1)[N // 2, 0, 1 % ncx[0, 0].size] = -np.inf


@pytest.mark.parametrize("name,dtype", CASES_BY_DTYPE)
def test_route_special_values(rng, monkeypatch, routes_taken, name, dtype):
    """NaN and Inf in X give what the float64 formula gives on every route: element by
    element for inference, the channel's (or plane's) statistics NaN or infinite
    otherwise, and nothing leaks into other channels."""
    case = CASES[name]
    X, params = data(rng, case, dtype)
    plant_special_values(X, case.data_format)
    arrange(monkeypatch, case)
    if case.op == "quant-int8":  # int8 has no NaN: the call raises
        with pytest.raises(ValueError, match="NaN quotients"):
            run(case, X, params, dtype)
        assert case.routes <= set(routes_taken)
        return
    result, params = run(case, X, params, dtype)
    assert case.routes <= set(routes_taken)
    if case.op == "gated-grad":  # a non-finite x or dY spoils its (row, group) only
        check_gated_grad_confinement(X, llm_args(case, X)[0], result)
        return
    if case.op in ("grad", "act-grad", "relu-grad", "relu-planes-grad", "act-eval", "relu-eval"):
        # a non-finite X or dY makes its channel's dX all NaN or inf
        check_grad_confinement(X, case.data_format, result[0])
        return
    if case.op == "group-grad":  # ... and its (n, group)'s
        x, d = _group_view(X, case.data_format), _group_view(result[0], case.data_format)
        bad = ~np.isfinite(x).all(axis=2) | ~np.isfinite(x[::-1]).all(axis=2)
        assert bad.any() and np.array_equal(np.isfinite(d).all(axis=2), ~bad)
        return
    check_with_oracle(case, X, params, result)


def check_gated_grad_confinement(X, G, grads):
    """The (row, group)s where x or dY (x's rows reversed) hold NaN or Inf have a
    non-finite dx; the others are finite, and so are dweight and dbias outside the
    columns of the spoiled groups."""
    def by_group(a):
        return a.astype(F64).reshape(a.shape[0], -1, G)

    bad = ~np.isfinite(by_group(X)).all(axis=2) | ~np.isfinite(by_group(X[::-1])).all(axis=2)
    assert bad.any()
    for d in grads[:2]:
        assert np.isfinite(by_group(d)).all(axis=2)[~bad].all()
    assert not np.isfinite(by_group(grads[0])).all(axis=2)[bad].any()
    clean = np.repeat(~bad.any(axis=0), G)
    for d in grads[2:]:
        assert np.isfinite(d.astype(F64))[clean].all()


def check_grad_confinement(X, fmt, dX):
    """The channels where X or dY (X reversed) holds NaN or Inf are not finite; the
    others are finite."""
    x = np.moveaxis(X, -1, 1) if fmt == "NXC" else X
    d = np.moveaxis(dX, -1, 1) if fmt == "NXC" else dX
    axes = (0, *range(2, x.ndim))
    bad = ~np.isfinite(x.astype(F64)).all(axis=axes) | ~np.isfinite(x[::-1].astype(F64)).all(
        axis=axes)
    finite = np.isfinite(d.astype(F64)).all(axis=axes)
    assert bad.any() and np.array_equal(finite, ~bad)


def test_every_route_has_a_case():
    covered = set().union(*(c.routes for c in CASES.values()))
    assert covered == set(policy.ROUTES), sorted(set(policy.ROUTES) ^ covered)


# launched by the engine, reporting no route and run by no case here yet: the sums of
# ORT's SkipGroupNorm (skip_kernels, the module of AdaLN's gated residual)
NO_CASE_YET = {"skip_kernels.skip_sums", "skip_kernels.skip_sums_serial"}


def launched_kernels():
    """Names of the kernels the Numba engine launches: ``loops.X``, ``reductions.X``,
    ``instance.X`` that are Numba dispatchers (in the engine's module and in the launch
    sequences its methods share)."""
    names = set()
    for node in (n for module in (engine_module, numba_launch, numba_gated, numba_quantized,
                                  numba_gradients)
                 for n in ast.walk(ast.parse(inspect.getsource(module)))):
        if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
                and node.value.id in KERNEL_MODULES):
            if isinstance(getattr(KERNEL_MODULES[node.value.id], node.attr, None), Dispatcher):
                names.add(f"{node.value.id}.{node.attr}")
    return names


def test_every_kernel_has_a_case(monkeypatch):
    """Each kernel the engine can launch is launched by some case."""
    expected = launched_kernels() - NO_CASE_YET
    assert len(expected) > 15
    rng = np.random.default_rng(0)
    for case in CASES.values():  # compile first: a kernel compiled while another one is
        with monkeypatch.context() as m:  # replaced below would not find it (shares_input)
            arrange(m, case)
            run(case, *data(rng, case, F32), F32)
    launched = set()
    for name in expected:  # called from Python (backward_small's steps: fused_steps)
        alias, attr = name.split(".")
        kernel = getattr(KERNEL_MODULES[alias], attr)

        def recording(*args, _kernel=kernel, _name=name):
            launched.add(_name)
            if _name.startswith("small."):
                launched.update(fused_steps(_name, args))
            return _kernel(*args)

        monkeypatch.setattr(KERNEL_MODULES[alias], attr, recording)
    rng = np.random.default_rng(0)
    for case in CASES.values():
        with monkeypatch.context() as m:
            arrange(m, case)
            X, params = data(rng, case, F32)
            run(case, X, params, F32)
    assert expected <= launched, sorted(expected - launched)


class KernelStatisticsTwin:
    """The NumPy twin given the kernels' statistics: everything after them (folding,
    the normalize pass, the rounding of 16-bit outputs) must be bit-identical to the
    kernels on every route (see ``normkernels/reference.py``)."""

    def __getattr__(self, name):  # folding and the normalize pass: the twin's
        return getattr(reference.ENGINE, name)

    def channel_moments(self, x, C, S, path=None):
        return ENGINE.channel_moments(x, C, S, path)

    def instance_planes(self, x, y, C, S, scale, B, epsilon, path=None, group=1):
        mean, m2 = ENGINE.instance_planes(x, np.empty_like(y), C, S, scale, B, epsilon, path,
                                          group)
        reference.normalize_planes(x, y, C, S, scale, B, epsilon, mean, m2, group=group)
        return mean, m2

    def instance_rows(self, x, y, N, C, scale, B, epsilon, path=None, group=1):
        mean, m2 = ENGINE.instance_rows(x, np.empty_like(y), N, C, scale, B, epsilon, path,
                                        group)
        reference.normalize_rows(x, y, N, C, scale, B, epsilon, mean, m2, group=group)
        return mean, m2

    def channel_grad_sums(self, x, dy, C, S, mean, path=None):
        return ENGINE.channel_grad_sums(x, dy, C, S, mean, path)

    # the epilogues' backward: the composition (dZ made, then the twin's passes on it)
    epilogue_dz = Engine.epilogue_dz
    epilogue_grad_sums = Engine.epilogue_grad_sums
    epilogue_grad_apply = Engine.epilogue_grad_apply

    def group_grad_sums(self, x, dy, planes, S, group, path=None):
        return ENGINE.group_grad_sums(x, dy, planes, S, group, path)

    def normalize_rows(self, x, y, scale, B, epsilon, centered, skip=None, bias=None,
                       sums=None, path=None, rounding="once"):
        mean, var = ENGINE.normalize_rows(x, np.empty_like(y), scale, B, epsilon, centered,
                                          skip, bias, None, path, rounding=rounding)
        src = x if skip is None else reference.skip_sums(x, skip, bias)
        if sums is not None:
            sums[...] = src
        reference.normalize_rows_from(src, y, scale, B, epsilon, centered, mean, var,
                                      rounding=rounding)
        return mean, var

    def gated_rms(self, x, z, y, weight, bias, G, epsilon, before, path=None):
        var = ENGINE.gated_rms(x, z, np.empty_like(y), weight, bias, G, epsilon, before, path)
        return reference.ENGINE.gated_rms(x, z, y, weight, bias, G, epsilon, before, var=var)

    def gated_rms_backward(self, dy, x, z, weight, bias, G, epsilon, before, dx, dz,
                           path=None):
        var = ENGINE.gated_rms_backward(dy, x, z, weight, bias, G, epsilon, before,
                                        np.empty_like(dx), np.empty_like(dz), path)[2]
        return reference.ENGINE.gated_rms_backward(dy, x, z, weight, bias, G, epsilon, before,
                                                   dx, dz, var=var)

    def qk_rms(self, qkv, q_weight, k_weight, nq, nk, epsilon, llama, path=None):
        var = ENGINE.qk_rms(qkv.copy(), q_weight, k_weight, nq, nk, epsilon, llama, path)
        return reference.ENGINE.qk_rms(qkv, q_weight, k_weight, nq, nk, epsilon, llama,
                                       var=var)

    def rows_backward(self, x, dy, dx, gamma, centered, epsilon, stats=None, path=None):
        # the kernels' (AdaLN's dLN): the gated residual's backward after it is the twin's
        return ENGINE.rows_backward(x, dy, dx, gamma, centered, epsilon, stats, path)

    def modulated_rows_backward(self, x, dy, dx, T, gamma, epsilon, path=None):
        return ENGINE.modulated_rows_backward(x, dy, dx, T, gamma, epsilon, path)

    # AdaLN's forward: a sample at a time through normalize_rows above
    modulated_rows = Engine.modulated_rows

    def quantized_rows(self, x, w, b, res, q, scales, epsilon, centered, offset, fp8, static,
                       group, scale_ub, floor, path=None):
        assert res is None  # the cases have no residual
        mean, var, _ = ENGINE.quantized_rows(
            x, w, b, None, np.empty_like(q), None if scales is None else np.empty_like(scales),
            epsilon, centered, offset, fp8, static, group, scale_ub, floor, path)
        nans = reference_quantized.quantize_rows_from(
            x, w, b, q, None if scales is None else scales.reshape(-1, scales.shape[-1]),
            epsilon, centered, offset, fp8, static, group, scale_ub, floor, mean, var)
        return mean, var, nans


@pytest.mark.parametrize("name,dtype", CASES_BY_DTYPE)
def test_route_matches_twin(rng, monkeypatch, name, dtype):
    """Inference and LRN: the twin's bits. Training, instance, group and mean-variance
    normalization: the twin's bits given the kernels' statistics. Moments: the twin's
    own statistics are within the stated accuracy too. LpNormalization: the twin's
    norms are NumPy's sums, so within an ulp (four for float64). The epilogues'
    gradients: ReLU's mask and AdaLN's gated residual the twin's bits (given the
    kernels' statistics and dLN), the activation's derivative the oracle's bound (the
    twin's exp is NumPy's). Issue 32's and the epilogues' kernels: the default path's
    bits on every path too."""
    case = CASES[name]
    X, params = data(rng, case, dtype)
    arrange(monkeypatch, case)
    result, params = run(case, X, params, dtype)
    if case.op in LLM_OPS + EPILOGUE_OPS:  # the default path's bits (serial at these sizes)
        with monkeypatch.context() as m:
            m.setattr(threads, "_forked_from_openmp", False)
            default, _ = run(replace(case, path=None), X, params, dtype)
        for got, want in zip(_outputs(result), _outputs(default), strict=True):
            assert_identical(np.asarray(got), np.asarray(want))
    # the twin's own float64 sums (the activation's derivative: with NumPy's exp): the
    # oracle's bound
    if case.op in ("moments", "rows-grad", "act-grad", "act-eval"):
        check_with_oracle(case, X, params, run(case, X, params, dtype, reference.ENGINE)[0])
        return
    if case.op == "lp":
        twin = run(case, X, params, dtype, reference.ENGINE)[0].astype(F64)
        spacing = (np.abs(twin) * 2.0**-7 if dtype == BF16  # an ulp of dtype at the twin's Y
                   else np.abs(np.spacing(twin.astype(dtype))).astype(F64))
        assert np.all(np.abs(result.astype(F64) - twin) <= (4 if dtype == F64 else 1) * spacing)
        return
    twin = (reference.ENGINE if case.op in ("bn", "onednn", "normalize", "bn-planned", "lrn")
            else KernelStatisticsTwin())
    expected, _ = run(case, X, params, dtype, twin)
    for got, want in zip(_outputs(result), _outputs(expected), strict=True):
        assert_identical(np.asarray(got), np.asarray(want))


@pytest.mark.parametrize("dtype", FLOATS, ids=FLOAT_IDS)
@pytest.mark.parametrize("op", ["layer", "rms", "skip", "fused-add"])
def test_row_paths_give_the_same_bits(rng, monkeypatch, op, dtype):
    """Every path of a row normalization (fused on each path, split, and the
    one-thread twins of a forked child) gives the same outputs, bit for bit: the
    statistics are the same chunk results merged in the same order on all of them."""
    case = Case(op, (5, 3 * 65536 + 7), "NCX", frozenset())  # 4 chunks a row, 5 rows
    # (with two chunks a merge in reverse order gave the same bits here; with four not)
    X, params = data(rng, case, dtype)
    results = []
    for path, patch, forked in [("serial", {}, False), ("parallel", {}, False),
                                ("streaming", {}, False), ("parallel", SPLIT, False),
                                ("streaming", SPLIT, False), (None, {}, True)]:
        with monkeypatch.context() as m:
            arrange(m, Case(op, case.ncx_shape, "NCX", frozenset(), path, forked, patch))
            results.append(run(Case(op, case.ncx_shape, "NCX", frozenset(), path), X, params,
                               dtype)[0])
    for result in results[1:]:
        for got, want in zip(_outputs(result), _outputs(results[0]), strict=True):
            assert_identical(np.asarray(got), np.asarray(want))

"""The operator table: one record per public operator, and what the package needs
from it.

``normkernels bench`` (workloads, the float64 check, the peers), ``normkernels
warmup`` and ``coldstart``, :mod:`normkernels.onnx` (``run_node``, the evaluator's
OpRun classes), :mod:`normkernels.dask` and the benchmark cases in ``benchmarks/`` iterate
:data:`OPERATORS`; none of them names an operator. Adding an operator is a spec
module in ``normkernels/ops/``, its public function in its family's module of
``normkernels/api/`` (re-exported by ``api/__init__.py``), kernels if it needs new
loops, and one record here (see CONTRIBUTING.md). A record's backward pass (mode
"backward": workloads, the float64 check of dX, the torch peer, warmup and coldstart)
is its ``backward`` field, the public gradient function, plus
``mode_kwargs["backward"]``. The parts a record is built from (:class:`Onnx`,
:class:`WarmupCase`, the NumPy formulas the bench checks it with, and ``EPSILON``,
``GROUPS``, ``BACKWARD``) are in :mod:`normkernels.operators.record`; how its calls are
made (parameters, arguments, the call, coldstart's source) in
:mod:`normkernels.operators.calls`.

Importing this module imports neither Numba nor the operators' spec modules.
"""

import math
from dataclasses import dataclass, field

from normkernels.operators.calls import OperatorCalls
from normkernels.operators.record import (
    BACKWARD,
    EPSILON,
    GROUPS,
    Chunked,
    Onnx,
    OperatorFormulas,
    WarmupCase,
    qk_heads,
)

YARDSTICK = "batchnorm"  # BN inference: what other operators' times are compared with
LRN_SIZE = 5
MOMENTUM = 0.9  # ONNX convention: weighs the old running value (PyTorch's is 1 - this)


@dataclass(frozen=True)
class Operator(OperatorCalls, OperatorFormulas):
    """One public operator. ``family`` says what its workloads are and which formula
    the bench checks them with: NCX or NXC tensors with parameters per channel,
    "channel" (statistics per channel or per (n, c)) or "group" (per (n, group):
    ``groups`` names the attribute and the workloads' group count); "lrn" (a window
    across channels, no parameters); "mvn" (NCX only, statistics over axes 0, 2, 3, no
    parameters); or a row normalization over X's last axis, "layer" (centred), "rms"
    (parameters per column; ``skip``: onnxruntime's skip add first, its first
    parameter is then ``skip``, of X's shape) or "lp" (no parameters).

    "qk" is a row normalization per head of a packed qkv row (QK-norm: ``X``'s last
    axis holds ``num_q_heads`` q heads, then ``num_kv_heads`` k heads and as many v
    heads, of ``head_dim`` each, from :func:`qk_heads`); its two parameters are
    ``q_weight`` and ``k_weight``, of ``head_dim``.

    ``per_sample``: the diffusion models' modulation (AdaLN, AdaGroupNorm): the two
    parameters, scale and B (the shift), come per sample, of shape (N, C) (C: the
    channels, or a row normalization's row length), and Y is the normalization (without
    affine parameters) ``* (1 + scale[n]) + shift[n]``, broadcast over the sample's
    rows or spatial positions.

    ``backward`` names the public gradient function of the operator; a record that has
    one gets the mode "backward" (appended to ``modes``), whose calls are ``backward(dY,
    X, scale[, mean, var], **mode_kwargs["backward"], out=dX)``: dY of X's shape and
    layout, the forward's first parameter, and for batch normalization (the records
    whose forward takes mean and var) X's batch mean and population variance (a
    ``per_sample`` record's: ``(dY, X, scale, B)``, in its ``signature``'s order). Its
    formula is dX (specs/backward-passes.md section 1), its workloads move three
    X-sized arrays (X and dY read, dX written) and no ONNX peer has it."""

    name: str  # the bench's and the CLI's key
    title: str
    function: str  # the public function in normkernels
    spec: str  # the spec-layer module in normkernels.ops
    modes: tuple = ("inference",)
    dtypes: tuple = ("float16", "bfloat16", "float32", "float64")  # of X (latest opset)
    n_params: int = 4  # per-channel parameters (scale, B, mean, var order)
    family: str = "channel"
    skip: bool = False
    param_dtype: str = None  # parameters' dtype when not X's (float32, or bf16 for bf16 X)
    default_layout: str = "NCX"  # data_format's default (oneDNN's operators: NXC)
    statistics_per_sample: bool = False  # per (n, c), not per c over the batch (instance)
    reads_only: bool = False  # no Y: the roofline is a read, not a copy
    onnx: Onnx = None
    torch: str = None  # torch.nn.functional function, or None
    mode_kwargs: dict = field(default_factory=dict)  # mode -> keyword arguments
    over_inference: tuple = ()  # modes the bench also times against BN inference
    warmup: tuple = ()
    groups: tuple = None  # ("num_groups" or "groups", GROUPS): the group attribute
    backward: str = None  # the public backward function: mode "backward" calls it
    backward_spec: str = BACKWARD  # the spec module of the backward function
    # mode -> the positional arguments by name, when not (X, scale, B, mean, var) or
    # (dY, X, scale, mean, var) in that order (oneDNN's training operations)
    signature: dict = field(default_factory=dict)
    chunked: Chunked = None  # how normkernels.dask runs it (None: no dask function)
    # the attribute that names the layout, when not ``data_format``: (name, {"NCX": value,
    # "NXC": value}) (onnxruntime's GroupNorm: channels_last)
    layout_attribute: tuple = None
    # the activation its workloads apply after the affine ("silu"), or "silu gate": the
    # skip input is a gate, Y = affine * silu(gate)
    epilogue: str = None
    per_sample: bool = False  # (scale, B) per sample, (N, C): Y = norm * (1 + scale) + B
    # a skip record's last parameter is a bias added with the skip (onnxruntime's); False:
    # the sum is input + skip only (vLLM's fused add)
    skip_bias: bool = True
    # the arguments the function writes in place, by name (Y first); it takes no ``out``
    # and its calls here run on copies (``OperatorCalls.call``), returning them
    in_place: tuple = ()
    quantized: str = None  # Y's dtype when it is quantized (the call returns (q, scales))
    streams: int = None  # X-sized arrays a call moves, when not the bench's default count

    def __post_init__(self):
        if self.backward is not None and BACKWARD not in self.modes:
            object.__setattr__(self, "modes", (*self.modes, BACKWARD))

    @property
    def batch_statistics(self):
        """Does the backward take X's batch mean and variance (batch normalization:
        the forward takes mean and var as parameters)?"""
        return self.n_params == 4 and not self.rows

    @property
    def takes_out(self):
        """Does the public function take ``out`` (it writes a Y of X's shape and dtype)?"""
        return not (self.reads_only or self.in_place or self.quantized)

    @property
    def tuple_output(self):
        """Does the formula give every output of a call (moments' mean and variance, a
        quantized record's q and scales), not Y alone?"""
        return self.reads_only or self.quantized is not None

    @property
    def rows(self):
        return self.family in ("layer", "rms", "lp", "qk")

    @property
    def layouts(self):
        """The layouts its workloads come in (row normalizations: rows, named "NCX")."""
        return ("NCX",) if self.rows or self.family == "mvn" else ("NCX", "NXC")

    def group_count(self, C):
        """The groups of a workload with ``C`` channels: ``GROUPS``, or the largest
        divisor of C below it."""
        return math.gcd(C, self.groups[1])

    def columns(self, shape):
        """How many parameters per parameter vector: C (the channels; ``shape`` in NCX
        order) or the row length."""
        if self.family == "qk":  # q_weight and k_weight: one head's
            return qk_heads(shape[-1])["head_dim"]
        if self.rows:
            return shape[-1]
        return shape[1] if len(shape) > 1 else 1


_SCALE_SHIFT_WARMUP = (WarmupCase("planes", (2, 3, 64)), WarmupCase("periodic", (2, 3, 4)))
_STATISTICS_WARMUP = (
    WarmupCase("statistics: planes", (2, 3, 1024), "NCX", "training", ("serial", "parallel")),
    WarmupCase("statistics: rows", (2, 3, 4, 4), "NXC", "training", ("serial", "parallel")))

# the group normalization kernels with the SiLU epilogue, on every path and layout
_SILU_WARMUP = (WarmupCase("fused planes", (1, 32, 1024), per_thread=True),
                WarmupCase("fused short planes", (2, 32, 5, 5), paths=("serial", "parallel")),
                WarmupCase("rows", (2, 4, 4, 32), "NXC", paths=("serial", "parallel")))

_ROWS_EPSILON = {"inference": {"epsilon": EPSILON}}
_ROWS_WITH_BACKWARD = {"inference": {"epsilon": EPSILON}, "backward": {"epsilon": EPSILON}}
# every row kernel: fused rows on each path, and the split path (one long row) of both
# statistics (the other row operators run these same kernels)
_ROWS_WARMUP = (WarmupCase("rows", (64, 100)),
                WarmupCase("split rows", (1, 70001), paths=("parallel", "streaming")))
# the backward kernels: the reduction and the dX pass (streaming stores too) by planes
# (NCX, planes of at least 256) and by rows (NXC), for batch normalization and for
# instance normalization (whose kernels group normalization runs); RMS normalization
# runs layernorm's
_CHANNEL_BACKWARD_WARMUP = (WarmupCase("backward: planes", (2, 3, 256), "NCX", "backward"),
                            WarmupCase("backward: rows", (2, 3, 4, 4), "NXC", "backward"))
_ROWS_BACKWARD_WARMUP = (WarmupCase("backward: rows", (64, 100), mode="backward",
                                    paths=("serial", "parallel")),)
# per-sample modulation: the row kernels with float64 tables, one call per sample
# (fused rows, the split path of a long row, the backward), and the instance and group
# kernels with per-(n, c) float64 parameters (32 groups of 2 channels), as instancenorm's
_ADA_ROWS_WARMUP = (WarmupCase("rows per sample", (2, 64, 100)),
                    WarmupCase("split rows per sample", (1, 1, 70001),
                               paths=("parallel", "streaming")),
                    WarmupCase("backward: rows per sample", (2, 64, 100), mode="backward",
                               paths=("serial", "parallel")))
_ADA_GROUP_WARMUP = (WarmupCase("fused planes", (1, 64, 1024), per_thread=True),
                     WarmupCase("fused short planes", (2, 64, 5, 5), paths=("serial",
                                                                            "parallel")),
                     WarmupCase("split planes", (2, 64, 64), paths=("parallel",)),
                     WarmupCase("rows", (2, 64, 4, 4), "NXC", paths=("serial", "parallel")),
                     WarmupCase("backward: planes", (2, 64, 256), "NCX", "backward"),
                     WarmupCase("backward: rows", (2, 64, 4, 4), "NXC", "backward"))

# the fused add: its table-free kernels on each path (decode's few rows, prefill's many)
_FUSED_ADD_WARMUP = (WarmupCase("rows", (1, 4096), paths=("serial",)),
                     WarmupCase("rows", (64, 100)))
_QUANTIZED_INT8 = {"inference": {"epsilon": EPSILON, "dtype": "int8"}}
_SKIP_SIMPLIFIED_PEER = Onnx("SkipSimplifiedLayerNormalization", (1,), ("input", "skip",
                             "gamma"), None, implements=False, domain="com.microsoft",
                             versioned=False)

OPERATORS = {op.name: op for op in [
    Operator("batchnorm", "ONNX BatchNormalization", "batch_normalization",
             "batch_normalization", modes=("inference", "training"),
             onnx=Onnx("BatchNormalization", (1, 6, 7, 9, 14, 15), ("X", "scale", "B",
                       "input_mean", "input_var"), "op_batch_normalization"),
             torch="batch_norm", over_inference=("training", "backward"),
             mode_kwargs={"inference": {"epsilon": EPSILON},
                          "training": {"epsilon": EPSILON, "momentum": MOMENTUM,
                                       "training_mode": 1},
                          "backward": {"epsilon": EPSILON, "training": True}},
             warmup=(*_SCALE_SHIFT_WARMUP, *_STATISTICS_WARMUP, *_CHANNEL_BACKWARD_WARMUP),
             backward="batch_normalization_backward",
             chunked=Chunked("batch")),
    Operator("batchnorm-inference", "oneDNN Graph BatchNormInference-1",
             "batch_norm_inference", "batch_norm_inference",
             dtypes=("float16", "bfloat16", "float32"), param_dtype="float32",
             default_layout="NXC",
             onnx=Onnx("BatchNormalization", (15,), ("X", "scale", "B", "input_mean",
                       "input_var"), "op_batch_normalization", implements=False),
             torch="batch_norm", mode_kwargs={"inference": {"epsilon": EPSILON}},
             warmup=_SCALE_SHIFT_WARMUP,
             chunked=Chunked("given")),
    Operator("batchnorm-training-onednn", "oneDNN Graph BatchNormForwardTraining-1 and "
             "BatchNormTrainingBackward-1", "batch_norm_forward_training", "onednn_training",
             modes=("training",), dtypes=("float16", "bfloat16", "float32"),
             param_dtype="float32", default_layout="NXC",
             onnx=Onnx("BatchNormalization", (15,), ("X", "scale", "B", "input_mean",
                       "input_var"), "op_batch_normalization", implements=False),
             torch="batch_norm", over_inference=("training", "backward"),
             mode_kwargs={"training": {"epsilon": EPSILON, "momentum": MOMENTUM},
                          "backward": {"epsilon": EPSILON}},
             backward="batch_norm_training_backward", backward_spec="onednn_training",
             signature={"training": ("X", "mean", "var", "scale", "B"),
                        "backward": ("X", "dY", "mean", "var", "scale")},
             chunked=Chunked("whole", "channels", ("X",) + ("channel",) * 4)),  # BN's kernels
    Operator("instancenorm", "ONNX InstanceNormalization", "instance_normalization",
             "instance_normalization", n_params=2, statistics_per_sample=True,
             onnx=Onnx("InstanceNormalization", (1, 6, 22), ("input", "scale", "B"),
                       "op_instance_normalization"),
             torch="instance_norm", over_inference=("inference",),
             mode_kwargs={"inference": {"epsilon": EPSILON}, "backward": {"epsilon": EPSILON}},
             backward="instance_normalization_backward",
             warmup=(WarmupCase("fused planes", (1, 2, 1024), per_thread=True),
                     WarmupCase("fused short planes", (2, 3, 5, 5), paths=("serial",
                                                                           "parallel")),
                     WarmupCase("split planes", (2, 3, 64), paths=("parallel",)),
                     WarmupCase("rows", (2, 4, 4, 3), "NXC", paths=("serial", "parallel")),
                     *_CHANNEL_BACKWARD_WARMUP),
             chunked=Chunked("instance")),
    Operator("moments", "Per-channel moments", "moments", "moments", n_params=0,
             reads_only=True,
             chunked=Chunked("moments")),  # its kernels are warmed by batchnorm training
    Operator("layernorm", "ONNX LayerNormalization", "layer_normalization",
             "layer_normalization", n_params=2, family="layer",
             onnx=Onnx("LayerNormalization", (17,), ("X", "Scale", "B"),
                       "op_layer_normalization", required=2, counts_outputs=True),
             torch="layer_norm", mode_kwargs=_ROWS_WITH_BACKWARD,
             warmup=(*_ROWS_WARMUP, *_ROWS_BACKWARD_WARMUP),
             backward="layer_normalization_backward",
             chunked=Chunked("rows")),
    Operator("rmsnorm", "ONNX RMSNormalization", "rms_normalization", "rms_normalization",
             n_params=1, family="rms",
             onnx=Onnx("RMSNormalization", (23,), ("X", "scale"), "op_rms_normalization"),
             torch="rms_norm", mode_kwargs=_ROWS_WITH_BACKWARD,
             warmup=(WarmupCase("split rows", (1, 70001), paths=("parallel",)),),
             backward="rms_normalization_backward",
             chunked=Chunked("rows")),
    Operator("simplified-layernorm", "onnxruntime SimplifiedLayerNormalization",
             "simplified_layer_normalization", "rms_normalization", n_params=1, family="rms",
             onnx=Onnx("SimplifiedLayerNormalization", (1,), ("X", "scale"), None,
                       versioned=False, counts_outputs=True),
             torch="rms_norm", mode_kwargs=_ROWS_EPSILON,
             chunked=Chunked("whole", "rows", ("X", "rows"))),
    Operator("skip-layernorm", "onnxruntime SkipLayerNormalization (com.microsoft)",
             "skip_layer_normalization", "skip_layer_normalization", n_params=3,
             family="layer", skip=True,
             onnx=Onnx("SkipLayerNormalization", (1,), ("input", "skip", "gamma", "beta",
                       "bias"), None, domain="com.microsoft", required=3, versioned=False,
                       counts_outputs=True),
             torch="layer_norm", mode_kwargs=_ROWS_EPSILON,
             chunked=Chunked("whole", "rows", ("X", "rows", "rows", "X"))),
    Operator("skip-simplified-layernorm",
             "onnxruntime SkipSimplifiedLayerNormalization (com.microsoft)",
             "skip_simplified_layer_normalization", "skip_layer_normalization", n_params=2,
             family="rms", skip=True,
             onnx=Onnx("SkipSimplifiedLayerNormalization", (1,), ("input", "skip", "gamma",
                       "bias"), None, domain="com.microsoft", required=3, versioned=False,
                       counts_outputs=True),
             torch="rms_norm", mode_kwargs=_ROWS_EPSILON,
             chunked=Chunked("whole", "rows", ("X", "rows", "rows", "X"))),
    # LLM serving (docs/guide/llm-serving.md). The fused adds write X and skip (the residual)
    # in place; their workloads round once ("llama" rounds the normalized value too,
    # which the table's formula, rounded once, does not model: tests/test_llm_rows.py)
    Operator("fused-add-rmsnorm", "vLLM fused_add_rms_norm (in place)", "fused_add_rms_norm",
             "fused_add", n_params=1, family="rms", skip=True, skip_bias=False,
             in_place=("X", "skip"), streams=4,
             onnx=_SKIP_SIMPLIFIED_PEER, torch="rms_norm",
             mode_kwargs={"inference": {"epsilon": EPSILON, "rounding": "once"}},
             warmup=_FUSED_ADD_WARMUP),
    Operator("fused-add-layernorm", "fused_add_layer_norm (in place)", "fused_add_layer_norm",
             "fused_add", n_params=2, family="layer", skip=True, skip_bias=False,
             in_place=("X", "skip"), streams=4, torch="layer_norm",
             mode_kwargs=_ROWS_EPSILON, warmup=_FUSED_ADD_WARMUP),
    # Mamba-2's gated RMSNorm: the skip input is the gate, Y = rms(X) * scale * silu(gate)
    Operator("gated-rmsnorm", "Gated RMSNorm (Mamba-2, Qwen3-Next)", "gated_rms_normalization",
             "gated", n_params=1, family="rms", skip=True, skip_bias=False,
             epilogue="silu gate", streams=3, torch="rms_norm", mode_kwargs=_ROWS_EPSILON,
             warmup=(WarmupCase("rows", (64, 100), paths=("serial", "parallel")),),
             chunked=Chunked("whole", "rows")),
    # int8 output, a scale per row computed in the same pass (vLLM's dynamic per-token)
    Operator("quantized-rmsnorm", "RMSNorm to int8, dynamic per-row scales",
             "quantized_rms_normalization", "quantized", n_params=1, family="rms",
             quantized="int8", torch="rms_norm", mode_kwargs=_QUANTIZED_INT8,
             warmup=(WarmupCase("rows", (64, 100), paths=("serial", "parallel")),)),
    Operator("quantized-layernorm", "LayerNorm to int8, dynamic per-row scales",
             "quantized_layer_normalization", "quantized", n_params=2, family="layer",
             quantized="int8", torch="layer_norm", mode_kwargs=_QUANTIZED_INT8,
             warmup=(WarmupCase("rows", (64, 100), paths=("serial", "parallel")),)),
    # QK-norm: RMSNorm over each q and k head of a packed qkv, in place (v untouched);
    # the heads follow from the row length (record.qk_heads)
    Operator("qk-rmsnorm", "QK-norm per head of a packed qkv (Qwen3), in place",
             "qk_rms_normalization", "qk_norm", n_params=2, family="qk", in_place=("X",),
             torch="rms_norm", mode_kwargs=_ROWS_EPSILON,
             warmup=(WarmupCase("heads", (64, 768)),)),
    Operator("layernorm-onednn", "oneDNN Graph LayerNorm-1", "layer_norm", "layer_norm",
             n_params=2, family="layer", dtypes=("float16", "bfloat16", "float32"),
             param_dtype="float32",
             onnx=Onnx("LayerNormalization", (17,), ("X", "Scale", "B"),
                       "op_layer_normalization", implements=False),
             torch="layer_norm",
             mode_kwargs={"inference": {"epsilon": EPSILON, "keep_stats": False}},
             chunked=Chunked("whole", "rows", ("X", "lead", "lead"))),
    Operator("rmsnorm-onednn", "oneDNN Graph RMSNorm-1", "rms_norm", "layer_norm",
             n_params=1, family="rms", dtypes=("float16", "bfloat16", "float32"),
             param_dtype="float32",
             onnx=Onnx("RMSNormalization", (23,), ("X", "scale"), "op_rms_normalization",
                       implements=False),
             torch="rms_norm", mode_kwargs=_ROWS_EPSILON,
             chunked=Chunked("whole", "rows")),
    Operator("groupnorm", "ONNX GroupNormalization", "group_normalization",
             "group_normalization", n_params=2, family="group",
             groups=("num_groups", GROUPS),
             onnx=Onnx("GroupNormalization", (18, 21), ("X", "scale", "bias"), None),
             torch="group_norm", over_inference=("inference", "backward"),
             mode_kwargs={"inference": {"epsilon": EPSILON}, "backward": {"epsilon": EPSILON}},
             backward="group_normalization_backward",
             chunked=Chunked("group")),  # instancenorm's kernels
    Operator("groupnorm-onednn", "oneDNN Graph GroupNorm-1", "group_norm",
             "group_normalization", n_params=2, family="group", groups=("groups", GROUPS),
             dtypes=("float16", "bfloat16", "float32"), param_dtype="float32",
             default_layout="NXC",
             onnx=Onnx("GroupNormalization", (21,), ("X", "scale", "bias"), None,
                       implements=False),
             torch="group_norm",
             mode_kwargs={"inference": {"epsilon": EPSILON, "keep_stats": False}},
             chunked=Chunked("whole", "sample", ("X", "groups", "groups"))),
    Operator("groupnorm-ort", "onnxruntime GroupNorm (com.microsoft), SiLU",
             "ort_group_norm", "ort_group_norm", n_params=2, family="group",
             groups=("groups", GROUPS), epilogue="silu",
             onnx=Onnx("GroupNorm", (1,), ("X", "gamma", "beta"), None,
                       domain="com.microsoft", versioned=False),
             torch="group_norm",
             mode_kwargs={"inference": {"epsilon": EPSILON, "activation": 1}},
             layout_attribute=("channels_last", {"NCX": 0, "NXC": 1}),
             warmup=_SILU_WARMUP),
    Operator("skip-groupnorm-ort", "onnxruntime SkipGroupNorm (com.microsoft), SiLU",
             "ort_skip_group_norm", "ort_group_norm", n_params=2, family="group", skip=True,
             groups=("groups", GROUPS), epilogue="silu",
             onnx=Onnx("SkipGroupNorm", (1,), ("X", "gamma", "beta", "skip", "bias"), None,
                       domain="com.microsoft", required=4, versioned=False,
                       counts_outputs=True),
             torch="group_norm",
             mode_kwargs={"inference": {"epsilon": EPSILON, "activation": 1}},
             signature={"inference": ("X", "scale", "B", "skip")},
             layout_attribute=("channels_last", {"NCX": 0, "NXC": 1}),
             warmup=(WarmupCase("skip add", (2, 32, 4, 4), "NXC", paths=("serial",
                                                                        "parallel")),
                     WarmupCase("skip add", (2, 32, 4, 4), paths=("serial", "parallel")))),
    # per-sample modulation. No dask function: the (N, C) parameters would have to be
    # chunked along N with X, and Chunked's "whole" hands any other array whole to a block
    Operator("ada-layernorm", "Adaptive LayerNorm (DiT, FLUX, SD3)", "ada_layer_norm",
             "modulated", n_params=2, family="layer", per_sample=True, torch="layer_norm",
             mode_kwargs=_ROWS_WITH_BACKWARD, backward="ada_layer_norm_backward",
             backward_spec="modulated",
             signature={"inference": ("X", "B", "scale"), "backward": ("dY", "X", "B", "scale")},
             warmup=_ADA_ROWS_WARMUP),
    Operator("ada-groupnorm", "diffusers AdaGroupNorm", "ada_group_norm", "modulated",
             n_params=2, family="group", per_sample=True, groups=("num_groups", GROUPS),
             torch="group_norm",
             mode_kwargs={"inference": {"epsilon": EPSILON}, "backward": {"epsilon": EPSILON}},
             backward="ada_group_norm_backward", backward_spec="modulated",
             signature={"inference": ("X", "B", "scale"), "backward": ("dY", "X", "B", "scale")},
             warmup=_ADA_GROUP_WARMUP),
    Operator("mvn", "ONNX MeanVarianceNormalization", "mean_variance_normalization",
             "mean_variance_normalization", n_params=0, family="mvn",
             onnx=Onnx("MeanVarianceNormalization", (9, 13), ("X",), None),
             over_inference=("inference",),
             chunked=Chunked("whole", "axes")),  # the moments and normalize kernels of batchnorm
    Operator("lpnorm", "ONNX LpNormalization", "lp_normalization", "lp_normalization",
             n_params=0, family="lp",
             onnx=Onnx("LpNormalization", (1, 22), ("input",), "op_lp_normalization"),
             torch="normalize",
             warmup=(WarmupCase("rows", (64, 100), paths=("serial", "parallel")),),
             chunked=Chunked("whole", "axis")),
    Operator("lrn", "ONNX LRN", "lrn", "lrn", n_params=0, family="lrn",
             onnx=Onnx("LRN", (1, 13), ("X",), "op_lrn"), torch="local_response_norm",
             mode_kwargs={"inference": {"size": LRN_SIZE}},
             warmup=(WarmupCase("planes", (2, 6, 100), paths=("serial", "parallel")),
                     WarmupCase("rows", (2, 6, 4, 4), "NXC", paths=("serial", "parallel"))),
             chunked=Chunked("whole", "channel")),
]}


def operator(name):
    """The record named ``name`` (a KeyError listing the names otherwise)."""
    try:
        return OPERATORS[name]
    except KeyError:
        raise KeyError(f"no operator {name!r} (operators: {', '.join(OPERATORS)})") from None


def onnx_implemented():
    """(domain, op_type) -> record, for the ONNX operators normkernels runs."""
    return {(op.onnx.domain, op.onnx.op_type): op for op in OPERATORS.values()
            if op.onnx is not None and op.onnx.implements}

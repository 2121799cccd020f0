"""Planted bugs, each of which the test suite must catch.

    python tests/mutations.py            # every mutation (slow: 20-40 min)
    python tests/mutations.py --list     # the mutations and the tests each runs
    python tests/mutations.py --check    # every replacement still applies (seconds)
    python tests/mutations.py NAME ...   # some of them (names or prefixes)
    python tests/mutations.py --jobs 2   # two at a time, each on its own copy

Each mutation is a set of exact text replacements in the package. The script copies
the working tree to a temporary directory, runs the mutation's tests on the
unmutated copy first (they must pass), then for each mutation applies it, runs the
same tests (``pytest -x``) and reports the first test that fails. A mutation whose
tests still pass *survived*: the suite has a hole. A replacement whose text is not
found fails the run, so the list is kept in step with the code: after changing a
kernel, an engine path or a test, run this and mend the list (a new path gets its
planted bug too). Not run in CI (it recompiles the kernels for every mutation of a
kernel source).
"""

import argparse
import hashlib
import os
import queue
import re
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# the tests that speak for each operator family
BN = ["tests/test_batch_normalization.py", "tests/test_paths.py", "tests/test_rounding.py",
      "-k", "not onednn and not training and not instance and not moments"]
ONEDNN = ["tests/test_batch_normalization.py", "tests/test_paths.py", "tests/test_rounding.py",
          "-k", "onednn"]
TRAINING = ["tests/test_training.py", "tests/test_paths.py", "tests/test_rounding.py",
            "-k", "training and not moments"]
INSTANCE = ["tests/test_instance_normalization.py", "tests/test_paths.py",
            "tests/test_rounding.py", "-k", "instance"]
MOMENTS = ["tests/test_training.py", "tests/test_paths.py", "-k", "moments"]
ROWS = ["tests/test_paths.py", "-k", "layer or rms or skip or rows"]
EPI_ROWS = ["tests/test_layer_norm_epilogue.py", "-k",
            "float32 and (matches_oracle or large_offsets)"]
GROUP = ["tests/test_groups.py", "tests/test_paths.py", "-k", "group"]
MVN = ["tests/test_groups.py", "tests/test_paths.py", "-k", "mvn or mean_variance"]
LP = ["tests/test_lp_lrn.py", "tests/test_paths.py", "-k", "lp"]
LRN = ["tests/test_lp_lrn.py", "tests/test_paths.py", "-k", "lrn"]
FAMILIES = {"bn": BN, "onednn": ONEDNN, "training": TRAINING, "instance": INSTANCE}
SIXTEEN_BIT_OUTPUT = ("bn", "onednn", "training", "instance")


@dataclass(frozen=True)
class Mutation:
    name: str
    what: str
    edits: tuple  # (path, old, new): ``old`` must occur exactly once
    tests: tuple  # pytest arguments


def mutation(name, what, edits, tests):
    return Mutation(name, what, tuple(edits), tuple(tests))


ELEMENTS = "normkernels/kernels/elements.py"
VECTORS = "normkernels/kernels/vectors.py"
MOMENTS_K = "normkernels/kernels/statistics.py"
INSTANCE_K = "normkernels/kernels/instance.py"
SCALE_SHIFT = "normkernels/kernels/scale_shift.py"
ENGINE = "normkernels/engine/numba_engine.py"
BOUND = "normkernels/engine/numba_bind.py"
ENGINE_BASE = "normkernels/engine/__init__.py"
DIRECT = "normkernels/engine/numba_direct.py"
PLAN_TESTS = ["tests/test_plans.py", "-k", "training_and_backward"]
TRAINING_PLANS = "normkernels/ops/training_plans.py"
BIND_PLANS = ["tests/test_bind.py", "-k", "training_and_backward"]
POLICY = "normkernels/engine/policy.py"
THREADS = "normkernels/engine/threads.py"
TWIN = "normkernels/reference/__init__.py"
TABLE = "normkernels/operators/__init__.py"
FOLD = "normkernels/kernels/fold.py"
INFERENCE_K = "normkernels/kernels/inference.py"
PLANS = "normkernels/ops/plans.py"
MOMENTS_SPEC = "normkernels/ops/moments.py"
BINDING = "normkernels/binding.py"
COMMON = "normkernels/ops/common.py"
BN_SPEC = "normkernels/ops/batch_normalization.py"
CACHE = "normkernels/kernels/cache.py"
ROWS_K = "normkernels/kernels/rows.py"
ROWS_SPEC = "normkernels/ops/rows.py"
ROW_VECTORS = "normkernels/kernels/row_vectors.py"
ZOO = "normkernels/torch/zoo.py"
MODULATED = "normkernels/torch/modulated.py"
LN_SPEC = "normkernels/ops/layer_normalization.py"
GN_SPEC = "normkernels/ops/group_normalization.py"
MVN_SPEC = "normkernels/ops/mean_variance_normalization.py"
LP_K = "normkernels/kernels/lp.py"
LRN_K = "normkernels/kernels/lrn.py"
DASK = "normkernels/dask/channels.py"
DASK_WHOLE = "normkernels/dask/whole.py"
BWD_SPEC = "normkernels/ops/backward.py"
BWD_SUMS = "normkernels/kernels/backward_sums.py"
BWD_DX = "normkernels/kernels/backward_dx.py"
BACKWARD = ["tests/test_backward.py"]
FOLD_SPEC = "normkernels/ops/fold_batch_norm.py"
FOLD_BN = ["tests/test_fold_batch_norm.py"]
ACTIVATIONS = "normkernels/kernels/activations.py"
ORT_GN_SPEC = "normkernels/ops/ort_group_norm.py"
SKIP_SUMS_K = "normkernels/kernels/skip_sums.py"
ORT_GN = ["tests/test_ort_group_norm.py"]
ADA_SPEC = "normkernels/ops/modulated.py"
ADA = ["tests/test_ada_layer_norm.py"]
ACT_GRAD_K = "normkernels/kernels/activation_grad.py"
GRADIENTS = "normkernels/engine/numba_gradients.py"
EPI_BWD_SPEC = "normkernels/ops/epilogue_backward.py"
EPI_BWD = ["tests/test_epilogue_backward.py"]
EPI_GRAD_K = "normkernels/kernels/epilogue_grad.py"
FUSED_BWD = ["tests/test_epilogue_backward.py", "-k", "fused_passes"]
TABLE_THREADS = ["tests/test_table.py", "-k", "threads and backward"]
LANES = "normkernels/kernels/lanes.py"
INLINING = "normkernels/kernels/inlining.py"
FUSED_ADD = "normkernels/kernels/fused_add.py"
FUSED_ADD_SPEC = "normkernels/ops/fused_add.py"
GATED = "normkernels/kernels/gated.py"
QUANT_K = "normkernels/kernels/quantize.py"
QUANT_SPEC = "normkernels/ops/quantized.py"
QUANT_ENGINE = "normkernels/engine/numba_quantized.py"
QK = "normkernels/kernels/qk_norm.py"
TARGET = "normkernels/kernels/target.py"
PORTABLE = ["tests/test_portable.py"]

# bfloat16 narrowing: scalar bits path without the rounding bias, and the vector
# bodies sent to that path instead of fptrunc
BF16_TRUNCATE = [
    (ELEMENTS, "bias = builder.add(lsb, _splat(0x7FFF, bits.type))",
     "bias = builder.and_(lsb, _splat(0, bits.type))"),
    (VECTORS, "return 32, _I16, widen_bf16, _narrow_bf16_vector",
     "return 32, _I16, widen_bf16, narrow_bf16"),
]
# float16 narrowing: fptrunc, then one step toward zero where it rounded away
F16_TRUNCATE = [
    (ELEMENTS, "    return builder.bitcast(builder.fptrunc(value, _vec(ir.HalfType(), count)), "
     "_vec(_I16, count))\n", '''    half = builder.fptrunc(value, _vec(ir.HalfType(), count))
    bits = builder.bitcast(half, _vec(_I16, count))
    back = builder.fpext(half, _vec(_F32, count))
    zero = _splat(0.0, back.type)
    up = builder.and_(builder.fcmp_ordered(">=", value, zero),
                      builder.fcmp_ordered(">", back, value))
    down = builder.and_(builder.fcmp_ordered("<", value, zero),
                        builder.fcmp_ordered("<", back, value))
    away = builder.or_(up, down)
    return builder.select(away, builder.sub(bits, _splat(1, bits.type)), bits)
'''),
]

MUTATIONS = [
    *[mutation(f"bf16-truncates/{family}", "bfloat16 narrowing truncates instead of rounding "
               "to nearest even", BF16_TRUNCATE, FAMILIES[family])
      for family in SIXTEEN_BIT_OUTPUT],
    *[mutation(f"f16-truncates/{family}", "float16 narrowing truncates", F16_TRUNCATE,
               FAMILIES[family]) for family in SIXTEEN_BIT_OUTPUT],
    mutation("bf16-round-half-up", "bfloat16 ties rounded away from zero, not to even", [
        (ELEMENTS, "bias = builder.add(lsb, _splat(0x7FFF, bits.type))",
         "bias = builder.or_(lsb, _splat(0x8000, bits.type))"),
        BF16_TRUNCATE[1]], ["tests/test_rounding.py"]),
    mutation("bf16-subnormals-flushed", "bfloat16 vectors never leave fptrunc (float32 "
             "subnormals flushed to zero)", [
                 (VECTORS, "    return result\n\n\ndef storage_codec",
                  "    return fast\n\n\ndef storage_codec")],
             ["tests/test_kernels.py", "-k", "subnormal"]),
    mutation("per-sample-parameters-mixed", "NXC instance rows, one call per sample, with "
             "parameters per (n, c) (AdaGroupNorm): every sample normalized with sample 0's "
             "parameters", [
                 (ENGINE, "cs, gs = slice(n * C, (n + 1) * C), slice(n * G, (n + 1) * G)",
                  "cs, gs = slice(0, C), slice(n * G, (n + 1) * G)")],
             ["tests/test_ada_layer_norm.py", "-k", "sample_by_sample"]),
    mutation("rows-sample-parameters-mixed", "NXC instance norm, one launch: every sample "
             "with sample 0's parameters", [
                 (INSTANCE_K, "        mn = m[n * C:(n + 1) * C]\n", "        mn = m[0:C]\n")],
             INSTANCE),
    mutation("fused-plane-channel", "fused instance norm takes plane p's scale/B from "
             "channel p // N instead of p % C", [
                 (INSTANCE_K, "        c = p % C\n        fold_one(",
                  "        c = p // (m.size // C)\n        fold_one(")], INSTANCE),
    mutation("epsilon-dropped/inference", "inference folds a = scale / sqrt(var)", [
        (INFERENCE_K, "math.sqrt(np.float64(load(var, c)) + epsilon)",
         "math.sqrt(np.float64(load(var, c)))")], BN),
    mutation("mean-residual-not-folded/inference", "inference rounds a float64 mean to "
             "float32 without folding the residual into B", [
                 (INFERENCE_K, "b[c] = np.float64(load(B, c)) - residual * a64",
                  "b[c] = load(B, c)")], TRAINING),
    mutation("tables-channel/inference", "the serial inference kernel's tables take "
             "channel i % C", [
                 (INFERENCE_K, "c = (i // S) % C", "c = i % C")], BN),
    mutation("running-momentum-swapped/compiled", "the compiled running statistics weigh "
             "the batch by momentum", [
                 (INFERENCE_K, "np.float64(load(previous, c)) * momentum + batch[c] * keep",
                  "np.float64(load(previous, c)) * keep + batch[c] * momentum")], TRAINING),
    mutation("launch-end-not-recorded", "parallel launches never mark the workers awake",
             [(THREADS, "        _last_parallel_end = time.perf_counter()\n", "")],
             ["tests/test_policy.py"]),
    mutation("asleep-rule-everywhere", "the statistics families run serial while the "
             "workers sleep (instance norm of 7x7 planes 2.5x slower)", [
                 (POLICY, "if n <= limit or (asleep_rule and", "if n <= limit or (True and")],
             ["tests/test_policy.py"]),
    mutation("plan-writeable-unchecked", "a plan writes into a read-only out", [
        (PLANS, "elif not out.flags.writeable or (params", "elif False or (params")],
             ["tests/test_plans.py"]),
    mutation("plan-guard-off", "a plan writes into an out that overlaps an input", [
        (PLANS, "guard=out is not None)", "guard=False)")], ["tests/test_plans.py"]),
    mutation("plan-key-untyped", "plan keys without the attributes' types (1.0 for 1)", [
        (BN_SPEC, "consumed_inputs, num_outputs, saved_var, data_format, type(opset),",
         "consumed_inputs, num_outputs, saved_var, data_format, type(None),"),
        (BN_SPEC, "type(epsilon), type(momentum), type(training_mode), type(is_test),",
         "type(None), type(None), type(None), type(None),"),
        (BN_SPEC, "type(spatial), type(consumed_inputs), type(num_outputs), type(saved_var),",
         "type(None), type(None), type(None), type(None),")], ["tests/test_plans.py"]),
    mutation("plan-out-strides-ignored", "a plan serves an out of other strides", [
        (PLANS, "return type(out), out.shape, out.strides, out.dtype",
         "return type(out), out.shape, out.dtype")], ["tests/test_plans.py"]),
    mutation("plan-for-converted-arrays", "a plan made for arrays the checks converted "
             "(non-native byte order)", [
                 (PLANS, "a is b and type(a) is _ndarray", "type(a) is _ndarray")],
             ["tests/test_plans.py"]),
    mutation("plan-instance-sharing-unchecked", "an instance-norm plan writes into an out "
             "that shares memory with scale", [
                 (PLANS, "elif not out.flags.writeable or (params is not None and _shares(",
                  "elif not out.flags.writeable or (False and _shares(")],
             ["tests/test_plans.py"]),
    mutation("plan-instance-layout", "an instance-norm plan runs channels-last memory as "
             "planes", [(PLANS, "S != spatial, order", "S == spatial, order")],
             ["tests/test_plans.py"]),
    mutation("plan-training-sharing-unchecked", "a training plan writes into an out that "
             "shares memory with input_mean", [
                 (PLANS, "if out is not None and (not out.flags.writeable or _shares(out, X, "
                  "params)):", "if out is not None and not out.flags.writeable:")],
             ["tests/test_plans.py"]),
    mutation("plan-layernorm-strides", "a LayerNormalization plan serves a strided X of "
             "the same shape as contiguous", [
                 ("normkernels/ops/layer_normalization.py",
                  "type(X), X.shape, X.strides, X.dtype,", "type(X), X.shape, X.dtype,")],
             ["tests/test_plan_safety.py"]),
    mutation("plan-instance-dtype", "an InstanceNormalization plan serves X of another "
             "dtype", [
                 ("normkernels/ops/instance_normalization.py",
                  "type(input), input.shape, input.strides, input.dtype,",
                  "type(input), input.shape, input.strides,")],
             ["tests/test_plan_safety.py"]),
    mutation("bn-backward-eval-reads-x", "eval-mode BN backward computes dX through "
             "(x - mean) * 0 (NaN where X is NaN)", [
                 ("normkernels/ops/backward.py",
                  "    if training and (ep is None or dz is not None):",
                  "    if ep is None or dz is not None:")],
             ["tests/test_backward.py", "-k", "eval_mode"]),
    mutation("torch-bn-running-biased", "normkernels.torch updates the running variance "
             "with the biased batch variance", [
                 ("normkernels/torch/functional.py", "unbiased = var * (count / (count - 1))",
                  "unbiased = var")],
             ["tests/test_torch.py", "-k", "modules_match"]),
    mutation("torch-ln-grads-swapped", "normkernels.torch's LayerNorm returns dbias as "
             "dweight", [
                 ("normkernels/torch/eager.py", "ctx.n)\n        return dx, _keep(dw, w is not "
                  "None), _keep(db, ctx.has_bias), None, None",
                  "ctx.n)\n        return dx, _keep(db, w is not None), _keep(dw, ctx.has_bias), "
                  "None, None")],
             ["tests/test_torch.py", "-k", "functions_match"]),
    mutation("torch-op-ln-grads-swapped", "the LayerNorm custom operator's autograd returns "
             "dbias as dweight", [
                 ("normkernels/torch/ops.py", "ctx.n)\n    return dx, None, _keep(dw, w is not "
                  "None), _keep(db, ctx.has_bias), None",
                  "ctx.n)\n    return dx, None, _keep(db, w is not None), _keep(dw, "
                  "ctx.has_bias), None")],
             ["tests/test_torch.py", "-k", "eager_routes or opcheck"]),
    mutation("torch-rms-eps", "normkernels.torch's rms_norm takes 1e-6 for eps=None", [
                 ("normkernels/torch/functional.py",
                  "        eps = torch.finfo(torch.float32 if wide else input.dtype).eps\n",
                  "        eps = 1e-6\n")],
             ["tests/test_torch.py", "-k", "rms_norm_default"]),
    mutation("torch-bn-eval-grad-training", "normkernels.torch's eval-mode BatchNorm "
             "backward differentiates through the batch statistics", [
                 ("normkernels/torch/eager.py",
                  "batch_norm_backward_impl(dy, x, w, mean, var, ctx.eps, False)",
                  "batch_norm_backward_impl(dy, x, w, mean, var, ctx.eps, True)")],
             ["tests/test_torch.py", "-k", "functions_match"]),
    mutation("torch-eager-no-autograd", "normkernels.torch's eager calls drop autograd",
             [("normkernels/torch/eager.py",
               "return GRAD if grad and torch.is_grad_enabled() else PLAIN", "return PLAIN")],
             ["tests/test_torch.py", "-k", "functions_match"]),
    mutation("numba-row-inv-std", "normkernels.numba.layer_norm_row returns the variance "
             "for the inverse standard deviation", [
                 ("normkernels/numba.py", "return mean[0], 1.0 / np.sqrt(var[0] + epsilon)",
                  "return mean[0], var[0]")],
             ["tests/test_numba_api.py"]),
    mutation("torch-direct-stale-view", "normkernels.torch's direct route keeps a "
             "parameter's view after the tensor gets new memory", [
                 ("normkernels/torch/direct.py",
                  "if kept is not None and kept[0]() is t and kept[1] == t.data_ptr():",
                  "if kept is not None and kept[0]() is t:")],
             ["tests/test_torch.py", "-k", "direct_route"]),
    mutation("grad-sums-short-planes-by-rows", "BN backward reduces short planes of many "
             "channels by rows (a float64 partial per element)", [
                 ("normkernels/kernels/backward_sums.py",
                  "return by_planes(S, n_rows) or C * S > ROW_BLOCK_ELEMENTS",
                  "return by_planes(S, n_rows)")],
             ["tests/test_backward.py", "-k", "every_route"]),
    mutation("plan-reuse-x-only", "a plan's bound call serves any call whose X is the "
             "bound X (another out or parameters)", [
                 (PLANS, "entry = entries.get(tuple(map(id, arrays)))",
                  "entry = entries.get(id(arrays[0]))"),
                 (PLANS, "self.entries[ids] = (arrays, call, size)",
                  "self.entries[ids[0]] = (arrays, call, size)")],
             ["tests/test_plan_safety.py", "-k", "other_objects"]),
    mutation("plan-reuse-read-only-out", "a plan's bound call writes an out made read-only",
             [(PLANS, "if call is None or not out.flags.writeable:", "if call is None:")],
             ["tests/test_plan_safety.py", "-k", "same_arrays"]),
    mutation("plan-moments-layout", "a moments plan reads the channels of NXC memory as "
             "NCX", [
                 (MOMENTS_SPEC, "functools.partial(_planned, data_format=data_format,",
                  "functools.partial(_planned, data_format=\"NCX\",")],
             ["tests/test_plans.py", "tests/test_training.py", "-k", "moments"]),
    mutation("bind-copied-x", "a bound call runs on the copy of a strided X made at binding",
             [(BINDING, "    if not _reads((x, scale, B, mean, var), inputs)",
               "    if not _reads((scale, B, mean, var), inputs)")], ["tests/test_bind.py"]),
    mutation("bind-planes-copied-x", "a bound instance norm runs on the copy of X made "
             "at binding", [(BINDING, "    if not _reads((x, scale, B), inputs) or not "
                            "_same_memory(y, result):\n        return None\n    return "
                            "_checked(ENGINE.bind_instance_planes",
                            "    if not _reads((scale, B), inputs) or not "
                            "_same_memory(y, result):\n        return None\n    return "
                            "_checked(ENGINE.bind_instance_planes")], ["tests/test_bind.py"]),
    mutation("bind-planes-stale-tables", "a bound instance norm folds scale and B once, "
             "at binding", [(BOUND, "        return compiled_call(instance.fused_planes_serial, "
                             "(xs, ys, *args))",
                             "        s0, b0 = args[3].copy(), args[4].copy()\n"
                             "        args = args[:3] + (s0, b0) + args[5:]\n"
                             "        return compiled_call(instance.fused_planes_serial, "
                             "(xs, ys, *args))")],
             ["tests/test_bind.py"]),
    mutation("bind-converted-parameter", "a bound call reads a parameter converted at "
             "binding", [(BINDING, "    if not _reads((x, scale, B, mean, var), inputs)",
                          "    if not _reads((x,), inputs)")],
             ["tests/test_bind.py"]),
    mutation("plan-signed-zero", "a plan made for epsilon 0.0 serves -0.0", [
        (BN_SPEC, "if (key is not None and call.epsilon and (call.momentum",
         "if (key is not None and ((call.momentum")], ["tests/test_plans.py"]),
    mutation("plan-signed-zero/momentum", "a plan made for momentum 0.0 serves -0.0", [
        (BN_SPEC, "momentum.hex() if type(momentum) is float else momentum,", "momentum,")],
             ["tests/test_plans.py", "-k", "signed_zero"]),
    mutation("epsilon-dropped/instance", "instance norm's per-plane fold leaves out epsilon", [
        (FOLD, "a64 = scale / math.sqrt(var + epsilon)", "a64 = scale / math.sqrt(var)")],
             INSTANCE),
    mutation("nxc-stride-swapped", "contiguous X: the run length S taken for NXC instead "
             "of NCX", [
                 (COMMON, 'if data_format == "NCX" and X.ndim > 2 else 1',
                  'if data_format == "NXC" and X.ndim > 2 else 1')], BN),
    mutation("channels-last-memory-order", "a channels-last-in-memory NCX tensor read "
             "with the channels-first order", [
                 (COMMON, "def _channels_last_order(ndim):\n    return (0, *range(2, ndim), 1)",
                  "def _channels_last_order(ndim):\n    return (0, *range(1, ndim))")], BN),
    mutation("mean-residual-not-folded", "a float64 mean rounded to float32 without "
             "folding the residual into B", [
                 (COMMON, "if mean.dtype.itemsize <= cd.itemsize:", "if True:")], TRAINING),
    mutation("mean-residual-not-folded/instance", "instance norm's fold drops the residual "
             "of the rounded mean", [
                 (FOLD, "b[i] = B - (mean - np.float64(m[i])) * a64", "b[i] = B")], INSTANCE),
    mutation("merge-order-by-threads", "row blocks sized by the thread count, so the "
             "statistics' merge order depends on it", [
                 (POLICY, "ROW_BLOCK_ELEMENTS // min(width, column_tile))",
                  "ROW_BLOCK_ELEMENTS // min(width, column_tile) // threads.count())")],
             ["tests/test_training.py", "-k", "thread_count"]),
    mutation("sample-blocks-by-threads", "the NXC per-sample statistics' row blocks "
             "depend on the thread count, so their merge order does", [
                 (POLICY, "    per_sample = -(-MIN_SAMPLE_BLOCKS // max(N, 1))",
                  "    per_sample = -(-MIN_SAMPLE_BLOCKS * threads.count() // max(N, 1))")],
             ["tests/test_instance_normalization.py", "-k", "thread_count"]),
    mutation("merge-planes-reversed", "plane chunks merged last to first on the split "
             "path (the fused path merges them in order)", [
                 (MOMENTS_K, "            for k in range(chunks):\n",
                  "            for k in range(chunks - 1, -1, -1):\n")],
             ["tests/test_instance_normalization.py", "-k", "bitwise"]),
    mutation("two-pass-fallback-off", "the one-pass shifted sums never fall back to two "
             "passes when they cancel", [
                 (MOMENTS_K, "        if one_pass and correction <= s2 * CANCELLATION_LIMIT:\n",
                  "        if one_pass:\n")],
             ["tests/test_training.py", "-k", "outlier"]),
    mutation("rows-infinite-shift", "the rows kernel keeps one-pass sums that are NaN "
             "because the block's first row is infinite (an infinite mean turns NaN)", [
                 (MOMENTS_K, "if not correction <= s2[j] * CANCELLATION_LIMIT:",
                  "if correction > s2[j] * CANCELLATION_LIMIT:")], MOMENTS),
    mutation("split-vector-lane", "a vector straddling two planes gives one lane too many "
             "to the first", [
                 (VECTORS, 'builder.icmp_signed("<", lane,', 'builder.icmp_signed("<=", lane,')],
             BN),
    mutation("periodic-block-phase", "a parallel block of the periodic loop starts its "
             "parameter tables at phase 0 instead of its own", [
                 (SCALE_SHIFT, "    phase = lo % P\n", "    phase = 0\n")], BN),
    mutation("momentum-swapped", "running statistics weigh the batch by momentum "
             "(PyTorch's convention; the NumPy rule, which 16-bit statistics and the twin "
             "use)", [
                 (ENGINE_BASE, "* momentum\n                    + batch * (1.0 - momentum))",
                  "* (1.0 - momentum)\n                    + batch * momentum)")],
             TRAINING),
    mutation("out-not-written", "a strided out= is never written back", [
        (COMMON, "        np.copyto(out, y)\n        return out", "        return out")], BN),
    mutation("fork-guard-off", "a child forked after GNU OpenMP ran launches parallel "
             "kernels", [
                 (THREADS, "    return not _forked_from_openmp", "    return True")],
             ["tests/test_reliability.py", "-k", "child_processes"]),
    mutation("launch-guard-off", "parallel launches not serialised under the workqueue "
             "layer", [
                 (THREADS, 'return _LOCKED if _layer == "workqueue" else _UNLOCKED',
                  "return _UNLOCKED")],
             ["tests/test_reliability.py", "-k", "threading_layer and workqueue"]),
    mutation("statistics-path-ignored", "the statistics run their parallel kernels on the "
             "serial path (in a forked child too)", [
                 (ENGINE, '            S = xs.size  # one channel: the whole tensor is one plane\n'
                  '        path = "serial" if policy.resolve_path(xs, path) == "serial" '
                  'else "parallel"', '            S = xs.size  # one channel: the whole tensor '
                  'is one plane\n        path = "parallel"')],
             ["tests/test_paths.py", "-k", "moments"]),
    mutation("twin-fold-epsilon", "the NumPy twin folds a = scale / sqrt(var), without "
             "epsilon", [
                 (COMMON, "np.sqrt(var.astype(FLOAT64) + epsilon)",
                  "np.sqrt(var.astype(FLOAT64))")],
             ["tests/test_paths.py", "-k", "twin and bn"]),
    mutation("streaming-hint-dropped", "streaming kernels emit ordinary stores", [
        (VECTORS, '        store.set_metadata("nontemporal", hint)\n', "")],
             ["tests/test_kernels.py", "-k", "non_temporal"]),
    mutation("inliner-copies-share-one-block", "the faster inliner hands every block of a "
             "copy the same copied block (one memo for the whole inline, not per scope)", [
                 (INLINING, "            block = copy.deepcopy(value, entry[1])",
                  "            block = entry[1].setdefault('b', copy.deepcopy(value, entry[1]))")],
             ["tests/test_kernels.py", "-k", "inliner"]),
    mutation("inliner-copies-nothing", "the faster inliner skips the callee's first copy "
             "too (it then changes the untyped IR kept for the next call sites)", [
                 (INLINING, "            if id(scope) in self._made:", "            if True:")],
             ["tests/test_kernels.py", "-k", "inliner"]),
    mutation("inliner-patched-at-import", "the faster inliner is installed at import "
             "(Numba's inliner imported by every process)", [
                 (INLINING, "\n_install_at_first_compile()\n",
                  "\n_install()\n")],
             ["tests/test_kernels.py", "-k", "inliner"]),
    mutation("label-counter-kept", "Numba's IR label counter is not restarted at a "
             "top-level compile (block names grow past LLVM's limit)", [
                 (INLINING, "            if self.depth == 0:\n                _reset_labels()\n",
                  "")],
             ["tests/test_kernels.py", "-k", "label_counter"]),
    # issue 32: the gated RMSNorm (mamba_ssm) and QK-norm
    mutation("gated-after-gate-dropped", "norm_before_gate=False normalizes x, not x * silu(z)", [
                 (GATED, "        us[i] = load(xs, i) * activate(SILU, load(zs, i))",
                  "        us[i] = load(xs, i)")],
             ["tests/test_gated.py", "-k", "forward_matches_oracle and after"]),
    mutation("gated-group-offset", "every group takes the statistics of the row's first group", [
                 (GATED, "                var[j + g] = row_statistics(x, xo + g * G, G, False)[1]",
                  "                var[j + g] = row_statistics(x, xo, G, False)[1]")],
             ["tests/test_gated.py", "-k", "forward_matches_oracle and g32"]),
    mutation("gated-bias-dropped", "the bias is not added (norm before gate)", [
                 (GATED, "        v = (load(xs, i) * a) * ws[i] + bs[i]",
                  "        v = (load(xs, i) * a) * ws[i]")],
             ["tests/test_gated.py", "-k", "forward_matches_oracle and before-bias"]),
    mutation("gated-epsilon-dropped", "epsilon left out of the inverse RMS", [
                 (GATED, "            a[g] = 1.0 / math.sqrt(var[j + g] + epsilon)",
                  "            a[g] = 1.0 / math.sqrt(var[j + g])")],
             ["tests/test_gated.py", "-k", "hostile_values"]),
    mutation("qk-k-heads-q-weight", "k heads scaled by q_weight", [
                 (QK, "            _scale(x, o + h * D, D, a[h], kw, llama)",
                  "            _scale(x, o + h * D, D, a[h], qw, llama)")],
             ["tests/test_qk_norm.py", "-k", "once_matches_oracle"]),
    mutation("qk-v-heads-for-k", "the k heads' scaling is written over the v heads", [
                 (QK, "            _scale(x, o + h * D, D, a[h], kw, llama)",
                  "            _scale(x, o + (h + nk) * D, D, a[h], kw, llama)")],
             ["tests/test_qk_norm.py", "-k", "once_matches_oracle"]),
    mutation("qk-float32-overflow-kept", "a bfloat16 head whose float32 sum of squares "
             "overflows keeps it (no float64 statistics)", [
                 (QK, "            if not (inline and math.isfinite(var[j + h])):",
                  "            if not inline:")],
             ["tests/test_qk_norm.py", "-k", "squares_beyond_float32"]),
    mutation("qk-llama-rounds-once", "rounding='llama' skips the rounding of x_hat to T", [
                 (QK, "    if llama:\n", "    if llama and False:\n")],
             ["tests/test_qk_norm.py", "-k", "llama_rounding"]),
    mutation("gated-backward-silu-slope", "silu' = s (1 + z s) instead of s (1 + z (1 - s))", [
                 (GATED, "    return s * (1.0 + zv * (1.0 - s))", "    return s * (1.0 + zv * s)")],
             ["tests/test_gated.py", "-k", "backward_matches_oracle"]),
    mutation("gated-backward-mean-over-row", "the backward's mean(h g) divides by the row "
             "length, not the group size", [
                 (GATED, "            c = c / G", "            c = c / K")],
             ["tests/test_gated.py", "-k", "backward_matches_oracle and g32"]),
    # issue 32: Llama's rounding, Gemma's offset, the in-place fused add
    mutation("llama-vectors-round-once", "the row vectors skip Llama's rounding of the "
             "normalized value", [
                 (ROW_VECTORS, '        llama = sig.args[-1].rounding == "llama"\n',
                  '        llama = False\n')],
             ["tests/test_llm_rows.py", "-k", "llama_is_the_rounded"]),
    mutation("llama-scalar-round-once", "the row kernels' scalar heads and tails skip Llama's "
             "rounding", [
                 (ROWS_K, '    if act.rounding != "llama":\n        return value(y, act, value)',
                  '    if True:\n        return value(y, act, value)')],
             ["tests/test_llm_rows.py", "-k", "llama_is_the_rounded"]),
    mutation("gemma-offset-ignored", "offset= is not added to the weight", [
                 (COMMON, "    if offset == 0:\n        return scale",
                  "    if True:\n        return scale")],
             ["tests/test_llm_rows.py", "-k", "gemma"]),
    mutation("fused-add-sums-not-kept", "the decode kernel leaves the residual unwritten", [
                 (FUSED_ADD, "        store(rs, i, load(xs, i) + load(rs, i))",
                  "        load(xs, i) + load(rs, i)")],
             ["tests/test_llm_rows.py", "-k", "fused_add_rms_norm and decode1"]),
    mutation("fused-add-llama-ignored", "the decode kernel rounds once under Llama's rounding", [
                 (FUSED_ADD, "        if llama:\n            n = round_to_storage(xs, n)",
                  "        if False:\n            n = round_to_storage(xs, n)")],
             ["tests/test_llm_rows.py", "-k", "fused_add_rms_norm and llama and decode4"]),
    mutation("fused-add-plan-skips-overlap", "a planned fused add does not check x against the "
             "residual", [
                 (FUSED_ADD_SPEC, "        if plans.shares(x, residual, params) or "
                  "plans.shares(residual, x, params):", "        if False:")],
             ["tests/test_llm_rows.py", "-k", "bound_and_planned"]),
    # issue 32: normalizations with int8 / float8 outputs
    mutation("quantized/fp8-ties-up", "float8 conversion rounds ties up (the tie-break's lsb "
             "dropped)", [
                 (QUANT_K, "normal = np.uint32(np.uint32((a + np.uint32(0x7FFFF) + lsb) >> "
                  "np.uint32(20))", "normal = np.uint32(np.uint32((a + np.uint32(0x80000) + 0 * "
                  "lsb) >> np.uint32(20))")],
             ["tests/test_quantized.py", "-k", "fp8_conversion_is_correctly_rounded"]),
    mutation("quantized/int8-qmax-128", "int8 dynamic scale divides max|y| by 128, not 127", [
                 (QUANT_K, "qmax = FP8_MAX if fp8 else INT8_MAX",
                  "qmax = FP8_MAX if fp8 else 128.0")],
             ["tests/test_quantized.py", "-k", "against_the_oracle and float32-int8-rms-dynamic"]),
    mutation("quantized/floor-dropped", "the dynamic scale's floor not applied", [
                 (QUANT_K, "s = s if s > floor else floor", "s = s if s > floor else s")],
             ["tests/test_quantized.py", "-k", "zero_rows_take_the_floor"]),
    mutation("quantized/residual-not-normalized", "with residual, x is normalized instead of "
             "x + residual", [
                 (QUANT_K, "        src, sr = res, ro\n", "        src, sr = x, xo\n")],
             ["tests/test_quantized.py", "-k", "residual_is_added_in_place_first"]),
    mutation("quantized/group-scale-index", "per-group scales all written to the row's first "
             "group", [(QUANT_K, "scales[so + g] = s", "scales[so] = s")],
             ["tests/test_quantized.py", "-k", "against_the_oracle and group"]),
    mutation("quantized/mean-residual-dropped", "the float32 fold drops the mean's residual c", [
                 (QUANT_K, "        f[2] = -((mu - np.float64(f[0])) * inv)\n",
                  "        f[2] = -0.0\n")],
             ["tests/test_quantized.py", "-k", "large_offsets"]),
    mutation("quantized/scale-ub-ignored", "scale_ub checked but not passed on", [
                 (QUANT_SPEC, 'ub = None if scale_ub is None else _positive_float32(label, '
                  '"scale_ub", scale_ub)', 'ub = None if scale_ub is None else '
                  '_positive_float32(label, "scale_ub", scale_ub) and None')],
             ["tests/test_quantized.py", "-k", "against_the_oracle and ub"]),
    # the table-free quantized rows (a decode step) and the plan's bound call of them
    mutation("quantized/table-free-first-row-only", "the table-free quantized kernel "
             "quantizes the first row only", [
                 (QUANT_K, "    for r in range(q.size // K):", "    for r in range(1):")],
             ["tests/test_paths.py", "-k", "table-free and quant"]),
    mutation("quantized/table-free-bias-dropped", "the table-free quantized layer norm "
             "drops the bias", [
                 (QUANT_ENGINE, "storage_view(w), _table_free_bias(b, x.dtype, K, centered)",
                  "storage_view(w), _table_free_bias(None, x.dtype, K, centered)")],
             ["tests/test_paths.py", "-k", "table-free and quant"]),
    mutation("quantized/plan-offset-dropped", "a planned quantized call drops the offset "
             "(Gemma's 1 + w)", [
                 (QUANT_ENGINE, "epsilon, centered, cd(offset), fp8,",
                  "epsilon, centered, cd(0.0), fp8,")],
             ["tests/test_llm_plans.py", "-k", "quantized"]),
    mutation("bind-copies-read-only-params", "a bound inference call copies small "
             "read-only parameters at binding (later contents unseen)", [
                 (BOUND, "        p0, p1, p2, p3 = (storage_alias(scale), storage_alias(B), "
                  "storage_alias(mean),", "        p0, p1, p2, p3 = (storage_view(scale), "
                  "storage_alias(B), storage_alias(mean),")],
             ["tests/test_bind.py", "-k", "read_only"]),
    mutation("bind-rows-stale-scale", "a bound row normalization copies its scale at "
             "binding (the spec layer's broadcast view is read-only)", [
                 (BOUND, "        s = storage_alias(scale)\n",
                  "        s = storage_view(scale)\n")],
             ["tests/test_bind.py", "-k", "every_operator and layernorm"]),
    mutation("onednn-plan-key-without-keep-stats", "a oneDNN LayerNorm plan made with "
             "keep_stats serves a call without it", [
                 ("normkernels/ops/layer_norm.py",
                  "(begin_norm_axis, epsilon, keep_stats, use_affine)",
                  "(begin_norm_axis, epsilon, use_affine)")],
             ["tests/test_plans.py", "-k", "onednn"]),
    mutation("corrupt-cache-raises", "a corrupt kernel cache file raises into the call", [
        (CACHE, "\n_tolerate_unreadable_files()\n",
         "\n")], ["tests/test_reliability.py", "-k", "corrupt_cache"]),
    mutation("epsilon-dropped/rows", "row normalizations fold a = 1 / sqrt(var)", [
        (ROWS_K, "inv = 1.0 / math.sqrt(var + epsilon)", "inv = 1.0 / math.sqrt(var)")], ROWS),
    mutation("mean-residual-not-folded/rows", "row normalizations round the float64 row "
             "mean to float32 and drop its residual", [
                 (ROWS_K, "c[r] = -((mean - np.float64(m[r])) * inv)", "c[r] = -0.0")],
             ["tests/test_rows.py"]),
    mutation("one-pass-variance/rows", "row variance as E[x^2] - E[x]^2 (the function "
             "body's formula)", [
                 (ROWS_K, "        mean_b, m2_b = wide_span(xs[lo:hi])\n",
                  "        mean_b = shifted_sums(xs[lo:hi], 0.0)[0] / (hi - lo)\n"
                  "        m2_b = shifted_sums(xs[lo:hi], 0.0)[1]"
                  " - (hi - lo) * mean_b * mean_b\n")],
             ["tests/test_rows.py"]),
    mutation("columns-at-row-offset/rows", "the row vector reads the column tables at the "
             "element's offset in X instead of its column", [
                 (ROW_VECTORS, "s, b = (load(k, j, table) for k in _TABLES)",
                  "s, b = (load(k, xi, table) for k in _TABLES)")],
             ROWS),
    # float32 rows in float32 lanes (issue 47)
    mutation("float32-lanes-a-lo-dropped/rows", "float32 rows multiply by a rounded to "
             "float32 alone (no a_lo compensation)", [
                 (ROW_VECTORS, "_fma(builder, t, a_hi, _fma(builder, t, a_lo, c32))",
                  "_fma(builder, t, a_hi, c32)")],
             ["tests/test_float32_rows.py"]),
    mutation("float32-lanes-residual-dropped/rows", "float32 lanes drop the mean's residual "
             "(the mean rounded to float32)", [
                 (ROW_VECTORS, "c32 = builder.select(finite, residual, ir.Constant(_F32, -0.0))",
                  "c32 = ir.Constant(_F32, -0.0)")],
             ["tests/test_float32_rows.py"]),
    mutation("float32-lanes-nowhere/rows", "the kernels keep float64 lanes on FMA targets "
             "(the twin computes float32 lanes)", [
                 (ROW_VECTORS, "return y.dtype == types.float32 and jit_target().fma",
                  "return False")],
             ["tests/test_float32_rows.py"]),
    mutation("float32-lanes-no-conditioning/rows", "float32 lanes for every row, however "
             "scaled (deviations that overflow float32, a beyond its range)", [
                 (ROW_VECTORS, '    """The ``i1`` "this row takes float32 lanes" of float64 row '
                  'scalars ``m``, ``a``."""\n', '    """The ``i1`` "this row takes float32 lanes" '
                  'of float64 row scalars ``m``, ``a``."""\n    return ir.Constant(ir.IntType(1), '
                  '1)\n')],
             ["tests/test_float32_rows.py", "tests/test_rows.py", "-k", "huge or subnormal"]),
    mutation("fma32-rounds-twice/twin", "the twin's float32 FMA is a float64 multiply-add "
             "rounded to float32 (two roundings)", [
                 ("normkernels/reference/rows.py",
                  "        s = np.where(inexact, (bits + toward).view(FLOAT64), s)\n", "")],
             ["tests/test_float32_rows.py", "-k", "fma32"]),
    mutation("skip-not-repeated/rows", "a skip of (seq, hidden) is not repeated over the "
             "batch", [(ROWS_K, "(r % n_skip) * K, bias", "min(r, n_skip - 1) * K, bias")],
             ["tests/test_rows.py", "-k", "skip"]),
    mutation("split-merge-reversed/rows", "the split path merges a row's chunks last to "
             "first (the fused path merges them in order)", [
                 ("normkernels/kernels/rows_split.py",
                  "            for k in range(part_m2.shape[1]):\n"
                  "                size = min(K - k * PLANE_CHUNK, PLANE_CHUNK)\n",
                  "            for k in range(part_m2.shape[1] - 1, -1, -1):\n"
                  "                size = min(K - k * PLANE_CHUNK, PLANE_CHUNK)\n")],
             ["tests/test_paths.py", "-k", "same_bits"]),
    mutation("short-rows-mean/rows", "rows shorter than SHORT_ROW: deviations from 0, not "
             "from the mean", [
                 (ROWS_K, "        d = np.float64(load(x, o + i)) - mu\n",
                  "        d = np.float64(load(x, o + i))\n")], ROWS),
    mutation("narrow-squares-overflow/rows", "16-bit RMS rows keep float32 sums of "
             "squares that overflowed", [
                 (ROWS_K, "    return math.isfinite(total), total\n",
                  "    return True, total\n")], ["tests/test_rows.py"]),
    mutation("stash-bfloat16-as-float32", "stash_type 16 gives float32 statistics", [
        (LN_SPEC, "STASH_TYPES = {1: FLOAT32, 16: BFLOAT16, 11: FLOAT64}",
         "STASH_TYPES = {1: FLOAT32, 16: FLOAT32, 11: FLOAT64}")], ["tests/test_rows.py"]),
    mutation("broadcast-leading-axes-ignored/rows", "Scale varying along the leading axes "
             "taken as its first row", [
                 (ROWS_SPEC, "        if any(d != 1 for d in p.shape[:lead]):\n"
                  "            return None\n        p = p.reshape(p.shape[lead:])",
                  "        p = p[(0,) * lead]")], ["tests/test_rows.py"]),
    mutation("row-plan-sharing-unchecked", "a row plan writes into an out that shares "
             "memory with Scale", [
                 (ROWS_SPEC, "elif not out.flags.writeable or plans.shares(out, X, params):",
                  "elif not out.flags.writeable:")], ["tests/test_plans.py", "-k", "row"]),
    # group normalizations
    mutation("scale-per-group/group", "GroupNormalization-21 takes channel c's scale from "
             "its group's index", [
                 (INSTANCE_K, "    for p in range(g * Cg, (g + 1) * Cg):\n        c = p % C\n",
                  "    for p in range(g * Cg, (g + 1) * Cg):\n        c = (p // Cg) % C\n")],
             GROUP),
    mutation("group-count-per-channel/group", "NXC group statistics divide by the rows of "
             "one channel, not the group's elements", [
                 (INSTANCE_K, "    count = rows_per_sample * Cg\n",
                  "    count = rows_per_sample\n")], GROUP),
    mutation("group-merge-first-channel/group", "NXC group M2 leaves out the spread between "
             "the group's channels", [
                 (INSTANCE_K, "                q += part_m2[first + k, c] + size * (d * d)",
                  "                q += part_m2[first + k, c]")], GROUP),
    mutation("opset18-tiled/group", "GroupNormalization-18 tiles the per-group scale over the "
             "channels instead of repeating it", [
                 (GN_SPEC, "scale, bias = np.repeat(scale, C // groups), np.repeat(bias, C // "
                  "groups)", "scale, bias = np.tile(scale, C // groups), np.tile(bias, C // "
                  "groups)")], GROUP),
    mutation("dask-group-m2/group", "dask: the group M2 leaves out the spread between chunks' "
             "channel means", [
                 (DASK, "group_m2 = (m2 + count * (mean - group_mean) ** 2)",
                  "group_m2 = (m2 + 0 * (mean - group_mean) ** 2)")],
             ["tests/test_dask.py", "-k", "group"]),
    mutation("read-only-type/compiles", "a read-only input reaches the kernels as a "
             "read-only array (a second Numba specialization of every kernel it meets)", [
                 ("normkernels/dtypes.py", "return np.asarray(_Memory(arr))", "return arr")],
             ["tests/test_compiles.py"]),
    mutation("dask-whole-axis-split/whole", "dask's whole strategy leaves the last of the "
             "axes a record's statistics span chunked", [
                 (DASK_WHOLE, "X = X.rechunk({i: -1 for i in axes})",
                  "X = X.rechunk({i: -1 for i in axes[:-1]})")],
             ["tests/test_dask.py", "-k", "every_record"]),
    mutation("epsilon-on-variance/mvn", "MeanVarianceNormalization adds 1e-9 to the variance",
             [(MVN_SPEC, "a64 = 1.0 / (np.sqrt(var) + EPSILON)",
               "a64 = 1.0 / np.sqrt(var + EPSILON)")], MVN),
    mutation("mean-residual-dropped/mvn", "MeanVarianceNormalization rounds the float64 mean "
             "and drops its residual", [
                 (MVN_SPEC, "b = np.where(np.isfinite(m), 0.0 - residual, 0.0).astype(cd)",
                  "b = np.zeros(mean.shape, cd)")], MVN),
    mutation("abs-dropped/lp", "LpNormalization p = 1 sums x, not |x| (the ONNX reference's "
             "bug)", [(LANES, "        acc = acc + absolute(load_lanes(x, i, 0.0))",
                       "        acc = acc + load_lanes(x, i, 0.0)"),
                      (LANES, "        total += abs(np.float64(load(x, k)))",
                       "        total += np.float64(load(x, k))")], LP),
    mutation("f16-bits-round-half-up", "float16 narrowing by integer bits (targets without "
             "F16C) rounds ties up, not to even", [
                 (ELEMENTS, "normal = builder.lshr(builder.add(rebiased, lsb), _splat(13, i32))",
                  "normal = builder.lshr(builder.add(rebiased, _splat(1, i32)), _splat(13, i32))")],
             PORTABLE),
    mutation("f16-bits-subnormals-halved", "float16 widening by integer bits scales "
             "subnormals by 2**-25", [
                 (ELEMENTS, "_splat(2.0**-24, _vec(_F32, count))",
                  "_splat(2.0**-25, _vec(_F32, count))")], PORTABLE),
    mutation("f16-bits-nan-not-quiet", "float16 narrowing by integer bits keeps a signalling "
             "NaN signalling (the instructions quiet it)", [
                 (ELEMENTS, "_splat(0x3FF, i32)),\n                      _splat(0x7E00, i32))",
                  "_splat(0x3FF, i32)),\n                      _splat(0x7C00, i32))")],
             PORTABLE),
    mutation("bf16-instruction-everywhere", "vcvtneps2bf16 emitted on x86 targets without "
             "AVX512-BF16 (the abort of issue 26)", [
                 (TARGET, '        return self.x86 and "avx512bf16" in self.found',
                  "        return self.x86")], PORTABLE),
    mutation("f16-instruction-everywhere", "LLVM's half conversions on targets without F16C "
             "(compiler-rt calls the JIT cannot link)", [
                 (TARGET, '        return {"f16_narrow", "f16_widen"} <= self.found',
                  "        return True")], PORTABLE),
    mutation("reduction-order-by-target", "the lanes' sums follow the target's vector width "
             "(as an LLVM-vectorised or fast-math sum does): half the lanes without AVX-512", [
                 (LANES, "        self.count = LANES64 if dtype == types.float64 else LANES32\n",
                  "        self.count = (LANES64 if dtype == types.float64 else LANES32) // (\n"
                  "            1 if 'avx512f' in __import__('normkernels.kernels.target', "
                  "fromlist=['t']).jit_target().found else 2)\n")], PORTABLE),
    mutation("no-rescale/lp", "LpNormalization: no rescaling of overflowed or underflowed "
             "float64 sums", [(LP_K, "    if total > HUGE or total < TINY:",
                               "    if total != total:")], LP),
    mutation("window-symmetric/lrn", "LRN's window one channel short above c for even size "
             "(torch's mirrored window)", [
                 (LRN_K, "    below, above = (size - 1) // 2, size // 2\n    for c in range(C):",
                  "    below, above = size // 2, (size - 1) // 2\n    for c in range(C):")],
             LRN),
    mutation("alpha-not-over-size/lrn", "LRN divides alpha by the channels in the window's "
             "reach, not by size", [
                 (ENGINE, "args = (window, float(alpha) / int(size),",
                  "args = (window, float(alpha) / window,")], LRN),
    # activation epilogues; onnxruntime's GroupNorm and SkipGroupNorm
    mutation("plan-key-without-activation/layer", "LayerNormalization's plan key leaves out "
             "the activation (a SiLU call served by the plain call's plan)", [
                 ("normkernels/ops/layer_normalization.py", "num_outputs, activation,",
                  "num_outputs,")], ["tests/test_plans.py", "-k", "activation"]),
    mutation("plan-key-without-activation/rms", "RMSNormalization's plan key leaves out the "
             "activation", [
                 ("normkernels/ops/rms_normalization.py",
                  "(opset, axis, epsilon, stash_type, rounding, offset, activation)",
                  "(opset, axis, epsilon, stash_type, rounding, offset)")],
             ["tests/test_plans.py", "-k", "activation"]),
    mutation("plan-key-without-activation/groupnorm", "GroupNormalization's plan key leaves "
             "out the activation", [
                 ("normkernels/ops/group_normalization.py", "num_groups, data_format, activation,",
                  "num_groups, data_format,")], ["tests/test_plans.py", "-k", "activation"]),
    mutation("plan-key-without-activation/ort-groupnorm", "GroupNorm's (com.microsoft) plan key "
             "leaves out the activation", [
                 ("normkernels/ops/ort_group_norm.py", "(label, engine, groups, activation, ",
                  "(label, engine, groups, ")], ["tests/test_plans.py", "-k", "activation"]),
    mutation("row-plan-drops-activation", "a row plan runs its calls without their activation", [
                 ("normkernels/ops/rows.py", '        if self.act is not None:\n'
                  '            extra["act"] = self.act\n', "")],
             ["tests/test_plans.py", "-k", "activation"]),
    mutation("bound-rows-drop-activation", "a bound row call runs without the activation", [
                 ("normkernels/engine/numba_bind.py",
                  "act = marker(NONE if act is None else act, rounding)",
                  "act = marker(NONE, rounding)")], ["tests/test_plans.py", "-k", "activation"]),
    mutation("silu-sigmoid-branches-swapped/activations", "SiLU takes (y e) / (1 + e) for "
             "positive y (the one division's branches swapped)", [
                 (ACTIVATIONS, "builder.select(above, y, builder.fmul(y, e))",
                  "builder.select(above, builder.fmul(y, e), y)")], ORT_GN),
    mutation("sigmoid-branches-swapped/activations", "sigmoid (the slopes' and the gated "
             "backward's) takes e / (1 + e) for positive z", [
                 (ACTIVATIONS, "builder.select(above, constant(z.type, 1.0), e)",
                  "builder.select(above, e, constant(z.type, 1.0))")],
             ["tests/test_epilogue_backward.py", "tests/test_gated.py"]),
    mutation("exp-polynomial-coefficient/activations", "float32 exp: the r^2 coefficient "
             "0.49999994 replaced by 0.5 - 2^-12", [
                 (ACTIVATIONS, "poly=(0.4999999403953552,", "poly=(0.49975585938,")], ORT_GN),
    mutation("exp-estrin-pair-swapped/activations", "float32 exp: Estrin's second pair "
             "takes c5 + c4 r (its coefficients swapped)", [
                 (ACTIVATIONS, "builder.fadd(c4, builder.fmul(c5, r))",
                  "builder.fadd(c5, builder.fmul(c4, r))")], ORT_GN),
    mutation("exp-offset-dropped/activations", "exp's rounding constant without the offset K: "
             "every result 2^-K too small", [
                 (ACTIVATIONS, 'magic = constant(ty, k_["magic"] + k_["offset"])',
                  'magic = constant(ty, k_["magic"])')], ORT_GN),
    mutation("exp-reduced-offset-dropped/activations", "exact GELU's exponential scaled by "
             "2^k without the offset K (erfc's branch 2^-K too small)", [
                 (ACTIVATIONS, 'shifted = builder.add(builder.fptosi(k, ity), '
                  'constant(ity, k_["offset"]))', 'shifted = builder.fptosi(k, ity)')],
             ["tests/test_gelu.py"]),
    mutation("silu-twin-rounds-twice/twin", "the twin's SiLU as z * sigmoid(z) (two "
             "roundings, not the kernels' one division)", [
                 ("normkernels/reference/gated.py",
                  "return np.where(above, z, z * e) / denominator",
                  "return z * (np.where(above, z.dtype.type(1.0), e) / denominator)")],
             ["tests/test_gated.py", "-k", "silu_twin"]),
    mutation("exp-floor-raised/activations", "float32 exp clamps its argument at -80, "
             "not -104 (SiLU of -90 comes out 8 orders of magnitude off)", [
                 (ACTIVATIONS, "_F32_EXP = dict(low=-104.0,", "_F32_EXP = dict(low=-80.0,")],
             ORT_GN),
    mutation("vector-activation-dropped/activations", "the vector bodies skip the "
             "activation (the scalar heads and tails apply it)", [
                 (VECTORS, "        yv = activations.build(builder, sig.args[-1].kind, yv)\n",
                  "")], ORT_GN),
    mutation("scalar-activation-dropped/activations", "the scalar heads and tails skip "
             "the activation", [
                 (SCALE_SHIFT, "store(y, i, activate(act, with_residual(res, i, (load(x, i) - m) "
                  "* a + b)))", "store(y, i, with_residual(res, i, (load(x, i) - m) * a + b))")],
             ORT_GN),
    mutation("vector-residual-dropped/epilogues", "the vector bodies leave out add=", [
                 (VECTORS, "            yv = builder.fadd(yv, rv if widen is None else "
                  "widen(builder, rv, lanes))\n", "")], ORT_GN),
    mutation("scalar-residual-dropped/epilogues", "the scalar loops leave out add=", [
                 (ACTIVATIONS, "    if isinstance(res, types.NoneType):\n        return value(res, "
                  "i, value), lambda", "    if True:\n        return value(res, i, value), "
                  "lambda")], ORT_GN),
    mutation("channels-last-inverted/ort-groupnorm", "channels_last=1 read as channels "
             "first", [(ORT_GN_SPEC, 'return eps, ACTIVATIONS[silu], "NXC" if last else "NCX"',
                        'return eps, ACTIVATIONS[silu], "NCX" if last else "NXC"')], ORT_GN),
    mutation("skip-bias-dropped/ort-groupnorm", "SkipGroupNorm's NHWC skip add leaves out "
             "the bias", [(SKIP_SUMS_K, "(row_load(x, i) + row_load(skip, i)) + bias[i])",
                           "(row_load(x, i) + row_load(skip, i)))")], ORT_GN),
    mutation("skip-per-sample-index/ort-groupnorm", "a per-(n, c) skip of NHWC X taken per "
             "row instead of per sample", [
                 (ORT_GN_SPEC, "        rows_per_skip = 1 if kind == \"full\" else spatial",
                  "        rows_per_skip = 1")], ORT_GN),
    mutation("scale-without-one/ada-layer-norm", "AdaLN multiplies by scale, not 1 + scale",
             [(ADA_SPEC, "        s_all = 1.0 + tables[\"scale\"]",
               "        s_all = tables[\"scale\"]")], ADA),
    mutation("zero-shift-positive/ada-layer-norm", "a zero shift adds +0.0 (AdaLN-Zero is "
             "then not LayerNorm bit for bit)", [
                 (ADA_SPEC, "b_all = np.where(tables[\"shift\"] == 0, -0.0, tables[\"shift\"])",
                  "b_all = tables[\"shift\"] + 0.0")], ADA),
    mutation("gate-ignored/ada-layer-norm", "the gated residual adds X ungated", [
                 (ADA_SPEC, "gate_t = tables.get(\"gate\", np.ones((N, C)))",
                  "gate_t = np.ones((N, C))")], ADA),
    mutation("per-sample-params-as-channels/ada-group-norm", "NCX planes take the channel's "
             "parameters (p % C) where they are per (n, c)", [
                 (ENGINE, "        per = n_planes if scale.size == n_planes else C\n",
                  "        per = C\n")], ADA),
    mutation("sample-slice-dropped/ada-group-norm", "channels-last samples run one by one "
             "all take sample 0's parameters", [
                 (ENGINE, "                sample = params if scale.size == C else (params[0][cs], "
                  "params[1][cs],", "                sample = params if True else (params[0][cs], "
                  "params[1][cs],")], ADA),
    # BatchNorm folded into Conv/Gemm weights
    mutation("epsilon-dropped/fold", "fold_batch_norm folds a = scale / sqrt(var)", [
        (FOLD_SPEC, 'a = p64["scale"] / np.sqrt(shifted)',
         'a = p64["scale"] / np.sqrt(p64["var"])')], FOLD_BN),
    mutation("bias-not-scaled/fold", "fold_batch_norm adds the layer's bias unscaled: "
             "bias' = bias + b, not bias * a + b", [
                 (FOLD_SPEC, "fused_bias = given * a + b", "fused_bias = given + b")], FOLD_BN),
    mutation("bf16-double-rounding/fold", "fold_batch_norm casts its float64 results with "
             "astype (ml_dtypes rounds float64 to bfloat16 twice, through float32)", [
                 (FOLD_SPEC, "return round_once(fused_weight, W.dtype), round_once(fused_bias, "
                  "W.dtype)", "return fused_weight.astype(W.dtype), fused_bias.astype(W.dtype)")],
             FOLD_BN),
    # backward passes
    mutation("projection-without-r/backward", "the x_hat projection of dX misses a factor r", [
        (BWD_DX, "bg = -rg * rg * rg * g2 / M[g]", "bg = -rg * rg * g2 / M[g]")], BACKWARD),
    mutation("mean-residual-dropped/backward", "dX rounds the float64 mean and drops its "
             "residual", [(BWD_DX, "kp = kg + (bg * (rounded - mean) if np.isfinite(rounded) "
                           "else 0.0)", "kp = kg")], BACKWARD),
    mutation("rows-channel-of-column/backward", "the rows reduction assigns column j to "
             "channel j % C, not (j // S) % C", [
                 (BWD_SUMS, "        c = (j // S) % C\n", "        c = j % C\n")], BACKWARD),
    mutation("row-mean-of-g-dropped/backward", "LayerNorm backward leaves out <g> (as "
             "RMSNorm's)", [(BWD_DX, "    mg = sg / K if centered else 0.0",
                             "    mg = 0.0")], BACKWARD),
    mutation("row-vector-dgamma/backward", "the row backward's vector lanes add dY, not "
             "dY * x_hat, into dscale", [(BWD_DX, "load_lanes(dgamma, j, mean) + dyv * xh)",
                                          "load_lanes(dgamma, j, mean) + dyv)")], BACKWARD),
    mutation("given-r-recomputed/backward", "the row backward recomputes r although the "
             "caller gave inv_std", [(BWD_DX, "    if not given:\n        r = 1.0 / np.sqrt",
                                      "    if True:\n        r = 1.0 / np.sqrt")], BACKWARD),
    mutation("given-group-stats-ignored/backward", "the group backward recomputes the "
             "statistics although the caller gave them", [
                 (BWD_SPEC, "        if given is not None:  # the caller's",
                  "        if False:  # the caller's")], BACKWARD),
    mutation("chunk-shift-dropped/backward", "the fused group reduction adds each chunk's "
             "sums around the chunk's mean as if around the group's", [
                 (BWD_SUMS, "t2 += part2[k] - (mu - part_mean[k]) * part1[k]",
                  "t2 += part2[k]")], BACKWARD),
    mutation("row-block-shift-dropped/backward", "the fused channels-last reduction adds "
             "each block's sums around the block's column mean as if around the group's", [
                 (BWD_SUMS, "t2 += part2[blk, j] - (mu - part_mean[blk, j]) * part1[blk, j]",
                  "t2 += part2[blk, j]")], BACKWARD),
    mutation("stream-grad-no-k/backward", "the streaming dX vectors leave out K", [
        ("normkernels/kernels/vectors.py",
         "        yv = builder.fadd(builder.fadd(builder.fmul(dv, a),\n"
         "                                       builder.fmul(builder.fsub(xv, m), b)), k)",
         "        yv = builder.fadd(builder.fmul(dv, a), builder.fmul(builder.fsub(xv, m), b))")],
             BACKWARD),
    mutation("onednn-momentum-onnx/backward", "oneDNN's BatchNormForwardTraining defaults "
             "to ONNX's momentum 0.9, not the dnnl backend's 0.5", [
                 ("normkernels/ops/onednn_training.py", "MOMENTUM = 0.5", "MOMENTUM = 0.9")],
             BACKWARD),
    # state shared between calls: only concurrent calls on different data show it (the
    # table battery's threads test; the other thread tests run one input at a time)
    mutation("scratch-shared/rows-backward", "the row backward's column partials in one "
             "buffer per shape, shared by concurrent calls", [
                 (ENGINE, "        part_g, part_b = np.empty((items, K)), np.empty((items, K))\n",
                  "        part_g, part_b = self.__dict__.setdefault(\n"
                  "            (\"rows_backward\", items, K), (np.empty((items, K)), "
                  "np.empty((items, K))))\n")], TABLE_THREADS),
    mutation("scratch-shared/grad-sums", "the per-channel gradient sums (BN backward; "
             "instance and group backward of short planes) in one buffer per C, shared by "
             "concurrent calls", [
                 (GRADIENTS, "    total1, total2 = np.empty(C), np.empty(C)\n",
                  "    total1, total2 = _SHARED.setdefault((route, C), "
                  "(np.empty(C), np.empty(C)))\n"),
                 (GRADIENTS, "\ndef grad_sums(", "\n_SHARED = {}\n\n\ndef grad_sums(")],
             TABLE_THREADS),
    mutation("scratch-shared/group-grad-sums", "the fused instance and group backward "
             "reduction's partials in one set of buffers per shape, shared by concurrent "
             "calls", [
                 (ENGINE, "        parts = [np.empty(shape) for _ in range(4)]\n",
                  "        parts = self.__dict__.setdefault((\"group_grad_sums\", shape),\n"
                  "                                         [np.empty(shape) for _ in "
                  "range(4)])\n")], TABLE_THREADS),
    mutation("error-names-nothing", "a wrong parameter length is reported without naming "
             "the parameter", [
                 (COMMON, 'raise ValueError(f"{op}: {name} must have shape ({C},) to match',
                  'raise ValueError(f"{op}: parameter must have shape ({C},) to match')],
             ["tests/test_hostile.py"]),
    # backward passes through the epilogues; AdaGroupNorm's and AdaLN's
    mutation("silu-derivative/epilogue-backward", "silu'(z) taken as s (1 + z s), not "
             "s (1 + z (1 - s))", [
                 (ACT_GRAD_K, "builder.fmul(s, builder.fadd(one, builder.fmul(z, "
                  "builder.fsub(one, s))))", "builder.fmul(s, builder.fadd(one, "
                  "builder.fmul(z, s)))")], EPI_BWD),
    mutation("gelu-tanh-slope/epilogue-backward", "gelu_tanh' drops the 3 of the cube's "
             "derivative", [(ACT_GRAD_K, "constant(ty, 3.0 * b)",
                             "constant(ty, b)")], EPI_BWD),
    mutation("gelu-density/epilogue-backward", "gelu' takes phi(z) as exp(-z^2 / 2) / "
             "sqrt(pi), not / sqrt(2 pi)", [
                 (ACT_GRAD_K, "constant(ty, 1.0 / math.sqrt(2.0 * math.pi))",
                  "constant(ty, 1.0 / math.sqrt(math.pi))")], EPI_BWD),
    mutation("relu-mask-at-zero/epilogue-backward", "the ReLU mask passes dY where Y is 0",
             [(ACT_GRAD_K, "            if load(y, i) > 0:", "            if load(y, i) >= 0:")],
             EPI_BWD),
    mutation("residual-gradient-is-dy/epilogue-backward", "diff_src_1 (the residual's "
             "gradient), kept by the fused reduction, written as dY, not dY * act'(Z)", [
                 (EPI_GRAD_K, "kept = dz if narrow is None else narrow(builder, dz, "
                  "lanes.count)", 'kept = loaded("dy") if narrow is None else narrow(builder, '
                  'loaded("dy"), lanes.count)')], EPI_BWD),
    mutation("residual-left-out-of-z/epilogue-backward", "Z recomputed in the lanes without "
             "the residual", [(EPI_GRAD_K, '    if has_res:\n        z = builder.fadd(z, '
                               'loaded("res"))\n', "")], EPI_BWD),
    mutation("mask-at-zero/fused-epilogue-backward", "the fused passes' ReLU mask from Y "
             "passes dY where Y is 0", [
                 (EPI_GRAD_K, 'builder.select(builder.fcmp_ordered(">", loaded("mask"), zero)',
                  'builder.select(builder.fcmp_ordered(">=", loaded("mask"), zero)')],
             FUSED_BWD),
    mutation("tail-dropped/fused-epilogue-backward", "the fused reduction leaves out a "
             "chunk's tail (the elements past its last whole lane vector)", [
                 (EPI_GRAD_K, "    if body < n:\n        dz = np.empty", "    if False:\n"
                  "        dz = np.empty")], FUSED_BWD),
    mutation("last-chunk-dropped/fused-epilogue-backward", "the fused reduction's loop over "
             "plane chunks leaves out the last", [
                 (EPI_GRAD_K, "    for item in prange(part1.size):\n        p = item // "
                  "chunks", "    for item in prange(part1.size - 1):\n        p = item // "
                  "chunks")], FUSED_BWD),
    mutation("rows-dz-not-kept/fused-epilogue-backward", "the fused rows reduction does not "
             "write dZ where it keeps it (dR)", [
                 (EPI_GRAD_K, "        copy_into(residual_slice(out, lo, lo + width), row)\n",
                  "")], FUSED_BWD),
    mutation("segment-channel/fused-epilogue-backward", "the fused dX pass takes a plane "
             "segment's channel from the element index, not the plane's", [
                 (EPI_GRAD_K, "        end = min(hi, (pos // S + 1) * S)\n        c = (pos // S) "
                  "% C\n        _segment", "        end = min(hi, (pos // S + 1) * S)\n"
                  "        c = pos % C\n        _segment")], FUSED_BWD),
    mutation("vector-dr-dropped/fused-epilogue-backward", "the fused dX pass's vectors do "
             "not write dR (16-bit X under a smooth activation)", [
                 (EPI_GRAD_K, "                store_vector(context, builder, dres, args[6], i, "
                  "dz, False)\n", "                pass\n")], FUSED_BWD),
    mutation("epilogue-routes/fused-sums-path-ignored", "the fused reduction ignores path= "
             "(forced parallel runs the serial kernel)", [
                 (GRADIENTS, '    path = "serial" if policy.resolve_path(xs, path) == "serial" '
                  'else "parallel"\n    with launch_guard(path):\n        if backward_sums.'
                  'sums_by_planes(C, S, xs.size // (C * S)):\n            took(route,',
                  '    path = "serial" if route == "epilogue_sums" or policy.resolve_path('
                  'xs, path) == "serial" else "parallel"\n    with launch_guard(path):\n'
                  '        if backward_sums.sums_by_planes(C, S, xs.size // (C * S)):\n'
                  '            took(route,')],
             ["tests/test_paths.py", "-k", "relu-planes-grad and not serial"]),
    mutation("sample-gamma/ada-group-norm-backward", "channels-last samples all take sample "
             "0's 1 + scale", [(BWD_SPEC, "            gamma = gammas[i]",
                                "            gamma = gammas[0]")], EPI_BWD),
    mutation("ungated-dx/ada-layer-norm-backward", "dX of the gated residual leaves out the "
             "gate", [(SKIP_SUMS_K, "store(dx, i, gate[i] * total)", "store(dx, i, total)")],
             EPI_BWD),
    mutation("stream-gradient-dropped/ada-layer-norm-backward", "the gradient reaching S "
             "from later layers (dS) left out of the residual stream's", [
                 (SKIP_SUMS_K, "total = with_residual(ds, i, dln[i])", "total = dln[i]")],
             EPI_BWD),
    # exact GELU (normkernels/kernels/erf.py)
    mutation("gelu-rounded-square/erf", "erfc's exp(-x^2) of a rounded x^2 (t * t, not the "
             "split th * th + tl (t + th)): an error growing as x^2", [
                 ("normkernels/kernels/erf.py", "    a = builder.fmul(builder.fmul(th, th), "
                  "k_(-0.5))  # exact\n    m = builder.fmul(builder.fmul(tl, builder.fadd(t, "
                  "th)), k_(0.5))\n", "    a = builder.fmul(builder.fmul(t, t), k_(-0.5))\n"
                  "    m = zero\n")], ["tests/test_gelu.py"]),
    mutation("gelu-coefficient/erf", "fdlibm's pa1 (erf on [0.84375, 1.25]) with its tenth "
             "digit wrong (2.4e-10 relative)", [
                 ("normkernels/kernels/erf.py", "4.14856118683748331666e-01",
                  "4.14856118583748331666e-01")], ["tests/test_gelu.py"]),
    mutation("gelu-nan-clamped/erf", "NaN and -inf clamped like a large |y| (gelu(NaN) "
             "and gelu(-inf) come out -0.0)", [
                 ("normkernels/kernels/erf.py", "    return builder.select(inside, result, "
                  "builder.fmul(y, step))\n", "    return result\n")], ["tests/test_gelu.py"]),
    # the operator table's per-sample modulation (records ada-layernorm, ada-groupnorm)
    mutation("per-sample-gain-on-dy/operator-formulas", "the float64 formula of a per-sample "
             "backward adds the modulation's 1 to dY, not to the scale", [
                 ("normkernels/operators/record.py", "k = int(mode == BACKWARD)", "k = 0")],
             ["tests/test_table.py", "-k", "every_path and ada and backward"]),
    mutation("ada-shift-scale-swapped/operator-table", "ada-layernorm's record passes the "
             "table's scale as shift and its shift as scale", [
                 (TABLE, 'signature={"inference": ("X", "B", "scale"), '
                  '"backward": ("dY", "X", "B", "scale")},\n             '
                  'warmup=_ADA_ROWS_WARMUP),', 'signature={"inference": ("X", "scale", "B"), '
                  '"backward": ("dY", "X", "scale", "B")},\n             '
                  'warmup=_ADA_ROWS_WARMUP),')],
             ["tests/test_table.py", "-k", "every_path and ada-layernorm"]),
    # activation= and add= on the row normalizations
    mutation("vector-residual-dropped/rows-epilogue", "the row vectors leave out add= (the "
             "scalar heads and tails add it)", [
                 (ROW_VECTORS, "                y32 = builder.fadd(y32, res)\n",
                  "                pass\n")],
             EPI_ROWS),
    mutation("scalar-activation-dropped/rows-epilogue", "the row kernels' scalar heads and "
             "tails skip the activation", [
                 (ROWS_K, "store(y, yo + i, _activated(y, act, with_residual(res, ro + i, v)))",
                  "store(y, yo + i, with_residual(res, ro + i, v))")],
             ["tests/test_layer_norm_epilogue.py", "-k", "matches_oracle"]),
    mutation("residual-row-stride/rows-epilogue", "the fused rows read the residual at Y's "
             "row stride, not its own", [
                 (ROWS_K, "                      r * rr, res, act)",
                  "                      r * yr, res, act)")], EPI_ROWS),
    # issue 32's routes (gated_rms, gated_rms_backward, qk_norm, quantized_rows): the
    # path choice, the backward's work items, and each parallel loop's (and its twin's)
    # last, short item (test_paths: 19 rows, 2 an item)
    mutation("routes32/fork-rule-dropped", "issue 32's kernels take a forced parallel path "
             "as given (a child forked after GNU OpenMP launches parallel kernels)", [
                 ("normkernels/engine/numba_gated.py", "    path = policy.loop_path(arr, path)\n",
                  '    path = path if path == "parallel" else policy.loop_path(arr, path)\n')],
             ["tests/test_paths.py", "-k", "forked and (gated or qk or quant)"]),
    mutation("routes32/streaming-not-mapped", "the loops without a streaming kernel report "
             "(and compare against) a streaming path", [
                 (POLICY, '    return "serial" if resolve_path(arr, path, arrays=arrays) == '
                  '"serial" else "parallel"', "    return resolve_path(arr, path, arrays=arrays)")],
             ["tests/test_paths.py", "-k", "streaming and (gated or qk or quant)"]),
    mutation("routes32/gated-backward-items-by-threads", "the gated backward's work items "
             "by the thread count (policy.rows_per_item), not the shape: the bits of dweight "
             "and dbias depend on the machine", [
                 ("normkernels/engine/numba_gated.py", "        per_item = "
                  "gated_kernels.rows_per_item(K)  # the shape's: it orders the sums",
                  "        per_item = policy.rows_per_item(M, K)")],
             ["tests/test_paths.py", "-k", "gated-grad and twin"]),
    mutation("routes32/gated-last-item-dropped", "the gated forward's loop over items leaves "
             "out the last, short one", [
                 (GATED, "    for item in prange((M + per_item - 1) // per_item):\n"
                  "        first = item * per_item\n        _forward_item(",
                  "    for item in prange(M // per_item):\n"
                  "        first = item * per_item\n        _forward_item(")],
             ["tests/test_paths.py", "-k", "gated and oracle and not grad"]),
    mutation("routes32/qk-last-item-dropped", "QK-norm's loop over items leaves out the last, "
             "short one", [
                 (QK, "    for item in prange((M + per_item - 1) // per_item):",
                  "    for item in prange(M // per_item):")],
             ["tests/test_paths.py", "-k", "qk and oracle"]),
    mutation("routes32/quantized-last-item-dropped", "the quantized rows' loop over items "
             "leaves out the last, short one", [
                 (QUANT_K, "    for item in prange((M + rows_per_item - 1) // rows_per_item):",
                  "    for item in prange(M // rows_per_item):")],
             ["tests/test_paths.py", "-k", "quant and oracle"]),
    # the epilogues' gradient routes (activation_grad, relu_mask, gated_backward): a
    # forced path ignored (the parallel route never taken), and each loop's (and its
    # one-thread twin's) last item left out (test_paths' serial cases)
    mutation("epilogue-routes/activation-grad-path-ignored", "the activation gradient "
             "ignores path= (forced parallel runs the serial kernel)", [
                 (GRADIENTS, "dys, path, z.reshape(-1)", "dys, None, z.reshape(-1)")],
             ["tests/test_paths.py", "-k", "act-eval and not serial and oracle"]),
    mutation("epilogue-routes/activation-grad-last-item-dropped", "the activation "
             "gradient's loop over items leaves out the last, short one (all of a call "
             "under 64K elements)", [
                 (ACT_GRAD_K, "    n = z.size\n    for item in prange((n + ITEM_ELEMENTS - 1) "
                  "// ITEM_ELEMENTS):", "    n = z.size\n    for item in prange(n // "
                  "ITEM_ELEMENTS):")],
             ["tests/test_paths.py", "-k", "act-eval-serial and oracle"]),
    mutation("epilogue-routes/relu-mask-path-ignored", "ReLU's mask ignores path= (forced "
             "parallel runs the serial kernel)", [
                 (GRADIENTS, "dys,\n               path, ys, dys, dzs)",
                  "dys,\n               None, ys, dys, dzs)")],
             ["tests/test_paths.py", "-k", "relu-eval and not serial and oracle"]),
    mutation("epilogue-routes/relu-mask-last-item-dropped", "ReLU's mask's loop over items "
             "leaves out the last, short one", [
                 (ACT_GRAD_K, "    n = y.size\n    for item in prange((n + ITEM_ELEMENTS - 1) "
                  "// ITEM_ELEMENTS):", "    n = y.size\n    for item in prange(n // "
                  "ITEM_ELEMENTS):")],
             ["tests/test_paths.py", "-k", "relu-eval-serial and oracle"]),
    mutation("epilogue-routes/gated-backward-path-ignored", "AdaLN's gated backward "
             "ignores path= (forced parallel runs the serial kernel)", [
                 (GRADIENTS, "xs, path, dln.reshape(-1)", "xs, None, dln.reshape(-1)")],
             ["tests/test_paths.py", "-k", "ada-grad and not serial and oracle"]),
    mutation("epilogue-routes/gated-backward-last-sample-dropped", "AdaLN's gated "
             "backward's loop over samples leaves out the last", [
                 (SKIP_SUMS_K, "    for k in prange(M // rows_per_gate):",
                  "    for k in prange(M // rows_per_gate - 1):")],
             ["tests/test_paths.py", "-k", "ada-grad-serial and oracle"]),
    # the table-free serial rows, the bound entry point, the table's records
    mutation("table-free/any-row-count", "plain rows take the table-free kernel at any "
             "row count (the tables' route is never taken on one thread)", [
                 ("normkernels/engine/numba_launch.py",
                  "    return (x.shape[0] <= TABLE_FREE_ROWS and skip is None",
                  "    return (skip is None")],
             ["tests/test_paths.py", "-k", "fused-serial"]),
    mutation("table-free/epilogue-dropped", "a row normalization with an activation "
             "epilogue takes the table-free kernel (which has none)", [
                 ("normkernels/engine/numba_launch.py",
                  "            and y.dtype == x.dtype and marker(act).kind == \"none\")",
                  "            and y.dtype == x.dtype)")],
             EPI_ROWS),
    mutation("table-free/llama-dropped", "the table-free kernel rounds once under Llama's "
             "rounding", [
                 (ENGINE, "            kernel(xs, xr, ys, yr, K, s, b, epsilon, rounding == "
                  "\"llama\", mean, var)",
                  "            kernel(xs, xr, ys, yr, K, s, b, epsilon, False, mean, var)")],
             ["tests/test_llm_rows.py", "-k", "llama or rounding"]),
    mutation("table-free/statistics-of-first-row", "the table-free kernel normalizes every "
             "row with the first row's statistics", [
                 (FUSED_ADD, "        mean[row], var[row] = row_statistics(x, row * xr, K, "
                  "centered)",
                  "        mean[row], var[row] = row_statistics(x, 0, K, centered)")],
             ["tests/test_paths.py", "-k", "table-free"]),
    mutation("cache/save-unlocked", "a cache entry is saved without the lock on its index "
             "(concurrent processes lose entries or share data files)", [
                 (CACHE, "        if not ours(self):\n            return numba_save(self, key, "
                  "data)", "        if True:\n            return numba_save(self, key, data)")],
             ["tests/test_compile_cost.py", "-k", "concurrent"]),
    mutation("cache/load-refreshes", "a load from the disk cache refreshes the target context "
             "(every registry imported: a third of a warm first call)", [
                 (CACHE, "        rtsys.initialize(target_context)\n",
                  "        target_context.refresh()\n")],
             ["tests/test_compile_cost.py", "-k", "cached_load"]),
    mutation("backward-sums/slice-assigned", "the row partials are stored by a slice "
             "assignment from an array again (compiles Numba's shape-error formatting: "
             "seconds of a first call)", [
                 (BWD_SUMS, "m[j])\n        put_partials(part1, blk, j0, s1)\n"
                  "        put_partials(part2, blk, j0, s2)\n",
                  "m[j])\n        part1[blk, j0:j1] = s1\n        part2[blk, j0:j1] = s2\n")],
             ["tests/test_compile_cost.py", "-k", "error_message"]),
    mutation("inliner/overloads-compiled", "an inline=\"always\" overload's implementation "
             "is compiled whole again, besides being inlined as typed IR", [
                 ("normkernels/kernels/inlining.py",
                  "                dispatcher._can_compile = False\n", "                pass\n")],
             ["tests/test_compile_cost.py", "-k", "inlined_overload"]),
    mutation("torch/rms-eps-16-bit", "rms_norm's eps=None on 16-bit input is the 16-bit "
             "dtype's epsilon, not float32's (torch's computation type)", [
                 ("normkernels/torch/functional.py",
                  "        wide = input.dtype in (torch.float16, torch.bfloat16)\n",
                  "        wide = False\n")],
             ["tests/test_torch.py", "-k", "default_epsilon"]),
    mutation("torch/instance-one-element", "instance_norm of one spatial element returns "
             "zeros where torch raises", [
                 ("normkernels/torch/functional.py",
                  "    if math.prod(input.shape[2:]) == 1:", "    if False:")],
             ["tests/test_torch.py", "-k", "errors_name"]),
    mutation("torch/bn-mixed-to-torch", "BatchNorm modules with float32 parameters on "
             "16-bit input run torch's forward (its strided path rounds the gradients)", [
                 ("normkernels/torch/modules.py", "                mixed=True)",
                  "                mixed=False)")],
             ["tests/test_torch.py", "-k", "float32_parameters"]),
    mutation("torch/swap-subclasses", "replace_modules swaps any subclass of a registered "
             "class (a subclass may override forward)", [
                 ("normkernels/torch/modules.py", "        ours = SWAPS.get(cls)\n",
                  "        ours = next((o for c, o in SWAPS.items() if isinstance(module, c)), "
                  "None)\n")],
             ["tests/test_torch.py", "-k", "register_swap"]),
    mutation("zoo/llama-rounds-once", "transformers' Llama RMSNorm swapped for a forward "
             "that rounds once (not weight * x_hat.to(dtype))", [
                 (ZOO, '        y = _rms(hidden_states, self.weight, self.variance_epsilon, '
                  '"llama")\n        return super().forward(hidden_states) if y is None else y\n'
                  '\n\nclass _T5LayerNorm:',
                  '        y = _rms(hidden_states, self.weight, self.variance_epsilon, '
                  '"once")\n        return super().forward(hidden_states) if y is None else y\n'
                  '\n\nclass _T5LayerNorm:')],
             ["tests/test_torch_zoo.py", "-k", "match_their_forward and llama-bfloat16"]),
    mutation("zoo/gemma-offset-dropped", "Gemma's 1 + weight computed as weight", [
                 (ZOO, "        y = _rms(x, self.weight, self.eps, offset=1.0)",
                  "        y = _rms(x, self.weight, self.eps, offset=0.0)")],
             ["tests/test_torch_zoo.py", "-k", "match_their_forward and gemma-float32"]),
    mutation("zoo/float64-computed", "a float64 input to a class that computes in float32 "
             "is computed in float64", [
                 (ZOO, "_FLOAT32_COMPUTED = (torch.float16, torch.bfloat16, torch.float32)",
                  "_FLOAT32_COMPUTED = (torch.float16, torch.bfloat16, torch.float32, "
                  "torch.float64)")],
             ["tests/test_torch_zoo.py", "-k", "float64_and_foreign"]),
    mutation("zoo/inherited-forward", "a subclass that inherits a zoo class's forward is "
             "recognized by it (it may change what the forward calls)", [
                 (ZOO, '    if "forward" not in cls.__dict__:\n        return None\n', ""),
                 (ZOO, "        fn = cls.__dict__.get(name)",
                  "        fn = getattr(cls, name, None)")],
             ["tests/test_torch_zoo.py", "-k", "digests_recognize"]),
    mutation("zoo/outside-the-zoos", "a user's class with a zoo's code is swapped", [
                 (ZOO, "    if cls.__module__.startswith(ZOOS):", "    if True:")],
             ["tests/test_torch_zoo.py", "-k", "digests_recognize"]),
    mutation("modulated/shift-scale-swapped", "diffusers' AdaLayerNormZero modulates with "
             "its shift as the scale", [
                 (MODULATED, "        y = ada_layer_norm(self.norm, x, shift_msa, scale_msa)\n"
                  "        if y is None:\n            y = self.norm(x) * (1 + scale_msa[:, None]) "
                  "+ shift_msa[:, None]\n        return y, gate_msa, shift_mlp",
                  "        y = ada_layer_norm(self.norm, x, scale_msa, shift_msa)\n"
                  "        if y is None:\n            y = self.norm(x) * (1 + scale_msa[:, None]) "
                  "+ shift_msa[:, None]\n        return y, gate_msa, shift_mlp")],
             ["tests/test_torch_modulated.py", "-k", "one_pass and zero-dtype2"]),
    mutation("modulated/default-eps", "the fused AdaLayerNorm ignores its norm's eps", [
                 (MODULATED, "        return norm.eps\n", "        return 1e-5\n")],
             ["tests/test_torch_modulated.py", "-k", "one_pass and zero-single-dtype2"]),
    mutation("modulated/affine-norm-fused", "a norm with its own weight and bias is fused "
             "without them", [
                 (MODULATED, "norm.weight is None and norm.bias is None", "True")],
             ["tests/test_torch_modulated.py", "-k", "own_affine"]),
    mutation("modulated/group-order", "AdaGroupNorm's chunks taken as (shift, scale)", [
                 (MODULATED, "            scale, shift = emb.chunk(2, dim=1)\n            y = ",
                  "            shift, scale = emb.chunk(2, dim=1)\n            y = ")],
             ["tests/test_torch_modulated.py", "-k", "one_pass and group-dtype2"]),
    mutation("modulated/grad-fused", "a call that wants a gradient runs the one pass (no "
             "gradient flows)", [
                 (MODULATED, "eager.route(x, *params) == eager.PLAIN", "True")],
             ["tests/test_torch_modulated.py", "-k", "gradients_and_other"]),
    mutation("zoo/frozen-eps", "DETR's FrozenBatchNorm2d with BatchNorm2d's eps taken as "
             "1e-3", [
                 (ZOO, "                            False, 0.0, 1e-5)",
                  "                            False, 0.0, 1e-3)")],
             ["tests/test_torch_zoo.py", "-k", "frozen and float32"]),
    mutation("zoo/frozen-promotion", "FrozenBatchNorm2d of bfloat16 x with float32 buffers "
             "computed by normkernels (torch promotes to float32)", [
                 (ZOO, "x.shape[1] != self.weight.shape[0] or not modules.ours(",
                  "x.shape[1] != self.weight.shape[0] or not modules.ours_batch_norm(self, x) "
                  "and modules.ours(")],
             ["tests/test_torch_zoo.py", "-k", "frozen and float32"]),
    mutation("zoo/unregister-ignored", "unregister_swap does not stop the zoo's finder", [
                 ("normkernels/torch/modules.py",
                  "        if ours is None and cls not in _DECLINED:",
                  "        if ours is None:")],
             ["tests/test_torch_zoo.py", "-k", "unregister"]),
    mutation("direct/llama-dropped", "the adapter's direct route rounds once under Llama's "
             "rounding", [
                 ("normkernels/engine/numba_bind.py", '        llama = rounding == "llama"\n',
                  "        llama = False\n")],
             ["tests/test_torch.py", "-k", "direct_route"]),
    mutation("direct/backward-statistics-without-eps", "the direct route's saved inverse "
             "standard deviation leaves out epsilon", [
                 ("normkernels/torch/direct.py",
                  "        np.divide(1.0, np.sqrt(stats[1] + eps), out=stats[1])",
                  "        np.divide(1.0, np.sqrt(stats[1]), out=stats[1])")],
             ["tests/test_torch_direct.py"]),
    mutation("serving/rms-rounds-once", "vLLM's rms_norm operator rounds once", [
                 ("normkernels/torch/serving.py",
                  '    _rms(out, input, weight, epsilon, 0.0, "llama")',
                  '    _rms(out, input, weight, epsilon, 0.0, "once")')],
             ["tests/test_torch_serving.py"]),
    mutation("serving/gemma-fused-offset-dropped", "the Gemma fused add multiplies by weight", [
                 ("normkernels/torch/serving.py",
                  '    _fused(input, residual, weight, epsilon, 1.0, "once")',
                  '    _fused(input, residual, weight, epsilon, 0.0, "once")')],
             ["tests/test_torch_serving.py"]),
    mutation("torch/group-norm-one-value", "GroupNorm of one value per group returns zeros "
             "(torch raises)", [
                 ("normkernels/torch/functional.py",
                  "    if input.shape[0] * input.shape[1] // groups * math.prod(input.shape[2:]) "
                  "== 1:", "    if False:")],
             ["tests/test_torch_differential.py", "-k", "0"]),
    mutation("bind/mixin-method-kept", "bind's recorder lets an engine mixin's method "
             "through (the gated norm's bind fails inside the recorder)", [
                 (BINDING, "                and (callable(getattr(Engine, name, None)) or not "
                  "hasattr(_Recorder, name))):",
                  "                and callable(getattr(Engine, name, None))):")],
             ["tests/test_bind.py", "-k", "gated"]),
    mutation("torch/group-norm-statistics-without-eps", "GroupNorm's forward keeps "
             "1 / sqrt(var) for the backward, without epsilon", [
                 (GN_SPEC, "inv_std = 1.0 / np.sqrt(m2 / max(count, 1) + eps)",
                  "inv_std = 1.0 / np.sqrt(m2 / max(count, 1))")],
             ["tests/test_torch.py", "-k", "group_norm"]),
    mutation("torch/group-norm-backward-drops-statistics", "the eager GroupNorm backward "
             "recomputes the statistics it was given", [
                 ("normkernels/torch/ops.py",
                  'num_groups=num_groups, mean=array(mean, "mean"), inv_std=array(rstd, "rstd"),',
                  "num_groups=num_groups,")],
             ["tests/test_torch.py", "-k", "group_norm"]),
    mutation("torch/instance-norm-statistics-without-eps", "InstanceNorm's forward keeps "
             "1 / sqrt(var) for the backward, without epsilon", [
                 ("normkernels/ops/instance_normalization.py",
                  "inv_std = 1.0 / np.sqrt(m2 / max(spatial, 1) + eps)",
                  "inv_std = 1.0 / np.sqrt(m2 / max(spatial, 1))")],
             ["tests/test_torch.py", "-k", "forward_statistics"]),
    mutation("torch/instance-norm-backward-drops-statistics", "the InstanceNorm backward "
             "recomputes the statistics it was given", [
                 ("normkernels/torch/ops.py",
                  '        mean=array(mean, "mean"), inv_std=array(rstd, "rstd"), out=array(dx, '
                  '"out"))', '        out=array(dx, "out"))')],
             ["tests/test_torch.py", "-k", "forward_statistics"]),
    mutation("group-coefficients-no-residual", "the group backward's coefficients drop "
             "the rounded mean's residual from K", [
                 (BWD_DX, "kp = kg + (bg * (rounded - mean) if np.isfinite(rounded) else 0.0)",
                  "kp = kg")],
             ["tests/test_backward.py", "-k", "group_coefficients"]),
    mutation("group-coefficients-twin-pairwise", "the twin's group sums go back to NumPy's "
             "pairwise order", [
                 (ENGINE_BASE, "g1 = np.cumsum((gamma * sum_dy).reshape(-1, Cg), axis=1)[:, -1]",
                  "g1 = (gamma * sum_dy).reshape(-1, Cg).sum(axis=1)")],
             ["tests/test_backward.py", "-k", "group_coefficients"]),
    mutation("bench/networks-output-per-layer", "the networks suite gives every layer a cold "
             "Y of its own again (torch's allocator hands its Y back warm)", [
                 ("normkernels/bench/networks.py", "    if key not in shared:\n",
                  "    if True:\n")],
             ["tests/test_networks.py"]),
    # the training and backward plans (normkernels/ops/training_plans.py) and their
    # engine steps (engine/numba_direct.py, kernels/backward_small.py)
    mutation("one-call/bn-r-ignores-inv-std", "the one-call BN backward (the full path's "
             "and the plans') takes the given inv_std for a variance", [
                 ("normkernels/kernels/backward_small.py",
                  "r[c] = 1.0 / np.sqrt(v + epsilon) if is_var else v",
                  "r[c] = 1.0 / np.sqrt(v + epsilon)")],
             ["tests/test_backward.py", "-k", "inv_std_is_the_same"]),
    mutation("one-call/given-stats-first-view", "the one-call group backward reads every "
             "channels-last sample's statistics from the first sample's", [
                 ("normkernels/kernels/backward_small.py",
                  "            mean[g] = given_mean[first + g]\n"
                  "            r[g] = given_r[first + g]",
                  "            mean[g] = given_mean[g]\n            r[g] = given_r[g]")],
             ["tests/test_backward.py"]),
    mutation("one-call/warm-without-given-stats", "the warm-up leaves out the one-call "
             "group backward with given statistics (a later call compiles it)", [
                 (GRADIENTS, "                for recomputed in (True, False):",
                  "                for recomputed in (True,):")],
             ["tests/test_compiles.py", "-k", "warm_backward_covers"]),
    mutation("warm/ada-group-backward-not-warmed", "the warm-up of AdaGroupNorm leaves "
             "out the one-call group backward kernels (a server compiles them later)", [
                 ("normkernels/warm.py", '"group_normalization_backward",\n'
                  '                      "ada_group_norm_backward")',
                  '"group_normalization_backward")')],
             ["tests/test_compiles.py", "-k", "after_warmup and ada-groupnorm"]),
    mutation("plans/group-rows-of-planes", "the group backward plan counts the rows of "
             "a view as its planes' elements (the sums' route of the full path differs)", [
                 (DIRECT, "        n_rows = size // views // (planes * S)",
                  "        n_rows = size // views // planes")],
             ["tests/test_plans.py", "-k", "statistics_plans"]),
    mutation("plans/statistics-count", "the planned forward with statistics divides M2 by "
             "the group's elements less one", [
                 ("normkernels/ops/plans.py", "m2 / self.count + self.epsilon",
                  "m2 / (self.count - 1) + self.epsilon")],
             ["tests/test_plans.py", "-k", "statistics_plans"]),
    mutation("torch/huge-outputs-contiguous", "the adapter's large outputs are laid out "
             "C-contiguous whatever x's memory format", [
                 ("normkernels/torch/tensors.py",
                  "return torch.empty(0, dtype=x.dtype).set_(memory, 0, x.shape, x.stride())",
                  "return torch.from_numpy(np.empty(x.shape, STORAGE[x.dtype])).view(x.dtype)")],
             ["tests/test_torch.py", "-k", "large_outputs"]),
    mutation("one-call/threads-not-started", "the engine does not start the threading "
             "layer before a one-call kernel launches parallel kernels from compiled code", [
                 (THREADS, "        numba.get_num_threads()\n        try:", "        try:")],
             ["tests/test_backward.py", "-k", "fresh_process"]),
    mutation("plans/fused-training-sample-variance", "the fused training step divides M2 "
             "by count - 1", [
                 ("normkernels/kernels/training_small.py", "        var[c] = m2[c] / count[c]",
                  "        var[c] = m2[c] / (count[c] - 1)")], PLAN_TESTS),
    mutation("plans/fused-group-first-view-only", "the fused group backward runs the first "
             "channels-last sample only", [
                 ("normkernels/kernels/backward_small.py", "    for v in range(views):",
                  "    for v in range(1):")], PLAN_TESTS),
    mutation("plans/direct-moments-one-channel-planes", "the direct moments of one channel "
             "take the planes of S, not the whole tensor (the engine's rule)", [
                 (DIRECT, "            S = size  # one channel: the whole tensor is one plane "
                  "(as channel_moments)", "            pass")], PLAN_TESTS),
    mutation("plans/gradient-out-overlap-unchecked", "a planned backward writes an out "
             "that overlaps X", [
                 ("normkernels/ops/training_plans.py",
                  "if out is not None and (not out.flags.writeable or plans.shares(out, X, "
                  "(dY, *params))):", "if out is not None and not out.flags.writeable:")],
             ["tests/test_plan_safety.py", "-k", "out_is_checked and batchnorm-backward"]),
    mutation("plans/rows-backward-broadcast-scale", "the LayerNorm backward plan takes a "
             "broadcast scale for the span's", [
                 ("normkernels/ops/training_plans.py",
                  "None if scale.shape == tuple(span) else rows.sum_to, serial)",
                  "None, serial)")],
             PLAN_TESTS),
    mutation("grad-routes/few-rows-by-planes", "short planes in more rows go by planes "
             "(the measured rule is 2 n_rows <= S)", [
                 ("normkernels/kernels/backward_sums.py", "S >= GRAD_MIN_PLANE or 2 * n_rows <= S",
                  "S >= GRAD_MIN_PLANE or n_rows <= S")],
             ["tests/test_backward.py", "-k", "every_route"]),
    mutation("modulated/first-sample-tables", "AdaLN's one-launch kernel normalizes every "
             "sample with the first sample's tables", [
                 ("normkernels/kernels/modulated.py", "        sn, bn = s[n * K:(n + 1) * K], "
                  "b[n * K:(n + 1) * K]", "        sn, bn = s[:K], b[:K]")],
             ["tests/test_ada_layer_norm.py", "-k", "one_launch"]),
    mutation("modulated/items-of-the-first-sample", "AdaLN's parallel items all cover the "
             "first sample's rows", [
                 ("normkernels/kernels/modulated.py", "        first = n * T + (item % "
                  "per_sample) * rows_per_item", "        first = (item % per_sample) * "
                  "rows_per_item")],
             ["tests/test_ada_layer_norm.py", "-k", "one_launch"]),
    mutation("modulated/backward-first-sample-gamma", "AdaLN's one-launch backward takes "
             "the first sample's gamma for every sample", [
                 ("normkernels/kernels/backward_dx.py", "        g = gamma[n * K:(n + 1) * K]",
                  "        g = gamma[:K]")],
             ["tests/test_ada_layer_norm.py", "-k", "one_launch_backward"]),
    mutation("modulated/backward-items-of-all-rows", "AdaLN's backward items are the "
             "whole batch's rows_backward items (a sample's sums then differ)", [
                 ("normkernels/engine/numba_gated.py", "        items, rows_per_item = "
                  "backward_dx.row_items(T, K)", "        items, rows_per_item = "
                  "backward_dx.row_items(M, K)")],
             ["tests/test_ada_layer_norm.py", "-k", "one_launch_backward"]),
    mutation("one-call/ada-group-channel-scale", "AdaGroupNorm's one-call backward reads "
             "the scale per channel (sample 0's for every sample)", [
                 ("normkernels/ops/backward.py", "x, dy, dx, len(views), planes, per, Cg, "
                  "planes if per_sample else C,", "x, dy, dx, len(views), planes, per, Cg, C,")],
             ["tests/test_epilogue_backward.py", "-k", "ada_group"]),
    # bound training and backward calls (normkernels.bind through their plans)
    mutation("bind-plan/stale-scale", "a bound BatchNorm backward reads the scale converted "
             "at binding", [
                 (TRAINING_PLANS, "        args = (*arrays, scale.reshape(C), mean.reshape(C),",
                  "        args = (*arrays, scale.astype(np.float64), mean.reshape(C),")],
             BIND_PLANS),
    mutation("bind-plan/stale-given-statistics", "a bound group backward reads the given "
             "statistics converted at binding", [
                 (TRAINING_PLANS, "        return _bound(lambda: run(xs, dys, dxs, s, eps, "
                  "_given(mean, inv_std)), (), dX,", "        given = _given(mean, inv_std)\n"
                  "        return _bound(lambda: run(xs, dys, dxs, s, eps, given), (), dX,")],
             BIND_PLANS),
    mutation("bind-plan/stale-gamma", "a bound LayerNorm backward reads the scale converted "
             "at binding", [
                 (TRAINING_PLANS, "        return _bound(lambda: run(xs, dys, dxs, gamma(scale)),",
                  "        g = gamma(scale)\n        return _bound(lambda: run(xs, dys, dxs, g),")],
             BIND_PLANS),
    mutation("bind-plan/training-stale-scale", "a bound BatchNorm training call reads a copy "
             "of the scale made at binding", [
                 (TRAINING_PLANS, "        args = (storage_view(x.ravel()), "
                  "storage_view(yc.ravel()), storage_view(scale),",
                  "        args = (storage_view(x.ravel()), "
                  "storage_view(yc.ravel()), storage_view(scale.copy()),")], BIND_PLANS),
    mutation("bind-plan/read-only-out-written", "a bound backward writes an out made "
             "read-only since binding", [
                 (TRAINING_PLANS, "        if not dX.flags.writeable:\n            return None\n"
                  "        dscale, dB", "        dscale, dB")], BIND_PLANS),
    mutation("plans/onednn-backward-gamma-ignored", "a planned oneDNN backward takes its "
             "first call's default gamma (ones) for a given one", [
                 ("normkernels/ops/onednn_training.py", "        grads = plans.serve(self.key, "
                  "diff_dst, src, self.ones if gamma is None else gamma,",
                  "        grads = plans.serve(self.key, diff_dst, src, self.ones,")],
             ["tests/test_plans.py", "-k", "training_and_backward and onednn"]),
    mutation("bind-plan/in-place-call-run-twice", "binding runs a call that writes its "
             "inputs (out=X) a second time", [
                 (BINDING, "    planned = None if _writes_inputs(result, args, kwargs) else",
                  "    planned = None if False else")],
             ["tests/test_bind.py", "-k", "writes_its_inputs"]),
    mutation("bind-plan/whole-result-for-part", "a bound RMSNorm backward returns its plan's "
             "three outputs (the operator returns two)", [
                 (BINDING, "        return lambda r: r[:n]", "        return lambda r: r")],
             BIND_PLANS),
]


def tracked_files():
    out = subprocess.run(["git", "ls-files", "-co", "--exclude-standard"], cwd=ROOT,
                         capture_output=True, text=True, check=True).stdout
    return [p for p in out.splitlines() if (ROOT / p).is_file()]


def kernel_stamp(tree):
    digest = hashlib.sha256()
    for path in sorted((tree / "normkernels" / "kernels").glob("*.py")):
        digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


def run_tests(tree, tests, cache_root, timeout):
    """(exit code, first failing test or None, seconds)."""
    env = {**os.environ, "PYTHONPATH": str(tree),
           "NUMBA_CACHE_DIR": str(cache_root / kernel_stamp(tree))}
    start = time.monotonic()
    try:
        done = subprocess.run([sys.executable, "-m", "pytest", "-x", "-q", "-rf",
                               "-p", "no:cacheprovider", *tests], cwd=tree, env=env,
                              capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return None, "(timed out)", time.monotonic() - start
    failed = re.findall(r"^FAILED (\S+)", done.stdout, re.MULTILINE)
    return done.returncode, (failed[0] if failed else done.stdout[-300:]), \
        time.monotonic() - start


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("names", nargs="*", help="mutations to run (names or prefixes)")
    parser.add_argument("--list", action="store_true")
    parser.add_argument("--check", action="store_true",
                        help="only check that every replacement applies (seconds)")
    parser.add_argument("--timeout", type=float, default=1200)
    parser.add_argument("--jobs", type=int, default=1,
                        help="mutations run at once, each on its own copy of the tree")
    parser.add_argument("--no-baseline", action="store_true",
                        help="skip running each mutation's tests on the unmutated tree first "
                             "(where the whole suite has just passed on it, as in CI)")
    args = parser.parse_args()
    chosen = [m for m in MUTATIONS
              if not args.names or any(m.name.startswith(n) for n in args.names)]
    if args.list:
        for m in chosen:
            print(f"{m.name:36} {m.what}\n{'':36} tests: {' '.join(m.tests)}")
        return 0
    if args.check:
        for m in chosen:
            for path, old, _new in m.edits:
                count = (ROOT / path).read_text().count(old)
                if count != 1:
                    sys.exit(f"{m.name}: the text to replace occurs {count} times in {path} "
                             "(expected once); update tests/mutations.py")
        print(f"{len(chosen)} mutations, every replacement applies")
        return 0
    work = Path(tempfile.mkdtemp(prefix="normkernels-mutations-"))
    cache_root = work / "numba-cache"
    trees = queue.Queue()  # one copy of the tree per job; a job takes one, then gives it back
    for k in range(max(1, args.jobs)):
        tree = work / f"tree{k}"
        for rel in tracked_files():
            (tree / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / rel, tree / rel)
        trees.put(tree)
    originals = {}
    for m in chosen:  # every replacement must still apply
        for path, old, _new in m.edits:
            text = originals.setdefault(path, (ROOT / path).read_text())
            if text.count(old) != 1:
                sys.exit(f"{m.name}: the text to replace occurs {text.count(old)} times in "
                         f"{path} (expected once); update tests/mutations.py")

    def on_a_tree(work_item):
        tree = trees.get()
        try:
            return work_item(tree)
        finally:
            trees.put(tree)

    def baseline(tests):
        return tests, on_a_tree(lambda tree: run_tests(tree, tests, cache_root, args.timeout))

    def mutated(m):
        def run(tree):
            for path, old, new in m.edits:
                (tree / path).write_text((tree / path).read_text().replace(old, new))
            try:
                return run_tests(tree, m.tests, cache_root, args.timeout)
            finally:
                for path, _old, _new in m.edits:
                    (tree / path).write_text(originals[path])
        return m, on_a_tree(run)

    print(f"baseline: the mutations' tests on the unmutated tree ({work}, {args.jobs} jobs)",
          flush=True)
    with ThreadPoolExecutor(max(1, args.jobs)) as pool:
        for tests, (code, first, seconds) in pool.map(baseline, [] if args.no_baseline else
                                                      sorted({m.tests for m in chosen})):
            if code != 0:
                sys.exit(f"baseline fails ({' '.join(tests)}): {first}")
            print(f"  passes in {seconds:5.0f} s: {' '.join(tests)}", flush=True)
        survived = 0
        print(f"\n{'mutation':36} {'result':8} {'s':>5}  first failing test")
        for m, (code, first, seconds) in pool.map(mutated, chosen):
            if code == 1 or code is None:
                result = "caught"
            elif code == 0:
                result, first, survived = "SURVIVED", "-", survived + 1
            else:  # collection error, usage error: the mutation broke more than it meant to
                result, survived = f"ERROR {code}", survived + 1
            print(f"{m.name:36} {result:8} {seconds:5.0f}  {first}", flush=True)
    shutil.rmtree(work, ignore_errors=True)
    print(f"\n{len(chosen) - survived} of {len(chosen)} planted bugs caught")
    return 1 if survived else 0

if __name__ == "__main__":
    sys.exit(main())

"""ONNX GroupNormalization-18/-21 and oneDNN Graph GroupNorm-1 (spec layer).

The C channels split into ``num_groups`` consecutive blocks of ``C / num_groups``;
per (n, group) the mean and population variance over the group's channels and all
spatial positions; ``Y = (X - mean) / sqrt(var + epsilon) * scale + bias``.

* GroupNormalization-18 (deprecated by ONNX, still run by onnxruntime and the
  ReferenceEvaluator): scale and bias have one value per *group*, shape
  ``(num_groups,)``.
* GroupNormalization-21: one value per *channel*, shape ``(C,)``, and ``stash_type``.
* oneDNN GroupNorm-1: gamma/beta per channel, optional (``use_affine``), statistics
  outputs ``(mean, variance)`` of shape ``(N, groups)``; channels-last by default.

Where the function bodies and normkernels differ (docs/guide/groups.md):
statistics are float64 two-level sums (float32 runs for 16-bit X) with the centred
variance, where the -21 body takes ``E[x^2] - E[x]^2`` in the stash type and the -18
body computes everything in T (float16 squares overflow above 256); the normalized
value is not rounded to T before the scale and bias (one rounding at the end). So
``stash_type`` selects nothing here: every legal value (1, 10, 11, 16) runs at least as
precisely as it asks.

The loops are instance normalization's (:meth:`normkernels.engine.Engine.instance_planes`
and ``instance_rows`` with ``group`` channels per group): a group's planes are
contiguous in NCX memory, and in NXC memory the per-(n, c) partials are merged per
group.
"""

import math
from dataclasses import dataclass

import numpy as np

from normkernels.ops import common, plans
from normkernels.ops.common import ALL_FLOATS, BFLOAT16, FLOAT16, FLOAT32, FLOAT64

OP = "GroupNormalization"
GROUP_NORM = "GroupNorm"  # oneDNN Graph
STASH_TYPES = {1: FLOAT32, 10: FLOAT16, 11: FLOAT64, 16: BFLOAT16}  # the -21 body's list


@dataclass(frozen=True)
class Version(common.Version):
    dtypes: tuple = ALL_FLOATS
    per_group: bool = False  # scale and bias of shape (num_groups,) (opset 18)


VERSIONS = {
    18: Version(18, {"epsilon": 1e-5}, per_group=True),
    21: Version(21, {"epsilon": 1e-5, "stash_type": 1}),
}

version_for = common.version_lookup(OP, VERSIONS)


def check_groups(label, name, groups, C):
    """``groups``: an integer from 1 to C that divides C."""
    if not common.is_integer(groups):
        raise TypeError(f"{label}: {name} must be an integer, got "
                        f"{type(groups).__name__} {groups!r}")
    groups = int(groups)
    if not 1 <= groups <= max(C, 1) or C % groups:
        raise ValueError(f"{label}: {name} must divide the number of channels C = {C} "
                         f"(1 <= {name} <= C and C % {name} == 0), got {groups}")
    return groups


def _check_rank(label, X, least):
    if X.ndim < least:
        raise ValueError(f"{label}: X must have at least {least} dimensions (N x C x D1 ...), "
                         f"got shape {X.shape}")


def normalize(label, X, scale, bias, groups, eps, data_format, out, engine, path, act=None,
              res=None):
    """``(Y, mean, M2, count)``: Y written to ``out`` (or a new array), the per-(n,
    group) mean and M2 (flat ``n * groups + g``, float64) over ``count`` elements each.
    ``scale`` and ``bias`` per channel, checked; ``act`` an activation epilogue's name
    (:mod:`normkernels.kernels.activations`) or None; ``res`` a checked residual added
    before it, or None."""
    C = common.channel_count(X, data_format)
    spatial = math.prod(X.shape[2:] if data_format == "NCX" else X.shape[1:-1])
    N = X.shape[0]
    count = C // groups * spatial
    if count == 0 and N * C > 0:
        raise ValueError(f"{label}: X of shape {X.shape} has a zero-size spatial extent: "
                         "the mean and variance of zero elements are undefined")
    stats = {}

    def kernel(x, y, C, S, r=None):
        extra = common.epilogue(act, r)
        if S == spatial:  # channels-first memory (or spatial size 1: both agree)
            stats["m"] = engine.instance_planes(x, y, C, S, scale, bias, eps, path,
                                                group=C // groups, **extra)
        else:  # channels-last memory
            stats["m"] = engine.instance_rows(x, y, N, C, scale, bias, eps, path,
                                              group=C // groups, **extra)

    Y = common.map_layout(X, data_format, out, kernel, res)
    mean, m2 = stats.get("m", (np.zeros(N * groups), np.zeros(N * groups)))
    return Y, mean, m2, count


def group_normalization(X, scale, bias, *, num_groups, epsilon=None, stash_type=None,
                        opset=21, data_format="NCX", activation=None, add=None, out=None,
                        engine, path=None, statistics=False):
    """Spec layer of :func:`normkernels.group_normalization`. ``statistics`` (for a
    training forward, the PyTorch adapter's): return ``(Y, mean, inv_std)``, the
    float64 per-(n, group) mean and ``1 / sqrt(var + epsilon)`` of shape ``(N,
    num_groups)`` that :func:`normkernels.group_normalization_backward` takes."""
    key = given = None
    if path is None and add is None:  # an earlier call's plan
        try:
            key = (OP, engine, opset, epsilon, stash_type, num_groups, data_format, activation,
                   statistics, type(opset), type(epsilon), type(stash_type), type(num_groups),
                   type(data_format), type(activation), type(statistics), type(X), X.shape,
                   X.strides, X.dtype,
                   type(scale), scale.shape, scale.strides, scale.dtype,
                   type(bias), bias.shape, bias.strides, bias.dtype, plans.out_key(out, X))
            plan = plans.get(key)
        except (AttributeError, TypeError):  # not arrays, or an unhashable attribute
            key = plan = None
        if plan is not None:
            Y = plan(X, scale, bias, out)
            if Y is not None:
                return Y
        given = (X, scale, bias)
    version = version_for(opset)
    label = version.label(OP)
    attrs = common.resolve_attributes(label, version, {"epsilon": epsilon,
                                                       "stash_type": stash_type})
    eps = common.check_epsilon(label, attrs["epsilon"])
    act = common.check_activation(label, activation)
    if "stash_type" in attrs:
        from normkernels.ops.layer_normalization import stash_dtype

        stash_dtype(label, attrs["stash_type"], STASH_TYPES)
    common.check_data_format(label, data_format)
    arrays = {"X": common.as_array("X", X), "scale": common.as_array("scale", scale),
              "bias": common.as_array("bias", bias)}
    for name, arr in arrays.items():
        common.check_dtype(label, name, arr, version.dtypes)
    common.check_same_dtype(label, "T", arrays)
    X = arrays.pop("X")
    _check_rank(label, X, 2)
    C = common.channel_count(X, data_format)
    groups = check_groups(label, "num_groups", num_groups, C)
    if version.per_group:
        for name, p in arrays.items():
            if p.shape != (groups,):
                raise ValueError(f"{label}: {name} must have shape ({groups},), one value per "
                                 f"group (opset 18; opset 21 takes one per channel), got "
                                 f"shape {p.shape}")
    else:
        common.check_channel_params(label, C, arrays)
    res = common.check_residual(label, "add", add, X)
    if out is not None:
        common.check_out(label, out, X, arrays, {"X": X} if res is None else {"X": X, "add": res})
    checked = (X, arrays["scale"], arrays["bias"])
    scale, bias = arrays["scale"], arrays["bias"]
    if version.per_group:  # each channel takes its group's value
        scale, bias = np.repeat(scale, C // groups), np.repeat(bias, C // groups)
    Y, mean, m2, count = normalize(label, X, scale, bias, groups, eps, data_format, out,
                                   engine, path, act, res)
    # a plan for per-channel parameters only (opset 18's are repeated per call)
    if key is not None and eps and not version.per_group and plans.plain(given, checked):
        spatial = math.prod(X.shape[2:] if data_format == "NCX" else X.shape[1:-1])
        plans.add(key, plans.instance(engine, eps, X, data_format, out, spatial, C // groups,
                                      act, statistics is True))
    if statistics:
        with np.errstate(all="ignore"):  # count 0: an empty X, no statistic is read
            inv_std = 1.0 / np.sqrt(m2 / max(count, 1) + eps)
        shape = (X.shape[0], groups)
        return Y, mean.reshape(shape), inv_std.reshape(shape)
    return Y


def group_norm(src, gamma=None, beta=None, *, groups, epsilon=1e-5, keep_stats=True,
               use_affine=True, data_format="NXC", out=None, engine, path=None):
    """Spec layer of :func:`normkernels.group_norm`."""
    from normkernels.ops import layer_norm as dnnl

    label = GROUP_NORM
    X = common.as_array("src", src)
    common.check_dtype(label, "src", X, dnnl.SRC)
    eps = common.check_epsilon(label, epsilon)
    keep = dnnl.check_bool(label, "keep_stats", keep_stats)
    common.check_data_format(label, data_format)
    _check_rank(label, X, 3)
    # gamma and beta: LayerNorm's rules (the documents give both the same dtype table)
    params = dnnl.affine_params(label, X, use_affine, gamma, beta,
                                dnnl.GAMMA_DTYPES[dnnl.LAYER_NORM][X.dtype])
    C = common.channel_count(X, data_format)
    G = check_groups(label, "groups", groups, C)
    common.check_channel_params(label, C, params)
    if out is not None:
        common.check_out(label, out, X, params)
    stats = params["gamma"].dtype if params else FLOAT32
    scale = params.get("gamma", np.ones(C, FLOAT32))
    bias = params.get("beta", np.zeros(C, FLOAT32))
    Y, mean, m2, count = normalize(label, X, scale, bias, G, eps, data_format, out, engine,
                                   path)
    if not keep:
        return Y
    shape = (X.shape[0], G)
    with np.errstate(all="ignore"):
        var = m2 / count if count else m2
    return Y, mean.astype(stats).reshape(shape), var.astype(stats).reshape(shape)

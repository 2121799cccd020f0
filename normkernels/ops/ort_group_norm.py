"""onnxruntime's GroupNorm and SkipGroupNorm (com.microsoft, version 1; spec layer).

GroupNorm: per sample and group of ``C / groups`` consecutive channels, the mean and
population variance over the group's channels and every spatial position, ``y =
gamma[c] * (x - mean) / sqrt(var + epsilon) + beta[c]``, then the activation
(``activation`` 1: SiLU ``y * sigmoid(y)``; 0: none). ``channels_last`` (default 1):
X is (N, H, W, C), else (N, C, H, W). The schema's T and M are float16 and float32;
here T is any of float16, bfloat16, float32, float64, and gamma and beta (M) any
float dtype, the same for both (onnxruntime's CUDA kernels take float32 gamma with
float16 X). onnxruntime has no CPU kernel for either operator ("Could not find an
implementation for GroupNorm(1)").

SkipGroupNorm: ``s = x + skip + bias`` (skip of X's shape, or one value per (n, c):
(N, 1, 1, C) or (N, C) for NHWC; (N, C, 1, 1) or (N, C) for NCHW; bias of shape (C,),
optional), then GroupNorm of ``s``. As the package's SkipLayerNormalization, ``s`` is
rounded to T before its statistics (it is the operator's second output ``S``), so Y
is :func:`ort_group_norm` of the returned S.

X has rank 3 or more (the schema's is 4: (N, H, W, C)). The normalization and its
loops are group normalization's (:mod:`normkernels.ops.group_normalization`), the
activation applied in the same pass before Y is rounded
(:mod:`normkernels.kernels.activations`).
"""

import math

import numpy as np

from normkernels.ops import common, group_normalization, plans
from normkernels.ops.common import ALL_FLOATS

GROUP_NORM = "GroupNorm"  # com.microsoft
SKIP_GROUP_NORM = "SkipGroupNorm"
ACTIVATIONS = {0: None, 1: "silu"}


def _attributes(label, groups, activation, epsilon, channels_last):
    eps = common.check_epsilon(label, epsilon)
    silu = common.check_int_attribute(label, "activation", activation, (0, 1))
    last = common.check_int_attribute(label, "channels_last", channels_last, (0, 1))
    if not common.is_integer(groups):
        raise TypeError(f"{label}: groups must be an integer, got {type(groups).__name__} "
                        f"{groups!r}")
    return eps, ACTIVATIONS[silu], "NXC" if last else "NCX"


def _arrays(label, X, gamma, beta, data_format):
    X = common.as_array("X", X)
    common.check_dtype(label, "X", X, ALL_FLOATS)
    params = {"gamma": common.as_array("gamma", gamma), "beta": common.as_array("beta", beta)}
    for name, p in params.items():
        common.check_dtype(label, name, p, ALL_FLOATS)
    common.check_same_dtype(label, "M", params)
    if X.ndim < 3:
        raise ValueError(f"{label}: X must have at least 3 dimensions ((N, H, W, C) with "
                         f"channels_last=1, (N, C, H, W) otherwise), got shape {X.shape}")
    C = common.channel_count(X, data_format)
    common.check_channel_params(label, C, params)
    return X, params, C


def _check_groups(label, groups, C):
    return group_normalization.check_groups(label, "groups", groups, C)


def ort_group_norm(X, gamma, beta, *, groups, activation, epsilon=1e-5, channels_last=1,
                   out=None, engine, path=None):
    """Spec layer of :func:`normkernels.ort_group_norm`."""
    label = GROUP_NORM
    key = given = None
    if path is None:  # an earlier call's plan (see ops/plans.py)
        try:
            key = (label, engine, groups, activation, epsilon, channels_last, type(groups),
                   type(activation), type(epsilon), type(channels_last), type(X), X.shape,
                   X.strides, X.dtype, type(gamma), gamma.shape, gamma.strides, gamma.dtype,
                   type(beta), beta.shape, beta.strides, beta.dtype, plans.out_key(out, X))
            plan = plans.get(key)
        except (AttributeError, TypeError):  # not arrays, or an unhashable attribute
            key = plan = None
        if plan is not None:
            Y = plan(X, gamma, beta, out)
            if Y is not None:
                return Y
        given = (X, gamma, beta)
    eps, act, data_format = _attributes(label, groups, activation, epsilon, channels_last)
    X, params, C = _arrays(label, X, gamma, beta, data_format)
    G = _check_groups(label, groups, C)
    if out is not None:
        common.check_out(label, out, X, params)
    Y = group_normalization.normalize(label, X, params["gamma"], params["beta"], G, eps,
                                      data_format, out, engine, path, act=act)[0]
    checked = (X, params["gamma"], params["beta"])
    # a plan where gamma and beta have X's dtype (the plans' kernels take one dtype)
    if (key is not None and eps and X.dtype == checked[1].dtype
            and plans.plain(given, checked)):
        spatial = math.prod(X.shape[2:] if data_format == "NCX" else X.shape[1:-1])
        plans.add(key, plans.instance(engine, eps, X, data_format, out, spatial, C // G, act))
    return Y


def _skip_kind(label, X, skip, data_format):
    """``(rows_per_skip_unit, skip_rows)`` of the skip add, checking skip's shape: X's
    shape (one skip element per element), or one value per (n, c)."""
    N, C = X.shape[0], common.channel_count(X, data_format)
    ones = (1,) * (X.ndim - 2)
    per_channel = ((N, *ones, C) if data_format == "NXC" else (N, C, *ones), (N, C))
    if skip.shape == X.shape:
        return "full"
    if skip.shape in per_channel:
        return "per-channel"
    allowed = " or ".join(str(s) for s in (X.shape, *per_channel))
    raise ValueError(f"{label}: skip must have shape {allowed} (X's shape, or one value per "
                     f"sample and channel), got {skip.shape}")


def ort_skip_group_norm(X, gamma, beta, skip, bias=None, *, groups, activation, epsilon=1e-5,
                        channels_last=1, num_outputs=1, out=None, engine, path=None):
    """Spec layer of :func:`normkernels.ort_skip_group_norm`."""
    label = SKIP_GROUP_NORM
    eps, act, data_format = _attributes(label, groups, activation, epsilon, channels_last)
    n_out = common.check_int_attribute(label, "num_outputs", num_outputs, (1, 2))
    X, params, C = _arrays(label, X, gamma, beta, data_format)
    inputs = {"skip": common.as_array("skip", skip)}
    if bias is not None:
        inputs["bias"] = common.as_array("bias", bias)
    for name, arr in inputs.items():
        common.check_dtype(label, name, arr, ALL_FLOATS)
    common.check_same_dtype(label, "T", {"X": X, **inputs})
    kind = _skip_kind(label, X, inputs["skip"], data_format)
    if "bias" in inputs:
        common.check_channel_params(label, C, {"bias": inputs["bias"]})
    G = _check_groups(label, groups, C)
    if out is not None:
        common.check_out(label, out, X, {**params, **inputs})
    S = np.empty(X.shape, X.dtype)
    if X.size:
        _skip_sums(X, inputs["skip"], inputs.get("bias"), S, kind, data_format, engine)
    Y = group_normalization.normalize(label, S, params["gamma"], params["beta"], G, eps,
                                      data_format, out, engine, path, act=act)[0]
    return Y if n_out == 1 else (Y, S)


def _skip_sums(X, skip, bias, S, kind, data_format, engine):
    """``S = (X + skip) + bias`` (C-contiguous ``S``), by rows of the C-contiguous
    memory: rows of C channels (channels last) or planes (channels first)."""
    x = np.ascontiguousarray(X)
    C = common.channel_count(X, data_format)
    spatial = math.prod(X.shape[1:-1] if data_format == "NXC" else X.shape[2:])
    if data_format == "NXC":  # rows of C; bias per column
        K, per_column = C, True
        rows_per_skip = 1 if kind == "full" else spatial
    else:  # rows of one plane; bias per row (channel r % C)
        K, per_column = spatial, False
        rows_per_skip = 1
    skip_rows = kind == "full" or data_format == "NXC"
    engine.skip_sums(x.reshape(-1), np.ascontiguousarray(skip).reshape(-1), bias,
                     S.reshape(-1), K, rows_per_skip, skip_rows, per_column, C)

"""ONNX InstanceNormalization, opsets 1, 6 and 22 (spec layer).

``y = scale * (x - mean) / sqrt(variance + epsilon) + B`` with the mean and the
population variance of each (n, c) over the spatial axes. Versions:

* 1: ``consumed_inputs`` (legacy, accepted and ignored); input 4-D N x C x H x W;
  T in float16, float32, float64.
* 6: input N x C x D1 ... Dn (at least 3-D); same types.
* 22: adds bfloat16.

input, scale and B share the type T. ``data_format="NXC"`` (channels last, not an ONNX
layout) takes N x D1 ... Dn x C. Statistics are accumulated in float64 for float32 and
float64 input, in float32 runs joined in float64 for 16-bit input (the spec asks for
at least float32 for float16).
"""

import math
from dataclasses import dataclass

import numpy as np

from normkernels.ops import common, plans
from normkernels.ops.common import ALL_FLOATS, NO_BF16

OP = "InstanceNormalization"


@dataclass(frozen=True)
class Version(common.Version):
    dtypes: tuple = NO_BF16  # allowed dtypes of T (input, scale, B)
    min_rank: int = 3  # input is N x C x D1 ... Dn
    exact_rank: int = None  # opset 1: exactly 4-D


VERSIONS = {
    1: Version(1, {"consumed_inputs": None, "epsilon": 1e-5}, exact_rank=4),
    6: Version(6, {"epsilon": 1e-5}),
    22: Version(22, {"epsilon": 1e-5}, dtypes=ALL_FLOATS),
}

version_for = common.version_lookup(OP, VERSIONS)


def prepare(opset, attributes):
    """``(version, label, epsilon)`` for these attributes (None: the schema default)
    at ``opset``, checked."""
    version = version_for(opset)
    label = version.label(OP)
    attrs = common.resolve_attributes(label, version, attributes)
    return version, label, common.check_epsilon(label, attrs["epsilon"])


def check_types(version, label, arrays):
    """input, scale and B: allowed dtypes of T, one dtype (NumPy or dask arrays)."""
    for name, arr in arrays.items():
        common.check_dtype(label, name, arr, version.dtypes)
    common.check_same_dtype(label, "T", arrays)


def check_rank(version, label, shape):
    if version.exact_rank is not None and len(shape) != version.exact_rank:
        raise ValueError(f"{label}: input must be {version.exact_rank}-D (N x C x H x W), "
                         f"got shape {shape}")
    if len(shape) < version.min_rank:
        raise ValueError(f"{label}: input must have at least {version.min_rank} dimensions "
                         f"(N x C x D1 ...); got shape {shape}")


def instance_normalization(input, scale, B, *, epsilon=None, consumed_inputs=None, opset=22,
                           data_format="NCX", activation=None, add=None, out=None, engine,
                           path=None, statistics=False):
    """Spec layer of :func:`normkernels.instance_normalization`; ``engine`` runs the
    loops (``engine.instance_planes`` for channels-first memory,
    ``engine.instance_rows`` for channels-last). ``statistics`` (for a training
    forward, the PyTorch adapter's): return ``(Y, mean, inv_std)``, the float64 per-(n,
    c) mean and ``1 / sqrt(var + epsilon)`` of shape ``(N, C)`` that
    :func:`normkernels.instance_normalization_backward` takes."""
    key = given = None
    if path is None and activation is None and add is None:  # a plan
        try:
            key = (OP, engine, opset, epsilon, consumed_inputs, data_format, statistics,
                   type(opset), type(epsilon), type(consumed_inputs), type(data_format),
                   type(statistics),
                   type(input), input.shape, input.strides, input.dtype,
                   type(scale), scale.shape, scale.strides, scale.dtype,
                   type(B), B.shape, B.strides, B.dtype, plans.out_key(out, input))
            plan = plans.get(key)
        except (AttributeError, TypeError):  # not arrays, or an unhashable attribute
            key = plan = None
        if plan is not None:
            Y = plan(input, scale, B, out)
            if Y is not None:
                return Y
        given = (input, scale, B)
    version, label, eps = prepare(opset, {"epsilon": epsilon,
                                          "consumed_inputs": consumed_inputs})
    common.check_data_format(label, data_format)
    act = common.check_activation(label, activation)
    arrays = {"input": common.as_array("input", input), "scale": common.as_array("scale", scale),
              "B": common.as_array("B", B)}
    check_types(version, label, arrays)
    X = arrays.pop("input")
    check_rank(version, label, X.shape)
    C = common.channel_count(X, data_format)
    common.check_channel_params(label, C, arrays)
    res = common.check_residual(label, "add", add, X)
    if out is not None:
        common.check_out(label, out, X, arrays, {"X": X} if res is None else {"X": X, "add": res})
    spatial = math.prod(X.shape[2:] if data_format == "NCX" else X.shape[1:-1])
    if spatial == 0 and X.shape[0] * C > 0:
        raise ValueError(f"{label}: input of shape {X.shape} has a zero-size spatial extent: "
                         "the mean and variance of zero elements are undefined")
    N = X.shape[0]
    stats = {}

    def kernel(x, y, C, S, r=None):
        extra = common.epilogue(act, r)
        if S == spatial:  # channels-first memory (or spatial size 1: both agree)
            stats["m"] = engine.instance_planes(x, y, C, S, arrays["scale"], arrays["B"], eps,
                                                path, **extra)
        else:  # channels-last memory
            stats["m"] = engine.instance_rows(x, y, N, C, arrays["scale"], arrays["B"], eps,
                                              path, **extra)

    Y = common.map_layout(X, data_format, out, kernel, res)
    if key is not None and eps and plans.plain(given, (X, arrays["scale"], arrays["B"])):
        plans.add(key, plans.instance(engine, eps, X, data_format, out, spatial,
                                      statistics=statistics is True))
    if statistics:
        mean, m2 = stats.get("m", (np.zeros(N * C), np.zeros(N * C)))
        with np.errstate(all="ignore"):
            inv_std = 1.0 / np.sqrt(m2 / max(spatial, 1) + eps)
        return Y, mean.reshape(N, C), inv_std.reshape(N, C)
    return Y

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

import functools
import math
from dataclasses import dataclass

from normkernels.ops import common
from normkernels.ops.common import ALL_FLOATS, BFLOAT16

OP = "InstanceNormalization"
_NO_BF16 = tuple(d for d in ALL_FLOATS if d != BFLOAT16)


@dataclass(frozen=True)
class Version:
    since: int
    attributes: dict  # name -> schema default
    dtypes: tuple  # allowed dtypes of T (input, scale, B)
    ranks: str  # "4" or ">=3"


VERSIONS = {
    1: Version(1, {"consumed_inputs": None, "epsilon": 1e-5}, _NO_BF16, "4"),
    6: Version(6, {"epsilon": 1e-5}, _NO_BF16, ">=3"),
    22: Version(22, {"epsilon": 1e-5}, ALL_FLOATS, ">=3"),
}


def version_for(opset):
    """The InstanceNormalization version in force at ``opset`` (an int >= 1, or a
    NumPy integer)."""
    return _version_for(opset if type(opset) is int else common.check_opset(OP, opset))


@functools.cache
def _version_for(opset):
    return common.version_in_force(OP, VERSIONS, opset)


def instance_normalization(input, scale, B, *, epsilon=None, consumed_inputs=None, opset=22,
                           data_format="NCX", out=None, engine, path=None):
    """Spec layer of :func:`normkernels.instance_normalization`; ``engine`` runs the
    loops (``engine.instance_planes`` for channels-first memory,
    ``engine.instance_rows`` for channels-last)."""
    version = version_for(opset)
    label = f"{OP}-{version.since}"
    attrs = common.resolve_attributes(label, version.attributes,
                                      {"epsilon": epsilon, "consumed_inputs": consumed_inputs})
    eps = common.check_epsilon(label, attrs["epsilon"])
    common.check_data_format(label, data_format)
    arrays = {"input": common.as_array("input", input), "scale": common.as_array("scale", scale),
              "B": common.as_array("B", B)}
    for name, arr in arrays.items():
        common.check_dtype(label, name, arr, version.dtypes)
    common.check_same_dtype(label, "T", arrays)
    X = arrays.pop("input")
    if version.ranks == "4" and X.ndim != 4:
        raise ValueError(f"{label}: input must be 4-D (N x C x H x W), got shape {X.shape}")
    if X.ndim < 3:
        raise ValueError(f"{label}: input must have at least 3 dimensions (N x C x D1 ...); "
                         f"got shape {X.shape}")
    C = common.channel_count(X, data_format)
    common.check_channel_params(label, C, arrays)
    if out is not None:
        common.check_out(label, out, X, arrays)
    spatial = math.prod(X.shape[2:] if data_format == "NCX" else X.shape[1:-1])
    if spatial == 0 and X.shape[0] * C > 0:
        raise ValueError(f"{label}: input of shape {X.shape} has a zero-size spatial extent: "
                         "the mean and variance of zero elements are undefined")
    N = X.shape[0]

    def kernel(x, y, C, S):
        if S == spatial:  # channels-first memory (or spatial size 1: both agree)
            engine.instance_planes(x, y, C, S, arrays["scale"], arrays["B"], eps, path)
        else:  # channels-last memory
            engine.instance_rows(x, y, N, C, arrays["scale"], arrays["B"], eps, path)

    return common.map_layout(X, data_format, out, kernel)

"""ONNX BatchNormalization, opsets 1, 6, 7, 9, 14 and 15 (spec layer).

One :class:`Version` per since-version states what that version accepts: its
attributes with their schema defaults, its type variables and their dtypes. The
version that serves a model's opset is the highest since-version at or below it.

Delivered: inference (``training_mode=0`` in 14/15, ``is_test=1`` with
``spatial=1`` in 1/6). Training mode, opsets 7/9 (whose mode follows the number of
outputs) and non-spatial mode raise ``NotImplementedError``: they belong to the
training-mode feature, which brings the batch statistics kernels.
"""

import functools
from dataclasses import dataclass, field

from normkernels.ops import common
from normkernels.ops.common import ALL_FLOATS, BFLOAT16

OP = "BatchNormalization"
_NO_BF16 = tuple(d for d in ALL_FLOATS if d != BFLOAT16)
_INPUTS = ("X", "scale", "B", "input_mean", "input_var")
TRAINING_FEATURE = "training-mode BatchNormalization (batch statistics)"


@dataclass(frozen=True)
class Version:
    since: int
    attributes: dict  # name -> schema default
    type_vars: dict  # input name -> type variable
    dtypes: dict = field(default_factory=dict)  # type variable -> allowed dtypes


def _single_type(since, **attributes):
    """Opsets 1-9: every input is T, one of float16/float32/float64."""
    return Version(since, attributes, dict.fromkeys(_INPUTS, "T"), {"T": _NO_BF16})


VERSIONS = {
    1: _single_type(1, consumed_inputs=None, epsilon=1e-5, is_test=0, momentum=0.9, spatial=1),
    6: _single_type(6, epsilon=1e-5, is_test=0, momentum=0.9, spatial=1),
    7: _single_type(7, epsilon=1e-5, momentum=0.9, spatial=1),
    9: _single_type(9, epsilon=1e-5, momentum=0.9),
    14: Version(14, {"epsilon": 1e-5, "momentum": 0.9, "training_mode": 0},
                {"X": "T", "scale": "T", "B": "T", "input_mean": "U", "input_var": "U"},
                {"T": ALL_FLOATS, "U": ALL_FLOATS}),
    15: Version(15, {"epsilon": 1e-5, "momentum": 0.9, "training_mode": 0},
                {"X": "T", "scale": "T1", "B": "T1", "input_mean": "T2", "input_var": "T2"},
                {"T": ALL_FLOATS, "T1": ALL_FLOATS, "T2": ALL_FLOATS}),
}


@functools.cache
def version_for(opset):
    """The BatchNormalization version in force at ``opset``."""
    if isinstance(opset, bool) or not isinstance(opset, int) or opset < 1:
        raise ValueError(f"{OP}: opset must be an integer >= 1, got {opset!r}")
    return VERSIONS[max(v for v in VERSIONS if v <= opset)]


def resolve_attributes(version, given):
    """Schema defaults overlaid with the attributes the caller gave (not None);
    an attribute the version does not have is a TypeError."""
    attrs = dict(version.attributes)
    for name, value in given.items():
        if value is None:
            continue
        if name not in attrs:
            have = ", ".join(sorted(attrs))
            raise TypeError(f"{OP}-{version.since} has no attribute {name!r} "
                            f"(its attributes: {have})")
        attrs[name] = value
    return attrs


def check_types(version, arrays):
    if _types_ok(version, arrays):
        return
    label = f"{OP}-{version.since}"
    groups = {}
    for name, arr in arrays.items():
        tv = version.type_vars[name]
        common.check_dtype(label, name, arr, version.dtypes[tv])
        groups.setdefault(tv, {})[name] = arr
    for tv, members in groups.items():
        common.check_same_dtype(label, tv, members)


def _types_ok(version, arrays):
    """Fast path of check_types (per-call latency): True when there is no error."""
    seen = {}
    for name, arr in arrays.items():
        tv = version.type_vars[name]
        dt = arr.dtype
        first = seen.setdefault(tv, dt)
        if first is not dt and first != dt:
            return False
    # ``in`` on a tuple tries identity first; dtypes of builtin floats are singletons
    return all(dt in version.dtypes[tv] for tv, dt in seen.items())


def mode(version, attrs):
    """"inference" or "training" for these attributes, or NotImplementedError."""
    label = f"{OP}-{version.since}"
    if version.since >= 14:
        training = bool(attrs["training_mode"])
    elif version.since in (1, 6):
        if not attrs["spatial"]:
            raise NotImplementedError(f"{label}: spatial=0 is part of {TRAINING_FEATURE}, "
                                      "not implemented yet")
        training = not attrs["is_test"]
    else:
        raise NotImplementedError(
            f"{label}: this version chooses test or training mode by its number of "
            f"outputs; it is part of {TRAINING_FEATURE}, not implemented yet")
    if training:
        raise NotImplementedError(f"{label}: training mode is part of {TRAINING_FEATURE}, "
                                  "not implemented yet")
    return "inference"


def batch_normalization(X, scale, B, input_mean, input_var, *, epsilon=None, momentum=None,
                        training_mode=None, is_test=None, spatial=None, consumed_inputs=None,
                        opset=15, data_format="NCX", out=None, engine, path=None):
    """Spec layer of :func:`normkernels.batch_normalization`; ``engine`` runs the loops."""
    version = version_for(opset)
    attrs = resolve_attributes(version, {
        "epsilon": epsilon, "momentum": momentum, "training_mode": training_mode,
        "is_test": is_test, "spatial": spatial, "consumed_inputs": consumed_inputs})
    label = f"{OP}-{version.since}"
    common.check_data_format(label, data_format)
    arrays = {n: common.as_array(n, v)
              for n, v in zip(_INPUTS, (X, scale, B, input_mean, input_var), strict=True)}
    check_types(version, arrays)
    X = arrays.pop("X")
    if X.ndim < 1:
        raise ValueError(f"{label}: X must have at least 1 dimension (N), got a scalar")
    if version.since == 1 and X.ndim != 4:
        raise ValueError(f"{label}: X must be 4-D (N x C x H x W), got shape {X.shape}")
    eps = common.check_epsilon(label, attrs["epsilon"])
    common.check_channel_params(label, common.channel_count(X, data_format), arrays)
    if out is not None:
        common.check_out(label, out, X, arrays)
    mode(version, attrs)
    mean, a, b = common.fold_parameters(arrays["scale"], arrays["B"], arrays["input_mean"],
                                        arrays["input_var"], eps, X.dtype)
    return common.normalize(X, mean, a, b, data_format, out, engine, path)

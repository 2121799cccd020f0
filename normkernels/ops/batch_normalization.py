"""ONNX BatchNormalization, opsets 1, 6, 7, 9, 14 and 15 (spec layer).

One :class:`Version` per since-version states what that version accepts: its
attributes with their schema defaults, its type variables and their dtypes. The
version that serves a model's opset is the highest since-version at or below it.

Modes: opsets 14/15 by ``training_mode``; opsets 1/6 by ``is_test``; opsets 7/9 by
the number of outputs requested (``num_outputs``: 1 is inference). Training normalizes
Y with the batch statistics (population variance) and returns the running statistics
``input * momentum + batch * (1 - momentum)`` in the dtype of input_mean/input_var;
opsets 1-9 add saved_mean and saved_var (the batch mean and variance, as the spec
words it; ``saved_var="inv_std"`` gives onnxruntime's 1/sqrt(var + epsilon)).
``spatial=0`` (opsets 1, 6, 7) computes statistics per activation over N.

Attributes are checked in every mode, whether or not the mode uses them: INT
attributes are integers (Python or NumPy integers, bools), ``training_mode`` and
``spatial`` 0 or 1, ``is_test`` any integer (ONNX: nonzero is test mode); FLOAT
attributes (``epsilon``, ``momentum``) are finite real numbers, never strings;
``saved_var`` is "variance" or "inv_std" at every opset.
"""

import functools
from dataclasses import dataclass, field

import numpy as np

from normkernels.ops import common
from normkernels.ops.common import ALL_FLOATS, BFLOAT16

OP = "BatchNormalization"
_NO_BF16 = tuple(d for d in ALL_FLOATS if d != BFLOAT16)
_INPUTS = ("X", "scale", "B", "input_mean", "input_var")


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


def version_for(opset):
    """The BatchNormalization version in force at ``opset`` (an int >= 1, or a NumPy
    integer)."""
    return _version_for(opset if type(opset) is int else common.check_opset(OP, opset))


@functools.cache
def _version_for(opset):
    return common.version_in_force(OP, VERSIONS, opset)


def resolve_attributes(version, given):
    """Schema defaults overlaid with the attributes the caller gave (not None)."""
    return common.resolve_attributes(f"{OP}-{version.since}", version.attributes, given)


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


SAVED_VAR = ("variance", "inv_std")
# INT attributes: the values allowed (None: any integer; is_test is "nonzero" in ONNX)
_INT_ATTRIBUTES = {"training_mode": (0, 1), "is_test": None, "spatial": (0, 1)}


def check_attributes(label, attrs):
    """The INT attributes as Python ints and momentum as a Python float, checked in
    every mode; epsilon is checked by the caller."""
    for name, choices in _INT_ATTRIBUTES.items():
        if name in attrs:
            attrs[name] = common.check_int_attribute(label, name, attrs[name], choices)
    attrs["momentum"] = common.check_float_attribute(label, "momentum", attrs["momentum"])
    return attrs


def check_saved_var(label, saved_var):
    """``saved_var`` (a normkernels option, used by opsets 1-9 in training) is checked
    on every call, whatever the opset and mode."""
    if not isinstance(saved_var, str) or saved_var not in SAVED_VAR:
        raise ValueError(f"{label}: saved_var must be one of {SAVED_VAR}, got {saved_var!r}")


def mode(version, attrs, num_outputs):
    """"inference" or "training" for these attributes and output count."""
    label = f"{OP}-{version.since}"
    if version.since >= 14:
        if num_outputs is not None:
            raise TypeError(f"{label}: num_outputs is for opsets 1-9, whose mode or outputs "
                            "it selects; opsets 14+ return (Y, running_mean, running_var) "
                            "in training mode")
        return "training" if attrs["training_mode"] else "inference"
    if num_outputs is None:
        num_outputs = 1
    if not common.is_integer(num_outputs) or not 1 <= num_outputs <= 5:
        raise ValueError(f"{label}: num_outputs must be an integer from 1 to 5 (Y, mean, "
                         f"var, saved_mean, saved_var), got {num_outputs!r}")
    num_outputs = int(num_outputs)
    if version.since in (1, 6):
        training = not attrs["is_test"]
        if not training and num_outputs > 1:
            raise ValueError(f"{label}: is_test={attrs['is_test']} (nonzero: test mode) has "
                             f"one output, Y; num_outputs={num_outputs} asks for training "
                             "outputs")
    else:
        training = num_outputs > 1  # opsets 7 and 9: the outputs select the mode
    return "training" if training else "inference"


def batch_normalization(X, scale, B, input_mean, input_var, *, epsilon=None, momentum=None,
                        training_mode=None, is_test=None, spatial=None, consumed_inputs=None,
                        num_outputs=None, saved_var="variance", opset=15, data_format="NCX",
                        out=None, engine, path=None):
    """Spec layer of :func:`normkernels.batch_normalization`; ``engine`` runs the loops."""
    version = version_for(opset)
    attrs = resolve_attributes(version, {
        "epsilon": epsilon, "momentum": momentum, "training_mode": training_mode,
        "is_test": is_test, "spatial": spatial, "consumed_inputs": consumed_inputs})
    label = f"{OP}-{version.since}"
    attrs = check_attributes(label, attrs)
    check_saved_var(label, saved_var)
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
    if out is not None:
        common.check_out(label, out, X, arrays)
    run_mode = mode(version, attrs, num_outputs)
    if not attrs.get("spatial", 1):
        return _non_spatial(label, version, X, arrays, data_format, out, (
            run_mode, eps, attrs["momentum"], num_outputs, saved_var, engine, path))
    common.check_channel_params(label, common.channel_count(X, data_format), arrays)
    return _run(label, version, X, arrays, data_format, out, run_mode, eps, attrs["momentum"],
                num_outputs, saved_var, engine, path)


def _non_spatial(label, version, X, arrays, data_format, out, run_args):
    """``spatial=0``: statistics and parameters per activation (every position of
    the non-batch axes), so X runs as N x F with F activations, F = X.size / N.

    Parameters have the shape of one sample (``X.shape[1:]``: C x D1 ... Dn in NCX);
    opsets 1 and 6 also take shape (C,), broadcast over the spatial positions. The
    statistics outputs then have the shape of one sample.
    """
    sample = X.shape[1:] if X.ndim > 1 else ()
    C = common.channel_count(X, data_format)
    positions = int(np.prod(sample, dtype=np.int64)) // max(C, 1) if sample else 1
    expanded = {}
    for name, p in arrays.items():
        if p.shape == sample or (not sample and p.shape == (1,)):
            expanded[name] = p.reshape(-1)
        elif version.since in (1, 6) and p.shape == (C,):
            expanded[name] = (np.repeat(p, positions) if data_format == "NCX"
                              else np.tile(p, positions))
        else:
            allowed = f"{sample}" + (f" or ({C},)" if version.since in (1, 6) else "")
            raise ValueError(f"{label}: with spatial=0, {name} must have shape {allowed} "
                             f"(one value per activation), got {p.shape}")
    activations = int(np.prod(sample, dtype=np.int64)) if sample else 1
    X2 = X.reshape(X.shape[0], activations)
    out2 = out.reshape(X2.shape) if out is not None and out.flags.c_contiguous else None
    result = _run(label, version, X2, expanded, "NCX", out2, *run_args)
    if isinstance(result, tuple):
        Y, stats = result[0], tuple(v.reshape(sample or (1,)) for v in result[1:])
    else:
        Y, stats = result, ()
    Y = Y.reshape(X.shape)
    if out is not None and out2 is None:
        np.copyto(out, Y)
        Y = out
    elif out is not None:
        Y = out
    return (Y, *stats) if isinstance(result, tuple) else Y


def _run(label, version, X, arrays, data_format, out, run_mode, eps, momentum, num_outputs,
         saved_var, engine, path):
    if run_mode == "inference":
        mean, a, b = common.fold_parameters(arrays["scale"], arrays["B"],
                                            arrays["input_mean"], arrays["input_var"], eps,
                                            X.dtype)
        return common.normalize(X, mean, a, b, data_format, out, engine, path)
    return _training(label, version, X, arrays, eps, momentum, num_outputs or 1, saved_var,
                     data_format, out, engine, path)


def _training(label, version, X, arrays, eps, momentum, num_outputs, saved_var, data_format,
              out, engine, path):
    """Y normalized with the batch statistics, and the running (and saved) statistics."""
    if X.size == 0:
        raise ValueError(f"{label}: training mode on an empty X (shape {X.shape}): batch "
                         "statistics of zero elements are undefined")
    # Statistics, then normalize: X is read twice. Fusing per channel (its planes
    # normalized while still in L2, Y streamed) was measured slower on (32,64,112,112)
    # f32, 2 threads: a channel per thread 11.9 ms, a channel's planes split over the
    # threads 8.9 ms, that pipelined with the next channel's statistics 9.3-9.6 ms,
    # against 8.3-8.7 ms unfused (inference 4.1 ms). Here reading and writing do not
    # overlap in the fused loop, and the machine's read and write bandwidths add.
    Xc, C, S = common.contiguous_layout(X, data_format)
    count, batch_mean, m2 = engine.moments(Xc, C, S)
    batch_var = m2 / count  # population variance (divide by N)
    mean, a, b = common.fold_parameters(arrays["scale"], arrays["B"], batch_mean, batch_var,
                                        eps, X.dtype)
    Y = common.normalize(X, mean, a, b, data_format, out, engine, path)
    stats_dtype = arrays["input_mean"].dtype  # T2 (opset 15), U (14), T (1-9)
    # divide: saved_var="inv_std" of a zero var + epsilon is inf, as the formula gives
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        running_mean = (arrays["input_mean"].astype(np.float64) * momentum
                        + batch_mean * (1.0 - momentum)).astype(stats_dtype)
        running_var = (arrays["input_var"].astype(np.float64) * momentum
                       + batch_var * (1.0 - momentum)).astype(stats_dtype)
        if version.since >= 14:
            return Y, running_mean, running_var
        saved = (batch_var if saved_var == "variance"
                 else 1.0 / np.sqrt(batch_var + eps)).astype(stats_dtype)
    outputs = (Y, running_mean, running_var, batch_mean.astype(stats_dtype), saved)
    return outputs[0] if num_outputs == 1 else outputs[:num_outputs]

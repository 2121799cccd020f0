"""ONNX BatchNormalization, opsets 1, 6, 7, 9, 14 and 15 (spec layer).

One :class:`Version` per since-version states what that version accepts and does:
its attributes with their schema defaults (and the required ones), its type
variables and their dtypes, what selects the mode, the outputs of training, the rank
rule and whether spatial=0 takes per-channel parameters. The version that serves a
model's opset is the highest since-version at or below it. :func:`prepare` turns the
attributes into a checked :class:`Call` (integrations such as :mod:`normkernels.dask`
use it to check arguments before they have tensors).

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

from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np

from normkernels.ops import common, plans, training_plans
from normkernels.ops.common import ALL_FLOATS, NO_BF16

OP = "BatchNormalization"
INPUTS = ("X", "scale", "B", "input_mean", "input_var")
RUNNING_OUTPUTS = ("Y", "running_mean", "running_var")
SAVED_OUTPUTS = ("Y", "mean", "var", "saved_mean", "saved_var")


@dataclass(frozen=True)
class Version(common.Version):
    """One since-version of BatchNormalization and the behaviour it fixes."""

    type_vars: dict = field(default_factory=dict)  # input name -> type variable
    dtypes: dict = field(default_factory=dict)  # type variable -> allowed dtypes
    mode_from: str = "training_mode"  # what selects training: an attribute, or
    #                                   "num_outputs" (opsets 7, 9)
    outputs: tuple = RUNNING_OUTPUTS  # the outputs of training mode, in order
    exact_rank: int = None  # X must have exactly this rank (opset 1: 4-D)
    channel_params_broadcast: bool = False  # spatial=0 also takes (C,) parameters

    @property
    def counts_outputs(self):
        """Opsets 1-9: the caller says how many outputs the node has."""
        return self.outputs == SAVED_OUTPUTS


def _single_type(since, required=(), **behaviour_and_attributes):
    """Opsets 1-9: every input is T, one of float16/float32/float64."""
    behaviour = {k: behaviour_and_attributes.pop(k) for k in
                 ("mode_from", "exact_rank", "channel_params_broadcast")
                 if k in behaviour_and_attributes}
    return Version(since, behaviour_and_attributes, required,
                   type_vars=dict.fromkeys(INPUTS, "T"), dtypes={"T": NO_BF16},
                   outputs=SAVED_OUTPUTS, **behaviour)


VERSIONS = {
    1: _single_type(1, ("consumed_inputs",), consumed_inputs=None, epsilon=1e-5, is_test=0,
                    momentum=0.9, spatial=1, mode_from="is_test", exact_rank=4,
                    channel_params_broadcast=True),
    6: _single_type(6, epsilon=1e-5, is_test=0, momentum=0.9, spatial=1, mode_from="is_test",
                    channel_params_broadcast=True),
    7: _single_type(7, epsilon=1e-5, momentum=0.9, spatial=1, mode_from="num_outputs"),
    9: _single_type(9, epsilon=1e-5, momentum=0.9, mode_from="num_outputs"),
    14: Version(14, {"epsilon": 1e-5, "momentum": 0.9, "training_mode": 0},
                type_vars={"X": "T", "scale": "T", "B": "T", "input_mean": "U",
                           "input_var": "U"},
                dtypes={"T": ALL_FLOATS, "U": ALL_FLOATS}),
    15: Version(15, {"epsilon": 1e-5, "momentum": 0.9, "training_mode": 0},
                type_vars={"X": "T", "scale": "T1", "B": "T1", "input_mean": "T2",
                           "input_var": "T2"},
                dtypes={"T": ALL_FLOATS, "T1": ALL_FLOATS, "T2": ALL_FLOATS}),
}


version_for = common.version_lookup(OP, VERSIONS)


def resolve_attributes(version, given):
    """Schema defaults overlaid with the attributes the caller gave (not None)."""
    return common.resolve_attributes(version.label(OP), version, given)


def check_types(version, arrays):
    """Dtypes against the version's type variables: each allowed, and the inputs of
    one type variable sharing one dtype (anything with a ``dtype`` will do: NumPy or
    dask arrays)."""
    if _types_ok(version, arrays):
        return
    label = version.label(OP)
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


class Call(NamedTuple):  # a tuple: cheap to build on every call (per-call latency)
    """What one call computes, once its arguments are checked: everything but the
    tensors."""

    version: Version
    label: str
    training: bool
    epsilon: float
    momentum: float
    spatial: bool  # False: statistics and parameters per activation
    num_outputs: int  # outputs returned in training (opsets 1-9; 3 for 14/15)
    saved_var: str
    data_format: str
    engine: object = None
    path: str = None
    act: str = None  # an activation epilogue's name (package extension), or None
    res: object = None  # a residual added before the activation (package extension)


def prepare(opset, attributes, num_outputs=None, saved_var="variance", data_format="NCX",
            engine=None, path=None):
    """The :class:`Call` of these attributes (None: the schema default) at ``opset``:
    every attribute checked in every mode, whether or not the mode uses it (INT
    attributes integers, training_mode and spatial 0 or 1; epsilon and momentum
    finite real numbers; saved_var "variance" or "inv_std"; data_format)."""
    version = version_for(opset)
    label = version.label(OP)
    attrs = resolve_attributes(version, attributes)
    for name, choices in _INT_ATTRIBUTES.items():
        if name in attrs:
            attrs[name] = common.check_int_attribute(label, name, attrs[name], choices)
    momentum = common.check_float_attribute(label, "momentum", attrs["momentum"])
    if not isinstance(saved_var, str) or saved_var not in SAVED_VAR:
        raise ValueError(f"{label}: saved_var must be one of {SAVED_VAR}, got {saved_var!r}")
    common.check_data_format(label, data_format)
    eps = common.check_epsilon(label, attrs["epsilon"])
    training, num_outputs = _mode(version, label, attrs, num_outputs)
    return Call(version, label, training, eps, momentum, bool(attrs.get("spatial", 1)),
                num_outputs, saved_var, data_format, engine, path)


def _mode(version, label, attrs, num_outputs):
    """(training, outputs returned in training) for these attributes and outputs."""
    if not version.counts_outputs:
        if num_outputs is not None:
            raise TypeError(f"{label}: num_outputs is for opsets 1-9, whose mode or outputs "
                            "it selects; opsets 14+ return (Y, running_mean, running_var) "
                            "in training mode")
        return bool(attrs[version.mode_from]), len(version.outputs)
    if num_outputs is None:
        num_outputs = 1
    if not common.is_integer(num_outputs) or not 1 <= num_outputs <= len(version.outputs):
        raise ValueError(f"{label}: num_outputs must be an integer from 1 to "
                         f"{len(version.outputs)} ({', '.join(version.outputs)}), "
                         f"got {num_outputs!r}")
    num_outputs = int(num_outputs)
    if version.mode_from == "num_outputs":  # opsets 7 and 9: the outputs select the mode
        return num_outputs > 1, num_outputs
    training = not attrs[version.mode_from]  # opsets 1 and 6: is_test, nonzero is test
    if not training and num_outputs > 1:
        raise ValueError(f"{label}: is_test={attrs['is_test']} (nonzero: test mode) has "
                         f"one output, Y; num_outputs={num_outputs} asks for training "
                         "outputs")
    return training, num_outputs


def batch_normalization(X, scale, B, input_mean, input_var, *, epsilon=None, momentum=None,
                        training_mode=None, is_test=None, spatial=None, consumed_inputs=None,
                        num_outputs=None, saved_var="variance", opset=15, data_format="NCX",
                        activation=None, add=None, out=None, engine, path=None):
    """Spec layer of :func:`normkernels.batch_normalization`; ``engine`` runs the loops."""
    key = given = None
    if path is None and activation is None and add is None:  # an earlier call's plan
        try:
            # momentum.hex(): a zero momentum (the PyTorch adapter's) keeps its sign in
            # the key (-0.0 == 0.0, but their running outputs' zeros differ)
            key = (OP, engine, opset, epsilon,
                   momentum.hex() if type(momentum) is float else momentum,
                   training_mode, is_test, spatial,
                   consumed_inputs, num_outputs, saved_var, data_format, type(opset),
                   type(epsilon), type(momentum), type(training_mode), type(is_test),
                   type(spatial), type(consumed_inputs), type(num_outputs), type(saved_var),
                   type(data_format), type(X), X.shape, X.strides, X.dtype,
                   type(scale), scale.shape, scale.strides, scale.dtype,
                   type(B), B.shape, B.strides, B.dtype,
                   type(input_mean), input_mean.shape, input_mean.strides, input_mean.dtype,
                   type(input_var), input_var.shape, input_var.strides, input_var.dtype,
                   plans.out_key(out, X))
            plan = plans.get(key)
        except (AttributeError, TypeError):  # not arrays, or an unhashable attribute
            key = plan = None
        if plan is not None:
            Y = plan(X, scale, B, input_mean, input_var, out)
            if Y is not None:
                return Y
        given = (X, scale, B, input_mean, input_var)
    call = prepare(opset, {"epsilon": epsilon, "momentum": momentum,
                           "training_mode": training_mode, "is_test": is_test,
                           "spatial": spatial, "consumed_inputs": consumed_inputs},
                   num_outputs, saved_var, data_format, engine, path)
    if activation is not None:
        call = call._replace(act=common.check_activation(call.label, activation))
    arrays = {n: common.as_array(n, v)
              for n, v in zip(INPUTS, (X, scale, B, input_mean, input_var), strict=True)}
    check_types(call.version, arrays)
    X = arrays.pop("X")
    if X.ndim < 1:
        raise ValueError(f"{call.label}: X must have at least 1 dimension (N), got a scalar")
    rank = call.version.exact_rank
    if rank is not None and X.ndim != rank:
        raise ValueError(f"{call.label}: X must be {rank}-D (N x C x H x W), "
                         f"got shape {X.shape}")
    res = common.check_residual(call.label, "add", add, X)
    if out is not None:
        common.check_out(call.label, out, X, arrays,
                         {"X": X} if res is None else {"X": X, "add": res})
    if res is not None:
        if not call.spatial:
            raise ValueError(f"{call.label}: add= needs spatial=1 (statistics per channel)")
        call = call._replace(res=res)
    if not call.spatial:
        return _non_spatial(call, X, arrays, out)
    common.check_channel_params(call.label, common.channel_count(X, data_format), arrays)
    Y = _run(call, X, arrays, data_format, out)
    if (key is not None and call.epsilon and (call.momentum or type(momentum) is float)
            and plans.plain(given, (X, *arrays.values()))):
        plans.add(key, _plan(call, X, arrays, data_format, out))
    return Y


def _plan(call, X, arrays, data_format, out):
    """The plan a call that passed the checks leaves for the next with its key."""
    if not call.training:
        return plans.inference(call.engine, call.epsilon, X, data_format, out)
    if call.act is None and call.res is None:
        plan = training_plans.batch_training(
            call.engine, call.epsilon, X, arrays["scale"], arrays["B"], data_format, out,
            lambda *outputs: training_outputs(call, *outputs))
        if plan is not None:
            return plan

    def training(X, scale, B, input_mean, input_var, out):
        arrays = {"scale": scale, "B": B, "input_mean": input_mean, "input_var": input_var}
        return _training(call, X, arrays, data_format, out)

    return plans.Checked(training)


def _non_spatial(call, X, arrays, out):
    """``spatial=0``: statistics and parameters per activation (every position of
    the non-batch axes), so X runs as N x F with F activations, F = X.size / N.

    Parameters have the shape of one sample (``X.shape[1:]``: C x D1 ... Dn in NCX);
    opsets 1 and 6 also take shape (C,), broadcast over the spatial positions. The
    statistics outputs then have the shape of one sample.
    """
    sample = X.shape[1:] if X.ndim > 1 else ()
    C = common.channel_count(X, call.data_format)
    positions = int(np.prod(sample, dtype=np.int64)) // max(C, 1) if sample else 1
    broadcast = call.version.channel_params_broadcast
    expanded = {}
    for name, p in arrays.items():
        if p.shape == sample or (not sample and p.shape == (1,)):
            expanded[name] = p.reshape(-1)
        elif broadcast and p.shape == (C,):
            expanded[name] = (np.repeat(p, positions) if call.data_format == "NCX"
                              else np.tile(p, positions))
        else:
            allowed = f"{sample}" + (f" or ({C},)" if broadcast else "")
            raise ValueError(f"{call.label}: with spatial=0, {name} must have shape "
                             f"{allowed} (one value per activation), got {p.shape}")
    activations = int(np.prod(sample, dtype=np.int64)) if sample else 1
    X2 = X.reshape(X.shape[0], activations)
    out2 = out.reshape(X2.shape) if out is not None and out.flags.c_contiguous else None
    result = _run(call, X2, expanded, "NCX", out2)
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


def _run(call, X, arrays, data_format, out):
    if not call.training:
        return common.infer(X, arrays["scale"], arrays["B"], arrays["input_mean"],
                            arrays["input_var"], call.epsilon, data_format, out, call.engine,
                            call.path, call.act, call.res)
    return _training(call, X, arrays, data_format, out)


def _training(call, X, arrays, data_format, out):
    """Y normalized with the batch statistics, and the running (and saved) statistics.
    Statistics, then normalize: X is read twice (fusing them per channel was measured
    slower; see ``_training`` in docs/design.md)."""
    if X.size == 0:
        raise ValueError(f"{call.label}: training mode on an empty X (shape {X.shape}): "
                         "batch statistics of zero elements are undefined")
    engine = call.engine
    Xc, C, S = common.contiguous_layout(X, data_format)
    count, batch_mean, m2 = engine.channel_moments(Xc, C, S, call.path)
    batch_var = m2 / count  # population variance (divide by N)
    Y = common.infer(X, arrays["scale"], arrays["B"], batch_mean, batch_var, call.epsilon,
                     data_format, out, engine, call.path, call.act, call.res)
    return training_outputs(call, Y, batch_mean, batch_var, arrays["input_mean"],
                            arrays["input_var"])


def training_outputs(call, Y, batch_mean, batch_var, input_mean, input_var):
    """Training's outputs from Y and the float64 batch statistics: the running statistics
    in the dtype of input_mean (T2 at opset 15, U at 14, T at 1-9), and at opsets 1-9
    the saved ones, as many as the call returns."""
    engine, momentum = call.engine, call.momentum
    stats_dtype = input_mean.dtype
    running_mean = engine.running(input_mean, batch_mean, momentum, stats_dtype)
    running_var = engine.running(input_var, batch_var, momentum, stats_dtype)
    if call.version.outputs == RUNNING_OUTPUTS:
        return Y, running_mean, running_var
    # divide: saved_var="inv_std" of a zero var + epsilon is inf, as the formula gives
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        saved = (batch_var if call.saved_var == "variance"
                 else 1.0 / np.sqrt(batch_var + call.epsilon)).astype(stats_dtype)
    outputs = (Y, running_mean, running_var, batch_mean.astype(stats_dtype), saved)
    return outputs[0] if call.num_outputs == 1 else outputs[:call.num_outputs]

"""ONNX LayerNormalization-17 (spec layer).

Per row (the axes ``axis..`` of X): ``Y = (X - mean) / sqrt(var + epsilon) * Scale +
B`` with the population variance; optional outputs ``Mean`` and ``InvStdDev`` of shape
``X.shape[:axis] + (1, ...)`` in the stash type. X, Scale and B share the type T
(float16, bfloat16, float32, float64); Scale and B broadcast unidirectionally to X.

Where the function body and normkernels differ (docs/guide/rows.md):

* stage one (mean, variance, normalized value) is computed at least as precisely as
  the stash type: float64 statistics by two passes over the row (the body's
  ``E[x^2] - E[x]^2`` in float32 loses every digit at |mean|/std = 1e4), and the
  normalized value in the compute dtype (float64 for float64 X, else float32);
  ``stash_type`` sets the dtype of Mean and InvStdDev: 1 (float32) and 16 (bfloat16)
  as the spec allows, 11 (float64) as an extension;
* for 16-bit X, the normalized value is not rounded to X's type before the scale and
  bias: ``(x - mean) * inv * Scale + B`` is computed in float32 and rounded once.

Package extensions: ``activation=`` and ``add=`` (``Y = act(... * Scale + B + add)`` in
the same pass, see :mod:`normkernels.ops.rows`); Mean and InvStdDev are unchanged.
"""

from dataclasses import dataclass

from normkernels.ops import common, plans, rows
from normkernels.ops.common import ALL_FLOATS, BFLOAT16, FLOAT32, FLOAT64

OP = "LayerNormalization"
STASH_TYPES = {1: FLOAT32, 16: BFLOAT16, 11: FLOAT64}  # 11: a normkernels extension


@dataclass(frozen=True)
class Version(common.Version):
    dtypes: tuple = ALL_FLOATS


VERSIONS = {17: Version(17, {"axis": -1, "epsilon": 1e-5, "stash_type": 1})}

version_for = common.version_lookup(OP, VERSIONS)


def stash_dtype(label, stash_type, allowed=STASH_TYPES):
    """The dtype of ``stash_type`` (an ONNX TensorProto data type code)."""
    if not common.is_integer(stash_type):
        raise TypeError(f"{label}: stash_type must be an integer (a TensorProto data type), "
                        f"got {type(stash_type).__name__} {stash_type!r}")
    if int(stash_type) not in allowed:
        names = ", ".join(f"{k} ({common.dtype_names((v,))})" for k, v in allowed.items())
        raise ValueError(f"{label}: stash_type must be one of {names}; got {stash_type}")
    return allowed[int(stash_type)]


def check_outputs(label, num_outputs, most):
    if not common.is_integer(num_outputs) or not 1 <= num_outputs <= most:
        raise ValueError(f"{label}: num_outputs must be an integer from 1 to {most}, "
                         f"got {num_outputs!r}")
    return int(num_outputs)


def layer_normalization(X, Scale, B=None, *, axis=None, epsilon=None, stash_type=None,
                        num_outputs=1, opset=17, activation=None, add=None, out=None, engine,
                        path=None):
    """Spec layer of :func:`normkernels.layer_normalization`."""
    key = given = None
    # a plan of an earlier call with this metadata (see ops/plans.py); none with add=
    if path is None and add is None:
        try:
            key = (OP, engine, opset, axis, epsilon, stash_type, num_outputs, activation,
                   type(opset), type(axis), type(epsilon), type(stash_type), type(num_outputs),
                   type(activation),
                   type(X), X.shape, X.strides, X.dtype,
                   type(Scale), Scale.shape, Scale.strides, Scale.dtype,
                   None if B is None else (type(B), B.shape, B.strides, B.dtype),
                   plans.out_key(out, X))
            plan = plans.get(key)
        except (AttributeError, TypeError):  # not arrays, or an unhashable attribute
            key = plan = None
        if plan is not None:
            result = plan(X, Scale, B, out)
            if result is not None:
                return result
        given = (X, Scale) if B is None else (X, Scale, B)
    version = version_for(opset)
    label = version.label(OP)
    attrs = common.resolve_attributes(label, version, {"axis": axis, "epsilon": epsilon,
                                                       "stash_type": stash_type})
    eps = common.check_epsilon(label, attrs["epsilon"])
    stash = stash_dtype(label, attrs["stash_type"])
    n_out = check_outputs(label, num_outputs, 3)
    act = common.check_activation(label, activation)
    arrays = {"X": common.as_array("X", X), "Scale": common.as_array("Scale", Scale)}
    if B is not None:
        arrays["B"] = common.as_array("B", B)
    for name, arr in arrays.items():
        common.check_dtype(label, name, arr, version.dtypes)
    common.check_same_dtype(label, "T", arrays)
    X = arrays.pop("X")
    a = rows.normalized_axis(label, "axis", attrs["axis"], X.ndim)
    for name, p in arrays.items():
        rows.check_broadcast(label, name, p, X.shape)
    M, K = rows.rows_shape(X.shape, a)
    if K == 0 and M > 0:
        raise ValueError(f"{label}: X of shape {X.shape} has rows of zero elements (axis {a}): "
                         "their mean and variance are undefined")
    res = common.check_residual(label, "add", add, X)
    if out is not None:
        rows.check_out(label, out, X, arrays, res=res)
    finish = _outputs(n_out, stash, rows.statistics_shape(X.shape, a), eps)
    Y, mean, var = rows.normalize(X, a, arrays["Scale"], arrays.get("B"), eps, True, engine,
                                  path, out, act=act, res=res)
    checked = (X, *arrays.values())
    if key is not None and eps and plans.plain(given, checked):
        plans.add(key, rows.plan(engine, eps, True, X, a, checked[1:], out, finish, act=act))
    return finish(Y, mean, var)


def _outputs(n_out, stash, shape, epsilon):
    """``finish(Y, mean, var)``: the first ``n_out`` of Y, Mean and InvStdDev."""
    if n_out == 1:
        return lambda Y, mean, var: Y

    def finish(Y, mean, var):
        results = (Y, mean.astype(stash).reshape(shape),
                   rows.inverse_std(var, epsilon).astype(stash).reshape(shape))
        return results[:n_out]
    return finish

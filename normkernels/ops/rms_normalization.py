"""ONNX RMSNormalization-23 and onnxruntime's SimplifiedLayerNormalization (spec layer).

Per row (the axes ``axis..`` of X): ``Y = X / sqrt(mean(X**2) + epsilon) * scale``.
X has type T, scale type V (each float16, bfloat16, float32 or float64) and Y type V,
as the schemas declare. SimplifiedLayerNormalization (onnxruntime, default domain) is
the same with an optional second output ``inv_std_var = 1 / sqrt(mean(X**2) +
epsilon)`` of shape ``X.shape[:axis] + (1, ...)`` in its U type (stash_type 1:
float32, 11: float64).

Where the function body and normkernels differ (docs/guide/rows.md):

* the mean square is accumulated in float64 whatever ``stash_type`` (the body squares
  in the stash type; float16 squares overflow above 256), and the normalized value
  computed in float32 (float64 when X or scale is float64);
* T != V: the body's ``Mul`` is ill-typed and onnxruntime rejects the node;
  normkernels computes ``normalized * scale`` in the wider compute dtype and rounds
  once to V;
* for 16-bit X the normalized value is not rounded to X's type before the scale.

Package extensions (RMSNormalization): ``activation=`` and ``add=`` (X's shape and
dtype), ``Y = act(normalized * scale + add)`` in the same pass (see
:mod:`normkernels.ops.rows`); ``offset`` (Gemma's ``x_hat * (offset + scale)``, the sum
in float32, float64 when X or scale is) and ``rounding`` ("once": Y's one rounding;
"llama": ``round_V(round_V(x_hat) * scale)``, Hugging Face's LlamaRMSNorm and vLLM).
"""

from dataclasses import dataclass

from normkernels.ops import common, plans, rows
from normkernels.ops.common import ALL_FLOATS, BFLOAT16, FLOAT16, FLOAT32, FLOAT64
from normkernels.ops.layer_normalization import check_outputs, stash_dtype

OP = "RMSNormalization"
SIMPLIFIED = "SimplifiedLayerNormalization"
RMS_STASH = {1: FLOAT32, 10: FLOAT16, 11: FLOAT64, 16: BFLOAT16}
SIMPLIFIED_STASH = {1: FLOAT32, 11: FLOAT64}


@dataclass(frozen=True)
class Version(common.Version):
    dtypes: tuple = ALL_FLOATS


VERSIONS = {23: Version(23, {"axis": -1, "epsilon": 1e-5, "stash_type": 1})}

version_for = common.version_lookup(OP, VERSIONS)


def _key(op, engine, attributes, X, scale, out):
    """A plan key (see ops/plans.py), or None when the arguments are not arrays."""
    try:
        return (op, engine, *attributes, *map(type, attributes), type(X), X.shape, X.strides,
                X.dtype, type(scale), scale.shape, scale.strides, scale.dtype,
                plans.out_key(out, X))
    except AttributeError:
        return None


def _planned(key, X, scale, out):
    try:
        plan = plans.get(key)
    except TypeError:  # an unhashable attribute
        return None
    return None if plan is None else plan(X, scale, None, out)


def _run(label, X, scale, axis, epsilon, stash, out, engine, path, act=None, add=None,
         offset=0.0, rounding="once"):
    """Checks shared by both operators, then the normalization: ``(Y, a, var, X,
    scale)`` (the arrays as checked); ``act``, ``add``: the epilogue, ``offset``,
    ``rounding``: Gemma's and Llama's forms (unchecked)."""
    arrays = {"X": common.as_array("X", X), "scale": common.as_array("scale", scale)}
    for name, arr in arrays.items():
        common.check_dtype(label, name, arr, ALL_FLOATS)
    X, s = arrays["X"], arrays["scale"]
    a = rows.normalized_axis(label, "axis", axis, X.ndim)
    rows.check_broadcast(label, "scale", s, X.shape)
    M, K = rows.rows_shape(X.shape, a)
    if K == 0 and M > 0:
        raise ValueError(f"{label}: X of shape {X.shape} has rows of zero elements (axis {a}): "
                         "their mean square is undefined")
    act = common.check_activation(label, act)
    res = common.check_residual(label, "add", add, X)
    rounding = common.check_rounding(label, rounding)
    effective = common.offset_scale(label, offset, s, X)
    if out is not None:
        rows.check_out(label, out, X, {"scale": s}, dtype=s.dtype, res=res)
    Y, _, var = rows.normalize(X, a, effective, None, epsilon, False, engine, path, out,
                               out_dtype=s.dtype, act=act, res=res, rounding=rounding)
    return Y, a, var, X, s


def _add_plan(key, given, checked, engine, epsilon, a, out, finish, rounding="once",
              offset=0.0, act=None):
    X, s = checked
    if key is not None and epsilon and s.dtype == X.dtype and plans.plain(given, checked):
        plans.add(key, rows.plan(engine, epsilon, False, X, a, (s,), out, finish,
                                 rounding=rounding, offset=offset, act=act))


def rms_normalization(X, scale, *, axis=None, epsilon=None, stash_type=None, opset=23,
                      activation=None, add=None, offset=0.0, rounding="once", out=None, engine,
                      path=None):
    """Spec layer of :func:`normkernels.rms_normalization`."""
    key = None
    # a plan of an earlier call with this metadata (see ops/plans.py); none with add=
    plain = add is None and type(offset) in (int, float)
    if path is None and plain:
        key = _key(OP, engine, (opset, axis, epsilon, stash_type, rounding, offset, activation),
                   X, scale, out)
        Y = None if key is None else _planned(key, X, scale, out)
        if Y is not None:
            return Y
    version = version_for(opset)
    label = version.label(OP)
    attrs = common.resolve_attributes(label, version, {"axis": axis, "epsilon": epsilon,
                                                       "stash_type": stash_type})
    eps = common.check_epsilon(label, attrs["epsilon"])
    stash_dtype(label, attrs["stash_type"], RMS_STASH)  # checked; no output has it
    Y, a, _, *checked = _run(label, X, scale, attrs["axis"], eps, None, out, engine, path,
                             activation, add, offset, rounding)
    _add_plan(key, (X, scale), checked, engine, eps, a, out, _first, rounding,
              common.check_float_attribute(label, "offset", offset), activation)
    return Y


def _first(Y, mean, var):
    return Y


def simplified_layer_normalization(X, scale, *, axis=-1, epsilon=1e-5, stash_type=1,
                                   num_outputs=1, out=None, engine, path=None):
    """Spec layer of :func:`normkernels.simplified_layer_normalization`."""
    key = None
    if path is None:  # a plan of an earlier call with this metadata (see ops/plans.py)
        key = _key(SIMPLIFIED, engine, (axis, epsilon, stash_type, num_outputs), X, scale, out)
        result = None if key is None else _planned(key, X, scale, out)
        if result is not None:
            return result
    label = SIMPLIFIED
    eps = common.check_epsilon(label, epsilon)
    stash = stash_dtype(label, stash_type, SIMPLIFIED_STASH)
    n_out = check_outputs(label, num_outputs, 2)
    Y, a, var, *checked = _run(label, X, scale, axis, eps, stash, out, engine, path)
    finish = _first
    if n_out == 2:
        shape = rows.statistics_shape(Y.shape, a)

        def finish(Y, mean, var):
            return Y, rows.inverse_std(var, eps).astype(stash).reshape(shape)
    _add_plan(key, (X, scale), checked, engine, eps, a, out, finish)
    return finish(Y, None, var)

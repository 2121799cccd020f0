"""oneDNN Graph LayerNorm-1 and RMSNorm-1 (spec layer).

LayerNorm: ``dst = gamma * (src - mean) / sqrt(variance + epsilon) + beta`` over the
axes ``begin_norm_axis..`` (population mean and variance). With ``keep_stats`` (the
default) the outputs are ``(dst, mean, variance)``, the statistics of shape
``src.shape[:begin_norm_axis]`` (oneDNN drops the normalized axes; ONNX keeps them as
ones) in gamma's type (float32 without gamma). ``use_affine`` (default) needs gamma and
beta, both of the normalized span (``src.shape[begin_norm_axis:]`` or flat); without it
neither may be given.

RMSNorm: ``dst = gamma * src / sqrt(mean(src**2) + epsilon)``; gamma optional,
broadcastable to src. The graph document writes ``sqrt(RMS(x) + eps)`` with RMS
already a square root (a fourth root); the primitive document and the lowering define
the square root of the mean square plus epsilon, which is what this computes.

Types (the documents' tables): src/dst float32 with float32 gamma (and beta, mean,
variance); bfloat16 src with float32 or bfloat16; float16 src with float32 (RMSNorm:
also float16).
"""

import numpy as np

from normkernels.ops import common, plans, rows
from normkernels.ops.common import BFLOAT16, FLOAT16, FLOAT32

LAYER_NORM = "LayerNorm"
RMS_NORM = "RMSNorm"
SRC = (FLOAT32, BFLOAT16, FLOAT16)
GAMMA_DTYPES = {  # src dtype -> gamma dtypes, per operator
    LAYER_NORM: {FLOAT32: (FLOAT32,), BFLOAT16: (FLOAT32, BFLOAT16), FLOAT16: (FLOAT32,)},
    RMS_NORM: {FLOAT32: (FLOAT32,), BFLOAT16: (FLOAT32, BFLOAT16),
               FLOAT16: (FLOAT32, FLOAT16)},
}


def check_bool(label, name, value):
    """``value`` as a bool; a TypeError unless it is a Python or NumPy bool."""
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{label}: {name} must be a bool, got {type(value).__name__} {value!r}")
    return bool(value)


def _params(label, X, named, allowed=None):
    """The given parameters, checked for dtype (one dtype, allowed for src's)."""
    params = {n: common.as_array(n, v) for n, v in named.items() if v is not None}
    allowed = GAMMA_DTYPES[label][X.dtype] if allowed is None else allowed
    for name, p in params.items():
        common.check_dtype(label, name, p, allowed)
    common.check_same_dtype(label, "T2", params)
    return params


def affine_params(label, X, use_affine, gamma, beta, allowed=None):
    """gamma and beta checked against ``use_affine`` (both needed with it, neither
    allowed without) and for dtype (:func:`_params`); the given ones, as arrays."""
    affine = check_bool(label, "use_affine", use_affine)
    given = [n for n, v in (("gamma", gamma), ("beta", beta)) if v is not None]
    if affine and len(given) != 2:
        raise ValueError(f"{label}: use_affine=True needs gamma and beta (got "
                         f"{', '.join(given) or 'neither'})")
    if not affine and given:
        raise ValueError(f"{label}: use_affine=False takes no gamma or beta (got "
                         f"{', '.join(given)})")
    return _params(label, X, {"gamma": gamma, "beta": beta}, allowed)


def _src(label, src, begin_norm_axis, epsilon):
    X = common.as_array("src", src)
    common.check_dtype(label, "src", X, SRC)
    a = rows.normalized_axis(label, "begin_norm_axis", begin_norm_axis, X.ndim)
    eps = common.check_epsilon(label, epsilon)
    M, K = rows.rows_shape(X.shape, a)
    if K == 0 and M > 0:
        raise ValueError(f"{label}: src of shape {X.shape} has rows of zero elements: "
                         "their statistics are undefined")
    return X, a, eps


def _key(label, engine, attributes, src, params, out):
    """A plan key (see ops/plans.py) of the given arrays, or None when they are not
    arrays."""
    try:
        return (label, engine, *attributes, *map(type, attributes), type(src), src.shape,
                src.strides, src.dtype,
                *((None,) if p is None else (type(p), p.shape, p.strides, p.dtype)
                  for p in params), plans.out_key(out, src))
    except AttributeError:
        return None


def _planned(key, src, scale, B, out):
    try:
        plan = plans.get(key)
    except TypeError:  # an unhashable attribute
        return None
    return None if plan is None else plan(src, scale, B, out)


def _add_plan(key, given, checked, engine, epsilon, centered, X, a, out, finish):
    """A plan for the next call with this key: only with every parameter given (the
    plan's kernel call takes them as columns)."""
    if (key is not None and epsilon and all(g is not None for g in given)
            and plans.plain(given, checked)):
        plans.add(key, rows.plan(engine, epsilon, centered, X, a, checked[1:], out, finish))


def layer_norm(src, gamma=None, beta=None, *, begin_norm_axis=-1, epsilon=1e-5,
               keep_stats=True, use_affine=True, out=None, engine, path=None):
    """Spec layer of :func:`normkernels.layer_norm`."""
    label = LAYER_NORM
    key = None
    if path is None:  # a plan of an earlier call with this metadata (see ops/plans.py)
        key = _key(label, engine, (begin_norm_axis, epsilon, keep_stats, use_affine), src,
                   (gamma, beta), out)
        result = None if key is None else _planned(key, src, gamma, beta, out)
        if result is not None:
            return result
    X, a, eps = _src(label, src, begin_norm_axis, epsilon)
    keep = check_bool(label, "keep_stats", keep_stats)
    params = affine_params(label, X, use_affine, gamma, beta)
    checked = (X, *params.values())
    span = X.shape[a:]
    K = rows.rows_shape(X.shape, a)[1]
    for name, p in params.items():
        if p.shape != span and p.shape != (K,):
            raise ValueError(f"{label}: {name} must have the normalized shape {span} "
                             f"(or ({K},)), got {p.shape}")
        params[name] = p.reshape(span)
    if out is not None:
        rows.check_out(label, out, X, params)
    stats = params["gamma"].dtype if params else FLOAT32
    scale = params.get("gamma", np.ones(1, FLOAT32))
    finish = _stats_outputs(keep, stats, X.shape[:a])
    Y, mean, var = rows.normalize(X, a, scale, params.get("beta"), eps, True, engine, path,
                                  out)
    _add_plan(key, (src, gamma, beta), checked, engine, eps, True, X, a, out, finish)
    return finish(Y, mean, var)


def _stats_outputs(keep, stats, shape):
    """``finish(Y, mean, var)``: Y, or with ``keep`` also the statistics in ``stats``."""
    if not keep:
        return lambda Y, mean, var: Y
    return lambda Y, mean, var: (Y, mean.astype(stats).reshape(shape),
                                 var.astype(stats).reshape(shape))


def rms_norm(src, gamma=None, *, begin_norm_axis=-1, epsilon=1e-5, out=None, engine,
             path=None):
    """Spec layer of :func:`normkernels.rms_norm`."""
    label = RMS_NORM
    key = None
    if path is None:  # a plan of an earlier call with this metadata (see ops/plans.py)
        key = _key(label, engine, (begin_norm_axis, epsilon), src, (gamma,), out)
        Y = None if key is None else _planned(key, src, gamma, None, out)
        if Y is not None:
            return Y
    X, a, eps = _src(label, src, begin_norm_axis, epsilon)
    params = _params(label, X, {"gamma": gamma})
    scale = params.get("gamma", np.ones(1, FLOAT32))
    rows.check_broadcast(label, "gamma", scale, X.shape)
    if out is not None:
        rows.check_out(label, out, X, params)
    Y = rows.normalize(X, a, scale, None, eps, False, engine, path, out)[0]
    _add_plan(key, (src, gamma), (X, *params.values()), engine, eps, False, X, a, out,
              _first)
    return Y


def _first(Y, mean, var):
    return Y

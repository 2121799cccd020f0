"""Folding an inference BatchNormalization into the preceding Conv or Gemm (spec layer).

A graph optimizer's rewrite: ``BN(y) = a * y + b`` per output channel, with ``a =
scale / sqrt(var + epsilon)`` and ``b = B - mean * a``, so ``BN(Conv(x, W) + bias)`` is
``Conv(x, W') + bias'`` with ``W'[o, ...] = W[o, ...] * a[o]`` and ``bias'[o] =
bias[o] * a[o] + b[o]`` (bias 0 when absent). A Gemm/MatMul weight has its output
features on ``axis`` instead of axis 0; the rule is the same per output column.

``a``, ``W'`` and ``bias'`` are computed in float64 from the exact parameter values and
rounded once to the weight's dtype (:func:`normkernels.dtypes.round_once`:
ml_dtypes' own float64 -> bfloat16 cast rounds twice, through float32, and turns 1 +
2**-8 + 2**-40 into 1 instead of 1 + 2**-7). O(weights) NumPy work: no kernels, no
engine.
"""

import numpy as np

from normkernels.dtypes import round_once
from normkernels.ops import common
from normkernels.ops.common import ALL_FLOATS, FLOAT64

OP = "fold_batch_norm"
_PARAMS = ("scale", "B", "mean", "var")


def fold_batch_norm(weight, bias, scale, B, mean, var, *, epsilon=1e-5, axis=0):
    """Spec layer of :func:`normkernels.fold_batch_norm`: ``(weight', bias')``, new
    arrays of the weight's dtype."""
    W = common.as_array("weight", weight)
    common.check_dtype(OP, "weight", W, ALL_FLOATS)
    axis = _check_axis(axis, W.ndim)
    C = W.shape[axis]  # output channels (features)
    named = dict(zip(_PARAMS, (scale, B, mean, var), strict=True))
    if bias is not None:
        named["bias"] = bias
    params = {name: common.as_array(name, value) for name, value in named.items()}
    for name, p in params.items():
        common.check_dtype(OP, name, p, ALL_FLOATS)
        if p.shape != (C,):
            raise ValueError(f"{OP}: {name} must have shape ({C},) to match the {C} output "
                             f"features of weight (weight.shape[{axis}] of {W.shape}), "
                             f"got shape {p.shape}")
    eps = common.check_epsilon(OP, epsilon)
    if eps < 0:
        raise ValueError(f"{OP}: epsilon must be >= 0, got {eps}")
    p64 = {name: p.astype(FLOAT64) for name, p in params.items()}
    with np.errstate(all="ignore"):
        shifted = p64["var"] + eps
        negative = shifted < 0  # NaN compares False: it propagates
        if negative.any():
            o = int(np.flatnonzero(negative)[0])
            raise ValueError(f"{OP}: var + epsilon must not be negative, got var[{o}] = "
                             f"{float(p64['var'][o])} with epsilon {eps}")
        a = p64["scale"] / np.sqrt(shifted)
        b = p64["B"] - p64["mean"] * a
        given = p64.get("bias", np.zeros(C))
        fused_bias = given * a + b
        shape = [1] * W.ndim
        shape[axis] = C
        fused_weight = W.astype(FLOAT64) * a.reshape(shape)
    return round_once(fused_weight, W.dtype), round_once(fused_bias, W.dtype)


def _check_axis(axis, ndim):
    """``axis`` as a non-negative int: an integer (not a bool) in [-ndim, ndim)."""
    if not common.is_integer(axis):
        raise TypeError(f"{OP}: axis must be an integer, got {type(axis).__name__} {axis!r}")
    if not -ndim <= axis < ndim:
        raise ValueError(f"{OP}: axis must be in [{-ndim}, {ndim}) for a weight of "
                         f"{ndim} dimensions, got {axis}")
    return int(axis) % ndim

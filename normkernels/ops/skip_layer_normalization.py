"""onnxruntime's SkipLayerNormalization and SkipSimplifiedLayerNormalization
(com.microsoft, version 1; spec layer).

``s = input + skip (+ bias)`` rounded to T, then a layer normalization (centred:
``(s - mean) / sqrt(var + epsilon) * gamma (+ beta)``) or an RMS normalization
(simplified: ``s / sqrt(mean(s**2) + epsilon) * gamma``) over the last axis. input is
(batch, seq, hidden) or (tokens, hidden); skip has input's shape, or (1, seq, hidden)
or (seq, hidden) (repeated over the batch); gamma, beta and bias have shape (hidden,).
Outputs: output, then optionally mean and inv_std_var (float32, shape
``input.shape[:-1] + (1,)``; the simplified operator's mean is zeros, as onnxruntime
returns) and input_skip_bias_sum (``s``, T).

T is float32, float16 or bfloat16 (the schema), and float64 (onnxruntime's CPU kernel
registers it). ``output`` is the normalization of ``s`` as rounded to T, so it equals
:func:`normkernels.layer_normalization` of ``input_skip_bias_sum``.
"""

import math

import numpy as np

from normkernels.ops import common, plans, rows
from normkernels.ops.common import ALL_FLOATS, FLOAT32
from normkernels.ops.layer_normalization import check_outputs

SKIP = "SkipLayerNormalization"
SKIP_SIMPLIFIED = "SkipSimplifiedLayerNormalization"
EPSILON = 1e-12  # kDefaultSkipLayerNormEpsilon of onnxruntime's contrib headers


def _skip_rows(label, X, skip):
    """skip as contiguous rows of ``hidden`` that repeat over input's rows."""
    if X.ndim not in (2, 3):
        raise ValueError(f"{label}: input must be 2-D (tokens, hidden) or 3-D "
                         f"(batch, seq, hidden), got shape {X.shape}")
    allowed = [X.shape]
    if X.ndim == 3:
        allowed += [(1, *X.shape[1:]), X.shape[1:]]
    if skip.shape not in allowed:
        listed = " or ".join(str(tuple(s)) for s in allowed)
        raise ValueError(f"{label}: skip must have shape {listed}, got {skip.shape}")
    return np.ascontiguousarray(skip).reshape(-1, X.shape[-1])


def _skip_normalization(label, centered, input, skip, gamma, beta, bias, epsilon, num_outputs,
                        out, engine, path, rounding="once"):
    key = None
    # a plan of an earlier call with this metadata (see ops/plans.py); none for "llama"
    if path is None and rounding == "once":
        try:
            key = (label, engine, epsilon, num_outputs, type(epsilon), type(num_outputs),
                   *((type(a), a.shape, a.strides, a.dtype) if a is not None else None
                     for a in (input, skip, gamma, beta, bias)), plans.out_key(out, input))
            plan = plans.get(key)
        except (AttributeError, TypeError):  # not arrays, or an unhashable attribute
            key = plan = None
        if plan is not None:
            result = plan(input, gamma, beta, out, skip, bias)
            if result is not None:
                return result
    eps = common.check_epsilon(label, epsilon)
    rounding = common.check_rounding(label, rounding)
    n_out = check_outputs(label, num_outputs, 4)
    arrays = {"input": common.as_array("input", input), "skip": common.as_array("skip", skip),
              "gamma": common.as_array("gamma", gamma)}
    for name, value in (("beta", beta), ("bias", bias)):
        if value is not None:
            arrays[name] = common.as_array(name, value)
    for name, arr in arrays.items():
        common.check_dtype(label, name, arr, ALL_FLOATS)
    common.check_same_dtype(label, "T", arrays)
    X = arrays["input"]
    hidden = X.shape[-1] if X.ndim else 0
    if X.ndim in (2, 3) and hidden == 0 and X.size == 0 and math.prod(X.shape[:-1]) > 0:
        raise ValueError(f"{label}: input of shape {X.shape} has rows of zero elements: "
                         "their statistics are undefined")
    skip_rows = _skip_rows(label, X, arrays["skip"])
    for name in ("gamma", "beta", "bias"):
        if name in arrays and arrays[name].shape != (hidden,):
            raise ValueError(f"{label}: {name} must have shape ({hidden},) (hidden), got "
                             f"{arrays[name].shape}")
    others = {k: v for k, v in arrays.items() if k != "input"}
    if out is not None:
        rows.check_out(label, out, X, others)
    sums = np.empty(X.shape, X.dtype) if n_out == 4 else None
    Y, mean, var = rows.normalize(
        X, X.ndim - 1, arrays["gamma"], arrays.get("beta"), eps, centered, engine, path, out,
        skip=skip_rows, bias=arrays.get("bias"),
        sums=None if sums is None else sums.reshape(-1, hidden), rounding=rounding)
    shape = rows.statistics_shape(X.shape, X.ndim - 1)

    def finish(Y, mean, var):
        if n_out == 1:
            return Y
        results = (Y, (mean if centered else np.zeros_like(mean)).astype(FLOAT32).reshape(
            shape), rows.inverse_std(var, eps).astype(FLOAT32).reshape(shape), sums)
        return results[:n_out]

    given = (input, skip, gamma, beta, bias)
    checked = tuple(arrays.get(n) for n in ("input", "skip", "gamma", "beta", "bias"))
    if (key is not None and eps and n_out < 4
            and plans.plain([g for g in given if g is not None],
                            [c for c in checked if c is not None])):
        params = [c for c in checked[2:] if c is not None]
        plans.add(key, rows.plan(engine, eps, centered, X, X.ndim - 1, params, out, finish,
                                 skip=checked[1]))
    return finish(Y, mean, var)


def skip_layer_normalization(input, skip, gamma, beta=None, bias=None, *, epsilon=EPSILON,
                             num_outputs=1, rounding="once", out=None, engine, path=None):
    """Spec layer of :func:`normkernels.skip_layer_normalization`."""
    return _skip_normalization(SKIP, True, input, skip, gamma, beta, bias, epsilon,
                               num_outputs, out, engine, path, rounding)


def skip_simplified_layer_normalization(input, skip, gamma, bias=None, *, epsilon=EPSILON,
                                        num_outputs=1, rounding="once", out=None, engine,
                                        path=None):
    """Spec layer of :func:`normkernels.skip_simplified_layer_normalization`."""
    return _skip_normalization(SKIP_SIMPLIFIED, False, input, skip, gamma, None, bias, epsilon,
                               num_outputs, out, engine, path, rounding)

"""oneDNN Graph's training operations (spec layer): BatchNormForwardTraining-1,
BatchNormTrainingBackward-1 and LayerNormBackward-1 (specs/backward-passes.md,
section 5).

BatchNormForwardTraining: ``dst`` normalized with the batch mean and population
variance over N and the spatial axes, and the running statistics ``momentum * old +
(1 - momentum) * batch`` (the ONNX convention; ``mean`` and ``variance`` are the OLD
running statistics). The operation document marks ``momentum`` optional without a
default; the dnnl backend, its only implementation, uses 0.5
(``src/graph/backend/dnnl/executables/batch_norm.hpp``), so None means 0.5 here.
ONNX's 0.9 and PyTorch's 0.1 (the opposite convention) belong to other operators.

BatchNormTrainingBackward: the training-mode gradient of ``dst``, from the batch
``mean`` and ``variance`` with ``epsilon`` (``r = 1 / sqrt(variance + epsilon)``: the
forward's epsilon). With gamma the outputs are ``(diff_src, diff_gamma, diff_beta)``;
without, ``diff_src`` alone, computed for gamma = 1. (The document lets a graph pass
gamma yet not ask for diff_gamma/diff_beta; here gamma always brings them.)

LayerNormBackward: the gradient of LayerNorm from its ``mean`` and ``variance`` outputs
(shape ``src.shape[:begin_norm_axis]``); ``use_affine`` (default) needs gamma and beta
and returns ``(diff_src, diff_gamma, diff_beta)`` of gamma's shape; without it,
``diff_src`` alone. beta takes no part in the gradient; it is checked as an input.

Types: src, diff_dst and dst/diff_src (T1) float32, bfloat16 or float16; the
statistics, gamma and beta (T2) float32, or bfloat16 when src is bfloat16. Ranks: the
forward's (2-D or more); oneDNN's own shape inference asks 4-D of the BN backward.
"""

from typing import NamedTuple

import numpy as np

from normkernels.ops import backward, common, plans, rows, training_plans
from normkernels.ops.common import BFLOAT16, FLOAT16, FLOAT32

FORWARD = "BatchNormForwardTraining"
BACKWARD = "BatchNormTrainingBackward"
LN_BACKWARD = "LayerNormBackward"
T1 = (FLOAT32, BFLOAT16, FLOAT16)
T2 = (FLOAT32, BFLOAT16)
MOMENTUM = 0.5  # the dnnl backend's value when the attribute is absent


def _tensors(label, named):
    """The T1 tensors (``named``: name -> value, the first is src): arrays of one dtype
    and one shape."""
    arrays = {n: common.as_array(n, v) for n, v in named.items()}
    for name, arr in arrays.items():
        common.check_dtype(label, name, arr, T1)
    common.check_same_dtype(label, "T1", arrays)
    first, src = next(iter(arrays.items()))
    for name, arr in arrays.items():
        if arr.shape != src.shape:
            raise ValueError(f"{label}: {name} must have {first}'s shape {src.shape}, "
                             f"got {arr.shape}")
    return list(arrays.values())


def _params(label, src, named):
    """The given T2 inputs: one dtype, float32 or (for bfloat16 src) bfloat16."""
    params = {n: common.as_array(n, v) for n, v in named.items() if v is not None}
    for name, p in params.items():
        common.check_dtype(label, name, p, T2)
    common.check_same_dtype(label, "T2", params)
    if any(p.dtype == BFLOAT16 for p in params.values()) and src.dtype != BFLOAT16:
        raise TypeError(f"{label}: T2 ({', '.join(params)}) can be bfloat16 only when T1 "
                        f"(src) is bfloat16; src is {src.dtype}")
    return params


def _both_or_neither(label, gamma, beta):
    if (gamma is None) != (beta is None):
        raise ValueError(f"{label}: give gamma and beta together or neither, got only "
                         f"{'gamma' if gamma is not None else 'beta'}")


def _channels(label, src, data_format, params):
    common.check_data_format(label, data_format)
    if src.ndim < 2:
        raise ValueError(f"{label}: src must have at least 2 dimensions (N and C), got "
                         f"shape {src.shape}")
    C = common.channel_count(src, data_format)
    common.check_channel_params(label, C, params)
    return C


def batch_norm_forward_training(src, mean, variance, gamma=None, beta=None, *, epsilon,
                                momentum=None, data_format="NXC", out=None, engine,
                                path=None):
    """Spec layer of :func:`normkernels.batch_norm_forward_training`."""
    key = None
    if path is None:
        try:  # an earlier call's plan (normkernels/ops/training_plans.py)
            key = (FORWARD, engine, epsilon, type(epsilon), momentum, type(momentum),
                   data_format, type(data_format), *((type(a), a.shape, a.strides, a.dtype)
                   if a is not None else None for a in (src, mean, variance, gamma, beta)),
                   plans.out_key(out, src))
            plan = plans.get(key)
        except (AttributeError, TypeError):  # not arrays, or an unhashable attribute
            key = plan = None
        if plan is not None:
            outputs = plan(src, gamma, beta, mean, variance, out)
            if outputs is not None:
                return outputs
    given = (src, mean, variance, gamma, beta)
    label = FORWARD
    (X,) = _tensors(label, {"src": src})
    _both_or_neither(label, gamma, beta)
    params = _params(label, X, {"mean": mean, "variance": variance, "gamma": gamma,
                                "beta": beta})
    C = _channels(label, X, data_format, params)
    eps = common.check_epsilon(label, epsilon, positive=True)
    m = MOMENTUM if momentum is None else common.check_float_attribute(label, "momentum",
                                                                       momentum)
    if out is not None:
        common.check_out(label, out, X, params, {"src": X})
    if X.size == 0:
        raise ValueError(f"{label}: an empty src (shape {X.shape}): batch statistics of zero "
                         "elements are undefined")
    t2 = params["mean"].dtype
    scale = params.get("gamma", np.ones(C, t2))
    shift = params.get("beta", np.zeros(C, t2))
    Xc, C, S = common.contiguous_layout(X, data_format)
    count, batch_mean, m2 = engine.channel_moments(Xc, C, S, path)
    batch_var = m2 / count  # population variance
    dst = common.infer(X, scale, shift, batch_mean, batch_var, eps, data_format, out, engine,
                       path)
    finish = _outputs(engine, m, t2)
    if key is not None and m and plans.plain([a for a in given if a is not None],
                                             [X, *params.values()]):  # m: -0.0 == 0.0
        plan = training_plans.batch_training(engine, eps, X, scale, shift, data_format, out,
                                             finish)
        plans.add(key, None if plan is None else _Defaults(plan, scale, shift))
    return finish(dst, batch_mean, batch_var, params["mean"], params["variance"])


def _outputs(engine, momentum, t2):
    """``finish(dst, batch_mean, batch_var, mean, variance)``: the forward training's
    outputs (the running statistics, the batch statistics in the statistics' dtype)."""
    def finish(dst, batch_mean, batch_var, mean, variance):
        return (dst, engine.running(mean, batch_mean, momentum, t2),
                engine.running(variance, batch_var, momentum, t2), batch_mean.astype(t2),
                batch_var.astype(t2))
    return finish


class _Defaults(NamedTuple):
    """A forward training plan that takes gamma and beta as given (or its first call's
    defaults, ones and zeros, when they are None: the key says which)."""

    plan: object
    scale: object
    shift: object

    def __call__(self, src, gamma, beta, mean, variance, out):
        return self.plan(src, self.scale if gamma is None else gamma,
                         self.shift if beta is None else beta, mean, variance, out)

    def bind(self, src, gamma, beta, mean, variance, out):
        """The plan's :meth:`~normkernels.ops.training_plans.BatchTraining.bind`."""
        return self.plan.bind(src, self.scale if gamma is None else gamma,
                              self.shift if beta is None else beta, mean, variance, out)


class _Backward(NamedTuple):
    """A backward call whose checks passed: the BatchNormalization backward plan of
    ``key`` serves it, given gamma or ``ones`` (the key says which)."""

    key: tuple
    ones: object
    affine: bool

    def __call__(self, src, diff_dst, mean, variance, gamma, out):
        grads = plans.serve(self.key, diff_dst, src, self.ones if gamma is None else gamma,
                            mean, variance, None, out)
        return grads if grads is None or self.affine else grads[0]

    def bind(self, src, diff_dst, mean, variance, gamma, out):
        plan = plans.get(self.key)
        bound = None if not hasattr(plan, "bind") else plan.bind(
            diff_dst, src, self.ones if gamma is None else gamma, mean, variance, None, out)
        if bound is None or self.affine:
            return bound
        return lambda: (bound() or (None,))[0]


def batch_norm_training_backward(src, diff_dst, mean, variance, gamma=None, *, epsilon,
                                 data_format="NXC", out=None, engine, path=None):
    """Spec layer of :func:`normkernels.batch_norm_training_backward`."""
    key = None
    if path is None:
        try:  # an earlier call's plan
            key = (BACKWARD, engine, epsilon, type(epsilon), data_format, type(data_format),
                   *((type(a), a.shape, a.strides, a.dtype) if a is not None else None
                     for a in (src, diff_dst, mean, variance, gamma)), plans.out_key(out, src))
            plan = plans.get(key)
        except (AttributeError, TypeError):  # not arrays, or an unhashable attribute
            key = plan = None
        if plan is not None:
            grads = plan(src, diff_dst, mean, variance, gamma, out)
            if grads is not None:
                return grads
    given = (src, diff_dst, mean, variance, gamma)
    label = BACKWARD
    X, dY = _tensors(label, {"src": src, "diff_dst": diff_dst})
    params = _params(label, X, {"mean": mean, "variance": variance, "gamma": gamma})
    C = _channels(label, X, data_format, params)
    eps = common.check_epsilon(label, epsilon, positive=True)
    if out is not None:
        common.check_out(label, out, X, params, {"src": X, "diff_dst": dY})
    scale = params.get("gamma", np.ones(C, params["mean"].dtype))
    dX, dgamma, dbeta = backward.batch_normalization_backward(
        dY, X, scale, params["mean"], params["variance"], epsilon=eps, training=True,
        data_format=data_format, out=out, engine=engine, path=path)
    if key is not None and plans.plain([a for a in given if a is not None],
                                       [X, dY, *params.values()]):
        plans.add(key, _Backward(training_plans.channel_key(
            backward.BN, engine, eps, True, data_format, dY, X, scale, params["mean"],
            params["variance"], None, out), None if gamma is not None else scale,
            gamma is not None))
    return (dX, dgamma, dbeta) if gamma is not None else dX


def layer_norm_backward(src, diff_dst, mean, variance, gamma=None, beta=None, *,
                        begin_norm_axis=-1, epsilon=1e-5, use_affine=True, out=None, engine,
                        path=None):
    """Spec layer of :func:`normkernels.layer_norm_backward`."""
    from normkernels.ops.layer_norm import affine_params

    label = LN_BACKWARD
    X, dY = _tensors(label, {"src": src, "diff_dst": diff_dst})
    a = rows.normalized_axis(label, "begin_norm_axis", begin_norm_axis, X.ndim)
    eps = common.check_epsilon(label, epsilon)
    affine = affine_params(label, X, use_affine, gamma, beta, allowed=T2)
    stats = _params(label, X, {"mean": mean, "variance": variance, **affine})
    span, lead = X.shape[a:], X.shape[:a]
    K = rows.rows_shape(X.shape, a)[1]
    for name in affine:
        if stats[name].shape not in (span, (K,)):
            raise ValueError(f"{label}: {name} must have the normalized shape {span} "
                             f"(or ({K},)), got {stats[name].shape}")
    for name in ("mean", "variance"):
        if stats[name].shape != lead:
            raise ValueError(f"{label}: {name} must have shape {lead} (src.shape[:"
                             f"begin_norm_axis]), got {stats[name].shape}")
    if out is not None:
        common.check_out(label, out, X, stats, {"src": X, "diff_dst": dY})
    with np.errstate(all="ignore"):
        inv_std = 1.0 / np.sqrt(stats["variance"].astype(np.float64) + eps)
    scale = stats["gamma"].reshape(span) if affine else np.ones(span, FLOAT32)
    dX, dgamma, dbeta = backward.layer_normalization_backward(
        dY, X, scale, axis=a, epsilon=eps, mean=stats["mean"], inv_std=inv_std, out=out,
        engine=engine, path=path)
    if not affine:
        return dX
    shape = stats["gamma"].shape
    return dX, dgamma.reshape(shape), dbeta.reshape(shape).astype(stats["beta"].dtype)

"""normkernels' normalizations as torch custom operators (namespace ``normkernels``).

Each forward operator has a fake (shape and dtype only: what ``torch.compile`` and
``torch.export`` trace) and an autograd formula that calls a backward operator,
itself a custom operator with a fake, so a backward pass traces too. The kernels are
normkernels' public functions run on NumPy views of the tensors (no copy); outputs
are allocated by torch (``empty_like``: the input's memory format) and written with
``out=``. What a forward computes and a backward needs is saved from the forward
(the row normalizations' float64 mean and inverse standard deviation, the batch
statistics of BatchNorm training); GroupNorm and InstanceNorm backward recompute
theirs from X (float64), as their forward functions give none.

Differences from torch (README): the statistics are float64 for every dtype, and Y
is rounded once; eval-mode BatchNorm's dX does not read X.
"""


import numpy as np
import torch
from torch import Tensor

from normkernels import api
from normkernels.torch.tensors import array, numpy_dtype, optional, tensor

NS = "normkernels"
F64 = torch.float64


def _ones(shape, like):
    return np.ones(shape, numpy_dtype(like.dtype))


def _stats_shape(x, ndim):
    return (*x.shape[:x.dim() - ndim], *(1,) * ndim)


def _op(name):
    return torch.library.custom_op(f"{NS}::{name}", mutates_args=(), device_types="cpu")


# --- LayerNorm ---

@_op("layer_norm")
def layer_norm(x: Tensor, normalized_ndim: int, weight: Tensor | None,
               bias: Tensor | None, eps: float) -> tuple[Tensor, Tensor, Tensor]:
    """``(y, mean, rstd)``: LayerNorm over the last ``normalized_ndim`` axes; mean and
    rstd float64 of shape ``x.shape[:-n] + (1,) * n``."""
    X = array(x, "input")
    shape = X.shape[X.ndim - normalized_ndim:]
    scale = _ones(shape, x) if weight is None else array(weight, "weight")
    y = torch.empty_like(x)
    _, mean, rstd = api.layer_normalization(
        X, scale, optional(bias, "bias"), axis=X.ndim - normalized_ndim, epsilon=eps,
        stash_type=11, num_outputs=3, out=array(y, "out"))
    return y, tensor(mean), tensor(rstd)


@layer_norm.register_fake
def _(x, normalized_ndim, weight, bias, eps):
    stats = _stats_shape(x, normalized_ndim)
    return torch.empty_like(x), x.new_empty(stats, dtype=F64), x.new_empty(stats, dtype=F64)


@_op("layer_norm_backward")
def layer_norm_backward(dy: Tensor, x: Tensor, weight: Tensor | None, mean: Tensor,
                        rstd: Tensor, normalized_ndim: int) -> tuple[Tensor, Tensor, Tensor]:
    """``(dx, dweight, dbias)`` from the forward's saved mean and rstd."""
    X = array(x, "input")
    shape = X.shape[X.ndim - normalized_ndim:]
    scale = _ones(shape, x) if weight is None else array(weight, "weight")
    dx = torch.empty_like(x)
    _, dw, db = api.layer_normalization_backward(
        array(dy, "grad"), X, scale, axis=X.ndim - normalized_ndim, mean=array(mean, "mean"),
        inv_std=array(rstd, "rstd"), out=array(dx, "out"))
    return dx, tensor(dw), tensor(db)


@layer_norm_backward.register_fake
def _(dy, x, weight, mean, rstd, normalized_ndim):
    shape = x.shape[x.dim() - normalized_ndim:]
    dtype = x.dtype if weight is None else weight.dtype
    return torch.empty_like(x), x.new_empty(shape, dtype=dtype), x.new_empty(shape, dtype=dtype)


def _layer_norm_setup(ctx, inputs, output):
    x, normalized_ndim, weight, bias, _ = inputs
    _, mean, rstd = output
    ctx.mark_non_differentiable(mean, rstd)
    ctx.save_for_backward(x, weight, mean, rstd)
    ctx.normalized_ndim = normalized_ndim
    ctx.has_bias = bias is not None


def _layer_norm_grad(ctx, dy, dmean, drstd):
    x, weight, mean, rstd = ctx.saved_tensors
    dx, dw, db = layer_norm_backward(dy, x, weight, mean, rstd, ctx.normalized_ndim)
    return (dx, None, None if weight is None else dw, db if ctx.has_bias else None, None)


layer_norm.register_autograd(_layer_norm_grad, setup_context=_layer_norm_setup)


# --- RMSNorm ---

@_op("rms_norm")
def rms_norm(x: Tensor, normalized_ndim: int, weight: Tensor | None,
             eps: float) -> tuple[Tensor, Tensor]:
    """``(y, rstd)``: RMSNorm over the last ``normalized_ndim`` axes; rstd float64."""
    X = array(x, "input")
    shape = X.shape[X.ndim - normalized_ndim:]
    scale = _ones(shape, x) if weight is None else array(weight, "weight")
    y = torch.empty_like(x)
    _, rstd = api.simplified_layer_normalization(
        X, scale, axis=X.ndim - normalized_ndim, epsilon=eps, stash_type=11, num_outputs=2,
        out=array(y, "out"))
    return y, tensor(rstd)


@rms_norm.register_fake
def _(x, normalized_ndim, weight, eps):
    return torch.empty_like(x), x.new_empty(_stats_shape(x, normalized_ndim), dtype=F64)


@_op("rms_norm_backward")
def rms_norm_backward(dy: Tensor, x: Tensor, weight: Tensor | None, rstd: Tensor,
                      normalized_ndim: int) -> tuple[Tensor, Tensor]:
    X = array(x, "input")
    shape = X.shape[X.ndim - normalized_ndim:]
    scale = _ones(shape, x) if weight is None else array(weight, "weight")
    dx = torch.empty_like(x)
    _, dw = api.rms_normalization_backward(array(dy, "grad"), X, scale,
                                           axis=X.ndim - normalized_ndim,
                                           inv_std=array(rstd, "rstd"), out=array(dx, "out"))
    return dx, tensor(dw)


@rms_norm_backward.register_fake
def _(dy, x, weight, rstd, normalized_ndim):
    shape = x.shape[x.dim() - normalized_ndim:]
    return torch.empty_like(x), x.new_empty(shape, dtype=x.dtype if weight is None
                                            else weight.dtype)


def _rms_norm_setup(ctx, inputs, output):
    x, normalized_ndim, weight, _ = inputs
    ctx.mark_non_differentiable(output[1])
    ctx.save_for_backward(x, weight, output[1])
    ctx.normalized_ndim = normalized_ndim


def _rms_norm_grad(ctx, dy, drstd):
    x, weight, rstd = ctx.saved_tensors
    dx, dw = rms_norm_backward(dy, x, weight, rstd, ctx.normalized_ndim)
    return dx, None, None if weight is None else dw, None


rms_norm.register_autograd(_rms_norm_grad, setup_context=_rms_norm_setup)


# --- GroupNorm and InstanceNorm (statistics per (n, group) / (n, c)) ---

@_op("group_norm")
def group_norm(x: Tensor, num_groups: int, weight: Tensor | None, bias: Tensor | None,
               eps: float) -> Tensor:
    """GroupNorm of (N, C, *) (any memory format), weight and bias per channel."""
    X = array(x, "input")
    C = X.shape[1]
    scale = _ones(C, x) if weight is None else array(weight, "weight")
    B = np.zeros(C, scale.dtype) if bias is None else array(bias, "bias")
    y = torch.empty_like(x)
    api.group_normalization(X, scale, B, num_groups=num_groups, epsilon=eps,
                            out=array(y, "out"))
    return y


@group_norm.register_fake
def _(x, num_groups, weight, bias, eps):
    return torch.empty_like(x)


@_op("group_norm_backward")
def group_norm_backward(dy: Tensor, x: Tensor, weight: Tensor | None, num_groups: int,
                        eps: float) -> tuple[Tensor, Tensor, Tensor]:
    X = array(x, "input")
    scale = _ones(X.shape[1], x) if weight is None else array(weight, "weight")
    dx = torch.empty_like(x)
    _, dw, db = api.group_normalization_backward(array(dy, "grad"), X, scale,
                                                 num_groups=num_groups, epsilon=eps,
                                                 out=array(dx, "out"))
    return dx, tensor(dw), tensor(db)


def _channel_grads_fake(dy, x, weight, *_):
    dtype = x.dtype if weight is None else weight.dtype
    C = x.shape[1]
    return torch.empty_like(x), x.new_empty(C, dtype=dtype), x.new_empty(C, dtype=dtype)


group_norm_backward.register_fake(_channel_grads_fake)


def _group_norm_setup(ctx, inputs, output):
    x, num_groups, weight, bias, eps = inputs
    ctx.save_for_backward(x, weight)
    ctx.num_groups, ctx.eps, ctx.has_bias = num_groups, eps, bias is not None


def _group_norm_grad(ctx, dy):
    x, weight = ctx.saved_tensors
    dx, dw, db = group_norm_backward(dy, x, weight, ctx.num_groups, ctx.eps)
    return dx, None, None if weight is None else dw, db if ctx.has_bias else None, None


group_norm.register_autograd(_group_norm_grad, setup_context=_group_norm_setup)


@_op("instance_norm")
def instance_norm(x: Tensor, weight: Tensor | None, bias: Tensor | None,
                  eps: float) -> Tensor:
    """InstanceNorm of (N, C, *) with the statistics of each (n, c)."""
    X = array(x, "input")
    C = X.shape[1]
    scale = _ones(C, x) if weight is None else array(weight, "weight")
    B = np.zeros(C, scale.dtype) if bias is None else array(bias, "bias")
    y = torch.empty_like(x)
    api.instance_normalization(X, scale, B, epsilon=eps, out=array(y, "out"))
    return y


@instance_norm.register_fake
def _(x, weight, bias, eps):
    return torch.empty_like(x)


@_op("instance_norm_backward")
def instance_norm_backward(dy: Tensor, x: Tensor, weight: Tensor | None,
                           eps: float) -> tuple[Tensor, Tensor, Tensor]:
    X = array(x, "input")
    scale = _ones(X.shape[1], x) if weight is None else array(weight, "weight")
    dx = torch.empty_like(x)
    _, dw, db = api.instance_normalization_backward(array(dy, "grad"), X, scale, epsilon=eps,
                                                    out=array(dx, "out"))
    return dx, tensor(dw), tensor(db)


instance_norm_backward.register_fake(_channel_grads_fake)


def _instance_norm_setup(ctx, inputs, output):
    x, weight, bias, eps = inputs
    ctx.save_for_backward(x, weight)
    ctx.eps, ctx.has_bias = eps, bias is not None


def _instance_norm_grad(ctx, dy):
    x, weight = ctx.saved_tensors
    dx, dw, db = instance_norm_backward(dy, x, weight, ctx.eps)
    return dx, None if weight is None else dw, db if ctx.has_bias else None, None


instance_norm.register_autograd(_instance_norm_grad, setup_context=_instance_norm_setup)


# --- BatchNorm ---

@_op("batch_norm_training")
def batch_norm_training(x: Tensor, weight: Tensor | None, bias: Tensor | None,
                        eps: float) -> tuple[Tensor, Tensor, Tensor]:
    """``(y, mean, var)``: BatchNorm with the batch statistics of (N, C, *) (float64
    mean and population variance of each channel)."""
    X = array(x, "input")
    C = X.shape[1] if X.ndim > 1 else 1
    scale = _ones(C, x) if weight is None else array(weight, "weight")
    B = np.zeros(C, scale.dtype) if bias is None else array(bias, "bias")
    y = torch.empty_like(x)
    # momentum 0: ONNX's running outputs are then the batch statistics themselves
    _, mean, var = api.batch_normalization(X, scale, B, np.zeros(C), np.ones(C), epsilon=eps,
                                           momentum=0.0, training_mode=1,
                                           out=array(y, "out"))
    return y, tensor(mean), tensor(var)


@batch_norm_training.register_fake
def _(x, weight, bias, eps):
    C = x.shape[1] if x.dim() > 1 else 1
    return torch.empty_like(x), x.new_empty(C, dtype=F64), x.new_empty(C, dtype=F64)


@_op("batch_norm_backward")
def batch_norm_backward(dy: Tensor, x: Tensor, weight: Tensor | None, mean: Tensor,
                        var: Tensor, eps: float, training: bool) -> tuple[Tensor, Tensor, Tensor]:
    """``(dx, dweight, dbias)``; ``training``: mean and var are the batch statistics
    (dX through them), else the running statistics (constants)."""
    X = array(x, "input")
    C = X.shape[1] if X.ndim > 1 else 1
    scale = _ones(C, x) if weight is None else array(weight, "weight")
    dx = torch.empty_like(x)
    _, dw, db = api.batch_normalization_backward(array(dy, "grad"), X, scale,
                                                 array(mean, "mean"), array(var, "var"),
                                                 epsilon=eps, training=training,
                                                 out=array(dx, "out"))
    return dx, tensor(dw), tensor(db)


batch_norm_backward.register_fake(lambda dy, x, weight, *_: _bn_grads_fake(x, weight))


def _bn_grads_fake(x, weight):
    dtype = x.dtype if weight is None else weight.dtype
    C = x.shape[1] if x.dim() > 1 else 1
    return torch.empty_like(x), x.new_empty(C, dtype=dtype), x.new_empty(C, dtype=dtype)


def _bn_training_setup(ctx, inputs, output):
    x, weight, bias, eps = inputs
    _, mean, var = output
    ctx.mark_non_differentiable(mean, var)
    ctx.save_for_backward(x, weight, mean, var)
    ctx.eps, ctx.has_bias = eps, bias is not None


def _bn_training_grad(ctx, dy, dmean, dvar):
    x, weight, mean, var = ctx.saved_tensors
    dx, dw, db = batch_norm_backward(dy, x, weight, mean, var, ctx.eps, True)
    return dx, None if weight is None else dw, db if ctx.has_bias else None, None


batch_norm_training.register_autograd(_bn_training_grad, setup_context=_bn_training_setup)


@_op("batch_norm_inference")
def batch_norm_inference(x: Tensor, weight: Tensor | None, bias: Tensor | None,
                         running_mean: Tensor, running_var: Tensor, eps: float) -> Tensor:
    """BatchNorm with given (running) statistics."""
    X = array(x, "input")
    C = X.shape[1] if X.ndim > 1 else 1
    scale = _ones(C, x) if weight is None else array(weight, "weight")
    B = np.zeros(C, scale.dtype) if bias is None else array(bias, "bias")
    y = torch.empty_like(x)
    api.batch_normalization(X, scale, B, array(running_mean, "running_mean"),
                            array(running_var, "running_var"), epsilon=eps,
                            out=array(y, "out"))
    return y


@batch_norm_inference.register_fake
def _(x, weight, bias, running_mean, running_var, eps):
    return torch.empty_like(x)


def _bn_inference_setup(ctx, inputs, output):
    x, weight, bias, running_mean, running_var, eps = inputs
    ctx.save_for_backward(x, weight, running_mean, running_var)
    ctx.eps, ctx.has_bias = eps, bias is not None


def _bn_inference_grad(ctx, dy):
    x, weight, mean, var = ctx.saved_tensors
    dx, dw, db = batch_norm_backward(dy, x, weight, mean, var, ctx.eps, False)
    return dx, None if weight is None else dw, db if ctx.has_bias else None, None, None, None


batch_norm_inference.register_autograd(_bn_inference_grad, setup_context=_bn_inference_setup)

OPERATORS = (layer_norm, rms_norm, group_norm, instance_norm, batch_norm_training,
             batch_norm_inference)
BACKWARD = (layer_norm_backward, rms_norm_backward, group_norm_backward,
            instance_norm_backward, batch_norm_backward)

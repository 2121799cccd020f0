"""normkernels' normalizations as torch custom operators (namespace ``normkernels``),
and the plain functions they run.

Each ``*_impl`` function computes on NumPy views of the tensors (no copy), with
outputs laid out as ``torch.empty_like``'s (the input's memory format; from 4 MB on in
memory from NumPy's allocator, :func:`normkernels.torch.tensors.empty_like`) and
written with ``out=``. Each is registered as a custom operator with a fake (shape and dtype
only: what ``torch.compile`` and ``torch.export`` trace) and, for the forward
operators, an autograd formula that calls the backward operator. Eager calls skip
the dispatcher (``functional.py``: it cost 25 us a call) and run the same functions.

What a backward needs is saved from the forward: the row normalizations',
GroupNorm's and InstanceNorm's float64 mean and inverse standard deviation, BatchNorm
training's float64 batch statistics.
"""

import numpy as np
import torch
from torch import Tensor

from normkernels import api
from normkernels.engine.numba_engine import ENGINE
from normkernels.ops import group_normalization as _gn
from normkernels.ops import instance_normalization as _in
from normkernels.torch.tensors import array, empty_like, numpy_dtype, optional, tensor

NS = "normkernels"
F64 = torch.float64


def _scale(weight, x, shape):
    return np.ones(shape, numpy_dtype(x.dtype)) if weight is None else array(weight, "weight")


def _bias(bias, scale):
    return np.zeros(scale.shape, scale.dtype) if bias is None else array(bias, "bias")


def _channels(x):
    return x.shape[1] if x.dim() > 1 else 1


def _stats_shape(x, ndim):
    return (*x.shape[:x.dim() - ndim], *(1,) * ndim)


def _tail(x, ndim):
    return tuple(x.shape[x.dim() - ndim:])


def _grad_like(dy, x):
    """dY in x's memory order: autograd may hand a gradient in another layout (a
    contiguous dY for a channels_last x), which the kernels would read through a NumPy
    transposing copy (4 ms at (1, 320, 64, 64); torch's copy_ takes a tenth)."""
    if dy.stride() == x.stride() or dy.shape != x.shape:
        return dy
    return torch.empty_like(x, dtype=dy.dtype).copy_(dy)


# --- the plain functions ---

def layer_norm_impl(x: Tensor, normalized_ndim: int, weight: Tensor | None,
                    bias: Tensor | None, eps: float) -> tuple[Tensor, Tensor, Tensor]:
    """``(y, mean, rstd)``: LayerNorm over the last ``normalized_ndim`` axes; mean and
    rstd float64 of shape ``x.shape[:-n] + (1,) * n``."""
    X = array(x, "input")
    y = empty_like(x)
    _, mean, rstd = api.layer_normalization(
        X, _scale(weight, x, _tail(x, normalized_ndim)), optional(bias, "bias"),
        axis=X.ndim - normalized_ndim, epsilon=eps, stash_type=11, num_outputs=3,
        out=array(y, "out"))
    return y, tensor(mean), tensor(rstd)


def layer_norm_y(x, normalized_ndim, weight, bias, eps):
    """:func:`layer_norm_impl`'s y alone (no statistics kept: inference)."""
    X = array(x, "input")
    y = empty_like(x)
    api.layer_normalization(X, _scale(weight, x, _tail(x, normalized_ndim)),
                            optional(bias, "bias"), axis=X.ndim - normalized_ndim,
                            epsilon=eps, out=array(y, "out"))
    return y


def layer_norm_backward_impl(dy: Tensor, x: Tensor, weight: Tensor | None, mean: Tensor,
                             rstd: Tensor, normalized_ndim: int) -> tuple[Tensor, Tensor, Tensor]:
    """``(dx, dweight, dbias)`` from the forward's mean and rstd."""
    X = array(x, "input")
    dx = empty_like(x)
    _, dw, db = api.layer_normalization_backward(
        array(dy, "grad"), X, _scale(weight, x, _tail(x, normalized_ndim)),
        axis=X.ndim - normalized_ndim, mean=array(mean, "mean"), inv_std=array(rstd, "rstd"),
        out=array(dx, "out"))
    return dx, tensor(dw), tensor(db)


def rms_norm_impl(x: Tensor, normalized_ndim: int, weight: Tensor | None,
                  eps: float) -> tuple[Tensor, Tensor]:
    """``(y, rstd)``: RMSNorm over the last ``normalized_ndim`` axes; rstd float64."""
    X = array(x, "input")
    y = empty_like(x)
    _, rstd = api.simplified_layer_normalization(
        X, _scale(weight, x, _tail(x, normalized_ndim)), axis=X.ndim - normalized_ndim,
        epsilon=eps, stash_type=11, num_outputs=2, out=array(y, "out"))
    return y, tensor(rstd)


def rms_norm_y(x, normalized_ndim, weight, eps, rounding="once", offset=0.0):
    """:func:`rms_norm_impl`'s y alone; ``rounding`` and ``offset`` as
    :func:`normkernels.rms_normalization`'s (the model zoos' RMSNorm classes)."""
    X = array(x, "input")
    y = empty_like(x)
    api.rms_normalization(X, _scale(weight, x, _tail(x, normalized_ndim)),
                          axis=X.ndim - normalized_ndim, epsilon=eps, rounding=rounding,
                          offset=offset, out=array(y, "out"))
    return y


def rms_norm_backward_impl(dy: Tensor, x: Tensor, weight: Tensor | None, rstd: Tensor | None,
                           normalized_ndim: int, eps: float = 0.0) -> tuple[Tensor, Tensor]:
    """``(dx, dweight)``; ``rstd`` None: recomputed from x with ``eps``."""
    X = array(x, "input")
    dx = empty_like(x)
    _, dw = api.rms_normalization_backward(
        array(dy, "grad"), X, _scale(weight, x, _tail(x, normalized_ndim)),
        axis=X.ndim - normalized_ndim, epsilon=eps, inv_std=optional(rstd, "rstd"),
        out=array(dx, "out"))
    return dx, tensor(dw)


def group_norm_impl(x: Tensor, num_groups: int, weight: Tensor | None, bias: Tensor | None,
                    eps: float) -> tuple[Tensor, Tensor, Tensor]:
    """``(y, mean, rstd)``: GroupNorm of (N, C, *) (any memory format), weight and bias
    per channel; mean and rstd float64 of shape (N, num_groups), the statistics Y was
    normalized with (as ``torch.native_group_norm``'s, kept for the backward)."""
    scale = _scale(weight, x, _channels(x))
    y = empty_like(x)
    _, mean, rstd = _gn.group_normalization(
        array(x, "input"), scale, _bias(bias, scale), num_groups=num_groups, epsilon=eps,
        out=array(y, "out"), engine=ENGINE, statistics=True)
    return y, tensor(mean), tensor(rstd)


def group_norm_y(x, num_groups, weight, bias, eps):
    """:func:`group_norm_impl`'s y alone (no statistics kept: inference, with the
    call plans of :func:`normkernels.group_normalization`)."""
    scale = _scale(weight, x, _channels(x))
    y = empty_like(x)
    api.group_normalization(array(x, "input"), scale, _bias(bias, scale),
                            num_groups=num_groups, epsilon=eps, out=array(y, "out"))
    return y


def group_norm_backward_impl(dy: Tensor, x: Tensor, weight: Tensor | None, mean: Tensor,
                             rstd: Tensor, num_groups: int) -> tuple[Tensor, Tensor, Tensor]:
    """``(dx, dweight, dbias)`` with the forward's statistics (:func:`group_norm_impl`)."""
    dx = empty_like(x)
    _, dw, db = api.group_normalization_backward(
        array(_grad_like(dy, x), "grad"), array(x, "input"), _scale(weight, x, _channels(x)),
        num_groups=num_groups, mean=array(mean, "mean"), inv_std=array(rstd, "rstd"),
        out=array(dx, "out"))
    return dx, tensor(dw), tensor(db)


def instance_norm_impl(x: Tensor, weight: Tensor | None, bias: Tensor | None,
                       eps: float) -> tuple[Tensor, Tensor, Tensor]:
    """``(y, mean, rstd)``: InstanceNorm of (N, C, *) with the statistics of each (n,
    c), which are returned (float64, shape (N, C)) and kept for the backward."""
    scale = _scale(weight, x, _channels(x))
    y = empty_like(x)
    _, mean, rstd = _in.instance_normalization(
        array(x, "input"), scale, _bias(bias, scale), epsilon=eps, out=array(y, "out"),
        engine=ENGINE, statistics=True)
    return y, tensor(mean), tensor(rstd)


def instance_norm_y(x, weight, bias, eps):
    """:func:`instance_norm_impl`'s y alone (inference, with the call plans)."""
    scale = _scale(weight, x, _channels(x))
    y = empty_like(x)
    api.instance_normalization(array(x, "input"), scale, _bias(bias, scale), epsilon=eps,
                               out=array(y, "out"))
    return y


def instance_norm_backward_impl(dy: Tensor, x: Tensor, weight: Tensor | None, mean: Tensor,
                                rstd: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """``(dx, dweight, dbias)`` with the forward's statistics (:func:`instance_norm_impl`)."""
    dx = empty_like(x)
    _, dw, db = api.instance_normalization_backward(
        array(_grad_like(dy, x), "grad"), array(x, "input"), _scale(weight, x, _channels(x)),
        mean=array(mean, "mean"), inv_std=array(rstd, "rstd"), out=array(dx, "out"))
    return dx, tensor(dw), tensor(db)


def batch_norm_training_impl(x: Tensor, weight: Tensor | None, bias: Tensor | None,
                             eps: float) -> tuple[Tensor, Tensor, Tensor]:
    """``(y, mean, var)``: BatchNorm with the batch statistics of (N, C, *) (float64
    mean and population variance of each channel)."""
    C = _channels(x)
    scale = _scale(weight, x, C)
    y = empty_like(x)
    # momentum 0: ONNX's running outputs are then the batch statistics themselves
    _, mean, var = api.batch_normalization(array(x, "input"), scale, _bias(bias, scale),
                                           np.zeros(C), np.ones(C), epsilon=eps, momentum=0.0,
                                           training_mode=1, out=array(y, "out"))
    return y, tensor(mean), tensor(var)


def batch_norm_inference_impl(x: Tensor, weight: Tensor | None, bias: Tensor | None,
                              running_mean: Tensor, running_var: Tensor, eps: float) -> Tensor:
    """BatchNorm with given (running) statistics."""
    scale = _scale(weight, x, _channels(x))
    y = empty_like(x)
    api.batch_normalization(array(x, "input"), scale, _bias(bias, scale),
                            array(running_mean, "running_mean"),
                            array(running_var, "running_var"), epsilon=eps,
                            out=array(y, "out"))
    return y


def batch_norm_backward_impl(dy: Tensor, x: Tensor, weight: Tensor | None, mean: Tensor,
                             var: Tensor, eps: float,
                             training: bool) -> tuple[Tensor, Tensor, Tensor]:
    """``(dx, dweight, dbias)``; ``training``: mean and var are the batch statistics
    (dX through them), else the running statistics (constants)."""
    dx = empty_like(x)
    _, dw, db = api.batch_normalization_backward(
        array(_grad_like(dy, x), "grad"), array(x, "input"), _scale(weight, x, _channels(x)),
        array(mean, "mean"), array(var, "var"), epsilon=eps, training=training,
        out=array(dx, "out"))
    return dx, tensor(dw), tensor(db)


# --- the operators ---

def _op(name, fn, fake):
    op = torch.library.custom_op(f"{NS}::{name}", fn, mutates_args=(), device_types="cpu")
    op.register_fake(fake)
    return op


def _grads_fake(x, weight, shape):
    dtype = x.dtype if weight is None else weight.dtype
    return torch.empty_like(x), x.new_empty(shape, dtype=dtype), x.new_empty(shape, dtype=dtype)


layer_norm = _op("layer_norm", layer_norm_impl, lambda x, n, w, b, eps: (
    torch.empty_like(x), x.new_empty(_stats_shape(x, n), dtype=F64),
    x.new_empty(_stats_shape(x, n), dtype=F64)))
layer_norm_backward = _op("layer_norm_backward", layer_norm_backward_impl,
                          lambda dy, x, w, mean, rstd, n: _grads_fake(x, w, _tail(x, n)))
rms_norm = _op("rms_norm", rms_norm_impl, lambda x, n, w, eps: (
    torch.empty_like(x), x.new_empty(_stats_shape(x, n), dtype=F64)))
rms_norm_backward = _op("rms_norm_backward", rms_norm_backward_impl,
                        lambda dy, x, w, rstd, n: _grads_fake(x, w, _tail(x, n))[:2])
group_norm = _op("group_norm", group_norm_impl, lambda x, g, w, b, eps: (
    torch.empty_like(x), x.new_empty((x.shape[0], g), dtype=F64),
    x.new_empty((x.shape[0], g), dtype=F64)))
group_norm_backward = _op("group_norm_backward", group_norm_backward_impl,
                          lambda dy, x, w, mean, rstd, g: _grads_fake(x, w, _channels(x)))
instance_norm = _op("instance_norm", instance_norm_impl, lambda x, w, b, eps: (
    torch.empty_like(x), x.new_empty(x.shape[:2], dtype=F64), x.new_empty(x.shape[:2],
                                                                           dtype=F64)))
instance_norm_backward = _op("instance_norm_backward", instance_norm_backward_impl,
                             lambda dy, x, w, mean, rstd: _grads_fake(x, w, _channels(x)))
batch_norm_training = _op("batch_norm_training", batch_norm_training_impl, lambda x, w, b, eps: (
    torch.empty_like(x), x.new_empty(_channels(x), dtype=F64),
    x.new_empty(_channels(x), dtype=F64)))
batch_norm_inference = _op("batch_norm_inference", batch_norm_inference_impl,
                           lambda x, w, b, rm, rv, eps: torch.empty_like(x))
batch_norm_backward = _op("batch_norm_backward", batch_norm_backward_impl,
                          lambda dy, x, w, m, v, eps, training: _grads_fake(x, w, _channels(x)))


# --- autograd of the operators (the backward operators, so a backward traces too) ---

def _save(ctx, tensors, **values):
    ctx.save_for_backward(*tensors)
    for name, value in values.items():
        setattr(ctx, name, value)


def _keep(grad, wanted):
    return grad if wanted else None


def _ln_setup(ctx, inputs, output):
    x, n, w, b, _ = inputs
    ctx.mark_non_differentiable(output[1], output[2])
    _save(ctx, (x, w, output[1], output[2]), n=n, has_bias=b is not None)


def _ln_grad(ctx, dy, *_):
    x, w, mean, rstd = ctx.saved_tensors
    dx, dw, db = layer_norm_backward(dy, x, w, mean, rstd, ctx.n)
    return dx, None, _keep(dw, w is not None), _keep(db, ctx.has_bias), None


def _rms_setup(ctx, inputs, output):
    x, n, w, _ = inputs
    ctx.mark_non_differentiable(output[1])
    _save(ctx, (x, w, output[1]), n=n)


def _rms_grad(ctx, dy, _):
    x, w, rstd = ctx.saved_tensors
    dx, dw = rms_norm_backward(dy, x, w, rstd, ctx.n)
    return dx, None, _keep(dw, w is not None), None


def _gn_setup(ctx, inputs, output):
    x, g, w, b, _ = inputs
    ctx.mark_non_differentiable(output[1], output[2])
    _save(ctx, (x, w, output[1], output[2]), g=g, has_bias=b is not None)


def _gn_grad(ctx, dy, *_):
    x, w, mean, rstd = ctx.saved_tensors
    dx, dw, db = group_norm_backward(dy, x, w, mean, rstd, ctx.g)
    return dx, None, _keep(dw, w is not None), _keep(db, ctx.has_bias), None


def _in_setup(ctx, inputs, output):
    x, w, b, _ = inputs
    ctx.mark_non_differentiable(output[1], output[2])
    _save(ctx, (x, w, output[1], output[2]), has_bias=b is not None)


def _in_grad(ctx, dy, *_):
    x, w, mean, rstd = ctx.saved_tensors
    dx, dw, db = instance_norm_backward(dy, x, w, mean, rstd)
    return dx, _keep(dw, w is not None), _keep(db, ctx.has_bias), None


def _bn_training_setup(ctx, inputs, output):
    x, w, b, eps = inputs
    ctx.mark_non_differentiable(output[1], output[2])
    _save(ctx, (x, w, output[1], output[2]), eps=eps, has_bias=b is not None)


def _bn_training_grad(ctx, dy, *_):
    x, w, mean, var = ctx.saved_tensors
    dx, dw, db = batch_norm_backward(dy, x, w, mean, var, ctx.eps, True)
    return dx, _keep(dw, w is not None), _keep(db, ctx.has_bias), None


def _bn_inference_setup(ctx, inputs, output):
    x, w, b, rm, rv, eps = inputs
    _save(ctx, (x, w, rm, rv), eps=eps, has_bias=b is not None)


def _bn_inference_grad(ctx, dy):
    x, w, mean, var = ctx.saved_tensors
    dx, dw, db = batch_norm_backward(dy, x, w, mean, var, ctx.eps, False)
    return dx, _keep(dw, w is not None), _keep(db, ctx.has_bias), None, None, None


for _forward, _grad, _setup in ((layer_norm, _ln_grad, _ln_setup),
                                (rms_norm, _rms_grad, _rms_setup),
                                (group_norm, _gn_grad, _gn_setup),
                                (instance_norm, _in_grad, _in_setup),
                                (batch_norm_training, _bn_training_grad, _bn_training_setup),
                                (batch_norm_inference, _bn_inference_grad, _bn_inference_setup)):
    _forward.register_autograd(_grad, setup_context=_setup)

OPERATORS = (layer_norm, rms_norm, group_norm, instance_norm, batch_norm_training,
             batch_norm_inference)
BACKWARD = (layer_norm_backward, rms_norm_backward, group_norm_backward,
            instance_norm_backward, batch_norm_backward)

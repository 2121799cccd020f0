"""Eager calls without torch's dispatcher: the same functions as the custom operators
(``ops.py``), called directly, with autograd by ``torch.autograd.Function``.

Why: a custom operator's Python dispatch costs about 25 us a call, five times the
whole normalization of a small tensor. Where the dispatcher must see the call (inside
``torch.compile`` or ``torch.export``, under a torch function or dispatch mode, or
with tensors of a subclass: FakeTensor, FunctionalTensor, ...) the operators run
instead (:func:`route`).
"""

import torch
from torch.autograd.function import once_differentiable

from normkernels.torch import direct, ops
from normkernels.torch.tensors import numpy_dtype, tensor

OP, PLAIN, GRAD = "op", "plain", "grad"
_TENSORS = (torch.Tensor, torch.nn.Parameter)
_function_mode = torch._C._is_torch_function_mode_enabled
_dispatch_modes = torch._C._len_torch_dispatch_stack
_compiling = torch.compiler.is_compiling


def route(*tensors):
    """OP (the custom operator), PLAIN (no gradient: the function alone) or GRAD (an
    autograd.Function over the functions)."""
    if _compiling() or _function_mode() or _dispatch_modes():
        return OP
    grad = False
    for t in tensors:
        if t is None:
            continue
        if type(t) not in _TENSORS:
            return OP
        grad = grad or t.requires_grad
    return GRAD if grad and torch.is_grad_enabled() else PLAIN


def _keep(grad, wanted):
    return grad if wanted else None


def _direct_rows(ctx, x, weight, bias, n, eps, centered):
    """Y by the direct route (a call whose metadata a first call has proven), its
    statistics kept on ``ctx`` for :func:`_direct_rows_backward`; None: the full path."""
    fast = direct.rows_with_statistics(x, n, weight, bias, eps, centered)
    if fast is None:
        ctx.stats = None
        return None
    y, ctx.stats = fast
    ctx.save_for_backward(x, weight)
    ctx.n, ctx.eps, ctx.has_bias = n, eps, bias is not None
    return y


def _direct_rows_backward(ctx, dy, centered):
    x, w = ctx.saved_tensors
    dx, dg, db = direct.rows_backward(dy, x, w, ctx.stats, ctx.n, ctx.eps, centered)
    dw = None if w is None else tensor(dg.astype(numpy_dtype(w.dtype))).reshape(w.shape)
    db = tensor(db.astype(numpy_dtype(w.dtype))).reshape(w.shape) if ctx.has_bias else None
    return dx, dw, db


class LayerNorm(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias, n, eps):
        y = _direct_rows(ctx, x, weight, bias, n, eps, True)
        if y is not None:
            return y
        y, mean, rstd = ops.layer_norm_impl(x, n, weight, bias, eps)
        ctx.save_for_backward(x, weight, mean, rstd)
        ctx.n, ctx.has_bias = n, bias is not None
        return y

    @staticmethod
    @once_differentiable
    def backward(ctx, dy):
        if ctx.stats is not None:
            return (*_direct_rows_backward(ctx, dy, True), None, None)
        x, w, mean, rstd = ctx.saved_tensors
        dx, dw, db = ops.layer_norm_backward_impl(dy, x, w, mean, rstd, ctx.n)
        return dx, _keep(dw, w is not None), _keep(db, ctx.has_bias), None, None


class RMSNorm(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, n, eps):
        y = _direct_rows(ctx, x, weight, None, n, eps, False)
        if y is not None:
            return y
        y, rstd = ops.rms_norm_impl(x, n, weight, eps)
        ctx.save_for_backward(x, weight, rstd)
        ctx.n = n
        return y

    @staticmethod
    @once_differentiable
    def backward(ctx, dy):
        if ctx.stats is not None:
            dx, dw, _ = _direct_rows_backward(ctx, dy, False)
            return dx, dw, None, None
        x, w, rstd = ctx.saved_tensors
        dx, dw = ops.rms_norm_backward_impl(dy, x, w, rstd, ctx.n)
        return dx, _keep(dw, w is not None), None, None


class RoundedRMSNorm(torch.autograd.Function):
    """RMSNorm over the last axis with ``rounding`` and ``offset`` (the zoos' classes);
    the backward recomputes the statistics from x (the forward keeps none) and takes
    the scale ``offset + weight`` in float32 (Gemma's arithmetic)."""

    @staticmethod
    def forward(ctx, x, weight, eps, rounding, offset):
        ctx.save_for_backward(x, weight)
        ctx.eps, ctx.offset = eps, offset
        return ops.rms_norm_y(x, 1, weight, eps, rounding, offset)

    @staticmethod
    @once_differentiable
    def backward(ctx, dy):
        x, w = ctx.saved_tensors
        scale = w if w is None or not ctx.offset else w.float() + ctx.offset
        dx, dw = ops.rms_norm_backward_impl(dy, x, scale, None, 1, ctx.eps)
        return dx, None if w is None else dw.to(w.dtype), None, None, None


class GroupNorm(torch.autograd.Function):
    """The forward's float64 statistics are kept for the backward (as torch's
    ``native_group_norm`` keeps its mean and rstd): it reads X and dY twice, not X
    three times."""

    @staticmethod
    def forward(ctx, x, weight, bias, groups, eps):
        y, mean, rstd = ops.group_norm_impl(x, groups, weight, bias, eps)
        ctx.save_for_backward(x, weight, mean, rstd)
        ctx.groups, ctx.has_bias = groups, bias is not None
        return y

    @staticmethod
    @once_differentiable
    def backward(ctx, dy):
        x, w, mean, rstd = ctx.saved_tensors
        dx, dw, db = ops.group_norm_backward_impl(dy, x, w, mean, rstd, ctx.groups)
        return dx, _keep(dw, w is not None), _keep(db, ctx.has_bias), None, None


class InstanceNorm(torch.autograd.Function):
    """The forward's float64 statistics per (n, c) are kept for the backward."""

    @staticmethod
    def forward(ctx, x, weight, bias, eps):
        y, mean, rstd = ops.instance_norm_impl(x, weight, bias, eps)
        ctx.save_for_backward(x, weight, mean, rstd)
        ctx.has_bias = bias is not None
        return y

    @staticmethod
    @once_differentiable
    def backward(ctx, dy):
        x, w, mean, rstd = ctx.saved_tensors
        dx, dw, db = ops.instance_norm_backward_impl(dy, x, w, mean, rstd)
        return dx, _keep(dw, w is not None), _keep(db, ctx.has_bias), None


class BatchNormTraining(torch.autograd.Function):
    """``(y, mean, var)``: the statistics are outputs (for the running update), not
    differentiable."""

    @staticmethod
    def forward(ctx, x, weight, bias, eps):
        y, mean, var = ops.batch_norm_training_impl(x, weight, bias, eps)
        ctx.mark_non_differentiable(mean, var)
        ctx.save_for_backward(x, weight, mean, var)
        ctx.eps, ctx.has_bias = eps, bias is not None
        return y, mean, var

    @staticmethod
    @once_differentiable
    def backward(ctx, dy, dmean, dvar):
        x, w, mean, var = ctx.saved_tensors
        dx, dw, db = ops.batch_norm_backward_impl(dy, x, w, mean, var, ctx.eps, True)
        return dx, _keep(dw, w is not None), _keep(db, ctx.has_bias), None


class BatchNormInference(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias, running_mean, running_var, eps):
        ctx.save_for_backward(x, weight, running_mean, running_var)
        ctx.eps, ctx.has_bias = eps, bias is not None
        return ops.batch_norm_inference_impl(x, weight, bias, running_mean, running_var, eps)

    @staticmethod
    @once_differentiable
    def backward(ctx, dy):
        x, w, mean, var = ctx.saved_tensors
        dx, dw, db = ops.batch_norm_backward_impl(dy, x, w, mean, var, ctx.eps, False)
        return dx, _keep(dw, w is not None), _keep(db, ctx.has_bias), None, None, None

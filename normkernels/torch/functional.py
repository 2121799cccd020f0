"""torch.nn.functional's normalizations computed by normkernels (same signatures).

Each call goes by :func:`eager.route`: the custom operator where the dispatcher must
see it (compiling, modes, tensor subclasses), else the function directly, under an
autograd.Function when a gradient is wanted."""

import math

import torch

from normkernels.torch import direct, eager, ops
from normkernels.torch.eager import GRAD, OP


def _normalized_ndim(input, normalized_shape):
    shape = (normalized_shape,) if isinstance(normalized_shape, int) else tuple(normalized_shape)
    if not shape or tuple(input.shape[input.dim() - len(shape):]) != shape \
            or len(shape) > input.dim():
        raise ValueError(f"normalized_shape {shape} must be the last dimensions of input's "
                         f"shape {tuple(input.shape)}")
    return len(shape)


def layer_norm(input, normalized_shape, weight=None, bias=None, eps=1e-5):
    """As ``torch.nn.functional.layer_norm``.

    Parameters
    ----------
    input : torch.Tensor
        A CPU tensor of float16, bfloat16, float32 or float64; each row is its last
        ``len(normalized_shape)`` dimensions.
    normalized_shape : int or sequence of int
        The shape of a row: the last dimensions of ``input``'s shape.
    weight, bias : torch.Tensor, optional
        Of shape ``normalized_shape``, input's dtype.
    eps : float, default 1e-5
        Added to the variance.

    Returns
    -------
    torch.Tensor
        Of input's shape, dtype and memory format.

    Raises
    ------
    ValueError
        ``normalized_shape`` is not the end of input's shape.

    Examples
    --------
    >>> import torch
    >>> import normkernels.torch as nt
    >>> x = torch.arange(6.0).reshape(2, 3)
    >>> nt.layer_norm(x, (3,))
    tensor([[-1.2247,  0.0000,  1.2247],
            [-1.2247,  0.0000,  1.2247]])
    >>> w, b = torch.tensor([1.0, 2.0, 3.0]), torch.tensor([0.5, 0.0, -0.5])
    >>> torch.allclose(nt.layer_norm(x, (3,), w, b), torch.nn.functional.layer_norm(x, (3,), w, b))
    True
    """
    n, eps = _normalized_ndim(input, normalized_shape), float(eps)
    path = eager.route(input, weight, bias)
    if path == OP:
        return ops.layer_norm(input, n, weight, bias, eps)[0]
    if path == GRAD:
        return eager.LayerNorm.apply(input, weight, bias, n, eps)
    return direct.rows(input, n, weight, bias, eps, True,
                       lambda: ops.layer_norm_y(input, n, weight, bias, eps))


def rms_norm(input, normalized_shape, weight=None, eps=None):
    """As ``torch.nn.functional.rms_norm``; ``eps=None``: the machine epsilon of the
    computation's dtype, torch's rule (float32's for float16 and bfloat16 input, whose
    own epsilons, 0.00098 and 0.0078, would swamp a small mean square).

    Parameters
    ----------
    input : torch.Tensor
        A CPU tensor of float16, bfloat16, float32 or float64; each row is its last
        ``len(normalized_shape)`` dimensions.
    normalized_shape : int or sequence of int
        The shape of a row: the last dimensions of ``input``'s shape.
    weight : torch.Tensor, optional
        Of shape ``normalized_shape``, input's dtype.
    eps : float, optional
        Added to the mean square (default: the machine epsilon above).

    Returns
    -------
    torch.Tensor
        ``input / sqrt(mean(input**2) + eps) * weight`` over each row, of input's shape,
        dtype and memory format.

    Raises
    ------
    ValueError
        ``normalized_shape`` is not the end of input's shape.

    Examples
    --------
    >>> import torch
    >>> import normkernels.torch as nt
    >>> x = torch.arange(6.0).reshape(2, 3)
    >>> nt.rms_norm(x, (3,))
    tensor([[0.0000, 0.7746, 1.5492],
            [0.7348, 0.9798, 1.2247]])
    >>> w = torch.tensor([1.0, 2.0, 3.0])
    >>> torch.allclose(nt.rms_norm(x, (3,), w), torch.nn.functional.rms_norm(x, (3,), w))
    True
    """
    n = _normalized_ndim(input, normalized_shape)
    if eps is None:
        wide = input.dtype in (torch.float16, torch.bfloat16)
        eps = torch.finfo(torch.float32 if wide else input.dtype).eps
    eps = float(eps)
    path = eager.route(input, weight)
    if path == OP:
        return ops.rms_norm(input, n, weight, eps)[0]
    if path == GRAD:
        return eager.RMSNorm.apply(input, weight, n, eps)
    return direct.rows(input, n, weight, None, eps, False,
                       lambda: ops.rms_norm_y(input, n, weight, eps))


def rounded_rms_norm(input, weight, eps, rounding="once", offset=0.0):
    """RMSNorm over the last axis by :func:`normkernels.rms_normalization`'s
    ``rounding`` and ``offset`` (the zoos' RMSNorm classes: ``rounding="llama"`` is
    ``weight * x_hat.to(dtype)``, ``offset=1`` Gemma's ``1 + weight``); None where the
    dispatcher must see the call (a module then runs its own forward)."""
    path = eager.route(input, weight)
    if path == OP:
        return None
    if path == GRAD:
        return eager.RoundedRMSNorm.apply(input, weight, float(eps), rounding, offset)
    if offset:
        return ops.rms_norm_y(input, 1, weight, float(eps), rounding, offset)
    return direct.rows(input, 1, weight, None, float(eps), False,
                       lambda: ops.rms_norm_y(input, 1, weight, float(eps), rounding), rounding)


def group_norm(input, num_groups, weight=None, bias=None, eps=1e-5):
    """As ``torch.nn.functional.group_norm``.

    Parameters
    ----------
    input : torch.Tensor
        ``(N, C, *)``: a CPU tensor of float16, bfloat16, float32 or float64 (channels_last
        too).
    num_groups : int
        The groups the C channels are split into (it divides C); the statistics are per
        (sample, group).
    weight, bias : torch.Tensor, optional
        Of shape (C,), input's dtype.
    eps : float, default 1e-5
        Added to the variance.

    Returns
    -------
    torch.Tensor
        Of input's shape, dtype and memory format.

    Raises
    ------
    ValueError
        ``input`` has fewer than 2 dimensions, or its groups hold one value each.

    Examples
    --------
    >>> import torch
    >>> import normkernels.torch as nt
    >>> x = torch.arange(24.0).reshape(2, 4, 3)
    >>> nt.group_norm(x, 2)[0]
    tensor([[-1.4638, -0.8783, -0.2928],
            [ 0.2928,  0.8783,  1.4638],
            [-1.4638, -0.8783, -0.2928],
            [ 0.2928,  0.8783,  1.4638]])
    >>> w, b = torch.tensor([1.0, 2.0, 3.0, 4.0]), torch.zeros(4)
    >>> torch.allclose(nt.group_norm(x, 2, w, b), torch.nn.functional.group_norm(x, 2, w, b))
    True
    """
    if input.dim() < 2:
        raise ValueError(f"input must be (N, C, *), got shape {tuple(input.shape)}")
    groups, eps = int(num_groups), float(eps)
    if input.shape[0] * input.shape[1] // groups * math.prod(input.shape[2:]) == 1:
        # torch's check (in every mode): statistics of one value
        size = [input.shape[0] * input.shape[1] // groups, groups, *input.shape[2:]]
        raise ValueError(f"Expected more than 1 value per channel when training, got input "
                         f"size {size}")
    path = eager.route(input, weight, bias)
    if path == OP:
        return ops.group_norm(input, groups, weight, bias, eps)[0]
    if path == GRAD:
        return eager.GroupNorm.apply(input, weight, bias, groups, eps)
    return ops.group_norm_y(input, groups, weight, bias, eps)


def instance_norm(input, running_mean=None, running_var=None, weight=None, bias=None,
                  use_input_stats=True, momentum=0.1, eps=1e-5):
    """As ``torch.nn.functional.instance_norm`` with the statistics of each instance
    (``use_input_stats``); running statistics are not supported (a ValueError).

    Parameters
    ----------
    input : torch.Tensor
        (N, C, L, ...): a CPU tensor of float16, bfloat16, float32 or float64, with at
        least one spatial dimension; the statistics are per (sample, channel).
    running_mean, running_var : None
        Must be None (torch's ``track_running_stats`` is not supported).
    weight, bias : torch.Tensor, optional
        Of shape (C,), input's dtype.
    use_input_stats : bool, default True
        Must be True.
    momentum : float, default 0.1
        Unused (no running statistics).
    eps : float, default 1e-5
        Added to the variance.

    Returns
    -------
    torch.Tensor
        Of input's shape, dtype and memory format.

    Raises
    ------
    ValueError
        Running statistics given or ``use_input_stats`` false; ``input`` without a
        spatial dimension, or of one spatial element.

    Examples
    --------
    >>> import torch
    >>> import normkernels.torch as nt
    >>> x = torch.arange(24.0).reshape(2, 4, 3)
    >>> nt.instance_norm(x)[0]
    tensor([[-1.2247,  0.0000,  1.2247],
            [-1.2247,  0.0000,  1.2247],
            [-1.2247,  0.0000,  1.2247],
            [-1.2247,  0.0000,  1.2247]])
    >>> w, b = torch.tensor([1.0, 2.0, 3.0, 4.0]), torch.ones(4)
    >>> y = torch.nn.functional.instance_norm(x, weight=w, bias=b)
    >>> torch.allclose(nt.instance_norm(x, weight=w, bias=b), y)
    True
    """
    if running_mean is not None or running_var is not None or not use_input_stats:
        raise ValueError("instance_norm: running statistics (track_running_stats) are not "
                         "supported by normkernels.torch; use torch's instance_norm")
    if input.dim() < 3:
        raise ValueError(f"input must be (N, C, L, ...) with at least one spatial "
                         f"dimension, got shape {tuple(input.shape)}")
    if math.prod(input.shape[2:]) == 1:  # torch's check: one value has no variance
        raise ValueError(f"Expected more than 1 spatial element when training, got input "
                         f"size {input.size()}")
    eps = float(eps)
    path = eager.route(input, weight, bias)
    if path == OP:
        return ops.instance_norm(input, weight, bias, eps)[0]
    if path == GRAD:
        return eager.InstanceNorm.apply(input, weight, bias, eps)
    return ops.instance_norm_y(input, weight, bias, eps)


def batch_norm(input, running_mean, running_var, weight=None, bias=None, training=False,
               momentum=0.1, eps=1e-5):
    """As ``torch.nn.functional.batch_norm``: with ``training`` the batch statistics,
    and the running ones updated in place (``running = (1 - momentum) * running +
    momentum * batch``, the unbiased batch variance), else the running statistics.

    Parameters
    ----------
    input : torch.Tensor
        ``(N, C, *)``: a CPU tensor of float16, bfloat16, float32 or float64 (channels_last
        too).
    running_mean, running_var : torch.Tensor or None
        Of shape (C,): the statistics used when not ``training`` (then required), and
        updated in place when ``training`` (None: not kept).
    weight, bias : torch.Tensor, optional
        Of shape (C,), input's dtype (float32 for 16-bit input too).
    training : bool, default False
        Normalize with the batch statistics (per channel, over N and the spatial
        dimensions) and update the running ones.
    momentum : float, default 0.1
        The weight of the batch statistics in the running ones' update.
    eps : float, default 1e-5
        Added to the variance.

    Returns
    -------
    torch.Tensor
        Of input's shape, dtype and memory format.

    Raises
    ------
    ValueError
        ``input`` has fewer than 2 dimensions; not ``training`` without running
        statistics; ``training`` with one value per channel.

    Examples
    --------
    >>> import torch
    >>> import normkernels.torch as nt
    >>> x = torch.arange(24.0).reshape(2, 4, 3)
    >>> mean, var = torch.zeros(4), torch.ones(4)
    >>> y = nt.batch_norm(x, mean, var, training=True)
    >>> mean, var
    (tensor([0.7000, 1.0000, 1.3000, 1.6000]), tensor([5.3000, 5.3000, 5.3000, 5.3000]))
    >>> mean2, var2 = torch.zeros(4), torch.ones(4)
    >>> want = torch.nn.functional.batch_norm(x, mean2, var2, training=True)
    >>> torch.allclose(y, want), torch.allclose(var, var2)
    (True, True)
    >>> torch.allclose(nt.batch_norm(x, mean, var), torch.nn.functional.batch_norm(x, mean, var))
    True
    """
    if input.dim() < 2:
        raise ValueError(f"input must be (N, C, *), got shape {tuple(input.shape)}")
    eps = float(eps)
    if not training:
        if running_mean is None or running_var is None:
            raise ValueError("batch_norm: running_mean and running_var are required when "
                             "not training")
        path = eager.route(input, weight, bias, running_mean, running_var)
        if path == OP:
            return ops.batch_norm_inference(input, weight, bias, running_mean, running_var, eps)
        if path == GRAD:
            return eager.BatchNormInference.apply(input, weight, bias, running_mean,
                                                  running_var, eps)
        return direct.inference(input, weight, bias, running_mean, running_var, eps,
                                lambda: ops.batch_norm_inference_impl(
                                    input, weight, bias, running_mean, running_var, eps))
    count = input.numel() // input.shape[1]
    if count <= 1:
        raise ValueError(f"batch_norm: expected more than 1 value per channel when training, "
                         f"got input of shape {tuple(input.shape)}")
    path = eager.route(input, weight, bias)
    if path == OP:
        y, mean, var = ops.batch_norm_training(input, weight, bias, eps)
    elif path == GRAD:
        y, mean, var = eager.BatchNormTraining.apply(input, weight, bias, eps)
    else:
        y, mean, var = ops.batch_norm_training_impl(input, weight, bias, eps)
    if running_mean is not None or running_var is not None:
        with torch.no_grad():
            if running_mean is not None:
                running_mean.mul_(1 - momentum).add_(mean.to(running_mean.dtype),
                                                     alpha=momentum)
            if running_var is not None:
                unbiased = var * (count / (count - 1))
                running_var.mul_(1 - momentum).add_(unbiased.to(running_var.dtype),
                                                    alpha=momentum)
    return y

"""torch.nn.functional's normalizations computed by normkernels (same signatures)."""

import torch

from normkernels.torch import ops


def _normalized_ndim(input, normalized_shape):
    shape = (normalized_shape,) if isinstance(normalized_shape, int) else tuple(normalized_shape)
    if not shape or tuple(input.shape[input.dim() - len(shape):]) != shape \
            or len(shape) > input.dim():
        raise ValueError(f"normalized_shape {shape} must be the last dimensions of input's "
                         f"shape {tuple(input.shape)}")
    return len(shape)


def layer_norm(input, normalized_shape, weight=None, bias=None, eps=1e-5):
    """As ``torch.nn.functional.layer_norm``."""
    return ops.layer_norm(input, _normalized_ndim(input, normalized_shape), weight, bias,
                          float(eps))[0]


def rms_norm(input, normalized_shape, weight=None, eps=None):
    """As ``torch.nn.functional.rms_norm``; ``eps=None``: the machine epsilon of input's
    dtype (torch's rule)."""
    n = _normalized_ndim(input, normalized_shape)
    if eps is None:
        eps = torch.finfo(input.dtype).eps
    return ops.rms_norm(input, n, weight, float(eps))[0]


def group_norm(input, num_groups, weight=None, bias=None, eps=1e-5):
    """As ``torch.nn.functional.group_norm``."""
    if input.dim() < 2:
        raise ValueError(f"input must be (N, C, *), got shape {tuple(input.shape)}")
    return ops.group_norm(input, int(num_groups), weight, bias, float(eps))


def instance_norm(input, running_mean=None, running_var=None, weight=None, bias=None,
                  use_input_stats=True, momentum=0.1, eps=1e-5):
    """As ``torch.nn.functional.instance_norm`` with the statistics of each instance
    (``use_input_stats``); running statistics are not supported (a ValueError)."""
    if running_mean is not None or running_var is not None or not use_input_stats:
        raise ValueError("instance_norm: running statistics (track_running_stats) are not "
                         "supported by normkernels.torch; use torch's instance_norm")
    if input.dim() < 3:
        raise ValueError(f"input must be (N, C, L, ...) with at least one spatial "
                         f"dimension, got shape {tuple(input.shape)}")
    return ops.instance_norm(input, weight, bias, float(eps))


def batch_norm(input, running_mean, running_var, weight=None, bias=None, training=False,
               momentum=0.1, eps=1e-5):
    """As ``torch.nn.functional.batch_norm``: with ``training`` the batch statistics,
    and the running ones updated in place (``running = (1 - momentum) * running +
    momentum * batch``, the unbiased batch variance), else the running statistics."""
    if input.dim() < 2:
        raise ValueError(f"input must be (N, C, *), got shape {tuple(input.shape)}")
    if not training:
        if running_mean is None or running_var is None:
            raise ValueError("batch_norm: running_mean and running_var are required when "
                             "not training")
        return ops.batch_norm_inference(input, weight, bias, running_mean, running_var,
                                        float(eps))
    count = input.numel() // input.shape[1]
    if count <= 1:
        raise ValueError(f"batch_norm: expected more than 1 value per channel when training, "
                         f"got input of shape {tuple(input.shape)}")
    y, mean, var = ops.batch_norm_training(input, weight, bias, float(eps))
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

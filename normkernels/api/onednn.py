"""oneDNN Graph's normalization operations: BatchNormInference, LayerNorm, RMSNorm
and GroupNorm, and for training BatchNormForwardTraining,
BatchNormTrainingBackward and LayerNormBackward."""

from normkernels.engine.numba_engine import ENGINE
from normkernels.ops import batch_norm_inference as _bni
from normkernels.ops import group_normalization as _gn
from normkernels.ops import layer_norm as _dnnl_rows
from normkernels.ops import onednn_training as _dnnl_train


def batch_norm_inference(input, gamma, beta, mean, variance, *, epsilon, data_format="NXC",
                         out=None):
    """oneDNN Graph BatchNormInference-1.

    ``output = (input - mean) / sqrt(variance + epsilon) * gamma + beta`` per channel.

    Parameters
    ----------
    input : ndarray
        At least 2-D; channels last (``data_format="NXC"``, the default) or at axis 1
        (``"NCX"``). float32, float16 or bfloat16.
    gamma, beta, mean, variance : ndarray
        Shape (C,), one dtype: float32, or bfloat16 when ``input`` is bfloat16.
    epsilon : float
        Required, finite and positive.
    out : ndarray, optional
        Where to write the output; may be ``input`` itself.
    """
    return _bni.batch_norm_inference(input, gamma, beta, mean, variance, epsilon=epsilon,
                                     data_format=data_format, out=out, engine=ENGINE)


def layer_norm(src, gamma=None, beta=None, *, begin_norm_axis=-1, epsilon=1e-5,
               keep_stats=True, use_affine=True, out=None):
    """oneDNN Graph LayerNorm-1.

    ``dst = gamma * (src - mean) / sqrt(variance + epsilon) + beta`` over the axes
    ``begin_norm_axis, ...``. src is float32, bfloat16 or float16; gamma and beta
    (required with ``use_affine``, forbidden without) have the normalized shape and
    dtype float32 (or bfloat16 for bfloat16 src). Returns dst, or with ``keep_stats``
    (the default) ``(dst, mean, variance)``: statistics of shape
    ``src.shape[:begin_norm_axis]`` in gamma's dtype (float32 without gamma); the
    variance is the population variance, without epsilon.
    """
    return _dnnl_rows.layer_norm(src, gamma, beta, begin_norm_axis=begin_norm_axis,
                                 epsilon=epsilon, keep_stats=keep_stats,
                                 use_affine=use_affine, out=out, engine=ENGINE)


def rms_norm(src, gamma=None, *, begin_norm_axis=-1, epsilon=1e-5, out=None):
    """oneDNN Graph RMSNorm-1: ``dst = gamma * src / sqrt(mean(src**2) + epsilon)`` over
    the axes ``begin_norm_axis, ...``; gamma optional, broadcastable to src (float32;
    bfloat16 for bfloat16 src, float16 for float16 src). dst has src's dtype."""
    return _dnnl_rows.rms_norm(src, gamma, begin_norm_axis=begin_norm_axis, epsilon=epsilon,
                               out=out, engine=ENGINE)


def group_norm(src, gamma=None, beta=None, *, groups, epsilon=1e-5, keep_stats=True,
               use_affine=True, data_format="NXC", out=None):
    """oneDNN Graph GroupNorm-1.

    ``dst = gamma * (src - mean) / sqrt(variance + epsilon) + beta`` per (n, group) of
    ``C / groups`` consecutive channels, over the group's channels and all spatial
    positions.

    Parameters
    ----------
    src : ndarray
        At least 3-D: N x D1 ... Dn x C (``data_format="NXC"``, oneDNN's default) or
        N x C x D1 ... Dn (``"NCX"``). float32, bfloat16 or float16.
    gamma, beta : ndarray, optional
        Shape (C,): float32 (or bfloat16 for bfloat16 src). Both required when
        ``use_affine`` (the default), neither allowed otherwise.
    groups : int
        Required; must divide C.
    epsilon : float
        Default 1e-5.
    keep_stats : bool
        Also return the statistics (the default).
    out : ndarray, optional
        Where to write dst (src's shape and dtype); may be src itself.

    Returns
    -------
    ndarray, or (dst, mean, variance)
        ``mean`` and ``variance`` (population, not its inverse square root) have shape
        (N, groups) and gamma's dtype (float32 without gamma).
    """
    return _gn.group_norm(src, gamma, beta, groups=groups, epsilon=epsilon,
                          keep_stats=keep_stats, use_affine=use_affine, data_format=data_format,
                          out=out, engine=ENGINE)


def batch_norm_forward_training(src, mean, variance, gamma=None, beta=None, *, epsilon,
                                momentum=None, data_format="NXC", out=None):
    """oneDNN Graph BatchNormForwardTraining-1: ``(dst, running_mean, running_variance,
    batch_mean, batch_variance)``.

    ``dst = gamma * (src - batch_mean) / sqrt(batch_variance + epsilon) + beta`` per
    channel, the batch statistics over N and the spatial axes (population variance);
    ``running = momentum * old + (1 - momentum) * batch`` for mean and variance, with
    ``mean`` and ``variance`` the old running statistics. ``momentum=None`` uses 0.5:
    the operation document gives no default and the dnnl backend, its implementation,
    uses 0.5. gamma and beta are optional together (none: 1 and 0).

    Parameters
    ----------
    src : ndarray
        float32, bfloat16 or float16; N x D1 ... Dn x C (``data_format="NXC"``, the
        default) or N x C x D1 ... Dn (``"NCX"``), at least 2-D.
    mean, variance, gamma, beta : ndarray
        Shape (C,), float32 (or bfloat16 for bfloat16 src), one dtype.
    epsilon : float
        Required, positive.
    out : ndarray, optional
        Where to write dst (src's shape and dtype); may be src.

    Returns
    -------
    dst, running_mean, running_variance, batch_mean, batch_variance
        dst like src; the statistics of shape (C,) in mean's dtype.
    """
    return _dnnl_train.batch_norm_forward_training(src, mean, variance, gamma, beta,
                                                   epsilon=epsilon, momentum=momentum,
                                                   data_format=data_format, out=out,
                                                   engine=ENGINE)


def batch_norm_training_backward(src, diff_dst, mean, variance, gamma=None, *, epsilon,
                                 data_format="NXC", out=None):
    """oneDNN Graph BatchNormTrainingBackward-1: ``(diff_src, diff_gamma, diff_beta)``
    when gamma is given, else ``diff_src``.

    The training-mode gradient of BatchNormForwardTraining's dst: ``mean`` and
    ``variance`` are the batch statistics the forward returned, ``epsilon`` the
    forward's (``r = 1 / sqrt(variance + epsilon)``). Without gamma diff_src is computed
    for gamma = 1. Types and layouts as :func:`batch_norm_forward_training`; ``out``
    (diff_src) may be diff_dst or src. Computed as
    :func:`batch_normalization_backward`.
    """
    return _dnnl_train.batch_norm_training_backward(src, diff_dst, mean, variance, gamma,
                                                    epsilon=epsilon, data_format=data_format,
                                                    out=out, engine=ENGINE)


def layer_norm_backward(src, diff_dst, mean, variance, gamma=None, beta=None, *,
                        begin_norm_axis=-1, epsilon=1e-5, use_affine=True, out=None):
    """oneDNN Graph LayerNormBackward-1: ``(diff_src, diff_gamma, diff_beta)`` with
    ``use_affine`` (gamma and beta required; the gradients have gamma's shape and
    dtype), else ``diff_src``.

    ``mean`` and ``variance`` are :func:`layer_norm`'s statistics outputs (shape
    ``src.shape[:begin_norm_axis]``), used as given: ``r = 1 / sqrt(variance +
    epsilon)``. Types as :func:`layer_norm`; ``out`` (diff_src) may be diff_dst or src.
    Computed as :func:`layer_normalization_backward` (float64 per row, rounded once).
    """
    return _dnnl_train.layer_norm_backward(src, diff_dst, mean, variance, gamma, beta,
                                           begin_norm_axis=begin_norm_axis, epsilon=epsilon,
                                           use_affine=use_affine, out=out, engine=ENGINE)

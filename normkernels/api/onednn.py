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
    data_format : {"NXC", "NCX"}
        Where the channels are: the last axis (the default) or axis 1.
    out : ndarray, optional
        Where to write the output; may be ``input`` itself.

    Returns
    -------
    output : ndarray
        input's shape and dtype (``out`` when given).

    Raises
    ------
    TypeError
        A dtype other than those listed, the parameters not of one dtype.
    ValueError
        input of fewer than 2 dimensions, parameters not of shape (C,), epsilon not
        finite and positive, an unknown ``data_format``.

    Examples
    --------
    >>> x = np.arange(8, dtype=np.float32).reshape(4, 2)  # N x C
    >>> gamma, beta = np.ones(2, np.float32), np.zeros(2, np.float32)
    >>> mean, variance = np.array([3, 4], np.float32), np.array([5, 5], np.float32)
    >>> y = normkernels.batch_norm_inference(x, gamma, beta, mean, variance, epsilon=1e-5)
    >>> np.round(y[:, 0], 4)
    array([-1.3416, -0.4472,  0.4472,  1.3416], dtype=float32)
    >>> np.allclose(y, (x - mean) / np.sqrt(variance + 1e-5) * gamma + beta)
    True
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

    Parameters
    ----------
    src : ndarray
        At least 1-D; float32, bfloat16 or float16.
    gamma, beta : ndarray, optional
        ``src.shape[begin_norm_axis:]``; float32 (or bfloat16 for bfloat16 src).
    begin_norm_axis : int
        The first normalized axis, in ``[-src.ndim, src.ndim)``; default the last.
    epsilon : float
        Added to the variance (default 1e-5).
    keep_stats : bool
        Also return mean and variance (the default).
    use_affine : bool
        Whether gamma and beta are given (the default).
    out : ndarray, optional
        Where to write dst (src's shape and dtype); may be src itself.

    Returns
    -------
    dst : ndarray, or (dst, mean, variance)
        dst has src's shape and dtype.

    Raises
    ------
    TypeError
        A dtype other than those listed.
    ValueError
        ``begin_norm_axis`` out of range, gamma and beta given without ``use_affine``
        or missing with it, gamma or beta of another shape.

    Examples
    --------
    >>> src = np.arange(8, dtype=np.float32).reshape(2, 4)
    >>> gamma, beta = np.ones(4, np.float32), np.zeros(4, np.float32)
    >>> dst, mean, variance = normkernels.layer_norm(src, gamma, beta)
    >>> mean, variance
    (array([1.5, 5.5], dtype=float32), array([1.25, 1.25], dtype=float32))
    >>> np.allclose(dst, normkernels.layer_normalization(src, gamma, beta))
    True
    """
    return _dnnl_rows.layer_norm(src, gamma, beta, begin_norm_axis=begin_norm_axis,
                                 epsilon=epsilon, keep_stats=keep_stats,
                                 use_affine=use_affine, out=out, engine=ENGINE)


def rms_norm(src, gamma=None, *, begin_norm_axis=-1, epsilon=1e-5, out=None):
    """oneDNN Graph RMSNorm-1: ``dst = gamma * src / sqrt(mean(src**2) + epsilon)`` over
    the axes ``begin_norm_axis, ...``; gamma optional, broadcastable to src (float32;
    bfloat16 for bfloat16 src, float16 for float16 src). dst has src's dtype.

    Parameters
    ----------
    src : ndarray
        At least 1-D; float32, bfloat16 or float16.
    gamma : ndarray, optional
        Broadcastable to ``src.shape[begin_norm_axis:]``; None: no scaling.
    begin_norm_axis : int
        The first normalized axis, in ``[-src.ndim, src.ndim)``; default the last.
    epsilon : float
        Added to the mean square (default 1e-5).
    out : ndarray, optional
        Where to write dst (src's shape and dtype).

    Returns
    -------
    dst : ndarray
        src's shape and dtype.

    Raises
    ------
    TypeError
        A dtype other than those listed.
    ValueError
        ``begin_norm_axis`` out of range, gamma not broadcastable to src.

    Examples
    --------
    >>> src = np.arange(8, dtype=np.float32).reshape(2, 4)
    >>> dst = normkernels.rms_norm(src, np.full(4, 2.0, np.float32))
    >>> np.round(dst, 4)
    array([[0.    , 1.069 , 2.1381, 3.2071],
           [1.4254, 1.7817, 2.1381, 2.4944]], dtype=float32)
    >>> np.allclose(dst, 2 * src / np.sqrt((src**2).mean(-1, keepdims=True) + 1e-5))
    True
    """
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
    use_affine : bool
        Whether gamma and beta are given (the default).
    data_format : {"NXC", "NCX"}
        Where the channels are: the last axis (the default) or axis 1.
    out : ndarray, optional
        Where to write dst (src's shape and dtype); may be src itself.

    Returns
    -------
    ndarray, or (dst, mean, variance)
        ``mean`` and ``variance`` (population, not its inverse square root) have shape
        (N, groups) and gamma's dtype (float32 without gamma).

    Raises
    ------
    TypeError
        A dtype other than those listed.
    ValueError
        src of fewer than 3 dimensions, ``groups`` not a divisor of C, gamma or beta
        not of shape (C,), or given without ``use_affine`` (missing with it).

    Examples
    --------
    >>> src = np.arange(16, dtype=np.float32).reshape(1, 2, 2, 4)  # N x H x W x C
    >>> gamma, beta = np.ones(4, np.float32), np.zeros(4, np.float32)
    >>> dst, mean, variance = normkernels.group_norm(src, gamma, beta, groups=2)
    >>> mean, variance
    (array([[6.5, 8.5]], dtype=float32), array([[20.25, 20.25]], dtype=float32))
    >>> np.allclose(dst, normkernels.group_normalization(src, gamma, beta, num_groups=2,
    ...                                                  data_format="NXC"))
    True
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
    momentum : float, optional
        The weight of the old running statistics (None: 0.5).
    data_format : {"NXC", "NCX"}
        Where the channels are: the last axis (the default) or axis 1.
    out : ndarray, optional
        Where to write dst (src's shape and dtype); may be src.

    Returns
    -------
    dst, running_mean, running_variance, batch_mean, batch_variance
        dst like src; the statistics of shape (C,) in mean's dtype.

    Raises
    ------
    TypeError
        A dtype other than those listed.
    ValueError
        src of fewer than 2 dimensions, parameters not of shape (C,), gamma without
        beta or beta without gamma, epsilon not positive.

    Examples
    --------
    >>> src = np.arange(8, dtype=np.float32).reshape(4, 2)  # N x C
    >>> mean, variance = np.zeros(2, np.float32), np.ones(2, np.float32)
    >>> dst, running_mean, running_var, batch_mean, batch_var = (
    ...     normkernels.batch_norm_forward_training(src, mean, variance, epsilon=1e-5,
    ...                                             momentum=0.9))
    >>> batch_mean, batch_var
    (array([3., 4.], dtype=float32), array([5., 5.], dtype=float32))
    >>> running_mean, running_var
    (array([0.3, 0.4], dtype=float32), array([1.4, 1.4], dtype=float32))
    >>> np.allclose(dst, (src - batch_mean) / np.sqrt(batch_var + 1e-5))
    True
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

    Parameters
    ----------
    src : ndarray
        The forward's input: float32, bfloat16 or float16, at least 2-D.
    diff_dst : ndarray
        The gradient reaching dst: src's shape and dtype.
    mean, variance : ndarray
        The forward's batch statistics: shape (C,), float32 (or bfloat16 for bfloat16
        src).
    gamma : ndarray, optional
        Shape (C,), mean's dtype; None: gamma = 1 and only diff_src is returned.
    epsilon : float
        Required, positive: the forward's.
    data_format : {"NXC", "NCX"}
        Where the channels are: the last axis (the default) or axis 1.
    out : ndarray, optional
        Where to write diff_src (src's shape and dtype); may be diff_dst or src.

    Returns
    -------
    diff_src : ndarray, or (diff_src, diff_gamma, diff_beta)
        diff_src like src; diff_gamma and diff_beta of shape (C,) in gamma's dtype.

    Raises
    ------
    TypeError
        A dtype other than those listed.
    ValueError
        diff_dst not of src's shape, parameters not of shape (C,), epsilon not
        positive.

    Examples
    --------
    >>> src = np.arange(8, dtype=np.float32).reshape(4, 2)  # N x C
    >>> diff_dst = np.array([[1, 2], [1, 0], [0, 1], [2, 1]], np.float32)
    >>> mean, variance = np.array([3, 4], np.float32), np.array([5, 5], np.float32)
    >>> diff_src, diff_gamma, diff_beta = normkernels.batch_norm_training_backward(
    ...     src, diff_dst, mean, variance, np.ones(2, np.float32), epsilon=1e-5)
    >>> np.round(diff_gamma, 4), diff_beta
    (array([ 0.8944, -0.8944], dtype=float32), array([4., 4.], dtype=float32))
    >>> np.allclose(diff_src.sum(axis=0), 0, atol=1e-6)  # the batch mean's dependence
    True
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

    Parameters
    ----------
    src : ndarray
        The forward's input: float32, bfloat16 or float16.
    diff_dst : ndarray
        The gradient reaching dst: src's shape and dtype.
    mean, variance : ndarray
        The forward's statistics, shape ``src.shape[:begin_norm_axis]``.
    gamma, beta : ndarray, optional
        The forward's (``src.shape[begin_norm_axis:]``); required with ``use_affine``,
        forbidden without.
    begin_norm_axis : int
        The forward's first normalized axis; default the last.
    epsilon : float
        The forward's (default 1e-5).
    use_affine : bool
        Whether gamma and beta are given (the default); then their gradients are
        returned too.
    out : ndarray, optional
        Where to write diff_src (src's shape and dtype); may be diff_dst or src.

    Returns
    -------
    diff_src : ndarray, or (diff_src, diff_gamma, diff_beta)
        diff_src like src; diff_gamma and diff_beta of gamma's shape and dtype.

    Raises
    ------
    TypeError
        A dtype other than those listed.
    ValueError
        ``begin_norm_axis`` out of range, statistics or gamma and beta of another
        shape, gamma and beta missing with ``use_affine`` (given without).

    Examples
    --------
    >>> src = np.arange(8, dtype=np.float32).reshape(2, 4)
    >>> gamma, beta = np.ones(4, np.float32), np.zeros(4, np.float32)
    >>> dst, mean, variance = normkernels.layer_norm(src, gamma, beta)
    >>> diff_dst = np.array([[1, 2, 0, 1], [0, 1, 1, 2]], np.float32)
    >>> diff_src, diff_gamma, diff_beta = normkernels.layer_norm_backward(
    ...     src, diff_dst, mean, variance, gamma, beta)
    >>> np.round(diff_gamma, 4), diff_beta
    (array([-1.3416, -1.3416,  0.4472,  4.0249], dtype=float32),
     array([1., 3., 1., 3.], dtype=float32))
    >>> dX, dScale, dB = normkernels.layer_normalization_backward(diff_dst, src, gamma)
    >>> np.allclose(diff_src, dX)
    True
    """
    return _dnnl_train.layer_norm_backward(src, diff_dst, mean, variance, gamma, beta,
                                           begin_norm_axis=begin_norm_axis, epsilon=epsilon,
                                           use_affine=use_affine, out=out, engine=ENGINE)

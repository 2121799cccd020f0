"""The gradients of the ONNX-style normalizations: batch, instance, group, layer and
RMS normalization."""

from normkernels.engine.numba_engine import ENGINE
from normkernels.ops import backward as _bwd
from normkernels.ops import modulated as _ada


def batch_normalization_backward(dY, X, scale, mean, var=None, *, inv_std=None, epsilon=1e-5,
                                 training=True, data_format="NCX", out=None, activation=None,
                                 Y=None, B=None, add=None):
    """The gradient of BatchNormalization: ``(dX, dscale, dB)``.

    Training (``training=True``): ``mean`` and ``var`` are the batch mean and
    population variance the forward normalized with (``dX`` includes their dependence
    on X). Inference (``training=False``): the running statistics, constants, so ``dX =
    dY * scale / sqrt(var + epsilon)``.

    Parameters
    ----------
    dY, X : ndarray
        One shape and float dtype (f16, bf16, f32, f64); N x C x D1 ... Dn
        (``data_format="NCX"``), N x D1 ... Dn x C (``"NXC"``) or 1-D (C = 1); any
        strides (dY is read in X's memory order).
    scale, mean : ndarray
        Shape (C,), any float dtype.
    var : ndarray, optional
        Shape (C,): with ``epsilon``, ``r = 1 / sqrt(var + epsilon)`` (oneDNN's and
        PyTorch's eval-mode convention).
    inv_std : ndarray, optional
        Shape (C,): ``r`` itself (PyTorch's ``save_invstd``, onnxruntime's saved inverse
        standard deviation). Exactly one of ``var`` and ``inv_std``.
    out : ndarray, optional
        Where to write dX (X's shape and dtype); may be dY or X itself.
    activation, Y, B, add : optional
        The backward pass through the forward's epilogue (``Y = act(scale * x_hat + B +
        add)``: ``activation=`` and ``add=`` of :func:`batch_normalization`; oneDNN's
        ``fuse_norm_relu`` and ``fuse_norm_add_relu``). ``activation``: the forward's;
        ``Y``: its output, the mask of ``"relu"`` (as oneDNN's workspace); otherwise
        ``B`` (shape (C,)): the activation's input is recomputed from X with it.
        ``add``: the forward's residual (read only when the input is recomputed); when
        given, the gradient of the residual (oneDNN's ``diff_src_1``) is returned too.

    Returns
    -------
    dX : ndarray
        X's shape, dtype and memory order.
    dscale, dB : ndarray
        Shape (C,), scale's dtype: ``sum(dY * x_hat)`` and ``sum(dY)`` per channel
        (dY being the gradient at the activation's input when there is an epilogue).
    dadd : ndarray
        Only with ``add``: X's shape and dtype, ``dY * act'(Z)``.

    Notes
    -----
    One reduction over (X, dY) gives every channel's ``sum(dY)`` and ``sum(dY * (x -
    mean))`` in float64, in an order that depends only on the shape (bitwise the same
    for any thread count); one pass writes ``dX = dY * A + (x - mean) * B + K`` in
    float32 (float64 for float64 X), rounded once.
    """
    return _bwd.batch_normalization_backward(dY, X, scale, mean, var, inv_std=inv_std,
                                             epsilon=epsilon, training=training,
                                             data_format=data_format, out=out,
                                             activation=activation, Y=Y, B=B, add=add,
                                             engine=ENGINE)


def instance_normalization_backward(dY, X, scale, *, epsilon=1e-5, mean=None, inv_std=None,
                                    data_format="NCX", out=None, activation=None, Y=None,
                                    B=None, add=None):
    """The gradient of InstanceNormalization: ``(dX, dscale, dB)``.

    The statistics of every (n, c) are recomputed from X (float64, as the forward's)
    unless ``mean`` and ``inv_std`` (``1 / sqrt(var + epsilon)``), shape (N, C), give
    them; ``dX`` includes their dependence on X. Arguments as
    :func:`batch_normalization_backward` (X at least 3-D; the epilogue's arguments
    too); ``dscale`` and ``dB`` sum over n and the spatial axes, in scale's dtype.
    """
    return _bwd.instance_normalization_backward(dY, X, scale, epsilon=epsilon, mean=mean,
                                                inv_std=inv_std, data_format=data_format,
                                                out=out, activation=activation, Y=Y, B=B,
                                                add=add, engine=ENGINE)


def group_normalization_backward(dY, X, scale, *, num_groups, epsilon=1e-5, mean=None,
                                 inv_std=None, data_format="NCX", out=None, activation=None,
                                 Y=None, B=None, add=None):
    """The gradient of GroupNormalization-21 (scale per channel): ``(dX, dscale, dB)``.

    The statistics of every (n, group) are recomputed from X (float64) unless ``mean``
    and ``inv_std`` give them (shape (N, num_groups), as PyTorch's ``mean``/``rstd``;
    oneDNN's variance converts as ``1 / sqrt(variance + epsilon)``); ``dX`` includes
    their dependence on X. Arguments as :func:`batch_normalization_backward` (X at least
    2-D; ``num_groups`` must divide C); ``dscale`` and ``dB`` sum over n and the spatial
    axes, in scale's dtype.
    """
    return _bwd.group_normalization_backward(dY, X, scale, num_groups=num_groups,
                                             epsilon=epsilon, mean=mean, inv_std=inv_std,
                                             data_format=data_format, out=out,
                                             activation=activation, Y=Y, B=B, add=add,
                                             engine=ENGINE)


def layer_normalization_backward(dY, X, Scale, *, axis=-1, epsilon=1e-5, stash_type=1,
                                 mean=None, inv_std=None, out=None):
    """The gradient of LayerNormalization: ``(dX, dScale, dB)``.

    Per row (the axes ``axis..``) the mean and variance are recomputed from X (float64,
    two passes while the row is in cache); ``dX = r (g - <g> - x_hat <g x_hat>)`` with
    ``g = dY * Scale`` is evaluated in float64 and rounded once to X's dtype. ``dScale``
    and ``dB`` have Scale's shape and dtype (summed over every row, and over the axes
    Scale is broadcast along). ``stash_type`` is checked as the forward checks it; the
    arithmetic is float64 whatever its value. ``out``: dX's destination, may be dY.

    ``mean`` and ``inv_std``: the forward's Mean and InvStdDev outputs (shape
    ``X.shape[:axis]``, or followed by ones as ONNX gives them; any float dtype), used
    instead of recomputing the statistics (both or neither; ``epsilon`` is then unused).
    """
    return _bwd.layer_normalization_backward(dY, X, Scale, axis=axis, epsilon=epsilon,
                                             stash_type=stash_type, mean=mean, inv_std=inv_std,
                                             out=out, engine=ENGINE)


def rms_normalization_backward(dY, X, scale, *, axis=-1, epsilon=1e-5, inv_std=None, out=None):
    """The gradient of RMSNormalization: ``(dX, dscale)``, ``dX = r (g - x_hat <g
    x_hat>)`` with ``r = 1 / sqrt(mean(x^2) + epsilon)``, ``x_hat = x r``, ``g = dY *
    scale``; ``inv_std`` gives ``r`` per row (onnxruntime's ``inv_std_var``) instead of
    recomputing it; as :func:`layer_normalization_backward` otherwise."""
    return _bwd.rms_normalization_backward(dY, X, scale, axis=axis, epsilon=epsilon,
                                           inv_std=inv_std, out=out, engine=ENGINE)


def ada_group_norm_backward(dY, X, shift, scale, *, num_groups, epsilon=1e-5,
                            data_format="NCX", mean=None, inv_std=None, out=None):
    """The gradient of :func:`ada_group_norm`: ``(dX, dshift, dscale)``.

    ``Y = GN(X) * (1 + scale[n, c]) + shift[n, c]``: the group normalization's backward
    pass with per-(n, c) ``gamma = 1 + scale`` (``dX`` includes the statistics'
    dependence on X); ``dshift[n, c] = sum(dY)`` and ``dscale[n, c] = sum(dY * x_hat)``
    over the spatial axes of sample n, in shift's and scale's dtypes (rounded once from
    float64). The statistics are recomputed from X unless ``mean`` and ``inv_std``
    (shape (N, num_groups)) give them. Arguments as :func:`ada_group_norm`; ``out``:
    dX's destination, may be dY.
    """
    return _ada.ada_group_norm_backward(dY, X, shift, scale, num_groups=num_groups,
                                        epsilon=epsilon, data_format=data_format, mean=mean,
                                        inv_std=inv_std, out=out, engine=ENGINE)


def ada_layer_norm_backward(dY, X, shift, scale, *, epsilon=1e-6, residual=None, gate=None,
                            dS=None, out=None):
    """The gradient of :func:`ada_layer_norm`.

    Without ``residual``: ``(dX, dshift, dscale)``, the LayerNorm backward pass of each
    sample with ``gamma = 1 + scale[n]`` (statistics recomputed from X, float64), and
    ``dshift[n] = sum(dY)``, ``dscale[n] = sum(dY * x_hat)`` over sample n's tokens,
    shape (N, C) in shift's and scale's dtypes.

    With ``residual`` (the forward returned ``(Y, S)``, ``S = residual + gate * X``):
    ``(dX, dresidual, dgate, dshift, dscale)``. ``dS``: the gradient reaching S from
    later in the network (the residual stream; None: 0); the total ``dS_total = dS +
    dLN(S)`` is ``dresidual``, ``dX = gate * dS_total`` and ``dgate[n] = sum(dS_total *
    X)`` over the tokens (None without ``gate``). S is recomputed as the forward
    computed it; with 16-bit X, dLN stays in float32 and each result is rounded once.
    """
    return _ada.ada_layer_norm_backward(dY, X, shift, scale, epsilon=epsilon,
                                        residual=residual, gate=gate, dS=dS, out=out,
                                        engine=ENGINE)

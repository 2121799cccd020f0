"""The gradients of the ONNX-style normalizations: batch, instance, group, layer and
RMS normalization."""

from normkernels.engine.numba_engine import ENGINE
from normkernels.ops import backward as _bwd


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
    epsilon : float
        Added to ``var`` (unused with ``inv_std``).
    training : bool
        Whether ``mean`` and ``var`` are the batch's (True, the default) or running
        statistics (False).
    data_format : {"NCX", "NXC"}
        Where the channels are: axis 1 (the default) or the last axis.
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

    Raises
    ------
    TypeError
        A dtype other than the four floats, dY not of X's dtype.
    ValueError
        dY not of X's shape, parameters not of shape (C,), both or neither of ``var``
        and ``inv_std``, an unknown ``data_format`` or ``activation``, ``out`` not of
        X's shape and dtype.

    Notes
    -----
    One reduction over (X, dY) gives every channel's ``sum(dY)`` and ``sum(dY * (x -
    mean))`` in float64, in an order that depends only on the shape (bitwise the same
    for any thread count); one pass writes ``dX = dY * A + (x - mean) * B + K`` in
    float32 (float64 for float64 X), rounded once.

    Examples
    --------
    >>> X = np.arange(12, dtype=np.float32).reshape(2, 3, 2)  # N x C x D
    >>> dY = np.ones_like(X)
    >>> dY[..., 0] = 3
    >>> scale = np.array([1, 2, 3], np.float32)
    >>> mean, var = normkernels.moments(X)  # the batch statistics
    >>> dX, dscale, dB = normkernels.batch_normalization_backward(dY, X, scale, mean, var)
    >>> dB, np.round(dscale, 4)
    (array([8., 8., 8.], dtype=float32), array([-0.6576, -0.6576, -0.6576], dtype=float32))
    >>> x_hat = (X - mean[:, None]) / np.sqrt(var[:, None] + 1e-5)
    >>> np.allclose(dscale, (dY * x_hat).sum(axis=(0, 2)))
    True

    With running statistics (``training=False``) the gradient is a per-channel scaling:

    >>> dX, _, _ = normkernels.batch_normalization_backward(dY, X, scale, mean, var,
    ...                                                     training=False)
    >>> np.allclose(dX, dY * scale[:, None] / np.sqrt(var[:, None] + 1e-5))
    True
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

    Parameters
    ----------
    dY, X : ndarray
        One shape and float dtype; N x C x D1 ... Dn (``data_format="NCX"``) or N x D1
        ... Dn x C (``"NXC"``), at least 3-D.
    scale : ndarray
        Shape (C,), any float dtype.
    epsilon : float
        The forward's (unused with ``mean`` and ``inv_std``).
    mean, inv_std : ndarray, optional
        Shape (N, C): the forward's statistics (both or neither).
    data_format : {"NCX", "NXC"}
        Where the channels are: axis 1 (the default) or the last axis.
    out : ndarray, optional
        Where to write dX (X's shape and dtype); may be dY or X itself.
    activation, Y, B, add : optional
        The forward's epilogue, as in :func:`batch_normalization_backward`.

    Returns
    -------
    dX : ndarray
        X's shape, dtype and memory order.
    dscale, dB : ndarray
        Shape (C,), scale's dtype.
    dadd : ndarray
        Only with ``add``, as in :func:`batch_normalization_backward`.

    Raises
    ------
    TypeError
        A dtype other than the four floats, dY not of X's dtype.
    ValueError
        dY not of X's shape, X of fewer than 3 dimensions, parameters not of
        shape (C,), ``mean`` without ``inv_std`` or the reverse, an unknown
        ``data_format`` or ``activation``.

    Examples
    --------
    >>> X = np.arange(12, dtype=np.float32).reshape(1, 3, 4)  # N x C x D
    >>> dY = np.array([1, 2, 0, 1], np.float32) * np.ones_like(X)
    >>> scale = np.array([1, 2, 3], np.float32)
    >>> dX, dscale, dB = normkernels.instance_normalization_backward(dY, X, scale)
    >>> mu, r = X.mean(-1, keepdims=True), 1 / np.sqrt(X.var(-1, keepdims=True) + 1e-5)
    >>> x_hat, g = (X - mu) * r, dY * scale[:, None]
    >>> np.allclose(dX, r * (g - g.mean(-1, keepdims=True)
    ...                      - x_hat * (g * x_hat).mean(-1, keepdims=True)))
    True
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

    Parameters
    ----------
    dY, X : ndarray
        One shape and float dtype; N x C x D1 ... Dn (``data_format="NCX"``) or N x D1
        ... Dn x C (``"NXC"``), at least 2-D.
    scale : ndarray
        Shape (C,), any float dtype.
    num_groups : int
        Required; must divide C.
    epsilon : float
        The forward's (unused with ``mean`` and ``inv_std``).
    mean, inv_std : ndarray, optional
        Shape (N, num_groups): the forward's statistics (both or neither).
    data_format : {"NCX", "NXC"}
        Where the channels are: axis 1 (the default) or the last axis.
    out : ndarray, optional
        Where to write dX (X's shape and dtype); may be dY or X itself.
    activation, Y, B, add : optional
        The forward's epilogue, as in :func:`batch_normalization_backward`.

    Returns
    -------
    dX : ndarray
        X's shape, dtype and memory order.
    dscale, dB : ndarray
        Shape (C,), scale's dtype.
    dadd : ndarray
        Only with ``add``, as in :func:`batch_normalization_backward`.

    Raises
    ------
    TypeError
        A dtype other than the four floats, dY not of X's dtype.
    ValueError
        dY not of X's shape, X of fewer than 2 dimensions, ``num_groups`` not a
        divisor of C, parameters not of shape (C,), ``mean`` without ``inv_std`` or
        the reverse, an unknown ``data_format`` or ``activation``.

    Examples
    --------
    One group is the layer normalization of each sample's C x D values:

    >>> X = np.arange(12, dtype=np.float32).reshape(1, 3, 4)  # N x C x D
    >>> dY = np.array([1, 2, 0, 1], np.float32) * np.ones_like(X)
    >>> dX, dscale, dB = normkernels.group_normalization_backward(
    ...     dY, X, np.ones(3, np.float32), num_groups=1)
    >>> dX_rows, _, _ = normkernels.layer_normalization_backward(
    ...     dY.reshape(1, 12), X.reshape(1, 12), np.ones(12, np.float32))
    >>> np.allclose(dX, dX_rows.reshape(X.shape)), dB
    (True, array([4., 4., 4.], dtype=float32))
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

    Parameters
    ----------
    dY, X : ndarray
        One shape and float dtype (float16, bfloat16, float32, float64), rank >= 1.
    Scale : ndarray
        The forward's, broadcastable to ``X.shape[axis:]``.
    axis : int
        The forward's first normalized axis; default the last.
    epsilon : float
        The forward's (default 1e-5).
    stash_type : int
        1, 16 or 11, as in :func:`layer_normalization`.
    mean, inv_std : ndarray, optional
        The forward's Mean and InvStdDev.
    out : ndarray, optional
        Where to write dX (X's shape and dtype); may be dY.

    Returns
    -------
    dX : ndarray
        X's shape and dtype.
    dScale, dB : ndarray
        Scale's shape and dtype.

    Raises
    ------
    TypeError
        A dtype other than the four floats, dY not of X's dtype.
    ValueError
        dY not of X's shape, ``axis`` out of range, Scale not broadcastable, an unknown
        ``stash_type``, ``mean`` without ``inv_std`` or the reverse.

    Examples
    --------
    >>> X = np.arange(8, dtype=np.float32).reshape(2, 4)
    >>> dY = np.array([[1, 2, 0, 1], [0, 1, 1, 2]], np.float32)
    >>> Scale = np.full(4, 2.0, np.float32)
    >>> dX, dScale, dB = normkernels.layer_normalization_backward(dY, X, Scale)
    >>> np.round(dScale, 4), dB
    (array([-1.3416, -1.3416,  0.4472,  4.0249], dtype=float32),
     array([1., 3., 1., 3.], dtype=float32))
    >>> mu, r = X.mean(-1, keepdims=True), 1 / np.sqrt(X.var(-1, keepdims=True) + 1e-5)
    >>> x_hat, g = (X - mu) * r, dY * Scale
    >>> np.allclose(dX, r * (g - g.mean(-1, keepdims=True)
    ...                      - x_hat * (g * x_hat).mean(-1, keepdims=True)))
    True
    """
    return _bwd.layer_normalization_backward(dY, X, Scale, axis=axis, epsilon=epsilon,
                                             stash_type=stash_type, mean=mean, inv_std=inv_std,
                                             out=out, engine=ENGINE)


def rms_normalization_backward(dY, X, scale, *, axis=-1, epsilon=1e-5, inv_std=None, out=None):
    """The gradient of RMSNormalization: ``(dX, dscale)``, ``dX = r (g - x_hat <g
    x_hat>)`` with ``r = 1 / sqrt(mean(x^2) + epsilon)``, ``x_hat = x r``, ``g = dY *
    scale``; ``inv_std`` gives ``r`` per row (onnxruntime's ``inv_std_var``) instead of
    recomputing it; as :func:`layer_normalization_backward` otherwise.

    Parameters
    ----------
    dY, X : ndarray
        One shape and float dtype (float16, bfloat16, float32, float64), rank >= 1.
    scale : ndarray
        The forward's, broadcastable to ``X.shape[axis:]``.
    axis : int
        The forward's first normalized axis; default the last.
    epsilon : float
        The forward's (default 1e-5; unused with ``inv_std``).
    inv_std : ndarray, optional
        ``r`` per row, shape ``X.shape[:axis]`` (or followed by ones).
    out : ndarray, optional
        Where to write dX (X's shape and dtype); may be dY.

    Returns
    -------
    dX : ndarray
        X's shape and dtype.
    dscale : ndarray
        scale's shape and dtype.

    Raises
    ------
    TypeError
        A dtype other than the four floats, dY not of X's dtype.
    ValueError
        dY not of X's shape, ``axis`` out of range, scale not broadcastable.

    Examples
    --------
    >>> X = np.arange(8, dtype=np.float32).reshape(2, 4)
    >>> dY = np.array([[1, 2, 0, 1], [0, 1, 1, 2]], np.float32)
    >>> scale = np.full(4, 2.0, np.float32)
    >>> dX, dscale = normkernels.rms_normalization_backward(dY, X, scale)
    >>> r = 1 / np.sqrt((X**2).mean(-1, keepdims=True) + 1e-5)
    >>> x_hat, g = X * r, dY * scale
    >>> np.allclose(dX, r * (g - x_hat * (g * x_hat).mean(-1, keepdims=True)))
    True
    >>> np.allclose(dscale, (dY * x_hat).sum(axis=0))
    True
    """
    return _bwd.rms_normalization_backward(dY, X, scale, axis=axis, epsilon=epsilon,
                                           inv_std=inv_std, out=out, engine=ENGINE)

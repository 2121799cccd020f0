"""The modulated normalizations of diffusion models (DiT, FLUX, SD3; diffusers'
AdaGroupNorm): a normalization without its own affine, then ``* (1 + scale) + shift``
per sample (and channel), in the normalize pass; and their gradients."""

from normkernels.engine.numba_engine import ENGINE
from normkernels.ops import modulated as _ada


def ada_layer_norm(X, shift, scale, *, epsilon=1e-6, residual=None, gate=None, out=None):
    """Adaptive LayerNorm (DiT, FLUX, SD3): ``Y = LN(X) * (1 + scale[n]) + shift[n]``.

    LayerNormalization over the last axis (C) without its own affine parameters, then
    the per-sample modulation. With ``residual``, a DiT block's boundary in one call:
    ``S = residual + gate * X`` (the residual stream after a sublayer whose output is
    X; ``gate`` None means 1), then ``Y = LN(S) * (1 + scale) + shift``.

    Parameters
    ----------
    X : ndarray
        (N, ..., C): N samples of tokens of C channels; float16, bfloat16, float32 or
        float64; any strides.
    shift, scale : ndarray
        (N, C) or (N, 1, ..., 1, C) (X's rank), any float dtype: one value per sample
        and channel, broadcast over the tokens.
    epsilon : float
        Default 1e-6 (DiT's).
    residual : ndarray, optional
        X's shape and dtype.
    gate : ndarray, optional
        As shift; needs ``residual``.
    out : ndarray, optional
        Where to write Y (X's shape and dtype); may be X itself.

    Returns
    -------
    ndarray or tuple
        Y; with ``residual``, ``(Y, S)``: S (a new C-contiguous array) is ``residual +
        gate * X`` rounded once to X's dtype, and Y is the normalization of S as
        returned.

    Raises
    ------
    TypeError
        A dtype other than the four floats.
    ValueError
        X of fewer than 2 dimensions, shift, scale or gate of another shape, ``gate``
        without ``residual``, residual not of X's shape and dtype, rows of zero
        elements.

    Notes
    -----
    ``1 + scale`` and ``shift`` enter the row kernels' one rounding (float64 arithmetic
    for float32 X), and a zero shift adds -0.0: with AdaLN-Zero's ``scale = shift =
    0``, Y equals ``layer_normalization(X, ones)`` bit for bit. One kernel call per
    sample.

    Examples
    --------
    >>> X = np.arange(16, dtype=np.float32).reshape(2, 2, 4)  # 2 samples of 2 tokens
    >>> shift = np.zeros((2, 4), np.float32)
    >>> scale = np.array([[0, 0, 0, 0], [1, 1, 1, 1]], np.float32)
    >>> Y = normkernels.ada_layer_norm(X, shift, scale)
    >>> np.round(Y[1], 4)  # sample 1: twice the LayerNorm
    array([[-2.6833, -0.8944,  0.8944,  2.6833],
           [-2.6833, -0.8944,  0.8944,  2.6833]], dtype=float32)
    >>> LN = normkernels.layer_normalization(X, np.ones(4, np.float32), epsilon=1e-6)
    >>> np.allclose(Y, LN * (1 + scale[:, None]) + shift[:, None])
    True
    """
    return _ada.ada_layer_norm(X, shift, scale, epsilon=epsilon, residual=residual, gate=gate,
                               out=out, engine=ENGINE)


def ada_group_norm(X, shift, scale, *, num_groups, epsilon=1e-5, data_format="NCX", out=None):
    """diffusers' AdaGroupNorm: ``Y = GN(X) * (1 + scale[n, c]) + shift[n, c]``.

    Group normalization without its own affine parameters, modulated per sample and
    channel (scale and shift from an embedding, as diffusers' ``AdaGroupNorm`` computes
    them); the modulation is folded into each (n, c)'s normalize parameters in float64,
    so it costs what :func:`group_normalization` costs.

    Parameters
    ----------
    X : ndarray
        N x C x D1 ... Dn (``data_format="NCX"``) or N x D1 ... Dn x C (``"NXC"``); at
        least 3-D; float16, bfloat16, float32 or float64; any strides.
    shift, scale : ndarray
        (N, C), any float dtype.
    num_groups : int
        Required; must divide C.
    epsilon : float
        Default 1e-5.
    data_format : {"NCX", "NXC"}
        Where the channels are: axis 1 (the default) or the last axis.
    out : ndarray, optional
        Where to write Y (X's shape and dtype); may be X itself.

    Returns
    -------
    ndarray
        X's shape and dtype; with ``scale = shift = 0``, ``group_normalization(X, ones,
        zeros)`` bit for bit.

    Raises
    ------
    TypeError
        A dtype other than the four floats.
    ValueError
        X of fewer than 3 dimensions, shift or scale not of shape (N, C),
        ``num_groups`` not a divisor of C, an unknown ``data_format``.

    Examples
    --------
    >>> X = np.arange(16, dtype=np.float32).reshape(1, 4, 2, 2)  # NCHW
    >>> shift = np.array([[0, 0, 1, 1]], np.float32)
    >>> scale = np.array([[0, 1, 0, 1]], np.float32)
    >>> Y = normkernels.ada_group_norm(X, shift, scale, num_groups=2)
    >>> GN = normkernels.group_normalization(X, np.ones(4, np.float32),
    ...                                      np.zeros(4, np.float32), num_groups=2)
    >>> np.allclose(Y, GN * (1 + scale[..., None, None]) + shift[..., None, None])
    True
    """
    return _ada.ada_group_norm(X, shift, scale, num_groups=num_groups, epsilon=epsilon,
                               data_format=data_format, out=out, engine=ENGINE)


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

    Parameters
    ----------
    dY, X : ndarray
        One shape and float dtype: (N, ..., C).
    shift, scale : ndarray
        The forward's: (N, C) or (N, 1, ..., 1, C), any float dtype.
    epsilon : float
        The forward's (default 1e-6).
    residual, gate : ndarray, optional
        The forward's.
    dS : ndarray, optional
        The gradient reaching S (X's shape and dtype); needs ``residual``.
    out : ndarray, optional
        Where to write dX (X's shape and dtype); may be dY.

    Returns
    -------
    tuple
        ``(dX, dshift, dscale)``; with ``residual``, ``(dX, dresidual, dgate, dshift,
        dscale)``.

    Raises
    ------
    TypeError
        A dtype other than the four floats.
    ValueError
        dY, residual or dS not of X's shape and dtype, shift, scale or gate of another
        shape, ``gate`` or ``dS`` without ``residual``.

    Examples
    --------
    >>> X = np.arange(16, dtype=np.float32).reshape(2, 2, 4)  # 2 samples of 2 tokens
    >>> dY = np.ones_like(X)
    >>> dY[..., 0] = 2
    >>> shift = np.zeros((2, 4), np.float32)
    >>> scale = np.array([[0, 0, 0, 0], [1, 1, 1, 1]], np.float32)
    >>> dX, dshift, dscale = normkernels.ada_layer_norm_backward(dY, X, shift, scale)
    >>> dshift
    array([[4., 2., 2., 2.],
           [4., 2., 2., 2.]], dtype=float32)
    >>> dX1, _, _ = normkernels.layer_normalization_backward(dY[1], X[1], 1 + scale[1],
    ...                                                      epsilon=1e-6)
    >>> np.allclose(dX[1], dX1)
    True
    """
    return _ada.ada_layer_norm_backward(dY, X, shift, scale, epsilon=epsilon,
                                        residual=residual, gate=gate, dS=dS, out=out,
                                        engine=ENGINE)


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

    Parameters
    ----------
    dY, X : ndarray
        One shape and float dtype; N x C x D1 ... Dn (``data_format="NCX"``) or N x D1
        ... Dn x C (``"NXC"``), at least 3-D.
    shift, scale : ndarray
        The forward's: (N, C), any float dtype.
    num_groups : int
        Required; must divide C.
    epsilon : float
        The forward's (default 1e-5).
    data_format : {"NCX", "NXC"}
        Where the channels are: axis 1 (the default) or the last axis.
    mean, inv_std : ndarray, optional
        Shape (N, num_groups): the forward's statistics (both or neither).
    out : ndarray, optional
        Where to write dX (X's shape and dtype); may be dY.

    Returns
    -------
    dX : ndarray
        X's shape and dtype.
    dshift, dscale : ndarray
        Shape (N, C), in shift's and scale's dtypes.

    Raises
    ------
    TypeError
        A dtype other than the four floats.
    ValueError
        X of fewer than 3 dimensions, dY not of X's shape, shift or scale not of shape
        (N, C), ``num_groups`` not a divisor of C.

    Examples
    --------
    >>> X = np.arange(16, dtype=np.float32).reshape(1, 4, 2, 2)  # NCHW
    >>> dY = np.ones_like(X)
    >>> dY[..., 0] = 2
    >>> shift, scale = np.zeros((1, 4), np.float32), np.array([[0, 1, 0, 1]], np.float32)
    >>> dX, dshift, dscale = normkernels.ada_group_norm_backward(dY, X, shift, scale,
    ...                                                          num_groups=2)
    >>> dshift
    array([[6., 6., 6., 6.]], dtype=float32)
    >>> dX_gn, _, _ = normkernels.group_normalization_backward(dY, X, 1 + scale[0],
    ...                                                        num_groups=2)
    >>> np.allclose(dX, dX_gn)  # gamma = 1 + scale
    True
    """
    return _ada.ada_group_norm_backward(dY, X, shift, scale, num_groups=num_groups,
                                        epsilon=epsilon, data_format=data_format, mean=mean,
                                        inv_std=inv_std, out=out, engine=ENGINE)

"""ONNX BatchNormalization, the per-channel moments of X (mergeable partials for
statistics of chunks or micro-batches), and inference BatchNorm folded into the
preceding Conv/Gemm weights."""

from normkernels.engine.numba_engine import ENGINE
from normkernels.ops import batch_normalization as _bn
from normkernels.ops import fold_batch_norm as _fold
from normkernels.ops import moments as _moments


def batch_normalization(X, scale, B, input_mean, input_var, *, epsilon=None, momentum=None,
                        training_mode=None, is_test=None, spatial=None, consumed_inputs=None,
                        num_outputs=None, saved_var="variance", opset=15, data_format="NCX",
                        activation=None, add=None, out=None):
    """ONNX BatchNormalization with the semantics of ``opset``.

    Inference: ``Y = (X - input_mean) / sqrt(input_var + epsilon) * scale + B`` per
    channel. Training: the same with the batch mean and population variance of X, and
    ``running = input * momentum + batch * (1 - momentum)`` (ONNX's convention:
    ``momentum`` weighs the old value, the opposite of PyTorch's).

    Parameters
    ----------
    X : ndarray
        N x C x D1 ... Dn (``data_format="NCX"``, ONNX's layout), N x D1 ... Dn x C
        (``"NXC"``), or 1-D of size N (C = 1). float16, bfloat16 (opset >= 14),
        float32 or float64; any strides.
    scale, B, input_mean, input_var : ndarray
        Shape (C,). Opset 15: scale/B share one float dtype (T1), mean/var another
        (T2), each independent of X. Opset 14: scale/B have X's dtype. Opsets 1-9:
        everything has X's dtype.
    epsilon, momentum, training_mode, is_test, spatial, consumed_inputs
        ONNX attributes; ``None`` means the opset's schema default. Passing an
        attribute the opset does not have is a TypeError, and so is leaving out
        ``consumed_inputs`` at opsets 1-5 (the schema requires it; its value is
        accepted and ignored).
    num_outputs : int, optional
        Opsets 1-9: how many outputs the node has (1 to 5: Y, mean, var, saved_mean,
        saved_var); in opsets 7 and 9 it selects the mode (1 = inference).
    saved_var : {"variance", "inv_std"}
        Opsets 1-9 training: saved_var as the spec words it (the batch variance), or
        onnxruntime's 1 / sqrt(var + epsilon).
    opset : int
        The model's opset; the version used is the highest at or below it.
    data_format : {"NCX", "NXC"}
        Where the channels are: axis 1 (ONNX's layout, the default) or the last axis
        (channels last, a normkernels extension).
    activation : str, optional
        An epilogue applied to Y in the same pass, before its one rounding (a package
        extension, not an ONNX attribute): None (default), "relu", "silu", "gelu_tanh" or
        "gelu" (PyTorch's definitions; the error bound in the user
        guide's "Diffusion models and fused epilogues" page, ``docs/guide/epilogues.md``).
    add : ndarray, optional
        A residual of X's shape and dtype added to the affine result before the
        activation, in the same pass (oneDNN's norm-add-relu; a package extension):
        ``Y = act(normalized * scale + B + add)``. May be ``out``.
    out : ndarray, optional
        Where to write Y (X's shape and dtype); may be X itself.

    Returns
    -------
    Y : ndarray, or a tuple
        Y has X's shape, dtype and memory order (``out`` when given). Training returns
        ``(Y, running_mean, running_var)`` in opsets 14/15 and the first
        ``num_outputs`` of ``(Y, mean, var, saved_mean, saved_var)`` in opsets 1-9;
        statistics have input_mean's dtype and are new arrays.

    Raises
    ------
    TypeError
        A dtype the opset does not allow, an attribute the opset does not have, or
        ``consumed_inputs`` left out at opsets 1-5.
    ValueError
        Parameters not of shape (C,), an unknown ``data_format``, ``saved_var`` or
        ``activation``, ``num_outputs`` out of range, training on an empty X, or
        ``out`` not of X's shape and dtype.

    Notes
    -----
    Arithmetic is float32 (float64 for float64 X); float16/bfloat16 results are
    rounded once from it. Parameters are folded to ``a = scale / sqrt(var + eps)``
    in float64 and rounded once to the compute dtype, as are mean and B. Batch
    statistics are computed in one read of X (float64 sums; for 16-bit X float32 runs
    joined in float64), in an order independent of the thread count. ``spatial=0``
    (opsets 1, 6, 7) normalizes each activation over N: parameters then have the
    shape of one sample, ``X.shape[1:]`` (opsets 1/6 also accept (C,), broadcast),
    and so do the statistics returned.

    Examples
    --------
    >>> X = np.arange(12, dtype=np.float32).reshape(2, 3, 2)  # N x C x D
    >>> scale, B = np.ones(3, np.float32), np.zeros(3, np.float32)
    >>> mean, var = np.array([0, 1, 2], np.float32), np.array([1, 4, 9], np.float32)
    >>> Y = normkernels.batch_normalization(X, scale, B, mean, var)
    >>> np.allclose(Y, (X - mean[:, None]) / np.sqrt(var[:, None] + 1e-5))
    True

    Training mode returns the running statistics updated with the batch's:

    >>> Y, running_mean, running_var = normkernels.batch_normalization(
    ...     X, scale, B, mean, var, training_mode=1, momentum=0.9)
    >>> running_mean, running_var
    (array([0.35, 1.45, 2.55], dtype=float32), array([1.825, 4.525, 9.025], dtype=float32))
    """
    return _bn.batch_normalization(
        X, scale, B, input_mean, input_var, epsilon=epsilon, momentum=momentum,
        training_mode=training_mode, is_test=is_test, spatial=spatial,
        consumed_inputs=consumed_inputs, num_outputs=num_outputs, saved_var=saved_var,
        opset=opset, data_format=data_format, activation=activation, add=add, out=out,
        engine=ENGINE)


def moments(X, *, data_format="NCX"):
    """Per-channel mean and population variance of X.

    Channels are axis 1 (``"NCX"``) or the last axis (``"NXC"``); a 1-D X is one
    channel. One read of X, float64 accumulation (16-bit X: float32 runs joined in
    float64, variance within 1e-6 relative), bitwise the same for any thread count.
    Returns float64 arrays for float32/float64 X, float32 for float16/bfloat16.

    Parameters
    ----------
    X : ndarray
        At least 1-D; float16, bfloat16, float32 or float64; any strides.
    data_format : {"NCX", "NXC"}
        Where the channels are: axis 1 (the default) or the last axis.

    Returns
    -------
    mean, var : ndarray
        Shape (C,): the mean and population variance of each channel over every other
        axis.

    Raises
    ------
    TypeError
        X's dtype not one of the four floats.
    ValueError
        X a scalar, no elements to reduce, an unknown ``data_format``.

    Examples
    --------
    >>> X = np.arange(12, dtype=np.float32).reshape(2, 3, 2)
    >>> mean, var = normkernels.moments(X)
    >>> mean, var
    (array([3.5, 5.5, 7.5]), array([9.25, 9.25, 9.25]))
    >>> np.allclose(var, X.var(axis=(0, 2)))
    True
    """
    return _moments.moments(X, data_format=data_format, engine=ENGINE)


def partial_moments(X, *, data_format="NCX"):
    """Mergeable per-channel statistics of X: ``Moments(count, mean, M2)`` (int64,
    float64, float64 arrays of shape (C,); M2 = sum of squared deviations). Combine
    partials of chunks or micro-batches with :func:`merge_moments`; the variance is
    ``M2 / count``. An empty X gives count 0 (the identity of the merge).

    Parameters
    ----------
    X : ndarray
        At least 1-D; float16, bfloat16, float32 or float64; any strides; may be
        empty.
    data_format : {"NCX", "NXC"}
        Where the channels are: axis 1 (the default) or the last axis.

    Returns
    -------
    Moments
        A named tuple ``(count, mean, M2)`` of arrays of shape (C,).

    Raises
    ------
    TypeError
        X's dtype not one of the four floats.
    ValueError
        X a scalar, an unknown ``data_format``.

    Examples
    --------
    >>> X = np.arange(12, dtype=np.float32).reshape(2, 3, 2)
    >>> normkernels.partial_moments(X[:1])  # the first sample
    Moments(count=array([2, 2, 2]), mean=array([0.5, 2.5, 4.5]), M2=array([0.5, 0.5, 0.5]))
    """
    return _moments.partial_statistics(X, data_format, ENGINE)


def merge_moments(a, b):
    """Merge two partials from :func:`partial_moments` (Chan's formula): the
    statistics of the concatenation, without a second pass over the data.

    Parameters
    ----------
    a, b : Moments
        Partials of the same channels (shape (C,)), as :func:`partial_moments` or
        this function returns them.

    Returns
    -------
    Moments
        ``(count, mean, M2)`` of the data of both; the variance is ``M2 / count``.

    Raises
    ------
    ValueError
        The partials describe different numbers of channels.

    Examples
    --------
    >>> X = np.arange(12, dtype=np.float32).reshape(2, 3, 2)
    >>> both = normkernels.merge_moments(normkernels.partial_moments(X[:1]),
    ...                                  normkernels.partial_moments(X[1:]))
    >>> both.count, both.mean, both.M2 / both.count
    (array([4, 4, 4]), array([3.5, 5.5, 7.5]), array([9.25, 9.25, 9.25]))
    >>> np.allclose(both.M2 / both.count, normkernels.moments(X)[1])
    True
    """
    return _moments.merge(a, b)


def fold_batch_norm(weight, bias, scale, B, mean, var, *, epsilon=1e-5, axis=0):
    """Inference BatchNormalization folded into the preceding Conv or Gemm/MatMul.

    ``BN(y) = a * y + b`` per output channel with ``a = scale / sqrt(var + epsilon)``
    and ``b = B - mean * a``; the folded layer has ``W'[o, ...] = W[o, ...] * a[o]``
    and ``bias'[o] = bias[o] * a[o] + b[o]``, so ``Conv(x, W') + bias'`` is
    ``BN(Conv(x, W) + bias)``.

    Parameters
    ----------
    weight : ndarray
        The Conv weight (O, I / groups, k1 ... kn) with ``axis=0``, or a Gemm/MatMul
        weight with its output features on ``axis``: (N, K) with ``axis=0`` (Gemm
        with transB=1, torch's Linear), (K, N) with ``axis=1`` or ``-1`` (MatMul,
        Gemm with transB=0). float16, bfloat16, float32 or float64; any strides.
    bias : ndarray or None
        Shape (O,), any of the four float dtypes; None means zeros.
    scale, B, mean, var : ndarray
        The BatchNormalization's scale, B, input_mean and input_var: shape (O,), where
        O = ``weight.shape[axis]``; any of the four float dtypes, each its own.
    epsilon : float
        A finite number >= 0 (default 1e-5, ONNX's and torch's).
    axis : int
        The output-feature axis of ``weight`` (negative counts from the end).

    Returns
    -------
    (weight', bias') : tuple of ndarray
        New arrays of ``weight``'s dtype: ``weight'`` of its shape, ``bias'`` of
        shape (O,) (also when ``bias`` is None). The inputs are not modified.

    Notes
    -----
    ``a``, ``weight'`` and ``bias'`` are computed in float64 from the exact values
    and rounded once (to nearest even) to the weight's dtype; torch's
    ``fuse_conv_bn_weights`` computes in the weight's dtype instead. A dtype error is
    a TypeError, a wrong shape, an axis out of range, a negative epsilon or a
    negative ``var + epsilon`` a ValueError, each naming the argument. NaN and Inf in
    the parameters propagate to their own output channel (``var + epsilon = 0``
    gives ``a = inf``).

    Examples
    --------
    >>> W = np.arange(6, dtype=np.float32).reshape(3, 2)  # a Gemm weight (N, K)
    >>> scale, B = np.full(3, 2, np.float32), np.ones(3, np.float32)
    >>> mean, var = np.array([0, 1, 2], np.float32), np.array([1, 4, 9], np.float32)
    >>> W2, b2 = normkernels.fold_batch_norm(W, None, scale, B, mean, var, epsilon=0.0)
    >>> W2, b2
    (array([[0.    , 2.    ],
           [2.    , 3.    ],
           [2.6667, 3.3333]], dtype=float32), array([ 1.    ,  0.    , -0.3333], dtype=float32))
    >>> x = np.array([1, 2], np.float32)
    >>> np.allclose(W2 @ x + b2, (W @ x - mean) / np.sqrt(var) * scale + B)
    True
    """
    return _fold.fold_batch_norm(weight, bias, scale, B, mean, var, epsilon=epsilon,
                                 axis=axis)

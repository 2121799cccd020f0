"""The row normalizations: ONNX LayerNormalization and RMSNormalization,
onnxruntime's SimplifiedLayerNormalization, SkipLayerNormalization and
SkipSimplifiedLayerNormalization (the adaptive LayerNorm of diffusion transformers is in
normkernels.api.modulated)."""

from normkernels.engine.numba_engine import ENGINE
from normkernels.ops import layer_normalization as _ln
from normkernels.ops import rms_normalization as _rms
from normkernels.ops import skip_layer_normalization as _skip


def layer_normalization(X, Scale, B=None, *, axis=-1, epsilon=1e-5, stash_type=1,
                        num_outputs=1, opset=17, activation=None, add=None, out=None):
    """ONNX LayerNormalization-17.

    Per row (the axes ``axis, ..., X.ndim - 1``): ``Y = (X - mean) / sqrt(var +
    epsilon) * Scale + B`` with the mean and population variance of the row.

    Parameters
    ----------
    X : ndarray
        Any rank >= 1; float16, bfloat16, float32 or float64; any strides (rows that
        are contiguous are read in place, others copied first).
    Scale, B : ndarray
        X's dtype; broadcast unidirectionally to X (typically ``X.shape[axis:]``; B is
        optional).
    axis : int
        The first normalized axis, in ``[-X.ndim, X.ndim)``.
    epsilon : float
        Added to the variance (finite; default 1e-5, the schema's).
    stash_type : int
        The dtype of Mean and InvStdDev: 1 (float32), 16 (bfloat16), or 11 (float64, a
        normkernels extension).
    num_outputs : int
        1: Y; 2: (Y, Mean); 3: (Y, Mean, InvStdDev).
    opset : int
        The model's opset; the version used is the highest at or below it (17).
    activation : str, optional
        An epilogue applied to Y in the same pass (a package extension, not an ONNX
        attribute): None (default), "relu", "silu", "gelu_tanh" or "gelu" (PyTorch's
        definitions; the error bound in the user guide's ``docs/guide/epilogues.md``),
        evaluated in float32 (float64 for float64 X) before Y's one rounding to a
        16-bit dtype. Mean and InvStdDev are those of X, unchanged.
    add : ndarray, optional
        A residual of X's shape and dtype (any strides) added to the affine result
        before the activation, in the same pass (a package extension): ``Y =
        act(normalized * Scale + B + add)``. May be ``out``.
    out : ndarray, optional
        Where to write Y (X's shape and dtype); may be X itself.

    Returns
    -------
    Y : ndarray or tuple
        Y, or a tuple with ``Mean`` and ``InvStdDev`` of shape
        ``X.shape[:axis] + (1,) * (X.ndim - axis)`` in the stash type.

    Raises
    ------
    TypeError
        X's dtype not one of the four floats, or Scale or B not of X's dtype.
    ValueError
        ``axis`` out of range, Scale or B not broadcastable to X, rows of zero
        elements, a non-finite epsilon, an unknown ``stash_type``, ``num_outputs`` or
        ``activation``, an opset below 17, or ``out`` not of X's shape and dtype.

    Notes
    -----
    Statistics are float64 by two passes over each row while it is in cache (the
    function body's ``E[x^2] - E[x]^2`` in float32 returns NaN or digits of noise for
    rows like 4e4 + [0, 1, 2, 3]); X is read from memory once. Y is computed in float32
    (float64 for float64 X) and rounded once; for 16-bit X that skips the body's
    rounding of the normalized value to X's type before Scale and B.

    Examples
    --------
    >>> X = np.arange(8, dtype=np.float32).reshape(2, 4)
    >>> Scale, B = np.ones(4, np.float32), np.zeros(4, np.float32)
    >>> Y, Mean, InvStdDev = normkernels.layer_normalization(X, Scale, B, num_outputs=3)
    >>> np.round(Y, 4)
    array([[-1.3416, -0.4472,  0.4472,  1.3416],
           [-1.3416, -0.4472,  0.4472,  1.3416]], dtype=float32)
    >>> Mean.ravel(), np.round(InvStdDev.ravel(), 4)
    (array([1.5, 5.5], dtype=float32), array([0.8944, 0.8944], dtype=float32))
    >>> mu, var = X.mean(-1, keepdims=True), X.var(-1, keepdims=True)
    >>> np.allclose(Y, (X - mu) / np.sqrt(var + 1e-5) * Scale + B)
    True
    """
    return _ln.layer_normalization(X, Scale, B, axis=axis, epsilon=epsilon,
                                   stash_type=stash_type, num_outputs=num_outputs, opset=opset,
                                   activation=activation, add=add, out=out, engine=ENGINE)


def rms_normalization(X, scale, *, axis=-1, epsilon=1e-5, stash_type=1, opset=23,
                      activation=None, add=None, offset=0.0, rounding="once", out=None):
    """ONNX RMSNormalization-23.

    Per row (the axes ``axis, ...``): ``Y = X / sqrt(mean(X**2) + epsilon) * scale``.

    Parameters
    ----------
    X : ndarray
        Any rank >= 1; float16, bfloat16, float32 or float64 (T).
    scale : ndarray
        Any of the four float dtypes (V); broadcasts unidirectionally to X.
    axis : int
        The first normalized axis, in ``[-X.ndim, X.ndim)``; default the last.
    epsilon : float
        Added to the mean square (finite; default 1e-5, the schema's).
    stash_type : int
        1, 10, 11 or 16 (the body's legal values): checked, with no effect on the
        result: the mean square is always accumulated in float64.
    activation : str, optional
        None, "relu", "silu", "gelu_tanh" or "gelu": an epilogue in the same pass, as in
        :func:`layer_normalization` (a package extension).
    add : ndarray, optional
        A residual of X's shape and dtype added before the activation: ``Y =
        act(normalized * scale + add)`` (a package extension).
    offset : float
        Gemma's zero-centred weight (a package extension): ``Y = normalized * (offset +
        scale)``, the sum computed in float32 (float64 when X or scale is float64) as
        Hugging Face's GemmaRMSNorm computes ``1 + weight``; ``offset=1.0`` is Gemma's.
    rounding : {"once", "llama"}
        Where Y is rounded (a package extension). "once" (default): ``normalized *
        scale`` in float32 (float64 for float32 and float64 X), rounded once to V.
        "llama": the normalized value is rounded to V first, then multiplied by scale
        and rounded again, ``round_V(round_V(normalized) * scale)``: Hugging Face's
        LlamaRMSNorm (``weight * hidden.to(input_dtype)``) and vLLM's ``rms_norm``.
        For 16-bit V the two differ in the last bit of about a quarter of the values;
        for float64 they are the same.
    opset : int
        The model's opset; the version used is the highest at or below it (23).
    out : ndarray, optional
        Where to write Y (X's shape, scale's dtype).

    Returns
    -------
    Y : ndarray
        Y of X's shape and scale's dtype (the schema's V). With T != V (which
        onnxruntime rejects) ``normalized * scale`` is computed in the wider dtype and
        rounded once.

    Raises
    ------
    TypeError
        X or scale not of one of the four float dtypes.
    ValueError
        ``axis`` out of range, scale not broadcastable to X, rows of zero elements, a
        non-finite epsilon, an unknown ``stash_type``, ``activation`` or ``rounding``,
        an opset below 23, or ``out`` not of X's shape and scale's dtype.

    Examples
    --------
    >>> X = np.arange(8, dtype=np.float32).reshape(2, 4)
    >>> scale = np.full(4, 2.0, np.float32)
    >>> Y = normkernels.rms_normalization(X, scale)
    >>> np.round(Y, 4)
    array([[0.    , 1.069 , 2.1381, 3.2071],
           [1.4254, 1.7817, 2.1381, 2.4944]], dtype=float32)
    >>> np.allclose(Y, X / np.sqrt((X**2).mean(-1, keepdims=True) + 1e-5) * scale)
    True
    >>> Gemma = normkernels.rms_normalization(X, scale - 1, offset=1.0)  # 1 + weight
    >>> np.allclose(Gemma, Y)
    True
    """
    return _rms.rms_normalization(X, scale, axis=axis, epsilon=epsilon, stash_type=stash_type,
                                  opset=opset, activation=activation, add=add, offset=offset,
                                  rounding=rounding, out=out, engine=ENGINE)


def simplified_layer_normalization(X, scale, *, axis=-1, epsilon=1e-5, stash_type=1,
                                   num_outputs=1, out=None):
    """onnxruntime's SimplifiedLayerNormalization (default domain, version 1): RMS
    normalization as :func:`rms_normalization`, with ``num_outputs=2`` also returning
    ``inv_std_var = 1 / sqrt(mean(X**2) + epsilon)`` of shape ``X.shape[:axis] + (1,
    ...)`` in float32 (``stash_type=1``) or float64 (11).

    Parameters
    ----------
    X : ndarray
        Any rank >= 1; float16, bfloat16, float32 or float64.
    scale : ndarray
        Broadcasts unidirectionally to X; as in :func:`rms_normalization`.
    axis : int
        The first normalized axis, in ``[-X.ndim, X.ndim)``; default the last.
    epsilon : float
        Added to the mean square (finite).
    stash_type : int
        The dtype of ``inv_std_var``: 1 (float32) or 11 (float64).
    num_outputs : int
        1: Y; 2: ``(Y, inv_std_var)``.
    out : ndarray, optional
        Where to write Y.

    Returns
    -------
    Y : ndarray or tuple
        Y (as :func:`rms_normalization` returns it), or ``(Y, inv_std_var)``.

    Raises
    ------
    TypeError
        A dtype other than the four floats.
    ValueError
        ``axis`` out of range, scale not broadcastable to X, a non-finite epsilon, a
        ``stash_type`` other than 1 and 11, ``num_outputs`` not 1 or 2.

    Examples
    --------
    >>> X = np.arange(8, dtype=np.float32).reshape(2, 4)
    >>> Y, inv_std_var = normkernels.simplified_layer_normalization(
    ...     X, np.ones(4, np.float32), num_outputs=2)
    >>> np.round(inv_std_var, 4)
    array([[0.5345],
           [0.1782]], dtype=float32)
    >>> np.allclose(Y, X * inv_std_var)
    True
    """
    return _rms.simplified_layer_normalization(X, scale, axis=axis, epsilon=epsilon,
                                               stash_type=stash_type, num_outputs=num_outputs,
                                               out=out, engine=ENGINE)


def skip_layer_normalization(input, skip, gamma, beta=None, bias=None, *, epsilon=1e-12,
                             num_outputs=1, rounding="once", out=None):
    """onnxruntime's SkipLayerNormalization (com.microsoft): layer normalization over the
    last axis of ``s = input + skip (+ bias)``, fused in one pass.

    Parameters
    ----------
    input : ndarray
        (batch, seq, hidden) or (tokens, hidden); float16, bfloat16, float32 or float64.
    skip : ndarray
        input's shape, or (1, seq, hidden) or (seq, hidden) (repeated over the batch).
    gamma, beta, bias : ndarray
        (hidden,), input's dtype; beta and bias optional (bias is added before the
        normalization).
    epsilon : float
        Added to the variance (finite; default 1e-12, onnxruntime's).
    num_outputs : int
        1 to 4: output, mean, inv_std_var (float32, ``input.shape[:-1] + (1,)``),
        input_skip_bias_sum (``s`` in input's dtype).
    rounding : {"once", "llama"}
        A package extension: "llama" rounds the normalized value to T before gamma
        multiplies it (see :func:`rms_normalization`).
    out : ndarray, optional
        Where to write output; may be ``input``.

    Returns
    -------
    output : ndarray or tuple
        ``output`` (input's shape and dtype), or the first ``num_outputs`` of
        ``(output, mean, inv_std_var, input_skip_bias_sum)``.

    Raises
    ------
    TypeError
        A dtype other than the four floats, or the arrays not of one dtype.
    ValueError
        input not 2-D or 3-D, skip or the (hidden,) parameters of another shape, rows
        of zero elements, a non-finite epsilon, ``num_outputs`` not 1 to 4.

    Notes
    -----
    ``s`` is rounded to input's dtype before it is normalized, so ``output`` is the
    layer normalization of ``input_skip_bias_sum``.

    Examples
    --------
    >>> x = np.arange(8, dtype=np.float32).reshape(2, 4)
    >>> skip = np.ones((2, 4), np.float32)
    >>> gamma, beta = np.ones(4, np.float32), np.zeros(4, np.float32)
    >>> out, mean, inv_std_var, s = normkernels.skip_layer_normalization(
    ...     x, skip, gamma, beta, num_outputs=4)
    >>> s, mean.ravel()
    (array([[1., 2., 3., 4.],
           [5., 6., 7., 8.]], dtype=float32), array([2.5, 6.5], dtype=float32))
    >>> np.array_equal(out, normkernels.layer_normalization(s, gamma, beta, epsilon=1e-12))
    True
    """
    return _skip.skip_layer_normalization(input, skip, gamma, beta, bias, epsilon=epsilon,
                                          num_outputs=num_outputs, rounding=rounding, out=out,
                                          engine=ENGINE)


def skip_simplified_layer_normalization(input, skip, gamma, bias=None, *, epsilon=1e-12,
                                        num_outputs=1, rounding="once", out=None):
    """onnxruntime's SkipSimplifiedLayerNormalization (com.microsoft): RMS normalization
    of ``s = input + skip (+ bias)`` over the last axis, times gamma. Arguments and
    outputs as :func:`skip_layer_normalization` (no beta); the ``mean`` output is zeros,
    as onnxruntime returns it. With ``num_outputs=4`` and ``rounding="llama"`` it is the
    out-of-place form of vLLM's ``fused_add_rms_norm`` (:func:`fused_add_rms_norm`).

    Parameters
    ----------
    input : ndarray
        (batch, seq, hidden) or (tokens, hidden); float16, bfloat16, float32 or float64.
    skip : ndarray
        input's shape, or (1, seq, hidden) or (seq, hidden).
    gamma, bias : ndarray
        (hidden,), input's dtype; bias optional.
    epsilon : float
        Added to the mean square (finite; default 1e-12).
    num_outputs : int
        1 to 4: output, mean (zeros), inv_std_var, input_skip_bias_sum.
    rounding : {"once", "llama"}
        As in :func:`skip_layer_normalization`.
    out : ndarray, optional
        Where to write output; may be ``input``.

    Returns
    -------
    output : ndarray or tuple
        ``output``, or the first ``num_outputs`` of ``(output, mean, inv_std_var,
        input_skip_bias_sum)``.

    Raises
    ------
    TypeError
        A dtype other than the four floats, or the arrays not of one dtype.
    ValueError
        As :func:`skip_layer_normalization`.

    Examples
    --------
    >>> x = np.arange(8, dtype=np.float32).reshape(2, 4)
    >>> skip, gamma = np.ones((2, 4), np.float32), np.ones(4, np.float32)
    >>> out = normkernels.skip_simplified_layer_normalization(x, skip, gamma)
    >>> np.round(out, 4)
    array([[0.3651, 0.7303, 1.0954, 1.4606],
           [0.7581, 0.9097, 1.0613, 1.213 ]], dtype=float32)
    >>> np.allclose(out, normkernels.rms_normalization(x + skip, gamma, epsilon=1e-12))
    True
    """
    return _skip.skip_simplified_layer_normalization(input, skip, gamma, bias,
                                                     epsilon=epsilon, num_outputs=num_outputs,
                                                     rounding=rounding, out=out, engine=ENGINE)

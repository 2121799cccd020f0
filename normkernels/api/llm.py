"""The normalizations of LLM serving: vLLM's fused residual add (in place), Gemma's
zero-centred weight and Llama's rounding (keywords of :func:`rms_normalization`),
the gated RMSNorm of Mamba-2 and Qwen3-Next, per-head QK-norm on a packed qkv, and
normalizations with int8 or float8 outputs (``../shared/specs/llm-normalizations.md``
has the serving stacks' definitions)."""

from normkernels.engine.numba_engine import ENGINE
from normkernels.ops import fused_add as _fused


def fused_add_rms_norm(x, residual, weight, *, epsilon=1e-6, offset=0.0, rounding="llama"):
    """vLLM's ``fused_add_rms_norm(input, residual, weight, epsilon)``: the residual add
    and the RMS normalization of a transformer block's boundary, in place on both.

    Per row (x's last axis): ``z = round_T(x + residual)``; ``residual <- z``; ``x <-
    round_T(round_T(z / sqrt(mean(z**2) + epsilon)) * weight)``.

    Parameters
    ----------
    x : ndarray
        (..., hidden): float16, bfloat16, float32 or float64 (T); written with the
        normalized result. Any strides (rows laid out with a contiguous last axis are
        written in place directly, others through a copy written back).
    residual : ndarray
        x's shape and dtype; written with the sum ``z`` (the residual stream).
    weight : ndarray
        (hidden,), T.
    epsilon : float
        Default 1e-6 (Llama's).
    offset : float
        Gemma's zero-centred weight: multiply by ``offset + weight`` (computed in
        float32; float64 for float64 T); pass ``offset=1.0, rounding="once"`` for
        Gemma's ``GemmaRMSNorm`` with a residual.
    rounding : {"llama", "once"}
        "llama" (default: vLLM's and Hugging Face's LlamaRMSNorm): the normalized value
        is rounded to T before the weight multiplies it; "once": the float32 product is
        rounded once (see :func:`normkernels.rms_normalization`).

    Returns
    -------
    None
        x and residual are written in place.

    Raises
    ------
    TypeError
        A dtype other than the four floats, or the arrays not of one dtype.
    ValueError
        residual not of x's shape, weight not of shape (hidden,), x or residual
        read-only, x and residual sharing memory, an unknown ``rounding``.

    Notes
    -----
    The sum is computed in float32 (float64 for float32 and float64 T) and rounded once,
    which is T's correctly rounded sum; the mean square is accumulated in float64 from
    the rounded sum. One pass over the rows: each block of rows is added, reduced and
    normalized while it is in cache (onnxruntime's SkipSimplifiedLayerNormalization
    kernel, which is the out-of-place form of this function).

    Examples
    --------
    >>> x = np.arange(8, dtype=np.float32).reshape(2, 4)  # a sublayer's output
    >>> residual = np.ones_like(x)                         # the residual stream
    >>> normkernels.fused_add_rms_norm(x, residual, np.ones(4, np.float32))
    >>> residual
    array([[1., 2., 3., 4.],
           [5., 6., 7., 8.]], dtype=float32)
    >>> np.round(x, 4)
    array([[0.3651, 0.7303, 1.0954, 1.4606],
           [0.7581, 0.9097, 1.0613, 1.213 ]], dtype=float32)
    """
    return _fused.fused_add_rms_norm(x, residual, weight, epsilon=epsilon, offset=offset,
                                     rounding=rounding, engine=ENGINE)


def fused_add_layer_norm(x, residual, weight, bias=None, *, epsilon=1e-5, offset=0.0,
                         rounding="once"):
    """The residual add and the layer normalization of a transformer block's boundary,
    in place on both (:func:`fused_add_rms_norm` with LayerNorm).

    Per row (x's last axis): ``z = round_T(x + residual)``; ``residual <- z``; ``x <-
    round_T((z - mean) / sqrt(var + epsilon) * weight + bias)``.

    Parameters
    ----------
    x, residual : ndarray
        (..., hidden), one dtype T (float16, bfloat16, float32, float64); both written.
    weight, bias : ndarray
        (hidden,), T; bias optional.
    epsilon : float
        Default 1e-5 (torch's LayerNorm).
    offset : float
        Multiply by ``offset + weight`` (TransformerEngine's ``zero_centered_gamma``:
        ``offset=1.0``).
    rounding : {"once", "llama"}
        "once" (default): the affine result is rounded once; "llama": the normalized
        value is rounded to T before the weight multiplies it.

    Returns
    -------
    None
        x and residual are written in place.

    Raises
    ------
    TypeError, ValueError
        As :func:`fused_add_rms_norm`; also bias of another shape or dtype.

    Examples
    --------
    >>> x = np.arange(8, dtype=np.float32).reshape(2, 4)
    >>> residual = np.ones_like(x)
    >>> weight, bias = np.ones(4, np.float32), np.zeros(4, np.float32)
    >>> normkernels.fused_add_layer_norm(x, residual, weight, bias)
    >>> np.allclose(x, normkernels.layer_normalization(residual, weight, bias))
    True
    >>> np.round(x, 4)
    array([[-1.3416, -0.4472,  0.4472,  1.3416],
           [-1.3416, -0.4472,  0.4472,  1.3416]], dtype=float32)
    """
    return _fused.fused_add_layer_norm(x, residual, weight, bias, epsilon=epsilon,
                                       offset=offset, rounding=rounding, engine=ENGINE)

"""Normalizations with quantized outputs (int8, float8_e4m3fn): vLLM's fused
``rms_norm_*_quant`` kernels."""

from normkernels.engine.numba_engine import ENGINE
from normkernels.ops import quantized as _q

# The sections the two functions share ({bias}: the layer norm's bias, or nothing),
# after each one's own summary.
_SECTIONS = """
    Parameters
    ----------
    x : ndarray
        (..., hidden), any rank >= 1; float16, bfloat16, float32 or float64; any
        strides (rows that are not contiguous are copied first).
    weight : ndarray
        (hidden,), x's dtype.
{bias}    dtype : numpy.int8 or ml_dtypes.float8_e4m3fn
        The dtype of ``q`` (anything else: TypeError).
    epsilon : float
        Added to the variance (>= 0).
    static_scale : float, optional
        A positive finite scale (rounded to float32) for the whole tensor: ``q =
        quant(y / static_scale)``. None: dynamic scales.
    group_size : int, optional
        Dynamic scales per ``group_size`` contiguous features of a row (a divisor of
        ``hidden``; 128 is typical); None: one scale per row.
    scale_ub : float, optional
        An upper bound of the dynamic scales (positive finite).
    residual : ndarray, optional
        x's shape and dtype, writeable, not overlapping x: the fused add first, **in
        place**: ``residual[...] = round_T(x + residual)`` (the sum in float32, float64
        for float64 x, rounded once to x's dtype), then ``residual`` is normalized (x is
        left untouched). The update happens even when the call then raises for a NaN
        (int8).
    offset : float
        Added to the weight: ``(offset + weight)`` (1.0 for Gemma's ``1 + weight``).

    Returns
    -------
    q : ndarray
        x's shape, ``dtype``.
    scales : ndarray
        float32: static, the scale as a 0-d array; dynamic, shape ``x.shape[:-1] +
        (1,)``, or ``x.shape[:-1] + (hidden // group_size,)``. Dequantize with ``q *
        scales`` (per group).

    Raises
    ------
    TypeError
        x not of the four float dtypes, the parameters not of x's dtype, ``dtype`` not
        int8 or float8_e4m3fn.
    ValueError
        weight (or bias) not of shape (hidden,), ``group_size`` not a positive divisor
        of hidden or given with ``static_scale``, a scale not positive and finite,
        residual sharing memory with x, a NaN quotient with int8.

    Notes
    -----
    Per row: float64 statistics, as the row normalizations compute them (the row is
    read from memory once; user guide, "Row normalizations"), folded into ``m, a, c`` in
    the compute dtype (float32; float64 for float64 x); then ``y = ((x - m) * a + c)
    * (offset + weight) (+ bias)`` in the compute dtype (``offset`` rounded to it
    first, then added to ``weight``), **never rounded to x's dtype**: the quantizer
    reads y directly, as vLLM's kernels do.

    Scales: static, ``s = float32(static_scale)``; dynamic, per row or per group of
    ``group_size`` contiguous features, ``s = float32(max|y| / qmax)`` (qmax: 127 for
    int8, 448 for float8; NaNs in y are ignored by the maximum), then ``s =
    min(s, scale_ub)`` when given and ``s = max(s, floor)`` (float8: ``1 / (448 *
    512)``; int8: float32's epsilon, vLLM's ``min_scaling_factor``).

    The quotient, as vLLM computes it: int8 multiplies by the inverted scale, ``y *
    float32(1 / s)``; float8 divides, ``y / s`` (vLLM: "to match FBGemm"); in the
    compute dtype. Quantization: int8 rounds half to even and saturates to [-128,
    127]; a NaN quotient raises ValueError (int8 has no NaN); float8_e4m3fn saturates
    to +-448 (infinities too) and rounds to nearest even once from the quotient (from
    float64 for float64 x), NaN stays NaN.
    """
_BIAS = """    bias : ndarray, optional
        (hidden,), x's dtype.
"""


def _shared_sections(bias):
    """Appends :data:`_SECTIONS` to the decorated function's docstring."""
    def document(fn):
        fn.__doc__ = (fn.__doc__ or "") + _SECTIONS.replace("{bias}", _BIAS if bias else "")
        return fn

    return document


@_shared_sections(bias=False)
def quantized_rms_normalization(x, weight, *, dtype, epsilon=1e-6, static_scale=None,
                                group_size=None, scale_ub=None, residual=None, offset=0.0):
    """RMS normalization with an int8 or float8_e4m3fn output: vLLM's
    ``rms_norm_static_fp8_quant``, ``rms_norm_dynamic_per_token_quant`` and
    ``rms_norm_per_block_quant`` (with ``residual``: the fused-add forms).

    Per row (the last axis): ``y = x / sqrt(mean(x**2) + epsilon) * (offset +
    weight)``, ``q = quant(y / s)``.

    Examples
    --------
    >>> x = np.arange(8, dtype=np.float32).reshape(2, 4)
    >>> weight = np.ones(4, np.float32)
    >>> q, scales = normkernels.quantized_rms_normalization(x, weight, dtype=np.int8)
    >>> q
    array([[  0,  42,  85, 127],
           [ 73,  91, 109, 127]], dtype=int8)
    >>> y = normkernels.rms_normalization(x, weight, epsilon=1e-6)
    >>> np.allclose(q * scales, y, atol=scales.max() / 2)  # within half a step
    True
    """
    return _q.quantized_rms_normalization(x, weight, dtype=dtype, epsilon=epsilon,
                                          static_scale=static_scale, group_size=group_size,
                                          scale_ub=scale_ub, residual=residual, offset=offset,
                                          engine=ENGINE)


@_shared_sections(bias=True)
def quantized_layer_normalization(x, weight, bias=None, *, dtype, epsilon=1e-6,
                                  static_scale=None, group_size=None, scale_ub=None,
                                  residual=None, offset=0.0):
    """Layer normalization with an int8 or float8_e4m3fn output (the layer-norm
    counterpart of vLLM's fused RMS-norm quant kernels).

    Per row (the last axis): ``y = (x - mean) / sqrt(var + epsilon) * (offset +
    weight) + bias`` (population variance), ``q = quant(y / s)``.

    Examples
    --------
    >>> x = np.arange(8, dtype=np.float32).reshape(2, 4)
    >>> weight = np.ones(4, np.float32)
    >>> q, scale = normkernels.quantized_layer_normalization(x, weight, dtype=np.int8,
    ...                                                      static_scale=0.05)
    >>> q, scale
    (array([[-27,  -9,   9,  27],
           [-27,  -9,   9,  27]], dtype=int8), array(0.05, dtype=float32))
    """
    return _q.quantized_layer_normalization(x, weight, bias, dtype=dtype, epsilon=epsilon,
                                            static_scale=static_scale, group_size=group_size,
                                            scale_ub=scale_ub, residual=residual,
                                            offset=offset, engine=ENGINE)

"""The gated RMSNorm (Mamba-2, Qwen3-Next) and per-head QK-norm on a packed qkv."""

from normkernels.engine.numba_engine import ENGINE
from normkernels.ops import gated as _gated
from normkernels.ops import qk_norm as _qk


def gated_rms_normalization(x, gate, weight, bias=None, *, epsilon=1e-6, group_size=None,
                            norm_before_gate=True, out=None):
    """Gated RMSNorm: mamba_ssm's ``rmsnorm_fn`` / ``RMSNormGated`` (Mamba-2, Qwen3-Next's
    linear-attention output norm).

    Over the last axis in groups of ``group_size`` contiguous features, with ``x_hat(v)
    = v / sqrt(mean(v**2) + epsilon)`` per group and ``silu(z) = z * sigmoid(z)``:

    * ``norm_before_gate=True``: ``y = (x_hat(x) * weight + bias) * silu(gate)``;
    * ``norm_before_gate=False``: ``y = x_hat(x * silu(gate)) * weight + bias``.

    Parameters
    ----------
    x : ndarray
        ``(..., hidden)``, rank >= 1; float16, bfloat16 (``ml_dtypes.bfloat16``),
        float32 or float64. Rows are read in place when their last axis is contiguous
        (any row stride), else copied.
    gate : ndarray
        The gate ``z``: x's shape and dtype.
    weight : ndarray
        ``(hidden,)``, x's dtype.
    bias : ndarray, optional
        ``(hidden,)``, x's dtype; None: no bias.
    epsilon : float
        Added to each group's mean square (finite).
    group_size : int, optional
        A positive divisor of ``hidden``: each contiguous group of that many features is
        normalized on its own (mamba_ssm's ``ngroups = hidden / group_size``). None: the
        whole row.
    norm_before_gate : bool
        Whether the gate multiplies the normalized result (True, mamba_ssm's default) or
        the input before the statistics (False, Mamba-2's ``RMSNormGated``).
    out : ndarray, optional
        Where to write Y (x's shape and dtype); may be x or gate itself.

    Returns
    -------
    ndarray
        Y of x's shape and dtype (``out`` when given).

    Raises
    ------
    TypeError
        A dtype other than the four floats, gate, weight or bias not of x's dtype.
    ValueError
        gate not of x's shape, weight or bias not of shape (hidden,), ``group_size``
        not a positive divisor of hidden, a non-finite epsilon.

    Notes
    -----
    The mean square is accumulated in float64; ``1 / sqrt(ms + epsilon)`` is rounded
    once to the compute dtype, float32 (float64 for float64 x), in which the rest is
    computed; Y is rounded once to x's dtype. ``x * silu(gate)`` is *not* rounded to
    x's dtype before its statistics: mamba_ssm's Triton kernel keeps it in float32
    (``x *= z * tl.sigmoid(z)`` on the float32 load), and so does this function.
    Hugging Face's ``Qwen3NextRMSNormGated`` rounds ``x_hat`` to the input dtype before
    the weight (Llama rounding) and differs in the last bit for 16-bit x. SiLU is the
    package's (the one of the ``activation="silu"`` epilogues, the same bits on every
    CPU, within a few float32 units of roundoff of ``z * sigmoid(z)``).

    Examples
    --------
    >>> x = np.arange(8, dtype=np.float32).reshape(2, 4)
    >>> gate, weight = np.full_like(x, 2.0), np.ones(4, np.float32)
    >>> y = normkernels.gated_rms_normalization(x, gate, weight)
    >>> silu = gate / (1 + np.exp(-gate))
    >>> np.allclose(y, x / np.sqrt((x**2).mean(-1, keepdims=True) + 1e-6) * weight * silu)
    True
    >>> y = normkernels.gated_rms_normalization(x, gate, weight, group_size=2)
    >>> xg = x.reshape(2, 2, 2)  # two groups of two features per row
    >>> np.allclose(y, (xg / np.sqrt((xg**2).mean(-1, keepdims=True) + 1e-6)).reshape(2, 4)
    ...             * weight * silu)
    True
    """
    return _gated.gated_rms_normalization(x, gate, weight, bias, epsilon=epsilon,
                                          group_size=group_size,
                                          norm_before_gate=norm_before_gate, out=out,
                                          engine=ENGINE)


def gated_rms_normalization_backward(dY, x, gate, weight, bias=None, *, epsilon=1e-6,
                                     group_size=None, norm_before_gate=True):
    """The gradient of :func:`gated_rms_normalization`.

    Parameters
    ----------
    dY : ndarray
        The gradient reaching Y: x's shape and dtype.
    x, gate, weight, bias, epsilon, group_size, norm_before_gate
        As given to the forward call (the statistics are recomputed from them).

    Returns
    -------
    tuple
        ``(dx, dgate, dweight)``, or ``(dx, dgate, dweight, dbias)`` when ``bias`` is
        given. dx and dgate have x's shape and dtype; dweight and dbias shape
        ``(hidden,)`` and weight's dtype, as torch autograd of the composite returns
        them (and mamba_ssm's ``_layer_norm_bwd``, ``dw.to(weight.dtype)``).

    Raises
    ------
    TypeError, ValueError
        As :func:`gated_rms_normalization`; also dY not of x's shape and dtype.

    Notes
    -----
    Computed in float64 throughout (statistics, SiLU and its derivative ``s (1 + z
    (1 - s))``, the group's ``sum(x_hat * g)``), each result rounded once: with ``h``
    the normalized value, ``g = d * weight`` and ``rs = 1 / sqrt(ms + epsilon)``,
    ``dx = rs (g - h mean(h g))`` per group, where ``d = dY * silu(gate)`` when the norm
    comes before the gate (``dgate = dY (h weight + bias) silu'(gate)``) and ``d = dY``
    otherwise (then the ``dx`` above is the gradient of ``x * silu(gate)``, which gives
    ``dx * silu(gate)`` and ``dgate = dx * x * silu'(gate)``). ``dweight = sum(d * h)``
    and ``dbias = sum(d)`` over all rows, in float64, in an order fixed by the shape
    (blocks of rows, then the blocks in order): the same bits for any thread count.

    Examples
    --------
    >>> x = np.arange(8, dtype=np.float32).reshape(2, 4)
    >>> gate, weight = np.full_like(x, 2.0), np.ones(4, np.float32)
    >>> dY = np.ones_like(x)
    >>> dx, dgate, dweight = normkernels.gated_rms_normalization_backward(dY, x, gate, weight)
    >>> h = x / np.sqrt((x**2).mean(-1, keepdims=True) + 1e-6)
    >>> silu = gate / (1 + np.exp(-gate))
    >>> np.allclose(dweight, (dY * silu * h).sum(axis=0))
    True
    """
    return _gated.gated_rms_normalization_backward(dY, x, gate, weight, bias, epsilon=epsilon,
                                                   group_size=group_size,
                                                   norm_before_gate=norm_before_gate,
                                                   engine=ENGINE)


def qk_rms_normalization(qkv, q_weight, k_weight, *, num_q_heads, num_kv_heads, head_dim,
                         epsilon=1e-6, rounding="once"):
    """Per-head RMSNorm of the q and k heads of a packed qkv, in place (Qwen3's
    ``q_norm`` and ``k_norm``, OLMo-2 per head, Gemma-3 before RoPE).

    Each head of ``head_dim`` features is normalized over ``head_dim``: ``x_hat = x /
    sqrt(mean(x**2) + epsilon)``, then multiplied by ``q_weight`` (q heads) or
    ``k_weight`` (k heads); the v heads are neither read nor written.

    Parameters
    ----------
    qkv : ndarray
        ``(..., (num_q_heads + 2 * num_kv_heads) * head_dim)``: per token, the q heads,
        then the k heads, then the v heads. float16, bfloat16, float32 or float64;
        writeable; its last axis contiguous and its leading axes mergeable into one axis
        of rows without a copy (a row-strided view of a larger buffer is fine), since
        the result is written into it.
    q_weight, k_weight : ndarray
        ``(head_dim,)``, qkv's dtype.
    num_q_heads, num_kv_heads, head_dim : int
        Positive; there are as many v heads as k heads.
    epsilon : float
        Added to each head's mean square.
    rounding : {"once", "llama"}
        "once" (the package's rule): ``round_T(x_hat * w)`` computed in float32 (float64
        for float64 qkv). "llama": ``round_T(round_T(x_hat) * w)``, Hugging Face's
        ``Qwen3RMSNorm`` (``self.weight * hidden_states.to(input_dtype)``); the two
        differ in the last bit for 16-bit qkv only.

    Returns
    -------
    ndarray
        ``qkv`` itself, normalized in place (no copy is made).

    Raises
    ------
    ValueError
        qkv read-only, its last axis not contiguous or its leading axes not mergeable,
        its last axis not ``(nq + 2 nkv) * head_dim``, a weight not ``(head_dim,)``, a
        non-positive count.
    TypeError
        A dtype other than the four floats, the weights not of qkv's dtype, a
        non-integer count, qkv not an ndarray.

    Notes
    -----
    The mean square of a head is accumulated in float64 and ``1 / sqrt(ms +
    epsilon)`` rounded once to the compute dtype.

    Examples
    --------
    >>> qkv = np.arange(24, dtype=np.float32).reshape(2, 12)  # 2 tokens: q, k, v of 4
    >>> w = np.ones(4, np.float32)
    >>> out = normkernels.qk_rms_normalization(qkv, w, w, num_q_heads=1, num_kv_heads=1,
    ...                                        head_dim=4)
    >>> out is qkv
    True
    >>> np.round(qkv[0, :4], 4)  # token 0's q head, normalized
    array([0.    , 0.5345, 1.069 , 1.6036], dtype=float32)
    >>> qkv[0, 8:]  # its v head, untouched
    array([ 8.,  9., 10., 11.], dtype=float32)
    """
    return _qk.qk_rms_normalization(qkv, q_weight, k_weight, num_q_heads=num_q_heads,
                                    num_kv_heads=num_kv_heads, head_dim=head_dim,
                                    epsilon=epsilon, rounding=rounding, engine=ENGINE)

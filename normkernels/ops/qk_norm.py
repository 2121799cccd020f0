"""Per-head RMSNorm of q and k in a packed qkv, in place (spec layer): Qwen3's q_norm
and k_norm (``Qwen3RMSNorm`` over head_dim), applied to the q and k heads of a fused
qkv projection's output before RoPE; v untouched.

qkv: ``(..., (nq + 2 nkv) * head_dim)``, q heads first, then k, then v. Per head,
``x_hat = x / sqrt(mean(x**2) + epsilon)`` (float64 statistics), then:

* ``rounding="once"`` (the package's default): ``round_T(x_hat * w)`` in float32
  (float64 for float64 qkv);
* ``rounding="llama"`` (Hugging Face's ``Qwen3RMSNorm``, ``weight *
  hidden_states.to(input_dtype)``): ``round_T(round_T(x_hat) * w)``.

The two agree for float32 and float64 (rounding to T is then the identity).
"""

import numpy as np

from normkernels.ops import common
from normkernels.ops.common import ALL_FLOATS

OP = "qk_rms_normalization"
ROUNDINGS = ("once", "llama")


def _positive_int(label, name, value):
    if not common.is_integer(value):
        raise TypeError(f"{label}: {name} must be an integer, got {type(value).__name__} "
                        f"{value!r}")
    if value < 1:
        raise ValueError(f"{label}: {name} must be a positive integer, got {value}")
    return int(value)


def _rows_in_place(label, qkv):
    """``qkv`` as ``M x W`` rows over its own memory (never a copy)."""
    W = qkv.shape[-1]
    if W > 1 and qkv.strides[-1] != qkv.itemsize:
        raise ValueError(f"{label}: qkv's last axis must be contiguous (stride "
                         f"{qkv.itemsize} bytes, got {qkv.strides[-1]}): it is normalized "
                         "in place")
    rows = qkv.view()
    try:
        rows.shape = (-1, W)
    except AttributeError:
        raise ValueError(f"{label}: qkv's leading axes of shape {qkv.shape[:-1]} and strides "
                         f"{qkv.strides[:-1]} do not merge into one axis of rows without a "
                         "copy; it is normalized in place") from None
    return rows


def qk_rms_normalization(qkv, q_weight, k_weight, *, num_q_heads, num_kv_heads, head_dim,
                         epsilon=1e-6, rounding="once", engine, path=None):
    """Spec layer of :func:`normkernels.qk_rms_normalization`."""
    label = OP
    if not isinstance(qkv, np.ndarray):
        raise TypeError(f"{label}: qkv must be an ndarray (it is normalized in place), got "
                        f"{type(qkv).__name__}")
    common.check_dtype(label, "qkv", qkv, ALL_FLOATS)
    weights = {"q_weight": common.as_array("q_weight", q_weight),
               "k_weight": common.as_array("k_weight", k_weight)}
    for name, w in weights.items():
        common.check_dtype(label, name, w, ALL_FLOATS)
        if w.dtype != qkv.dtype:
            raise TypeError(f"{label}: {name} must have qkv's dtype ({qkv.dtype}), got "
                            f"{w.dtype}")
    nq = _positive_int(label, "num_q_heads", num_q_heads)
    nkv = _positive_int(label, "num_kv_heads", num_kv_heads)
    D = _positive_int(label, "head_dim", head_dim)
    eps = common.check_epsilon(label, epsilon)
    if rounding not in ROUNDINGS:
        raise ValueError(f"{label}: rounding must be one of {', '.join(ROUNDINGS)}, got "
                         f"{rounding!r}")
    if not qkv.dtype.isnative:
        raise TypeError(f"{label}: qkv has non-native byte order; it is normalized in place "
                        f"(convert with .astype({qkv.dtype.newbyteorder('=').name!r}))")
    if qkv.ndim < 1:
        raise ValueError(f"{label}: qkv must have rank >= 1, got a 0-d array")
    W = (nq + 2 * nkv) * D
    if qkv.shape[-1] != W:
        raise ValueError(f"{label}: qkv's last axis must be (num_q_heads + 2 * num_kv_heads) "
                         f"* head_dim = ({nq} + 2 * {nkv}) * {D} = {W}, got {qkv.shape[-1]}")
    for name, w in weights.items():
        if w.shape != (D,):
            raise ValueError(f"{label}: {name} must have shape ({D},) (head_dim), got "
                             f"{w.shape}")
    if not qkv.flags.writeable:
        raise ValueError(f"{label}: qkv is read-only; it is normalized in place")
    rows = _rows_in_place(label, qkv)
    if rows.size:
        engine.qk_rms(rows, weights["q_weight"], weights["k_weight"], nq, nkv, eps,
                      rounding == "llama", path)
    return qkv

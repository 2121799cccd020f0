"""The row normalizations' rules in NumPy, for :mod:`normkernels.reference`:
onnxruntime's skip add (:func:`skip_sums`), the fold of a row's statistics
(:func:`fold_rows`, the rule of :func:`normkernels.kernels.rows.fold_row`) and the
normalize pass with its epilogue (:func:`normalize_rows_from`), bit for bit the row
kernels' arithmetic up to the activation (the twin's own, NumPy's ``exp``).
"""

import numpy as np

from normkernels.dtypes import FLOAT32, FLOAT64, compute_dtype, row_compute_dtype
from normkernels.reference.fused import activation


def skip_sums(x, skip, bias):
    """onnxruntime's skip add: ``(x + skip) + bias`` per row (skip rows repeating over
    x's rows) in the row compute dtype, rounded once to x's dtype."""
    cd = row_compute_dtype(x.dtype)
    with np.errstate(all="ignore"):
        total = (x.astype(cd).reshape(-1, *skip.shape) + skip.astype(cd)).reshape(x.shape)
        if bias is not None:
            total = total + bias.astype(cd)
        return total.astype(x.dtype)


def normalize_rows_from(x, y, scale, B, epsilon, centered, mean, var, act=None, res=None,
                        rounding="once"):
    """Y of a row normalization from the per-row float64 ``mean`` and ``var`` (the
    mean square when not centred): the kernels' arithmetic, bit for bit. The epilogue:
    the residual ``res`` (x's shape and dtype; None: none) added in the row compute
    dtype, then the activation ``act`` in the activations' compute dtype (the value
    rounded to float32 first for float32 x), the twin's own (NumPy's ``exp``).
    ``rounding="llama"`` rounds the normalized value to y's dtype before the scale."""
    if x.dtype == np.float32 and float32_lanes():
        y[...] = float32_rows(x, scale, B, epsilon, centered, mean, var, act, res, rounding)
        return
    m, a, c = fold_rows(mean, var, epsilon, centered, x.dtype)
    cd = m.dtype
    b = np.full(x.shape[1], -0.0, cd) if B is None else B.astype(cd)
    with np.errstate(all="ignore"):
        normalized = (x.astype(cd) - m[:, None]) * a[:, None] + c[:, None]
        if rounding == "llama":
            normalized = normalized.astype(y.dtype).astype(cd)
        result = normalized * scale.astype(cd) + b
        if res is not None:
            result = result + res.astype(cd)
        if (getattr(act, "kind", act) or "none") != "none":
            result = activation(act, result.astype(compute_dtype(y.dtype)))
        y[...] = result.astype(y.dtype)


def fold_rows(mean, var, epsilon, centered, dtype):
    """Per-row ``(m, a, c)`` in the row compute dtype of ``dtype`` (float32 for 16-bit
    X, else float64: :func:`normkernels.dtypes.row_compute_dtype`) such that
    ``(x - m) * a + c`` is ``(x - mean) / sqrt(var + epsilon)``: the rule the row
    kernels follow (:func:`normkernels.kernels.rows.fold_row`). ``a`` is computed in
    float64 and rounded once; ``m`` is the mean rounded to the compute dtype and ``c``
    the residual ``-(mean - m) * a`` (float32 compute; zero where ``m`` is not finite),
    or ``-0.0``, which adds nothing, not even to a negative zero. Not ``centered``
    (RMS): ``m = 0`` and ``c = -0.0``: ``x * a`` exactly. Float32 rows on FMA targets
    take the float64 values and split them (:func:`float32_rows`)."""
    cd = row_compute_dtype(dtype)
    with np.errstate(all="ignore"):
        inv = 1.0 / np.sqrt(var + epsilon)
        a = inv.astype(cd)
        if not centered:
            return np.zeros(mean.size, cd), a, np.full(mean.size, -0.0, cd)
        m = mean.astype(cd)
        if cd == FLOAT64:
            return m, a, np.full(mean.size, -0.0, cd)
        c = np.where(np.isfinite(m), -((mean - m.astype(FLOAT64)) * inv), -0.0)
        return m, a, c.astype(cd)


def float32_lanes():
    """True when the JIT target normalizes float32 rows in float32 lanes (it has FMA;
    :func:`normkernels.kernels.row_vectors.float32_lanes`)."""
    from normkernels.kernels.target import jit_target  # the target only when asked

    return jit_target().fma


def fma32(a, b, c):
    """``a * b + c`` of float32 arrays rounded once to float32, as ``llvm.fma``: the
    product is exact in float64, the sum is rounded to odd in float64 (round to
    nearest, then the last bit set toward the exact sum where it was inexact), and
    that rounds to float32 correctly (53 >= 2 * 24 + 2 bits; Boldo and Melquiond)."""
    a, b, c = (np.asarray(v, FLOAT32).astype(FLOAT64) for v in (a, b, c))
    with np.errstate(all="ignore"):
        p = a * b
        s = p + c
        bb = s - p
        e = (p - (s - bb)) + (c - bb)  # s + e = p + c exactly (TwoSum)
        bits = s.view(np.int64)
        inexact = (e != 0) & np.isfinite(s) & ((bits & 1) == 0)
        toward = np.where((e > 0) == (s > 0), 1, -1)  # magnitude up or down
        s = np.where(inexact, (bits + toward).view(FLOAT64), s)
        return s.astype(FLOAT32)


def float32_rows(x, scale, B, epsilon, centered, mean, var, act=None, res=None,
                   rounding="once"):
    """:func:`normalize_rows_from` for float32 rows on FMA targets
    (:mod:`normkernels.kernels.row_vectors`): where a row is well scaled (``|m|`` and
    ``1 / a`` below ``LANES_LIMIT``, ``a`` too), float32 lanes: the fold's float64
    ``mean`` and ``a`` split into float32 ``m``, ``a_hi + a_lo`` and the mean's residual
    ``c``, ``n = fma(x - m, a_hi, fma(x - m, a_lo, c))``, ``fma(n, scale, B)``, the
    residual added in float32; elsewhere float64 and one rounding. ``scale``, ``B`` and
    ``res`` broadcast against the rows."""
    from normkernels.kernels.row_vectors import LANES_LIMIT

    m64, a64, _ = fold_rows(mean, var, epsilon, centered, FLOAT64)
    with np.errstate(all="ignore"):
        m = m64.astype(FLOAT32)
        a_hi = a64.astype(FLOAT32)
        a_lo = (a64 - a_hi.astype(FLOAT64)).astype(FLOAT32)
        rest = m64 - m.astype(FLOAT64)
        c = np.where(np.isnan(rest), -0.0, (-0.0 - rest) * a64).astype(FLOAT32)
        t = x.astype(FLOAT32) - m[:, None]
        n = fma32(t, a_hi[:, None], fma32(t, a_lo[:, None], c[:, None]))
        b = np.full(x.shape[1], -0.0, FLOAT32) if B is None else B.astype(FLOAT32)
        result = fma32(n, scale.astype(FLOAT32), b)
        if res is not None:
            result = result + res.astype(FLOAT32)
        ok = (np.abs(m64) < LANES_LIMIT) & (a64 < LANES_LIMIT) & (a64 > 1 / LANES_LIMIT)
        if not ok.all():  # float64 lanes, one rounding
            wide = (x.astype(FLOAT64) - m64[:, None]) * a64[:, None]
            if rounding == "llama":
                wide = wide.astype(FLOAT32).astype(FLOAT64)
            wide = wide * scale.astype(FLOAT64) + b.astype(FLOAT64)
            if res is not None:
                wide = wide + res.astype(FLOAT64)
            result = np.where(ok[:, None], result, wide.astype(FLOAT32))
        if (getattr(act, "kind", act) or "none") != "none":
            result = activation(act, result)
        return result

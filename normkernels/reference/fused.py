"""The fused operators' twins in NumPy, for :mod:`normkernels.reference`: the
activation epilogues (:func:`activation`, from the definitions with NumPy's ``exp``,
not the kernels' polynomial: an independent evaluation) and SkipGroupNorm's skip add
(:func:`skip_sums_rows`, the rule of :func:`normkernels.kernels.skip_sums.skip_sums`)
and the gated residual of ``ada_layer_norm`` (:func:`gated_sums_rows`).
"""

import math

import numpy as np

from normkernels.dtypes import row_compute_dtype

_erfc = np.vectorize(math.erfc, otypes=[np.float64])


def activation(act, y):
    """The activation epilogue ``act`` (a name or marker, or None) of ``y`` in its
    dtype, with NumPy's ``exp`` and ``math.erfc`` (the twin is an independent
    evaluation)."""
    kind = getattr(act, "kind", act) or "none"
    if kind == "none":
        return y
    with np.errstate(all="ignore"):
        if kind == "relu":
            return np.where(y < 0, y.dtype.type(0), y)
        if kind == "gelu":  # y erfc(-y / sqrt 2) / 2 in float64 (no cancellation below 0;
            # float64 y's tail carries x's rounding, ~y^2 units), rounded to y's dtype
            y64 = y.astype(np.float64)
            return (y64 * (_erfc(y64 * -np.sqrt(0.5)) / 2)).astype(y.dtype)
        z = y if kind == "silu" else 2 * np.sqrt(2 / np.pi, dtype=y.dtype) * (
            y + y.dtype.type(0.044715) * (y * y * y))
        e = np.exp(-np.abs(z))
        return y * (np.where(z >= 0, y.dtype.type(1), e) / (1 + e))


def skip_sums_rows(x, skip, bias, dest, K, rows_per_skip, skip_rows, per_column, C):
    """:meth:`normkernels.engine.Engine.skip_sums` in NumPy."""
    cd = row_compute_dtype(x.dtype)
    M = x.size // K
    unit = np.arange(M) // rows_per_skip
    with np.errstate(all="ignore"):
        s = (skip.reshape(-1, K).astype(cd)[unit] if skip_rows
             else skip.astype(cd)[unit][:, None])
        total = x.reshape(M, K).astype(cd) + s
        if bias is not None:
            total = total + (bias.astype(cd)[None, :] if per_column
                             else bias.astype(cd)[np.arange(M) % C][:, None])
        dest.reshape(M, K)[...] = total.astype(dest.dtype)


def gated_sums_rows(x, residual, gate, dest, K, rows_per_gate):
    """:meth:`normkernels.engine.Engine.gated_sums` in NumPy."""
    cd = row_compute_dtype(x.dtype)
    M = x.size // K
    g = np.asarray(gate, cd).reshape(-1, K)[np.arange(M) // rows_per_gate]
    with np.errstate(all="ignore"):
        total = residual.reshape(M, K).astype(cd) + g * x.reshape(M, K).astype(cd)
        dest.reshape(M, K)[...] = total.astype(dest.dtype)


class EpilogueGradients:
    """The epilogue backward passes of :class:`normkernels.reference.NumPyEngine` (the
    rules of :mod:`normkernels.kernels.activation_grad`, with NumPy's ``exp``)."""

    def activation_grad(self, z, dy, dz, act, path=None):
        kind = getattr(act, "kind", act)
        cd = z.dtype
        with np.errstate(all="ignore"):
            if kind == "silu":
                s = sigmoid(z)
                slope = s * (1 + z * (1 - s))
            elif kind == "gelu_tanh":
                a, b = cd.type(2 * np.sqrt(2 / np.pi)), cd.type(0.044715)
                s = sigmoid(a * (z + b * (z * z * z)))
                slope = s + z * (s * (1 - s)) * (a * (1 + 3 * b * (z * z)))
            elif kind == "gelu":
                z64 = z.astype(np.float64)
                cdf = 0.5 * _erfc(-z64 / np.sqrt(2.0))
                slope = (cdf + z64 * np.exp(-0.5 * z64 * z64) / np.sqrt(2 * np.pi)).astype(cd)
            else:
                raise ValueError(f"no derivative for activation {kind!r}")
            dz.reshape(-1)[...] = (dy.reshape(-1).astype(cd) * slope.reshape(-1)).astype(cd)

    def gated_backward(self, dln, ds, x, gate, dres, dx, K, rows_per_gate, path=None):
        cd, M = dln.dtype, x.size // K
        with np.errstate(all="ignore"):
            total = dln.reshape(M, K)
            if ds is not None:
                total = total + ds.reshape(M, K).astype(cd)
            g = np.asarray(gate, cd).reshape(-1, K)[np.arange(M) // rows_per_gate]
            dres.reshape(M, K)[...] = total.astype(dres.dtype)
            dx.reshape(M, K)[...] = (g * total).astype(dx.dtype)
            products = total.astype(np.float64) * x.reshape(M, K).astype(np.float64)
        return products.reshape(-1, rows_per_gate, K).sum(axis=1).reshape(-1)

    def relu_mask(self, y, dy, dz, path=None):
        with np.errstate(invalid="ignore"):
            mask = y.reshape(-1).astype(np.float64) > 0  # exact for every float dtype
        dz.reshape(-1)[...] = np.where(mask, dy.reshape(-1), dy.dtype.type(0))


def sigmoid(z):
    """``1 / (1 + exp(-z))`` without overflow, in z's dtype."""
    e = np.exp(-np.abs(z))
    return np.where(z >= 0, z.dtype.type(1), e) / (1 + e)

"""The NumPy twins of the gated RMSNorm's and QK-norm's engine methods (a mixin of
:class:`normkernels.reference.NumPyEngine`).

Bit for bit the kernels' arithmetic (:mod:`normkernels.kernels.gated`,
:mod:`normkernels.kernels.qk_norm`) after the statistics, SiLU and sigmoid included:
:func:`sigmoid` evaluates the kernels' own sigmoid (Cody-Waite reduction, Cephes'
polynomial, the exponent-bit scaling of :mod:`normkernels.kernels.activations`) with
NumPy's IEEE operations, which round exactly as the kernels' (no FMA in either). The
statistics are the twin's own (float64 sums of squares by NumPy), within the
statistics' accuracy of the kernels'; given the kernels' mean squares (``var=``) the
results are the kernels' bits (tests/test_gated.py checks both).
"""

import math

import numpy as np

from normkernels.dtypes import FLOAT64, compute_dtype, round_once

# float32: Cephes expf; float64: Cephes exp (Pade form): the kernels' constants
_F32_EXP = dict(low=-104.0, magic=12582912.0, ln2_hi=0.693359375, ln2_lo=-2.12194440e-4,
                poly=(1.9875691500e-4, 1.3981999507e-3, 8.3334519073e-3, 4.1665795894e-2,
                      1.6666665459e-1, 5.0000001201e-1), bias=127, mantissa=23)
_F64_EXP = dict(low=-746.0, magic=6755399441055744.0, ln2_hi=6.93145751953125e-1,
                ln2_lo=1.42860682030941723212e-6,
                p=(1.26177193074810590878e-4, 3.02994407707441961300e-2,
                   9.99999999999999999910e-1),
                q=(3.00198505138664455042e-6, 2.52448340349684104192e-3,
                   2.27265548208155028766e-1, 2.00000000000000000009e0),
                bias=1023, mantissa=52)


def _horner(x, coefficients):
    t = x.dtype.type
    acc = np.full_like(x, t(coefficients[0]))
    for c in coefficients[1:]:
        acc = acc * x + t(c)
    return acc


def _exp_nonpositive(t):
    """The kernels' ``exp(t)`` for ``t <= 0`` (float32 or float64 arrays)."""
    double = t.dtype == FLOAT64
    k_ = _F64_EXP if double else _F32_EXP
    f = t.dtype.type
    u = np.where(t < f(k_["low"]), f(k_["low"]), np.where(t == t, t, f(0.0)))
    magic = f(k_["magic"])
    k = (u * f(1.0 / math.log(2.0)) + magic) - magic
    r = (u - k * f(k_["ln2_hi"])) - k * f(k_["ln2_lo"])
    rr = r * r
    if double:
        px = r * _horner(rr, k_["p"])
        qx = _horner(rr, k_["q"])
        e = f(1.0) + f(2.0) * (px / (qx - px))
    else:
        e = (_horner(r, k_["poly"]) * rr + r) + f(1.0)
    ints = np.int64 if double else np.int32
    ki = k.astype(ints)
    k1 = ki >> 1
    k2 = ki - k1
    shift, bias = ints(k_["mantissa"]), ints(k_["bias"])
    f1 = ((k1 + bias) << shift).view(t.dtype)
    f2 = ((k2 + bias) << shift).view(t.dtype)
    return (e * f1) * f2


def sigmoid(z):
    """The kernels' sigmoid of ``z`` (a float32 or float64 array), bit for bit."""
    z = np.asarray(z)
    f = z.dtype.type
    with np.errstate(all="ignore"):
        e = _exp_nonpositive(np.where(z > 0, f(0.0) - z, z))
        return np.where(z >= 0, f(1.0), e) / (f(1.0) + e)


def silu(z):
    """The kernels' SiLU, ``z * sigmoid(z)``."""
    with np.errstate(all="ignore"):
        return z * sigmoid(z)


def _mean_squares(u, G):
    """Float64 mean square of each group of ``G`` (rows of ``u``, row-major)."""
    u64 = u.astype(FLOAT64).reshape(-1, G)
    with np.errstate(all="ignore"):
        return np.einsum("ij,ij->i", u64, u64) / G


def _inverse(var, epsilon, dtype):
    with np.errstate(all="ignore"):
        return (1.0 / np.sqrt(var + epsilon)).astype(dtype)


class GatedTwins:
    def gated_rms(self, x, z, y, weight, bias, G, epsilon, before, path=None, var=None):
        M, K = x.shape
        cd = compute_dtype(x.dtype)
        w = weight.astype(cd)
        b = np.full(K, -0.0, cd) if bias is None else bias.astype(cd)
        xc, zc = x.astype(cd), z.astype(cd)
        with np.errstate(all="ignore"):
            u = xc if before else xc * silu(zc)
            if var is None:
                var = _mean_squares(u, G)
            a = np.repeat(_inverse(var, epsilon, cd).reshape(M, K // G), G, axis=1)
            v = (u * a) * w + b
            if before:
                v = v * silu(zc)
            y[...] = v.astype(y.dtype)
        return var

    def gated_rms_backward(self, dy, x, z, weight, bias, G, epsilon, before, dx, dz,
                           path=None, var=None):
        M, K = x.shape
        w = weight.astype(FLOAT64)
        b = np.full(K, -0.0) if bias is None else bias.astype(FLOAT64)
        x64, z64, d = x.astype(FLOAT64), z.astype(FLOAT64), dy.astype(FLOAT64)
        with np.errstate(all="ignore"):
            s = sigmoid(z64)
            slope = s * (1.0 + z64 * (1.0 - s))
            u = x64 if before else x64 * (z64 * s)
            if var is None:
                var = _mean_squares(u, G)
            rs = np.repeat((1.0 / np.sqrt(var + epsilon)).reshape(M, K // G), G, axis=1)
            h = u * rs
            if before:
                dz[...] = round_once((d * (h * w + b)) * slope, dz.dtype)
                d = d * (z64 * s)
            g = d * w
            c = np.cumsum((h * g).reshape(-1, G), axis=1)[:, -1] / G
            du = (g - h * np.repeat(c.reshape(M, K // G), G, axis=1)) * rs
            if before:
                dx[...] = round_once(du, dx.dtype)
            else:
                dz[...] = round_once((du * x64) * slope, dz.dtype)
                dx[...] = round_once(du * (z64 * s), dx.dtype)
            dw, db = _row_sums(d * h, rows_per_item(K)), _row_sums(d, rows_per_item(K))
        return dw, db, var

    def qk_rms(self, qkv, q_weight, k_weight, nq, nk, epsilon, llama, path=None, var=None):
        M = qkv.shape[0]
        D = q_weight.size
        cd = compute_dtype(qkv.dtype)
        heads = qkv[:, :(nq + nk) * D].reshape(M, nq + nk, D)  # a view (rows contiguous)
        w = np.concatenate([np.broadcast_to(q_weight.astype(cd), (nq, D)),
                            np.broadcast_to(k_weight.astype(cd), (nk, D))])
        with np.errstate(all="ignore"):
            if var is None:
                var = _mean_squares(heads, D)
            a = _inverse(var, epsilon, cd).reshape(M, nq + nk, 1)
            v = heads.astype(cd) * a
            if llama:
                v = v.astype(qkv.dtype).astype(cd)
            heads[...] = (v * w).astype(qkv.dtype)
        return var


def _row_sums(values, per_item):
    """Sums over the rows of ``values`` (float64, ``M x K``) as the kernels add them:
    in order within blocks of ``per_item`` rows, then the blocks in order."""
    total = None
    for lo in range(0, max(values.shape[0], 1), per_item):
        part = np.zeros(values.shape[1])
        for row in values[lo:lo + per_item]:
            part += row
        total = part if total is None else total + part
    return total




def rows_per_item(K):
    """The kernels' rows per work item (:func:`normkernels.kernels.gated.rows_per_item`:
    blocks of about ``1 << 15`` elements), which orders the sums over rows."""
    return max(1, (1 << 15) // max(K, 1))

"""The NumPy twins of the gated RMSNorm's and QK-norm's engine methods (a mixin of
:class:`normkernels.reference.NumPyEngine`).

Bit for bit the kernels' arithmetic (:mod:`normkernels.kernels.gated`,
:mod:`normkernels.kernels.qk_norm`) after the statistics, SiLU and sigmoid included:
:func:`sigmoid` and :func:`silu` evaluate the kernels' own (Cody-Waite reduction, the
polynomials, the exponent-bit scaling of :mod:`normkernels.kernels.activations`) with
NumPy's IEEE operations, which round exactly as the kernels' (no FMA in either). The
statistics are the twin's own (float64 sums of squares by NumPy), within the
statistics' accuracy of the kernels'; given the kernels' mean squares (``var=``) the
results are the kernels' bits (tests/test_gated.py checks both).
"""

import math

import numpy as np

from normkernels.dtypes import FLOAT64, compute_dtype, round_once

# the kernels' constants (normkernels.kernels.activations): float32's fitted polynomial,
# float64's Cephes exp (Pade form); ``offset`` K of the scaling by 2^(k + K), then 2^-K
_F32_EXP = dict(low=-104.0, magic=12582912.0, ln2_hi=0.693359375, ln2_lo=-2.12194440e-4,
                poly=(0.4999999403953552, 0.16666515171527863, 0.04166845604777336,
                      0.008369418792426586, 0.0013813142431899905),
                mantissa=23, offset=100)
_F64_EXP = dict(low=-746.0, magic=6755399441055744.0, ln2_hi=6.93145751953125e-1,
                ln2_lo=1.42860682030941723212e-6,
                p=(1.26177193074810590878e-4, 3.02994407707441961300e-2,
                   9.99999999999999999910e-1),
                q=(3.00198505138664455042e-6, 2.52448340349684104192e-3,
                   2.27265548208155028766e-1, 2.00000000000000000009e0),
                mantissa=52, offset=1000)


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
    u = np.where(t >= f(k_["low"]), t, f(k_["low"]))  # NaN: low
    magic = f(k_["magic"] + k_["offset"])
    rounded = u * f(1.0 / math.log(2.0)) + magic  # its low bits: k + offset
    k = rounded - magic
    r = (u - k * f(k_["ln2_hi"])) - k * f(k_["ln2_lo"])
    rr = r * r
    if double:
        px = r * _horner(rr, k_["p"])
        qx = _horner(rr, k_["q"])
        e = f(1.0) + f(2.0) * (px / (qx - px))
    else:
        c2, c3, c4, c5, c6 = (f(c) for c in k_["poly"])
        p = ((c2 + c3 * r) + rr * (c4 + c5 * r)) + (rr * rr) * c6
        e = (p * rr + r) + f(1.0)
    bits = np.uint64 if double else np.uint32
    moved = e.view(bits) + (rounded.view(bits) << bits(k_["mantissa"]))  # wraps: 2^(k + K)
    return moved.view(t.dtype) * f(2.0 ** -k_["offset"])


def _sigmoid_parts(z):
    f = z.dtype.type
    e = _exp_nonpositive(-np.abs(z))
    return e, f(1.0) + e, z >= 0


def sigmoid(z):
    """The kernels' sigmoid of ``z`` (a float32 or float64 array), bit for bit."""
    z = np.asarray(z)
    with np.errstate(all="ignore"):
        e, denominator, above = _sigmoid_parts(z)
        return np.where(above, z.dtype.type(1.0), e) / denominator


def silu(z):
    """The kernels' SiLU, ``z / (1 + e)`` or ``(z e) / (1 + e)`` (one division)."""
    z = np.asarray(z)
    with np.errstate(all="ignore"):
        e, denominator, above = _sigmoid_parts(z)
        return np.where(above, z, z * e) / denominator


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
            u = x64 if before else x64 * silu(z64)
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

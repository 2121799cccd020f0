"""The NumPy twins of the quantized-output normalizations' engine methods (a mixin of
:class:`normkernels.reference.NumPyEngine`).

:func:`quantize_rows_from` is the kernels' arithmetic after the statistics, bit for bit
(:mod:`normkernels.kernels.quantize`): given the kernels' float64 statistics it gives
their bits. The twin's own statistics are float64 two-pass means (NumPy's pairwise
sums), not the kernels' blocked sums (see :mod:`normkernels.reference`).
"""

import numpy as np

from normkernels.dtypes import FLOAT32, FLOAT64, compute_dtype

INT8_MAX = 127.0
FP8_MAX = 448.0

# float8_e4m3fn from the bits of float32 / float64: (unsigned view, sign shift, NaN
# above, 448's bits, 2**-6's bits, dropped bits, exponent rebias, subnormal adder)
_FP8 = {
    FLOAT32: (np.uint32, 24, 0x7F800000, 0x43E00000, 0x3C800000, 20, 120 << 3, 16384.0),
    FLOAT64: (np.uint64, 56, 0x7FF0000000000000, 0x407C000000000000, 0x3F90000000000000,
              49, 1016 << 3, 2.0**43),
}


def fp8_bits(v):
    """float8_e4m3fn bits (uint8) of float32 or float64 ``v``: saturated to +-448
    (infinities too), rounded to nearest even once from ``v``; NaN -> ``sign | 0x7f``
    (the rule of :func:`normkernels.kernels.quantize.fp8_from_f32`)."""
    v = np.asarray(v)
    uint, shift, nan_above, top, normal, drop, rebias, adder = _FP8[v.dtype]
    u = v.view(uint)
    one = uint(1)
    sign = (u >> uint(shift)) & uint(0x80)
    a = np.minimum(u & uint(np.iinfo(uint).max >> 1), uint(top))
    lsb = (a >> uint(drop)) & one
    rounded = ((a + ((one << uint(drop - 1)) - one) + lsb) >> uint(drop)) - uint(rebias)
    adder = v.dtype.type(adder)
    with np.errstate(all="ignore"):
        tiny = (a.view(v.dtype) + adder).view(uint) - np.asarray(adder).view(uint)
    r = np.where(a >= uint(normal), rounded, tiny)
    r = np.where((u & uint(np.iinfo(uint).max >> 1)) > uint(nan_above), uint(0x7F), r)
    return (sign | r).astype(np.uint8)


def int8_values(v):
    """``v`` clipped to [-128, 127] (NaN -> 127) and rounded half to even, as int8."""
    c = np.where(v < INT8_MAX, v, v.dtype.type(INT8_MAX))
    c = np.where(c > -128.0, c, v.dtype.type(-128.0))
    return np.rint(c).astype(np.int8)


def quotients(src, w, b, epsilon, centered, offset, fp8, static, group, scale_ub, floor,
              mean, var):
    """The kernels' quotients ``v`` (``M x (K // group) x group`` in the compute dtype:
    ``y * float32(1 / s)`` for int8, ``y / s`` for float8) and float32 scales ``s``
    (``M x (K // group)``) of the rows of ``src`` from float64 per-row ``mean`` and
    ``var`` (the mean square when not ``centered``): their arithmetic, bit for bit."""
    M, K = src.shape
    cd = compute_dtype(src.dtype)
    with np.errstate(all="ignore"):
        inv = 1.0 / np.sqrt(var + epsilon)
        a = inv.astype(cd)
        m = (mean if centered else np.zeros(M)).astype(cd)
        c = np.full(M, -0.0, cd)
        if centered and cd == FLOAT32:
            c = np.where(np.isfinite(m), -((mean - m.astype(FLOAT64)) * inv), -0.0).astype(cd)
        wt = np.full(K, offset, cd) + w.astype(cd)
        bt = np.full(K, -0.0, cd) if b is None else b.astype(cd)
        y = ((src.astype(cd) - m[:, None]) * a[:, None] + c[:, None]) * wt + bt
        groups = y.reshape(M, K // group, group)
        if static is None:
            amax = np.fmax.reduce(np.abs(groups), axis=2, initial=0.0).astype(cd)
            s = (amax.astype(FLOAT64) / (FP8_MAX if fp8 else INT8_MAX)).astype(FLOAT32)
            s = np.minimum(s, np.float32(np.inf if scale_ub is None else scale_ub))
            s = np.maximum(s, np.float32(floor))
        else:
            s = np.full((M, K // group), static, FLOAT32)
        if fp8:
            return groups / s.astype(cd)[:, :, None], s
        return groups * (1.0 / s.astype(FLOAT64)).astype(cd)[:, :, None], s


def quantize_rows_from(src, w, b, q, scales, epsilon, centered, offset, fp8, static, group,
                       scale_ub, floor, mean, var):
    """The quantized rows of ``src`` (``M x K``, after any residual add) from float64
    per-row ``mean`` and ``var`` into ``q`` (uint8 storage) and ``scales`` (dynamic:
    ``M x (K // group)`` float32): the kernels' bits. Returns the number of groups
    with a NaN quotient (int8 only)."""
    v, s = quotients(src, w, b, epsilon, centered, offset, fp8, static, group, scale_ub,
                     floor, mean, var)
    if static is None:
        scales.reshape(s.shape)[...] = s
    if fp8:
        q.reshape(v.shape)[...] = fp8_bits(v)
        return 0
    q.reshape(v.shape)[...] = int8_values(v).view(np.uint8)
    return int(np.isnan(v).any(axis=2).sum())


def row_statistics(src, centered):
    """Float64 per-row ``(mean, var)`` by two passes (var: the mean square when not
    ``centered``, mean 0)."""
    wide = src.astype(FLOAT64)
    with np.errstate(all="ignore"):
        if not centered:
            return np.zeros(src.shape[0]), (wide * wide).mean(axis=1)
        mean = wide.mean(axis=1)
        return mean, ((wide - mean[:, None]) ** 2).mean(axis=1)


def add_residual(x, res):
    """``res = round_T(x + res)`` in place, the sum in the compute dtype."""
    cd = compute_dtype(x.dtype)
    with np.errstate(all="ignore"):
        res[...] = (x.astype(cd) + res.astype(cd)).astype(res.dtype)


class QuantizedTwins:
    def quantized_rows(self, x, w, b, res, q, scales, epsilon, centered, offset, fp8, static,
                       group, scale_ub, floor, path=None):
        """:meth:`normkernels.engine.numba_quantized.QuantizedLoops.quantized_rows` in
        NumPy (statistics by two passes)."""
        src = x
        if res is not None:
            add_residual(x, res)
            src = res
        mean, var = row_statistics(src, centered)
        nans = quantize_rows_from(src, w, b, q, scales, epsilon, centered, offset, fp8, static,
                                  group, scale_ub, floor, mean, var)
        return mean, var, nans

    def quantized_plan(self, dtype, M, K, group, centered, fp8, static, scale_ub, floor, bias):
        """:meth:`normkernels.engine.numba_quantized.QuantizedLoops.quantized_plan`:
        :meth:`quantized_rows` on the plan's rows."""
        def run(x, w, b, res, q, scales, epsilon, offset):
            rows = (M, K)
            return self.quantized_rows(x.reshape(rows), w, b,
                                       None if res is None else res.reshape(rows),
                                       q.reshape(rows), scales, epsilon, centered, offset, fp8,
                                       static, group, scale_ub, floor)[2]

        return run

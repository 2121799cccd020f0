"""Independent float64 oracles, written from the ONNX operator documents
(onnx/docs/Operators.md: BatchNormalization, InstanceNormalization) and oneDNN Graph's
BatchNormInference specification, and the error model the kernels are held to.

Nothing here imports normkernels: these are the statements the kernels are checked
against.

The error model (the user guide's "Numerics", docs/guide/numerics.md, states the same):

* Normalize: per channel the kernel computes ``y = (x - m) * a + b`` in the compute
  dtype (float64 for float64 X, else float32), with ``a = scale / sqrt(var + eps)``
  folded in float64 and rounded once, ``m`` the mean rounded to the compute dtype and
  ``b = B - (mean - m) * a`` (the mean's residual folded into B in float64). With
  ``u`` the unit roundoff of the compute dtype and ``g(k) = k u / (1 - k u)``, each
  of the four roundings of the ``(x - m) * a`` product chain and the three of the
  ``+ b`` chain gives (:func:`arithmetic_bound`)

      |y - exact| <= g(6) |x - mean| |a| + g(3) (|B| + |mean - m| |a|) + underflow.

* 16-bit outputs are ``y`` rounded once to nearest even, so they are within half an
  ulp of the output dtype (at ``|y|``) beyond that bound: truncation (up to a whole
  ulp) fails it on random data, round-half-up fails the tie tests.
* Statistics (training, instance normalization, moments) computed by the kernels are
  within ``STATISTICS_ERROR``: ``|mean - exact| <= e_m (|mean| + std)`` and
  ``|var - exact| <= e_v var + e_o |mean| std``; Y then moves by the first-order
  effect of that.
"""

import math

import ml_dtypes
import numpy as np

BFLOAT16 = np.dtype(ml_dtypes.bfloat16)
F16, F32, F64 = np.dtype(np.float16), np.dtype(np.float32), np.dtype(np.float64)

# (significand bits, smallest normal exponent) of each float dtype
_FORMATS = {F16: (10, -14), BFLOAT16: (7, -126), F32: (23, -126), F64: (52, -1022)}

# (e_m, e_v, e_o): the accuracy the guide states for the kernels' statistics,
# |mean error| <= e_m (|mean| + std) and |var error| <= e_v var + e_o |mean| std (the
# merges of partial means carry the rounding of mean-sized numbers: the relative
# variance error grows with |mean| / std, 1e-12 at 1e6). float32 and float64 X
# accumulate in float64 (measured worst: 5.2 and 650 float64 unit roundoffs over the
# tests' shapes and offsets up to 1e4); 16-bit X sums float32 runs joined in float64
# (measured worst 0.2 and 0.7 float32 unit roundoffs).
STATISTICS_ERROR = {F16: (1e-6, 1e-6, 1e-6), BFLOAT16: (1e-6, 1e-6, 1e-6),
                    F32: (2e-15, 1e-12, 2.0**-53), F64: (2e-15, 1e-12, 2.0**-53)}


def unit_roundoff(dtype):
    """Half the spacing of ``dtype`` at 1: the relative error of one rounding."""
    return 2.0 ** -(_FORMATS[np.dtype(dtype)][0] + 1)


def gamma(k, dtype):
    """Higham's bound on ``k`` successive roundings: ``k u / (1 - k u)``."""
    u = unit_roundoff(dtype)
    return k * u / (1 - k * u)


def compute_dtype(dtype):
    """The kernels' arithmetic dtype for tensors of ``dtype``."""
    return F64 if np.dtype(dtype) == F64 else F32


def ulp(values, dtype):
    """Spacing of ``dtype`` at each of ``values`` (float64 array)."""
    bits, emin = _FORMATS[np.dtype(dtype)]
    mag = np.abs(np.asarray(values, dtype=np.float64))
    with np.errstate(divide="ignore", invalid="ignore"):
        exp = np.floor(np.log2(np.where((mag > 0) & np.isfinite(mag), mag, 1.0)))
    return np.exp2(np.maximum(exp, emin) - bits)


def channel_shape(X, data_format):
    """Shape that broadcasts a length-C vector along X's channel axis."""
    if X.ndim == 1:
        return (1,)
    shape = [1] * X.ndim
    shape[1 if data_format == "NCX" else -1] = -1
    return tuple(shape)


def _f64(v, shape=None):
    v = np.asarray(v).astype(np.float64)
    return v if shape is None else v.reshape(shape)


def batch_norm(X, scale, B, mean, var, epsilon, data_format="NCX"):
    """ONNX BatchNormalization inference / oneDNN BatchNormInference in float64:
    ``Y = (X - mean) / sqrt(var + epsilon) * scale + B``. ``mean`` and ``var`` are
    per channel, or arrays that broadcast against X."""
    shape = channel_shape(X, data_format)
    f = lambda v: _f64(v) if np.ndim(v) == np.ndim(X) else _f64(v, shape)  # noqa: E731
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        return (_f64(X) - f(mean)) / np.sqrt(f(var) + epsilon) * f(scale) + f(B)


def arithmetic_bound(X, scale, B, mean, var, epsilon, data_format, out_dtype,
                     mean_rounded=False):
    """The bound of the compute dtype's arithmetic on ``(x - m) * a + b`` (module
    docstring), per element. ``mean_rounded``: the mean is wider than the compute dtype
    (a float64 mean with float32 X, every batch mean), so ``m`` is its rounding and B
    takes the residual."""
    cd = compute_dtype(out_dtype)
    shape = channel_shape(X, data_format)
    f = lambda v: _f64(v) if np.ndim(v) == np.ndim(X) else _f64(v, shape)  # noqa: E731
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        a = np.abs(f(scale)) / np.sqrt(f(var) + epsilon)
        residual = unit_roundoff(cd) * np.abs(f(mean)) * a if mean_rounded else 0.0
        bound = (gamma(6, cd) * (np.abs(_f64(X) - f(mean)) * a + residual)
                 + gamma(3, cd) * (np.abs(f(B)) + residual))
    underflow = 4 * 2.0 ** (-150 if cd == F32 else -1075)  # half the smallest subnormal
    return bound + underflow


def statistics_effect(X, scale, mean, var, epsilon, data_format, stats_dtype):
    """How far Y may move when mean and var carry the kernels' statistics error
    (:func:`statistics_tolerance`), to first order (with a 1% margin):
    ``|a| d_mean + |x - mean| |a| d_var / (2 (var + eps))``."""
    shape = channel_shape(X, data_format)
    f = lambda v: _f64(v) if np.ndim(v) == np.ndim(X) else _f64(v, shape)  # noqa: E731
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        m, v = f(mean), f(var)
        a = np.abs(f(scale)) / np.sqrt(v + epsilon)
        d_mean, d_var = statistics_tolerance(m, v, stats_dtype)
        return 1.01 * (a * d_mean + np.abs(_f64(X) - m) * a * d_var / (2 * (v + epsilon)))


def tolerance(X, scale, B, mean, var, epsilon, data_format, out_dtype, mean_rounded=False,
              statistics_of=None):
    """Allowed |Y - oracle| per element: :func:`arithmetic_bound`, plus the effect of
    the statistics' error when the kernel computed them from X (``statistics_of``:
    X's dtype), plus half an ulp of a 16-bit output (correct rounding)."""
    bound = arithmetic_bound(X, scale, B, mean, var, epsilon, data_format, out_dtype,
                             mean_rounded)
    if statistics_of is not None:
        bound = bound + statistics_effect(X, scale, mean, var, epsilon, data_format,
                                          statistics_of)
    if np.dtype(out_dtype).itemsize == 2:
        exact = batch_norm(X, scale, B, mean, var, epsilon, data_format)
        bound = bound + 0.5 * ulp(np.abs(exact) + bound, out_dtype)
    return bound


def assert_close(got, exact, tol, what="Y"):
    """``got`` within ``tol`` of the float64 ``exact`` where that is finite; NaN
    exactly where it is NaN and the same infinities where it is infinite. Returns the
    largest error / tolerance ratio."""
    got = np.asarray(got).astype(np.float64)
    exact = np.broadcast_to(exact, got.shape)
    tol = np.broadcast_to(tol, got.shape)
    nan = np.isnan(exact)
    assert np.array_equal(np.isnan(got), nan), f"{what}: NaN where the oracle has none " \
        "(or the reverse)"
    inf = np.isinf(exact)
    assert np.array_equal(got[inf], exact[inf]), f"{what}: infinities differ"
    finite = ~nan & ~inf
    if not finite.any():
        return 0.0
    err = np.abs(got[finite] - exact[finite])
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = np.where(err == 0, 0.0, err / tol[finite])
    worst = int(np.argmax(ratio))
    assert ratio[worst] <= 1.0, (
        f"{what}: error {err[worst]:.3g} at a value {exact[finite][worst]:.6g} is "
        f"{ratio[worst]:.3g}x the tolerance {tol[finite][worst]:.3g}")
    return float(ratio[worst])


def statistics_tolerance(mean, var, x_dtype):
    """Allowed errors of the kernels' mean and population variance of X (``mean``,
    ``var``: the exact values, float64)."""
    e_m, e_v, e_o = STATISTICS_ERROR[np.dtype(x_dtype)]
    with np.errstate(invalid="ignore", over="ignore"):
        std = np.sqrt(np.maximum(var, 0))
        return (e_m * (np.abs(mean) + std) + 1e-300,
                e_v * np.abs(var) + e_o * np.abs(mean) * std + 1e-300)


def rounded_statistic_tolerance(exact, dtype, propagated):
    """A statistic computed in float64 with an error of at most ``propagated`` (plus a
    few float64 roundings) and rounded once to ``dtype``."""
    bound = propagated + 4 * unit_roundoff(F64) * np.abs(exact)
    return bound + 0.5 * ulp(np.abs(exact) + bound, dtype)


def batch_statistics(X, data_format="NCX"):
    """Per-channel batch mean and population variance in float64, from a channel-major
    copy (NumPy sums pairwise only along the contiguous axis; summing over outer axes
    is sequential and was measured 1e-12 off on mean 1e4 / std 1 data)."""
    x = _f64(X)
    if x.ndim == 1:
        x = x.reshape(-1, 1)
    axis = 1 if data_format == "NCX" else x.ndim - 1
    per_channel = np.ascontiguousarray(np.moveaxis(x, axis, 0)).reshape(x.shape[axis], -1)
    with np.errstate(invalid="ignore"):
        mean = per_channel.mean(axis=1)
        dev = per_channel - mean[:, None]
        # corrected two-pass: the second term removes the rounding of the mean
        var = (dev * dev).mean(axis=1) - dev.mean(axis=1) ** 2
    return mean, var


def batch_norm_training(X, scale, B, input_mean, input_var, epsilon, momentum,
                        data_format="NCX"):
    """ONNX BatchNormalization training mode in float64: Y normalized with the batch
    statistics, running statistics ``input * momentum + batch * (1 - momentum)``."""
    mean, var = batch_statistics(X, data_format)
    Y = batch_norm(X, scale, B, mean, var, epsilon, data_format)
    running_mean = _f64(input_mean) * momentum + mean * (1 - momentum)
    running_var = _f64(input_var) * momentum + var * (1 - momentum)
    return Y, running_mean, running_var, mean, var


def instance_statistics(X, data_format="NCX"):
    """Mean and population variance of every (n, c) over the spatial axes, float64,
    shaped to broadcast against X (keepdims). Corrected two-pass from a contiguous
    per-(n, c) copy, as :func:`batch_statistics`."""
    x = _f64(X)
    if data_format == "NXC":
        x = np.moveaxis(x, -1, 1)
    N, C = x.shape[:2]
    planes = np.ascontiguousarray(x).reshape(N, C, -1)
    with np.errstate(invalid="ignore"):
        mean = planes.mean(axis=2, keepdims=True)
        dev = planes - mean
        var = (dev * dev).mean(axis=2, keepdims=True) - dev.mean(axis=2, keepdims=True) ** 2
    shape = (N, C) + (1,) * (x.ndim - 2)
    mean, var = mean.reshape(shape), var.reshape(shape)
    if data_format == "NXC":
        mean, var = np.moveaxis(mean, 1, -1), np.moveaxis(var, 1, -1)
    return mean, var


def instance_norm(X, scale, B, epsilon, data_format="NCX"):
    """ONNX InstanceNormalization in float64:
    ``y = scale * (x - mean) / sqrt(var + epsilon) + B`` per (n, c)."""
    mean, var = instance_statistics(X, data_format)
    return batch_norm(X, scale, B, mean, var, epsilon, data_format), mean, var


def instance_tolerance(X, scale, B, mean, var, epsilon, data_format, out_dtype):
    """Allowed |Y - oracle| for instance normalization: :func:`tolerance` with the
    per-(n, c) statistics (broadcastable, as :func:`instance_statistics` gives them)
    computed by the kernel from X."""
    return tolerance(X, scale, B, mean, var, epsilon, data_format, out_dtype,
                     mean_rounded=compute_dtype(out_dtype) != F64, statistics_of=X.dtype)


def training_tolerance(X, scale, B, mean, var, epsilon, data_format):
    """Allowed |Y - oracle| for training-mode BatchNormalization (batch statistics
    ``mean``, ``var`` per channel, computed by the kernel from X)."""
    return tolerance(X, scale, B, mean, var, epsilon, data_format, X.dtype,
                     mean_rounded=compute_dtype(X.dtype) != F64, statistics_of=X.dtype)


def round_to_nearest_even(values, dtype):
    """``values`` (float64, each exactly representable in float32) rounded to the
    16-bit ``dtype``, ties to even, as bit patterns of that dtype (uint16). Written
    on the bits, apart from NumPy's and ml_dtypes' conversions."""
    f = np.asarray(values, np.float64).astype(np.float32)
    assert np.array_equal(f.astype(np.float64), np.asarray(values, np.float64)), \
        "values must be float32 numbers"
    bits = f.view(np.uint32).astype(np.uint64)
    if np.dtype(dtype) == BFLOAT16:
        keep = 16
        lsb = (bits >> keep) & 1
        return ((bits + 0x7FFF + lsb) >> keep).astype(np.uint16)
    # float16, normal results only (the tie tests stay in [2**-14, 65504])
    sign = (bits >> 31) << 15
    exponent = ((bits >> 23) & 0xFF).astype(np.int64) - 127 + 15
    assert np.all((exponent >= 1) & (exponent <= 30)), "float16 normal range only"
    mantissa = bits & 0x7FFFFF
    lsb = (mantissa >> 13) & 1
    rounded = (exponent.astype(np.uint64) << 10) + ((mantissa + 0xFFF + lsb) >> 13)
    return (sign | rounded).astype(np.uint16)


def row_norm(X, scale, B, epsilon, axis=-1, centered=True):
    """ONNX LayerNormalization (``centered``) / RMSNormalization in float64, written
    from the operator documents: per row (the axes ``axis..``) ``(x - mean) /
    sqrt(var + epsilon) * scale + B`` with the population variance, or ``x /
    sqrt(mean(x**2) + epsilon) * scale`` (+ B). ``scale`` and ``B`` (None: none)
    broadcast to X. Returns ``(Y, mean, var)``, the statistics with keepdims (mean 0
    and var the mean square when not centred)."""
    x = _f64(X)
    axes = tuple(range(axis % x.ndim, x.ndim))
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        if centered:
            mean = x.mean(axis=axes, keepdims=True)
            dev = x - mean
            var = (dev * dev).mean(axis=axes, keepdims=True) - dev.mean(axis=axes,
                                                                       keepdims=True) ** 2
        else:
            mean = np.zeros(x.shape[:axis % x.ndim] + (1,) * len(axes))
            var = (x * x).mean(axis=axes, keepdims=True)
        y = (x - mean) / np.sqrt(var + epsilon) * _f64(scale)
        if B is not None:
            y = y + _f64(B)
    return y, mean, var


def row_tolerance(X, scale, B, mean, var, epsilon, out_dtype, centered=True):
    """Allowed |Y - oracle| for a row normalization: :func:`tolerance` with per-row
    statistics (keepdims) computed by the kernel from X, per-element parameters (the
    row kernel rounds ``1 / sqrt(var + eps)`` once and multiplies by the scale: the
    same count of roundings as the folded ``a``), the mean's residual when the compute
    dtype is float32, and half an ulp of a 16-bit output."""
    shape = np.shape(X)
    s = np.broadcast_to(_f64(scale), shape)
    b = np.broadcast_to(_f64(B) if B is not None else np.zeros(1), shape)
    return tolerance(X, s, b, mean, var, epsilon, "NCX", out_dtype,
                     mean_rounded=centered and compute_dtype(out_dtype) != F64,
                     statistics_of=X.dtype)


# --- group normalizations (specs/group-normalizations.md sections 1, 2 and 5) --------

MVN_EPSILON = 1e-9  # MeanVarianceNormalization's constant, added to the standard deviation


def _refined_moments(values):
    """Mean and population variance along the last (contiguous) axis, keepdims: the
    corrected two-pass of :func:`batch_statistics`, with the mean corrected as well
    (``mean + mean(x - mean)``), so a constant group of any value has exactly its value
    as mean and variance 0 (a pairwise sum of 30 copies of 7.3, divided by 30, is 2
    ulps off, which ``1 / (std + 1e-9)`` would make 2e-6)."""
    with np.errstate(invalid="ignore"):
        first = values.mean(axis=-1, keepdims=True)
        dev = values - first
        correction = dev.mean(axis=-1, keepdims=True)
        return first + correction, (dev * dev).mean(axis=-1, keepdims=True) - correction ** 2


def group_statistics(X, num_groups, data_format="NCX"):
    """Mean and population variance of every (n, group) of ``C / num_groups``
    consecutive channels, over the group's channels and all spatial positions: float64,
    broadcast to X's shape (full arrays), and also as (N, num_groups) arrays. Corrected
    two-pass from a contiguous per-(n, group) copy, as :func:`batch_statistics`."""
    x = _f64(X)
    if data_format == "NXC" and x.ndim > 2:
        x = np.moveaxis(x, -1, 1)
    N, G = x.shape[0], num_groups
    groups = np.ascontiguousarray(x).reshape(N, G, -1)
    mean, var = _refined_moments(groups)
    full_mean = np.broadcast_to(mean, groups.shape).reshape(x.shape)
    full_var = np.broadcast_to(var, groups.shape).reshape(x.shape)
    if data_format == "NXC" and x.ndim > 2:
        full_mean, full_var = np.moveaxis(full_mean, 1, -1), np.moveaxis(full_var, 1, -1)
    return (np.ascontiguousarray(full_mean), np.ascontiguousarray(full_var),
            mean.reshape(N, G), var.reshape(N, G))


def group_norm(X, scale, B, num_groups, epsilon, data_format="NCX", per_group=False):
    """ONNX GroupNormalization / oneDNN GroupNorm in float64:
    ``y = scale * (x - mean) / sqrt(var + epsilon) + B`` with the statistics of x's
    (n, group). ``scale`` and ``B`` per channel (GroupNormalization-21, GroupNorm), or
    per group with ``per_group`` (GroupNormalization-18: channel c takes group
    ``c // (C / num_groups)``'s value). Returns ``(Y, mean, var)``, the statistics
    broadcast to X's shape, and the per-channel scale and B."""
    C = X.shape[1] if data_format == "NCX" or X.ndim == 2 else X.shape[-1]
    scale, B = _f64(scale), _f64(B)
    if per_group:
        scale, B = np.repeat(scale, C // num_groups), np.repeat(B, C // num_groups)
    mean, var, _, _ = group_statistics(X, num_groups, data_format)
    fmt = "NCX" if X.ndim == 2 else data_format
    return batch_norm(X, scale, B, mean, var, epsilon, fmt), mean, var, scale, B


def group_tolerance(X, scale, B, mean, var, epsilon, data_format, out_dtype):
    """Allowed |Y - oracle| for group normalization: :func:`instance_tolerance` with
    the per-(n, group) statistics broadcast to X's shape (``mean``, ``var`` as
    :func:`group_norm` returns them) and per-channel ``scale`` and ``B``."""
    fmt = "NCX" if np.ndim(X) == 2 else data_format
    return instance_tolerance(X, scale, B, mean, var, epsilon, fmt, out_dtype)


def mvn_statistics(X, axes):
    """Mean and population variance of X over ``axes`` (None or empty: every axis),
    float64, broadcast to X's shape. The reduced axes are moved last and made
    contiguous (pairwise sums), corrected two-pass."""
    x = _f64(X)
    axes = tuple(range(x.ndim)) if not axes else tuple(sorted(a % x.ndim for a in axes))
    kept = tuple(i for i in range(x.ndim) if i not in axes)
    order = kept + axes
    moved = np.ascontiguousarray(x.transpose(order))
    rows = moved.reshape(int(np.prod([x.shape[i] for i in kept])), -1)
    mean, var = _refined_moments(rows)
    back = np.argsort(order)
    full = [np.ascontiguousarray(np.broadcast_to(v, rows.shape).reshape(moved.shape)
                                 .transpose(back)) for v in (mean, var)]
    return full[0], full[1]


def mean_variance_norm(X, axes):
    """ONNX MeanVarianceNormalization in float64: ``(x - mean) / (sqrt(var) + 1e-9)``
    over ``axes`` (the function body's constant added to the standard deviation).
    Returns ``(Y, mean, var)``, the statistics broadcast to X's shape."""
    mean, var = mvn_statistics(X, axes)
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        y = (_f64(X) - mean) / (np.sqrt(np.maximum(var, 0)) + MVN_EPSILON)
    return y, mean, var


def mvn_tolerance(X, mean, var, out_dtype):
    """Allowed |Y - oracle| for MeanVarianceNormalization: :func:`tolerance` with
    scale 1, B 0, epsilon 0 and the variance replaced by ``(std + 1e-9) ** 2``, so that
    its ``1 / sqrt(var + eps)`` is the operator's ``a = 1 / (std + 1e-9)``: the kernels
    compute ``(x - m) * a + b`` with ``a`` folded in float64 and rounded once and the
    mean's residual in ``b`` (float32 compute), statistics from X. The first-order
    statistics effect it adds is that of the replaced variance, which differs from the
    operator's by the factor ``(std + 1e-9) / std``: exact to 1% for std >= 1e-7 (a
    constant group has x - mean = 0 and is checked exactly)."""
    with np.errstate(invalid="ignore"):
        replaced = (np.sqrt(np.maximum(_f64(var), 0)) + MVN_EPSILON) ** 2
    ones = np.ones(np.shape(X))
    return tolerance(X, ones, np.zeros(np.shape(X)), mean, replaced, 0.0, "NCX", out_dtype,
                     mean_rounded=compute_dtype(out_dtype) != F64, statistics_of=np.dtype(
                         np.asarray(X).dtype))


# --- LpNormalization and LRN (specs/group-normalizations.md sections 3 and 4): NumPy in
# long double, from the ONNX text ---

WIDE = np.longdouble  # the oracle's precision (80-bit on x86-64)




def lp_oracle(X, axis, p):
    """``x / ||x||_p`` along ``axis``; a zero norm gives 0 (the ONNX doc string)."""
    v = np.asarray(X, dtype=np.float64).astype(WIDE)
    norm = (np.abs(v).sum(axis=axis, keepdims=True) if p == 1
            else np.sqrt((v * v).sum(axis=axis, keepdims=True)))
    with np.errstate(all="ignore"):
        return np.where(norm == 0, WIDE(0), v / norm)


def lrn_oracle(X, size, alpha, beta, bias, data_format="NCX"):
    """The LRN formula per channel, window bounds literally as the schema writes them."""
    v = np.asarray(X, dtype=np.float64).astype(WIDE)
    if data_format == "NXC":
        v = np.moveaxis(v, -1, 1)
    C = v.shape[1]
    Y = np.empty_like(v)
    for c in range(C):
        lo = max(0, c - math.floor((size - 1) / 2))
        hi = min(C - 1, c + math.ceil((size - 1) / 2))
        square_sum = (v[:, lo:hi + 1] ** 2).sum(axis=1)
        with np.errstate(all="ignore"):
            Y[:, c] = v[:, c] / (WIDE(bias) + WIDE(alpha) / size * square_sum) ** WIDE(beta)
    return np.moveaxis(Y, 1, -1) if data_format == "NXC" else Y


def wide_ulp(values, dtype):
    """The spacing of ``dtype`` at ``values`` (its smallest subnormal spacing at 0)."""
    info = ml_dtypes.finfo(dtype)
    _, e = np.frexp(np.abs(values))
    return np.ldexp(WIDE(1), np.maximum(e - 1, info.minexp) - info.nmant)


def ulp_close(got, exact, dtype, terms=0):
    """float32/float64: within 2 ulps of ``exact``; 16-bit: within 1 ulp of ``exact``
    rounded to the dtype. NaN exactly where the oracle has NaN. float64 also gets the
    error of a float64 sum of ``terms`` nonnegative terms (``terms * 2**-53``
    relative): float64 arithmetic cannot promise 2 ulps of a float64 norm."""
    got = np.asarray(got)
    assert got.dtype == dtype and got.shape == exact.shape
    g = got.astype(np.float64).astype(WIDE)
    nan = np.isnan(exact)
    assert np.array_equal(np.isnan(g), nan), "NaN in the wrong places"
    if dtype.itemsize == 2:
        target = exact.astype(np.float64).astype(dtype).astype(np.float64).astype(WIDE)
        bound = wide_ulp(target, dtype)
    else:
        target, bound = exact, 2 * wide_ulp(exact, dtype)
        if dtype == F64:
            bound = bound + terms * WIDE(2.0**-53) * np.abs(exact)
    err = np.abs(g - target)
    ok = (err <= bound) | nan | (g == target)  # g == target: infinities
    assert ok.all(), (f"{(~ok).sum()} elements off; worst {np.max(np.where(ok, 0, err / bound))}"
                      f" x the bound at {np.argwhere(~ok)[:3].tolist()}")


# --- backward passes (specs/backward-passes.md, section 1) ---

def normalization_backward(dY, X, scale, mean, inv_std, reduced, training=True):
    """The gradient of ``y = scale * (x - mean) * inv_std + B`` in float64, the
    statistics those of the groups that ``reduced`` (axes) spans: ``mean`` and
    ``inv_std`` broadcast over them, ``scale`` broadcast to X. Training: ``dX = r (g -
    <g> - x_hat <g x_hat>)`` with ``g = dY * scale``; else ``dX = scale * r * dY``.
    Returns ``(dX, dY * x_hat)`` (the parameter gradients are sums of the second and
    of dY)."""
    x, dy = _f64(X), _f64(dY)
    with np.errstate(all="ignore"):
        x_hat = (x - mean) * inv_std
        g = dy * scale
        if training:
            dX = inv_std * (g - g.mean(axis=reduced, keepdims=True)
                            - x_hat * (g * x_hat).mean(axis=reduced, keepdims=True))
        else:
            dX = scale * inv_std * dy
        return dX, dy * x_hat


def backward_tolerance(dY, X, scale, mean, inv_std, reduced, dX_exact, out_dtype,
                       training=True):
    """Allowed |dX - oracle|: the kernels' float64 sums are exact to first order; dX is
    ``dY * A + (x - m) * B + K`` with A, B, K each rounded once to the compute dtype and
    four roundings in the expression, so each of its terms ``|A dY|``, ``|A x_hat
    <dY x_hat>|`` (the ``(x - mean) * B`` term) and ``|A <dY>|`` (K) carries ``g(8)``,
    plus one rounding to a 16-bit output."""
    cd = compute_dtype(out_dtype)
    with np.errstate(all="ignore"):
        x_hat = (_f64(X) - mean) * inv_std
        dy = _f64(dY)
        a = np.abs(_f64(scale)) * inv_std
        terms = a * np.abs(dy)
        bound = gamma(8, cd) * terms
        if training:
            terms = a * (np.abs(x_hat) * np.abs((dy * x_hat).mean(axis=reduced, keepdims=True))
                         + np.abs(dy.mean(axis=reduced, keepdims=True)))
            # the float64 sums: M terms summed in float64 (worst case M roundings of
            # the sum of |terms|), then the terms' own roundings
            count = np.prod([np.shape(X)[i] for i in np.atleast_1d(reduced)])
            sums = count * 2.0**-53 * a * (np.abs(x_hat) * np.abs(dy * x_hat).mean(
                axis=reduced, keepdims=True) + np.abs(dy).mean(axis=reduced, keepdims=True))
            bound = bound + gamma(8, cd) * terms + sums
        bound = bound + 4 * 2.0 ** (-150 if cd == F32 else -1075)
    if np.dtype(out_dtype).itemsize == 2:
        bound = bound + 0.5 * ulp(np.abs(dX_exact) + bound, out_dtype)
    return bound


# --- activation epilogues ---------------------------------------------------------------

GELU_A = np.sqrt(2.0 / np.pi)


def _erfc_sum(x, e):
    """erfc(x) for ``x >= 0`` in ``x``'s (long double) precision, ``e = exp(-x^2)``:
    ``1 - erf(x)`` from the series of positive terms ``erf(x) = 2 / sqrt(pi) e sum
    (2 x^2)^n x / (2n + 1)!!`` below 1 (the difference loses under 3 bits there), else
    the continued fraction ``erfc(x) = e / (sqrt(pi) (x + (1/2) / (x + 1 / (x + (3/2) /
    ...))))``, evaluated from a depth that converges to the precision in each range
    (checked against a 200-bit evaluation: within 3 units of the last long-double bit)."""
    L = x.dtype.type
    root_pi = np.sqrt(4 * np.arctan(L(1)))
    out = np.empty_like(x)
    low = x < 1
    xs = x[low]
    term = xs.copy()
    total = xs.copy()
    for n in range(1, 60):
        term = term * (2 * xs * xs) / (2 * n + 1)
        total = total + term
    out[low] = 1 - 2 / root_pi * e[low] * total
    for lo, hi, depth in ((1, 2, 500), (2, 4, 150), (4, np.inf, 50)):
        part = (x >= lo) & (x < hi)
        xs = x[part]
        f = xs.copy()
        for n in range(depth, 0, -1):
            f = xs + L(n) / 2 / f
        out[part] = e[part] / (root_pi * f)
    return out


def gelu_exact(y):
    """``gelu(y) = y Phi(y) = 0.5 y erfc(-y / sqrt 2)`` of float64 ``y`` in long double,
    accurate to a few units of its last bit where long double is wider than float64
    (x86's 64-bit significand, aarch64 Linux's 113): ``exp(-y^2 / 2)`` from ``y = yh +
    yl`` (yh: 26 bits) so that no rounding of ``y^2`` is amplified, and erfc of
    :func:`_erfc_sum` (no cancellation: ``1 - erfc / 2`` for ``y >= 0``, at least 1/2).
    ``gelu(inf) = inf``, ``gelu(-inf) = NaN`` (PyTorch's), NaN stays NaN."""
    L = np.longdouble
    y = _f64(y)
    finite = np.isfinite(y)
    t = np.where(finite, np.abs(y), 0.0)
    th = (t.view(np.uint64) & np.uint64(0xFFFFFFFFF8000000)).view(np.float64)
    tl = (t - th).astype(L)
    th = th.astype(L)
    e = np.exp(-(th * th) / 2) * np.exp(-(2 * th * tl + tl * tl) / 2)  # exp(-t^2 / 2)
    erfc = _erfc_sum(t.astype(L) / np.sqrt(L(2)), e)
    value = y.astype(L) * np.where(y < 0, erfc / 2, 1 - erfc / 2)
    special = np.where(y > 0, L(np.inf), L(np.nan))
    return np.where(finite, value, np.where(np.isnan(y), y.astype(L), special))


def activation(kind, y):
    """The activation ``kind`` ("relu", "silu", "gelu_tanh", "gelu"; None: none) of
    float64 ``y``, from PyTorch's definitions (``gelu_tanh`` in its sigmoid form, which
    does not cancel; ``gelu`` from :func:`gelu_exact`, rounded to float64)."""
    y = _f64(y)
    with np.errstate(all="ignore"):
        if kind is None or kind == "none":
            return y
        if kind == "relu":
            return np.where(y < 0, 0.0, y)
        if kind == "gelu":
            return gelu_exact(y).astype(np.float64)
        z = y if kind == "silu" else 2 * GELU_A * (y + 0.044715 * y ** 3)
        return y * np.exp(-np.logaddexp(0.0, -z))  # sigmoid(z), without overflow


def activation_tolerance(kind, exact_y, tol_y, out_dtype):
    """Allowed |act(Y) - act(oracle Y)|: Y's own tolerance through the activation's
    slope (within [-0.13, 1.13]), the activation's error (normkernels'
    ``SIGMOID_ULPS`` of the compute dtype, plus 8 per unit of the sigmoid's argument:
    the up to 7 roundings of gelu_tanh's argument are amplified by exp; exact GELU has
    no such term), the subnormal floor, and half an ulp of a 16-bit output (rounded
    once more)."""
    from normkernels.kernels.activations import ACTIVATION_ULPS, SIGMOID_ULPS

    if kind is None or kind == "none":
        return tol_y
    cd = compute_dtype(out_dtype)
    u = unit_roundoff(cd)
    tiny = 2.0 ** (-149 if cd == F32 else -1074)
    y = _f64(exact_y)
    value = activation(kind, y)
    with np.errstate(all="ignore"):
        z = np.abs(y if kind != "gelu_tanh" else 2 * GELU_A * (y + 0.044715 * y ** 3))
        own = np.zeros_like(y) if kind == "relu" else (
            (SIGMOID_ULPS + 8 * z) * u * np.abs(value) + 4 * np.abs(y) * tiny)
        if kind == "gelu":  # no rounded argument amplified (no z term); the oracle's own
            # rounding to float64, and a result rounded twice into the subnormals
            own = ((ACTIVATION_ULPS * u + 2.0**-53) * np.abs(value) + 4 * np.abs(y) * tiny
                   + 2 * tiny)
        bound = 1.13 * tol_y + own
        if np.dtype(out_dtype).itemsize == 2:
            bound = bound + 0.5 * ulp(np.abs(value) + bound, out_dtype)
    return bound

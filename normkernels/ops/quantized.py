"""Row normalizations with quantized outputs (spec layer): vLLM's fused
``rms_norm_static_fp8_quant``, ``rms_norm_dynamic_per_token_quant`` and
``rms_norm_per_block_quant``, and the same for layer normalization.

Per row of ``x`` (its last axis, ``hidden`` elements): float64 statistics, ``y =
x_hat * (offset + weight) (+ bias)`` in float32 (float64 for float64 x) and never
rounded to x's dtype, then ``q = quant(y / s)`` with a static scale or one scale per
row (per ``group_size`` features with ``group_size``). The arithmetic is
:mod:`normkernels.kernels.quantize`'s docstring; the argument rules are here.
"""

import math

import ml_dtypes
import numpy as np

from normkernels.ops import common, plans, rows
from normkernels.ops.common import ALL_FLOATS

RMS = "quantized_rms_normalization"
LAYER = "quantized_layer_normalization"
INT8 = np.dtype(np.int8)
FP8 = np.dtype(ml_dtypes.float8_e4m3fn)
QUANT_DTYPES = (INT8, FP8)
FLOAT32_TINY = float(np.finfo(np.float32).tiny)
FLOAT32_MAX = float(np.finfo(np.float32).max)
# the dynamic scale's floor (vLLM's min_scaling_factor): float8 1 / (448 * 512), int8
# float32's epsilon
FLOORS = {INT8: float(np.finfo(np.float32).eps), FP8: 1.0 / (448.0 * 512.0)}


def check_quant_dtype(label, dtype):
    try:
        d = np.dtype(dtype)
    except TypeError:
        d = None
    if d not in QUANT_DTYPES:
        raise TypeError(f"{label}: dtype must be numpy.int8 or ml_dtypes.float8_e4m3fn, "
                        f"got {dtype!r}")
    return d


def _positive_float32(label, name, value):
    """A positive finite float whose float32 rounding is a normal number (its
    reciprocal finite: the int8 quotient multiplies by it)."""
    number = common.check_float_attribute(label, name, value, positive=True)
    if not FLOAT32_TINY <= number <= FLOAT32_MAX:
        raise ValueError(f"{label}: {name} must be a normal positive finite float32 value "
                         f"(in [{FLOAT32_TINY}, {FLOAT32_MAX}]: 1 / {name} finite), got "
                         f"{number}")
    return number


def _vector(label, name, value, x, hidden):
    if value is None:
        return None
    p = common.as_array(name, value)
    if p.dtype != x.dtype:
        raise TypeError(f"{label}: {name} must have x's dtype {x.dtype}, got {p.dtype}")
    if p.shape != (hidden,):
        raise ValueError(f"{label}: {name} must have shape (hidden,) = ({hidden},), "
                         f"got {p.shape}")
    return np.ascontiguousarray(p)


def _residual(label, residual, x):
    if residual is None:
        return None
    if not isinstance(residual, np.ndarray):
        raise TypeError(f"{label}: residual must be a numpy.ndarray (it is updated in "
                        f"place), got {type(residual).__name__}")
    if residual.dtype != x.dtype:
        raise TypeError(f"{label}: residual must have x's dtype {x.dtype}, got "
                        f"{residual.dtype}")
    if residual.shape != x.shape:
        raise ValueError(f"{label}: residual must have x's shape {x.shape}, got "
                         f"{residual.shape}")
    if not residual.flags.writeable:
        raise ValueError(f"{label}: residual is read-only (it is updated in place)")
    if np.may_share_memory(residual, x) and np.shares_memory(residual, x):
        raise ValueError(f"{label}: residual shares memory with x (residual is updated "
                         "in place to x + residual; x must be left untouched)")
    return residual


def _group(label, group_size, hidden, static):
    if group_size is None:
        return hidden
    if static:
        raise ValueError(f"{label}: group_size applies to dynamic scales only "
                         "(static_scale is given)")
    if not common.is_integer(group_size):
        raise TypeError(f"{label}: group_size must be an int, got "
                        f"{type(group_size).__name__} {group_size!r}")
    g = int(group_size)
    if g < 1 or hidden % g:
        raise ValueError(f"{label}: group_size must be a positive divisor of hidden "
                         f"(x.shape[-1] = {hidden}), got {g}")
    return g


def _planned(label, engine, x, weight, bias, residual, dtype, epsilon, static_scale,
             group_size, scale_ub, offset):
    """``(key, result)``: the plan key of a call (None: it has none) and what the plan
    of an earlier call with this metadata gives it (None: the full path decides)."""
    attributes = (dtype, epsilon, static_scale, group_size, scale_ub, offset)
    try:
        key = (label, engine, *attributes, *map(type, attributes), type(x), x.shape, x.strides,
               x.dtype, type(weight), weight.shape, weight.strides, weight.dtype,
               None if bias is None else (type(bias), bias.shape, bias.strides, bias.dtype),
               None if residual is None else (type(residual), residual.shape,
                                              residual.strides, residual.dtype))
        plan = plans.get(key)
    except (AttributeError, TypeError):  # not arrays, or an unhashable attribute
        return None, None
    if plan is None:
        return key, None
    return key, plan(x, weight, bias, residual, epsilon, static_scale, scale_ub, offset)


def quantized_normalization(label, x, weight, bias, *, dtype, epsilon, static_scale,
                            group_size, scale_ub, residual, offset, centered, engine,
                            path=None, key=None):
    """The checks, then ``engine.quantized_rows``: ``(q, scales)``; ``key``: the call's
    plan key (see :func:`_planned`), under which a plan of it is stored."""
    qd = check_quant_dtype(label, dtype)
    given = (x, weight, bias)
    x = common.as_array("x", x)
    common.check_dtype(label, "x", x, ALL_FLOATS)
    if x.ndim < 1:
        raise ValueError(f"{label}: x must have rank >= 1 (rows over its last axis), "
                         f"got a 0-d array")
    eps = common.check_float_attribute(label, "epsilon", epsilon)
    if eps < 0:
        raise ValueError(f"{label}: epsilon must be >= 0, got {eps}")
    off = common.check_float_attribute(label, "offset", offset)
    static = None if static_scale is None else _positive_float32(label, "static_scale",
                                                                 static_scale)
    if scale_ub is not None and static is not None:
        raise ValueError(f"{label}: scale_ub applies to dynamic scales only "
                         "(static_scale is given)")
    ub = None if scale_ub is None else _positive_float32(label, "scale_ub", scale_ub)
    hidden = x.shape[-1]
    M = x.size // hidden if hidden else 0
    if hidden == 0 and math.prod(x.shape[:-1]) > 0:
        raise ValueError(f"{label}: x of shape {x.shape} has rows of zero elements: "
                         "their statistics are undefined")
    w = _vector(label, "weight", weight, x, hidden)
    if w is None:
        raise TypeError(f"{label}: weight is required, got None")
    b = _vector(label, "bias", bias, x, hidden)
    res = _residual(label, residual, x)
    group = _group(label, group_size, hidden, static is not None)
    plan = _Plan(label, engine, centered, qd, group, x.shape, M, hidden)
    n = 2 if b is None else 3  # the arrays as given, kept as given by the checks
    if (key is not None and M and plans.plain(given[:n], (x, w, b)[:n])
            and all(a is None or a.flags.c_contiguous for a in (x, w, b, res))
            and (res is None or type(res) is np.ndarray)):
        plans.add(key, plan)
    xr = rows.rows_in(x, M, hidden) if M else x
    rr = None if res is None or not M else rows.rows_in(res, M, hidden)
    result, nans = plan.run(xr, w, b, rr, eps, static, ub, off, path)
    if rr is not None and not np.may_share_memory(rr, res):  # rows were a copy
        res[...] = rr.reshape(res.shape)
    return _checked_nans(label, nans, result)


class _Plan:
    """A call plan (see :mod:`normkernels.ops.plans`) of C-contiguous arrays: only the
    checks that depend on more than the key (the residual writeable and apart from x),
    then the engine's bound call (``engine.quantized_plan``, made at the first planned
    call). :meth:`run` is the full path's. The float attributes are the caller's,
    converted as the full checks convert them (a key does not tell ``-0.0`` from
    ``0.0``)."""

    __slots__ = ("G", "K", "M", "bound", "centered", "engine", "label", "qd", "scale_shape",
                 "shape")

    def __init__(self, label, engine, centered, qd, G, shape, M, K):
        self.label, self.engine, self.centered, self.qd, self.G = label, engine, centered, qd, G
        self.shape, self.M, self.K = shape, M, K
        self.scale_shape = (*shape[:-1], K // max(G, 1))
        self.bound = None

    def __call__(self, x, weight, bias, residual, epsilon, static, scale_ub, offset):
        if residual is not None and (not residual.flags.writeable
                                     or np.may_share_memory(residual, x)):
            return None
        run = self.bound
        if run is None:
            run = self.bound = self.engine.quantized_plan(
                x.dtype, self.M, self.K, self.G, self.centered, self.qd == FP8,
                None if static is None else float(static),
                None if scale_ub is None else float(scale_ub), FLOORS[self.qd], bias)
        q = np.empty(self.shape, np.uint8)
        scales = None if static is not None else np.empty(self.scale_shape, np.float32)
        nans = run(x, weight, bias, residual, q, scales, float(epsilon), float(offset))
        if nans:
            _checked_nans(self.label, nans, None)
        if static is not None:
            return q.view(self.qd), np.array(float(static), np.float32)
        return q.view(self.qd), scales

    def run(self, xr, w, b, rr, eps, static, ub, off, path):
        """``((q, scales), nans)`` of checked ``M x K`` rows ``xr`` (and residual rows
        ``rr``): ``nans`` row groups had NaN quotients."""
        M, K, G, qd = self.M, self.K, self.G, self.qd
        q = np.empty((M, K), np.uint8)
        scales, nans = None, 0
        if static is None:
            scales = np.empty(self.scale_shape, np.float32)
        if M:
            _, _, nans = self.engine.quantized_rows(xr, w, b, rr, q, scales, eps,
                                                    self.centered, off, qd == FP8, static, G,
                                                    ub, FLOORS[qd], path)
        out = q.reshape(self.shape).view(qd)
        if static is not None:
            return (out, np.array(static, np.float32)), nans
        return (out, scales), nans


def _checked_nans(label, nans, result):
    """``result``, or the error of ``nans`` row groups of NaN quotients (int8 only)."""
    if nans:
        raise ValueError(f"{label}: x has NaN quotients y / s in {nans} row group(s) (a NaN "
                         "in x, residual or the parameters, or an infinite y and scale); int8 "
                         "has no NaN (float8_e4m3fn keeps it)")
    return result


def quantized_rms_normalization(x, weight, *, dtype, epsilon=1e-6, static_scale=None,
                                group_size=None, scale_ub=None, residual=None, offset=0.0,
                                engine, path=None):
    """Spec layer of :func:`normkernels.quantized_rms_normalization`."""
    return _spec(RMS, False, x, weight, None, dtype, epsilon, static_scale, group_size,
                 scale_ub, residual, offset, engine, path)


def quantized_layer_normalization(x, weight, bias=None, *, dtype, epsilon=1e-6,
                                  static_scale=None, group_size=None, scale_ub=None,
                                  residual=None, offset=0.0, engine, path=None):
    """Spec layer of :func:`normkernels.quantized_layer_normalization`."""
    return _spec(LAYER, True, x, weight, bias, dtype, epsilon, static_scale, group_size,
                 scale_ub, residual, offset, engine, path)


def _spec(label, centered, x, weight, bias, dtype, epsilon, static_scale, group_size,
          scale_ub, residual, offset, engine, path):
    """A plan of an earlier call with this metadata (see ops/plans.py), else the full
    checks (positional: a decode step's call is a few microseconds)."""
    key = None
    if path is None:
        key, result = _planned(label, engine, x, weight, bias, residual, dtype, epsilon,
                               static_scale, group_size, scale_ub, offset)
        if result is not None:
            return result
    return quantized_normalization(label, x, weight, bias, dtype=dtype, epsilon=epsilon,
                                   static_scale=static_scale, group_size=group_size,
                                   scale_ub=scale_ub, residual=residual, offset=offset,
                                   centered=centered, engine=engine, path=path, key=key)

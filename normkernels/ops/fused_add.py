"""vLLM's fused residual add and normalization, in place (spec layer).

Per row of ``x`` (the last axis, ``hidden``): ``z = round_T(x + residual)``;
``residual <- z``; then ``x <- normalize(z)``: RMS normalization (``fused_add_rms_norm``,
vLLM's ``fused_add_rms_norm(input, residual, weight, epsilon)``: Llama rounding by
default, ``round_T(round_T(z_hat) * weight)``) or layer normalization
(``fused_add_layer_norm``: ``round_T(z_hat * weight + bias)``). Both arrays are
written in place and nothing is returned: a serving loop calls it twice per layer with
the same residual buffer. The out-of-place form is onnxruntime's
SkipSimplifiedLayerNormalization / SkipLayerNormalization with ``num_outputs=4``.

The add is onnxruntime's skip add (``x + residual`` in float32, float64 for float32 and
float64 T, rounded once to T: the correctly rounded sum, as T's own addition gives it),
and the normalization reads the rounded sum, as vLLM's kernels do.
"""

import numpy as np

from normkernels.ops import common, plans, rows
from normkernels.ops.common import ALL_FLOATS

FUSED_ADD_RMS = "fused_add_rms_norm"
FUSED_ADD_LAYER = "fused_add_layer_norm"


def _in_place_rows(arr, M, K):
    """``arr`` as ``M x K`` rows the kernels write in place (a view), or None when its
    memory is not laid out as rows (the caller works on a copy and writes it back)."""
    try:
        v = arr.reshape(M, K, copy=False)
    except (ValueError, TypeError):
        return None
    if K > 1 and v.strides[1] != v.itemsize:
        return None
    if M > 1 and (v.strides[0] < K * v.itemsize or v.strides[0] % v.itemsize):
        return None
    return v


class _Plan:
    """A call plan (see :mod:`normkernels.ops.plans`) of C-contiguous x and residual and
    contiguous parameters: only the checks that depend on more than the key (writeable,
    overlaps), then the engine; and, when the very same arrays keep coming (a serving
    loop's buffers) and there is no offset (whose ``offset + weight`` is made per
    call), their bound call."""

    __slots__ = ("K", "M", "centered", "engine", "epsilon", "label", "offset", "reuse",
                 "rounding")

    def __init__(self, label, engine, epsilon, centered, offset, rounding, M, K):
        self.label, self.engine, self.epsilon, self.centered = label, engine, epsilon, centered
        self.offset, self.rounding = offset, rounding
        self.M, self.K = M, K
        self.reuse = plans.Reuse()

    def __call__(self, x, residual, weight, bias):
        arrays = (x, residual, weight, bias)
        if not (x.flags.writeable and residual.flags.writeable):
            return False
        call = self.reuse.bound(arrays)
        if call is not None:
            call()
            return True
        params = (weight,) if bias is None else (weight, bias)
        if plans.shares(x, residual, params) or plans.shares(residual, x, params):
            return False
        xw, rw = x.reshape(self.M, self.K), residual.reshape(self.M, self.K)
        scale = common.offset_scale(self.label, self.offset, weight, x)
        args = (xw, xw, scale, bias, self.epsilon, self.centered)
        kwargs = {"skip": rw, "bias": None, "sums": rw, "rounding": self.rounding}
        self.engine.normalize_rows(*args, **kwargs)
        if (scale is weight and x.nbytes <= plans.REUSE_MAX_BYTES
                and hasattr(self.engine, "bind_rows")):
            self.reuse.offer(arrays, lambda: self.engine.bind_rows(
                *args, kwargs["skip"], None, kwargs["sums"], self.rounding))
        return True


def _fused_add(label, centered, x, residual, weight, bias, epsilon, offset, rounding, engine,
               path):
    key = None
    if path is None:  # a plan of an earlier call with this metadata (see ops/plans.py)
        try:
            key = (label, engine, epsilon, offset, rounding, type(epsilon), type(offset),
                   *((type(a), a.shape, a.strides, a.dtype) if a is not None else None
                     for a in (x, residual, weight, bias)))
            plan = plans.get(key)
        except (AttributeError, TypeError):  # not arrays, or an unhashable attribute
            key = plan = None
        if plan is not None and plan(x, residual, weight, bias):
            return None
    eps = common.check_epsilon(label, epsilon)
    rounding = common.check_rounding(label, rounding)
    arrays = {"x": x, "residual": residual, "weight": weight}
    if bias is not None:
        arrays["bias"] = bias
    for name, arr in arrays.items():
        if not isinstance(arr, np.ndarray):
            raise TypeError(f"{label}: {name} must be a numpy.ndarray, got "
                            f"{type(arr).__name__}")
        common.check_dtype(label, name, arr, ALL_FLOATS)
    common.check_same_dtype(label, "T", arrays)
    if x.ndim == 0:
        raise ValueError(f"{label}: x must have at least 1 dimension, got a 0-d array")
    if residual.shape != x.shape:
        raise ValueError(f"{label}: residual must have x's shape {x.shape}, got "
                         f"{residual.shape}")
    hidden = x.shape[-1]
    for name in ("weight", "bias"):
        if name in arrays and arrays[name].shape != (hidden,):
            raise ValueError(f"{label}: {name} must have shape ({hidden},) (x's last axis), "
                             f"got {arrays[name].shape}")
    for name in ("x", "residual"):
        if not arrays[name].flags.writeable:
            raise ValueError(f"{label}: {name} is read-only ({label} writes it in place)")
    if np.may_share_memory(x, residual) and np.shares_memory(x, residual):
        raise ValueError(f"{label}: x and residual share memory (both are written)")
    for name in ("weight", "bias"):
        for target in ("x", "residual"):
            if name in arrays and np.shares_memory(arrays[name], arrays[target]):
                raise ValueError(f"{label}: {name} shares memory with {target}, which is "
                                 "written")
    M, K = rows.rows_shape(x.shape, x.ndim - 1)
    if K == 0 and M > 0:
        raise ValueError(f"{label}: x of shape {x.shape} has rows of zero elements: their "
                         "statistics are undefined")
    if x.size == 0:
        return None
    scale = common.offset_scale(label, offset, weight, x)
    if (key is not None and eps and x.flags.c_contiguous
            and residual.flags.c_contiguous and weight.flags.c_contiguous
            and (bias is None or bias.flags.c_contiguous)
            and all(type(a) is np.ndarray and a.dtype.isnative
                    for a in (x, residual, weight, bias) if a is not None)):
        plans.add(key, _Plan(label, engine, eps, centered, offset, rounding, M, K))
    # the kernels read residual's rows as contiguous skip rows and write them as sums
    xr = _in_place_rows(x, M, K)
    rr = residual.reshape(M, K) if residual.flags.c_contiguous else None
    xw = xr if xr is not None else np.ascontiguousarray(x).reshape(M, K)
    rw = rr if rr is not None else np.ascontiguousarray(residual).reshape(M, K)
    engine.normalize_rows(xw, xw, scale, bias, eps, centered, skip=rw, bias=None, sums=rw,
                          path=path, rounding=rounding)
    if xr is None:
        x[...] = xw.reshape(x.shape)
    if rr is None:
        residual[...] = rw.reshape(x.shape)
    return None


def fused_add_rms_norm(x, residual, weight, *, epsilon=1e-6, offset=0.0, rounding="llama",
                       engine, path=None):
    """Spec layer of :func:`normkernels.fused_add_rms_norm`."""
    return _fused_add(FUSED_ADD_RMS, False, x, residual, weight, None, epsilon, offset,
                      rounding, engine, path)


def fused_add_layer_norm(x, residual, weight, bias=None, *, epsilon=1e-5, offset=0.0,
                         rounding="once", engine, path=None):
    """Spec layer of :func:`normkernels.fused_add_layer_norm`."""
    return _fused_add(FUSED_ADD_LAYER, True, x, residual, weight, bias, epsilon, offset,
                      rounding, engine, path)

"""The gated RMSNorm of Mamba-2 and Qwen3-Next (spec layer): mamba_ssm's
``rmsnorm_fn`` / ``RMSNormGated`` (``ops/triton/layernorm_gated.py``) and its backward.

Per row of the last axis (``hidden``), in groups of ``group_size`` contiguous features
(None: the whole row), with ``x_hat = v / sqrt(mean(v**2) + epsilon)`` over a group:

* ``norm_before_gate=True``: ``y = (x_hat(x) * w + b) * silu(z)``;
* ``norm_before_gate=False``: ``x' = x * silu(z)``, ``y = x_hat(x') * w + b``.

As mamba_ssm's kernel, ``x'`` is not rounded to x's dtype before its statistics (its
Triton kernel keeps it in float32). The statistics are float64; the arithmetic is in
float32 (float64 for float64 x) and Y is rounded once to x's dtype. The backward pass
is float64 throughout, dx and dgate rounded once; dweight and dbias are sums over all
rows in float64, rounded once to weight's dtype (what torch autograd of the composite
returns, and mamba_ssm's ``_layer_norm_bwd``: ``dw.to(weight.dtype)``).
"""

from functools import partial

import numpy as np

from normkernels.dtypes import round_once
from normkernels.ops import common, plans
from normkernels.ops.common import ALL_FLOATS

OP = "gated_rms_normalization"
BACKWARD = "gated_rms_normalization_backward"


def _as_bool(label, name, value):
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{label}: {name} must be a bool, got {type(value).__name__} {value!r}")
    return bool(value)


def _group(label, group_size, K):
    if group_size is None:
        return K
    if not common.is_integer(group_size):
        raise TypeError(f"{label}: group_size must be an integer or None, got "
                        f"{type(group_size).__name__} {group_size!r}")
    if group_size < 1 or K % group_size:
        raise ValueError(f"{label}: group_size must be a positive divisor of the last axis "
                         f"({K}), got {group_size}")
    return int(group_size)


def _rows(a):
    """``a`` as ``M x K`` rows, each contiguous (a view where NumPy can, else a copy)."""
    rows = a.reshape(-1, a.shape[-1])
    if rows.shape[1] > 1 and rows.strides[1] != rows.itemsize:
        rows = np.ascontiguousarray(rows)
    return rows


def _checked(label, named, x_name, params):
    """The arrays converted and checked: one float dtype, the tensors one shape (rank
    >= 1, a non-empty last axis), the parameters ``(K,)``."""
    arrays = {n: common.as_array(n, v) for n, v in named.items() if v is not None}
    for name, arr in arrays.items():
        common.check_dtype(label, name, arr, ALL_FLOATS)
    x = arrays[x_name]
    for name, arr in arrays.items():
        if arr.dtype != x.dtype:
            raise TypeError(f"{label}: {name} must have {x_name}'s dtype ({x.dtype}), got "
                            f"{arr.dtype}")
    if x.ndim < 1:
        raise ValueError(f"{label}: {x_name} must have rank >= 1, got a 0-d array")
    K = x.shape[-1]
    if K == 0:
        raise ValueError(f"{label}: {x_name} of shape {x.shape} has rows of zero elements: "
                         "their mean square is undefined")
    for name, arr in arrays.items():
        want = (K,) if name in params else x.shape
        if arr.shape != want:
            raise ValueError(f"{label}: {name} must have shape {want} ({x_name}'s "
                             f"{'last axis' if name in params else 'shape'}), got {arr.shape}")
    return arrays


def _target(label, out, x):
    """``(rows, result, copy)``: where the kernels write Y, what is returned, and
    whether ``rows`` is scratch to copy into ``out`` (its rows are not contiguous)."""
    if out is None:
        y = np.empty(x.shape, x.dtype)
        return y.reshape(-1, x.shape[-1]), y, False
    if not isinstance(out, np.ndarray):
        raise TypeError(f"{label}: out must be an ndarray, got {type(out).__name__}")
    if out.dtype != x.dtype or out.shape != x.shape:
        raise ValueError(f"{label}: out must have x's shape {x.shape} and dtype {x.dtype}, "
                         f"got {out.shape} {out.dtype}")
    if not out.flags.writeable:
        raise ValueError(f"{label}: out is read-only")
    rows = out.reshape(-1, x.shape[-1])  # a copy when the leading axes do not merge
    if not np.may_share_memory(rows, out) or (rows.shape[1] > 1
                                              and rows.strides[1] != rows.itemsize):
        return np.empty(rows.shape, x.dtype), out, True
    return rows, out, False


def gated_rms_normalization(x, gate, weight, bias=None, *, epsilon=1e-6, group_size=None,
                            norm_before_gate=True, out=None, engine, path=None):
    """Spec layer of :func:`normkernels.gated_rms_normalization`."""
    key = None
    if path is None:  # a plan of an earlier call with this metadata (see ops/plans.py)
        try:
            key = (OP, engine, epsilon, group_size, norm_before_gate, type(epsilon),
                   type(group_size), type(norm_before_gate), type(x), x.shape, x.strides,
                   x.dtype, type(gate), gate.shape, gate.strides, gate.dtype, type(weight),
                   weight.shape, weight.strides, weight.dtype,
                   None if bias is None else (type(bias), bias.shape, bias.strides, bias.dtype),
                   plans.out_key(out, x))
            plan = plans.get(key)
        except (AttributeError, TypeError):  # not arrays, or an unhashable attribute
            key = plan = None
        if plan is not None:
            y = plan(x, gate, weight, bias, out, epsilon)
            if y is not None:
                return y
    label = OP
    arrays = _checked(label, {"x": x, "gate": gate, "weight": weight, "bias": bias}, "x",
                      ("weight", "bias"))
    x, z = arrays["x"], arrays["gate"]
    eps = common.check_epsilon(label, epsilon)
    before = _as_bool(label, "norm_before_gate", norm_before_gate)
    G = _group(label, group_size, x.shape[-1])
    rows, result, copy = _target(label, out, x)
    for name in ("x", "gate"):  # may_share_memory first: bounds only (shares_memory: us)
        arr = arrays[name]
        if (out is not None and np.may_share_memory(result, arr)
                and not common.same_view(result, arr) and np.shares_memory(result, arr)):
            raise ValueError(f"{label}: out overlaps {name} without being the same view")
    given = (x, gate, weight) if bias is None else (x, gate, weight, bias)
    if (key is not None and x.size and not copy and plans.plain(given, tuple(arrays.values()))
            and all(a.flags.c_contiguous for a in (*given, result))):
        plans.add(key, _Plan(engine, G, before, x.shape))
    if x.size:
        engine.gated_rms(_rows(x), _rows(z), rows, arrays["weight"], arrays.get("bias"), G,
                         eps, before, path)
        if copy:
            np.copyto(result, rows.reshape(result.shape))
    return result


class _Plan:
    """A call plan (see :mod:`normkernels.ops.plans`) of C-contiguous arrays: only the
    checks that depend on more than the key (``out`` writeable and apart from the
    inputs: otherwise the full checks decide), then the engine; when the very same
    arrays keep coming with ``out`` (a serving loop's buffers), their bound engine call
    (:class:`plans.Reuse`: the same objects have the same overlaps). epsilon is the
    caller's, converted as the full checks convert it (a key does not tell ``-0.0``
    from ``0.0``; so a zero epsilon is never bound)."""

    __slots__ = ("G", "before", "engine", "reuse", "rows", "shape")

    def __init__(self, engine, G, before, shape):
        self.engine, self.G, self.before, self.shape = engine, G, before, shape
        self.rows = (-1, shape[-1])
        self.reuse = plans.Reuse()

    def __call__(self, x, gate, weight, bias, out, epsilon):
        arrays = (x, gate, weight, bias, out)
        if out is None:
            y = np.empty(self.shape, x.dtype)
        elif self.reuse.serve(arrays, out):
            return out
        elif not out.flags.writeable or plans.shares(out, x, (gate, weight) if bias is None
                                                      else (gate, weight, bias)):
            return None
        else:
            y = out
        rows = self.rows
        args = (x.reshape(rows), gate.reshape(rows), y.reshape(rows), weight, bias, self.G,
                float(epsilon), self.before, None)
        self.engine.gated_rms(*args)
        if out is not None and args[6] and x.nbytes <= plans.REUSE_MAX_BYTES:
            self.reuse.offer(arrays, lambda: partial(self.engine.gated_rms, *args))
        return y


def gated_rms_normalization_backward(dY, x, gate, weight, bias=None, *, epsilon=1e-6,
                                     group_size=None, norm_before_gate=True, engine,
                                     path=None):
    """Spec layer of :func:`normkernels.gated_rms_normalization_backward`."""
    label = BACKWARD
    arrays = _checked(label, {"x": x, "dY": dY, "gate": gate, "weight": weight,
                              "bias": bias}, "x", ("weight", "bias"))
    x, z = arrays["x"], arrays["gate"]
    eps = common.check_epsilon(label, epsilon)
    before = _as_bool(label, "norm_before_gate", norm_before_gate)
    G = _group(label, group_size, x.shape[-1])
    dx, dz = np.empty(x.shape, x.dtype), np.empty(x.shape, x.dtype)
    K = x.shape[-1]
    if x.size:
        dw, db, _ = engine.gated_rms_backward(_rows(arrays["dY"]), _rows(x), _rows(z),
                                              arrays["weight"], arrays.get("bias"), G, eps,
                                              before, dx.reshape(-1, K), dz.reshape(-1, K),
                                              path)
    else:
        dw, db = np.zeros(K), np.zeros(K)
    grads = (dx, dz, round_once(dw, x.dtype))
    return grads if bias is None else (*grads, round_once(db, x.dtype))

"""ONNX MeanVarianceNormalization-9/-13 (spec layer).

``Y = (X - E[X]) / (sqrt(E[(X - E[X])^2]) + 1e-9)`` with the expectations over
``axes`` (default ``[0, 2, 3]``: per channel of a 4-D NCHW tensor). There is no
epsilon attribute: the function body adds the constant 1e-9 to the standard deviation
(not to the variance), so a constant group gives 0. Version 13 adds bfloat16.

Where the body and normkernels differ (docs/guide/groups.md): the body's
variance is ``E[x^2] - E[x]^2`` in T (negative, then NaN, when it cancels); here it is
the centred float64 variance of the package's moments kernels. The body type-checks
only for float32 (its ``Add`` of T and a float32 constant); normkernels runs every T of
the schema as float32 does: statistics in float64, ``1 / (std + 1e-9)`` in float64
(so the 1e-9 keeps its meaning for float16, where it is below the smallest
subnormal), the normalize in the compute dtype (float64 for float64 X, else float32),
rounded once to T.

``axes`` as ReduceMean takes them: each in [-r, r-1], no repeats; an empty list
reduces every axis (ReduceMean's default). The reduced and kept axes are run as the
per-channel moments and normalize loops of BatchNormalization when the kept axes are
consecutive (``[0, 2, 3]`` of NCHW, trailing axes, leading axes); any other pattern
is transposed into a contiguous copy first.
"""

import math
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from normkernels.dtypes import FLOAT64, compute_dtype, storage_view
from normkernels.ops import common, plans
from normkernels.ops.common import ALL_FLOATS, NO_BF16

OP = "MeanVarianceNormalization"
EPSILON = 1e-9  # the body's constant, added to the standard deviation
DEFAULT_AXES = (0, 2, 3)


@dataclass(frozen=True)
class Version(common.Version):
    dtypes: tuple = ALL_FLOATS


VERSIONS = {
    9: Version(9, {"axes": DEFAULT_AXES}, dtypes=NO_BF16),
    13: Version(13, {"axes": DEFAULT_AXES}),
}

version_for = common.version_lookup(OP, VERSIONS)


def check_axes(label, axes, ndim):
    """``axes`` normalized to a sorted tuple of distinct axes in [0, ndim); empty means
    every axis."""
    if isinstance(axes, (str, bytes)) or not hasattr(axes, "__iter__"):
        raise TypeError(f"{label}: axes must be a sequence of integers, got "
                        f"{type(axes).__name__} {axes!r}")
    axes = tuple(axes)
    for a in axes:
        if not common.is_integer(a):
            raise TypeError(f"{label}: axes must be integers, got {a!r} in {axes}")
        if not -ndim <= a < ndim:
            raise ValueError(f"{label}: axis {a} of axes {axes} is out of range for a "
                             f"{ndim}-D X (each axis must be in [{-ndim}, {ndim - 1}])")
    resolved = tuple(sorted(int(a) % ndim for a in axes))
    if len(set(resolved)) != len(resolved):
        raise ValueError(f"{label}: axes {axes} name an axis twice")
    return resolved or tuple(range(ndim))


def fold(mean, var, dtype):
    """Per-group ``(m, a, b)`` in the compute dtype of ``dtype`` for ``y = (x - m) * a +
    b``: ``a = 1 / (sqrt(var) + 1e-9)`` in float64 rounded once; ``m`` the mean rounded
    to the compute dtype and its residual folded into ``b`` (the rule of
    :func:`normkernels.reference.fold_parameters` with scale 1 and B 0)."""
    cd = compute_dtype(dtype)
    with np.errstate(all="ignore"):
        a64 = 1.0 / (np.sqrt(var) + EPSILON)
        m = mean.astype(cd)
        if cd == FLOAT64:
            b = np.zeros(mean.shape, cd)
        else:
            residual = (mean - m.astype(np.float64)) * a64
            b = np.where(np.isfinite(m), 0.0 - residual, 0.0).astype(cd)
        return m, a64.astype(cd), b


def _runs(shape, axes):
    """``(lead, kept, trail)`` element counts when the kept axes are consecutive
    (reduced axes before and after them), else None."""
    kept = [i for i in range(len(shape)) if i not in axes]
    if kept and kept[-1] - kept[0] + 1 != len(kept):
        return None
    first = kept[0] if kept else len(shape)
    last = kept[-1] + 1 if kept else len(shape)
    return (math.prod(shape[:first]), math.prod(shape[first:last]),
            math.prod(shape[last:]))


class _Planned(NamedTuple):
    """A call over C-contiguous X (and ``out``) of one shape, dtype and axes whose kept
    axes are consecutive: the engine's direct moments step, the fold, the engine's
    scale-shift; ``out`` checked again (writeable, X itself or apart from it)."""

    moments: object  # engine.direct_moments
    scale_shift: object  # engine.direct_scale_shift

    def __call__(self, X, out):
        y = plans.own_output(X, out)
        if y is None:
            return None
        xs, ys = storage_view(X.ravel()), storage_view(y.ravel())
        if not (xs.flags.aligned and ys.flags.aligned):
            return None
        count, mean, m2 = self.moments(xs)
        self.scale_shift(xs, ys, *fold(mean, m2 / count, X.dtype))
        return y


def _plan(engine, X, y, C, S):
    """The plan of a call that passed the checks over C-contiguous X and y, or None
    (an engine without direct steps, above the serial size)."""
    if not hasattr(engine, "direct_moments"):
        return None
    xs = storage_view(X.ravel())
    steps = (engine.direct_moments(C, S, X.size),
             engine.direct_scale_shift(C, S, xs, np.empty_like(xs), compute_dtype(X.dtype)))
    return None if None in steps else _Planned(*steps)


def mean_variance_normalization(X, *, axes=None, opset=13, out=None, engine, path=None):
    """Spec layer of :func:`normkernels.mean_variance_normalization`."""
    key = None
    if path is None:
        try:  # an earlier call's plan (normkernels/ops/plans.py)
            key = (OP, engine, None if axes is None else tuple(axes), type(axes), opset,
                   type(opset), type(X), X.shape, X.strides, X.dtype, plans.out_key(out, X))
            if axes is not None:
                key += tuple(map(type, axes))
            plan = plans.get(key)
        except (AttributeError, TypeError):  # not an array, or an unhashable attribute
            key = plan = None
        if plan is not None:
            Y = plan(X, out)
            if Y is not None:
                return Y
    given = X
    version = version_for(opset)
    label = version.label(OP)
    attrs = common.resolve_attributes(label, version, {"axes": axes})
    X = common.as_array("X", X)
    common.check_dtype(label, "X", X, version.dtypes)
    if X.ndim == 0:
        raise ValueError(f"{label}: X must have at least one dimension, got a scalar")
    axes = check_axes(label, attrs["axes"], X.ndim)
    if out is not None:
        common.check_out(label, out, X, {})
    if X.size == 0:
        return np.empty_like(X) if out is None else out
    runs = _runs(X.shape, axes)
    if runs is None:  # kept axes apart: reduced axes first, kept last, in a copy
        kept = tuple(i for i in range(X.ndim) if i not in axes)
        order = axes + kept
        x = np.ascontiguousarray(X.transpose(order))
        C, S = math.prod(X.shape[i] for i in kept), 1
    else:
        order = None
        x = np.ascontiguousarray(X)
        C, S = runs[1], runs[2]
    if out is not None and order is None and out.flags.c_contiguous:
        y = out
    else:
        y = np.empty_like(x)
    count, mean, m2 = engine.channel_moments(x, C, S, path)
    m, a, b = fold(mean, m2 / count, X.dtype)
    engine.scale_shift(x, y, C, S, m, a, b, path)
    if key is not None and x is X is given and order is None and (out is None or y is out):
        plans.add(key, _plan(engine, X, y, C, S))
    if order is not None:
        y = y.transpose(np.argsort(order))
    if out is not None and y is not out:
        np.copyto(out, y)
        return out
    return y

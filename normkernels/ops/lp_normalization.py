"""ONNX LpNormalization, opsets 1 and 22 (spec layer).

``output = input / ||input||_p`` along ``axis`` (default -1), ``p`` 1 or 2 (default
2): ``||x||_1 = sum |x|``, ``||x||_2 = sqrt(sum x**2)``. Versions:

* 1: T in float16, float32, float64;
* 22: adds bfloat16.

Where normkernels decides what the spec leaves open or the reference gets wrong:

* p = 1 sums absolute values, as the formula says (the ONNX reference sums ``x ** p``
  without them: [1, -3] gives [-0.5, 1.5] there, [0.25, -0.75] here and in
  onnxruntime);
* a zero norm (every element of the vector zero) gives zeros, as the doc string says
  since onnx/onnx PR #7618 (onnxruntime and torch's ``F.normalize`` agree on exact
  zeros; torch also clamps norms below 1e-12, the spec divides by the true norm);
* the norm is accumulated and the quotient computed in float64 for every dtype,
  rounded once to T; a float64 sum of squares that overflows or underflows for a
  finite nonzero vector is recomputed from the vector scaled by a power of two
  (the loops: ``kernels/lp.py``).
"""

import math
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from normkernels.ops import common, plans, rows
from normkernels.ops.common import ALL_FLOATS, NO_BF16

OP = "LpNormalization"
P_CHOICES = (1, 2)


@dataclass(frozen=True)
class Version(common.Version):
    dtypes: tuple = NO_BF16  # allowed dtypes of T


VERSIONS = {
    1: Version(1, {"axis": -1, "p": 2}),
    22: Version(22, {"axis": -1, "p": 2}, dtypes=ALL_FLOATS),
}

version_for = common.version_lookup(OP, VERSIONS)


def check_p(label, p):
    """``p`` as a Python int: 1 or 2, the only orders the schema supports."""
    if not common.is_integer(p):
        raise TypeError(f"{label}: p must be an integer (1 or 2), got {type(p).__name__} {p!r}")
    if p not in P_CHOICES:
        raise ValueError(f"{label}: p must be 1 or 2 (the schema supports only the L1 and L2 "
                         f"norms), got {p}")
    return int(p)


def memory_order(X):
    """Axes ``order`` such that ``X.transpose(order)`` is C-contiguous, or None."""
    if X.flags.c_contiguous:
        return tuple(range(X.ndim))
    order = tuple(int(a) for a in np.argsort([-s for s in X.strides], kind="stable"))
    return order if X.transpose(order).flags.c_contiguous else None


def out_overlaps(out, X):
    """Whether ``out`` (an ndarray) shares memory with X without being X itself."""
    return (np.may_share_memory(out, X) and not common.same_view(out, X)
            and np.shares_memory(out, X))


class _Planned(NamedTuple):
    """A call with C-contiguous X (and ``out``) of one shape, dtype, axis and p: the
    engine's loop over ``(outer, K, inner)``; ``out`` checked again (writeable, X
    itself or apart from it)."""

    engine: object
    outer: int
    K: int
    inner: int
    p: int

    def __call__(self, X, out):
        Y = plans.own_output(X, out)
        if Y is None:
            return None
        self.engine.lp_normalize(X, Y, self.outer, self.K, self.inner, self.p)
        return Y


def lp_normalization(input, *, axis=None, p=None, opset=22, out=None, engine, path=None):
    """Spec layer of :func:`normkernels.lp_normalization`; ``engine.lp_normalize``
    runs the loops over X as ``(outer, K, inner)`` C-contiguous memory."""
    key = None
    if path is None:
        try:  # an earlier call's plan (normkernels/ops/plans.py)
            key = (OP, engine, axis, type(axis), p, type(p), opset, type(opset), type(input),
                   input.shape, input.strides, input.dtype, plans.out_key(out, input))
            plan = plans.get(key)
        except (AttributeError, TypeError):  # not an array, or an unhashable attribute
            key = plan = None
        if plan is not None:
            Y = plan(input, out)
            if Y is not None:
                return Y
    given = input
    version = version_for(opset)
    label = version.label(OP)
    attrs = common.resolve_attributes(label, version, {"axis": axis, "p": p})
    X = common.as_array("input", input)
    common.check_dtype(label, "input", X, version.dtypes)
    a = rows.normalized_axis(label, "axis", attrs["axis"], X.ndim)
    order_p = check_p(label, attrs["p"])
    if out is not None:
        if isinstance(out, np.ndarray) and out_overlaps(out, X):
            X = X.copy()  # out overwrites part of X: read from a copy
        common.check_out(label, out, X, {})
    if X.size == 0:
        return np.empty_like(X) if out is None else out
    order = memory_order(X)
    if order is None:  # neither C-contiguous nor a permutation of it: a copy
        X = np.ascontiguousarray(X)
        order = tuple(range(X.ndim))
    if out is not None and out.transpose(order).flags.c_contiguous:
        Y = out
    else:
        Y = np.empty_like(X)  # X's memory order
        if not Y.transpose(order).flags.c_contiguous:
            Y = np.empty(X.shape, X.dtype)
            order = tuple(range(X.ndim))
            X = np.ascontiguousarray(X)
    x, y = X.transpose(order), Y.transpose(order)
    k = order.index(a)  # the normalized axis in memory order
    outer, K, inner = math.prod(x.shape[:k]), x.shape[k], math.prod(x.shape[k + 1:])
    engine.lp_normalize(x, y, outer, K, inner, order_p, path)
    if key is not None and plans.plain((given,), (X,)) and X.flags.c_contiguous and (
            out is None or (out.flags.c_contiguous and Y is out)):
        plans.add(key, _Planned(engine, outer, K, inner, order_p))
    if out is not None and Y is not out:
        np.copyto(out, Y)
        return out
    return Y

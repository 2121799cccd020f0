"""Per-channel statistics as a public building block (spec layer).

``partial_moments`` gives the mergeable form (count, mean, M2) of one tensor;
``merge_moments`` combines two such partials (Chan's formula), so statistics of
micro-batches, chunks or workers can be combined without a second pass and without
cancellation; ``moments`` gives the mean and population variance.
"""

import functools
from typing import NamedTuple

import numpy as np

from normkernels.ops import common, plans
from normkernels.ops.common import ALL_FLOATS, FLOAT32, FLOAT64

OP = "moments"


class Moments(NamedTuple):
    """Per-channel partial statistics: element count, mean, and M2 (the sum of squared
    deviations from the mean). int64 / float64 arrays of shape (C,)."""

    count: np.ndarray
    mean: np.ndarray
    M2: np.ndarray


def partial_statistics(X, data_format, engine, op=OP, path=None):
    """:class:`Moments` of X (any float dtype, any strides), via
    ``engine.channel_moments``."""
    X = common.as_array("X", X)
    common.check_data_format(op, data_format)
    common.check_dtype(op, "X", X, ALL_FLOATS)
    if X.ndim < 1:
        raise ValueError(f"{op}: X must have at least 1 dimension, got a scalar")
    C = common.channel_count(X, data_format)
    if X.size == 0:
        return Moments(np.zeros(C, np.int64), np.zeros(C), np.zeros(C))
    return _partial(X, data_format, engine, path)


def _partial(X, data_format, engine, path=None):
    """:class:`Moments` of a checked, non-empty X."""
    Xc, C, S = common.contiguous_layout(X, data_format)
    return Moments(*engine.channel_moments(Xc, C, S, path))


def statistics(X, data_format, engine, op=OP, path=None):
    """(mean, population variance, dtype-preserving) as :func:`moments` returns them."""
    X = common.as_array("X", X)
    part = partial_statistics(X, data_format, engine, op, path)
    if part.count.size and part.count[0] == 0:
        raise ValueError(f"{op}: X has no elements along the reduced axes "
                         f"(shape {X.shape}); statistics of zero elements are undefined")
    return _finish(X, part)


def _finish(X, part):
    out_dtype = FLOAT64 if X.dtype in (FLOAT32, FLOAT64) else FLOAT32
    var = part.M2 / part.count  # M2 is a sum of squares: never negative
    return part.mean.astype(out_dtype), var.astype(out_dtype)


def moments(X, *, data_format="NCX", engine, path=None):
    """Spec layer of :func:`normkernels.moments`."""
    key = None
    if path is None:  # a plan of an earlier call with this metadata (see ops/plans.py)
        try:
            key = (OP, engine, data_format, type(data_format), type(X), X.shape, X.strides,
                   X.dtype)
            plan = plans.get(key)
        except (AttributeError, TypeError):  # not an array, or an unhashable argument
            key = plan = None
        if plan is not None:
            return plan(X)
    result = statistics(X, data_format, engine, path=path)
    if key is not None and X.size and plans.plain((X,), (common.as_array("X", X),)):
        plans.add(key, functools.partial(_planned, data_format=data_format, engine=engine))
    return result


def _planned(X, data_format, engine):
    """:func:`moments` of X whose checks its plan's key proves."""
    return _finish(X, _partial(X, data_format, engine))


def merge(a, b):
    """Chan's merge of two :class:`Moments` (or (count, mean, M2) triples)."""
    a = Moments(*(np.asarray(v) for v in a))
    b = Moments(*(np.asarray(v) for v in b))
    if a.mean.shape != b.mean.shape:
        raise ValueError(f"merge_moments: partials have shapes {a.mean.shape} and "
                         f"{b.mean.shape}; they must describe the same channels")
    n_a = a.count.astype(np.int64)
    n_b = b.count.astype(np.int64)
    n = n_a + n_b
    with np.errstate(invalid="ignore", divide="ignore"):
        w_b = np.where(n > 0, n_b / np.maximum(n, 1), 0.0)
        delta = b.mean - a.mean
        combined = np.where(np.isfinite(delta), a.mean + delta * w_b,
                            (a.mean * n_a + b.mean * n_b) / np.maximum(n, 1))  # inf means
        mean = np.where(n_a == 0, b.mean, np.where(n_b == 0, a.mean, combined))
        m2 = np.where(n_a == 0, b.M2, np.where(
            n_b == 0, a.M2, a.M2 + b.M2 + delta * delta * (n_a * w_b)))
    return Moments(n, mean.astype(np.float64), m2.astype(np.float64))

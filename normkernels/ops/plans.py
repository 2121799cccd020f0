"""Call plans: what a call worked out from its arguments' metadata, kept for the
next call with the same metadata (per-call latency of small tensors).

A public call builds a *key* from everything its checks and layout decisions
depended on: the operator and engine, every attribute with its type (``1`` and
``1.0`` and ``True`` are different keys: one of them may be an error), and each
array's type, shape, strides and dtype, plus whether ``out`` is absent, X itself
or another array. Plans are made only for calls whose arrays are exactly ndarrays in
native byte order, and never for a zero float attribute (``-0.0`` and ``0.0`` are
equal keys but not equal epsilons). The first call runs the full checks and, when they pass,
stores a plan; a later call with an equal key runs the plan, which repeats only the
checks that depend on more than the key (``out`` writeable, memory shared with an
input) and hands anything unusual back to the full path (returns None).
Execution decisions that can change between calls with equal keys (the path: the
size thresholds, ``NORMKERNELS_STREAMING``, a forked child) are made by the engine
on every call, never stored in a plan.
"""

from typing import NamedTuple

import numpy as np

from normkernels.ops import common

LIMIT = 512  # plans kept; the store is emptied when full (a model has a few dozen shapes)
_plans = {}
_ndarray = np.ndarray


def get(key):
    return _plans.get(key)


def add(key, plan):
    if plan is None:
        return
    if len(_plans) >= LIMIT:
        _plans.clear()
    _plans[key] = plan


def clear():
    _plans.clear()


def plain(given, checked):
    """Whether a call may leave a plan: its arrays are exactly ndarrays, kept as given
    by the full checks (no conversion to an array or to native byte order)."""
    return all(a is b and type(a) is _ndarray for a, b in zip(given, checked, strict=True))


def out_key(out, X):
    """``out``'s part of a key: absent, X itself, or its type, shape, strides, dtype."""
    if out is None:
        return 0
    if out is X:
        return 1
    return type(out), out.shape, out.strides, out.dtype


class Inference(NamedTuple):
    """Per-channel inference (BatchNormalization, BatchNormInference) of X with one
    memory layout: ``order`` transposes X to C-contiguous (None: X is)."""

    engine: object
    epsilon: float
    C: int
    S: int
    order: tuple
    shape: tuple
    dtype: object

    def __call__(self, X, scale, B, mean, var, out):
        if out is None:
            y = np.empty(self.shape, self.dtype) if self.order is None else np.empty_like(X)
        elif not out.flags.writeable:
            return None  # the full path raises the error
        else:
            y = out
        x, yc = X, y
        if self.order is not None:  # C-contiguous views in memory order
            x, yc = X.transpose(self.order), y.transpose(self.order)
        # guard: the engine hands back (False) a call whose out may share memory with
        # an input; the full path then decides
        if self.engine.inference(x, yc, self.C, self.S, scale, B, mean, var, self.epsilon,
                                 guard=out is not None):
            return y
        return None


def inference(engine, epsilon, X, data_format, out):
    """The :class:`Inference` plan of a call that just passed the full checks, or None
    when its layout needs the full path (a copy of X, or of Y into ``out``)."""
    if X.size == 0:
        return None
    layout = common.physical_layout(X, data_format)
    if layout is None:
        return None
    order, S = layout
    if out is not None and out is not X and not out.transpose(order).flags.c_contiguous:
        return None
    identity = order == tuple(range(X.ndim))
    return Inference(engine, epsilon, common.channel_count(X, data_format), S,
                     None if identity and X.flags.c_contiguous else order, X.shape, X.dtype)

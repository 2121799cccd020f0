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
    """The plan stored under ``key``, or None. Each operator builds its key inline
    (a function building it cost 0.4 us per call, 9% of a tiny call)."""
    return _plans.get(key)


def add(key, plan):
    if plan is None:
        return
    if len(_plans) >= LIMIT:
        _plans.clear()
    _plans[key] = plan


def clear():
    _plans.clear()


def stored_keys():
    """The keys of the plans stored now, oldest first (a copy: for tests and
    diagnostics)."""
    return list(_plans)


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


def _output(plan, X, out, params=None):
    """``(y, x, y_c)``: Y (``out`` or a new array in X's memory order) and the
    C-contiguous views the engine runs over; None when ``out`` needs the full
    checks (read-only, or sharing memory with X or one of ``params``; None: the
    engine checks sharing itself)."""
    if out is None:
        y = np.empty(plan.shape, plan.dtype) if plan.order is None else np.empty_like(X)
    elif not out.flags.writeable or (params is not None and _shares(out, X, params)):
        return None
    else:
        y = out
    if plan.order is None:
        return y, X, y
    return y, X.transpose(plan.order), y.transpose(plan.order)


def shares(out, X, params):
    """Whether ``out`` may share memory with X (other than by being X) or a parameter."""
    return _shares(out, X, params)


def _shares(out, X, params):
    if out is not X and np.may_share_memory(out, X):
        return True
    return any(np.may_share_memory(out, p) for p in params)


def _layout(X, data_format, out):
    """``(order, S)`` for a plan: ``order`` None when X is C-contiguous; None when the
    call needs the full path (an empty X, a copy of X, or of Y into ``out``)."""
    if X.size == 0:
        return None
    layout = common.physical_layout(X, data_format)
    if layout is None:
        return None
    order, S = layout
    if out is not None and out is not X and not out.transpose(order).flags.c_contiguous:
        return None
    return (None if order == tuple(range(X.ndim)) else order), S


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
        views = _output(self, X, out)
        if views is None:
            return None
        y, x, yc = views
        # guard: the engine hands back (False) a call whose out may share memory with
        # an input; the full path then decides
        if self.engine.inference(x, yc, self.C, self.S, scale, B, mean, var, self.epsilon,
                                 guard=out is not None):
            return y
        return None


def inference(engine, epsilon, X, data_format, out):
    """The :class:`Inference` plan of a call that just passed the full checks, or None
    when its layout needs the full path."""
    layout = _layout(X, data_format, out)
    if layout is None:
        return None
    return Inference(engine, epsilon, common.channel_count(X, data_format), layout[1],
                     layout[0], X.shape, X.dtype)


class Instance(NamedTuple):
    """Instance normalization of X with one memory layout (``rows``: channels last
    in memory, the engine's ``instance_rows``; else ``instance_planes``)."""

    engine: object
    epsilon: float
    N: int
    C: int
    S: int
    rows: bool
    order: tuple
    shape: tuple
    dtype: object

    def __call__(self, X, scale, B, out):
        views = _output(self, X, out, (scale, B))
        if views is None:
            return None
        y, x, yc = views
        if self.rows:
            self.engine.instance_rows(x, yc, self.N, self.C, scale, B, self.epsilon)
        else:
            self.engine.instance_planes(x, yc, self.C, self.S, scale, B, self.epsilon)
        return y


def instance(engine, epsilon, X, data_format, out, spatial):
    """The :class:`Instance` plan of a call that just passed the full checks, or None."""
    layout = _layout(X, data_format, out)
    if layout is None:
        return None
    order, S = layout
    return Instance(engine, epsilon, X.shape[0], common.channel_count(X, data_format), S,
                    S != spatial, order, X.shape, X.dtype)


class Checked(NamedTuple):
    """A call whose argument checks its key proves, run by ``run(X, *params, out)``
    (the operator's code after its checks): only ``out`` is checked again."""

    run: object

    def __call__(self, X, *params_and_out):
        *params, out = params_and_out
        if out is not None and (not out.flags.writeable or _shares(out, X, params)):
            return None
        return self.run(X, *params_and_out)

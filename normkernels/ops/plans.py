"""Call plans: what a call worked out from its arguments' metadata, kept for the
next call with the same metadata (per-call latency of small tensors).

A public call builds a *key* from everything its checks and layout decisions
depended on: the operator and engine, every attribute with its type (``1`` and
``1.0`` and ``True`` are different keys: one of them may be an error), and each
array's type, shape, strides and dtype, plus whether ``out`` is absent, X itself
or another array. Plans are made only for calls whose arrays are exactly ndarrays in
native byte order, and never for a zero float attribute (``-0.0`` and ``0.0`` are
equal keys but not equal epsilons) unless the key holds its ``float.hex()``
(BatchNormalization's momentum). The first call runs the full checks and, when they pass,
stores a plan; a later call with an equal key runs the plan, which repeats only the
checks that depend on more than the key (``out`` writeable, memory shared with an
input) and hands anything unusual back to the full path (returns None).
Execution decisions that can change between calls with equal keys (the path: the
size thresholds, ``NORMKERNELS_STREAMING``, a forked child) are made by the engine
on every call, never stored in a plan.

A network calls each layer with its own buffers, the same objects at every pass
(and often many layers with one shape, so one plan). A plan whose single output is
``out`` therefore keeps a :class:`Reuse`: when calls keep passing the very same
array objects (``is``, not equal metadata; the third planned call), it binds them as
:func:`normkernels.bind` would, and later calls with those objects run the bound
call (checking only that ``out`` is still writeable). As with ``bind``, a call of a
serial size stays one compiled serial call (safe in any process); above it the path
is still decided per call. The same
objects with the same key have the same memory, strides and overlaps, which is all
the full checks looked at; their contents are read at every call. Nothing is held
from a first sighting (weak references); arrays above ``REUSE_MAX_BYTES`` are never
bound (their call costs far more than the checks), and the bound calls, which keep
their arrays alive, are capped per plan and in bytes over all plans.
"""

import contextlib
import threading
import weakref
from typing import NamedTuple

import numpy as np

from normkernels.ops import common

LIMIT = 512  # plans kept; the store is emptied when full (a model has a few dozen shapes)
_plans = {}
_ndarray = np.ndarray


def get(key):
    """The plan stored under ``key``, or None. Each operator builds its key inline
    (a function building it cost 0.4 us per call, 9% of a tiny call)."""
    plan = _plans.get(key)
    if _recording and plan is not None:
        return _recorded(plan)
    return plan


# normkernels.bind: per thread, while it binds a call, the plans that call runs
_recording = {}


def _recorded(plan):
    """``plan``, or in a thread that records (:func:`recording`) a call of it that notes
    the plan, its arguments and its result."""
    ran = _recording.get(threading.get_ident())
    if ran is None:
        return plan

    def call(*args):
        ran.depth += 1
        try:
            result = plan(*args)
        finally:
            ran.depth -= 1
        if not ran.depth:  # not a plan another plan runs
            ran.append((plan, args, result))
        return result

    return call


class _Ran(list):
    __slots__ = ("depth",)


@contextlib.contextmanager
def recording():
    """Within: the list of ``(plan, arguments, result)`` of every plan this thread's
    calls run, not counting the plans a plan runs (:func:`normkernels.bind` binds a
    call its plan serves)."""
    ran, ident = _Ran(), threading.get_ident()
    ran.depth = 0
    _recording[ident] = ran
    try:
        yield ran
    finally:
        del _recording[ident]


def serve(key, *args):
    """The result of the plan stored under ``key`` for ``args``, or None (no plan, or
    the plan hands the call to the full path). ``key`` is built by a function and may
    hold an unhashable attribute: no plan then."""
    try:
        plan = get(key)
    except TypeError:
        return None
    return None if plan is None else plan(*args)


def add(key, plan):
    if plan is None:
        return
    if len(_plans) >= LIMIT:
        clear()
    try:
        _plans[key] = plan
    except TypeError:  # an unhashable attribute: no plan
        pass


def clear():
    """Forget every plan (and with them the arrays of their bound calls)."""
    _plans.clear()
    _held[0] = 0


# Bound calls: arrays above REUSE_MAX_BYTES are never bound; a plan keeps at most
# REUSE_ENTRIES bound array sets (a network's layers of one shape: dozens) and
# REUSE_SEEN sightings, and stops looking after REUSE_STRIKES (see Reuse); all plans
# together hold at most REUSE_BUDGET_BYTES of arrays alive (:func:`clear` lets them go).
REUSE_MAX_BYTES = 1 << 22
REUSE_ENTRIES = 128
REUSE_SEEN = 256
REUSE_STRIKES = 16
REUSE_BUDGET_BYTES = 1 << 28
_held = [0]  # bytes of X and out the bound calls hold (approximate under threads)


class Reuse:
    """The bound calls of a plan's recurring arrays (see the module's docstring).

    Entries are keyed by the ``id`` of every array of the call: a bound entry holds
    its arrays, so while it lives no other object has those ids, and an equal key is
    the very same objects. Before that, a call's ids are remembered (ids alone: cheap,
    but a temporary's id is reused once it is freed), then, when they come again,
    its arrays weakly, and the third time, if the weak references still give these
    very objects, they are bound. Each time they do not (temporaries whose ids came
    back) is a strike; after ``REUSE_STRIKES`` the plan stops looking, so a caller
    that passes new arrays every time pays one comparison a call."""

    __slots__ = ("entries", "seen", "strikes")

    def __init__(self):
        self.entries = {}
        self.seen = {}
        self.strikes = 0

    def bound(self, arrays):
        """The bound call of exactly these array objects, or None."""
        entries = self.entries
        if not entries:
            return None
        entry = entries.get(tuple(map(id, arrays)))
        return None if entry is None else entry[1]

    def serve(self, arrays, out):
        """Run the bound call of exactly these arrays into ``out``; False when there is
        none, or when ``out`` is read-only now (the planned call then hands it to the
        full checks)."""
        call = self.bound(arrays)
        if call is None or not out.flags.writeable:
            return False
        call()
        return True

    def offer(self, arrays, bind):
        """After a full planned call over ``arrays``: a step towards binding them
        (``bind()``: a zero-argument callable, or None when they do not bind)."""
        if self.strikes >= REUSE_STRIKES:
            return
        ids = tuple(map(id, arrays))
        seen = self.seen
        refs = seen.get(ids)
        if refs is None:  # first sighting: the ids
            if len(seen) >= REUSE_SEEN:
                seen.clear()
            seen[ids] = ()
            return
        if refs and all((a is None) if r is None else (r() is a)
                        for r, a in zip(refs, arrays, strict=True)):
            del seen[ids]
            self._bind(ids, arrays, bind)
            return
        if refs:  # other objects under the same ids: temporaries
            self.strikes += 1
        seen[ids] = tuple(None if a is None else weakref.ref(a) for a in arrays)

    def _bind(self, ids, arrays, bind):
        size = sum(a.nbytes for a in arrays if a is not None)
        if len(self.entries) >= REUSE_ENTRIES:
            self.release()
        if _held[0] + size > REUSE_BUDGET_BYTES:
            return
        call = bind()
        if call is not None:
            self.entries[ids] = (arrays, call, size)
            _held[0] += size

    def release(self):
        """Forget the bound calls (and the arrays they hold)."""
        entries, self.entries = self.entries, {}
        _held[0] -= sum(entry[2] for entry in entries.values())


def reusable(X, out, engine):
    """Whether a call may be bound for reuse: ``out`` given, X small enough, and an
    engine that binds."""
    return out is not None and X.nbytes <= REUSE_MAX_BYTES and hasattr(engine, "bind_rows")


def stored_keys():
    """The keys of the plans stored now, oldest first (a copy: for tests and
    diagnostics)."""
    return list(_plans)


def bound_calls():
    """How many bound calls the stored plans hold now (for tests and diagnostics)."""
    return sum(len(plan.reuse.entries) for plan in _plans.values()
               if isinstance(getattr(plan, "reuse", None), Reuse))


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


def output(plan, X, out, params=None):
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


def own_output(X, out):
    """Y of a planned call that writes X's shape and dtype elementwise from X alone:
    ``out`` (writeable, X itself or apart from it) or a new array like X; None when
    ``out`` needs the full checks."""
    if out is None:
        return np.empty_like(X)
    if not out.flags.writeable or (out is not X and np.may_share_memory(out, X)):
        return None
    return out


def shares(out, X, params):
    """Whether ``out`` may share memory with X (other than by being X) or a parameter."""
    return _shares(out, X, params)


def _shares(out, X, params):
    if out is not X and np.may_share_memory(out, X):
        return True
    return any(np.may_share_memory(out, p) for p in params)


def layout(X, data_format, out):
    """``(order, S)`` for a plan: ``order`` None when X is C-contiguous; None when the
    call needs the full path (an empty X, a copy of X, or of Y into ``out``)."""
    if X.size == 0:
        return None
    found = common.physical_layout(X, data_format)
    if found is None:
        return None
    order, S = found
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
    reuse: Reuse

    def __call__(self, X, scale, B, mean, var, out):
        arrays = (X, scale, B, mean, var, out)
        if self.reuse.serve(arrays, out):
            return out
        views = output(self, X, out)
        if views is None:
            return None
        y, x, yc = views
        # guard: the engine hands back (False) a call whose out may share memory with
        # an input; the full path then decides
        if not self.engine.inference(x, yc, self.C, self.S, scale, B, mean, var,
                                     self.epsilon, guard=out is not None):
            return None
        if reusable(X, out, self.engine):
            self.reuse.offer(arrays, lambda: self.engine.bind_inference(
                x, yc, self.C, self.S, scale, B, mean, var, self.epsilon))
        return y


def inference(engine, epsilon, X, data_format, out):
    """The :class:`Inference` plan of a call that just passed the full checks, or None
    when its layout needs the full path."""
    found = layout(X, data_format, out)
    if found is None:
        return None
    return Inference(engine, epsilon, common.channel_count(X, data_format), found[1],
                     found[0], X.shape, X.dtype, Reuse())


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
    reuse: Reuse
    group: int = 1  # channels per group (GroupNormalization); 1: instance normalization
    act: object = None  # the activation epilogue's name (GroupNormalization's); None: none
    count: int = 0  # elements per group; with it the call returns (Y, mean, inv_std)

    def __call__(self, X, scale, B, out):
        arrays = (X, scale, B, out)
        if not self.count and self.reuse.serve(arrays, out):
            return out
        views = output(self, X, out, (scale, B))
        if views is None:
            return None
        y, x, yc = views
        if self.rows:
            stats = self.engine.instance_rows(x, yc, self.N, self.C, scale, B, self.epsilon,
                                              group=self.group, act=self.act)
        else:
            stats = self.engine.instance_planes(x, yc, self.C, self.S, scale, B, self.epsilon,
                                                group=self.group, act=self.act)
            if not self.count and reusable(X, out, self.engine):
                self.reuse.offer(arrays, lambda: self.engine.bind_instance_planes(
                    x, yc, self.C, self.S, scale, B, self.epsilon, self.group, self.act))
        if not self.count:
            return y
        mean, m2 = stats  # as the full path's statistics=True
        with np.errstate(all="ignore"):
            inv_std = 1.0 / np.sqrt(m2 / self.count + self.epsilon)
        return y, mean.reshape(self.N, -1), inv_std.reshape(self.N, -1)


def instance(engine, epsilon, X, data_format, out, spatial, group=1, act=None,
             statistics=False):
    """The :class:`Instance` plan of a call that just passed the full checks (``group``
    channels per group: GroupNormalization; ``act`` its activation; ``statistics``: it
    returns the statistics too), or None."""
    found = layout(X, data_format, out)
    if found is None:
        return None
    order, S = found
    return Instance(engine, epsilon, X.shape[0], common.channel_count(X, data_format), S,
                    S != spatial, order, X.shape, X.dtype, Reuse(), group, act,
                    group * spatial if statistics else 0)


class Checked(NamedTuple):
    """A call whose argument checks its key proves, run by ``run(X, *params, out)``
    (the operator's code after its checks): only ``out`` is checked again."""

    run: object

    def __call__(self, X, *params_and_out):
        *params, out = params_and_out
        if out is not None and (not out.flags.writeable or _shares(out, X, params)):
            return None
        return self.run(X, *params_and_out)

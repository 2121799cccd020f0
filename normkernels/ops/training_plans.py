"""Call plans of the training and backward calls (per-call latency of small tensors;
the inference plans and what every plan must honour: :mod:`normkernels.ops.plans`).

A training or backward call is several steps (statistics, a fold in float64, a pass
writing Y or dX); at a few thousand elements each step's Python, not its arithmetic,
was the call. A plan here holds the engine's direct steps for its sizes
(``direct_*`` of :class:`normkernels.engine.numba_direct.DirectSteps`: the serial
kernels of the engine's own methods at that size, so a planned call gives the full
path's bits) and runs them in the order the full path does. The plan is made only
where every step has a direct form (a serial size, an engine that has them; the rows
backward calls the engine above it); else there is none (BatchNormalization's
training keeps its checked plan, :class:`normkernels.ops.plans.Checked`). A training
plan switches to its one-call kernel after ``FUSE_AFTER`` calls (see there); the
BatchNormalization, instance and group backward plans run the full path's one-call
kernel from their first call (the full path compiled it).

A planned call checks again what its key does not prove: ``out`` writeable and apart
from the inputs, and the arrays aligned (the kernels' entry points were compiled for
aligned arrays; an unaligned one takes the full path).
"""

import contextlib
from typing import NamedTuple

import numpy as np

from normkernels.dtypes import storage_view
from normkernels.ops import common, plans, rows


def aligned(*arrays):
    """Whether every array is aligned (what a compiled entry point assumes)."""
    for a in arrays:
        if not a.flags.aligned:
            return False
    return True


# Planned calls a training plan serves step by step before it compiles its
# one-call kernel (kernels/training_small.py): a second or tenth
# call does not pay the compile (about a second per dtype on an empty cache;
# milliseconds from the disk cache), a training loop's small layers do from the
# FUSE_AFTER-th on (the warm-up compiles it: fusing()). The two give the same bits.
FUSE_AFTER = 64


class _Fusing:
    """A plan whose step is the engine's direct steps for its first ``FUSE_AFTER``
    served calls, then its fused direct step (``fuse()`` makes it; its first run
    compiles it or loads it from the disk cache)."""

    __slots__ = ("calls", "fuse", "run")

    def __init__(self, run, fuse):
        self.run, self.fuse, self.calls = run, fuse, 0

    def current(self):
        """The step of this served call."""
        if self.fuse is not None and self.calls >= FUSE_AFTER:
            self.run, self.fuse = self.fuse(), None
        self.calls += 1
        return self.run


class BatchTraining(_Fusing):
    """Per-channel training (BatchNormalization's, oneDNN's forward training) of X with
    one memory layout: the batch statistics and Y from them (the engine's direct step:
    step by step, then after ``FUSE_AFTER`` calls in one compiled call, as the
    backward plans), then the operator's outputs by ``finish(Y, batch_mean, batch_var,
    input_mean, input_var)``."""

    __slots__ = ("dtype", "epsilon", "finish", "order", "shape")

    def __init__(self, epsilon, run, fuse, finish, order, shape, dtype):
        super().__init__(run, fuse)
        self.epsilon, self.finish, self.order, self.shape, self.dtype = (epsilon, finish, order,
                                                                         shape, dtype)

    def __call__(self, X, scale, B, input_mean, input_var, out):
        views = plans.output(self, X, out, (scale, B, input_mean, input_var))
        if views is None:
            return None
        y, x, yc = views
        xs, ys = storage_view(x.ravel()), storage_view(yc.ravel())
        s, b = storage_view(scale), storage_view(B)
        if not aligned(xs, ys, s, b):
            return None
        mean, var = self.current()(xs, ys, s, b, self.epsilon)
        return self.finish(y, mean, var, input_mean, input_var)

    def bind(self, X, scale, B, input_mean, input_var, out):
        """This plan's call for fixed arrays (:func:`normkernels.bind`): the views and
        checks made once; each call runs the step and ``finish`` (None: the full
        path's, ``out`` made read-only since)."""
        views = plans.output(self, X, out, (scale, B, input_mean, input_var))
        if views is None:
            return None
        y, x, yc = views
        args = (storage_view(x.ravel()), storage_view(yc.ravel()), storage_view(scale),
                storage_view(B), self.epsilon)
        if not aligned(*args[:4]):
            return None

        def call():
            if not y.flags.writeable:
                return None
            mean, var = self.current()(*args)
            return self.finish(y, mean, var, input_mean, input_var)

        return call


def batch_training(engine, epsilon, X, scale, B, data_format, out, finish):
    """The :class:`BatchTraining` plan of a training call that just passed the checks
    (per-channel statistics, no epilogue), or None."""
    found = plans.layout(X, data_format, out)
    if found is None or not hasattr(engine, "direct_training"):
        return None
    order, S = found
    C = common.channel_count(X, data_format)
    x = X if order is None else X.transpose(order)
    xs = storage_view(np.ascontiguousarray(x).ravel())
    samples = (C, S, xs, np.empty_like(xs), storage_view(scale), storage_view(B))
    run = engine.direct_training(*samples)
    if run is None:
        return None
    return BatchTraining(float(epsilon), run, lambda: engine.direct_training(*samples, True),
                         finish, order, X.shape, X.dtype)


def _gradient_views(X, dY, out, order, params):
    """``(dX, xs, dys, dxs)`` of a planned backward call: dX (``out``, or new in X's
    memory order) and the flat storage views of X, dY and dX in the kernels' order;
    None when the full path must decide (``out`` read-only or sharing memory with an
    input, an array not aligned)."""
    if out is not None and (not out.flags.writeable or plans.shares(out, X, (dY, *params))):
        return None
    dX = np.empty_like(X) if out is None else out
    views = [storage_view((a if order is None else a.transpose(order)).ravel())
             for a in (X, dY, dX)]
    if not aligned(*views, *params):
        return None
    return (dX, *views)


def _gradient_layout(engine, step, X, dY, data_format, out):
    """``(order, S)`` of a backward plan's layout, or None (the full path's: another
    layout, dY in another memory order, an engine without the direct ``step``)."""
    found = plans.layout(X, data_format, out)
    if found is None or not hasattr(engine, step):
        return None
    if not (dY if found[0] is None else dY.transpose(found[0])).flags.c_contiguous:
        return None
    return found


def channel_key(label, engine, epsilon, training, data_format, dY, X, scale, mean, var,
                inv_std, out):
    """The plan key of a BatchNormalization backward call (None: not arrays; it may hold
    an unhashable attribute, :func:`normkernels.ops.plans.serve` finds no plan for it;
    :mod:`normkernels.ops.plans` says what a key holds)."""
    try:
        key = (label, engine, epsilon, type(epsilon), training, type(training), data_format,
               type(data_format), type(dY), dY.shape, dY.strides, dY.dtype,
               type(X), X.shape, X.strides, X.dtype,
               type(scale), scale.shape, scale.strides, scale.dtype,
               type(mean), mean.shape, mean.strides, mean.dtype,
               None if var is None else (type(var), var.shape, var.strides, var.dtype),
               None if inv_std is None else (type(inv_std), inv_std.shape, inv_std.strides,
                                             inv_std.dtype),
               plans.out_key(out, X))
    except AttributeError:  # not arrays
        return None
    return key


class ChannelBackward(NamedTuple):
    """BatchNormalization's training backward of X with one memory layout: the full
    path's one-call kernel, through the engine's direct step at a serial size, else the
    engine's ``channel_backward`` (None there: the streaming path); dscale and dB in
    the parameters' dtype."""

    epsilon: float
    order: tuple
    C: int
    pdtype: object
    run: object  # engine.direct_channel_backward
    serial: bool  # run is the direct step (it never hands the call back)

    def __call__(self, dY, X, scale, mean, var, inv_std, out):
        stats, C = var if inv_std is None else inv_std, self.C
        views = _gradient_views(X, dY, out, self.order, (scale, mean, stats))
        if views is None:
            return None
        dX, xs, dys, dxs = views
        sums = self.run(xs, dys, dxs, scale.reshape(C), mean.reshape(C), stats.reshape(C),
                        inv_std is None, self.epsilon)
        if sums is None:  # the streaming path: the full path's steps
            return None
        return dX, sums[0].astype(self.pdtype), sums[1].astype(self.pdtype)

    def bind(self, dY, X, scale, mean, var, inv_std, out):
        """This plan's call for fixed arrays (:func:`normkernels.bind`) at a serial size:
        views, dX and checks made once; the parameters read at each call. None above
        it (the plan itself is then bound)."""
        stats, C = var if inv_std is None else inv_std, self.C
        views = self.serial and _gradient_views(X, dY, out, self.order, (scale, mean, stats))
        if not views:
            return None
        dX, *arrays = views
        args = (*arrays, scale.reshape(C), mean.reshape(C), stats.reshape(C), inv_std is None,
                self.epsilon)
        return _bound(self.run, args, dX, self.pdtype)


def _bound(run, args, dX, pdtype, finish=None):
    """A bound backward call: ``run(*args)``'s parameter gradients (``finish`` applied)
    in ``pdtype`` with dX; None (the full path's: it raises) when dX was made
    read-only."""

    def call():
        if not dX.flags.writeable:
            return None
        dscale, dB = run(*args) if finish is None else finish(*run(*args))
        return dX, dscale.astype(pdtype), dB.astype(pdtype)

    return call


def channel_backward(engine, epsilon, dY, X, scale, data_format, out):
    """The :class:`ChannelBackward` plan of BatchNormalization's training backward that
    just passed the checks, or None (another layout, no direct step)."""
    found = _gradient_layout(engine, "direct_channel_backward", X, dY, data_format, out)
    if found is None:
        return None
    order, S = found
    C = common.channel_count(X, data_format)
    run = engine.direct_channel_backward(C, S, X.size, X.dtype)
    serial = run is not None
    if not serial:  # above the serial size: the engine's call decides the path

        def run(xs, dys, dxs, scale, mean, stats, is_var, epsilon):
            return engine.channel_backward(xs, dys, dxs, C, S, scale, mean, stats, is_var,
                                           epsilon)
    return ChannelBackward(float(epsilon), order, C, scale.dtype, run, serial)


def group_key(label, engine, num_groups, epsilon, data_format, dY, X, scale, mean, inv_std,
              out):
    """The plan key of an instance or group normalization backward call, or None."""
    try:
        return (label, engine, num_groups, type(num_groups), epsilon, type(epsilon),
                data_format, type(data_format), type(dY), dY.shape, dY.strides, dY.dtype,
                type(X), X.shape, X.strides, X.dtype,
                type(scale), scale.shape, scale.strides, scale.dtype,
                None if mean is None else (type(mean), mean.shape, mean.dtype),
                None if inv_std is None else (type(inv_std), inv_std.shape, inv_std.dtype),
                plans.out_key(out, X))
    except AttributeError:  # not arrays
        return None


class GroupBackward(NamedTuple):
    """The instance and group normalization backward of X with one memory layout: the
    full path's one-call kernel (per view, the whole tensor in channels-first memory
    or each sample in channels-last memory: the statistics given or recomputed with
    the sums, the coefficients, the dX pass), through the engine's direct step at a
    serial size, else the engine's ``group_backward`` (None there: the streaming path,
    the full path's steps)."""

    epsilon: float
    order: tuple
    C: int
    pdtype: object
    run: object  # (xs, dys, dxs, scale, epsilon, given) -> (dscale, dB) or None
    serial: bool  # run is the direct step (it never hands the call back)

    def __call__(self, dY, X, scale, mean, inv_std, out):
        given = None
        if inv_std is not None:  # and mean: the key holds both shapes the checks passed
            if type(mean) is not np.ndarray or type(inv_std) is not np.ndarray:
                return None
            given = _given(mean, inv_std)
        views = _gradient_views(X, dY, out, self.order, (scale,))
        if views is None:
            return None
        dX, xs, dys, dxs = views
        sums = self.run(xs, dys, dxs, scale.reshape(self.C), self.epsilon, given)
        if sums is None:
            return None
        return dX, sums[0].astype(self.pdtype), sums[1].astype(self.pdtype)

    def bind(self, dY, X, scale, mean, inv_std, out):
        """As :meth:`ChannelBackward.bind` (the given statistics read at each call)."""
        views = self.serial and _gradient_views(X, dY, out, self.order, (scale,))
        if not views or not (inv_std is None or type(mean) is type(inv_std) is np.ndarray):
            return None
        dX, xs, dys, dxs = views
        run, s, eps = self.run, scale.reshape(self.C), self.epsilon
        if inv_std is None:
            return _bound(run, (xs, dys, dxs, s, eps, None), dX, self.pdtype)
        return _bound(lambda: run(xs, dys, dxs, s, eps, _given(mean, inv_std)), (), dX,
                      self.pdtype)


def _given(mean, inv_std):
    """The given statistics as the one-call kernels take them: flat float64."""
    return mean.astype(np.float64).ravel(), inv_std.astype(np.float64).ravel()


def group_backward(engine, epsilon, dY, X, scale, group, data_format, out, mean=None,
                   inv_std=None):
    """The :class:`GroupBackward` plan of an instance or group normalization backward
    (``group`` channels a group; ``mean`` and ``inv_std`` as the call gave them) that
    just passed the checks, or None."""
    found = _gradient_layout(engine, "direct_group_backward", X, dY, data_format, out)
    if found is None or not (inv_std is None or type(mean) is type(inv_std) is np.ndarray):
        return None
    order, S = found
    C, N = common.channel_count(X, data_format), X.shape[0]
    if S * N * C == X.size:  # channels-first memory: one view of N * C planes
        views, planes = 1, N * C
    else:  # channels-last memory: a view per sample, rows of C columns
        views, planes, S = N, C, 1
    run = engine.direct_group_backward(views, planes, S, group, C, X.size, X.dtype,
                                       inv_std is not None)
    serial = run is not None
    if not serial:  # above the serial size: the engine's call decides the path

        def run(xs, dys, dxs, scale, epsilon, given):
            return engine.group_backward(xs, dys, dxs, views, planes, S, group, C, scale,
                                         epsilon, given)
    return GroupBackward(float(epsilon), order, C, scale.dtype, run, serial)


def rows_key(label, engine, axis, epsilon, dY, X, scale, out):
    """The plan key of a LayerNormalization or RMSNormalization backward call, or None."""
    try:
        return (label, engine, axis, type(axis), epsilon, type(epsilon),
                type(dY), dY.shape, dY.strides, dY.dtype, type(X), X.shape, X.strides, X.dtype,
                type(scale), scale.shape, scale.strides, scale.dtype, plans.out_key(out, X))
    except AttributeError:  # not arrays
        return None


class RowsBackward(NamedTuple):
    """The LayerNormalization and RMSNormalization backward of C-contiguous X with the
    statistics recomputed: the engine's direct ``rows_backward`` step, the parameter
    gradients summed to the scale's shape (``sum_to``, unless it is the normalized
    span's)."""

    run: object  # engine.direct_rows_backward
    K: int
    span: tuple
    pshape: tuple
    pdtype: object
    sum_to: object

    serial: bool  # run is the direct step

    def __call__(self, dY, X, scale, out):
        views = _gradient_views(X, dY, out, None, (scale,))
        if views is None:
            return None
        dX, xs, dys, dxs = views
        dgamma, dbeta = self._sums(*self.run(xs, dys, dxs, self._gamma(scale)))
        return dX, dgamma.astype(self.pdtype), dbeta.astype(self.pdtype)

    def bind(self, dY, X, scale, out):
        """As :meth:`ChannelBackward.bind` (the scale read at each call)."""
        views = self.serial and _gradient_views(X, dY, out, None, (scale,))
        if not views:
            return None
        dX, xs, dys, dxs = views
        run, gamma = self.run, self._gamma
        return _bound(lambda: run(xs, dys, dxs, gamma(scale)), (), dX, self.pdtype, self._sums)

    def _gamma(self, scale):
        """The scale as the kernels take it: ``K`` float64 values, broadcast to the span."""
        if self.sum_to is None:  # the scale has the span's shape: its values in order
            return scale.astype(np.float64).reshape(self.K)
        return np.ascontiguousarray(np.broadcast_to(scale.astype(np.float64), self.span)
                                    ).reshape(self.K)

    def _sums(self, dgamma, dbeta):
        """The kernels' float64 sums over the span, summed to the scale's shape."""
        if self.sum_to is None:
            return dgamma.reshape(self.pshape), dbeta.reshape(self.pshape)
        return (self.sum_to(dgamma.reshape(self.span), self.pshape),
                self.sum_to(dbeta.reshape(self.span), self.pshape))


def rows_backward(engine, centered, epsilon, dY, X, scale, M, K, span, out):
    """The :class:`RowsBackward` plan of a row normalization's backward that just passed
    the checks, or None (X, dY or ``out`` not C-contiguous, an engine without direct
    steps)."""
    if (not (X.flags.c_contiguous and dY.flags.c_contiguous
             and (out is None or out.flags.c_contiguous))
            or not hasattr(engine, "direct_rows_backward")):
        return None
    run = engine.direct_rows_backward(M, K, centered, epsilon)
    serial = run is not None
    if not serial and M * K:  # above the serial size: the engine's call, its path per call
        def run(xs, dys, dxs, gamma):
            return engine.rows_backward(xs.reshape(M, K), dys.reshape(M, K), dxs.reshape(M, K),
                                        gamma, centered, epsilon)
    return RowsBackward(run, K, span, scale.shape, scale.dtype,
                        None if scale.shape == tuple(span) else rows.sum_to, serial)


@contextlib.contextmanager
def fusing():
    """Within: a backward plan serves its first planned call (a second call of equal
    metadata) fused (the warm-up compiles the one-call kernels so that no later call
    does)."""
    global FUSE_AFTER
    saved, FUSE_AFTER = FUSE_AFTER, 0
    try:
        yield
    finally:
        FUSE_AFTER = saved

"""The Numba engine's direct steps (a mixin of
:class:`normkernels.engine.numba_engine.NumbaEngine`): the pieces of a small training
or backward call, prepared once for its sizes by a call plan
(:mod:`normkernels.ops.training_plans`) and then run as the very serial kernels the
engine's own methods launch at that size, in the same order, so a planned call gives
the full path's bits. Each ``direct_*`` method returns None where it has no direct
form (above the serial size, an empty tensor): the plan then runs the engine's
methods.

What a direct step saves is Python, not arithmetic: the engine methods resolve the
path, pick the loop, report the route and size their partials on every call (a few
microseconds each, most of a call on a few thousand elements); here all of that is
decided once. Kernels whose arguments are arrays and numbers are called through their
dispatchers (typing them costs about 0.1 us an array); a kernel that takes an
activation marker or None is called through its compiled entry point (typing those
costs 2 us), with arrays its caller guarantees aligned and writeable (storage views).
The training step also has a fused form (``fused=True``): the same kernels composed
into one compiled call (:mod:`normkernels.kernels.training_small`), which a plan
switches to after ``training_plans.FUSE_AFTER`` calls. The backward steps are the
engine's own one-call kernels (:mod:`normkernels.kernels.backward_small`, the full
path's compiled function, called through its entry point).
"""

import numpy as np

from normkernels.dtypes import FLOAT64, compute_dtype
from normkernels.engine import policy
from normkernels.engine.lazy import lazy
from normkernels.engine.numba_bind import entry_point
from normkernels.engine.numba_gradients import float64_table
from normkernels.engine.numba_launch import parameter_tables
from normkernels.kernels.activations import NONE

# kernel modules: imported at first use (engine/lazy.py)
backward_dx = lazy(__name__, "backward_dx")
backward_sums = lazy(__name__, "backward_sums")
small = lazy(__name__, "small", "backward_small")
training = lazy(__name__, "training", "training_small")
inference = lazy(__name__, "inference")
loops = lazy(__name__, "loops", "scale_shift")
reductions = lazy(__name__, "reductions", "statistics")


def _serial(size):
    """Whether every step of a call over ``size`` elements runs serially in the
    engine's own methods (the thresholds of ``policy.choose_path`` for each)."""
    return 0 < size <= min(policy.SERIAL_MAX_ELEMENTS, policy.NORMALIZE_SERIAL_MAX_ELEMENTS)


def _entry(kernel, entry, args):
    """``kernel``'s entry point for the types of ``args``, found at the first run and
    kept in ``entry`` (a plan's later runs pass arguments of the same types: its key
    fixes the arrays' dtypes and shapes, the plan checks them aligned and hands
    storage views, writeable, to the kernel)."""
    if not entry:
        entry.append(entry_point(kernel, args))
    return entry[0]


_NO_STATS = np.empty(0)  # given_mean and given_r of a group backward that recomputes


def _tag(planes):
    """The route tag of :mod:`normkernels.kernels.backward_small` for a loop by planes
    (True) or by rows."""
    return small.PLANES if planes else small.ROWS


class DirectSteps:
    def direct_moments(self, C, S, size):
        """``run(xs) -> (count, mean, m2)``: :meth:`channel_moments` of ``size``
        elements on the serial path."""
        if not _serial(size):
            return None
        if C == 1:
            S = size  # one channel: the whole tensor is one plane (as channel_moments)
        n_rows = size // (C * S)
        if policy.use_plane_moments(S, n_rows):
            parts = size // S * -(-S // reductions.PLANE_CHUNK)
            partials, merge = reductions.plane_partials_serial, reductions.merge_planes

            def run(xs):
                count, mean, m2 = np.zeros(C, np.int64), np.zeros(C), np.zeros(C)
                part_mean, part_m2 = np.empty(parts), np.empty(parts)
                partials(xs, S, part_mean, part_m2)
                merge(part_mean, part_m2, C, S, count, mean, m2)
                return count, mean, m2
            return run
        period = C * S
        width = period * -(-policy.MIN_ROW_COLUMNS // period)
        wide = size // width * width
        # the two row_moments calls of channel_moments: whole wide rows, then the rest
        steps = [(lo, hi, P, policy.rows_per_block(P, reductions.COLUMN_TILE))
                 for lo, hi, P in ((0, wide, width), (wide, size, period)) if hi > lo]
        partials, merge = reductions.row_partials_serial, reductions.merge_rows_serial

        def run(xs):
            count, mean, m2 = np.zeros(C, np.int64), np.zeros(C), np.zeros(C)
            for lo, hi, P, rows in steps:
                n_rows = (hi - lo) // P
                blocks = -(-n_rows // rows)
                part_mean, part_m2 = np.empty((blocks, P)), np.empty((blocks, P))
                partials(xs[lo:hi], P, n_rows, rows, part_mean, part_m2)
                merge(part_mean, part_m2, n_rows, rows, C, S, count, mean, m2)
            return count, mean, m2
        return run

    def direct_normalize(self, C, S, xs, ys, scale, B):
        """``run(xs, ys, scale, B, mean, var, epsilon)``: :meth:`inference` on the
        serial path (no guard, no epilogue) over arrays of the types of the samples
        (flat storage views, aligned and writeable; float64 mean and var)."""
        size = xs.size
        if not _serial(size):
            return None
        stats = np.empty(C)
        period = policy.inference_period(C, S, xs.itemsize, size)
        if period == 0:
            run = entry_point(inference.normalize_planes_serial,
                              (xs, ys, C, S, scale, B, stats, stats, 1.0, False, None, NONE))
            return lambda xs, ys, scale, B, mean, var, eps: run(
                xs, ys, C, S, scale, B, mean, var, eps, False, None, NONE)
        run = entry_point(inference.normalize_periodic_serial,
                          (xs, ys, C, S, scale, B, stats, stats, 1.0, period, False, None, NONE))
        return lambda xs, ys, scale, B, mean, var, eps: run(
            xs, ys, C, S, scale, B, mean, var, eps, period, False, None, NONE)

    def direct_scale_shift(self, C, S, xs, ys, cd):
        """``run(xs, ys, m, a, b)``: :meth:`scale_shift` on the serial path (no
        epilogue) over flat storage views of the types of the samples (aligned and
        writeable) with coefficients of the compute dtype ``cd``."""
        if not _serial(xs.size):
            return None
        v = np.empty(C, cd)
        if policy.use_planes(C, S, v.itemsize):
            run = entry_point(loops.scale_shift_planes_serial,
                              (xs, ys, C, S, v, v, v, None, NONE))
            return lambda xs, ys, m, a, b: run(xs, ys, C, S, m, a, b, None, NONE)
        period = policy.table_period(C, S)[0]
        run = entry_point(loops.scale_shift_periodic_serial,
                          (xs, ys, period, v, v, v, None, NONE))

        def periodic(xs, ys, m, a, b):
            _, mt, at, bt = parameter_tables(C, S, m, a, b)
            run(xs, ys, period, mt, at, bt, None, NONE)
        return periodic

    def direct_training(self, C, S, xs, ys, scale, B, fused=False):
        """``run(xs, ys, scale, B, epsilon) -> (mean, var)``: per-channel training's
        :meth:`channel_moments`, ``var = M2 / count`` and :meth:`inference` with the
        float64 batch statistics, on the serial path (flat storage views and parameters
        of the types of the samples, aligned and writeable). ``fused``: in one compiled
        call (:func:`normkernels.kernels.training_small.batch_training`), else step by
        step."""
        size = xs.size
        moments = self.direct_moments(C, S, size)
        normalize = self.direct_normalize(C, S, xs, ys, scale, B)
        if moments is None or normalize is None:
            return None
        if not fused:
            def steps(xs, ys, scale, B, epsilon):
                count, mean, m2 = moments(xs)
                var = m2 / count  # population variance (divide by N)
                normalize(xs, ys, scale, B, mean, var, epsilon)
                return mean, var
            return steps
        Sm = size if C == 1 else S  # as channel_moments
        rows = not policy.use_plane_moments(Sm, size // (C * Sm))
        steps = np.zeros((0, 4), np.int64)
        if rows:  # channel_moments' two row_moments calls: whole wide rows, then the rest
            period = C * Sm
            width = period * -(-policy.MIN_ROW_COLUMNS // period)
            wide = size // width * width
            steps = np.array([(lo, hi, P, policy.rows_per_block(P, reductions.COLUMN_TILE))
                              for lo, hi, P in ((0, wide, width), (wide, size, period))
                              if hi > lo], np.int64).reshape(-1, 4)
        period = policy.inference_period(C, S, xs.itemsize, size)
        args = (C, S, Sm, _tag(not rows), steps, _tag(period == 0), period, NONE)
        kernel, entry = training.batch_training, []

        def run(xs, ys, scale, B, epsilon):
            mean, var = np.empty(C), np.empty(C)
            call = (xs, ys, *args[:3], scale, B, epsilon, *args[3:], mean, var)
            _entry(kernel, entry, call)(*call)
            return mean, var
        return run

    def direct_rows_backward(self, M, K, centered, epsilon):
        """``run(xs, dys, dxs, gamma) -> (dgamma, dbeta)``: :meth:`rows_backward` of
        ``M`` rows of ``K`` (flat storage views; float64 ``gamma`` of ``K``), the
        statistics recomputed, on the serial path."""
        if not _serial(M * K):
            return None
        items, rows_per_item = backward_dx.row_items(M, K)  # rows_backward's work items
        kernel, stats, eps = backward_dx.rows_backward_serial, np.empty((0, 2)), float(epsilon)

        def run(xs, dys, dxs, gamma):
            part_g, part_b = np.empty((items, K)), np.empty((items, K))
            kernel(xs, dys, dxs, K, gamma, centered, eps, stats, rows_per_item, part_g, part_b)
            return part_g.sum(axis=0), part_b.sum(axis=0)
        return run

    def direct_channel_backward(self, C, S, size, dtype):
        """``run(xs, dys, dxs, scale, mean, stats, is_var, epsilon) -> (dscale, dB)``:
        BatchNormalization's training backward as the engine's :meth:`channel_backward`
        runs it on the serial path, the same compiled call (flat storage views of X, dY,
        dX; the parameters as given, ``C`` values each, read as float64 as the engine
        passes them; float64 dscale and dB)."""
        if not _serial(size):
            return None
        n_rows = size // (C * S)
        cd = compute_dtype(dtype)
        tags = (_tag(backward_sums.sums_by_planes(C, S, n_rows)),
                _tag(backward_sums.by_planes(S, n_rows)), small.SERIAL)
        residual, like, kernel, entry = cd != FLOAT64, np.empty(0, cd), small.channel_backward, []

        def run(xs, dys, dxs, scale, mean, stats, is_var, epsilon):
            dscale, dB = np.empty(C), np.empty(C)
            args = (xs, dys, dxs, C, S, *map(float64_table, (scale, mean, stats)), is_var,
                    epsilon, *tags, residual, like, dscale, dB)
            _entry(kernel, entry, args)(*args)
            return dscale, dB
        return run

    def direct_group_backward(self, views, planes, S, group, C, size, dtype, given=False):
        """``run(xs, dys, dxs, scale, epsilon, stats) -> (dscale, dB)``: the instance/group
        backward as the engine's :meth:`group_backward` runs it on the serial path, the
        same compiled call (``views`` views of ``planes`` planes of ``S``, or with ``S``
        1 rows of ``planes`` columns; ``group`` planes a group, ``C`` channels;
        ``scale`` as given; with ``given`` the statistics ``stats``, float64 ``(mean,
        r)`` per (view, group), else recomputed and ``stats`` None)."""
        if not _serial(size):
            return None
        n_rows = size // views // (planes * S)  # rows of planes * S (S 1: of the columns)
        cd = compute_dtype(dtype)
        if given:
            sums = backward_sums.sums_by_planes(planes, S, n_rows)
        else:  # the one reduction: rows for a channels-last sample
            sums = not (S == 1 and n_rows > 1)
        tags = (small.GIVEN if given else small.RECOMPUTED, _tag(sums),
                _tag(backward_sums.by_planes(S, n_rows)), small.SERIAL)
        residual, like, kernel, entry = cd != FLOAT64, np.empty(0, cd), small.group_backward, []

        def run(xs, dys, dxs, scale, epsilon, stats):
            dscale, dB = np.empty(C), np.empty(C)
            mean, r = (_NO_STATS, _NO_STATS) if stats is None else stats
            args = (xs, dys, dxs, views, planes, S, group, C, float64_table(scale), epsilon,
                    mean, r, *tags, residual, like, dscale, dB)
            _entry(kernel, entry, args)(*args)
            return dscale, dB
        return run

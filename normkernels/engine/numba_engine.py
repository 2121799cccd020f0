"""The Numba engine: orchestration of the kernels per operator family.

Each method resolves the path once (:func:`policy.resolve_path`: the caller's, or
one chosen by size; serial in a forked child), picks the loop by the rules of
:mod:`normkernels.engine.policy`, reports the route it takes, and launches kernels
under :func:`threads.launch_guard`. Parallel kernels have one-thread twins (same
source, same bits) that run on the serial path. The launch sequences several
methods share (the scale-shift loops, the per-channel statistics) are in
:mod:`normkernels.engine.numba_launch`.
"""

import numpy as np

from normkernels.dtypes import (
    FLOAT32,
    FLOAT64,
    compute_dtype,
    row_compute_dtype,
    storage_view,
)
from normkernels.engine import Engine, policy
from normkernels.engine.lazy import lazy
from normkernels.engine.numba_bind import BoundCalls
from normkernels.engine.numba_direct import DirectSteps
from normkernels.engine.numba_gated import GatedLoops
from normkernels.engine.numba_gradients import EpilogueGradientLoops, grad_sums
from normkernels.engine.numba_launch import (
    add_skip,
    column,
    flat_rows,
    in_place_add,
    kernel_for,
    nothing,
    plane_moments,
    row_epilogue,
    row_moments,
    sample_moments,
    scale_shift_loops,
    table_free,
)
from normkernels.engine.numba_quantized import QuantizedLoops
from normkernels.engine.policy import took
from normkernels.engine.threads import launch_guard
from normkernels.kernels.activations import NONE, marker
from normkernels.kernels.options import MIN_PLANE, VECTOR_BYTES

# kernel modules: imported at first use (engine/lazy.py)
backward_dx = lazy(__name__, "backward_dx")
backward_sums = lazy(__name__, "backward_sums")
fused_add = lazy(__name__, "fused_add")
inference = lazy(__name__, "inference")
instance = lazy(__name__, "instance")
rows = lazy(__name__, "rows")
lp_kernels = lazy(__name__, "lp_kernels", "lp")
lrn_kernels = lazy(__name__, "lrn_kernels", "lrn")
split = lazy(__name__, "split", "rows_split")
skip_kernels = lazy(__name__, "skip_kernels", "skip_sums")
reductions = lazy(__name__, "reductions", "statistics")


def _views(x, y):
    # ravel: a view of C-contiguous x and y (the engine's contract), and cheaper than
    # reshape(-1) (per-call latency)
    return storage_view(x.ravel()), storage_view(y.ravel())


class NumbaEngine(BoundCalls, DirectSteps, EpilogueGradientLoops, GatedLoops, QuantizedLoops,
                  Engine):
    """:class:`normkernels.engine.Engine` on the Numba kernels."""

    name = "numba"

    def inference(self, x, y, C, S, scale, B, mean, var, epsilon, path=None, guard=False,
                  act=NONE, res=None):
        act = marker(act)
        xs, ys = _views(x, y)
        rs = None if res is None else storage_view(res.reshape(-1))
        sv = storage_view
        params = sv(scale), sv(B), sv(mean), sv(var)
        path = policy.resolve_path(ys, path, policy.NORMALIZE_SERIAL_MAX_ELEMENTS,
                                   asleep_rule=True)
        if path == "serial":  # one compiled call: guard, fold, tables, loop (per-call latency)
            period = policy.inference_period(C, S, x.itemsize, ys.size)
            if period == 0:
                return inference.normalize_planes_serial(xs, ys, C, S, *params, epsilon, guard,
                                                         rs, act)
            return inference.normalize_periodic_serial(xs, ys, C, S, *params, epsilon, period,
                                                       guard, rs, act)
        if guard and inference.shares_input(xs, ys, *params):
            return False
        cd = compute_dtype(x.dtype)
        m, a, b = np.empty(C, cd), np.empty(C, cd), np.empty(C, cd)
        inference.fold(*params, epsilon, m, a, b)
        with launch_guard(path):
            scale_shift_loops(xs, ys, C, S, m, a, b, path, act, rs)
        return True

    def running(self, previous, batch, momentum, dtype):
        if dtype != FLOAT32 and dtype != FLOAT64:  # 16-bit: rounded once from float64
            return super().running(previous, batch, momentum, dtype)
        out = np.empty(batch.shape, dtype)
        inference.running(storage_view(previous), batch, momentum, out)
        return out

    def scale_shift(self, x, y, C, S, mean, a, b, path=None, act=NONE, res=None):
        if not (x.flags.c_contiguous and y.flags.c_contiguous):
            raise ValueError("scale_shift: x and y must be C-contiguous")
        xs, ys = _views(x, y)
        path = policy.resolve_path(ys, path)
        with launch_guard(path):
            scale_shift_loops(xs, ys, C, S, mean, a, b, path, marker(act),
                              None if res is None else storage_view(res.reshape(-1)))

    def channel_moments(self, x, C, S, path=None):
        if not x.flags.c_contiguous:
            raise ValueError("channel_moments: x must be C-contiguous")
        xs = storage_view(x.reshape(-1))
        count, mean, m2 = np.zeros(C, np.int64), np.zeros(C), np.zeros(C)
        if C == 1:
            S = xs.size  # one channel: the whole tensor is one plane
        path = "serial" if policy.resolve_path(xs, path) == "serial" else "parallel"
        n_rows = xs.size // (C * S)
        if policy.use_plane_moments(S, n_rows):
            took("moments", "planes", path)
            plane_moments(xs, C, S, count, mean, m2, path)
            return count, mean, m2
        took("moments", "rows", path)
        period = C * S
        width = period * -(-policy.MIN_ROW_COLUMNS // period)
        wide_rows = xs.size // width
        row_moments(xs[:wide_rows * width], width, C, S, count, mean, m2, path)
        row_moments(xs[wide_rows * width:], period, C, S, count, mean, m2, path)
        return count, mean, m2

    def skip_sums(self, x, skip, bias, dest, K, rows_per_skip, skip_rows, per_column, C,
                  path=None):
        xs, ds, ss = storage_view(x), storage_view(dest), storage_view(skip)
        table = np.full(K if per_column else C, -0.0, row_compute_dtype(x.dtype))
        if bias is not None:
            table[:] = bias  # the float64 or float32 value of each bias entry (exact)
        path = policy.resolve_path(ds, path)
        rows_per_item = max(1, skip_kernels.ITEM_ELEMENTS // K)
        with launch_guard(path):
            kernel_for(skip_kernels.skip_sums, skip_kernels.skip_sums_serial, path)(
                xs, ss, table, ds, K, rows_per_skip, skip_rows, 0 if per_column else C,
                rows_per_item)

    def gated_sums(self, x, residual, gate, dest, K, rows_per_gate, path=None):
        xs, rs, ds = storage_view(x), storage_view(residual), storage_view(dest)
        table = np.asarray(gate, row_compute_dtype(x.dtype)).ravel()  # exact for float32
        path = policy.resolve_path(ds, path)
        with launch_guard(path):
            kernel_for(skip_kernels.gated_sums, skip_kernels.gated_sums_serial, path)(
                xs, rs, table, ds, K, rows_per_gate, max(1, skip_kernels.ITEM_ELEMENTS // K))

    def instance_planes(self, x, y, C, S, scale, B, epsilon, path=None, group=1, act=NONE,
                        res=None):
        act = marker(act)
        xs, ys = _views(x, y)
        rs = None if res is None else storage_view(res.reshape(-1))
        n_planes = xs.size // S
        n_groups = n_planes // group
        size = group * S  # elements per group: its planes are contiguous
        cd = compute_dtype(x.dtype)
        mean, m2 = np.empty(n_groups), np.empty(n_groups)
        m, a, b = np.empty(n_planes, cd), np.empty(n_planes, cd), np.empty(n_planes, cd)
        # parameters per (n, c) (scale.size == N * C, ada_group_norm): the kernels' channel
        # of plane p is p % C, so C = the plane count makes it the plane itself
        per = n_planes if scale.size == n_planes else C
        args = (per, group, S, storage_view(scale), storage_view(B), float(epsilon), mean, m2,
                m, a, b, rs, act)
        path = policy.resolve_path(ys, path)
        fused = "fused" if S >= MIN_PLANE else "fused-short"
        if policy.split_instance_planes(n_groups, size, xs.itemsize, path):
            took("instance_planes", "split")
            plane_moments(xs, n_groups, size, np.zeros(n_groups, np.int64), mean, m2,
                           "parallel")
            instance.fold_planes(per, group, size, *args[3:6], mean, m2, m, a, b)
            self.scale_shift(x, y, n_planes, S, m, a, b, path, act, res)
        elif path == "serial":
            took("instance_planes", fused, "serial")
            instance.fused_planes_serial(xs, ys, *args)
        elif path == "streaming" and S >= MIN_PLANE:
            took("instance_planes", "fused", "streaming")
            with launch_guard(path):
                instance.fused_planes_streaming(xs, ys, *args)
        else:
            took("instance_planes", fused, "parallel")
            with launch_guard(path):
                instance.fused_planes_parallel(xs, ys, *args)
        return mean, m2

    def instance_rows(self, x, y, N, C, scale, B, epsilon, path=None, group=1, act=NONE,
                      res=None):
        act = marker(act)
        xs, ys = _views(x, y)
        rs = None if res is None else storage_view(res.reshape(-1))
        R = xs.size // (N * C)
        path = policy.resolve_path(ys, path)
        one = "serial" if path == "serial" else "parallel"  # the statistics' path
        n_groups = N * C // group
        mean, m2 = np.empty(n_groups), np.empty(n_groups)
        cd = compute_dtype(x.dtype)
        m, a, b = np.empty(N * C, cd), np.empty(N * C, cd), np.empty(N * C, cd)
        params = (storage_view(scale), storage_view(B), float(epsilon))
        if R * C >= policy.SAMPLE_CALL_MIN_ELEMENTS:
            # sample by sample: its statistics, then its normalize while the sample is
            # still in the last-level cache (the same partials, so the same bits)
            took("instance_rows", "per-sample")
            G = C // group
            x2, y2 = x.reshape(N, R * C), y.reshape(N, R * C)
            for n in range(N):
                cs, gs = slice(n * C, (n + 1) * C), slice(n * G, (n + 1) * G)
                sample_moments(storage_view(x2[n]), 1, C, R, group, mean[gs], m2[gs], one,
                               batch=N)
                sample = params if scale.size == C else (params[0][cs], params[1][cs],
                                                        params[2])  # per (n, c)
                instance.fold_planes(C, group, R * group, *sample, mean[gs], m2[gs], m[cs],
                                     a[cs], b[cs])
                self.scale_shift(x2[n], y2[n], C, 1, m[cs], a[cs], b[cs], path, act,
                                 None if res is None else res.reshape(N, R * C)[n])
            return mean, m2
        sample_moments(xs, N, C, R, group, mean, m2, one)
        instance.fold_planes(C if scale.size == C else N * C, group, R * group, *params, mean,
                             m2, m, a, b)
        took("instance_rows", "one-launch", one)
        rows = policy.sample_normalize_rows(N, C, R)
        with launch_guard(one):
            kernel_for(instance.normalize_rows, instance.normalize_rows_serial, one)(
                xs, ys, C, R, rows, m, a, b, rs, act)
        return mean, m2

    def normalize_rows(self, x, y, scale, B, epsilon, centered, skip=None, bias=None,
                       sums=None, path=None, act=NONE, res=None, rounding="once"):
        M, K = x.shape
        (xs, xr), (ys, yr) = flat_rows(x), flat_rows(y)
        epilogue = row_epilogue(act, res, rounding)
        s = column(scale)
        b = s[:0] if B is None else column(B)  # empty: none
        mean, var = np.empty(M), np.empty(M)
        epsilon = float(epsilon)
        path = policy.resolve_path(ys, path)
        if (in_place_add(x, y, scale, B, skip, bias, sums, act, res)
                and not policy.split_rows(M, K, path)):  # no column tables, no aliasing
            took("rows", "fused add", path)
            args = (xs, xr, storage_view(skip).ravel(), K, s, b, epsilon, centered,
                    rounding == "llama", mean, var)
            if path == "serial":
                fused_add.fused_add_rows_serial(*args)
            else:
                with launch_guard(path):
                    fused_add.fused_add_rows_parallel(*args, policy.rows_per_item(M, K))
            return mean, var
        if path == "serial" and table_free(x, y, skip, sums, act, res):
            took("rows", "table-free", path)
            kernel = fused_add.plain_rows_serial if centered else fused_add.plain_rms_rows_serial
            kernel(xs, xr, ys, yr, K, s, b, epsilon, rounding == "llama", mean, var)
            return mean, var
        if policy.split_rows(M, K, path):
            took("rows", "split", path)
            if skip is not None:  # few rows: the sums in NumPy, then as without skip
                target = sums if sums is not None else np.empty(x.shape, x.dtype)
                add_skip(x, skip, bias, target)
                xs, xr = flat_rows(target)
            chunks = -(-K // reductions.PLANE_CHUNK)
            part_mean, part_m2 = np.empty((M, chunks)), np.empty((M, chunks))
            with launch_guard(path):
                if centered:
                    split.moment_partials(xs, xr, K, part_mean, part_m2)
                else:
                    split.square_partials(xs, xr, K, part_m2)
            split.merge_partials(part_mean, part_m2, K, centered, mean, var)
            kernel = split.normalize_streaming if path == "streaming" else split.normalize_parallel
            with launch_guard(path):
                kernel(xs, xr, ys, yr, K, policy.SPLIT_RUN, s, b, epsilon, centered, mean, var,
                       *epilogue)
            return mean, var
        # "none" is an empty array of its own: a slice of X would be read-only when X is,
        # and the kernel (typed for writing into sums) would not compile
        none = nothing(xs.dtype)
        if skip is None:  # the serial kernels take None (they compile without skip code)
            skip_s, bias_t = None, s[:0]
        else:
            skip_s = storage_view(skip).ravel()
            bias_t = s[:0] if bias is None else column(bias)
        sums_s = none if sums is None else storage_view(sums).ravel()
        took("rows", "fused", path)
        if path == "serial":
            kernel = rows.rows_serial if centered else rows.rms_rows_serial
            kernel(xs, xr, ys, yr, K, s, b, epsilon, mean, var, skip_s, bias_t, sums_s,
                   *epilogue)
        else:  # the parallel ones an empty array: one compile for both
            kernel = rows.rows_streaming if path == "streaming" else rows.rows_parallel
            with launch_guard(path):
                kernel(xs, xr, ys, yr, K, s, b, epsilon, centered, policy.rows_per_item(M, K),
                       mean, var, none if skip_s is None else skip_s, bias_t, sums_s,
                       *epilogue)
        return mean, var

    def rows_from_statistics(self, x, y, scale, B, epsilon, centered, mean, var, path=None,
                             act=NONE, res=None):
        K = x.shape[1]
        epilogue = row_epilogue(act, res)
        (xs, xr), (ys, yr) = flat_rows(x), flat_rows(y)
        s = column(scale)
        b = s[:0] if B is None else column(B)
        mean = np.ascontiguousarray(mean, dtype=np.float64)
        var = np.ascontiguousarray(var, dtype=np.float64)
        path = policy.resolve_path(ys, path)
        took("rows", "from-statistics", path)
        if path == "serial":
            kernel = split.normalize_serial
        else:
            kernel = split.normalize_streaming if path == "streaming" else split.normalize_parallel
        with launch_guard(path):
            kernel(xs, xr, ys, yr, K, policy.SPLIT_RUN, s, b, float(epsilon), centered, mean,
                   var, *epilogue)


    def lp_normalize(self, x, y, outer, K, inner, p, path=None):
        # No streaming variant: each vector is read twice (sum, scale), the second time
        # from cache; "streaming" runs the parallel kernels.
        xs, ys = _views(x, y)
        path = policy.resolve_path(ys, path)
        one = "serial" if path == "serial" else "parallel"
        with launch_guard(one):
            if inner == 1:
                took("lp", "rows", one)
                kernel_for(lp_kernels.rows_parallel, lp_kernels.rows_serial, one)(
                    xs, ys, K, p, policy.rows_per_item(outer, K))
            else:
                took("lp", "columns", one)
                chunk = min(inner, lp_kernels.COLUMN_CHUNK)
                kernel_for(lp_kernels.columns_parallel, lp_kernels.columns_serial, one)(
                    xs, ys, outer, K, inner, p, chunk, policy.rows_per_item(outer, K * chunk))

    def lrn(self, x, y, C, S, size, alpha, beta, bias, path=None):
        xs, ys = _views(x, y)
        path = policy.resolve_path(ys, path)
        one = "serial" if path == "serial" else "parallel"  # no streaming variant
        # the kernels' window size: beyond 2C + 1 every window holds all the channels
        # (and a huge size would loop over empty shifts); coef keeps the true size
        window = min(int(size), 2 * C + 1)
        # beta = 0.75 as sqrt(b) * sqrt(sqrt(b)) for narrower X only (kernels/lrn.py)
        args = (window, float(alpha) / int(size), float(bias), float(beta),
                beta == 0.75 and x.dtype != FLOAT64)
        with launch_guard(one):
            if S == 1:  # channels-last memory: rows of C contiguous channels
                took("lrn", "rows", one)
                kernel_for(lrn_kernels.rows_parallel, lrn_kernels.rows_serial, one)(
                    xs, ys, C, policy.rows_per_item(xs.size // C, C), *args)
            else:
                took("lrn", "planes", one)
                N = xs.size // (C * S)
                kernel_for(lrn_kernels.planes_parallel, lrn_kernels.planes_serial, one)(
                    xs, ys, C, S, policy.lrn_chunk(N, C, S), *args)

    def channel_grad_sums(self, x, dy, C, S, mean, path=None):
        xs, dys = _views(x, dy)
        return grad_sums("grad_sums", backward_sums, xs, dys, C, S, mean, path)

    def group_grad_sums(self, x, dy, planes, S, group, path=None):
        n_rows = x.size // planes
        if S == 1 and n_rows > 1:  # a channels-last sample: rows of the planes (columns)
            rows = backward_sums.block_rows(n_rows, planes)
            route, shape, sizes = "fused-rows", (-(-n_rows // rows), planes), (rows, n_rows)
            kernels = (backward_sums.row_moment_sums, backward_sums.row_moment_sums_serial,
                       backward_sums.merge_row_group_sums)
            args = (planes, rows)
        else:  # planes, in chunks; short planes too (one pass beat the two reductions
            # of the base engine at every shape measured, 1.4-2.8x: docs/design.md)
            route, shape, sizes = "fused-planes", planes * -(-S // reductions.PLANE_CHUNK), (S,)
            kernels = (backward_sums.plane_moment_sums, backward_sums.plane_moment_sums_serial,
                       backward_sums.merge_group_sums)
            args = (S,)
        xs, dys = _views(x, dy)
        parts = [np.empty(shape) for _ in range(4)]
        count, mean, m2 = (np.empty(planes // group) for _ in range(3))
        total1, total2 = np.empty(planes), np.empty(planes)
        path = "serial" if policy.resolve_path(xs, path) == "serial" else "parallel"
        took("grad_sums", route, path)
        with launch_guard(path):
            kernel_for(kernels[0], kernels[1], path)(xs, dys, *args, *parts)
        kernels[2](*parts, *sizes, group, count, mean, m2, total1, total2)
        return count, mean, m2, total1, total2

    def grad_apply(self, x, dy, dx, C, S, m, a, b, k, path=None):
        xs, dys = _views(x, dy)
        dxs = storage_view(dx.ravel())
        path = policy.resolve_path(dxs, path, arrays=3)  # X and dY read, dX written
        with launch_guard(path):
            if backward_sums.by_planes(S, xs.size // (C * S)):
                took("grad_apply", "planes", path)
                kernel = (backward_dx.apply_planes_streaming if path == "streaming" else
                          kernel_for(backward_dx.apply_planes, backward_dx.apply_planes_serial,
                                     path))
                kernel(xs, dys, dxs, C, S, m, a, b, k)
            else:
                took("grad_apply", "rows", path)
                P = C * S
                rows = backward_sums.block_rows(xs.size // P, P)
                if path == "streaming":  # tables wrapped by a vector's lanes
                    lanes = VECTOR_BYTES // dxs.itemsize
                    tables = [np.resize(np.repeat(v, S), P + lanes) for v in (m, a, b, k)]
                    backward_dx.apply_rows_streaming(xs, dys, dxs, P, rows, *tables)
                else:
                    tables = [np.repeat(v, S) for v in (m, a, b, k)]
                    kernel_for(backward_dx.apply_rows, backward_dx.apply_rows_serial, path)(
                        xs, dys, dxs, P, rows, *tables)

    def rows_backward(self, x, dy, dx, gamma, centered, epsilon, stats=None, path=None):
        M, K = x.shape
        stats = np.empty((0, 2)) if stats is None else np.ascontiguousarray(stats, np.float64)
        xs, dys = _views(x, dy)
        dxs = storage_view(dx.ravel())
        gamma = storage_view(gamma)  # writeable: one type whether or not the caller's is
        items, rows_per_item = backward_dx.row_items(M, K)
        part_g, part_b = np.empty((items, K)), np.empty((items, K))
        path = "serial" if policy.resolve_path(dxs, path) == "serial" else "parallel"
        took("rows_backward", path)
        with launch_guard(path):
            kernel_for(backward_dx.rows_backward, backward_dx.rows_backward_serial, path)(
                xs, dys, dxs, K, gamma, centered, float(epsilon), stats, rows_per_item, part_g,
                part_b)
        return part_g.sum(axis=0), part_b.sum(axis=0)


ENGINE = NumbaEngine()

"""The Numba engine's elementwise gradients of the fused epilogues (a mixin of
:class:`normkernels.engine.numba_engine.NumbaEngine`): an activation's derivative, ReLU's
mask, and the gated residual of adaptive LayerNorm; the group backward's
coefficients (one compiled call); and the BatchNorm, instance and group backward in
one compiled call (``channel_backward``, ``group_backward``: the kernels of
:mod:`normkernels.kernels.backward_small`, reporting the ``grad_sums`` and
``grad_apply`` routes their loops take). Routes (``policy.took``):
``activation_grad/<path>``, ``relu_mask/<path>``, ``gated_backward/<path>``, path serial
or parallel (:func:`normkernels.engine.numba_gated.launch`: none has a streaming loop,
the streaming path runs the parallel kernel)."""

import itertools

import numpy as np

from normkernels.dtypes import FLOAT64, compute_dtype, storage_view
from normkernels.engine import policy
from normkernels.engine.lazy import lazy
from normkernels.engine.numba_gated import launch
from normkernels.engine.numba_launch import kernel_for
from normkernels.engine.policy import took
from normkernels.engine.threads import launch_guard
from normkernels.kernels.activations import marker

# kernel modules: imported at first use (engine/lazy.py)
activation_grad = lazy(__name__, "activation_grad")
epilogue_grad = lazy(__name__, "epilogue_grad")
backward_dx = lazy(__name__, "backward_dx")
skip_kernels = lazy(__name__, "skip_kernels", "skip_sums")
backward_sums = lazy(__name__, "backward_sums")
small = lazy(__name__, "small", "backward_small")


def _fused_path(dxs, path):
    """The threads tag of a one-call backward, None for the streaming path (whose dX
    loop the one-call kernels do not have: the caller runs the steps)."""
    path = policy.resolve_path(dxs, path, arrays=3)  # X and dY read, dX written
    if path == "streaming":
        return None, path
    return (small.SERIAL if path == "serial" else small.PARALLEL), path


_NO_STATS = np.empty(0)  # given mean and r of a group backward that recomputes them


def float64_table(v):
    """A parameter as the one-call backward kernels take it: flat float64 (its values
    exactly), one compiled type whatever the caller's dtype and flags."""
    return np.ascontiguousarray(v, np.float64).reshape(-1)


def _tags(routes):
    """``backward_small``'s route tags of booleans (True: PLANES, SERIAL, RECOMPUTED)."""
    return [small.PLANES if r else small.ROWS for r in routes]


class EpilogueGradientLoops:
    def activation_grad(self, z, dy, dz, act, path=None):
        dys = storage_view(dy.reshape(-1))
        launch("activation_grad", activation_grad.activation_grad,
               activation_grad.activation_grad_serial, dys, path, z.reshape(-1), dys,
               dz.reshape(-1), marker(act))

    def relu_mask(self, y, dy, dz, path=None):
        ys, dys, dzs = (storage_view(v.reshape(-1)) for v in (y, dy, dz))
        launch("relu_mask", activation_grad.relu_mask, activation_grad.relu_mask_serial, dys,
               path, ys, dys, dzs)

    def gated_backward(self, dln, ds, x, gate, dres, dx, K, rows_per_gate, path=None):
        xs = storage_view(x.reshape(-1))
        dss = None if ds is None else storage_view(ds.reshape(-1))
        dgate = np.zeros(x.size // rows_per_gate)
        launch("gated_backward", skip_kernels.gated_backward, skip_kernels.gated_backward_serial,
               xs, path, dln.reshape(-1), dss, xs,
               np.ascontiguousarray(gate, dln.dtype).reshape(-1), storage_view(dres.reshape(-1)),
               storage_view(dx.reshape(-1)), dgate, K, rows_per_gate)
        return dgate

    def group_coefficients(self, gamma, gmean, r, sum_dy, sum_dyx, Cg, M, dtype):
        cd = compute_dtype(dtype)
        # C-contiguous and writeable: a read-only array would be another Numba type
        f64 = [np.require(v, np.float64, ("C", "W")).reshape(-1)
               for v in (gamma, gmean, r, sum_dy, sum_dyx)]
        counts = np.empty(f64[1].size)
        counts[...] = M
        m, a, b, k = (np.empty(f64[0].size, cd) for _ in range(4))
        terms = np.empty(f64[0].size)
        backward_dx.group_coefficients(*f64, int(Cg), counts, cd != FLOAT64, m, a, b, k, terms)
        return m, a, b, k, terms


    def channel_backward(self, x, dy, dx, C, S, scale, mean, stats, is_var, epsilon,
                         path=None):
        xs, dys = storage_view(x.ravel()), storage_view(dy.ravel())
        dxs = storage_view(dx.ravel())
        par, path = _fused_path(dxs, path)
        if par is None:
            return None
        n_rows = xs.size // (C * S)
        sums, apply = (backward_sums.sums_by_planes(C, S, n_rows),
                       backward_sums.by_planes(S, n_rows))
        took("grad_sums", "planes" if sums else "rows", path)
        took("grad_apply", "planes" if apply else "rows", path)
        cd = compute_dtype(x.dtype)
        dscale, dB = np.empty(C), np.empty(C)
        with launch_guard(path):
            small.channel_backward(
                xs, dys, dxs, C, S, *map(float64_table, (scale, mean, stats)), bool(is_var),
                float(epsilon), *_tags((sums, apply)), par, cd != FLOAT64, np.empty(0, cd),
                dscale, dB)
        return dscale, dB

    def group_backward(self, x, dy, dx, views, planes, S, group, C, scale, epsilon,
                       given=None, path=None):
        xs, dys = storage_view(x.ravel()), storage_view(dy.ravel())
        dxs = storage_view(dx.ravel())
        par, path = _fused_path(dxs, path)
        if par is None:
            return None
        n_rows = xs.size // views // (planes * S)
        if given is None:  # the one reduction: rows for a channels-last sample
            sums = not (S == 1 and n_rows > 1)
            took("grad_sums", "fused-planes" if sums else "fused-rows", path)
            stats, mean, r = small.RECOMPUTED, _NO_STATS, _NO_STATS
        else:
            sums = backward_sums.sums_by_planes(planes, S, n_rows)
            took("grad_sums", "planes" if sums else "rows", path)
            stats = small.GIVEN
            mean, r = (float64_table(v) for v in given)
        apply = backward_sums.by_planes(S, n_rows)
        took("grad_apply", "planes" if apply else "rows", path)
        cd = compute_dtype(x.dtype)
        dscale, dB = np.empty(C), np.empty(C)
        with launch_guard(path):
            small.group_backward(
                xs, dys, dxs, views, planes, S, group, C, float64_table(scale), float(epsilon),
                mean, r, stats, *_tags((sums, apply)), par, cd != FLOAT64, np.empty(0, cd),
                dscale, dB)
        return dscale, dB

    def warm_backward(self, dtype):
        """Compile (or load) every route of the one-call backward kernels for X of
        ``dtype``: each combination of tags is its own compiled function, and which a
        call takes depends on its shape (a server must not compile after its warm-up)."""
        x = np.zeros(16, dtype)
        xs, cd = storage_view(x), compute_dtype(dtype)
        out, like, ones = np.empty_like(xs), np.empty(0, cd), np.ones(4)
        for sums, apply, par in itertools.product((True, False), repeat=3):
            tags = (*_tags((sums, apply)), _tags((par,))[0])
            with launch_guard("serial" if par else "parallel"):
                small.channel_backward(xs, xs, out, 4, 4, ones, ones, ones, True, 1e-5, *tags,
                                       cd != FLOAT64, like, np.empty(4), np.empty(4))
                for recomputed in (True, False):
                    small.group_backward(xs, xs, out, 1, 4, 4, 2, 4, ones, 1e-5, ones[:2],
                                         ones[:2], *_tags((recomputed,)), *tags, cd != FLOAT64,
                                         like, np.empty(4), np.empty(4))

    def _epilogue_args(self, x, xs, S, ep, rows):
        """The fused kernels' epilogue arguments: ``(act, mask, res, zm, za, zb, like)``,
        Z's coefficients per channel, or per column (``rows``: each repeated ``S``
        times); ``like``: an empty array of dZ's buffer dtype (X's storage dtype for
        ReLU and a residual alone, else the compute dtype)."""
        cd = compute_dtype(x.dtype)
        if ep.mask is not None or ep.act is None:  # Z is not read: one type for all
            ep = ep._replace(act=None, res=None, m=None)
        if ep.m is None:  # one dummy entry per table
            tables = [np.zeros(1, cd) for _ in range(3)]
        else:
            tables = [np.ascontiguousarray(np.repeat(v, S) if rows else v, cd)
                      for v in (ep.m, ep.a, ep.b)]
        narrow = ep.mask is not None or ep.act in (None, "relu")
        like = xs[:0] if narrow else np.empty(0, cd)
        views = [None if v is None else storage_view(v.reshape(-1)) for v in (ep.mask, ep.res)]
        return (marker(ep.act), *views, *tables, like)

    def epilogue_grad_sums(self, x, dy, C, S, mean, ep, path=None, out=None):
        xs, dys = storage_view(x.ravel()), storage_view(dy.ravel())
        outs = None if out is None else storage_view(out.ravel())
        rows = not backward_sums.sums_by_planes(C, S, xs.size // (C * S))
        args = (*self._epilogue_args(x, xs, S, ep, rows=rows), outs)
        return grad_sums("epilogue_sums", epilogue_grad, xs, dys, C, S, mean, path, args)

    def epilogue_grad_apply(self, x, dy, dx, dres, C, S, m, a, b, k, ep, path=None):
        xs, dys = storage_view(x.ravel()), storage_view(dy.ravel())
        dxs = storage_view(dx.ravel())
        drs = None if dres is None else storage_view(dres.ravel())
        path = policy.resolve_path(dxs, path, arrays=3)
        planes = S >= backward_sums.GRAD_MIN_PLANE
        args = self._epilogue_args(x, xs, S, ep, rows=not planes)
        if path == "streaming" and not planes:
            path = "parallel"  # the rows loop has no streaming stores
        with launch_guard(path):
            if planes:
                took("epilogue_apply", "planes", path)
                kernel = (epilogue_grad.apply_planes_streaming if path == "streaming" else
                          kernel_for(epilogue_grad.apply_planes,
                                     epilogue_grad.apply_planes_serial, path))
                kernel(xs, dys, dxs, drs, C, S, m, a, b, k, *args)
            else:
                took("epilogue_apply", "rows", path)
                P = C * S
                rows = backward_sums.block_rows(xs.size // P, P)
                tables = [np.repeat(v, S) for v in (m, a, b, k)]
                kernel_for(epilogue_grad.apply_rows, epilogue_grad.apply_rows_serial, path)(
                    xs, dys, dxs, drs, P, rows, *tables, *args)


def grad_sums(route, kernels, xs, dys, C, S, mean, path, extra=()):
    """Per-channel float64 ``(sum dy, sum dy * (x - mean[c]))`` by the reduction kernels
    of module ``kernels`` (``plane_sums``, ``row_sums`` and their one-thread twins, each
    taking ``extra`` after its partials), on the loop ``sums_by_planes`` picks; the
    partials merged in a fixed order. Reports ``<route>/<planes|rows>/<path>``."""
    total1, total2 = np.empty(C), np.empty(C)
    path = "serial" if policy.resolve_path(xs, path) == "serial" else "parallel"
    with launch_guard(path):
        if backward_sums.sums_by_planes(C, S, xs.size // (C * S)):
            took(route, "planes", path)
            part1 = np.empty(xs.size // S * -(-S // backward_sums.PLANE_CHUNK))
            part2 = np.empty_like(part1)
            kernel_for(kernels.plane_sums, kernels.plane_sums_serial, path)(
                xs, dys, C, S, mean, part1, part2, *extra)
            backward_sums.merge_plane_sums(part1, part2, C, S, total1, total2)
        else:
            took(route, "rows", path)
            P = C * S
            rows = backward_sums.block_rows(xs.size // P, P)
            blocks = -(-(xs.size // P) // rows)
            part1, part2 = np.empty((blocks, P)), np.empty((blocks, P))
            kernel_for(kernels.row_sums, kernels.row_sums_serial, path)(
                xs, dys, P, rows, np.repeat(mean, S), part1, part2, *extra)
            backward_sums.merge_row_sums(part1, part2, C, S, total1, total2)
    return total1, total2

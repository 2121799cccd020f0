"""The Numba engine's elementwise gradients of the fused epilogues (a mixin of
:class:`normkernels.engine.numba_engine.NumbaEngine`): an activation's derivative, ReLU's
mask, and the gated residual of adaptive LayerNorm; and the group backward's
coefficients (one compiled call). Routes (``policy.took``):
``activation_grad/<path>``, ``relu_mask/<path>``, ``gated_backward/<path>``, path serial
or parallel (:func:`normkernels.engine.numba_gated.launch`: none has a streaming loop,
the streaming path runs the parallel kernel)."""

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
                rows = max(1, backward_sums.ROW_BLOCK_ELEMENTS // P)
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
            rows = max(1, backward_sums.ROW_BLOCK_ELEMENTS // P)
            blocks = -(-(xs.size // P) // rows)
            part1, part2 = np.empty((blocks, P)), np.empty((blocks, P))
            kernel_for(kernels.row_sums, kernels.row_sums_serial, path)(
                xs, dys, P, rows, np.repeat(mean, S), part1, part2, *extra)
            backward_sums.merge_row_sums(part1, part2, C, S, total1, total2)
    return total1, total2

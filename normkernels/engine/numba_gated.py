"""The Numba engine's loops of the gated RMSNorm, QK-norm and AdaLN's rows (a mixin of
:class:`normkernels.engine.numba_engine.NumbaEngine`).

Arrays arrive from the spec layer as 2-D ``M x K`` views whose rows are contiguous
(any row stride); they reach the kernels as flat storage arrays with row strides
(:func:`normkernels.engine.numba_launch.flat_rows`). Routes (``policy.took``):
``gated_rms/<path>``, ``gated_rms_backward/<path>``, ``qk_norm/<path>``,
``rows/modulated/<path>``, path serial
or parallel (:func:`normkernels.engine.policy.loop_path`: streaming runs the parallel
kernel).
"""

import numpy as np

from normkernels.dtypes import FLOAT64, compute_dtype, storage_view
from normkernels.engine import policy
from normkernels.engine.lazy import lazy
from normkernels.engine.numba_launch import flat_rows, kernel_for
from normkernels.engine.policy import took
from normkernels.engine.threads import launch_guard
from normkernels.kernels.activations import NONE

# kernel modules: imported at first use (engine/lazy.py)
gated_kernels = lazy(__name__, "gated_kernels", "gated")
modulated = lazy(__name__, "modulated")
backward_dx = lazy(__name__, "backward_dx")
qk_kernels = lazy(__name__, "qk_kernels", "qk_norm")


def launch(route, parallel, serial, arr, path, *args):
    """The path for ``arr`` (:func:`policy.loop_path`), its route reported as
    ``route/<path>``, then the parallel kernel or its one-thread twin on ``args``."""
    path = policy.loop_path(arr, path)
    took(route, path)
    with launch_guard(path):
        kernel_for(parallel, serial, path)(*args)


def tables(weight, bias, dtype):
    """The column tables of ``weight`` and ``bias`` (None: ``-0.0``, which adds
    nothing) in ``dtype``, writeable (a read-only weight would be another Numba type)."""
    w = storage_view(np.ascontiguousarray(weight, dtype))
    b = (np.full(w.size, -0.0, dtype) if bias is None
         else storage_view(np.ascontiguousarray(bias, dtype)))
    return w, b


def merge_partials(parts):
    """The sum over the items' partial sums (``n_items x K``), in item order."""
    total = parts[0].copy()
    for p in parts[1:]:
        total += p
    return total


class GatedLoops:
    def modulated_rows_backward(self, x, dy, dx, T, gamma, epsilon, path=None):
        """One launch for every sample (``backward_dx.modulated_rows_backward``)."""
        M, K = x.shape
        N = M // T
        items, rows_per_item = backward_dx.row_items(T, K)  # a sample's, as it alone
        part_g, part_b = np.empty((N * items, K)), np.empty((N * items, K))
        xs, dys, dxs = (storage_view(v.ravel()) for v in (x, dy, dx))
        path = "serial" if policy.resolve_path(dxs, path) == "serial" else "parallel"
        took("rows_backward", "modulated", path)
        with launch_guard(path):
            kernel_for(backward_dx.modulated_rows_backward,
                       backward_dx.modulated_rows_backward_serial, path)(
                xs, dys, dxs, K, T, np.ascontiguousarray(gamma, np.float64).ravel(),
                float(epsilon), rows_per_item, part_g, part_b)
        return (part_g.reshape(N, items, K).sum(axis=1),
                part_b.reshape(N, items, K).sum(axis=1))

    def modulated_rows(self, x, y, T, scale, B, epsilon, path=None):
        """One launch for every sample (:mod:`normkernels.kernels.modulated`)."""
        M, K = x.shape
        xs, ys = storage_view(x.ravel()), storage_view(y.ravel())
        mean, var = np.empty(M), np.empty(M)
        s, b = (np.ascontiguousarray(t, np.float64).ravel() for t in (scale, B))
        path = policy.resolve_path(ys, path)
        took("rows", "modulated", path)
        if path == "serial":
            modulated.modulated_rows_serial(xs, ys, K, T, s, b, float(epsilon), mean, var, NONE)
            return
        with launch_guard(path):
            modulated.modulated_rows_parallel(xs, ys, K, T, s, b, float(epsilon), mean, var,
                                              policy.rows_per_item(M, K), path == "streaming",
                                              NONE)

    def gated_rms(self, x, z, y, weight, bias, G, epsilon, before, path=None):
        """``y`` (``M x K``) from ``x`` and the gate ``z``; returns the float64 mean
        square of each group (``M * K / G``, row-major)."""
        M, K = x.shape
        w, b = tables(weight, bias, compute_dtype(x.dtype))
        var = np.empty(M * (K // G))
        xs, xr = flat_rows(x)
        launch("gated_rms", gated_kernels.gated_forward_parallel,
               gated_kernels.gated_forward_serial, xs, path, xs, xr, *flat_rows(z),
               *flat_rows(y), w, b, G, epsilon, before, var, policy.rows_per_item(M, K))
        return var

    def gated_rms_backward(self, dy, x, z, weight, bias, G, epsilon, before, dx, dz,
                           path=None):
        """``dx``, ``dz`` (contiguous ``M x K``) and ``(dweight, dbias, var)`` in
        float64 (the sums over rows)."""
        M, K = x.shape
        w, b = tables(weight, bias, FLOAT64)
        var = np.empty(M * (K // G))
        per_item = gated_kernels.rows_per_item(K)  # the shape's: it orders the sums
        n_items = max(1, -(-M // per_item))
        dwp, dbp = np.zeros(n_items * K), np.zeros(n_items * K)
        xs, xr = flat_rows(x)
        launch("gated_rms_backward", gated_kernels.gated_backward_parallel,
               gated_kernels.gated_backward_serial, xs, path, *flat_rows(dy), xs, xr,
               *flat_rows(z), w, b, G, epsilon, before, var, storage_view(dx.reshape(-1)),
               storage_view(dz.reshape(-1)), dwp, dbp, per_item)
        return (merge_partials(dwp.reshape(n_items, K)), merge_partials(dbp.reshape(n_items, K)),
                var)

    def qk_rms(self, qkv, q_weight, k_weight, nq, nk, epsilon, llama, path=None):
        """QK-norm of the ``M x W`` rows of ``qkv`` in place; returns the float64 mean
        square of each q and k head (``M * (nq + nk)``)."""
        M, W = qkv.shape
        cd = compute_dtype(qkv.dtype)
        qw, kw = tables(q_weight, k_weight, cd)
        var = np.empty(M * (nq + nk))
        xs, xr = flat_rows(qkv)
        launch("qk_norm", qk_kernels.qk_norm_parallel, qk_kernels.qk_norm_serial, xs, path,
               xs, xr, M, qw, kw, nq, nk, epsilon, llama, var, policy.rows_per_item(M, W))
        return var

"""The Numba engine's elementwise gradients of the fused epilogues (a mixin of
:class:`normkernels.engine.numba_engine.NumbaEngine`): an activation's derivative, ReLU's
mask, and the gated residual of adaptive LayerNorm; and the group backward's
coefficients (one compiled call). Routes (``policy.took``):
``activation_grad/<path>``, ``relu_mask/<path>``, ``gated_backward/<path>``, path serial
or parallel (:func:`normkernels.engine.numba_gated.launch`: none has a streaming loop,
the streaming path runs the parallel kernel)."""

import numpy as np

from normkernels.dtypes import FLOAT64, compute_dtype, storage_view
from normkernels.engine.lazy import lazy
from normkernels.engine.numba_gated import launch
from normkernels.kernels.activations import marker

# kernel modules: imported at first use (engine/lazy.py)
activation_grad = lazy(__name__, "activation_grad")
backward_dx = lazy(__name__, "backward_dx")
skip_kernels = lazy(__name__, "skip_kernels", "skip_sums")


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


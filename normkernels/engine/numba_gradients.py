"""The Numba engine's elementwise gradients of the fused epilogues (a mixin of
:class:`normkernels.engine.numba_engine.NumbaEngine`): an activation's derivative, ReLU's
mask, and the gated residual of adaptive LayerNorm."""

import numpy as np

from normkernels.dtypes import storage_view
from normkernels.engine import policy
from normkernels.engine.numba_launch import kernel_for
from normkernels.engine.policy import took
from normkernels.engine.threads import launch_guard
from normkernels.kernels import activation_grad
from normkernels.kernels import skip_sums as skip_kernels
from normkernels.kernels.activations import marker


class EpilogueGradientLoops:
    def activation_grad(self, z, dy, dz, act, path=None):
        dys = storage_view(dy.reshape(-1))
        path = "serial" if policy.resolve_path(dys, path) == "serial" else "parallel"
        took("activation_grad", path)
        with launch_guard(path):
            kernel_for(activation_grad.activation_grad, activation_grad.activation_grad_serial,
                       path)(z.reshape(-1), dys, dz.reshape(-1), marker(act))

    def relu_mask(self, y, dy, dz, path=None):
        ys, dys, dzs = (storage_view(v.reshape(-1)) for v in (y, dy, dz))
        path = "serial" if policy.resolve_path(dys, path) == "serial" else "parallel"
        took("relu_mask", path)
        with launch_guard(path):
            kernel_for(activation_grad.relu_mask, activation_grad.relu_mask_serial, path)(
                ys, dys, dzs)

    def gated_backward(self, dln, ds, x, gate, dres, dx, K, rows_per_gate, path=None):
        xs = storage_view(x.reshape(-1))
        dss = None if ds is None else storage_view(ds.reshape(-1))
        dgate = np.zeros(x.size // rows_per_gate)
        path = "serial" if policy.resolve_path(xs, path) == "serial" else "parallel"
        took("gated_backward", path)
        with launch_guard(path):
            kernel_for(skip_kernels.gated_backward, skip_kernels.gated_backward_serial, path)(
                dln.reshape(-1), dss, xs, np.ascontiguousarray(gate, dln.dtype).reshape(-1),
                storage_view(dres.reshape(-1)), storage_view(dx.reshape(-1)), dgate, K,
                rows_per_gate)
        return dgate

"""The Numba engine's loops of the quantized-output normalizations (a mixin of
:class:`normkernels.engine.numba_engine.NumbaEngine`). Routes: ``quantized_rows/<path>``,
serial or parallel (:func:`normkernels.engine.numba_gated.launch`), and
``quantized_rows/table-free/serial``: up to ``TABLE_FREE_ROWS`` rows on the serial path
(a decode step), the kernel that reads the weights without building column tables."""

import numpy as np

from normkernels.dtypes import STORAGE_DTYPE, compute_dtype, storage_view
from normkernels.engine import policy
from normkernels.engine.lazy import lazy
from normkernels.engine.numba_gated import launch
from normkernels.engine.numba_launch import TABLE_FREE_ROWS, flat_rows, nothing
from normkernels.engine.policy import took

# kernel modules: imported at first use (engine/lazy.py)
quantize = lazy(__name__, "quantize")

_NO_STATISTICS = np.empty(0)


def _scalars(dtype, epsilon, offset, static, scale_ub, floor):
    """The kernels' scalar arguments: epsilon, offset (in the compute dtype), the static
    scale (0: dynamic) and the clamps, as float32."""
    return (float(epsilon), compute_dtype(dtype).type(offset),
            np.float32(0.0 if static is None else static),
            np.float32(np.inf if scale_ub is None else scale_ub), np.float32(floor))


def _table_free_bias(b, dtype, K, centered):
    """The table-free kernel's bias: ``b``'s storage, else (centered: the kernel reads
    it) ``K`` values of ``-0.0``, which add nothing; not centered, never read."""
    if b is not None:
        return storage_view(b)
    if centered:
        return storage_view(np.full(K, -0.0, dtype))
    return nothing(STORAGE_DTYPE[dtype])


class QuantizedLoops:
    def quantized_rows(self, x, w, b, res, q, scales, epsilon, centered, offset, fp8, static,
                       group, scale_ub, floor, path=None):
        """Quantized row normalization of ``x`` (``M x K``, rows contiguous) into ``q``
        (``M x K`` uint8, contiguous): the rule of :mod:`normkernels.kernels.quantize`.
        ``w``, ``b`` (None: none): ``K`` values of x's dtype; ``res`` (None: none): the
        residual, ``M x K`` rows contiguous, updated in place; ``scales``: ``M x (K //
        group)`` float32 (dynamic), unused with a ``static`` scale (a float, else None);
        ``scale_ub`` (None: none) and ``floor``: the dynamic scale's clamps. Returns
        float64 per-row ``(mean, var)`` and the number of row groups with NaN
        quotients (int8 only)."""
        M, K = x.shape
        (xs, xr) = flat_rows(x)
        rs, rr = (nothing(xs.dtype), 0) if res is None else flat_rows(res)
        mean, var = np.empty(M), np.empty(M)
        sc = np.empty(0, np.float32) if scales is None else scales.reshape(-1)
        qs = q.reshape(-1)
        eps, off, st, ub, fl = _scalars(x.dtype, epsilon, offset, static, scale_ub, floor)
        if M <= TABLE_FREE_ROWS and policy.loop_path(qs, path) == "serial":
            took("quantized_rows", "table-free", "serial")
            nans = quantize.quantize_rows_table_free(
                xs, xr, rs, rr, storage_view(w), _table_free_bias(b, x.dtype, K, centered), K,
                group, eps, bool(centered), off, bool(fp8), st, ub, fl, qs, sc, mean, var)
            return mean, var, nans
        ws = storage_view(w)
        bs = ws[:0] if b is None else storage_view(b)
        nans = np.zeros(M, np.int64)
        launch("quantized_rows", quantize.quantize_rows, quantize.quantize_rows_serial, qs, path,
               xs, xr, rs, rr, ws, bs, K, group, eps, bool(centered), off, bool(fp8), st, ub,
               fl, qs, sc, mean, var, nans, policy.rows_per_item(M, K))
        return mean, var, int(np.count_nonzero(nans))

    def quantized_plan(self, dtype, M, K, group, centered, fp8, static, scale_ub, floor, bias):
        """:meth:`quantized_rows` for a call plan (rows of ``dtype``, everything but the
        arrays, epsilon and offset fixed): ``run(x, w, b, res, q, scales, epsilon,
        offset)``, the number of row groups with NaN quotients, for C-contiguous arrays
        of the plan's shapes (``q`` uint8 storage, ``scales`` None when static).

        A decode step (up to ``TABLE_FREE_ROWS`` rows) is one table-free kernel call
        with its constants resolved here; the path is still decided per call, and any
        other path is :meth:`quantized_rows`'s."""
        full = self.quantized_rows

        def general(x, w, b, res, q, scales, epsilon, offset):
            rows = (M, K)
            return full(x.reshape(rows), w, b, None if res is None else res.reshape(rows),
                        q.reshape(rows), scales, epsilon, centered, offset, fp8, static, group,
                        scale_ub, floor)[2]

        if M > TABLE_FREE_ROWS or M * K > policy.SERIAL_MAX_ELEMENTS:
            return general
        _, _, st, ub, fl = _scalars(dtype, 0.0, 0.0, static, scale_ub, floor)
        cd = compute_dtype(dtype).type
        none = nothing(STORAGE_DTYPE[dtype])
        no_bias = _table_free_bias(None, dtype, K, centered) if bias is None else None
        no_scales = np.empty(0, np.float32)
        kernel = quantize.quantize_rows_table_free
        centered, fp8 = bool(centered), bool(fp8)

        def run(x, w, b, res, q, scales, epsilon, offset):
            qs = q.reshape(-1)
            if policy.loop_path(qs, None) != "serial":
                return general(x, w, b, res, q, scales, epsilon, offset)
            took("quantized_rows", "table-free", "serial")
            return kernel(storage_view(x).reshape(-1), K,
                          none if res is None else storage_view(res).reshape(-1), K,
                          storage_view(w), no_bias if b is None else storage_view(b), K, group,
                          epsilon, centered, cd(offset), fp8, st, ub, fl, qs,
                          no_scales if scales is None else scales.reshape(-1), _NO_STATISTICS,
                          _NO_STATISTICS)

        return run

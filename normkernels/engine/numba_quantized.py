"""The Numba engine's loops of the quantized-output normalizations (a mixin of
:class:`normkernels.engine.numba_engine.NumbaEngine`). Routes: ``quantized_rows/<path>``,
serial or parallel (:func:`normkernels.engine.numba_gated.launch`)."""

import numpy as np

from normkernels.dtypes import compute_dtype, storage_view
from normkernels.engine import policy
from normkernels.engine.numba_gated import launch
from normkernels.engine.numba_launch import flat_rows
from normkernels.kernels import quantize

_NONE = {}


def _none(dtype):
    """An empty writeable storage array of ``dtype``: no residual (one per dtype)."""
    empty = _NONE.get(dtype)
    if empty is None:
        empty = _NONE[dtype] = storage_view(np.empty(0, dtype))
    return empty


class QuantizedLoops:
    def quantized_rows(self, x, w, b, res, q, scales, epsilon, centered, offset, fp8, static,
                       group, scale_ub, floor, path=None):
        """Quantized row normalization of ``x`` (``M x K``, rows contiguous) into ``q``
        (``M x K`` uint8, contiguous): the rule of :mod:`normkernels.kernels.quantize`.
        ``w``, ``b`` (None: none): ``K`` values of x's dtype; ``res`` (None: none): the
        residual, ``M x K`` rows contiguous, updated in place; ``scales``: ``M x (K //
        group)`` float32 (dynamic), unused with a ``static`` scale (a float, else None);
        ``scale_ub`` (None: none) and ``floor``: the dynamic scale's clamps. Returns
        float64 per-row ``(mean, var)`` and the number of rows with a group of NaN
        quotients (int8 only)."""
        M, K = x.shape
        (xs, xr) = flat_rows(x)
        if res is None:
            rs, rr = _none(x.dtype), 0
        else:
            rs, rr = flat_rows(res)
        ws = storage_view(w)
        bs = ws[:0] if b is None else storage_view(b)
        mean, var, nans = np.empty(M), np.empty(M), np.zeros(M, np.int64)
        sc = np.empty(0, np.float32) if scales is None else scales.reshape(-1)
        qs = q.reshape(-1)
        launch("quantized_rows", quantize.quantize_rows, quantize.quantize_rows_serial, qs, path,
               xs, xr, rs, rr, ws, bs, K, group, float(epsilon), bool(centered),
               compute_dtype(x.dtype).type(offset), bool(fp8),
               np.float32(0.0 if static is None else static),
               np.float32(np.inf if scale_ub is None else scale_ub), np.float32(floor), qs, sc,
               mean, var, nans, policy.rows_per_item(M, K))
        return mean, var, int(np.count_nonzero(nans))

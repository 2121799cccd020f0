"""The skip add of onnxruntime's SkipGroupNorm, ``s = (x + skip) + bias``, and the gated
residual of a DiT block, ``s = residual + gate * x`` (:func:`gated_sums`), rounded once
to X's dtype (the arithmetic of the row kernels' skip add, :func:`rows._add_row`:
float64 for float32 and float64 X, float32 for 16-bit X).

X is rows of ``K`` contiguous elements: NXC memory has rows of C channels (``bias``
per column), NCX memory rows of one plane (``bias`` one value per row, channel ``r %
C``). ``skip`` is either a row of ``K`` per ``rows_per_skip`` rows (X's shape: 1;
NXC ``(N, C)``: one row per sample) or one value per ``rows_per_skip`` rows (NCX
``(N, C)``: one value per plane). Work items are blocks of whole rows.
"""

import numpy as np
from numba import njit, prange

import normkernels.kernels.cache  # noqa: F401  (registers the cache locators before any @njit)
from normkernels.kernels.activations import residual_slice, with_residual
from normkernels.kernels.cache import serial_twin
from normkernels.kernels.elements import row_load, store
from normkernels.kernels.options import HELPER_OPTIONS, KERNEL_OPTIONS

ITEM_ELEMENTS = 1 << 15  # elements per work item (whole rows), about

# Each loop indexes slices from 0 in a function of its own: with offsets the loops
# stayed scalar (see rows._add_row).


@njit(**HELPER_OPTIONS)
def _row_skip_row_bias(x, skip, bias, dest):
    for i in range(x.size):
        store(dest, i, (row_load(x, i) + row_load(skip, i)) + bias[i])


@njit(**HELPER_OPTIONS)
def _row_skip_value_bias(x, skip, b, dest):
    for i in range(x.size):
        store(dest, i, (row_load(x, i) + row_load(skip, i)) + b)


@njit(**HELPER_OPTIONS)
def _value_skip_value_bias(x, s, b, dest):
    for i in range(x.size):
        store(dest, i, (row_load(x, i) + s) + b)


@njit(parallel=True, **KERNEL_OPTIONS)
def skip_sums(x, skip, bias, dest, K, rows_per_skip, skip_rows, C, rows_per_item):
    """``dest = (x + skip) + bias`` row by row (see the module docstring); ``bias`` a
    compute-dtype table of ``K`` values per column (NXC: ``C == 0``) or of ``C``
    values, one per row ``r % C`` (NCX); ``skip_rows``: skip holds rows of ``K``."""
    M = x.size // K
    for item in prange((M + rows_per_item - 1) // rows_per_item):
        for r in range(item * rows_per_item, min(M, (item + 1) * rows_per_item)):
            k = r // rows_per_skip
            xs, ds = x[r * K:(r + 1) * K], dest[r * K:(r + 1) * K]
            if skip_rows and C == 0:
                _row_skip_row_bias(xs, skip[k * K:(k + 1) * K], bias, ds)
            elif skip_rows:
                _row_skip_value_bias(xs, skip[k * K:(k + 1) * K], bias[r % C], ds)
            else:
                _value_skip_value_bias(xs, row_load(skip, k), bias[r % C], ds)


@njit(**HELPER_OPTIONS)
def _gated_row(x, residual, gate, dest):
    for i in range(x.size):
        store(dest, i, row_load(residual, i) + gate[i] * row_load(x, i))


@njit(parallel=True, **KERNEL_OPTIONS)
def gated_sums(x, residual, gate, dest, K, rows_per_gate, rows_per_item):
    """``dest = residual + gate * x`` row by row (rows of ``K``; ``gate`` a compute-dtype
    table of one row of ``K`` per ``rows_per_gate`` rows: per sample and channel)."""
    M = x.size // K
    for item in prange((M + rows_per_item - 1) // rows_per_item):
        for r in range(item * rows_per_item, min(M, (item + 1) * rows_per_item)):
            k = r // rows_per_gate
            _gated_row(x[r * K:(r + 1) * K], residual[r * K:(r + 1) * K],
                       gate[k * K:(k + 1) * K], dest[r * K:(r + 1) * K])


skip_sums_serial = serial_twin(skip_sums, **KERNEL_OPTIONS)
gated_sums_serial = serial_twin(gated_sums, **KERNEL_OPTIONS)


@njit(**HELPER_OPTIONS)
def _gated_back_row(dln, ds, x, gate, dres, dx, dgate):
    for i in range(x.size):
        # the residual stream's gradient in dln's dtype (float32 for 16-bit and float32 X)
        total = with_residual(ds, i, dln[i])
        dgate[i] += np.float64(total) * np.float64(row_load(x, i))  # before dx: may be x
        store(dres, i, total)
        store(dx, i, gate[i] * total)


@njit(parallel=True, **KERNEL_OPTIONS)
def gated_backward(dln, ds, x, gate, dres, dx, dgate, K, rows_per_gate):
    """The gated residual's backward (``S = residual + gate * x``): per row ``dres = dln
    + ds`` (``ds`` None: 0) in dln's dtype, ``dx = gate * dres`` (``gate`` in dln's
    dtype, one row of ``K`` per ``rows_per_gate`` rows: per sample), each rounded once
    to X's dtype, and per sample and column ``dgate += dres * x`` in float64, summed
    over the sample's rows in order (``dgate`` zeroed by the caller). Work items are
    samples."""
    M = x.size // K
    for k in prange(M // rows_per_gate):
        for r in range(k * rows_per_gate, (k + 1) * rows_per_gate):
            _gated_back_row(dln[r * K:(r + 1) * K], residual_slice(ds, r * K, (r + 1) * K),
                            x[r * K:(r + 1) * K], gate[k * K:(k + 1) * K],
                            dres[r * K:(r + 1) * K], dx[r * K:(r + 1) * K],
                            dgate[k * K:(k + 1) * K])


gated_backward_serial = serial_twin(gated_backward, **KERNEL_OPTIONS)

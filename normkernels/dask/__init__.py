"""normkernels on Dask arrays: statistics merged across chunks and workers.

Needs dask (``pip install 'normkernels[dask]'``), imported only when a function here
runs. Inputs are ``dask.array.Array`` chunked along any axes, the channel axis
included; results are lazy dask arrays.

* **Statistics** (training, instance normalization, :func:`moments`): each block's
  partial (count, mean, M2) per channel (or per (n, c)) comes from the normkernels
  kernel; the partials are merged with Chan's formula in dask's tree reduction
  (``dask.array.reduction``: chunk, combine, aggregate). Nothing is read twice but
  X itself, which the normalize pass reads again.
* **Normalize**: blockwise, each block with the parameters of its own channels,
  through the normkernels kernels (so a block's Y is bitwise what normkernels gives
  for that block with those statistics).

Versus single-machine normkernels on the same data: inference is bitwise equal;
statistics differ only in the order of float64 merges: means within ``r (|mean| +
std)``, variances within ``r var + 2**-53 |mean| std`` with r = 1e-13 for
float32/float64 X and 1e-6 for 16-bit X (whose per-block sums are float32 runs); Y
differs by what that moves. Opsets 14 and 15 (``training_mode``) for
BatchNormalization.

**Row normalizations** (:func:`layer_normalization`, :func:`rms_normalization`; per
row: the axes ``axis..``). When every normalized axis is one chunk, each block holds
whole rows and goes through the normkernels function: Y, Mean and InvStdDev are
bitwise what normkernels gives. When the normalized axes are chunked, each block's
part of every row gives float64 partial moments (two passes in NumPy; for RMS the
mean square, merged as a weighted mean), merged by Chan's formula in dask's tree
reduction (:func:`row_moments`), then each block is normalized with its rows'
statistics by normkernels' row kernel (the arithmetic of
:func:`normkernels.layer_normalization` given those statistics, bit for bit). The
statistics then differ from single-machine normkernels' only by the order of the
float64 merges, within the bounds above (Mean and InvStdDev are rounded once to the
stash type from them), and Y by what that moves. Scale and B may be NumPy or dask
arrays and may vary along the leading axes too (as the NumPy functions allow).

**Every other operator** of the table runs by the "whole" strategy
(:mod:`normkernels.dask.whole`): the axes its statistics span are rechunked to one
chunk each and every block goes through normkernels (bitwise what it gives).

The functions here are built from the operator table: a record's ``chunked``
(:class:`normkernels.operators.record.Chunked`) names its strategy, and
``normkernels.dask.<function>`` is that strategy applied to the record. The
strategies: :mod:`normkernels.dask.channels` (per-channel parameters),
:mod:`normkernels.dask.rows` (row normalizations), :mod:`normkernels.dask.whole`
(any record); their shared tree reduction is :mod:`normkernels.dask.reduction`, and
:mod:`normkernels.dask.docstrings` completes each function's docstring from its record
(the Parameters, Returns, Raises and a running example).
"""

from normkernels.dask import channels, rows, whole
from normkernels.dask.reduction import moments, partial_moments  # noqa: F401 (public)
from normkernels.dask.rows import row_moments  # noqa: F401 (public)
from normkernels.operators import OPERATORS

STRATEGIES = {"batch": channels.batch, "given": channels.given, "instance": channels.instance,
              "group": channels.group, "rows": rows.rows, "whole": whole.whole,
              "moments": lambda op: moments}


def _functions():
    built = {}
    for op in OPERATORS.values():
        if op.chunked is not None:
            fn = built[op.function] = STRATEGIES[op.chunked.strategy](op)
            fn.__qualname__, fn.__module__ = op.function, __name__
    return built


_FUNCTIONS = _functions()
globals().update(_FUNCTIONS)
__all__ = sorted({*_FUNCTIONS, "partial_moments", "row_moments"})

"""The "whole" strategy of :mod:`normkernels.dask`, for any record of the table: the
axes a record's statistics span are rechunked to one chunk each, then every block
goes through the record's public function. No statistics are merged across chunks,
so each output is bitwise what normkernels gives for that block; the cost is the
rechunk when those axes are split (dask moves the data once).

What it needs from a record is its :class:`normkernels.operators.record.Chunked`:
which axes must be whole (``whole``) and what each output is shaped like
(``outputs``). The arguments are read from the public function's signature: X is
its first argument, an array of X's shape (onnxruntime's ``skip``) is chunked like
X, any other dask array (a parameter) reaches every block whole."""

import inspect

import numpy as np

from normkernels import api
from normkernels.dask.docstrings import document, whole_returns
from normkernels.dask.reduction import channel_axis, check
from normkernels.ops import mean_variance_normalization as _mvn
from normkernels.ops import rows as _rows


def _whole_axes(label, op, ndim, arguments):
    """The axes every block holds whole, the first normalized axis (rows) and the
    channel axis (None without ``data_format``)."""
    kind = op.chunked.whole
    c = None
    if "data_format" in arguments:
        c = channel_axis(_Shape(ndim), arguments["data_format"])
    axes = set() if c is None else {c}  # per-channel parameters reach a block whole
    first = None
    if kind == "rows":
        name = "begin_norm_axis" if "begin_norm_axis" in arguments else "axis"
        # no axis argument (onnxruntime's skip normalizations): the last axis
        first = _rows.normalized_axis(label, name, arguments.get(name, -1), ndim)
        axes |= set(range(first, ndim))
    elif kind == "axis":
        axes.add(_rows.normalized_axis(label, "axis", arguments["axis"], ndim))
    elif kind == "channel":
        axes.add(1 if c is None else c)
    elif kind == "sample":
        axes |= set(range(1, ndim))
    elif kind == "channels":
        axes |= set(range(ndim)) - {c}
    elif kind == "axes":
        axes |= set(_mvn.check_axes(label, arguments["axes"], ndim))
    else:
        raise ValueError(f"{label}: unknown Chunked.whole {kind!r} in record {op.name!r}")
    return sorted(axes), first, c


class _Shape:
    """What :func:`channel_axis` reads of X: its rank."""

    def __init__(self, ndim):
        self.ndim = ndim


def _output_chunks(kind, X, first, c, shape):
    """``(chunks, squeezed axes)`` of an output of ``kind`` with X's rank (``shape``:
    its shape for a probe block): its blocks keep X's rank, lengths 1 where the
    output has no axis, and those axes are squeezed out afterwards."""
    if kind == "X":
        return X.chunks, ()
    if kind == "rows":
        return X.chunks[:first] + ((1,),) * (X.ndim - first), ()
    if kind == "lead":
        return X.chunks[:first] + ((1,),) * (X.ndim - first), tuple(range(first, X.ndim))
    if kind == "channel":
        return (tuple(X.chunks[c] if i == c else (1,) for i in range(X.ndim)),
                tuple(i for i in range(X.ndim) if i != c))
    if kind == "groups":  # axis 1 (whole) holds the groups
        return ((X.chunks[0], (shape[1],)) + ((1,),) * (X.ndim - 2),
                tuple(range(2, X.ndim)))
    raise ValueError(f"unknown Chunked.outputs kind {kind!r}")


def _pick(results, k, kind, c, ndim):
    """Output ``k`` of a block's results with X's rank: lengths 1 where the output
    has no axis of X (around the channel axis for a per-channel output, after the
    leading axes otherwise), as its chunks say."""
    r = results[k]
    if kind == "channel":
        return r.reshape([-1 if i == c else 1 for i in range(ndim)])
    return r.reshape(r.shape + (1,) * (ndim - r.ndim))


def whole(op):
    """The record's function on dask arrays, with its statistics' axes whole."""
    fn = getattr(api, op.function)
    signature = inspect.signature(fn)
    label = f"normkernels.dask.{op.function}"
    x_name = next(iter(signature.parameters))
    positional = [n for n, p in signature.parameters.items()
                  if p.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD]

    def run(*args, **kwargs):
        bound = signature.bind(*args, **kwargs)
        bound.apply_defaults()
        arguments = dict(bound.arguments)
        if arguments.pop("out", None) is not None:
            raise ValueError(f"{label}: out= is not supported on dask arrays; compute the "
                             f"result, or call normkernels.{op.function} on NumPy arrays")
        X = arguments[x_name]
        da = check(X, x_name, rows=True)
        axes, first, c = _whole_axes(label, op, X.ndim, arguments)
        X = X.rechunk({i: -1 for i in axes})
        index = tuple(range(X.ndim))
        lazy = []  # (name, array, index): what dask hands each block
        for name in positional:
            value = arguments[name]
            if name == x_name:
                lazy.append((name, X, index))
            elif isinstance(value, da.Array) and value.shape == X.shape:
                lazy.append((name, value.rechunk(X.chunks), index))
            elif isinstance(value, da.Array):  # reaches every block whole
                fresh = tuple(1000 * (len(lazy) + 1) + i for i in range(value.ndim))
                lazy.append((name, value, fresh))
        # the arguments are checked now, on a block of one row/sample/channel of X
        probe_shape = tuple(s if i in axes else min(s, 1) for i, s in enumerate(X.shape))
        probe = dict(arguments)
        for name, value, ind in lazy:
            shape = probe_shape if ind == index else value.shape
            probe[name] = np.ones(shape, value.dtype)
        with np.errstate(all="ignore"):
            result = fn(**probe)
        results = result if isinstance(result, tuple) else (result,)
        if len(results) > len(op.chunked.outputs):
            raise RuntimeError(f"{label}: {len(results)} outputs, but record {op.name!r} "
                               f"describes {len(op.chunked.outputs)}")

        def block(*blocks):
            call = dict(arguments)
            for (name, _, _), b in zip(lazy, blocks, strict=True):
                call[name] = b
            return fn(**call)

        flat = [a for _, value, ind in lazy for a in (value, ind)]
        if not isinstance(result, tuple):
            return da.blockwise(block, index, *flat, dtype=result.dtype, concatenate=True,
                                meta=np.empty((0,) * X.ndim, result.dtype))
        tuples = da.blockwise(block, index, *flat, dtype=object, concatenate=True,
                              meta=np.empty((0,) * X.ndim, object))
        outputs = []
        for k, (kind, r) in enumerate(zip(op.chunked.outputs, results, strict=False)):
            chunks, squeezed = _output_chunks(kind, X, first, c, r.shape)
            part = tuples.map_blocks(_pick, k, kind, c, X.ndim, dtype=r.dtype, chunks=chunks,
                                     meta=np.empty((0,) * X.ndim, r.dtype))
            outputs.append(da.squeeze(part, axis=squeezed) if squeezed else part)
        return tuple(outputs)

    run.__name__ = run.__qualname__ = op.function
    run.__signature__ = signature
    run.__doc__ = (f":func:`normkernels.{op.function}` ({op.title}) on dask arrays, lazily: "
                   f"the axes its statistics span ({op.chunked.whole}) are rechunked to one "
                   f"chunk each, then every block goes through normkernels, so each output "
                   f"is bitwise what normkernels gives. Parameters may be NumPy or dask "
                   f"arrays; ``out=`` is not supported.")
    skip = (", but the skip input (of X's shape): a dask array, chunked like X" if op.skip
            else "")
    return document(op, run, whole_returns(op), refused=", or ``out`` is given",
                    inputs=f"NumPy or dask arrays, each handed whole to every block{skip}")

"""What every strategy of :mod:`normkernels.dask` shares: the checks of a dask
input, the tree reduction of partial moments (per channel, per (n, c); Chan's
formula in dask's ``reduction``: chunk, combine, aggregate), per-channel
parameters chunked like X, and the blockwise runs (a new array, or every block
written straight into a NumPy ``out``).

Nothing here imports dask at import time: :func:`dask_array` does, when a function
runs."""

import operator

import numpy as np

from normkernels import api
from normkernels.ops import common
from normkernels.ops.moments import merge

PARTIAL = np.dtype([("count", np.int64), ("mean", np.float64), ("M2", np.float64)])


def dask_array():
    try:
        import dask.array as da
    except ImportError:
        raise ImportError("normkernels.dask needs dask: pip install 'normkernels[dask]'") \
            from None
    return da


def check(X, name="X", rows=False):
    """``X`` is a dask array of rank >= 2 (``rows``: any rank, the row normalizations
    check it themselves) with known chunk sizes."""
    da = dask_array()
    if not isinstance(X, da.Array):
        raise TypeError(f"normkernels.dask: {name} must be a dask.array.Array, got "
                        f"{type(X).__name__} (NumPy arrays go to normkernels' own functions)")
    if any(np.isnan(c) for chunks in X.chunks for c in chunks):
        raise ValueError(f"normkernels.dask: {name} has unknown chunk sizes; call "
                         f"{name}.compute_chunk_sizes() first")
    if rows:
        return da
    if X.ndim < 2:
        raise ValueError(f"normkernels.dask: {name} must have at least 2 dimensions "
                         f"(N, C, ...), got shape {X.shape}")
    return da


def channel_axis(X, data_format):
    common.check_data_format("normkernels.dask", data_format)
    return 1 if data_format == "NCX" else X.ndim - 1


# --- the tree reduction of partial moments ---

def structured(count, mean, m2, shape):
    out = np.empty(shape, PARTIAL)
    for field, value in (("count", count), ("mean", mean), ("M2", m2)):
        # a scalar fills every entry (an empty block's zero partials)
        out[field] = value if np.ndim(value) == 0 else np.reshape(value, shape)
    return out


def _flatten(parts):
    if isinstance(parts, (list, tuple)):
        for p in parts:
            yield from _flatten(p)
    else:
        yield parts


def merge_all(parts):
    parts = list(_flatten(parts))
    total = parts[0]
    shape = total.shape
    acc = (total["count"].ravel(), total["mean"].ravel(), total["M2"].ravel())
    for p in parts[1:]:
        acc = merge(acc, (p["count"].ravel(), p["mean"].ravel(), p["M2"].ravel()))
    return structured(*acc, shape)


def _channel_chunk(block, axis, keepdims, data_format, per_sample, computing_meta=False):
    """Partial moments of one block: per channel, or per (n, c) with ``per_sample``."""
    shape = tuple(1 if i in axis else s for i, s in enumerate(block.shape))
    if computing_meta or block.size == 0:
        return structured(0, 0.0, 0.0, shape)
    if not per_sample:
        part = api.partial_moments(block, data_format=data_format)
        return structured(part.count, part.mean, part.M2, shape)
    parts = [api.partial_moments(block[n:n + 1], data_format=data_format)
             for n in range(block.shape[0])]
    return structured(np.stack([p.count for p in parts]), np.stack([p.mean for p in parts]),
                       np.stack([p.M2 for p in parts]), shape)


def combine(parts, axis, keepdims):
    return merge_all(parts)


def aggregate(parts, axis, keepdims):
    merged = merge_all(parts)
    if keepdims:
        return merged
    return merged.reshape([s for i, s in enumerate(merged.shape) if i not in axis])


def reduce_moments(X, data_format, per_sample, split_every):
    da = dask_array()
    c_axis = channel_axis(X, data_format)
    kept = {0, c_axis} if per_sample else {c_axis}
    axis = tuple(i for i in range(X.ndim) if i not in kept)

    def chunk(block, axis, keepdims, computing_meta=False):
        return _channel_chunk(block, axis, keepdims, data_format, per_sample, computing_meta)

    return da.reduction(X, chunk, aggregate, combine=combine, axis=axis, keepdims=False,
                        dtype=PARTIAL, split_every=split_every, concatenate=False,
                        meta=np.empty((0,) * (X.ndim - len(axis)), PARTIAL))


def partial_moments(X, *, data_format="NCX", split_every=None):
    """Per-channel ``(count, mean, M2)`` of a dask array, as three lazy dask arrays
    (int64, float64, float64) of shape (C,): normkernels' partials of every block,
    merged by Chan's formula in dask's tree reduction.

    Parameters
    ----------
    X : dask.array.Array
        (N, C, ...) or (N, ..., C), chunked along any axes (its chunk sizes known).
    data_format : {"NCX", "NXC"}, default "NCX"
        Where the channel axis is: axis 1, or the last.
    split_every : int or dict, optional
        The fan-in of dask's tree reduction (``dask.array.reduction``'s).

    Returns
    -------
    count, mean, M2 : dask.array.Array
        Lazy, of shape (C,): the values per channel (int64), their mean and the sum of
        their squared deviations from it (float64).

    Raises
    ------
    TypeError
        ``X`` is not a dask array.
    ValueError
        ``X`` has unknown chunk sizes, fewer than 2 dimensions, or an unknown
        ``data_format``.

    Examples
    --------
    >>> import dask.array as da
    >>> import normkernels.dask
    >>> X = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    >>> count, mean, M2 = normkernels.dask.partial_moments(da.from_array(X, chunks=(1, 2, 2)))
    >>> count.compute(), mean.compute(), M2.compute()
    (array([8, 8, 8]), array([ 7.5, 11.5, 15.5]), array([298., 298., 298.]))
    """
    check(X)
    part = reduce_moments(X, data_format, False, split_every)
    return part["count"], part["mean"], part["M2"]


def moments(X, *, data_format="NCX", split_every=None):
    """Per-channel mean and population variance of a dask array (lazy, shape (C,)),
    float64 for float32/float64 X and float32 for 16-bit X, as
    :func:`normkernels.moments`.

    Parameters
    ----------
    X : dask.array.Array
        (N, C, ...) or (N, ..., C), chunked along any axes (its chunk sizes known).
    data_format : {"NCX", "NXC"}, default "NCX"
        Where the channel axis is: axis 1, or the last.
    split_every : int or dict, optional
        The fan-in of dask's tree reduction (``dask.array.reduction``'s).

    Returns
    -------
    mean, var : dask.array.Array
        Lazy, of shape (C,).

    Raises
    ------
    TypeError
        ``X`` is not a dask array.
    ValueError
        ``X`` has unknown chunk sizes, fewer than 2 dimensions, or an unknown
        ``data_format``.

    Examples
    --------
    >>> import dask.array as da
    >>> import normkernels.dask
    >>> X = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    >>> mean, var = normkernels.dask.moments(da.from_array(X, chunks=(1, 2, 2)))
    >>> mean.compute(), var.compute()
    (array([ 7.5, 11.5, 15.5]), array([37.25, 37.25, 37.25]))
    >>> all(np.allclose(a.compute(), b) for a, b in zip((mean, var), normkernels.moments(X)))
    True
    """
    count, mean, m2 = partial_moments(X, data_format=data_format, split_every=split_every)
    out = np.float64 if X.dtype in (np.float32, np.float64) else np.float32
    return mean.astype(out), (m2 / count).astype(out)


# --- blockwise normalize ---

def per_channel(arr, X, c_axis):
    """A parameter as a dask array chunked like X's channel axis."""
    da = dask_array()
    arr = da.asarray(arr)
    if arr.ndim != 1 or arr.shape[0] != X.shape[c_axis]:
        raise ValueError(f"normkernels.dask: parameters must have shape ({X.shape[c_axis]},) "
                         f"to match the channels of X, got {arr.shape}")
    return arr.rechunk((X.chunks[c_axis],))


def blockwise(fn, X, c_axis, params, dtype):
    da = dask_array()
    index = tuple(range(X.ndim))
    args = [X, index]
    for p in params:
        args += [p, (c_axis,)]
    return da.blockwise(fn, index, *args, dtype=dtype, concatenate=True)


def write_into(out, fn, X, c_axis, params):
    """Lazily run ``fn(block, *param_blocks, out=region_of_out)`` for every block of X:
    Y goes straight into ``out`` (a NumPy array of X's shape), with no per-block
    array and no copy. Returns the dask array of per-block tokens to compute."""
    da = dask_array()
    if not isinstance(out, np.ndarray) or out.shape != X.shape or out.dtype != X.dtype:
        raise ValueError(f"normkernels.dask: out must be a NumPy array of X's shape and "
                         f"dtype ({X.shape}, {X.dtype})")
    shape = [1] * X.ndim
    shape[c_axis] = -1
    blocks = []
    for p in params:
        p = p.reshape(shape)
        blocks.append(p.rechunk(tuple(X.chunks[c_axis] if i == c_axis else (1,)
                                      for i in range(X.ndim))))

    def task(block, *param_blocks, block_info=None):
        region = tuple(slice(lo, hi) for lo, hi in block_info[0]["array-location"])
        fn(block, *(p.reshape(-1) for p in param_blocks), out=out[region])
        return np.zeros((1,) * block.ndim, np.int8)

    import uuid

    # an explicit name: dask would otherwise hash the task, out (all of Y) included
    return da.map_blocks(task, X, *blocks, dtype=np.int8,
                         chunks=tuple((1,) * len(c) for c in X.chunks),
                         name=f"normkernels-into-{uuid.uuid4().hex}")


def blockwise_outputs(fn, X, args, outputs):
    """``fn(block, *argument_blocks)`` over X's blocks, lazily. ``args``: ``[(array,
    index), ...]``; ``outputs``: ``[(dtype, chunks), ...]``, one (Y: X's chunks) or
    several (``fn`` returns a tuple: Y, then per-row statistics)."""
    da = dask_array()
    index = tuple(range(X.ndim))
    flat = [X, index]
    for arr, ind in args:
        flat += [arr, ind]
    dtype = outputs[0][0]
    meta = np.empty((0,) * X.ndim, dtype)
    result = da.blockwise(fn, index, *flat, dtype=dtype, concatenate=True, meta=meta)
    if len(outputs) == 1:
        return result
    # one task per block makes the tuple; one per block and output picks from it
    return tuple(result.map_blocks(operator.getitem, i, dtype=dt, chunks=chunks,
                                   meta=np.empty((0,) * X.ndim, dt))
                 for i, (dt, chunks) in enumerate(outputs))

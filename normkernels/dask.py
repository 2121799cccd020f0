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
"""

import operator

import numpy as np

import normkernels
from normkernels.ops import batch_normalization as _bn
from normkernels.ops import common
from normkernels.ops import group_normalization as _gn
from normkernels.ops import instance_normalization as _in
from normkernels.ops import layer_normalization as _ln
from normkernels.ops import rms_normalization as _rms
from normkernels.ops import rows as _rows
from normkernels.ops.moments import merge

_PARTIAL = np.dtype([("count", np.int64), ("mean", np.float64), ("M2", np.float64)])


def _dask():
    try:
        import dask.array as da
    except ImportError:
        raise ImportError("normkernels.dask needs dask: pip install 'normkernels[dask]'") \
            from None
    return da


def _check(X, name="X", rows=False):
    """``X`` is a dask array of rank >= 2 (``rows``: any rank, the row normalizations
    check it themselves) with known chunk sizes."""
    da = _dask()
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


def _channel_axis(X, data_format):
    common.check_data_format("normkernels.dask", data_format)
    return 1 if data_format == "NCX" else X.ndim - 1


# --- the tree reduction of partial moments ---

def _structured(count, mean, m2, shape):
    out = np.empty(shape, _PARTIAL)
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


def _merge_all(parts):
    parts = list(_flatten(parts))
    total = parts[0]
    shape = total.shape
    acc = (total["count"].ravel(), total["mean"].ravel(), total["M2"].ravel())
    for p in parts[1:]:
        acc = merge(acc, (p["count"].ravel(), p["mean"].ravel(), p["M2"].ravel()))
    return _structured(*acc, shape)


def _channel_chunk(block, axis, keepdims, data_format, per_sample, computing_meta=False):
    """Partial moments of one block: per channel, or per (n, c) with ``per_sample``."""
    shape = tuple(1 if i in axis else s for i, s in enumerate(block.shape))
    if computing_meta or block.size == 0:
        return _structured(0, 0.0, 0.0, shape)
    if not per_sample:
        part = normkernels.partial_moments(block, data_format=data_format)
        return _structured(part.count, part.mean, part.M2, shape)
    parts = [normkernels.partial_moments(block[n:n + 1], data_format=data_format)
             for n in range(block.shape[0])]
    return _structured(np.stack([p.count for p in parts]), np.stack([p.mean for p in parts]),
                       np.stack([p.M2 for p in parts]), shape)


def _combine(parts, axis, keepdims):
    return _merge_all(parts)


def _aggregate(parts, axis, keepdims):
    merged = _merge_all(parts)
    if keepdims:
        return merged
    return merged.reshape([s for i, s in enumerate(merged.shape) if i not in axis])


def _reduce(X, data_format, per_sample, split_every):
    da = _dask()
    c_axis = _channel_axis(X, data_format)
    kept = {0, c_axis} if per_sample else {c_axis}
    axis = tuple(i for i in range(X.ndim) if i not in kept)

    def chunk(block, axis, keepdims, computing_meta=False):
        return _channel_chunk(block, axis, keepdims, data_format, per_sample, computing_meta)

    return da.reduction(X, chunk, _aggregate, combine=_combine, axis=axis, keepdims=False,
                        dtype=_PARTIAL, split_every=split_every, concatenate=False,
                        meta=np.empty((0,) * (X.ndim - len(axis)), _PARTIAL))


def partial_moments(X, *, data_format="NCX", split_every=None):
    """Per-channel ``(count, mean, M2)`` of a dask array, as three lazy dask arrays
    (int64, float64, float64) of shape (C,): normkernels' partials of every block,
    merged by Chan's formula in dask's tree reduction."""
    _check(X)
    part = _reduce(X, data_format, False, split_every)
    return part["count"], part["mean"], part["M2"]


def moments(X, *, data_format="NCX", split_every=None):
    """Per-channel mean and population variance of a dask array (lazy, shape (C,)),
    float64 for float32/float64 X and float32 for 16-bit X, as
    :func:`normkernels.moments`."""
    count, mean, m2 = partial_moments(X, data_format=data_format, split_every=split_every)
    out = np.float64 if X.dtype in (np.float32, np.float64) else np.float32
    return mean.astype(out), (m2 / count).astype(out)


# --- blockwise normalize ---

def _per_channel(arr, X, c_axis):
    """A parameter as a dask array chunked like X's channel axis."""
    da = _dask()
    arr = da.asarray(arr)
    if arr.ndim != 1 or arr.shape[0] != X.shape[c_axis]:
        raise ValueError(f"normkernels.dask: parameters must have shape ({X.shape[c_axis]},) "
                         f"to match the channels of X, got {arr.shape}")
    return arr.rechunk((X.chunks[c_axis],))


def _blockwise(fn, X, c_axis, params, dtype):
    da = _dask()
    index = tuple(range(X.ndim))
    args = [X, index]
    for p in params:
        args += [p, (c_axis,)]
    return da.blockwise(fn, index, *args, dtype=dtype, concatenate=True)


def _write_into(out, fn, X, c_axis, params):
    """Lazily run ``fn(block, *param_blocks, out=region_of_out)`` for every block of X:
    Y goes straight into ``out`` (a NumPy array of X's shape), with no per-block
    array and no copy. Returns the dask array of per-block tokens to compute."""
    da = _dask()
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


def batch_normalization(X, scale, B, input_mean, input_var, *, epsilon=None, momentum=None,
                        training_mode=None, opset=15, data_format="NCX",
                        compute_statistics=False, out=None):
    """:func:`normkernels.batch_normalization` (opsets 14 and 15) on a dask array.

    Inference: blockwise. Training: the batch statistics by a tree reduction of
    per-block partial moments, then the blockwise normalize with them; returns lazy
    ``(Y, running_mean, running_var)`` (running statistics in input_mean's dtype).

    ``compute_statistics=True`` computes the batch statistics now (one pass over X)
    and builds Y on them. Use it when X does not fit in memory and is not persisted:
    in a single graph every block of X is needed by the statistics and again by Y
    after them, so the scheduler would keep all of X in memory meanwhile.

    ``out``: a NumPy array of X's shape and dtype; then everything is computed now,
    each block's Y is written straight into it, and ``out`` is returned (with the
    running statistics as NumPy arrays in training).
    """
    da = _check(X)
    if _bn.version_for(opset).counts_outputs:
        raise NotImplementedError(f"normkernels.dask.batch_normalization: opset {opset!r}; "
                                  "only opsets 14 and 15 (training_mode) are supported on "
                                  "dask arrays")
    call = _bn.prepare(opset, {"epsilon": epsilon, "momentum": momentum,
                               "training_mode": training_mode}, data_format=data_format)
    c_axis = _channel_axis(X, data_format)
    params = [_per_channel(p, X, c_axis) for p in (scale, B, input_mean, input_var)]
    _bn.check_types(call.version, dict(zip(_bn.INPUTS, (X, *params), strict=True)))
    eps, mom = call.epsilon, call.momentum

    def normalize(block, s, b, m, v, out=None):
        return normkernels.batch_normalization(block, s, b, m, v, epsilon=eps, opset=opset,
                                               data_format=data_format, out=out)

    if not call.training:
        if out is not None:
            _write_into(out, normalize, X, c_axis, params).compute()
            return out
        return _blockwise(normalize, X, c_axis, params, X.dtype)
    count, mean, m2 = partial_moments(X, data_format=data_format)
    var = m2 / count
    if compute_statistics:
        import dask

        mean, var = (da.from_array(v) for v in dask.compute(mean, var))
    stats_dtype = params[2].dtype
    running_mean = (params[2].astype(np.float64) * mom + mean * (1 - mom)).astype(stats_dtype)
    running_var = (params[3].astype(np.float64) * mom + var * (1 - mom)).astype(stats_dtype)
    batch = [params[0], params[1], _per_channel(mean, X, c_axis), _per_channel(var, X, c_axis)]
    if out is not None:
        import dask

        tokens = _write_into(out, normalize, X, c_axis, batch)
        _, running_mean, running_var = dask.compute(tokens, running_mean, running_var)
        return out, running_mean, running_var
    Y = _blockwise(normalize, X, c_axis, batch, X.dtype)
    return Y, running_mean, running_var


def batch_norm_inference(input, gamma, beta, mean, variance, *, epsilon, data_format="NXC"):
    """:func:`normkernels.batch_norm_inference` (oneDNN) on a dask array, blockwise."""
    _check(input, "input")
    c_axis = _channel_axis(input, data_format)
    params = [_per_channel(p, input, c_axis) for p in (gamma, beta, mean, variance)]

    def normalize(block, g, b, m, v):
        return normkernels.batch_norm_inference(block, g, b, m, v, epsilon=epsilon,
                                                data_format=data_format)

    return _blockwise(normalize, input, c_axis, params, input.dtype)


def instance_normalization(input, scale, B, *, epsilon=None, opset=22, data_format="NCX",
                           compute_statistics=False):
    """:func:`normkernels.instance_normalization` on a dask array: per-(n, c)
    statistics by a tree reduction over the spatial chunks, then a blockwise normalize
    of every sample with its own statistics (``compute_statistics``: as in
    :func:`batch_normalization`)."""
    da = _check(input, "input")
    version, label, eps = _in.prepare(opset, {"epsilon": epsilon})
    c_axis = _channel_axis(input, data_format)
    params = [_per_channel(p, input, c_axis) for p in (scale, B)]
    _in.check_types(version, label, {"input": input, "scale": params[0], "B": params[1]})
    _in.check_rank(version, label, input.shape)
    part = _reduce(input, data_format, True, None)
    mean = part["mean"].rechunk((input.chunks[0], input.chunks[c_axis]))
    var = (part["M2"] / part["count"]).rechunk((input.chunks[0], input.chunks[c_axis]))
    if compute_statistics:
        import dask

        chunks = (input.chunks[0], input.chunks[c_axis])
        mean, var = (da.from_array(v, chunks=chunks) for v in dask.compute(mean, var))
    index = tuple(range(input.ndim))

    def normalize(block, s, b, m, v):
        out = np.empty_like(block)
        for n in range(block.shape[0]):
            sl = block[n:n + 1]
            out[n:n + 1] = normkernels.batch_normalization(
                sl, s.astype(np.float64), b.astype(np.float64), m[n], v[n], epsilon=eps,
                opset=15, data_format=data_format)
        return out

    return da.blockwise(normalize, index, input, index, params[0], (c_axis,), params[1],
                        (c_axis,), mean, (0, c_axis), var, (0, c_axis), dtype=input.dtype,
                        concatenate=True)


def group_normalization(X, scale, bias, *, num_groups, epsilon=None, stash_type=None,
                        opset=21, data_format="NCX", compute_statistics=False):
    """:func:`normkernels.group_normalization` on a dask array chunked along any axes
    (a chunk may split a group): per-(n, c) partial moments by the tree reduction of
    :func:`instance_normalization`, merged per (n, group) by Chan's formula (the
    group's channels in order), then a blockwise normalize of every sample with its
    groups' statistics (``compute_statistics``: as in :func:`batch_normalization`)."""
    da = _check(X)
    version = _gn.version_for(opset)
    label = version.label(_gn.OP)
    attrs = common.resolve_attributes(label, version, {"epsilon": epsilon,
                                                       "stash_type": stash_type})
    eps = common.check_epsilon(label, attrs["epsilon"])
    if "stash_type" in attrs:
        _ln.stash_dtype(label, attrs["stash_type"], _gn.STASH_TYPES)
    c_axis = _channel_axis(X, data_format)
    C = X.shape[c_axis]
    G = _gn.check_groups(label, "num_groups", num_groups, C)
    scale, bias = da.asarray(scale), da.asarray(bias)
    for name, arr in (("X", X), ("scale", scale), ("bias", bias)):
        common.check_dtype(label, name, arr, version.dtypes)
    common.check_same_dtype(label, "T", {"X": X, "scale": scale, "bias": bias})
    if version.per_group:  # opset 18: one value per group, each channel takes its group's
        for name, p in (("scale", scale), ("bias", bias)):
            if p.shape != (G,):
                raise ValueError(f"{label}: {name} must have shape ({G},), one value per "
                                 f"group, got shape {p.shape}")
        scale, bias = da.repeat(scale, C // G), da.repeat(bias, C // G)
    params = [_per_channel(p, X, c_axis) for p in (scale, bias)]
    part = _reduce(X, data_format, True, None)  # (N, C) partials
    N, Cg = X.shape[0], C // G
    count = part["count"].reshape(N, G, Cg)
    mean = part["mean"].reshape(N, G, Cg)
    m2 = part["M2"].reshape(N, G, Cg)
    total = count.sum(axis=2, keepdims=True)
    group_mean = (count * mean).sum(axis=2, keepdims=True) / total
    group_m2 = (m2 + count * (mean - group_mean) ** 2).sum(axis=2, keepdims=True)
    chunks = (X.chunks[0], X.chunks[c_axis])
    mean_c = da.broadcast_to(group_mean, (N, G, Cg)).reshape(N, C).rechunk(chunks)
    var_c = da.broadcast_to(group_m2 / total, (N, G, Cg)).reshape(N, C).rechunk(chunks)
    if compute_statistics:
        import dask

        mean_c, var_c = (da.from_array(v, chunks=chunks) for v in dask.compute(mean_c, var_c))
    index = tuple(range(X.ndim))

    def normalize(block, s, b, m, v):
        out = np.empty_like(block)
        for n in range(block.shape[0]):
            out[n:n + 1] = normkernels.batch_normalization(
                block[n:n + 1], s.astype(np.float64), b.astype(np.float64), m[n], v[n],
                epsilon=eps, opset=15, data_format=data_format)
        return out

    return da.blockwise(normalize, index, X, index, params[0], (c_axis,), params[1],
                        (c_axis,), mean_c, (0, c_axis), var_c, (0, c_axis), dtype=X.dtype,
                        concatenate=True)


# --- row normalizations (LayerNormalization, RMSNormalization) ---

def _row_array(name, p):
    """An input as a dask array or an ndarray (array-likes converted), in native byte
    order, as the NumPy functions convert them."""
    if not isinstance(p, _dask().Array):
        return common.as_array(name, p)
    return p if p.dtype.isnative else p.astype(p.dtype.newbyteorder("="))


def _is_column(p, ndim, a):
    """``p`` (broadcastable to X) does not vary along X's leading axes ``[0, a)``."""
    lead = p.ndim - (ndim - a)
    return lead <= 0 or all(d == 1 for d in p.shape[:lead])


def _broadcast(p, X, first):
    """``p`` (broadcastable to ``X.shape[first:]``) as a lazy array of exactly that shape,
    chunked like those axes of X: block ``(i_first, ...)`` of it holds the parameters of
    the same region as X's blocks there (zero-stride views where p has length 1)."""
    da = _dask()
    shape, chunks = X.shape[first:], X.chunks[first:]
    p = da.asarray(p)
    if p.ndim > len(shape):  # leading axes of length 1 (checked by the caller)
        p = p.reshape(p.shape[p.ndim - len(shape):])
    p = p.reshape((1,) * (len(shape) - p.ndim) + p.shape)
    p = p.rechunk(tuple((1,) if d == 1 else c for d, c in zip(p.shape, chunks, strict=True)))
    return da.broadcast_to(p, shape, chunks=chunks)


def _row_params(params, X, a):
    """The parameters as blockwise arguments ``[(array, index), ...]`` and whether they
    are per column (all of them; then each block gets its ``X.shape[a:]`` region, else
    its region of X's full shape)."""
    columns = all(_is_column(p, X.ndim, a) for p in params)
    first = a if columns else 0
    return [(_broadcast(p, X, first), tuple(range(first, X.ndim))) for p in params], columns


def _row_chunk(block, axis, keepdims, centered, computing_meta=False):
    """Partial moments of each row's part in one block: float64 ``(count, mean, M2)``
    by two passes, or (``centered`` false) ``(count, mean square, 0)``."""
    a = min(axis)
    shape = block.shape[:a] + (1,) * (block.ndim - a)
    if computing_meta or block.size == 0:
        return _structured(0, 0.0, 0.0, shape)
    M, K = _rows.rows_shape(block.shape, a)
    x = _rows.rows_in(block, M, K).astype(np.float64)
    with np.errstate(all="ignore"):
        if centered:
            mean = x.mean(axis=1)
            dev = x - mean[:, None]
            m2 = np.einsum("ij,ij->i", dev, dev)
        else:
            mean, m2 = np.einsum("ij,ij->i", x, x) / K, 0.0
    return _structured(K, mean, m2, shape)


def row_moments(X, *, axis=-1, centered=True, split_every=None):
    """Per-row float64 ``(mean, var)`` of a dask array over the axes ``axis..`` (lazy,
    shape ``X.shape[:axis] + (1, ...)``): the rows' partial moments in every block,
    merged by Chan's formula in dask's tree reduction. ``var`` is the population
    variance, or with ``centered=False`` the mean square (and ``mean`` 0): the
    statistics :func:`layer_normalization` and :func:`rms_normalization` normalize
    with."""
    da = _check(X, rows=True)
    label = "normkernels.dask.row_moments"
    common.check_dtype(label, "X", X, common.ALL_FLOATS)
    a = _rows.normalized_axis(label, "axis", axis, X.ndim)
    return _row_moments(da, X, a, centered, split_every)


def _row_moments(da, X, a, centered, split_every):
    def chunk(block, axis, keepdims, computing_meta=False):
        return _row_chunk(block, axis, keepdims, centered, computing_meta)

    part = da.reduction(X, chunk, _aggregate, combine=_combine, axis=tuple(range(a, X.ndim)),
                        keepdims=True, dtype=_PARTIAL, split_every=split_every,
                        concatenate=False, meta=np.empty((0,) * X.ndim, _PARTIAL))
    if not centered:  # the weighted mean of the mean squares (M2 unused)
        return da.zeros_like(part["mean"], dtype=np.float64), part["mean"]
    return part["mean"], part["M2"] / part["count"]


def _normalize_block(block, a, params, columns, epsilon, centered, mean, var, out_dtype):
    """Y of one block from its rows' float64 statistics, with the arithmetic of
    :func:`normkernels.ops.rows.normalize` (its fused path when the parameters are per
    column and Y has X's dtype, else its general path) on the block's rows."""
    from normkernels.engine.numba_engine import ENGINE

    shape = block.shape
    M, K = _rows.rows_shape(shape, a)
    Y = np.empty(shape, out_dtype)
    if block.size == 0:
        return Y
    mean = np.ascontiguousarray(np.reshape(mean, M), np.float64)
    var = np.ascontiguousarray(np.reshape(var, M), np.float64)
    s, b = params[0], params[1] if len(params) > 1 else None
    if columns and out_dtype == block.dtype:
        ENGINE.rows_from_statistics(_rows.rows_in(block, M, K), Y.reshape(M, K), s.reshape(K),
                                    None if b is None else b.reshape(K), epsilon, centered,
                                    mean, var)
        return Y
    wide = _rows.wide_dtype(block.dtype, out_dtype)
    z = np.empty((M, K), wide)
    if columns:
        ENGINE.rows_from_statistics(block.reshape(M, K).astype(wide), z, s.reshape(K),
                                    None if b is None else b.reshape(K), epsilon, centered,
                                    mean, var)
    else:
        ENGINE.rows_from_statistics(block.reshape(M, K).astype(wide), z, np.ones(K, wide), None,
                                    epsilon, centered, mean, var)
    z = z.reshape(shape)
    with np.errstate(all="ignore"):
        if not columns:
            z = z * s.astype(wide)
            if b is not None:
                z = z + b.astype(wide)
    np.copyto(Y, z.astype(out_dtype, copy=False))
    return Y


def _rows_blockwise(fn, X, args, outputs):
    """``fn(block, *argument_blocks)`` over X's blocks, lazily. ``args``: ``[(array,
    index), ...]``; ``outputs``: ``[(dtype, chunks), ...]``, one (Y: X's chunks) or
    several (``fn`` returns a tuple: Y, then per-row statistics)."""
    da = _dask()
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


def _rows_whole(X, a):
    """Every normalized axis of X is one chunk: each block holds whole rows."""
    return all(len(X.chunks[i]) == 1 for i in range(a, X.ndim))


def _row_statistics(da, X, a, centered, split_every, compute_statistics):
    """The merged per-row ``(mean, var)`` (keepdims) and the same without the
    normalized axes (the blockwise arguments), computed now with
    ``compute_statistics``."""
    mean, var = _row_moments(da, X, a, centered, split_every)
    if compute_statistics:
        import dask

        mean, var = (da.from_array(v, chunks=mean.chunks) for v in dask.compute(mean, var))
    squeeze = tuple(range(a, X.ndim))
    return mean, var, da.squeeze(mean, axis=squeeze), da.squeeze(var, axis=squeeze)


def _check_row_rank(label, X, a, what):
    M, K = _rows.rows_shape(X.shape, a)
    if K == 0 and M > 0:
        raise ValueError(f"{label}: X of shape {X.shape} has rows of zero elements (axis {a}): "
                         f"their {what} undefined")


def layer_normalization(X, Scale, B=None, *, axis=-1, epsilon=None, stash_type=None,
                        num_outputs=1, opset=17, split_every=None, compute_statistics=False):
    """:func:`normkernels.layer_normalization` on a dask array: ``Y``, or ``(Y, Mean)``
    or ``(Y, Mean, InvStdDev)`` (``num_outputs``), all lazy; the statistics shaped
    ``X.shape[:axis] + (1, ...)`` in the stash type.

    ``Scale`` and ``B`` (optional): NumPy or dask arrays of X's dtype that broadcast
    unidirectionally to X; they may also vary along the leading axes (the general
    path of the NumPy function, with the same arithmetic).

    * The normalized axes (``axis..``) each one chunk: blockwise, every block through
      :func:`normkernels.layer_normalization` (bitwise what normkernels gives).
    * A normalized axis in several chunks: per-row partial moments of every block
      (float64, two passes) merged by Chan's formula in dask's tree reduction
      (``split_every``), then a blockwise normalize of each block with its rows'
      statistics, by normkernels' row kernel. Mean is the merged mean and InvStdDev
      ``1 / sqrt(var + epsilon)`` in float64, each rounded once to the stash type.
      ``compute_statistics=True`` computes the statistics now (see
      :func:`batch_normalization`; no effect with whole rows, read once).
    """
    da = _check(X, rows=True)
    version = _ln.version_for(opset)
    label = version.label(_ln.OP)
    attrs = common.resolve_attributes(label, version, {"axis": axis, "epsilon": epsilon,
                                                       "stash_type": stash_type})
    eps = common.check_epsilon(label, attrs["epsilon"])
    stash = _ln.stash_dtype(label, attrs["stash_type"])
    n_out = _ln.check_outputs(label, num_outputs, 3)
    arrays = {"X": _row_array("X", X), "Scale": _row_array("Scale", Scale)}
    if B is not None:
        arrays["B"] = _row_array("B", B)
    for name, arr in arrays.items():
        common.check_dtype(label, name, arr, version.dtypes)
    common.check_same_dtype(label, "T", arrays)
    a = _rows.normalized_axis(label, "axis", attrs["axis"], X.ndim)
    X = arrays["X"]
    params = [p for name, p in arrays.items() if name != "X"]
    for name, p in arrays.items():
        if name != "X":
            _rows.check_broadcast(label, name, p, X.shape)
    _check_row_rank(label, X, a, "mean and variance are")
    args, columns = _row_params(params, X, a)
    stats_chunks = X.chunks[:a] + ((1,),) * (X.ndim - a)
    outputs = [(X.dtype, X.chunks)] + [(stash, stats_chunks)] * (n_out - 1)
    if _rows_whole(X, a):
        def whole(block, *param_blocks):
            return normkernels.layer_normalization(
                block, *param_blocks, axis=a, epsilon=eps, stash_type=attrs["stash_type"],
                num_outputs=n_out, opset=opset)

        return _rows_blockwise(whole, X, args, outputs)
    mean, var, lead_mean, lead_var = _row_statistics(da, X, a, True, split_every,
                                                     compute_statistics)
    lead = tuple(range(a))

    def normalize(block, m, v, *param_blocks):
        return _normalize_block(block, a, param_blocks, columns, eps, True, m, v, X.dtype)

    Y = _rows_blockwise(normalize, X, [(lead_mean, lead), (lead_var, lead), *args],
                        outputs[:1])
    if n_out == 1:
        return Y
    inv = var.map_blocks(_rows.inverse_std, eps, dtype=np.float64)
    return (Y, mean.astype(stash), inv.astype(stash))[:n_out]


def rms_normalization(X, scale, *, axis=-1, epsilon=None, stash_type=None, opset=23,
                      split_every=None, compute_statistics=False):
    """:func:`normkernels.rms_normalization` on a dask array: lazy Y in scale's dtype.

    ``scale``: a NumPy or dask array (any float dtype) broadcasting unidirectionally
    to X, per column or also varying along the leading axes. Whole normalized axes:
    blockwise through :func:`normkernels.rms_normalization` (bitwise); chunked ones:
    per-row float64 mean squares of every block merged as a weighted mean in dask's
    tree reduction, then a blockwise normalize with them (as
    :func:`layer_normalization`)."""
    da = _check(X, rows=True)
    version = _rms.version_for(opset)
    label = version.label(_rms.OP)
    attrs = common.resolve_attributes(label, version, {"axis": axis, "epsilon": epsilon,
                                                       "stash_type": stash_type})
    eps = common.check_epsilon(label, attrs["epsilon"])
    _ln.stash_dtype(label, attrs["stash_type"], _rms.RMS_STASH)  # checked; no output has it
    X, scale = _row_array("X", X), _row_array("scale", scale)
    for name, arr in (("X", X), ("scale", scale)):
        common.check_dtype(label, name, arr, version.dtypes)
    a = _rows.normalized_axis(label, "axis", attrs["axis"], X.ndim)
    _rows.check_broadcast(label, "scale", scale, X.shape)
    _check_row_rank(label, X, a, "mean square is")
    args, columns = _row_params([scale], X, a)
    out_dtype = scale.dtype
    if _rows_whole(X, a):
        def whole(block, s):
            return normkernels.rms_normalization(block, s, axis=a, epsilon=eps,
                                                 stash_type=attrs["stash_type"], opset=opset)

        return _rows_blockwise(whole, X, args, [(out_dtype, X.chunks)])
    _, _, lead_mean, lead_var = _row_statistics(da, X, a, False, split_every,
                                                compute_statistics)
    lead = tuple(range(a))

    def normalize(block, m, v, s):
        return _normalize_block(block, a, (s,), columns, eps, False, m, v, out_dtype)

    return _rows_blockwise(normalize, X, [(lead_mean, lead), (lead_var, lead), *args],
                           [(out_dtype, X.chunks)])

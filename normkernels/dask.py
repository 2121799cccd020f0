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
"""

import numpy as np

import normkernels
from normkernels.ops import batch_normalization as _bn
from normkernels.ops import common
from normkernels.ops import instance_normalization as _in
from normkernels.ops.moments import merge

_PARTIAL = np.dtype([("count", np.int64), ("mean", np.float64), ("M2", np.float64)])


def _dask():
    try:
        import dask.array as da
    except ImportError:
        raise ImportError("normkernels.dask needs dask: pip install 'normkernels[dask]'") \
            from None
    return da


def _check(X, name="X"):
    da = _dask()
    if not isinstance(X, da.Array):
        raise TypeError(f"normkernels.dask: {name} must be a dask.array.Array, got "
                        f"{type(X).__name__} (NumPy arrays go to normkernels' own functions)")
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
    out["count"] = np.reshape(count, shape)
    out["mean"] = np.reshape(mean, shape)
    out["M2"] = np.reshape(m2, shape)
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

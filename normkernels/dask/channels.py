"""The strategies of :mod:`normkernels.dask` for normalizations with per-channel
parameters (:class:`normkernels.operators.record.Chunked`): each takes a record and
returns its function on dask arrays. Statistics come from the tree reduction of
per-block partial moments (:mod:`normkernels.dask.reduction`); the normalize pass is
blockwise, each block with the parameters of its own channels, through the
normkernels kernels (so a block's Y is bitwise what normkernels gives for that block
with those statistics)."""

import importlib

import numpy as np

from normkernels import api
from normkernels.dask.docstrings import document
from normkernels.dask.reduction import (
    blockwise,
    channel_axis,
    check,
    partial_moments,
    per_channel,
    reduce_moments,
    write_into,
)
from normkernels.ops import common
from normkernels.ops import layer_normalization as _ln

# what the docstrings say of the parameters and of Y (normkernels.dask.docstrings)
PER_CHANNEL = "NumPy or dask arrays of shape (C,), rechunked like X's channel axis"
Y_RETURNED = ("dask.array.Array", "Lazy Y, of X's shape, dtype and chunks.")


def _spec(op):
    return importlib.import_module(f"normkernels.ops.{op.spec}")


def batch(op):
    """ONNX BatchNormalization (opsets 14 and 15): inference blockwise, training by
    per-channel moments merged across chunks."""
    fn = getattr(api, op.function)
    spec = _spec(op)

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
        da = check(X)
        if spec.version_for(opset).counts_outputs:
            raise NotImplementedError(f"normkernels.dask.batch_normalization: opset {opset!r}; "
                                      "only opsets 14 and 15 (training_mode) are supported on "
                                      "dask arrays")
        call = spec.prepare(opset, {"epsilon": epsilon, "momentum": momentum,
                                   "training_mode": training_mode}, data_format=data_format)
        c_axis = channel_axis(X, data_format)
        params = [per_channel(p, X, c_axis) for p in (scale, B, input_mean, input_var)]
        spec.check_types(call.version, dict(zip(spec.INPUTS, (X, *params), strict=True)))
        eps, mom = call.epsilon, call.momentum

        def normalize(block, s, b, m, v, out=None):
            return fn(block, s, b, m, v, epsilon=eps, opset=opset,
                                                   data_format=data_format, out=out)

        if not call.training:
            if out is not None:
                write_into(out, normalize, X, c_axis, params).compute()
                return out
            return blockwise(normalize, X, c_axis, params, X.dtype)
        count, mean, m2 = partial_moments(X, data_format=data_format)
        var = m2 / count
        if compute_statistics:
            import dask

            mean, var = (da.from_array(v) for v in dask.compute(mean, var))
        stats_dtype = params[2].dtype
        running_mean = (params[2].astype(np.float64) * mom + mean * (1 - mom)).astype(stats_dtype)
        running_var = (params[3].astype(np.float64) * mom + var * (1 - mom)).astype(stats_dtype)
        batch = [params[0], params[1], per_channel(mean, X, c_axis), per_channel(var, X, c_axis)]
        if out is not None:
            import dask

            tokens = write_into(out, normalize, X, c_axis, batch)
            _, running_mean, running_var = dask.compute(tokens, running_mean, running_var)
            return out, running_mean, running_var
        Y = blockwise(normalize, X, c_axis, batch, X.dtype)
        return Y, running_mean, running_var

    return document(
        op, batch_normalization, ("dask.array.Array or tuple of dask.array.Array",
                                  "Inference: lazy Y, of X's shape, dtype and chunks. "
                                  "Training: lazy ``(Y, running_mean, running_var)``, the "
                                  "running statistics in input_mean's dtype. With ``out``: "
                                  "``out``, computed (in training with the running "
                                  "statistics as NumPy arrays)."),
        inputs=PER_CHANNEL,
        arguments={"out": ("ndarray, optional", "A NumPy array of X's shape and dtype: "
                           "everything is computed now, each block's Y written straight "
                           "into it.")},
        raises=[("NotImplementedError", "``opset`` below 14 (the opsets whose outputs say "
                 "whether a node trains).")])


def given(op):
    """Statistics given (oneDNN BatchNormInference): every block with its channels'
    parameters, blockwise."""
    fn = getattr(api, op.function)

    def batch_norm_inference(input, gamma, beta, mean, variance, *, epsilon, data_format="NXC"):
        """:func:`normkernels.batch_norm_inference` (oneDNN) on a dask array, blockwise."""
        check(input, "input")
        c_axis = channel_axis(input, data_format)
        params = [per_channel(p, input, c_axis) for p in (gamma, beta, mean, variance)]

        def normalize(block, g, b, m, v):
            return fn(block, g, b, m, v, epsilon=epsilon,
                                                    data_format=data_format)

        return blockwise(normalize, input, c_axis, params, input.dtype)

    return document(op, batch_norm_inference, Y_RETURNED, inputs=PER_CHANNEL)


def instance(op):
    """Per-(n, c) statistics merged across the spatial chunks (InstanceNormalization)."""
    spec = _spec(op)

    def instance_normalization(input, scale, B, *, epsilon=None, opset=22, data_format="NCX",
                               compute_statistics=False):
        """:func:`normkernels.instance_normalization` on a dask array: per-(n, c)
        statistics by a tree reduction over the spatial chunks, then a blockwise normalize
        of every sample with its own statistics (``compute_statistics``: as in
        :func:`batch_normalization`)."""
        da = check(input, "input")
        version, label, eps = spec.prepare(opset, {"epsilon": epsilon})
        c_axis = channel_axis(input, data_format)
        params = [per_channel(p, input, c_axis) for p in (scale, B)]
        spec.check_types(version, label, {"input": input, "scale": params[0], "B": params[1]})
        spec.check_rank(version, label, input.shape)
        part = reduce_moments(input, data_format, True, None)
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
                out[n:n + 1] = api.batch_normalization(
                    sl, s.astype(np.float64), b.astype(np.float64), m[n], v[n], epsilon=eps,
                    opset=15, data_format=data_format)
            return out

        return da.blockwise(normalize, index, input, index, params[0], (c_axis,), params[1],
                            (c_axis,), mean, (0, c_axis), var, (0, c_axis), dtype=input.dtype,
                            concatenate=True)

    return document(op, instance_normalization, Y_RETURNED, inputs=PER_CHANNEL)


def group(op):
    """Per-(n, c) moments merged per (n, group) (ONNX GroupNormalization)."""
    spec = _spec(op)

    def group_normalization(X, scale, bias, *, num_groups, epsilon=None, stash_type=None,
                            opset=21, data_format="NCX", compute_statistics=False):
        """:func:`normkernels.group_normalization` on a dask array chunked along any axes
        (a chunk may split a group): per-(n, c) partial moments by the tree reduction of
        :func:`instance_normalization`, merged per (n, group) by Chan's formula (the
        group's channels in order), then a blockwise normalize of every sample with its
        groups' statistics (``compute_statistics``: as in :func:`batch_normalization`)."""
        da = check(X)
        version = spec.version_for(opset)
        label = version.label(spec.OP)
        attrs = common.resolve_attributes(label, version, {"epsilon": epsilon,
                                                           "stash_type": stash_type})
        eps = common.check_epsilon(label, attrs["epsilon"])
        if "stash_type" in attrs:
            _ln.stash_dtype(label, attrs["stash_type"], spec.STASH_TYPES)
        c_axis = channel_axis(X, data_format)
        C = X.shape[c_axis]
        G = spec.check_groups(label, "num_groups", num_groups, C)
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
        params = [per_channel(p, X, c_axis) for p in (scale, bias)]
        part = reduce_moments(X, data_format, True, None)  # (N, C) partials
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
                out[n:n + 1] = api.batch_normalization(
                    block[n:n + 1], s.astype(np.float64), b.astype(np.float64), m[n], v[n],
                    epsilon=eps, opset=15, data_format=data_format)
            return out

        return da.blockwise(normalize, index, X, index, params[0], (c_axis,), params[1],
                            (c_axis,), mean_c, (0, c_axis), var_c, (0, c_axis), dtype=X.dtype,
                            concatenate=True)

    return document(op, group_normalization, Y_RETURNED,
                    inputs=PER_CHANNEL + " (opset 18: per group, of shape (num_groups,))")

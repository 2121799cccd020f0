"""The row strategy of :mod:`normkernels.dask` (LayerNormalization and
RMSNormalization; per row: the axes ``axis..``) and what the "whole" strategy takes
from it: parameters that broadcast to X as blockwise arguments.

When every normalized axis is one chunk, each block holds whole rows and goes
through the normkernels function: every output is bitwise what normkernels gives.
When the normalized axes are chunked, each block's part of every row gives float64
partial moments (two passes in NumPy; for RMS the mean square, merged as a weighted
mean), merged by Chan's formula in dask's tree reduction (:func:`row_moments`), then
each block is normalized with its rows' statistics by normkernels' row kernel (the
arithmetic of :func:`normkernels.layer_normalization` given those statistics, bit for
bit). Scale and B may be NumPy or dask arrays and may vary along the leading axes
too (as the NumPy functions allow)."""

import importlib

import numpy as np

from normkernels import api
from normkernels.dask.docstrings import document
from normkernels.dask.reduction import (
    PARTIAL,
    aggregate,
    blockwise_outputs,
    check,
    combine,
    dask_array,
    structured,
)
from normkernels.ops import common
from normkernels.ops import layer_normalization as _ln
from normkernels.ops import rows as _rows


def row_array(name, p):
    """An input as a dask array or an ndarray (array-likes converted), in native byte
    order, as the NumPy functions convert them."""
    if not isinstance(p, dask_array().Array):
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
    da = dask_array()
    shape, chunks = X.shape[first:], X.chunks[first:]
    p = da.asarray(p)
    if p.ndim > len(shape):  # leading axes of length 1 (checked by the caller)
        p = p.reshape(p.shape[p.ndim - len(shape):])
    p = p.reshape((1,) * (len(shape) - p.ndim) + p.shape)
    p = p.rechunk(tuple((1,) if d == 1 else c for d, c in zip(p.shape, chunks, strict=True)))
    return da.broadcast_to(p, shape, chunks=chunks)


def row_params(params, X, a):
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
        return structured(0, 0.0, 0.0, shape)
    M, K = _rows.rows_shape(block.shape, a)
    x = _rows.rows_in(block, M, K).astype(np.float64)
    with np.errstate(all="ignore"):
        if centered:
            mean = x.mean(axis=1)
            dev = x - mean[:, None]
            m2 = np.einsum("ij,ij->i", dev, dev)
        else:
            mean, m2 = np.einsum("ij,ij->i", x, x) / K, 0.0
    return structured(K, mean, m2, shape)


def row_moments(X, *, axis=-1, centered=True, split_every=None):
    """Per-row float64 ``(mean, var)`` of a dask array over the axes ``axis..`` (lazy,
    shape ``X.shape[:axis] + (1, ...)``): the rows' partial moments in every block,
    merged by Chan's formula in dask's tree reduction. ``var`` is the population
    variance, or with ``centered=False`` the mean square (and ``mean`` 0): the
    statistics :func:`layer_normalization` and :func:`rms_normalization` normalize
    with.

    Parameters
    ----------
    X : dask.array.Array
        Of a float dtype, chunked along any axes (its chunk sizes known).
    axis : int, default -1
        The first normalized axis: each row is ``X[i, ..., :, ...]`` over ``axis..``.
    centered : bool, default True
        The mean and population variance; False: 0 and the mean square.
    split_every : int or dict, optional
        The fan-in of dask's tree reduction (``dask.array.reduction``'s).

    Returns
    -------
    mean, var : dask.array.Array
        Lazy, float64, of shape ``X.shape[:axis] + (1, ...)``.

    Raises
    ------
    TypeError
        ``X`` is not a dask array.
    ValueError
        ``X`` has unknown chunk sizes or is not of a float dtype, or ``axis`` is out of
        range.

    Examples
    --------
    >>> import dask.array as da
    >>> import normkernels.dask
    >>> X = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    >>> mean, var = normkernels.dask.row_moments(da.from_array(X, chunks=(1, 2, 2)))
    >>> mean.shape
    (2, 3, 1)
    >>> mean.compute().ravel(), var.compute().ravel()
    (array([ 1.5,  5.5,  9.5, 13.5, 17.5, 21.5]), array([1.25, 1.25, 1.25, 1.25, 1.25, 1.25]))
    >>> _, square = normkernels.dask.row_moments(da.from_array(X, chunks=(1, 2, 2)), axis=1,
    ...                                          centered=False)
    >>> np.allclose(square.compute(), (X.astype(np.float64) ** 2).mean(axis=(1, 2),
    ...                                                                 keepdims=True))
    True
    """
    da = check(X, rows=True)
    label = "normkernels.dask.row_moments"
    common.check_dtype(label, "X", X, common.ALL_FLOATS)
    a = _rows.normalized_axis(label, "axis", axis, X.ndim)
    return _row_moments(da, X, a, centered, split_every)


def _row_moments(da, X, a, centered, split_every):
    def chunk(block, axis, keepdims, computing_meta=False):
        return _row_chunk(block, axis, keepdims, centered, computing_meta)

    part = da.reduction(X, chunk, aggregate, combine=combine, axis=tuple(range(a, X.ndim)),
                        keepdims=True, dtype=PARTIAL, split_every=split_every,
                        concatenate=False, meta=np.empty((0,) * X.ndim, PARTIAL))
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
    if not columns and block.dtype == out_dtype == np.float32 and _rows.float32_lanes():
        from normkernels.reference.rows import float32_rows  # the general path's formula

        full = lambda p: np.broadcast_to(p, shape).reshape(M, K)  # noqa: E731
        z = float32_rows(_rows.rows_in(block, M, K), full(s), None if b is None else full(b),
                           epsilon, centered, mean, var)
        np.copyto(Y, z.reshape(shape))
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


def rows_whole(X, a):
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


def check_row_rank(label, X, a, what):
    M, K = _rows.rows_shape(X.shape, a)
    if K == 0 and M > 0:
        raise ValueError(f"{label}: X of shape {X.shape} has rows of zero elements (axis {a}): "
                         f"their {what} undefined")


def _resolve(spec, X, opset, axis, epsilon, stash_type):
    """X checked, and the version, label, attributes and epsilon of the call."""
    da = check(X, rows=True)
    version = spec.version_for(opset)
    label = version.label(spec.OP)
    attrs = common.resolve_attributes(label, version, {"axis": axis, "epsilon": epsilon,
                                                       "stash_type": stash_type})
    return da, version, label, attrs, common.check_epsilon(label, attrs["epsilon"])


def rows(op):
    """Per-row moments merged across chunks of the normalized axes: ONNX
    LayerNormalization (family "layer") and RMSNormalization ("rms")."""
    fn = getattr(api, op.function)
    spec = importlib.import_module(f"normkernels.ops.{op.spec}")
    if op.family == "layer":
        def layer_normalization(X, Scale, B=None, *, axis=-1, epsilon=None, stash_type=None,
                                num_outputs=1, opset=17, split_every=None,
                                compute_statistics=False):
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
            da, version, label, attrs, eps = _resolve(spec, X, opset, axis, epsilon,
                                                      stash_type)
            stash = spec.stash_dtype(label, attrs["stash_type"])
            n_out = spec.check_outputs(label, num_outputs, 3)
            arrays = {"X": row_array("X", X), "Scale": row_array("Scale", Scale)}
            if B is not None:
                arrays["B"] = row_array("B", B)
            for name, arr in arrays.items():
                common.check_dtype(label, name, arr, version.dtypes)
            common.check_same_dtype(label, "T", arrays)
            a = _rows.normalized_axis(label, "axis", attrs["axis"], X.ndim)
            X = arrays["X"]
            params = [p for name, p in arrays.items() if name != "X"]
            for name, p in arrays.items():
                if name != "X":
                    _rows.check_broadcast(label, name, p, X.shape)
            check_row_rank(label, X, a, "mean and variance are")
            args, columns = row_params(params, X, a)
            stats_chunks = X.chunks[:a] + ((1,),) * (X.ndim - a)
            outputs = [(X.dtype, X.chunks)] + [(stash, stats_chunks)] * (n_out - 1)
            if rows_whole(X, a):
                def whole(block, *param_blocks):
                    return fn(
                        block, *param_blocks, axis=a, epsilon=eps, stash_type=attrs["stash_type"],
                        num_outputs=n_out, opset=opset)

                return blockwise_outputs(whole, X, args, outputs)
            mean, var, lead_mean, lead_var = _row_statistics(da, X, a, True, split_every,
                                                             compute_statistics)
            lead = tuple(range(a))

            def normalize(block, m, v, *param_blocks):
                return _normalize_block(block, a, param_blocks, columns, eps, True, m, v, X.dtype)

            Y = blockwise_outputs(normalize, X, [(lead_mean, lead), (lead_var, lead), *args],
                                outputs[:1])
            if n_out == 1:
                return Y
            inv = var.map_blocks(_rows.inverse_std, eps, dtype=np.float64)
            return (Y, mean.astype(stash), inv.astype(stash))[:n_out]

        return document(op, layer_normalization, (
            "dask.array.Array or tuple of dask.array.Array",
            "Lazy ``Y`` (X's shape, dtype and chunks), or ``(Y, Mean)`` or ``(Y, Mean, "
            "InvStdDev)`` (``num_outputs``), the statistics of shape ``X.shape[:axis] + "
            "(1, ...)`` in the stash type."),
            inputs="NumPy or dask arrays of X's dtype broadcasting unidirectionally to X "
                   "(per column, or varying along the leading axes too); ``B`` optional")

    def rms_normalization(X, scale, *, axis=-1, epsilon=None, stash_type=None, opset=23,
                          split_every=None, compute_statistics=False):
        """:func:`normkernels.rms_normalization` on a dask array: lazy Y in scale's dtype.

        ``scale``: a NumPy or dask array (any float dtype) broadcasting unidirectionally
        to X, per column or also varying along the leading axes. Whole normalized axes:
        blockwise through :func:`normkernels.rms_normalization` (bitwise); chunked ones:
        per-row float64 mean squares of every block merged as a weighted mean in dask's
        tree reduction, then a blockwise normalize with them (as
        :func:`layer_normalization`)."""
        da, version, label, attrs, eps = _resolve(spec, X, opset, axis, epsilon, stash_type)
        _ln.stash_dtype(label, attrs["stash_type"], spec.RMS_STASH)  # checked; no output has it
        X, scale = row_array("X", X), row_array("scale", scale)
        for name, arr in (("X", X), ("scale", scale)):
            common.check_dtype(label, name, arr, version.dtypes)
        a = _rows.normalized_axis(label, "axis", attrs["axis"], X.ndim)
        _rows.check_broadcast(label, "scale", scale, X.shape)
        check_row_rank(label, X, a, "mean square is")
        args, columns = row_params([scale], X, a)
        out_dtype = scale.dtype
        if rows_whole(X, a):
            def whole(block, s):
                return fn(block, s, axis=a, epsilon=eps,
                                                     stash_type=attrs["stash_type"], opset=opset)

            return blockwise_outputs(whole, X, args, [(out_dtype, X.chunks)])
        _, _, lead_mean, lead_var = _row_statistics(da, X, a, False, split_every,
                                                    compute_statistics)
        lead = tuple(range(a))

        def normalize(block, m, v, s):
            return _normalize_block(block, a, (s,), columns, eps, False, m, v, out_dtype)

        return blockwise_outputs(normalize, X, [(lead_mean, lead), (lead_var, lead), *args],
                               [(out_dtype, X.chunks)])

    return document(op, rms_normalization,
                    ("dask.array.Array", "Lazy Y, of X's shape and chunks, in scale's dtype."),
                    inputs="a NumPy or dask array (any float dtype) broadcasting "
                           "unidirectionally to X")

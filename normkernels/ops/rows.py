"""The row normalizations' shared spec layer: axes, parameter broadcasting, layouts.

A row normalization normalizes each of the ``M = prod(X.shape[:a])`` rows of
``K = prod(X.shape[a:])`` elements (``a`` the normalized axis) and scales and shifts
the result by parameters that broadcast to X. The engine
(:meth:`normkernels.engine.Engine.normalize_rows`) takes 2-D rows and parameters per
column; :func:`normalize` gets every call there:

* **fused**: parameters that vary only along the normalized axes (the usual case, and
  the only one the ONNX function bodies and onnxruntime accept) become ``K``-column
  tables and the kernel writes Y in X's dtype in one pass;
* **general**: parameters that also vary along the leading axes (legal by the ONNX
  prose: "unidirectionally broadcastable to X"), or an output dtype other than X's
  (RMSNormalization with scale of another type): the kernel writes the normalized
  value in the compute dtype and NumPy applies the parameters with the same
  roundings (a product, then a sum, in the compute dtype; one rounding to the
  output dtype), so both give the same bits.

An epilogue (``activation=``, ``add=``: a package extension) makes ``Y = act(affine +
add)``: on the fused path the kernel adds the residual and applies the activation
while Y is in registers; on the general path NumPy adds the residual (in the wide
dtype) and the engine's per-channel loop applies the activation to the value rounded
to the activations' compute dtype, as the kernels do.
"""

import math
from typing import NamedTuple

import numpy as np

from normkernels.dtypes import FLOAT32, FLOAT64, row_compute_dtype
from normkernels.ops import common, plans


def normalized_axis(label, name, axis, ndim):
    """``axis`` as an index in ``[0, ndim)``: an integer in ``[-ndim, ndim)``."""
    if not common.is_integer(axis):
        raise TypeError(f"{label}: {name} must be an integer, got {type(axis).__name__} "
                        f"{axis!r}")
    if ndim == 0:
        raise ValueError(f"{label}: X must have at least 1 dimension, got a 0-d array")
    if not -ndim <= axis < ndim:
        raise ValueError(f"{label}: {name} must be in [{-ndim}, {ndim}) for {ndim}-D input, "
                         f"got {axis}")
    return int(axis) % ndim


def rows_shape(shape, a):
    """``(M, K)``: the rows and the row length for normalized axes ``a..``."""
    return math.prod(shape[:a]), math.prod(shape[a:])


def statistics_shape(shape, a):
    """ONNX's shape of per-row statistics: ``shape[:a] + (1,) * (len(shape) - a)``."""
    return tuple(shape[:a]) + (1,) * (len(shape) - a)


def check_broadcast(label, name, p, shape):
    """``p`` broadcasts unidirectionally to ``shape`` (NumPy's rules, ``p`` never
    growing the result)."""
    ok = p.ndim <= len(shape) and all(
        d == 1 or d == s for d, s in zip(p.shape[::-1], shape[::-1], strict=False))
    if not ok:
        raise ValueError(f"{label}: {name} of shape {p.shape} does not broadcast "
                         f"unidirectionally to X's shape {tuple(shape)}")


def column_table(p, shape, a):
    """``p`` (broadcastable to ``shape``) as ``K`` values per column when it does not
    vary along the leading axes ``[0, a)`` (a view, possibly with zero strides), else
    None."""
    lead = p.ndim - (len(shape) - a)  # how many of p's axes fall on the leading axes
    if lead > 0:
        if any(d != 1 for d in p.shape[:lead]):
            return None
        p = p.reshape(p.shape[lead:])
    return np.broadcast_to(p, shape[a:]).reshape(-1)


def _rows_view(X, M, K):
    """``X`` as ``M x K`` rows the kernels can read without a copy (rows contiguous,
    row stride non-negative), or None."""
    if X.flags.c_contiguous:
        return X.reshape(M, K)
    try:
        v = X.reshape(M, K, copy=False)
    except (ValueError, TypeError):  # TypeError: NumPy < 2.1 has no copy=
        return None
    if K > 1 and v.strides[1] != v.itemsize:
        return None
    if M > 1 and (v.strides[0] < 0 or v.strides[0] % v.itemsize):
        return None
    return v


def rows_in(X, M, K):
    """``X`` as ``M x K`` rows for the kernels: a view, or a C-contiguous copy."""
    v = _rows_view(X, M, K)
    return v if v is not None else np.ascontiguousarray(X).reshape(M, K)


def check_out(label, out, X, params, dtype=None, res=None):
    """``out`` for Y: X's shape and ``dtype`` (X's by default); see common.check_out.
    ``res``: a residual the kernel reads (``out`` may be it, exactly)."""
    if dtype is not None and dtype != X.dtype:
        if not isinstance(out, np.ndarray):
            raise TypeError(f"{label}: out must be a numpy.ndarray, got {type(out).__name__}")
        if out.shape != X.shape or out.dtype != dtype:
            raise ValueError(f"{label}: out must have shape {X.shape} and dtype {dtype}, "
                             f"got ({out.shape}, {out.dtype})")
        if not out.flags.writeable:
            raise ValueError(f"{label}: out is read-only")
        named = {"X": X, **params, **({} if res is None else {"add": res})}
        for name, p in named.items():
            if np.may_share_memory(out, p) and np.shares_memory(out, p):
                raise ValueError(f"{label}: out shares memory with {name}")
        return
    common.check_out(label, out, X, params, None if res is None else {"X": X, "add": res})


def wide_dtype(*dtypes):
    """The row compute dtype that holds every one of ``dtypes`` exactly (float32 only
    when all are 16-bit)."""
    return FLOAT64 if any(row_compute_dtype(d) == FLOAT64 for d in dtypes) else FLOAT32


def normalize(X, a, scale, B, epsilon, centered, engine, path=None, out=None, out_dtype=None,
              skip=None, bias=None, sums=None, act=None, res=None, rounding="once"):
    """Y of a row normalization of X over axes ``a..``, and float64 per-row ``(mean,
    var)`` (``var``: the mean square when not ``centered``; mean 0).

    ``scale`` and ``B`` (None: no shift) are checked arrays broadcastable to X;
    ``out_dtype`` is Y's dtype (X's by default); ``skip`` (``Ms x K`` rows, ``Ms``
    dividing M), ``bias`` (``K``) and ``sums`` (an ``M x K`` array for ``x + skip +
    bias``) are onnxruntime's skip add (fused path only: the caller guarantees
    parameters per column and ``out_dtype`` X's). ``act`` (an activation's name, or
    None) and ``res`` (a checked residual of X's shape and dtype, or None) are the
    epilogue ``Y = act(affine + res)``. ``rounding`` ("once" or "llama": see
    :func:`normkernels.ops.common.check_rounding`).
    """
    shape = X.shape
    out_dtype = X.dtype if out_dtype is None else out_dtype
    M, K = rows_shape(shape, a)
    Y = out if out is not None else np.empty(shape, out_dtype)
    if X.size == 0:
        return Y, np.zeros(M), np.zeros(M)
    s = column_table(scale, shape, a)
    b = None if B is None else column_table(B, shape, a)
    if out_dtype == X.dtype and s is not None and (B is None or b is not None):
        x2 = rows_in(X, M, K)
        y2 = _rows_view(Y, M, K)
        target = y2 if y2 is not None else np.empty((M, K), out_dtype)
        extra = common.epilogue(act, None if res is None else rows_in(res, M, K))
        if rounding != "once":  # an engine call without it passes none (older engines)
            extra["rounding"] = rounding
        mean, var = engine.normalize_rows(x2, target, s, b, epsilon, centered, skip=skip,
                                          bias=bias, sums=sums, path=path, **extra)
        if y2 is None:
            np.copyto(Y, target.reshape(shape))
        return Y, mean, var
    if X.dtype == out_dtype == FLOAT32 and rounding == "once" and float32_lanes():
        return _general_float32(X, scale, B, epsilon, centered, engine, path, Y, M, K, act,
                                res)
    # general: the kernel gives the normalized value (with the column parameters when
    # there are) in the wide compute dtype, NumPy applies the others
    wide = wide_dtype(X.dtype, out_dtype)
    x2 = X.reshape(M, K).astype(wide)
    z = np.empty((M, K), wide)
    ones = np.ones(K, wide)
    # llama: the kernel's normalized value, rounded to X's dtype, then NumPy's products
    columns = s is not None and (B is None or b is not None) and rounding == "once"
    mean, var = engine.normalize_rows(x2, z, s if columns else ones, b if columns else None,
                                      epsilon, centered, path=path)
    z = z.reshape(shape)
    with np.errstate(all="ignore"):
        if rounding == "llama":
            z = z.astype(X.dtype).astype(wide)
        if not columns:
            z = z * scale.astype(wide)
            if B is not None:
                z = z + B.astype(wide)
        if res is not None:
            z = z + res.astype(wide)
    if act is not None:
        z = _activated(z, act, out_dtype, engine, path)
    np.copyto(Y, z.astype(out_dtype, copy=False))
    return Y, mean, var


def float32_lanes():
    """True when float32 rows normalize in float32 lanes on the JIT target (FMA)."""
    from normkernels.reference.rows import float32_lanes as lanes  # the target, when asked

    return lanes()


def _general_float32(X, scale, B, epsilon, centered, engine, path, Y, M, K, act, res):
    """The general path of float32 rows on FMA targets: the kernels' statistics, then
    their float32 lanes' arithmetic per element in NumPy (``reference.rows``), so a
    parameter that varies along the leading axes gives the bits of the same values
    given per column."""
    from normkernels.reference.rows import float32_rows

    x2 = rows_in(X, M, K)
    mean, var = engine.normalize_rows(x2, np.empty((M, K), FLOAT32), np.ones(K, FLOAT32),
                                      None, epsilon, centered, path=path)
    full = lambda p: np.broadcast_to(p, X.shape).reshape(M, K)  # noqa: E731
    z = float32_rows(x2, full(scale), None if B is None else full(B), epsilon, centered,
                       mean, var, None, None if res is None else rows_in(res, M, K))
    if act is not None:
        z = _activated(z, act, FLOAT32, engine, path)
    np.copyto(Y, z.reshape(X.shape))
    return Y, mean, var


def _activated(z, act, out_dtype, engine, path):
    """The activation ``act`` of the general path's ``z``, rounded first to the
    activations' compute dtype (float32 unless Y is float64), by the engine's
    per-channel loop with ``m = 0, a = 1, b = -0.0`` (``(z - 0) * 1 + -0.0`` is ``z``
    exactly): the kernels' epilogue on the same value."""
    cd = FLOAT64 if out_dtype == FLOAT64 else FLOAT32
    v = np.array(z, dtype=cd, order="C").reshape(-1)  # a new array, activated in place
    engine.scale_shift(v, v, 1, v.size, np.zeros(1, cd), np.ones(1, cd), np.full(1, -0.0, cd),
                       path, act=act)
    return v.reshape(z.shape)


def inverse_std(var, epsilon):
    """``1 / sqrt(var + epsilon)`` in float64 (the kernels' ``a`` before rounding)."""
    with np.errstate(all="ignore"):
        return 1.0 / np.sqrt(var + epsilon)


class Plan(NamedTuple):
    """A row normalization's call plan (see :mod:`normkernels.ops.plans`): C-contiguous
    X, Y (``out`` too) and parameters of exactly the normalized shape or ``(K,)``, Y in
    X's dtype; ``finish(Y, mean, var)`` makes the operator's outputs. ``offset``
    (Gemma's, nonzero): ``offset + scale`` is made at every call as the full path makes
    it (the scale's values may change between calls). ``act``: the activation epilogue's
    name (None: none)."""

    engine: object
    epsilon: float
    centered: bool
    M: int
    K: int
    shape: tuple
    dtype: object
    finish: object
    reuse: plans.Reuse
    rounding: str = "once"
    offset: float = 0.0
    act: object = None

    def __call__(self, X, scale, B, out, skip=None, bias=None):
        arrays = (X, scale, B, out, skip, bias)
        if self.reuse.serve(arrays, out):
            return out
        params = tuple(p for p in (scale, B, skip, bias) if p is not None)
        if out is None:
            y = np.empty(self.shape, self.dtype)
        elif not out.flags.writeable or plans.shares(out, X, params):
            return None
        else:
            y = out
        M, K = self.M, self.K
        given = scale
        if self.offset:  # common.offset_scale's sum: float64 only for float64 X (= scale's)
            wide = FLOAT64 if self.dtype == FLOAT64 else FLOAT32
            scale = np.add(scale, wide.type(self.offset), dtype=wide)
        args = (X.reshape(M, K), y.reshape(M, K), scale.reshape(K),
                None if B is None else B.reshape(K), self.epsilon, self.centered,
                None if skip is None else skip.reshape(-1, K), bias)
        extra = {} if self.rounding == "once" else {"rounding": self.rounding}
        if self.act is not None:
            extra["act"] = self.act
        mean, var = self.engine.normalize_rows(*args, **extra)
        result = self.finish(y, mean, var)
        if result is y and plans.reusable(X, out, self.engine):
            self.reuse.offer(arrays, lambda: self._bind(args, extra, given))
        return result

    def _bind(self, args, extra, given):
        """The bound call of ``args``; with an offset, one that remakes ``offset +
        scale`` from ``given`` (the caller's scale) in a table of its own at every call,
        as the planned call does (the scale's values may change between calls)."""
        if not self.offset:
            return self.engine.bind_rows(*args, **extra)
        table = np.empty(self.K, args[2].dtype)
        call = self.engine.bind_rows(*args[:2], table, *args[3:], **extra)
        if call is None:
            return None
        flat, offset = given.reshape(self.K), table.dtype.type(self.offset)

        def run():
            np.add(flat, offset, out=table, dtype=table.dtype)
            call()

        return run


def plan(engine, epsilon, centered, X, a, params, out, finish, skip=None, rounding="once",
         offset=0.0, act=None):
    """The :class:`Plan` of a call that just passed the full checks, or None when it
    needs the full path (a copy of X, Y or skip, the general path, an empty X)."""
    M, K = rows_shape(X.shape, a)
    if X.size == 0 or not X.flags.c_contiguous:
        return None
    if skip is not None and not skip.flags.c_contiguous:
        return None
    if out is not None and not out.flags.c_contiguous:
        return None
    columns = (X.shape[a:], (K,))
    if any(p.shape not in columns or not p.flags.c_contiguous for p in params):
        return None
    return Plan(engine, epsilon, centered, M, K, X.shape, X.dtype, finish, plans.Reuse(),
                rounding, offset, act)


def sum_to(v, shape):
    """``v`` (the normalized span's shape) summed down to ``shape`` (a unidirectional
    broadcast source): the gradient of a broadcast parameter."""
    lead = v.ndim - len(shape)
    if lead:
        v = v.sum(axis=tuple(range(lead)))
    axes = tuple(i for i, n in enumerate(shape) if n == 1 and v.shape[i] != 1)
    return v.sum(axis=axes, keepdims=True) if axes else v.reshape(shape)

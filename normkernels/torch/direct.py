"""The adapter's shortest route for small tensors without gradients: once a call's
metadata (every tensor's type, device, shape, strides and dtype, and the attributes)
has passed the full path, later calls with that metadata run the engine's serial
kernel directly on views of the tensors (``engine.direct_rows``,
``direct_inference``).

Only for C-contiguous CPU tensors and parameters that are C-contiguous (of exactly K
or C values): up to the serial size one compiled call, above it the engine's call
(its path decided per call). The output is new, so it cannot overlap an input: the
one check a plan repeats per call has nothing to check here. The NumPy views of the
parameters (weights, biases, running statistics: the same tensors call after call)
are kept with the prepared call, and used while the tensor is that object with that
data pointer (the metadata is in the key).
"""

import math
import weakref

import numpy as np
import torch

from normkernels.dtypes import STORAGE_DTYPE, storage_view
from normkernels.engine.numba_engine import ENGINE
from normkernels.torch.tensors import array, numpy_dtype

LIMIT = 256  # prepared calls kept; emptied when full
_prepared = {}
_BF16 = torch.bfloat16


def _meta(t):
    return None if t is None else (type(t), t.is_cpu, t.shape, t.stride(), t.dtype)


def _flat(t, name):
    return storage_view(array(t, name)).reshape(-1)


class Prepared:
    """A serial kernel call and the views of its parameters."""

    __slots__ = ("bf16", "rows", "run", "storage", "views")

    def __init__(self, run, n_params, x):
        self.run = run
        self.views = [None] * n_params
        self.storage = STORAGE_DTYPE[numpy_dtype(x.dtype)]
        self.bf16 = x.dtype == _BF16

    def param(self, k, t, name):
        """The flat storage view of parameter tensor ``t`` (kept while ``t`` is the
        same object over the same memory)."""
        kept = self.views[k]
        if kept is not None and kept[0]() is t and kept[1] == t.data_ptr():
            return kept[2]
        view = _flat(t, name)
        if not view.flags.aligned:  # read only: an aligned copy computes the same
            view = np.require(view, requirements="A")
        self.views[k] = (weakref.ref(t), t.data_ptr(), view)
        return view

    def io(self, x):
        """(x's flat storage view, a new output tensor like x, its flat view); None for
        x's view where it is not aligned (the compiled call was made for aligned
        arrays: a tensor over a NumPy array's odd address)."""
        xs = (x.detach() if x.requires_grad else x)
        xs = (xs.view(torch.int16) if self.bf16 else xs).numpy().reshape(-1)
        if not xs.flags.aligned:
            return None, None, None
        ys = np.empty(x.shape, xs.dtype)
        y = torch.from_numpy(ys)
        if self.bf16:
            y = y.view(_BF16)
        return xs.view(self.storage), y, ys.reshape(-1).view(self.storage)


def rows(x, n, weight, bias, eps, centered, full, rounding="once"):
    """Y of a row normalization (LayerNorm ``centered``, else RMSNorm; ``rounding`` as
    :func:`normkernels.rms_normalization`'s); ``full()`` runs the full path (and
    proves the metadata) when there is no prepared call."""
    key = _rows_key(x, n, weight, bias, eps, centered, rounding)
    prepared = _prepared.get(key)
    if not prepared:  # unknown, or known not to have a direct route (False)
        y = full()  # first: it raises where the arguments are wrong
        if prepared is None:
            _prepare(key, lambda: _rows(x, n, weight, bias, eps, centered, rounding))
        return y
    M = prepared.rows
    y = _run_rows(prepared, x, weight, bias, eps, np.empty(M), np.empty(M))
    return full() if y is None else y


def rows_with_statistics(x, n, weight, bias, eps, centered):
    """``(y, stats)`` of a row normalization for its backward: ``stats`` the ``(M, 2)``
    float64 rows (mean, ``1 / sqrt(var + eps)``), as the full path's (bit for bit); None
    without a prepared call (the caller runs the full path; a first call prepares)."""
    key = _rows_key(x, n, weight, bias, eps, centered, "once")
    prepared = _prepared.get(key)
    if prepared is None:
        _prepare(key, lambda: _rows(x, n, weight, bias, eps, centered, "once"))
    if not prepared:
        return None
    stats = np.empty((2, prepared.rows))
    y = _run_rows(prepared, x, weight, bias, eps, stats[0], stats[1])
    if y is None:
        return None
    with np.errstate(all="ignore"):
        np.divide(1.0, np.sqrt(stats[1] + eps), out=stats[1])  # as ops.rows.inverse_std
    return y, stats.T


def _rows_key(x, n, weight, bias, eps, centered, rounding):
    return ("rows", centered, n, eps, rounding, _meta(x), _meta(weight), _meta(bias))


def _run_rows(prepared, x, weight, bias, eps, first, second):
    """Y by the prepared call, the rows' statistics written to ``first`` and
    ``second``; None where x's view is not aligned."""
    xs, y, ys = prepared.io(x)
    if xs is None:
        return None
    s = prepared.param(0, weight, "weight")
    prepared.run(xs, ys, s, s[:0] if bias is None else prepared.param(1, bias, "bias"), eps,
                 first, second)
    return y


def rows_backward(dy, x, weight, stats, n, eps, centered):
    """``(dx, dweight, dbias)`` (the parameter gradients float64, flat) of a row
    normalization from its forward's ``stats``: the engine's backward on views, as the
    full path runs it once the arguments are checked (they were, by the forward)."""
    X = array(x, "input")
    K = math.prod(x.shape[x.dim() - n:])
    M = X.size // K
    dY = array(dy, "grad")
    if not dY.flags.c_contiguous:  # autograd's (an expanded ones, a transposed gradient)
        dY = np.ascontiguousarray(dY)
    dx = torch.empty_like(x)
    gamma = np.ones(K) if weight is None else array(weight, "weight").reshape(K).astype(
        np.float64)
    dg, db = ENGINE.rows_backward(X.reshape(M, K), dY.reshape(M, K), array(dx, "out").reshape(
        M, K), gamma, centered, eps, np.ascontiguousarray(stats))
    return dx, dg, db


def _rows(x, n, weight, bias, eps, centered, rounding):
    if weight is None or not eps or not x.is_contiguous():
        return None
    K = math.prod(x.shape[x.dim() - n:])
    for p in (weight, bias):
        if p is not None and (p.dtype != x.dtype or not p.is_contiguous() or p.numel() != K):
            return None
    storage = STORAGE_DTYPE[numpy_dtype(x.dtype)]
    run = ENGINE.direct_rows(x.numel() // K, K, storage, centered, rounding)
    if run is None:
        return None
    prepared = Prepared(run, 2, x)
    prepared.rows = x.numel() // K
    return prepared


def inference(x, weight, bias, mean, var, eps, full):
    """Y of per-channel inference with given statistics (BatchNorm eval)."""
    key = ("inference", eps, _meta(x), _meta(weight), _meta(bias), _meta(mean), _meta(var))
    prepared = _prepared.get(key)
    if not prepared:
        y = full()
        if prepared is None:
            _prepare(key, lambda: _inference(x, weight, bias, mean, var, eps))
        return y
    xs, y, ys = prepared.io(x)
    if xs is None:
        return full()
    prepared.run(xs, ys, prepared.param(0, weight, "weight"), prepared.param(1, bias, "bias"),
                 prepared.param(2, mean, "running_mean"), prepared.param(3, var, "running_var"),
                 eps)
    return y


def _inference(x, weight, bias, mean, var, eps):
    if any(p is None or not p.is_contiguous() for p in (weight, bias, mean, var)) or not eps \
            or not x.is_contiguous() or x.dim() < 2:
        return None
    run = ENGINE.direct_inference(x.shape[1], math.prod(x.shape[2:]),
                                  STORAGE_DTYPE[numpy_dtype(x.dtype)], x.numel(),
                                  [STORAGE_DTYPE[numpy_dtype(p.dtype)]
                                   for p in (weight, bias, mean, var)])
    return None if run is None else Prepared(run, 4, x)


def _prepare(key, make):
    if len(_prepared) >= LIMIT:
        _prepared.clear()
    prepared = make()
    _prepared[key] = False if prepared is None else prepared


def clear():
    _prepared.clear()

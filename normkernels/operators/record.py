"""The parts an operator record (:class:`normkernels.operators.Operator`) is built
from: the attributes every workload runs with, the ONNX operator a record implements
(:class:`Onnx`), the calls that compile its kernels (:class:`WarmupCase`), and the
NumPy formulas of every family (:class:`OperatorFormulas`: what a NumPy user would
write, the bench's float64 check).

Importing this module imports neither Numba nor the operators' spec modules.
"""

from dataclasses import dataclass

import numpy as np

EPSILON = 1e-5  # the attributes every workload runs with (ONNX's defaults)
GROUPS = 32  # group normalizations: the groups of every workload (fewer when C is not a multiple)
BACKWARD = "backward"  # the mode that runs a record's backward function (and its spec module)


def qk_heads(width):
    """The heads of a packed qkv row of ``width`` features for the table's QK-norm
    workloads: head_dim the largest power of two up to 128 that leaves at least 3
    heads, a sixth of the heads (at least one) k heads and as many v heads, the rest q
    heads (6144: Qwen3-8B's 32 q and 8 kv heads of 128)."""
    head_dim = 128
    while head_dim > 1 and (width % head_dim or width // head_dim < 3):
        head_dim //= 2
    heads = width // head_dim
    kv = max(1, heads // 6)
    return {"num_q_heads": heads - 2 * kv, "num_kv_heads": kv, "head_dim": head_dim}


@dataclass(frozen=True)
class Onnx:
    """The ONNX operator a record implements (``implements``) or is compared with."""

    op_type: str
    versions: tuple  # since-versions; the last is the latest implemented
    inputs: tuple  # input names, in order
    reference_module: str  # onnx.reference.ops module holding the ONNX reference's op
    implements: bool = True  # False: only the bench's peers use it (an equivalent)
    domain: str = ""
    required: int = None  # inputs the node must have (None: all); the rest are optional
    versioned: bool = True  # the function takes ``opset`` (ONNX's operators, not contrib)
    counts_outputs: bool = False  # the node's output count is the function's num_outputs

    @property
    def latest(self):
        return self.versions[-1]

    @property
    def model_opset(self):
        """The default-domain opset of a one-node model holding this operator."""
        return self.latest if self.versioned and not self.domain else 17


@dataclass(frozen=True)
class Chunked:
    """How :mod:`normkernels.dask` runs a record on a chunked dask array.

    ``strategy`` "whole" works for any record: the axes its statistics span
    (``whole``) are rechunked to one chunk each and every block goes through the
    public function, so each output is bitwise what normkernels gives. ``whole``:
    "rows" (the axes from ``axis`` or ``begin_norm_axis`` on), "axis" (the one axis
    ``axis``), "channel" (LRN's window), "sample" (all but N), "axes" (the ``axes``
    attribute) or "channels" (all but the channel axis); a record with
    ``data_format`` also keeps its channel axis whole (its parameters are per
    channel). ``outputs``: the kind of each output the function can return, in
    order: "X" (X's shape), "rows" (X's leading axes, the normalized ones kept as 1),
    "lead" (X's leading axes only), "channel" (per channel) or "groups" (per (n,
    group)).

    The other strategies merge partial statistics across chunks, so no axis is
    rechunked: "batch" (ONNX BatchNormalization: inference blockwise, training by
    per-channel moments), "given" (statistics given: blockwise), "instance" and
    "group" (per-(n, c) moments, merged per group), "rows" (per-row moments) and
    "moments"."""

    strategy: str
    whole: str = None
    outputs: tuple = ("X",)


@dataclass(frozen=True)
class WarmupCase:
    """One call that compiles kernels: an NCX shape, a layout, a mode and the paths
    to force (``threads``: the shape's N scales with the thread count)."""

    label: str
    ncx_shape: tuple
    data_format: str = "NCX"
    mode: str = "inference"
    paths: tuple = ("serial", "parallel", "streaming")
    per_thread: bool = False  # N = this many planes' worth per thread (fused paths)


class OperatorFormulas:
    """The NumPy formulas of an :class:`normkernels.operators.Operator` (a mixin: it
    reads the record's fields ``family``, ``skip``, ``skip_bias``, ``epilogue``,
    ``quantized``, ``reads_only``, ``per_sample``, ``statistics_per_sample``,
    ``mode_kwargs`` and its
    ``rows``, ``batch_statistics`` and ``group_count``)."""


    def formula(self, X, params, mode, axis, dtype):
        """What a NumPy user would write, in ``dtype``: Y (mean and variance for
        moments; dX for mode "backward"; a quantized record's ``(q, scales)``, q before
        its rounding to integers); parameters broadcast along the channel
        ``axis`` (row normalizations: over the last axis, parameters per column;
        ``per_sample`` ones, (N, C), per sample too, the scale as ``1 + scale``)."""
        if self.per_sample:  # the modulation's gain (scale follows dY in a backward)
            k = int(mode == BACKWARD)
            params = [v if v.dtype == dtype else v.astype(dtype) for v in params]
            params[k] = params[k] + dtype.type(1)
        if mode == BACKWARD:
            return self._backward_formula(X, params, axis, dtype)
        if self.family == "qk":
            return self._qk_formula(X, params, dtype)
        if self.rows:
            return self._row_formula(X, params, dtype)
        if self.family in ("group", "lrn", "mvn"):
            x = X if dtype == X.dtype else X.astype(dtype)
            p = [v.astype(dtype) for v in params]
            if self.skip:  # onnxruntime's skip add first (skip: the first parameter)
                x, p = x + p[0], p[1:]
            y = getattr(self, f"_{self.family}_formula")(np.moveaxis(x, axis, 1), p, dtype)
            if self.epilogue == "silu":
                y = y / (1 + np.exp(-y))
            return np.moveaxis(y, 1, axis)
        reduced = tuple(i for i in range(X.ndim) if i != axis)
        shape = [1] * X.ndim
        shape[axis] = -1
        p = [v.astype(dtype).reshape(shape) for v in params]
        x = X if dtype == X.dtype else X.astype(dtype)
        eps = dtype.type(EPSILON)
        if self.reads_only:
            return x.mean(axis=reduced), x.var(axis=reduced)
        if self.statistics_per_sample:
            reduced = tuple(i for i in reduced if i != 0)
        if mode == "training" or self.statistics_per_sample:
            mean = x.mean(axis=reduced, keepdims=True)
            var = x.var(axis=reduced, keepdims=True)
        else:
            mean, var = p[2], p[3]
        return (x - mean) / np.sqrt(var + eps) * p[0] + p[1]

    def _group_formula(self, x, p, dtype):  # x: NCX
        N, C = x.shape[:2]
        g = x.reshape(N, self.group_count(C), -1)
        mean = g.mean(axis=-1, keepdims=True)
        var = g.var(axis=-1, keepdims=True)
        shape = (-1, C) + (1,) * (x.ndim - 2)  # per channel, or per (n, c)
        y = ((g - mean) / np.sqrt(var + dtype.type(EPSILON))).reshape(x.shape)
        return y * p[0].reshape(shape) + p[1].reshape(shape)

    def _mvn_formula(self, x, p, dtype):
        axes = (0, *range(2, x.ndim))
        mean = x.mean(axis=axes, keepdims=True)
        return (x - mean) / (np.sqrt(x.var(axis=axes, keepdims=True)) + dtype.type(1e-9))

    def _lrn_formula(self, x, p, dtype):
        size = self.mode_kwargs["inference"]["size"]
        C = x.shape[1]
        squares = x * x
        total = np.zeros_like(x)
        for c in range(C):  # the window of c: c - (size-1)//2 .. c + ceil((size-1)/2)
            lo, hi = max(0, c - (size - 1) // 2), min(C - 1, c + size // 2)
            total[:, c] = squares[:, lo:hi + 1].sum(axis=1)
        return x / (dtype.type(1.0) + dtype.type(1e-4 / size) * total) ** dtype.type(0.75)

    def _qk_formula(self, X, params, dtype):
        """RMSNorm over each q and k head (q_weight, k_weight); v as it was."""
        heads = qk_heads(X.shape[-1])
        q, k, D = heads["num_q_heads"], heads["num_kv_heads"], heads["head_dim"]
        x = (X if dtype == X.dtype else X.astype(dtype)).reshape(*X.shape[:-1], -1, D)
        y = x.copy()
        eps = dtype.type(EPSILON)
        for part, w in ((slice(0, q), params[0]), (slice(q, q + k), params[1])):
            h = x[..., part, :]
            y[..., part, :] = h / np.sqrt((h * h).mean(axis=-1, keepdims=True) + eps) * \
                w.astype(dtype)
        return y.reshape(X.shape)

    def _row_formula(self, X, params, dtype):
        x = X if dtype == X.dtype else X.astype(dtype)
        p = [self._along_rows(v.astype(dtype), x.ndim) for v in params]
        eps = dtype.type(EPSILON)
        if self.family == "lp":
            return x / np.sqrt((x * x).sum(axis=-1, keepdims=True))
        gate = None
        if self.epilogue == "silu gate":  # the skip input is the gate
            gate, p = p[0], p[1:]
        elif self.skip:  # input + skip (+ bias, the last parameter)
            x = x + p[0] + p[-1] if self.skip_bias else x + p[0]
            p = p[1:-1] if self.skip_bias else p[1:]
        if self.family == "rms":
            y = x / np.sqrt((x * x).mean(axis=-1, keepdims=True) + eps) * p[0]
        else:
            mean = x.mean(axis=-1, keepdims=True)
            y = (x - mean) / np.sqrt(x.var(axis=-1, keepdims=True) + eps) * p[0]
            y = y + p[1] if len(p) > 1 else y
        if gate is not None:
            y = y * (gate / (1 + np.exp(-gate)))
        if self.quantized is None:
            return y
        # int8, a scale per row: s = max|y| / 127, q = y / s before its rounding
        scale = np.abs(y).max(axis=-1, keepdims=True) / dtype.type(127)
        return y / scale, scale

    def _backward_formula(self, X, params, axis, dtype):
        """dX = r * (g - <g> - x_hat * <g * x_hat>), g = dY * scale, <.> the mean over
        each statistic group, r and x_hat from its mean and population variance (RMS:
        no centring, dX = r * (g - x_hat * <g * x_hat>)); batch normalization takes
        the given mean and var (params[2:]), the others recompute them from X."""
        x = X if dtype == X.dtype else X.astype(dtype)
        dy, gamma, *stats = [v if v.dtype == dtype else v.astype(dtype) for v in params]
        eps = dtype.type(EPSILON)
        if self.rows:  # statistic group: a row; scale per column (or per sample)
            g = dy * self._along_rows(gamma, x.ndim)
            return self._gradient(x, g, (-1,), eps, self.family == "layer")
        x, dy = np.moveaxis(x, axis, 1), np.moveaxis(dy, axis, 1)  # NCX from here
        shape = (1, -1) + (1,) * (x.ndim - 2)
        g = dy * gamma.reshape(-1, x.shape[1], *shape[2:])  # per channel, or per (n, c)
        if self.family == "group":  # (n, group): its channels and spatial positions
            grouped = (x.shape[0], self.group_count(x.shape[1]), -1)
            dx = self._gradient(x.reshape(grouped), g.reshape(grouped), (-1,), eps)
            dx = dx.reshape(x.shape)
        elif self.batch_statistics:  # channel c, over N and spatial: the given statistics
            reduced = (0, *range(2, x.ndim))
            mean, var = (v.reshape(shape) for v in stats)
            dx = self._gradient(x, g, reduced, eps, stats=(mean, var))
        else:  # instance normalization: (n, c), over the spatial axes
            dx = self._gradient(x, g, tuple(range(2, x.ndim)), eps)
        return np.moveaxis(dx, 1, axis)

    @staticmethod
    def _along_rows(v, ndim):
        """A row normalization's parameter, broadcast over X's rows: unit axes before
        its last (per column (C,), per sample (N, C) -> (N, 1, ..., C); X's shape:
        as it is)."""
        return v.reshape(*v.shape[:-1], *(1,) * (ndim - v.ndim), v.shape[-1])

    @staticmethod
    def _gradient(x, g, axes, eps, centered=True, stats=None):
        """dX of one normalization given g = dY * gamma, its groups reduced over ``axes``
        (``stats``: their (mean, var), else computed from x)."""
        if stats is not None:
            mean, var = stats
        elif centered:
            mean, var = x.mean(axis=axes, keepdims=True), x.var(axis=axes, keepdims=True)
        else:
            mean, var = 0, (x * x).mean(axis=axes, keepdims=True)
        r = 1 / np.sqrt(var + eps)
        x_hat = (x - mean) * r
        dx = g - x_hat * (g * x_hat).mean(axis=axes, keepdims=True)
        if centered:
            dx -= g.mean(axis=axes, keepdims=True)
        return r * dx

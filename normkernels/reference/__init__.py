"""Slow twins: the operators with NumPy loops instead of Numba kernels.

They share the spec layer (argument checks, the rules of parameter folding,
layouts) with the public functions and run on :class:`NumPyEngine`, which uses NumPy
only. Read them as the statement of what is computed; the tests compare
the kernels against them and both against an independent float64 oracle written
from the specs.

What is bit-identical to the kernels:

* Everything after the statistics: the normalize pass (every path, layout and dtype,
  rounding of 16-bit outputs included) and the folding of the parameters. So
  inference results (BatchNormalization in inference mode, BatchNormInference) are
  bit-identical; training and instance-normalization results are bit-identical
  when the twin is given the kernels' statistics (``normalize_planes``,
  ``normalize_rows``, and ``channel_moments`` swapped for the kernels';
  tests/test_paths.py does this on every route).
* Not the statistics: the twin takes float64 two-pass means and sums of squares
  (NumPy's pairwise sums), the kernels blocked one-pass shifted sums merged with
  Chan's formula (float32 runs for 16-bit X). Both are within the accuracy the
  user guide states (docs/guide/numerics.md: mean within e_m (|mean| + std), variance
  within e_v var + e_o |mean| std: 2e-15, 1e-12, 2**-53 for float32 and float64 X,
  1e-6 for 16-bit X), which the tests check for each against the float64 oracle.

The float64 rules of the Lp and LRN kernels (Lp's fold, the one rounding of a float64
result, the C library's pow) are in :mod:`normkernels.reference.lp`.
The row normalizations' rules (the skip add, the fold of a row's statistics, the
normalize pass and its epilogue) are in :mod:`normkernels.reference.rows`.
"""

import numpy as np

from normkernels.dtypes import FLOAT64, compute_dtype, round_once
from normkernels.engine import Engine
from normkernels.ops import backward as _bwd
from normkernels.ops import batch_norm_inference as _bni
from normkernels.ops import batch_normalization as _bn
from normkernels.ops import group_normalization as _gn
from normkernels.ops import instance_normalization as _in
from normkernels.ops import layer_norm as _dnnl_rows
from normkernels.ops import layer_normalization as _ln
from normkernels.ops import lp_normalization as _lp
from normkernels.ops import lrn as _lrn
from normkernels.ops import mean_variance_normalization as _mvn
from normkernels.ops import moments as _moments
from normkernels.ops import onednn_training as _dnnl_train
from normkernels.ops import rms_normalization as _rms
from normkernels.ops import skip_layer_normalization as _skip
from normkernels.ops.common import fold_parameters  # the kernels' folding rule, public here
from normkernels.reference.fused import (
    EpilogueGradients,
    activation,
    gated_sums_rows,
    skip_sums_rows,
)
from normkernels.reference.gated import GatedTwins
from normkernels.reference.lp import c_pow, lp_fold
from normkernels.reference.quantized import QuantizedTwins
from normkernels.reference.rows import (  # noqa: F401  (fold_rows: documented here)
    fold_rows,
    normalize_rows_from,
    skip_sums,
)


class NumPyEngine(EpilogueGradients, GatedTwins, QuantizedTwins, Engine):
    """:class:`normkernels.engine.Engine` in NumPy (``path`` is accepted and has no
    effect: there is one way to run here)."""

    name = "numpy"

    def inference(self, x, y, C, S, scale, B, mean, var, epsilon, path=None, guard=False,
                  act=None, res=None):
        if guard and any(np.may_share_memory(y, p) for p in (scale, B, mean, var)):
            return False
        if guard and not (x is y or x.ctypes.data == y.ctypes.data) and np.may_share_memory(x, y):
            return False
        m, a, b = fold_parameters(scale, B, mean, var, epsilon, x.dtype)
        self.scale_shift(x, y, C, S, m, a, b, act=act, res=res)
        return True

    def scale_shift(self, x, y, C, S, mean, a, b, path=None, act=None, res=None):
        cd = compute_dtype(x.dtype)
        with np.errstate(all="ignore"):
            xv = x.reshape(-1, C, S).astype(cd)
            result = (xv - mean[:, None]) * a[:, None] + b[:, None]
            if res is not None:
                result = result + res.reshape(result.shape).astype(cd)
            result = activation(act, result)
            y.reshape(-1, C, S)[...] = result.astype(y.dtype)

    def channel_moments(self, x, C, S, path=None):
        """Per-channel ``(count, mean, M2)`` in float64 by two passes (pairwise sums);
        not bit-identical to the kernels (see the module docstring)."""
        per_channel = np.ascontiguousarray(
            x.reshape(-1, C, S).astype(np.float64).transpose(1, 0, 2)).reshape(C, -1)
        count = np.full(C, per_channel.shape[1], np.int64)
        with np.errstate(all="ignore"):
            mean = _refined_mean(per_channel, 1) if count[0] else np.zeros(C)
            m2 = ((per_channel - mean[:, None]) ** 2).sum(axis=1)
        return count, mean, m2

    def skip_sums(self, x, skip, bias, dest, K, rows_per_skip, skip_rows, per_column, C,
                  path=None):
        skip_sums_rows(x, skip, bias, dest, K, rows_per_skip, skip_rows, per_column, C)

    def gated_sums(self, x, residual, gate, dest, K, rows_per_gate, path=None):
        gated_sums_rows(x, residual, gate, dest, K, rows_per_gate)

    def instance_planes(self, x, y, C, S, scale, B, epsilon, path=None, group=1, act=None,
                        res=None):
        groups = x.reshape(-1, group * S).astype(np.float64)  # a group's planes: contiguous
        with np.errstate(all="ignore"):
            mean = _refined_mean(groups, 1)
            m2 = ((groups - mean[:, None]) ** 2).sum(axis=1)
        normalize_planes(x, y, C, S, scale, B, epsilon, mean, m2, self, group, act, res)
        return mean, m2

    def instance_rows(self, x, y, N, C, scale, B, epsilon, path=None, group=1, act=None,
                      res=None):
        # (n, group) made contiguous: NumPy sums pairwise only along the last axis
        G = C // group
        groups = np.ascontiguousarray(
            x.reshape(N, -1, G, group).astype(np.float64).transpose(0, 2, 1, 3)).reshape(N, G, -1)
        with np.errstate(all="ignore"):
            mean = _refined_mean(groups, 2)
            m2 = ((groups - mean[:, :, None]) ** 2).sum(axis=2)
        mean, m2 = mean.reshape(-1), m2.reshape(-1)
        normalize_rows(x, y, N, C, scale, B, epsilon, mean, m2, self, group, act, res)
        return mean, m2

    def normalize_rows(self, x, y, scale, B, epsilon, centered, skip=None, bias=None,
                       sums=None, path=None, act=None, res=None, rounding="once"):
        M = x.shape[0]
        if skip is not None:
            x = skip_sums(x, skip, bias)
            if sums is not None:
                sums[...] = x
        with np.errstate(all="ignore"):
            wide = x.astype(np.float64)
            if centered:
                mean = wide.mean(axis=1)
                var = ((wide - mean[:, None]) ** 2).mean(axis=1)
            else:
                mean = np.zeros(M)
                var = (wide * wide).mean(axis=1)
        normalize_rows_from(x, y, scale, B, epsilon, centered, mean, var, act, res, rounding)
        return mean, var

    def rows_from_statistics(self, x, y, scale, B, epsilon, centered, mean, var, path=None,
                             act=None, res=None):
        normalize_rows_from(x, y, scale, B, epsilon, centered, np.asarray(mean, np.float64),
                            np.asarray(var, np.float64), act, res)


    def lp_normalize(self, x, y, outer, K, inner, p, path=None):
        """From the spec in float64 with the kernels' fold (:func:`lp_fold`): the same
        arithmetic after the norms, whose float64 sums are NumPy's (pairwise; the
        kernels' are vectorised), so the two agree within float64 roundings of the
        norm (the same bits after rounding to a narrower dtype but at rare ties)."""
        v = x.reshape(outer, K, inner).astype(np.float64)
        with np.errstate(all="ignore"):
            s, r = lp_fold(v, p)
            if x.dtype == FLOAT64:
                wide = (v * s) / r
            else:
                wide = (v * s) * (1.0 / r)
        y.reshape(outer, K, inner)[...] = round_once(wide, y.dtype)

    def lrn(self, x, y, C, S, size, alpha, beta, bias, path=None):
        """From the spec in float64, the window summed in ascending channel order from
        0.0 (the kernels' order): bit-identical to the kernels (``b ** beta`` by the C
        library's pow, as Numba's ``math.pow``)."""
        v = x.reshape(-1, C, S).astype(np.float64)
        size = int(size)
        window = min(size, 2 * C + 1)  # every window holds all the channels beyond
        with np.errstate(all="ignore"):
            sq = v * v
            total = np.zeros_like(sq)
            for d in range(-((window - 1) // 2), window // 2 + 1):  # channel c + d, ascending
                lo, hi = max(0, -d), min(C, C - d)
                if lo < hi:
                    total[:, lo:hi] += sq[:, lo + d:hi + d]
            base = float(bias) + (float(alpha) / size) * total
            if beta == 0.75 and x.dtype != FLOAT64:  # the kernels' cheaper form
                root = np.sqrt(base)
                den = root * np.sqrt(root)
            else:
                den = c_pow(base, float(beta))
            y.reshape(-1, C, S)[...] = round_once(v / den, y.dtype)

    def channel_grad_sums(self, x, dy, C, S, mean, path=None):
        """Float64 sums by NumPy (pairwise): not bit-identical to the kernels'."""
        def per_channel(v):
            return np.ascontiguousarray(
                v.reshape(-1, C, S).astype(np.float64).transpose(1, 0, 2)).reshape(C, -1)
        g = per_channel(dy)
        with np.errstate(all="ignore"):
            return g.sum(axis=1), (g * (per_channel(x) - mean[:, None])).sum(axis=1)

    def grad_apply(self, x, dy, dx, C, S, m, a, b, k, path=None):
        cd = compute_dtype(x.dtype)
        shape = (-1, C, S)
        with np.errstate(all="ignore"):
            result = (dy.reshape(shape).astype(cd) * a[:, None]
                      + (x.reshape(shape).astype(cd) - m[:, None]) * b[:, None] + k[:, None])
            dx.reshape(shape)[...] = result.astype(dx.dtype)

    def rows_backward(self, x, dy, dx, gamma, centered, epsilon, stats=None, path=None):
        K = x.shape[1]
        with np.errstate(all="ignore"):
            xv, d = x.astype(np.float64), dy.astype(np.float64)
            mean = xv.mean(axis=1, keepdims=True) if centered else np.zeros((len(xv), 1))
            r = 1.0 / np.sqrt(((xv - mean) ** 2).sum(axis=1, keepdims=True) / K + epsilon)
            if stats is not None:
                mean = stats[:, :1] if centered else mean
                r = stats[:, 1:]
            x_hat = (xv - mean) * r
            g = d * gamma
            mg = g.mean(axis=1, keepdims=True) if centered else 0.0
            result = r * (g - mg - x_hat * (g * x_hat).mean(axis=1, keepdims=True))
        dx[...] = round_once(result, dx.dtype)
        return (d * x_hat).sum(axis=0), d.sum(axis=0)


ENGINE = NumPyEngine()


def _refined_mean(values, axis):
    """The float64 mean along ``axis`` plus the mean of the deviations from it: NumPy's
    sum / n is a few ulps off for a constant non-dyadic group (7.3 repeated), where the
    correction makes it exact, so x - mean is 0 as on the kernels' shifted sums."""
    mean = values.mean(axis=axis)
    correction = (values - np.expand_dims(mean, axis)).mean(axis=axis)
    return np.where(np.isfinite(correction), mean + correction, mean)


def normalize_planes(x, y, C, S, scale, B, epsilon, mean, m2, engine=ENGINE, group=1,
                     act=None, res=None):
    """Y of NCX instance (group) normalization from the per-plane (per-group)
    ``mean`` and ``m2``."""
    m, a, b = _instance_parameters(x, scale, B, epsilon, mean, m2, S, engine, group)
    engine.scale_shift(x, y, m.size, S, m, a, b, act=act, res=res)


def normalize_rows(x, y, N, C, scale, B, epsilon, mean, m2, engine=ENGINE, group=1, act=None,
                   res=None):
    """Y of NXC instance (group) normalization from the per-(n, c) (per-(n, group))
    ``mean`` and ``m2`` (flat, ``n * C + c``)."""
    R = x.size // (N * C)
    m, a, b = _instance_parameters(x, scale, B, epsilon, mean, m2, R, engine, group)
    with np.errstate(all="ignore"):
        xv = x.reshape(N, R, C).astype(compute_dtype(x.dtype))
        shape = (N, 1, C)
        result = (xv - m.reshape(shape)) * a.reshape(shape) + b.reshape(shape)
        if res is not None:
            result = result + res.reshape(N, R, C).astype(xv.dtype)
        y.reshape(N, R, C)[...] = activation(act, result).astype(y.dtype)


def _instance_parameters(x, scale, B, epsilon, mean, m2, count, engine, group=1):
    """Per-plane parameters: each plane takes its group's statistics (over ``group *
    count`` elements) and its channel's scale and B."""
    reps = mean.size * group // scale.size
    return fold_parameters(np.tile(scale, reps), np.tile(B, reps), np.repeat(mean, group),
                           np.repeat(m2, group) / (group * count), epsilon, x.dtype)


def batch_normalization(X, scale, B, input_mean, input_var, **attributes):
    """Slow twin of :func:`normkernels.batch_normalization` (same arguments)."""
    return _bn.batch_normalization(X, scale, B, input_mean, input_var, engine=ENGINE,
                                   **attributes)


def batch_norm_inference(input, gamma, beta, mean, variance, **attributes):
    """Slow twin of :func:`normkernels.batch_norm_inference` (same arguments)."""
    return _bni.batch_norm_inference(input, gamma, beta, mean, variance, engine=ENGINE,
                                     **attributes)


def instance_normalization(input, scale, B, **attributes):
    """Slow twin of :func:`normkernels.instance_normalization` (same arguments)."""
    return _in.instance_normalization(input, scale, B, engine=ENGINE, **attributes)


def moments(X, *, data_format="NCX"):
    """Slow twin of :func:`normkernels.moments`."""
    return _moments.statistics(X, data_format, ENGINE)


def partial_moments(X, *, data_format="NCX"):
    """Slow twin of :func:`normkernels.partial_moments`."""
    return _moments.partial_statistics(X, data_format, ENGINE)


def layer_normalization(X, Scale, B=None, **attributes):
    """Slow twin of :func:`normkernels.layer_normalization`."""
    return _ln.layer_normalization(X, Scale, B, engine=ENGINE, **attributes)


def rms_normalization(X, scale, **attributes):
    """Slow twin of :func:`normkernels.rms_normalization`."""
    return _rms.rms_normalization(X, scale, engine=ENGINE, **attributes)


def simplified_layer_normalization(X, scale, **attributes):
    """Slow twin of :func:`normkernels.simplified_layer_normalization`."""
    return _rms.simplified_layer_normalization(X, scale, engine=ENGINE, **attributes)


def skip_layer_normalization(input, skip, gamma, beta=None, bias=None, **attributes):
    """Slow twin of :func:`normkernels.skip_layer_normalization`."""
    return _skip.skip_layer_normalization(input, skip, gamma, beta, bias, engine=ENGINE,
                                          **attributes)


def skip_simplified_layer_normalization(input, skip, gamma, bias=None, **attributes):
    """Slow twin of :func:`normkernels.skip_simplified_layer_normalization`."""
    return _skip.skip_simplified_layer_normalization(input, skip, gamma, bias, engine=ENGINE,
                                                     **attributes)


def layer_norm(src, gamma=None, beta=None, **attributes):
    """Slow twin of :func:`normkernels.layer_norm`."""
    return _dnnl_rows.layer_norm(src, gamma, beta, engine=ENGINE, **attributes)


def rms_norm(src, gamma=None, **attributes):
    """Slow twin of :func:`normkernels.rms_norm`."""
    return _dnnl_rows.rms_norm(src, gamma, engine=ENGINE, **attributes)


def group_normalization(X, scale, bias, **attributes):
    """Slow twin of :func:`normkernels.group_normalization`."""
    return _gn.group_normalization(X, scale, bias, engine=ENGINE, **attributes)


def group_norm(src, gamma=None, beta=None, **attributes):
    """Slow twin of :func:`normkernels.group_norm`."""
    return _gn.group_norm(src, gamma, beta, engine=ENGINE, **attributes)


def mean_variance_normalization(X, **attributes):
    """Slow twin of :func:`normkernels.mean_variance_normalization`."""
    return _mvn.mean_variance_normalization(X, engine=ENGINE, **attributes)


def lp_normalization(input, **attributes):
    """Slow twin of :func:`normkernels.lp_normalization`."""
    return _lp.lp_normalization(input, engine=ENGINE, **attributes)


def lrn(X, **attributes):
    """Slow twin of :func:`normkernels.lrn`."""
    return _lrn.lrn(X, engine=ENGINE, **attributes)


def batch_normalization_backward(dY, X, scale, mean, var=None, **attributes):
    """Slow twin of :func:`normkernels.batch_normalization_backward`."""
    return _bwd.batch_normalization_backward(dY, X, scale, mean, var, engine=ENGINE,
                                             **attributes)


def instance_normalization_backward(dY, X, scale, **attributes):
    """Slow twin of :func:`normkernels.instance_normalization_backward`."""
    return _bwd.instance_normalization_backward(dY, X, scale, engine=ENGINE, **attributes)


def group_normalization_backward(dY, X, scale, **attributes):
    """Slow twin of :func:`normkernels.group_normalization_backward`."""
    return _bwd.group_normalization_backward(dY, X, scale, engine=ENGINE, **attributes)


def layer_normalization_backward(dY, X, Scale, **attributes):
    """Slow twin of :func:`normkernels.layer_normalization_backward`."""
    return _bwd.layer_normalization_backward(dY, X, Scale, engine=ENGINE, **attributes)


def rms_normalization_backward(dY, X, scale, **attributes):
    """Slow twin of :func:`normkernels.rms_normalization_backward`."""
    return _bwd.rms_normalization_backward(dY, X, scale, engine=ENGINE, **attributes)


def batch_norm_forward_training(src, mean, variance, gamma=None, beta=None, **attributes):
    """Slow twin of :func:`normkernels.batch_norm_forward_training`."""
    return _dnnl_train.batch_norm_forward_training(src, mean, variance, gamma, beta,
                                                   engine=ENGINE, **attributes)


def batch_norm_training_backward(src, diff_dst, mean, variance, gamma=None, **attributes):
    """Slow twin of :func:`normkernels.batch_norm_training_backward`."""
    return _dnnl_train.batch_norm_training_backward(src, diff_dst, mean, variance, gamma,
                                                    engine=ENGINE, **attributes)


def layer_norm_backward(src, diff_dst, mean, variance, gamma=None, beta=None, **attributes):
    """Slow twin of :func:`normkernels.layer_norm_backward`."""
    return _dnnl_train.layer_norm_backward(src, diff_dst, mean, variance, gamma, beta,
                                           engine=ENGINE, **attributes)

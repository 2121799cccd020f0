"""Execution: how an operator's O(size) work runs, apart from what it computes.

The spec layer (:mod:`normkernels.ops`) checks arguments and works out the layout,
then hands flat C-contiguous tensors to an :class:`Engine`: element ``i`` belongs to
channel ``(i // S) % C`` (NCX memory: ``S`` is the spatial size; NXC: ``S = 1``).
Two engines implement the interface:

* the Numba engine (:mod:`normkernels.engine.numba_engine`): picks a loop and a
  path (serial, parallel, streaming; :mod:`normkernels.engine.policy`) and launches
  the kernels of :mod:`normkernels.kernels` under the thread guards of
  :mod:`normkernels.engine.threads`;
* the NumPy twin (:class:`normkernels.reference.NumPyEngine`): NumPy only.

Importing this package loads neither Numba nor the kernels.
"""

from typing import NamedTuple

import numpy as np

PATHS = ("serial", "parallel", "streaming")


class Epilogue(NamedTuple):
    """The forward's epilogue, for a backward pass through it: ``act`` the activation's
    name (None: none); ``mask`` the forward's Y (ReLU's mask) or None; ``res`` the
    residual or None (both flat, in x's memory order); ``m, a, b`` Z's coefficients
    per channel in the compute dtype (None when Z is not needed: a mask, or a
    residual alone)."""

    act: str | None
    mask: np.ndarray | None
    res: np.ndarray | None
    m: np.ndarray | None
    a: np.ndarray | None
    b: np.ndarray | None


class Engine:
    """The interface between the spec layer and the loops.

    ``path`` is one of :data:`PATHS` or None (chosen by size); every path gives the
    same bits. Statistics are float64 ``(count, mean, M2)`` (M2: the sum of squared
    deviations); parameters ``mean, a, b`` are in the compute dtype of ``x``.
    """

    def inference(self, x, y, C, S, scale, B, mean, var, epsilon, path=None, guard=False,
                  act=None, res=None):
        """``y = act((x - mean[c]) * scale[c] / sqrt(var[c] + epsilon) + B[c] + res)``
        (``act``: an activation epilogue of :mod:`normkernels.kernels.activations`, by
        name or marker, None for none; ``res``: a residual of x's shape and dtype in x's
        memory order, None for none; as in every method that takes them) from the raw
        parameters (any float dtypes), folded by the rule of
        :func:`normkernels.reference.fold_parameters`; ``y`` may be ``x``. With
        ``guard`` (a call plan, whose arguments were not checked), first returns False,
        writing nothing, when ``y`` may share memory with an input other than by
        being ``x``; else returns True."""
        raise NotImplementedError

    def bind_inference(self, x, y, C, S, scale, B, mean, var, epsilon):
        """A zero-argument callable doing :meth:`inference` on these arrays (checked:
        no sharing but ``y`` being ``x``), prepared once for repeated calls."""
        return lambda: self.inference(x, y, C, S, scale, B, mean, var, epsilon)

    def running(self, previous, batch, momentum, dtype):
        """A running statistic: ``previous * momentum + batch * (1 - momentum)`` in
        float64 (``batch``: float64), rounded once to ``dtype``."""
        with np.errstate(invalid="ignore", over="ignore"):
            return (previous.astype(np.float64) * momentum
                    + batch * (1.0 - momentum)).astype(dtype)

    def scale_shift(self, x, y, C, S, mean, a, b, path=None, act=None, res=None):
        """``y = act((x - mean[c]) * a[c] + b[c] + res)``; ``y`` may be ``x``."""
        raise NotImplementedError

    def channel_moments(self, x, C, S, path=None):
        """Per-channel ``(count, mean, M2)`` of ``x``."""
        raise NotImplementedError

    def skip_sums(self, x, skip, bias, dest, K, rows_per_skip, skip_rows, per_column, C,
                  path=None):
        """``dest = (x + skip) + bias`` over rows of ``K`` (flat C-contiguous arrays),
        in the row kernels' arithmetic, rounded once: row ``r`` adds skip row ``r //
        rows_per_skip`` (``skip_rows``) or skip value ``r // rows_per_skip``, and bias
        per column (``per_column``) or value ``r % C``; ``bias`` None: none."""
        raise NotImplementedError

    def gated_sums(self, x, residual, gate, dest, K, rows_per_gate, path=None):
        """``dest = residual + gate * x`` over rows of ``K`` (flat C-contiguous arrays),
        in the row kernels' arithmetic, rounded once; ``gate`` holds one row of ``K``
        per ``rows_per_gate`` rows."""
        raise NotImplementedError

    def instance_planes(self, x, y, C, S, scale, B, epsilon, path=None, group=1, act=None,
                        res=None):
        """Instance normalization of NCX memory (``N * C`` planes of ``S``), or group
        normalization with ``group`` channels per group (scale and B per channel, or
        per (n, c): ``N * C`` values, as here and in :meth:`instance_rows`);
        writes ``y``, returns the per-plane (per-group) ``(mean, M2)``."""
        raise NotImplementedError

    def instance_rows(self, x, y, N, C, scale, B, epsilon, path=None, group=1, act=None,
                      res=None):
        """Instance normalization of NXC memory (``N`` samples of ``R`` rows of
        ``C``), or group normalization with ``group`` channels per group; writes ``y``,
        returns the per-(n, c) (per-(n, group)) ``(mean, M2)``, flat ``n*C + c``
        (``n*G + g``)."""
        raise NotImplementedError


    def channel_grad_sums(self, x, dy, C, S, mean, path=None):
        """Per-channel ``(sum(dy), sum(dy * (x - mean[c])))`` in float64 of
        C-contiguous ``x`` and ``dy`` (the backward passes' reduction)."""
        raise NotImplementedError

    def group_grad_sums(self, x, dy, planes, S, group, path=None):
        """The reduction of the instance and group backward passes over ``planes``
        planes of ``S`` (C-contiguous ``x``, ``dy``), groups of ``group`` consecutive
        planes: per group ``(count, mean, M2)`` of x, per plane ``(sum dy, sum dy * (x -
        its group's mean))``, float64. Here: the statistics, then the sums around them."""
        count, mean, m2 = self.channel_moments(x, planes, S, path)
        n = count.reshape(-1, group).astype(np.float64)
        mu = mean.reshape(-1, group)
        total = n.sum(axis=1)
        with np.errstate(all="ignore"):  # exact merges of the per-plane moments
            gmean = (n * mu).sum(axis=1) / total
            gm2 = (m2.reshape(-1, group) + n * (mu - gmean[:, None]) ** 2).sum(axis=1)
        sum_dy, sum_dyx = self.channel_grad_sums(x, dy, planes, S, np.repeat(gmean, group),
                                                 path)
        return total, gmean, gm2, sum_dy, sum_dyx

    def group_coefficients(self, gamma, gmean, r, sum_dy, sum_dyx, Cg, M, dtype):
        """``(m, A, B, K, terms)``: the coefficients of :meth:`grad_apply` per plane of
        the group backward (``Cg`` consecutive planes a group, float64 per-plane
        ``gamma`` and sums, per-group ``gmean``, ``r`` and element count ``M``), in the
        compute dtype of ``dtype``: ``A = gamma r``, ``B = -r^3 sum(gamma sum_dyx) / M``,
        ``K = -r sum(gamma sum_dy) / M`` (the group sums in plane order), the mean
        rounded with its residual folded into K (as the forward folds it);
        and float64 ``terms = r sum_dyx`` per plane (the scale gradient's)."""
        from normkernels.dtypes import FLOAT64, compute_dtype

        cd = compute_dtype(dtype)
        with np.errstate(all="ignore"):
            rp = np.repeat(r, Cg)
            mu = np.repeat(gmean, Cg)
            # in plane order: cumsum adds left to right
            g1 = np.cumsum((gamma * sum_dy).reshape(-1, Cg), axis=1)[:, -1]
            g2 = np.cumsum((gamma * sum_dyx).reshape(-1, Cg), axis=1)[:, -1]
            b = np.repeat(-r * r * r * g2 / M, Cg)
            k = np.repeat(-r * g1 / M, Cg)
            m = mu.astype(cd)
            if cd != FLOAT64:
                k = k + np.where(np.isfinite(m), b * (m.astype(np.float64) - mu), 0.0)
            return m, (gamma * rp).astype(cd), b.astype(cd), k.astype(cd), rp * sum_dyx

    def channel_backward(self, x, dy, dx, C, S, scale, mean, stats, is_var, epsilon,
                         path=None):
        """BatchNormalization's training backward in one call: :meth:`channel_grad_sums`
        around ``mean``, :meth:`group_coefficients` with a group a channel (``r`` from
        ``stats``: the variance with ``epsilon``, or with ``is_var`` False ``r``
        itself) and :meth:`grad_apply`, with their bits; returns float64 ``(dscale,
        dB)``, or None where the caller runs those steps itself (here: always)."""
        return None

    def group_backward(self, x, dy, dx, views, planes, S, group, C, scale, epsilon,
                       given=None, path=None):
        """The instance/group backward in one call, over ``views`` equal views of ``x``
        (channels-first memory: one; channels-last: a view a sample) of ``planes``
        planes of ``S`` (``S`` 1: rows of ``planes`` columns), ``group`` planes a group,
        ``scale`` per channel (``C``): per view the statistics (``given``: float64
        ``(mean, r)`` per (view, group); else recomputed by :meth:`group_grad_sums`),
        :meth:`group_coefficients`, the parameter gradients added view by view, and
        :meth:`grad_apply`, with the bits of those steps; returns float64 ``(dscale,
        dB)``, or None where the caller runs the steps itself (here: always)."""
        return None

    def warm_backward(self, dtype):
        """Compile (or load) what :meth:`channel_backward` and :meth:`group_backward` can
        run for X of ``dtype`` (here: nothing)."""

    def grad_apply(self, x, dy, dx, C, S, m, a, b, k, path=None):
        """``dx = dy * a[c] + (x - m[c]) * b[c] + k[c]`` in the compute dtype, rounded
        once to dx's dtype; ``dx`` may be ``dy`` or ``x``."""
        raise NotImplementedError

    def epilogue_dz(self, x, dy, C, S, ep, path=None):
        """dZ of an epilogue ``ep`` (:class:`Epilogue`) over flat arrays in x's memory
        order: ReLU's mask (from ``ep.mask``, the forward's Y, or from Z) or a residual
        alone give dY or +0 in X's dtype; a smooth activation gives ``dY * act'(Z)`` in
        the compute dtype. Z is ``(x - ep.m[c]) * ep.a[c] + ep.b[c] + ep.res``, made by
        :meth:`scale_shift` on X widened to the compute dtype."""
        from normkernels.dtypes import compute_dtype

        if ep.mask is None and ep.act is None:
            return dy.copy()
        cd = compute_dtype(x.dtype)
        z = ep.mask
        if z is None:
            z = np.empty(x.shape, cd)
            extra = {} if ep.res is None else {"res": ep.res.astype(cd)}
            self.scale_shift(x.astype(cd), z, C, S, ep.m, ep.a, ep.b, path, **extra)
        if ep.mask is not None or ep.act == "relu":
            dz = np.empty_like(dy)
            self.relu_mask(z, dy, dz, path)
            return dz
        self.activation_grad(z, dy, z, ep.act, path)
        return z

    def epilogue_grad_sums(self, x, dy, C, S, mean, ep, path=None, out=None):
        """:meth:`channel_grad_sums` of dZ (:meth:`epilogue_dz`), and dZ written to
        ``out`` (X's dtype, where dZ is exact in it; None: nowhere). Here dZ is made,
        then reduced; the Numba engine makes it in the reduction's registers."""
        dz = self.epilogue_dz(x, dy, C, S, ep, path)
        if out is not None:
            out[...] = dz
        return self.channel_grad_sums(x, dz, C, S, mean, path)

    def epilogue_grad_apply(self, x, dy, dx, dres, C, S, m, a, b, k, ep, path=None):
        """:meth:`grad_apply` of dZ, and ``dres = dZ`` rounded once to its dtype
        (``dres`` None: no residual). Here dZ is made first (with 16-bit X under a
        smooth activation, dX in float32, then rounded)."""
        dz = self.epilogue_dz(x, dy, C, S, ep, path)
        if dres is not None:
            dres[...] = dz.astype(dres.dtype)
        if dz.dtype == x.dtype:
            self.grad_apply(x, dz, dx, C, S, m, a, b, k, path)
            return
        wide = np.empty(x.shape, dz.dtype)
        self.grad_apply(x.astype(dz.dtype), dz, wide, C, S, m, a, b, k, path)
        dx[...] = wide.astype(dx.dtype)

    def activation_grad(self, z, dy, dz, act, path=None):
        """``dz = dy * act'(z)`` in the compute dtype of flat arrays in one memory order
        (``z``, ``dz``: compute dtype; ``dy``: X's)."""
        raise NotImplementedError

    def relu_mask(self, y, dy, dz, path=None):
        """``dz = dy`` where ``y > 0``, else +0 (flat arrays of X's dtype)."""
        raise NotImplementedError

    def gated_backward(self, dln, ds, x, gate, dres, dx, K, rows_per_gate, path=None):
        """The gated residual's backward over rows of ``K``: ``dres = dln + ds`` (``ds``
        None: 0) and ``dx = gate * dres`` in dln's dtype (``gate``: a row per
        ``rows_per_gate`` rows), rounded once to X's dtype; returns float64 ``dgate``
        (a row per ``rows_per_gate`` rows), ``sum(dres * x)`` over those rows."""
        raise NotImplementedError

    def rows_backward(self, x, dy, dx, gamma, centered, epsilon, stats=None, path=None):
        """Backward of a row normalization of C-contiguous ``M x K`` rows (statistics
        recomputed per row, or ``stats``: float64 ``(M, 2)`` of the caller's mean and
        ``r = 1 / sqrt(var + epsilon)``; ``gamma`` float64 per column): writes ``dx``,
        returns the float64 column sums ``(sum dY * x_hat, sum dY)``."""
        raise NotImplementedError

    def normalize_rows(self, x, y, scale, B, epsilon, centered, skip=None, bias=None,
                       sums=None, path=None, act=None, res=None, rounding="once"):
        """Row normalization of 2-D ``x`` (``M`` rows of ``K``, each row contiguous)
        into ``y`` (same shape; may be ``x``): per row the mean and population
        variance (``centered``) or the mean square, then ``y = (x - mean) /
        sqrt(var + epsilon) * scale + B`` (``mean`` 0 when not centred) by the rule of
        :func:`normkernels.reference.fold_rows`; ``scale`` and ``B`` (None: no shift)
        are ``K`` columns in any float dtype. ``skip`` (rows of ``K``; row ``r`` uses
        ``skip[r % len(skip)]``) and ``bias`` (``K``, or None) first replace each row by
        ``x + skip + bias`` rounded to x's dtype, which ``sums`` (``M x K``, optional)
        receives. ``rounding="llama"`` rounds the normalized value to y's dtype before
        ``scale`` multiplies it (Hugging Face's LlamaRMSNorm), "once" (default) rounds
        only Y. Returns float64 ``(mean, var)`` per row (``var``: the mean square when
        not centred)."""
        raise NotImplementedError

    def modulated_rows(self, x, y, T, scale, B, epsilon, path=None):
        """AdaLN's rows: C-contiguous ``M x K`` ``x`` in samples of ``T`` rows, each
        sample normalized (centred) into ``y`` with its own columns, row ``n`` of the
        float64 ``(N, K)`` tables ``scale`` and ``B``: the bits :meth:`normalize_rows`
        gives each sample (this default: a call per sample)."""
        for n in range(x.shape[0] // T):
            rows = slice(n * T, (n + 1) * T)
            self.normalize_rows(x[rows], y[rows], scale[n], B[n], epsilon, True, path=path)

    def modulated_rows_backward(self, x, dy, dx, T, gamma, epsilon, path=None):
        """:meth:`rows_backward` (centred, statistics recomputed) of AdaLN's samples of
        ``T`` rows, each with its row of the float64 ``(N, K)`` ``gamma``: writes ``dx``,
        returns float64 ``(N, K)`` ``(sum dY * x_hat, sum dY)`` per sample, the bits
        :meth:`rows_backward` gives each sample (this default: a call per sample)."""
        N = x.shape[0] // T
        dgamma, dbeta = np.empty((N, x.shape[1])), np.empty((N, x.shape[1]))
        for n in range(N):
            rows = slice(n * T, (n + 1) * T)
            dgamma[n], dbeta[n] = self.rows_backward(x[rows], dy[rows], dx[rows], gamma[n],
                                                     True, epsilon, None, path)
        return dgamma, dbeta

    def rows_from_statistics(self, x, y, scale, B, epsilon, centered, mean, var, path=None):
        """The normalize pass of :meth:`normalize_rows` from given float64 per-row
        ``mean`` and ``var`` (merged partial moments of a chunked row, say): the same
        bits as :meth:`normalize_rows` gives with those statistics."""
        raise NotImplementedError

    def lp_normalize(self, x, y, outer, K, inner, p, path=None):
        """LpNormalization of C-contiguous ``x`` seen as ``(outer, K, inner)`` along
        its ``K`` axis into ``y`` (same shape; may be ``x``): ``y = x / ||x||_p``, p 1 or
        2, the norm accumulated and the quotient computed in float64, rounded once; a
        zero vector gives zeros (:mod:`normkernels.kernels.lp`)."""
        raise NotImplementedError

    def lrn(self, x, y, C, S, size, alpha, beta, bias, path=None):
        """LRN of C-contiguous ``x`` into ``y`` (may be ``x``); channel ``c`` of flat
        element ``i`` is ``(i // S) % C``: ``y = x / (bias + alpha / size *
        square_sum) ** beta`` over ONNX's window of ``size`` channels, in float64,
        rounded once (:mod:`normkernels.kernels.lrn`)."""
        raise NotImplementedError

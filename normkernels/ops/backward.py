"""Backward passes of BatchNormalization, InstanceNormalization and GroupNormalization
(spec layer).

Per statistic group (a channel for BatchNormalization in training, an (n, c) for
InstanceNormalization) of M elements with mean ``mu`` and ``r = 1 / sqrt(var +
epsilon)``, ``x_hat = (x - mu) * r`` and ``g = dY * scale``, the gradient of ``Y =
scale * x_hat + B`` is (specs/backward-passes.md, section 1)::

    dX     = r * (g - <g> - x_hat * <g * x_hat>)      (<.>: the group's mean)
    dscale = sum of dY * x_hat,   dB = sum of dY       (per channel)

With the running statistics (``training=False``) mu and r are constants: ``dX = scale
* r * dY``. Both are ``dX = dY * A + (x - mu) * B + K`` per group, with
``A = scale * r``, ``B = -A * r * dscale / M``, ``K = -A * dB / M`` (0 in eval mode):
one reduction over (X, dY) gives ``sum(dY)`` and ``sum(dY * (x - mu))`` per group in
float64, the coefficients are folded in float64 (the mean rounded to the compute dtype
with its residual folded into K, as the forward folds it), and one pass writes dX.
"""

import math

import numpy as np

from normkernels.dtypes import compute_dtype
from normkernels.ops import common, plans, training_plans
from normkernels.ops import epilogue_backward as _epilogue
from normkernels.ops.common import ALL_FLOATS

BN = "BatchNormalizationBackward"
IN = "InstanceNormalizationBackward"
GN = "GroupNormalizationBackward"


def _arrays(label, dY, X, params):
    """dY and X: one float dtype, one shape; parameters: float, shape (C,) later."""
    X = common.as_array("X", X)
    dY = common.as_array("dY", dY)
    common.check_dtype(label, "X", X, ALL_FLOATS)
    common.check_dtype(label, "dY", dY, ALL_FLOATS)
    if dY.dtype != X.dtype:
        raise TypeError(f"{label}: dY must have X's dtype ({X.dtype}), got {dY.dtype}")
    if dY.shape != X.shape:
        raise ValueError(f"{label}: dY must have X's shape {X.shape}, got {dY.shape}")
    arrays = {n: common.as_array(n, v) for n, v in params.items() if v is not None}
    for name, arr in arrays.items():
        common.check_dtype(label, name, arr, ALL_FLOATS)
    return dY, X, arrays


def _same_layout(X, dY, data_format):
    """``(x, dy, order, S)``: X and dY as C-contiguous views (or copies) in X's memory
    order, channel ``c`` of flat element ``i`` being ``(i // S) % C``."""
    X, order, S = common.layout_or_copy(X, data_format)
    dy = dY.transpose(order)
    if not dy.flags.c_contiguous:
        dy = np.ascontiguousarray(dy)
    return X.transpose(order), dy, order, S


def _inv_std(label, var, inv_std, epsilon):
    """``r`` in float64 from exactly one of ``var`` (with epsilon) and ``inv_std``."""
    if (var is None) == (inv_std is None):
        raise ValueError(f"{label}: give exactly one of var (with epsilon) and inv_std, got "
                         f"{'both' if var is not None else 'neither'}")
    if inv_std is not None:
        return np.asarray(inv_std, np.float64)
    eps = common.check_epsilon(label, epsilon)
    with np.errstate(all="ignore"):
        return 1.0 / np.sqrt(np.asarray(var, np.float64) + eps)


def given_statistics(label, mean, inv_std, lead, centered):
    """The caller's statistics as float64 ``(mean, r)`` of shape ``lead`` (None when
    neither is given: recompute them). Each may have shape ``lead`` or ``lead`` followed
    by ones (the forward's keepdims outputs); a centred normalization needs both or
    neither, RMS takes only ``inv_std``."""
    if not centered and mean is not None:
        raise ValueError(f"{label}: takes no mean (RMS normalization is not centred); "
                         "give inv_std alone")
    if centered and (mean is None) != (inv_std is None):
        raise ValueError(f"{label}: give both mean and inv_std (the forward's statistics) or "
                         f"neither (recomputed from X), got only "
                         f"{'mean' if mean is not None else 'inv_std'}")
    if inv_std is None:
        return None
    values = []
    for name, v in (("mean", mean), ("inv_std", inv_std)):
        if v is None:
            values.append(np.zeros(lead))
            continue
        arr = common.as_array(name, v)
        common.check_dtype(label, name, arr, ALL_FLOATS)
        extra = arr.shape[len(lead):]
        if arr.shape[:len(lead)] != tuple(lead) or any(n != 1 for n in extra):
            raise ValueError(f"{label}: {name} must have shape {tuple(lead)} (or that followed "
                             f"by ones), got {arr.shape}")
        values.append(arr.astype(np.float64).reshape(lead))
    return values[0], values[1]


def fold(engine, scale, mean, r, sum_dy, sum_dyx, count, training, dtype):
    """``(m, A, B, K)`` in the compute dtype of ``dtype``, and float64 ``(dscale, dB)``,
    per channel, from the float64 sums over ``count`` elements per channel: in training
    the group backward's coefficients with a group per channel
    (:meth:`normkernels.engine.Engine.group_coefficients`), in eval mode ``A = scale r``
    alone."""
    if training:
        *coefficients, dscale = engine.group_coefficients(scale, mean, r, sum_dy, sum_dyx, 1,
                                                          count, dtype)
        return coefficients, dscale, sum_dy
    cd = compute_dtype(dtype)  # eval mode: dX = dY * A (m, B and K are not used)
    with np.errstate(all="ignore"):
        zeros = np.zeros(scale.shape, cd)
        return (mean.astype(cd), (scale * r).astype(cd), zeros, zeros), r * sum_dyx, sum_dy


def _result(X, order, dx, out):
    """dX in X's memory order (``out`` when given)."""
    dX = dx.transpose(np.argsort(order)) if order is not None else dx
    if out is not None and dX is not out:
        if not np.shares_memory(dX, out):
            np.copyto(out, dX)
        return out
    return dX


def _target(x, dy, out, order, X, dY):
    """Where the kernel writes dX: ``out`` (or dY / X, when out is one of them) seen in
    the kernel's order when that is contiguous, else a new array."""
    if out is not None:
        view = out.transpose(order)
        if view.flags.c_contiguous:
            return view
    return np.empty_like(x)


def _channel_steps(engine, x, dy, dx, dres, C, S, scale, mean64, r, ep, training, path):
    """BatchNormalization's backward step by step: the per-channel sums (through the
    epilogue ``ep``), the coefficients, the dX pass; float64 ``(dscale, dB)``."""
    dz = None if ep is None or not training else _epilogue.kept(ep, x, dx, dres)
    if ep is None:
        sum_dy, sum_dyx = engine.channel_grad_sums(x, dy, C, S, mean64, path)
    else:
        sum_dy, sum_dyx = engine.epilogue_grad_sums(x, dy, C, S, mean64, ep, path, out=dz)
    coefficients, dscale, dB = fold(engine, scale.astype(np.float64), mean64, r, sum_dy,
                                    sum_dyx, x.size // C, training, x.dtype)
    if training and (ep is None or dz is not None):  # dY, or the dZ the reduction wrote
        engine.grad_apply(x, dy if dz is None else dz, dx, C, S, *coefficients, path)
    elif training:
        engine.epilogue_grad_apply(x, dy, dx, dres, C, S, *coefficients, ep, path)
    elif ep is None:  # dX = dY * scale * r does not read X: a NaN or inf in X stays out of dX
        m, a, _, _ = coefficients
        engine.scale_shift(dy, dx, C, S, np.zeros_like(m), a, np.zeros_like(a), path)
    else:
        _epilogue.scaled_grad(engine, x, dy, dx, dres, C, S, coefficients[1], ep, path)
    return dscale, dB


def batch_normalization_backward(dY, X, scale, mean, var=None, *, inv_std=None, epsilon=1e-5,
                                 training=True, data_format="NCX", out=None, activation=None,
                                 Y=None, B=None, add=None, engine, path=None):
    """Spec layer of :func:`normkernels.batch_normalization_backward` (with an epilogue:
    :mod:`normkernels.ops.epilogue_backward`)."""
    key = None
    if path is None and activation is None and Y is None and B is None and add is None:
        key = training_plans.channel_key(BN, engine, epsilon, training, data_format, dY, X,
                                         scale, mean, var, inv_std, out)
        grads = plans.serve(key, dY, X, scale, mean, var, inv_std, out)
        if grads is not None:
            return grads
    given = [a for a in (dY, X, scale, mean, var, inv_std) if a is not None]
    label = BN
    dY, X, params = _arrays(label, dY, X, {"scale": scale, "mean": mean, "var": var,
                                           "inv_std": inv_std})
    if not isinstance(training, (bool, np.bool_)):
        raise TypeError(f"{label}: training must be a bool, got {type(training).__name__}")
    common.check_data_format(label, data_format)
    C = common.channel_count(X, data_format)
    common.check_channel_params(label, C, params)
    r = _inv_std(label, params.get("var"), params.get("inv_std"), epsilon)
    if out is not None:
        common.check_out(label, out, X, params, {"X": X, "dY": dY})
    ep = None
    if _epilogue.wanted(activation, Y, B, add):
        ep = _epilogue.check(label, activation, Y, B, add, X, C)
    pdtype = params["scale"].dtype
    if X.size == 0:
        zeros = np.zeros(C, pdtype)
        grads = (np.empty_like(X) if out is None else out), zeros, zeros.copy()
        return grads + (() if ep is None or ep[3] is None else (np.empty_like(X),))
    x, dy, order, S = _same_layout(X, dY, data_format)
    mean64 = params["mean"].astype(np.float64)
    dres = None
    if ep is not None:
        act, Y, B, res = ep

        def coefficients():
            if params.get("var") is not None:  # the forward's own folding
                return common.fold_parameters(params["scale"], B, params["mean"], params["var"],
                                       epsilon, X.dtype)
            return _epilogue.z_coefficients(params["scale"].astype(np.float64), B, mean64, r,
                                            X.dtype)

        ep = _epilogue.prepare(act, Y, res, order, coefficients)
        dres = _epilogue.residual_target(res, x)
    dx = _target(x, dy, out, order, X, dY)
    fused = None
    if ep is None and training:  # the steps of _channel_steps in one call, where it can
        stats = params.get("var")
        fused = engine.channel_backward(x, dy, dx, C, S, params["scale"], params["mean"],
                                        params["inv_std"] if stats is None else stats,
                                        stats is not None, epsilon, path)
    dscale, dB = fused or _channel_steps(engine, x, dy, dx, dres, C, S, params["scale"],
                                         mean64, r, ep, bool(training), path)
    grads = _result(X, order, dx, out), dscale.astype(pdtype), dB.astype(pdtype)
    if (key is not None and training is True and epsilon
            and plans.plain(given, [dY, X, *params.values()])):
        plans.add(key, training_plans.channel_backward(engine, epsilon, dY, X, params["scale"],
                                                       data_format, out))
    return grads + _epilogue.residual_result(dres, order)


def instance_normalization_backward(dY, X, scale, *, epsilon=1e-5, mean=None, inv_std=None,
                                    data_format="NCX", out=None, activation=None, Y=None,
                                    B=None, add=None, engine, path=None):
    """Spec layer of :func:`normkernels.instance_normalization_backward`: the group
    backward pass with groups of one channel (the statistics of every (n, c)
    recomputed from X unless given)."""
    return group_backward(IN, dY, X, scale, None, epsilon, mean, inv_std, data_format, out,
                           engine, path, (activation, Y, B, add))


def group_normalization_backward(dY, X, scale, *, num_groups, epsilon=1e-5, mean=None,
                                 inv_std=None, data_format="NCX", out=None, activation=None,
                                 Y=None, B=None, add=None, engine, path=None):
    """Spec layer of :func:`normkernels.group_normalization_backward` (GroupNormalization-21:
    scale per channel)."""
    return group_backward(GN, dY, X, scale, num_groups, epsilon, mean, inv_std, data_format,
                           out, engine, path, (activation, Y, B, add))


def group_backward(label, dY, X, scale, num_groups, epsilon, mean, inv_std, data_format, out,
                    engine, path, epilogue=(None,) * 4, per_sample=False):
    """Per (n, group) of M elements, with ``g = dY * scale[c]``: ``dX = r (g - <g> - x_hat
    <g x_hat>)``, that is ``dY * scale[c] r + (x - mu) * B + K`` with ``B = -r^3 sum(g (x -
    mu)) / M`` and ``K = -r sum(g) / M``: the per-(n, c) sums of the reduction weighted by
    scale and added per group. ``num_groups`` None: instance normalization (a group per
    channel, X at least 3-D). ``epilogue``: the forward's ``(activation, Y, B, add)``
    (:mod:`normkernels.ops.epilogue_backward`). ``per_sample``: ``scale`` is a checked
    (N, C) table (AdaGroupNorm's ``1 + scale``), and ``dscale``, ``dB`` are the float64
    (N, C) sums per sample."""
    key = None
    if (path is None and not per_sample
            and epilogue[0] is epilogue[1] is epilogue[2] is epilogue[3] is None):
        key = training_plans.group_key(label, engine, num_groups, epsilon, data_format, dY, X,
                                       scale, mean, inv_std, out)
        grads = plans.serve(key, dY, X, scale, mean, inv_std, out)
        if grads is not None:
            return grads
    from normkernels.ops.group_normalization import check_groups

    supplied = (dY, X, scale)
    dY, X, params = _arrays(label, dY, X, {"scale": scale})
    common.check_data_format(label, data_format)
    least = 3 if num_groups is None else 2
    if X.ndim < least:
        raise ValueError(f"{label}: X must have at least {least} dimensions (N x C ...), got "
                         f"shape {X.shape}")
    C = common.channel_count(X, data_format)
    if not per_sample:
        common.check_channel_params(label, C, params)
    G = C if num_groups is None else check_groups(label, "num_groups", num_groups, C)
    eps = common.check_epsilon(label, epsilon)
    N, Cg = X.shape[0], C // max(G, 1)
    given = given_statistics(label, mean, inv_std, (N, G), True)
    if out is not None:
        common.check_out(label, out, X, params, {"X": X, "dY": dY})
    ep = _epilogue.check(label, *epilogue, X, C) if _epilogue.wanted(*epilogue) else None
    pdtype = params["scale"].dtype
    spatial = math.prod(X.shape[2:] if data_format == "NCX" else X.shape[1:-1])
    if X.size == 0 or spatial == 0:
        if spatial == 0 and N * C > 0:
            raise ValueError(f"{label}: X of shape {X.shape} has a zero-size spatial extent")
        zeros = np.zeros(params["scale"].shape if per_sample else C, pdtype)
        grads = (np.empty_like(X) if out is None else out), zeros, zeros.copy()
        return grads + (() if ep is None or ep[3] is None else (np.empty_like(X),))
    x, dy, order, S = _same_layout(X, dY, data_format)
    dx = _target(x, dy, out, order, X, dY)
    scale64 = params["scale"].astype(np.float64).reshape(-1)
    dres = None
    if ep is not None:
        act, Y, B, res = ep
        ep = _epilogue.prepare(act, Y, res, order, lambda: (None, None, None))
        dres = _epilogue.residual_target(res, x)
    if S == spatial:  # channels-first memory: N * C planes, a group's planes contiguous
        views, planes, per = [(x, dy, dx, ep, dres)], N * C, spatial
    else:  # channels-last memory: one call per sample, C columns
        views, planes, per = [(x[n], dy[n], dx[n], None if ep is None else _sample(ep, n),
                               None if dres is None else dres[n]) for n in range(N)], C, 1
    gammas = scale64.reshape(len(views), planes) if per_sample else None
    gamma = None if per_sample else np.tile(scale64, planes // C)
    dscale, dB = np.zeros(C), np.zeros(C)
    partials = []  # per_sample: each view's (dscale, dB) per (n, c)
    M = Cg * spatial
    fused = None
    if ep is None and (len(views) == 1 or not per_sample):  # the loop below in one call
        fused = engine.group_backward(  # per_sample: N * C planes, each its own channel
            x, dy, dx, len(views), planes, per, Cg, planes if per_sample else C,
            scale64 if per_sample else params["scale"], eps, given, path)
        if fused is not None:
            dscale, dB = fused
            partials = [(dscale.reshape(-1, C), dB.reshape(-1, C))]
    for i, (xv, dyv, dxv, epv, dresv) in enumerate(views if fused is None else ()):
        if per_sample:
            gamma = gammas[i]
        rows = slice(None) if len(views) == 1 else slice(i, i + 1)
        if given is not None:  # the caller's, per (n, group): all samples at once, or sample i
            gmean, r = given[0][rows].ravel(), given[1][rows].ravel()
        elif epv is None:  # one reduction gives the statistics and the sums
            M, gmean, gm2, sum_dy, sum_dyx = engine.group_grad_sums(xv, dyv, planes, per, Cg,
                                                                    path)
            with np.errstate(all="ignore"):
                r = 1.0 / np.sqrt(gm2 / M + eps)
        else:  # dZ needs the statistics first: a pass over X for them
            gmean, r = _group_statistics(engine, xv, planes, per, Cg, eps, path)
        if epv is not None:
            if act is not None and epv.mask is None:  # Z's coefficients, per plane
                bias = np.tile(B.astype(np.float64), planes // C)
                m, a, b = _epilogue.z_coefficients(gamma, bias, np.repeat(gmean, Cg),
                                                   np.repeat(r, Cg), X.dtype)
                epv = epv._replace(m=m, a=a, b=b)
            dz = _epilogue.kept(epv, xv, dxv, dresv)
            sum_dy, sum_dyx = engine.epilogue_grad_sums(xv, dyv, planes, per,
                                                        np.repeat(gmean, Cg), epv, path, out=dz)
        elif given is not None:
            sum_dy, sum_dyx = engine.channel_grad_sums(xv, dyv, planes, per,
                                                       np.repeat(gmean, Cg), path)
        # the sums of every plane are around its group's mean
        *coefficients, terms = engine.group_coefficients(gamma, gmean, r, sum_dy, sum_dyx,
                                                         Cg, M, X.dtype)
        if per_sample:
            partials.append((terms.reshape(-1, C), sum_dy.reshape(-1, C)))
        else:
            # the samples in order (cumsum adds left to right; sum may pair them up)
            dscale += np.cumsum(terms.reshape(-1, C), axis=0)[-1]
            dB += np.cumsum(sum_dy.reshape(-1, C), axis=0)[-1]
        if epv is None or dz is not None:  # dY, or the dZ the reduction wrote
            engine.grad_apply(xv, dyv if epv is None else dz, dxv, planes, per, *coefficients,
                              path)
        else:
            engine.epilogue_grad_apply(xv, dyv, dxv, dresv, planes, per, *coefficients, epv,
                                       path)
    if per_sample:
        return (_result(X, order, dx, out), np.concatenate([p[0] for p in partials]),
                np.concatenate([p[1] for p in partials]))
    grads = _result(X, order, dx, out), dscale.astype(pdtype), dB.astype(pdtype)
    if key is not None and eps and plans.plain(supplied, (dY, X, params["scale"])):
        plans.add(key, training_plans.group_backward(engine, eps, dY, X, params["scale"], Cg,
                                                     data_format, out, mean, inv_std))
    return grads + _epilogue.residual_result(dres, order)


def _sample(ep, n):
    """Sample ``n``'s part of an epilogue's arrays (channels-last memory)."""
    return ep._replace(mask=None if ep.mask is None else ep.mask[n],
                       res=None if ep.res is None else ep.res[n])


def _group_statistics(engine, x, planes, S, group, eps, path):
    """Per group of ``group`` consecutive planes of ``S``: float64 ``(mean, r)``, the
    per-plane moments merged exactly (:meth:`normkernels.engine.Engine.group_grad_sums`'
    merge)."""
    count, mean, m2 = engine.channel_moments(x, planes, S, path)
    n = count.reshape(-1, group).astype(np.float64)
    mu = mean.reshape(-1, group)
    with np.errstate(all="ignore"):
        gmean = (n * mu).sum(axis=1) / n.sum(axis=1)
        gm2 = (m2.reshape(-1, group) + n * (mu - gmean[:, None]) ** 2).sum(axis=1)
        return gmean, 1.0 / np.sqrt(gm2 / n.sum(axis=1) + eps)


LN = "LayerNormalizationBackward"
RMS = "RMSNormalizationBackward"


def _rows_backward(label, dY, X, scale, axis, epsilon, mean, inv_std, centered, out, engine,
                   path):
    from normkernels.ops import rows

    key = None
    if path is None and mean is None and inv_std is None:
        key = training_plans.rows_key(label, engine, axis, epsilon, dY, X, scale, out)
        grads = plans.serve(key, dY, X, scale, out)
        if grads is not None:
            return grads

    supplied = (dY, X, scale)
    dY, X, params = _arrays(label, dY, X, {"scale": scale})
    a = rows.normalized_axis(label, "axis", axis, X.ndim)
    eps = common.check_epsilon(label, epsilon)
    rows.check_broadcast(label, "scale", params["scale"], X.shape[a:])
    given = given_statistics(label, mean, inv_std, X.shape[:a], centered)
    if out is not None:
        common.check_out(label, out, X, params, {"X": X, "dY": dY})
    M, K = rows.rows_shape(X.shape, a)
    span = X.shape[a:]
    pshape, pdtype = params["scale"].shape, params["scale"].dtype
    if X.size == 0:
        zeros = np.zeros(pshape, pdtype)
        return (np.empty_like(X) if out is None else out), zeros, zeros.copy()
    x = np.ascontiguousarray(X).reshape(M, K)
    dy = np.ascontiguousarray(dY).reshape(M, K)
    if out is not None and out.flags.c_contiguous:
        dx = out.reshape(M, K)
    else:
        dx = np.empty((M, K), X.dtype)
    gamma = np.ascontiguousarray(np.broadcast_to(params["scale"].astype(np.float64), span)
                                 ).reshape(K)
    stats = None if given is None else np.stack([v.reshape(M) for v in given], axis=1)
    dgamma, dbeta = engine.rows_backward(x, dy, dx, gamma, centered, eps, stats, path)
    dX = dx.reshape(X.shape)
    if out is not None:  # dx is out's memory, or a new array to copy there
        if not np.shares_memory(dX, out):
            np.copyto(out, dX)
        dX = out
    dscale = rows.sum_to(dgamma.reshape(span), pshape).astype(pdtype)
    dB = rows.sum_to(dbeta.reshape(span), pshape).astype(pdtype)
    if key is not None and eps and plans.plain(supplied, (dY, X, params["scale"])):
        plans.add(key, training_plans.rows_backward(engine, centered, eps, dY, X, params["scale"],
                                                    M, K, span, out))
    return dX, dscale, dB


def layer_normalization_backward(dY, X, Scale, *, axis=-1, epsilon=1e-5, stash_type=1,
                                 mean=None, inv_std=None, out=None, engine, path=None):
    """Spec layer of :func:`normkernels.layer_normalization_backward`."""
    from normkernels.ops.layer_normalization import stash_dtype

    stash_dtype(LN, stash_type)
    return _rows_backward(LN, dY, X, Scale, axis, epsilon, mean, inv_std, True, out, engine,
                          path)


def rms_normalization_backward(dY, X, scale, *, axis=-1, epsilon=1e-5, inv_std=None, out=None,
                               engine, path=None):
    """Spec layer of :func:`normkernels.rms_normalization_backward`: ``(dX, dscale)``."""
    dX, dscale, _ = _rows_backward(RMS, dY, X, scale, axis, epsilon, None, inv_std, False, out,
                                   engine, path)
    return dX, dscale

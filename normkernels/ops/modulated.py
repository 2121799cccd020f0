"""The modulated normalizations of diffusion models (spec layer): adaptive layer
normalization (DiT, FLUX, SD3) and diffusers' AdaGroupNorm.

``Y = LN(X) * (1 + scale[n]) + shift[n]``: LayerNormalization over the last axis
(channels, C) without affine parameters, then per-sample ``(N, C)`` modulation
broadcast over the tokens. With ``residual``, the block boundary of a DiT block in one
call: ``S = residual + gate[n] * X`` (gate per sample and channel; None: 1), then
``Y = LN(S) * (1 + scale[n]) + shift[n]``, returning ``(Y, S)``.

``1 + scale`` and the shift are exact in float64 (the row kernels' compute dtype for
float32 and float64 X; float32, rounded once, for 16-bit X), so Y is the row
kernels' ``((x - m) * a + c) * s + b`` rounded once; a zero shift adds -0.0, so
AdaLN-Zero's initial ``scale = shift = 0`` gives plain LayerNormalization bit for bit.
S is ``residual + gate * x`` in the row compute dtype, rounded once to X's dtype, and
Y is the normalization of S as returned (as SkipLayerNormalization).

``ada_group_norm``: ``GN(X) * (1 + scale[n, c]) + shift[n, c]``, group normalization
without its own affine parameters (diffusers' ``AdaGroupNorm``), the modulation folded
into each (n, c) plane's parameters in float64 (``a = (1 + scale) / sqrt(var +
epsilon)``, rounded once), so it costs what GroupNormalization does.
"""

import math

import numpy as np

from normkernels.dtypes import round_once
from normkernels.ops import common, group_normalization
from normkernels.ops.common import ALL_FLOATS

ADA = "ada_layer_norm"
ADA_GROUP = "ada_group_norm"
EPSILON = 1e-6  # DiT's


def _per_sample(label, name, p, X):
    """``p`` as ``(N, C)``: given as (N, C) or (N, 1, ..., 1, C) (X's rank)."""
    N, C = X.shape[0], X.shape[-1]
    allowed = [(N, C), (N, *(1,) * (X.ndim - 2), C)]
    if p.shape not in allowed:
        listed = " or ".join(str(s) for s in dict.fromkeys(allowed))
        raise ValueError(f"{label}: {name} must have shape {listed} (one value per sample "
                         f"and channel), got {p.shape}")
    return p.reshape(N, C).astype(np.float64)


def _ada_arguments(label, epsilon, X, shift, scale, residual, gate):
    """AdaLN's checks shared by the forward and the backward: ``(epsilon, X, params,
    tables)``, the per-sample parameters checked (gate only with a residual) and as
    float64 ``(N, C)`` tables."""
    eps = common.check_epsilon(label, epsilon)
    X = common.as_array("X", X)
    common.check_dtype(label, "X", X, ALL_FLOATS)
    if X.ndim < 2:
        raise ValueError(f"{label}: X must have at least 2 dimensions (N, ..., C), got "
                         f"shape {X.shape}")
    params = {"shift": common.as_array("shift", shift), "scale": common.as_array("scale", scale)}
    if gate is not None:
        if residual is None:
            raise ValueError(f"{label}: gate scales X into the residual stream: it needs "
                             "residual")
        params["gate"] = common.as_array("gate", gate)
    for name, p in params.items():
        common.check_dtype(label, name, p, ALL_FLOATS)
    return eps, X, params, {name: _per_sample(label, name, p, X) for name, p in params.items()}


def ada_layer_norm(X, shift, scale, *, epsilon=EPSILON, residual=None, gate=None, out=None,
                   engine, path=None):
    """Spec layer of :func:`normkernels.ada_layer_norm`."""
    label = ADA
    eps, X, params, tables = _ada_arguments(label, epsilon, X, shift, scale, residual, gate)
    inputs = {"X": X}
    if residual is not None:
        inputs["residual"] = common.as_array("residual", residual)
        common.check_dtype(label, "residual", inputs["residual"], ALL_FLOATS)
        common.check_same_dtype(label, "T", inputs)
        if inputs["residual"].shape != X.shape:
            raise ValueError(f"{label}: residual must have X's shape {X.shape}, got "
                             f"{inputs['residual'].shape}")
    if out is not None:
        common.check_out(label, out, X, params, inputs)
    N, C = X.shape[0], X.shape[-1]
    T = math.prod(X.shape[1:-1])  # tokens per sample
    if X.size and C == 0:
        raise ValueError(f"{label}: X of shape {X.shape} has rows of zero elements: their "
                         "statistics are undefined")
    src = np.ascontiguousarray(X)
    S = None
    if residual is not None:
        S = np.empty(X.shape, X.dtype)
        if X.size:
            gate_t = tables.get("gate", np.ones((N, C)))
            engine.gated_sums(src.reshape(-1), np.ascontiguousarray(inputs["residual"]).reshape(-1),
                              gate_t, S.reshape(-1), C, T, path)
        src = S
    Y = out if out is not None and out.flags.c_contiguous else np.empty(X.shape, X.dtype)
    if X.size:
        s_all = 1.0 + tables["scale"]
        b_all = np.where(tables["shift"] == 0, -0.0, tables["shift"])  # adds nothing
        engine.modulated_rows(src.reshape(N * T, C), Y.reshape(N * T, C), T, s_all, b_all, eps,
                              path)
    if out is not None and Y is not out:
        np.copyto(out, Y)
        Y = out
    return Y if S is None else (Y, S)


def ada_group_norm(X, shift, scale, *, num_groups, epsilon=1e-5, data_format="NCX",
                   out=None, engine, path=None):
    """Spec layer of :func:`normkernels.ada_group_norm`."""
    label = ADA_GROUP
    eps = common.check_epsilon(label, epsilon)
    common.check_data_format(label, data_format)
    X = common.as_array("X", X)
    common.check_dtype(label, "X", X, ALL_FLOATS)
    if X.ndim < 3:
        raise ValueError(f"{label}: X must have at least 3 dimensions (N x C x D1 ...), got "
                         f"shape {X.shape}")
    N, C = X.shape[0], common.channel_count(X, data_format)
    params = {"shift": common.as_array("shift", shift), "scale": common.as_array("scale", scale)}
    for name, p in params.items():
        common.check_dtype(label, name, p, ALL_FLOATS)
        if p.shape != (N, C):
            raise ValueError(f"{label}: {name} must have shape ({N}, {C}) (one value per "
                             f"sample and channel), got {p.shape}")
    G = group_normalization.check_groups(label, "num_groups", num_groups, C)
    if out is not None:
        common.check_out(label, out, X, params)
    # per-(n, c) parameters: the engines take N * C values where they take C
    s = (1.0 + params["scale"].astype(np.float64)).ravel()
    b = params["shift"].astype(np.float64).ravel()
    return group_normalization.normalize(label, X, s, b, G, eps, data_format, out, engine,
                                         path)[0]


def ada_group_norm_backward(dY, X, shift, scale, *, num_groups, epsilon=1e-5,
                            data_format="NCX", mean=None, inv_std=None, out=None, engine,
                            path=None):
    """Spec layer of :func:`normkernels.ada_group_norm_backward`: the group backward pass
    with per-(n, c) ``gamma = 1 + scale``, whose per-sample sums are ``dscale`` and
    ``dshift``."""
    from normkernels.ops import backward

    label = ADA_GROUP + "_backward"
    X = common.as_array("X", X)
    if X.ndim < 3:
        raise ValueError(f"{label}: X must have at least 3 dimensions (N x C x D1 ...), got "
                         f"shape {X.shape}")
    common.check_data_format(label, data_format)
    N, C = X.shape[0], common.channel_count(X, data_format)
    params = {"shift": common.as_array("shift", shift), "scale": common.as_array("scale", scale)}
    for name, p in params.items():
        common.check_dtype(label, name, p, ALL_FLOATS)
        if p.shape != (N, C):
            raise ValueError(f"{label}: {name} must have shape ({N}, {C}) (one value per "
                             f"sample and channel), got {p.shape}")
    gamma = 1.0 + params["scale"].astype(np.float64)
    dX, dscale, dshift = backward.group_backward(label, dY, X, gamma, num_groups, epsilon,
                                                  mean, inv_std, data_format, out, engine,
                                                  path, per_sample=True)
    return dX, round_once(dshift, params["shift"].dtype), round_once(dscale, params["scale"].dtype)


def ada_layer_norm_backward(dY, X, shift, scale, *, epsilon=EPSILON, residual=None, gate=None,
                            dS=None, out=None, engine, path=None):
    """Spec layer of :func:`normkernels.ada_layer_norm_backward`."""
    from normkernels.dtypes import row_compute_dtype

    label = ADA + "_backward"
    dY = common.as_array("dY", dY)
    eps, X, params, tables = _ada_arguments(label, epsilon, X, shift, scale, residual, gate)
    inputs = {"dY": dY}
    if residual is not None:
        inputs["residual"] = common.as_array("residual", residual)
        if dS is not None:
            inputs["dS"] = common.as_array("dS", dS)
    elif dS is not None:
        raise ValueError(f"{label}: dS is the gradient of the returned S: it needs residual")
    for name, v in inputs.items():
        if v.shape != X.shape or v.dtype != X.dtype:
            raise ValueError(f"{label}: {name} must have X's shape and dtype ({X.shape}, "
                             f"{X.dtype}), got ({v.shape}, {v.dtype})")
    if out is not None:
        common.check_out(label, out, X, params, {"X": X, **inputs})
    N, C = X.shape[0], X.shape[-1]
    T = math.prod(X.shape[1:-1])
    if X.size == 0 or C == 0:
        if X.size and C == 0:
            raise ValueError(f"{label}: X of shape {X.shape} has rows of zero elements")
        zeros = {name: np.zeros((N, C), p.dtype) for name, p in params.items()}
        dX = np.empty_like(X) if out is None else out
        if residual is None:
            return dX, zeros["shift"], zeros["scale"]
        return dX, np.empty_like(X), zeros.get("gate", None), zeros["shift"], zeros["scale"]
    # 16-bit: the normalization's dX stays in float32 (computed from X widened exactly),
    # so that dS + dLN and gate * (...) are rounded once
    wide = residual is not None and X.dtype.itemsize == 2
    cd = row_compute_dtype(X.dtype) if wide else X.dtype
    src = np.ascontiguousarray(X)
    if residual is not None:  # S as the forward computed it (rounded once to X's dtype)
        S = np.empty(X.shape, X.dtype)
        engine.gated_sums(src.reshape(-1), np.ascontiguousarray(inputs["residual"]).reshape(-1),
                          tables.get("gate", np.ones((N, C))), S.reshape(-1), C, T, path)
        src = S
    src = src.astype(cd, copy=False).reshape(N, T, C)
    dy = np.ascontiguousarray(dY, dtype=cd).reshape(N, T, C)
    target = out if (residual is None and out is not None and out.flags.c_contiguous) else None
    dln = (np.empty((N, T, C), cd) if target is None else target.reshape(N, T, C))
    dscale, dshift = engine.modulated_rows_backward(
        src.reshape(N * T, C), dy.reshape(N * T, C), dln.reshape(N * T, C), T,
        1.0 + tables["scale"], eps, path)
    grads = (round_once(dshift, params["shift"].dtype), round_once(dscale, params["scale"].dtype))
    if residual is None:
        if out is None:
            return (dln.reshape(X.shape), *grads)
        if target is None:  # dln is a new array: copied into out
            np.copyto(out, dln.reshape(X.shape))
        return (out, *grads)
    # the residual stream: dR = dS + dLN, dX = gate dR, dgate = sum over tokens of dR X
    dR = np.empty(X.shape, X.dtype)
    dX = out if out is not None and out.flags.c_contiguous else np.empty(X.shape, X.dtype)
    dgate = engine.gated_backward(dln, None if dS is None else np.ascontiguousarray(dS),
                                  np.ascontiguousarray(X), tables.get("gate", np.ones((N, C))),
                                  dR, dX, C, T, path).reshape(N, C)
    if out is not None and dX is not out:
        np.copyto(out, dX)
        dX = out
    dgate = round_once(dgate, params["gate"].dtype) if "gate" in params else None
    return dX, dR, dgate, *grads

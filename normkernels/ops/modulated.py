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


def ada_layer_norm(X, shift, scale, *, epsilon=EPSILON, residual=None, gate=None, out=None,
                   engine, path=None):
    """Spec layer of :func:`normkernels.ada_layer_norm`."""
    label = ADA
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
    tables = {name: _per_sample(label, name, p, X) for name, p in params.items()}
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
        x2, y2 = src.reshape(N, T, C), Y.reshape(N, T, C)
        s_all = 1.0 + tables["scale"]
        b_all = np.where(tables["shift"] == 0, -0.0, tables["shift"])  # adds nothing
        for n in range(N):  # the row kernels take one table per column: a call per sample
            engine.normalize_rows(x2[n], y2[n], s_all[n], b_all[n], eps, True, path=path)
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

"""Backward passes through an activation and residual epilogue (spec layer; package
extensions, as the forward's ``activation=`` and ``add=``): oneDNN's ``fuse_norm_relu``
and ``fuse_norm_add_relu``, GroupNorm + SiLU.

The forward is ``Y = act(Z)``, ``Z = scale * x_hat + B + R``. Its gradient:

* ``dZ = dY * act'(Z)`` (:mod:`normkernels.kernels.activation_grad`);
* ``dR = dZ`` (oneDNN's ``diff_src_1``), returned when the forward had a residual;
* ``dX, dscale, dB``: the normalization's backward pass with dZ in place of dY.

Where Z comes from: ReLU's mask is ``Y > 0`` when the caller gives the forward's ``Y``
(what oneDNN keeps in its workspace); otherwise Z is recomputed from X, the statistics,
``scale``, ``B`` (and R), folded as the forward folds them (:func:`z_coefficients`),
in the compute dtype. dZ of ReLU is dY or 0, exact in X's dtype. For a smooth
activation dZ stays in the compute dtype (float32 for 16-bit X), and dX and dR are
rounded once, at the end.

This module checks the epilogue and lays it out (:class:`normkernels.engine.Epilogue`);
the engine makes dZ: the Numba engine block by block inside the backward's two
passes (:mod:`normkernels.kernels.epilogue_grad`), never in memory; its twin, the base
engine, writes dZ and runs the plain passes on it.
"""

import numpy as np

from normkernels.dtypes import compute_dtype
from normkernels.ops import common
from normkernels.ops.common import ALL_FLOATS


def wanted(activation, Y, B, add):
    """Whether a backward call has an epilogue to go through."""
    return not (activation is None and Y is None and B is None and add is None)


def check(label, activation, Y, B, add, X, C):
    """``(act, Y, B, add)`` checked: ``Y`` gives ReLU's mask; a smooth activation needs
    ``B`` (per channel, to recompute Z); ``add`` is the forward's residual (X's shape
    and dtype)."""
    act = common.check_activation(label, activation)
    res = common.check_residual(label, "add", add, X)
    if Y is not None:
        if act != "relu":
            raise ValueError(f"{label}: Y gives the mask of activation='relu'; "
                             f"{'no activation' if act is None else repr(act)} takes B "
                             "instead (the activation's input is recomputed from X)")
        Y = common.as_array("Y", Y)
        if Y.shape != X.shape or Y.dtype != X.dtype:
            raise ValueError(f"{label}: Y (the forward's output) must have X's shape and "
                             f"dtype ({X.shape}, {X.dtype}), got ({Y.shape}, {Y.dtype})")
    if B is not None:
        B = common.as_array("B", B)
        common.check_dtype(label, "B", B, ALL_FLOATS)
        common.check_channel_params(label, C, {"B": B})
    if act is not None and Y is None and B is None:
        raise ValueError(f"{label}: activation={act!r} needs B (the forward's bias), to "
                         "recompute the activation's input from X"
                         + (", or Y (the forward's output)" if act == "relu" else ""))
    if act is None and Y is None and B is not None and res is None:
        raise ValueError(f"{label}: B is only read to recompute an activation's input; "
                         "give activation=")
    return act, Y, B, res


def prepare(act, Y, res, order, coefficients):
    """The :class:`normkernels.engine.Epilogue` of a call: ``Y`` and ``res`` (X's
    shape) in the kernels' memory order (``order``: X's, from ``layout_or_copy``; copied
    only when not already); ``coefficients()`` gives Z's ``(m, a, b)`` per channel,
    called only when Z is read (no mask from Y, an activation)."""
    from normkernels.engine import Epilogue

    def kernel_order(v):
        return None if v is None else np.ascontiguousarray(v.transpose(order))

    if Y is not None:
        return Epilogue(act, kernel_order(Y), None, None, None, None)
    if act is None:  # a residual alone: dZ is dY
        return Epilogue(None, None, None, None, None, None)
    return Epilogue(act, None, kernel_order(res), *coefficients())


def z_coefficients(scale, B, mean, r, dtype):
    """Z's ``(m, a, b)`` per channel in the compute dtype of ``dtype`` from float64
    ``mean`` and ``r = 1 / sqrt(var + epsilon)``: ``a = scale r`` rounded once, the
    mean rounded with its residual folded into ``b`` (as the forward folds a float64
    mean; with ``var`` instead of ``r`` the forward's own rule is
    :func:`normkernels.reference.fold_parameters`)."""
    cd = compute_dtype(dtype)
    with np.errstate(all="ignore"):
        a64 = scale * r
        m = mean.astype(cd)
        b = B.astype(np.float64) + np.where(np.isfinite(m), (m - mean) * a64, 0.0)
    return m, a64.astype(cd), b.astype(cd)


def residual_target(res, x):
    """Where dR is written (X's dtype, the kernels' memory order), or None."""
    return None if res is None else np.empty_like(x)


def kept(ep, x, dx, dres):
    """Where the backward's reduction also writes dZ, for a plain dX pass to read, or
    None (the dX pass makes dZ again). dZ must be exact in X's dtype (ReLU, a residual
    alone, or 32/64-bit X). With a residual it goes to dR, which is written anyway (7
    passes over memory where making dZ again reads the residual twice: 8); for a smooth
    activation to dX, which the dX pass then overwrites (6 passes against 5, but the
    derivative, an exponential and a division a lane, is computed once). Not into dX
    when dX is X's memory (the reduction still reads X)."""
    if not (ep.mask is not None or ep.act in (None, "relu") or x.dtype.itemsize >= 4):
        return None
    if dres is not None:
        return dres
    if ep.mask is None and ep.act not in (None, "relu") and not np.may_share_memory(dx, x):
        return dx
    return None


def residual_result(dres, order):
    """``(dR,)`` in X's memory order, or ``()`` without a residual."""
    return () if dres is None else (dres.transpose(np.argsort(order)),)


def scaled_grad(engine, x, dy, dx, dres, C, S, a, ep, path):
    """``dX = dZ * a[c]`` (a backward with constant statistics: it does not read X, so
    a NaN or inf in X stays out of dX but for Z's), and ``dR = dZ``."""
    dz = engine.epilogue_dz(x, dy, C, S, ep, path)
    if dres is not None:
        dres[...] = dz.astype(dres.dtype)
    zeros = np.zeros_like(a)
    if dz.dtype == dx.dtype:
        engine.scale_shift(dz, dx, C, S, zeros, a, zeros, path)
        return
    wide = np.empty(dz.shape, dz.dtype)  # 16-bit X, a smooth activation: rounded once
    engine.scale_shift(dz, wide, C, S, zeros, a, zeros, path)
    dx[...] = wide.astype(dx.dtype)

"""Backward passes through an activation and residual epilogue (spec layer; package
extensions, as the forward's ``activation=`` and ``add=``): oneDNN's ``fuse_norm_relu``
and ``fuse_norm_add_relu``, GroupNorm + SiLU.

The forward is ``Y = act(Z)``, ``Z = scale * x_hat + B + R``. Its gradient:

* ``dZ = dY * act'(Z)`` (:mod:`normkernels.kernels.activation_grad`);
* ``dR = dZ`` (oneDNN's ``diff_src_1``), returned when the forward had a residual;
* ``dX, dscale, dB``: the normalization's backward pass with dZ in place of dY.

Where Z comes from: ReLU's mask is ``Y > 0`` when the caller gives the forward's ``Y``
(what oneDNN keeps in its workspace); otherwise Z is recomputed from X, the statistics,
``B`` (and R) by the forward's own kernels, in the compute dtype. dZ of ReLU is dY or
0, exact in X's dtype. For a smooth activation dZ stays in the compute dtype: with
16-bit X the normalization's backward then runs on float32 (X widened, exactly) and
dX and dR are rounded once, at the end.
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


def backward(label, dY, X, act, Y, res, data_format, pre_activation, normalization, out,
             engine, path):
    """The epilogue's gradient, then the normalization's: ``normalization(dZ, X, out)``
    returns ``(dX, dscale, dB)``; ``pre_activation(Xc, Rc)`` returns Z (X's shape, the
    compute dtype) from ``Xc`` and the residual ``Rc``, both in the compute dtype.
    Returns ``(dX, dscale, dB)``, followed by ``dR`` when ``res`` is given."""
    if X.size == 0:
        dX, dscale, dB = normalization(dY, X, out)
        return (dX, dscale, dB) + (() if res is None else (np.empty_like(X),))
    cd = compute_dtype(X.dtype)
    Xl, order, _ = common.layout_or_copy(X, data_format)
    back = np.argsort(order)

    def kernel_order(v):
        return np.ascontiguousarray(v.transpose(order))

    dy = kernel_order(dY)
    if act is None:  # a residual alone: dZ is dY
        dz = dy.copy()
    elif act == "relu":
        dz = np.empty_like(dy)
        if Y is not None:
            mask = kernel_order(Y)
        else:
            mask = kernel_order(pre_activation(_widened(Xl, cd), _widened(res, cd)))
        engine.relu_mask(mask, dy, dz, path)
    else:
        # Z is a new array in the compute dtype: dZ overwrites it, element by element
        dz = kernel_order(pre_activation(_widened(Xl, cd), _widened(res, cd)))
        engine.activation_grad(dz, dy, dz, act, path)
    dZ = dz.transpose(back)
    if dZ.dtype == X.dtype:
        dX, dscale, dB = normalization(dZ, Xl, out)
        grads = (dX, dscale, dB)
        return grads if res is None else (*grads, dZ)
    # 16-bit X under a smooth activation: dZ in float32, dX and dR rounded once at the end
    dX32, dscale, dB = normalization(dZ, _widened(Xl, cd), None)
    dX = np.empty_like(X) if out is None else out
    np.copyto(dX, dX32.astype(X.dtype))
    grads = (dX, dscale, dB)
    return grads if res is None else (*grads, dZ.astype(X.dtype))


def _widened(v, cd):
    """``v`` in the compute dtype ``cd`` (itself when it is already), memory order kept
    (16-bit to float32 is exact)."""
    if v is None or v.dtype == cd:
        return v
    return v.astype(cd, order="K")

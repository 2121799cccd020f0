"""The backward pass of an activation epilogue: ``dZ = dY * act'(Z)``, where ``Z`` is
the activation's input (the normalization's affine result plus the residual).

``act'`` is built in IR from the forward's own pieces (:mod:`normkernels.kernels.
activations`: the same sigmoid, exponential and GELU), so it is the same bits on every
CPU and branch-free: LLVM vectorises the loop as written. Derivatives, in the compute
dtype (PyTorch's formulas, which every framework uses):

* ``silu'(z) = s (1 + z (1 - s))``, ``s = sigmoid(z)``;
* ``gelu_tanh'(z) = s + z s (1 - s) 2u'``, ``s = sigmoid(2u)``, ``2u = 2 sqrt(2/pi)
  (z + 0.044715 z^3)``, ``2u' = 2 sqrt(2/pi) (1 + 3 * 0.044715 z^2)``;
* ``gelu'(z) = Phi(z) + z phi(z)``: ``Phi(z) = gelu(z) / z`` (the forward's own gelu,
  1/2 at 0), ``phi(z) = exp(-z^2 / 2) / sqrt(2 pi)``. It crosses 0 at z = -0.75, where
  the sum cancels: its error is absolute there, a few units of roundoff.

ReLU is :func:`relu_mask`: ``dZ = dY`` where ``z > 0``, else 0 (0 at 0 and for NaN),
selected, never multiplied (an infinite ``dY`` under a 0 of the mask gives 0, as
PyTorch's ``threshold_backward``), so exact in dY's dtype. The mask may come from the
forward's output ``Y`` (``relu(z) > 0`` exactly where ``z > 0``), as oneDNN's
``fuse_norm_relu`` takes it from its workspace.
"""

import math

from numba import njit, prange, types
from numba.core.extending import intrinsic

import normkernels.kernels.cache  # noqa: F401  (registers the cache locators before any @njit)
from normkernels.kernels.activations import (
    GELU_A,
    GELU_B,
    ActivationType,
    build,
    constant,
    exp_nonpositive,
    sigmoid,
)
from normkernels.kernels.cache import serial_twin
from normkernels.kernels.elements import load
from normkernels.kernels.options import KERNEL_OPTIONS

ITEM_ELEMENTS = 1 << 16  # elements per work item


def build_derivative(builder, kind, z):
    """IR of ``act'(z)`` (scalar or vector float/double ``z``)."""
    ty = z.type
    one = constant(ty, 1.0)
    if kind == "silu":
        s = sigmoid(builder, z)
        return builder.fmul(s, builder.fadd(one, builder.fmul(z, builder.fsub(one, s))))
    if kind == "gelu_tanh":
        a, b = 2.0 * GELU_A, GELU_B
        zz = builder.fmul(z, z)
        two_u = builder.fmul(constant(ty, a),
                             builder.fadd(z, builder.fmul(constant(ty, b), builder.fmul(zz, z))))
        slope = builder.fmul(constant(ty, a),
                             builder.fadd(one, builder.fmul(constant(ty, 3.0 * b), zz)))
        s = sigmoid(builder, two_u)
        ds = builder.fmul(s, builder.fsub(one, s))
        return builder.fadd(s, builder.fmul(builder.fmul(z, ds), slope))
    if kind == "gelu":  # Phi(z) = gelu(z) / z (1/2 at 0), phi(z) = exp(-z^2 / 2) / sqrt(2 pi)
        zero = constant(ty, 0.0)
        cdf = builder.select(builder.fcmp_ordered("==", z, zero), constant(ty, 0.5),
                             builder.fdiv(build(builder, "gelu", z), z))
        half_square = builder.fmul(builder.fmul(z, z), constant(ty, -0.5))
        density = builder.fmul(exp_nonpositive(builder, half_square),
                               constant(ty, 1.0 / math.sqrt(2.0 * math.pi)))
        return builder.fadd(cdf, builder.fmul(z, density))
    raise ValueError(f"no derivative for activation {kind!r}")


DERIVATIVES = ("silu", "gelu_tanh", "gelu")  # ReLU: relu_mask


@intrinsic
def derivative(typingctx, act, value):
    """``act'(value)`` for a scalar float32 or float64 ``value``."""
    if not (isinstance(act, ActivationType) and act.kind in DERIVATIVES
            and value in (types.float32, types.float64)):
        return None

    def codegen(context, builder, sig, args):
        return build_derivative(builder, act.kind, args[1])

    return value(act, value), codegen


@njit(parallel=True, **KERNEL_OPTIONS)
def activation_grad(z, dy, dz, act):
    """``dz = dy * act'(z)``: ``z`` and ``dz`` compute-dtype arrays, ``dy`` a storage
    array, all flat and in one memory order."""
    n = z.size
    for item in prange((n + ITEM_ELEMENTS - 1) // ITEM_ELEMENTS):
        for i in range(item * ITEM_ELEMENTS, min(n, (item + 1) * ITEM_ELEMENTS)):
            dz[i] = load(dy, i) * derivative(act, z[i])


@njit(parallel=True, **KERNEL_OPTIONS)
def relu_mask(y, dy, dz):
    """``dz = dy`` where ``y > 0``, else +0: ``y`` the forward's output or the
    activation's input (any storage or compute dtype), ``dy`` and ``dz`` storage arrays
    of one dtype (``dy`` copied exactly), all flat and in one memory order."""
    n = y.size
    for item in prange((n + ITEM_ELEMENTS - 1) // ITEM_ELEMENTS):
        for i in range(item * ITEM_ELEMENTS, min(n, (item + 1) * ITEM_ELEMENTS)):
            if load(y, i) > 0:
                dz[i] = dy[i]
            else:
                dz[i] = 0  # +0 in every storage dtype (all bits clear)


activation_grad_serial = serial_twin(activation_grad)
relu_mask_serial = serial_twin(relu_mask)

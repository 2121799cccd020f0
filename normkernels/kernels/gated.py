"""The gated RMSNorm of Mamba-2 and Qwen3-Next (mamba_ssm's ``RMSNormGated``): forward
and backward loops over rows.

Rows of ``K`` elements (row ``r`` of a flat storage array ``x`` at ``r * xr``, of the
gate ``z`` at ``r * zr``), normalized in groups of ``G`` contiguous elements (``K / G``
groups; ``G = K``: the whole row). Per group the mean square is float64
(:func:`normkernels.kernels.rows.row_statistics`) and ``a = 1 / sqrt(ms + epsilon)`` is
rounded once to the compute dtype ``cd`` (float32 for 16-bit and float32 X, float64 for
float64 X), the dtype of the column tables ``w`` and ``b`` (no bias: ``b = -0.0``,
which adds nothing). SiLU is the package's (:func:`normkernels.kernels.activations.
activate`: ``z sigmoid(z)`` as one division, the same bits on every CPU).

* ``before`` (``norm_before_gate=True``): ``y = ((x * a) * w + b) * silu(z)``;
* not ``before``: ``u = x * silu(z)`` (compute dtype, not rounded to X's dtype: mamba_ssm
  keeps it in float32), the statistics of ``u``, ``y = (u * a) * w + b``.

Y is rounded once to its storage dtype. The backward loops work in float64 throughout
(see :func:`gated_backward_parallel`). Parallel kernels split the rows in blocks of
``per_item`` rows: any count for the forward (rows are independent; the engine's
policy picks it), :func:`rows_per_item` for the backward, whose partial sums merge in
item order (the shape alone fixes it, so the bits never depend on the thread count).
Each has a one-thread twin of the same source (``*_serial``).
"""

import math

import numpy as np
from numba import njit, prange, types
from numba.core.extending import intrinsic

import normkernels.kernels.cache  # noqa: F401  (registers the cache locators before any @njit)
from normkernels.kernels.activations import SILU, activate, sigmoid
from normkernels.kernels.cache import serial_twin
from normkernels.kernels.elements import load, store
from normkernels.kernels.lp import store_rounded
from normkernels.kernels.options import HELPER_OPTIONS, INLINE_OPTIONS, KERNEL_OPTIONS
from normkernels.kernels.rows import row_statistics

BLOCK_ELEMENTS = 1 << 15  # elements of the rows of one backward work item


def rows_per_item(K):
    """Rows per backward work item for rows of ``K`` elements (the shape alone decides
    it: the partial sums then merge in the same order for any thread count)."""
    return max(1, BLOCK_ELEMENTS // max(K, 1))


@intrinsic
def sigmoid_of(typingctx, value):
    """The package's ``sigmoid(value)`` (float32 or float64), for the slopes."""
    if value not in (types.float32, types.float64):
        return None

    def codegen(context, builder, sig, args):
        return sigmoid(builder, args[0])

    return value(value), codegen


# The element loops take slices indexed from 0: with ``x[o + i]`` Numba wraps negative
# indices and LLVM kept the loops scalar (6-12 ns an element, SiLU's exponential
# included).


@njit(**INLINE_OPTIONS)
def _norm_then_gate(xs, zs, ys, a, ws, bs):
    """``y = ((x * a) * w + b) * silu(z)`` over a group."""
    for i in range(xs.size):
        v = (load(xs, i) * a) * ws[i] + bs[i]
        store(ys, i, v * activate(SILU, load(zs, i)))


@njit(**INLINE_OPTIONS)
def _gate_input(xs, zs, us):
    """``u = x * silu(z)`` over a row, in the compute dtype (not rounded to x's)."""
    for i in range(xs.size):
        us[i] = load(xs, i) * activate(SILU, load(zs, i))


@njit(**INLINE_OPTIONS)
def _affine(us, ys, a, ws, bs):
    """``y = (u * a) * w + b`` over a group."""
    for i in range(us.size):
        store(ys, i, (us[i] * a) * ws[i] + bs[i])


@njit(**INLINE_OPTIONS)
def _forward_rows(x, xr, z, zr, y, yr, w, b, G, epsilon, before, var, first, last):
    """Per row three loops over its groups (statistics, scalars, elements), so the
    square roots and divisions of short groups pipeline (as the QK-norm heads)."""
    K = w.size
    groups = K // G
    a = np.empty(groups, w.dtype)
    u = np.empty(0 if before else K, w.dtype)
    for r in range(first, last):
        xo, zo, yo, j = r * xr, r * zr, r * yr, r * groups
        if before:
            for g in range(groups):
                var[j + g] = row_statistics(x, xo + g * G, G, False)[1]
        else:
            _gate_input(x[xo:xo + K], z[zo:zo + K], u)
            for g in range(groups):
                var[j + g] = row_statistics(u, g * G, G, False)[1]
        for g in range(groups):
            a[g] = 1.0 / math.sqrt(var[j + g] + epsilon)
        for g in range(groups):
            lo, hi = g * G, g * G + G
            if before:
                _norm_then_gate(x[xo + lo:xo + hi], z[zo + lo:zo + hi], y[yo + lo:yo + hi], a[g],
                                w[lo:hi], b[lo:hi])
            else:
                _affine(u[lo:hi], y[yo + lo:yo + hi], a[g], w[lo:hi], b[lo:hi])


@njit(**KERNEL_OPTIONS)
def _forward_item(x, xr, z, zr, y, yr, w, b, G, epsilon, before, var, first, last):
    _forward_rows(x, xr, z, zr, y, yr, w, b, G, epsilon, before, var, first, last)


@njit(parallel=True, **KERNEL_OPTIONS)
def gated_forward_parallel(x, xr, z, zr, y, yr, w, b, G, epsilon, before, var, per_item):
    """Y into ``y`` (row stride ``yr``), the mean square of each group into ``var``
    (float64, ``M * K / G``); blocks of ``per_item`` rows in parallel (no bit depends
    on it: rows are independent). ``w``, ``b``: compute-dtype tables of ``K``;
    ``before``: ``norm_before_gate``."""
    M = var.size // (w.size // G)
    for item in prange((M + per_item - 1) // per_item):
        first = item * per_item
        _forward_item(x, xr, z, zr, y, yr, w, b, G, epsilon, before, var, first,
                      min(M, first + per_item))


@njit(**INLINE_OPTIONS)
def _slope(zv, s):
    """``silu'(z) = s (1 + z (1 - s))`` with ``s = sigmoid(z)``."""
    return s * (1.0 + zv * (1.0 - s))


@njit(**KERNEL_OPTIONS)
def _put(arr, i, value):
    """:func:`store_rounded`, called (not inlined: inlined into the row loops, its
    round-to-odd tripped Numba's IR scope check)."""
    store_rounded(arr, i, value)


@njit(**INLINE_OPTIONS)
def _backward_rows(dy, dyr, x, xr, z, zr, w, b, G, epsilon, before, var, dx, dz, dwp, dbp,
                   first, last):
    K = w.size
    groups = K // G
    u, g_, xh = np.empty(K), np.empty(K), np.empty(K)
    for r in range(first, last):
        xo, zo, dyo, o = r * xr, r * zr, r * dyr, r * K
        for k in range(K):
            u[k] = np.float64(load(x, xo + k))
            if not before:
                zv = np.float64(load(z, zo + k))
                u[k] = u[k] * activate(SILU, zv)
        for g in range(groups):
            ms = row_statistics(u, g * G, G, False)[1]
            var[r * groups + g] = ms
            rs = 1.0 / math.sqrt(ms + epsilon)
            c = -0.0  # adds nothing: the sum is its terms' (the twin's cumsum)
            for k in range(g * G, g * G + G):
                h = u[k] * rs
                d = np.float64(load(dy, dyo + k))
                if before:
                    zv = np.float64(load(z, zo + k))
                    s = sigmoid_of(zv)
                    _put(dz, o + k, (d * (h * w[k] + b[k])) * _slope(zv, s))
                    d = d * (zv * s)
                dbp[k] += d
                dwp[k] += d * h
                gk = d * w[k]
                g_[k] = gk
                xh[k] = h
                c += h * gk
            c = c / G
            for k in range(g * G, g * G + G):
                du = (g_[k] - xh[k] * c) * rs
                if before:
                    _put(dx, o + k, du)
                else:
                    zv = np.float64(load(z, zo + k))
                    s = sigmoid_of(zv)
                    _put(dz, o + k, (du * np.float64(load(x, xo + k))) * _slope(zv, s))
                    _put(dx, o + k, du * (zv * s))


@njit(**HELPER_OPTIONS)
def _backward_item(dy, dyr, x, xr, z, zr, w, b, G, epsilon, before, var, dx, dz, dwp, dbp,
                   item, per_item):
    """Item ``item``: its ``per_item`` rows, its partial sums ``dwp[item]``, ``dbp[item]``."""
    M = var.size // (w.size // G)
    K = w.size
    first = item * per_item
    _backward_rows(dy, dyr, x, xr, z, zr, w, b, G, epsilon, before, var, dx, dz,
                   dwp[item * K:item * K + K], dbp[item * K:item * K + K], first,
                   min(M, first + per_item))


@njit(parallel=True, **KERNEL_OPTIONS)
def gated_backward_parallel(dy, dyr, x, xr, z, zr, w, b, G, epsilon, before, var, dx, dz,
                            dwp, dbp, per_item):
    """The gradient, in float64 throughout (``w``, ``b``: float64 tables): per group
    ``h = u * rs`` (``u = x`` or ``x * silu(z)``, ``rs = 1 / sqrt(ms + epsilon)``, the
    mean square ``ms`` of the float64 ``u`` into ``var``); ``before``: ``dz = dy (h w +
    b) silu'(z)`` and ``d = dy silu(z)``, else ``d = dy``; ``g = d w``, ``c = sum(h
    g) / G`` (in order), ``du = (g - h c) rs``; ``dx = du`` (before) or ``du silu(z)``
    with ``dz = du x silu'(z)``. dx and dz (contiguous ``M x K``) rounded once
    (16-bit: by round-to-odd through float32, :func:`normkernels.kernels.lp.store_rounded`). Item
    ``i`` adds ``d`` and ``d h`` of its rows, in order, into ``dbp[i]`` and ``dwp[i]``
    (``n_items x K``, zeros): ``per_item`` (:func:`rows_per_item`) fixes the bits of
    their sums."""
    M = var.size // (w.size // G)
    for item in prange((M + per_item - 1) // per_item):
        _backward_item(dy, dyr, x, xr, z, zr, w, b, G, epsilon, before, var, dx, dz, dwp, dbp,
                       item, per_item)


# one-thread twins (see normkernels.kernels.cache.serial_twin)
gated_forward_serial = serial_twin(gated_forward_parallel, **KERNEL_OPTIONS)
gated_backward_serial = serial_twin(gated_backward_parallel, **KERNEL_OPTIONS)

"""A small per-channel training step in one compiled call: the batch statistics and
the normalize pass of BatchNormalization's (and oneDNN's forward) training on a tensor
of a serial size, as the engine runs them step by step on the serial path
(``channel_moments``, then ``inference`` with the float64 batch mean and variance),
composed from the very same serial kernels, so the bits are the step-by-step path's.
The routes are tags, as in :mod:`normkernels.kernels.backward_small` (why: there)."""

import numpy as np
from numba import njit
from numba.core.extending import overload

import normkernels.kernels.cache  # noqa: F401  (registers the cache locators before any @njit)
from normkernels.kernels.inference import normalize_periodic_serial, normalize_planes_serial
from normkernels.kernels.options import KERNEL_OPTIONS, OVERLOAD_OPTIONS
from normkernels.kernels.statistics import (
    PLANE_CHUNK,
    merge_planes,
    merge_rows_serial,
    plane_partials_serial,
    row_partials_serial,
)


def _moments(tag, x, C, S, steps, count, mean, m2):
    """Per-channel ``(count, mean, M2)`` by planes of ``S`` (``tag`` 1-D) or by the
    rows steps ``(lo, hi, P, rows per block)`` (2-D), as ``channel_moments``."""
    raise NotImplementedError("only callable from @njit code")


@overload(_moments, jit_options=OVERLOAD_OPTIONS)
def _moments_impl(tag, x, C, S, steps, count, mean, m2):
    if tag.ndim == 1:
        def planes(tag, x, C, S, steps, count, mean, m2):
            parts = x.size // S * ((S + PLANE_CHUNK - 1) // PLANE_CHUNK)
            part_mean, part_m2 = np.empty(parts), np.empty(parts)
            plane_partials_serial(x, S, part_mean, part_m2)
            merge_planes(part_mean, part_m2, C, S, count, mean, m2)
        return planes

    def rows(tag, x, C, S, steps, count, mean, m2):
        for i in range(steps.shape[0]):
            lo, hi, P, per_block = steps[i, 0], steps[i, 1], steps[i, 2], steps[i, 3]
            n_rows = (hi - lo) // P
            blocks = (n_rows + per_block - 1) // per_block
            part_mean, part_m2 = np.empty((blocks, P)), np.empty((blocks, P))
            row_partials_serial(x[lo:hi], P, n_rows, per_block, part_mean, part_m2)
            merge_rows_serial(part_mean, part_m2, n_rows, per_block, C, S, count, mean, m2)
    return rows


def _normalize(tag, x, y, C, S, scale, B, mean, var, epsilon, period, act):
    """The normalize pass with the batch statistics: the planes loop (``tag`` 1-D) or
    the periodic tables of ``period`` (2-D), as ``inference`` on the serial path."""
    raise NotImplementedError("only callable from @njit code")


@overload(_normalize, jit_options=OVERLOAD_OPTIONS)
def _normalize_impl(tag, x, y, C, S, scale, B, mean, var, epsilon, period, act):
    if tag.ndim == 1:
        def planes(tag, x, y, C, S, scale, B, mean, var, epsilon, period, act):
            normalize_planes_serial(x, y, C, S, scale, B, mean, var, epsilon, period < 0, None,
                                    act)
        return planes

    def periodic(tag, x, y, C, S, scale, B, mean, var, epsilon, period, act):
        normalize_periodic_serial(x, y, C, S, scale, B, mean, var, epsilon, period, period < 0,
                                  None, act)
    return periodic


@njit(**KERNEL_OPTIONS)
def batch_training(x, y, C, S, S_moments, scale, B, epsilon, moments, steps, normalize,
                   period, act, mean, var):
    """Writes Y and the float64 batch ``mean`` and population ``var`` of each channel:
    the moments (route tag ``moments``: planes of ``S_moments``, or the rows ``steps``),
    ``var = M2 / count``, the normalize pass (tag ``normalize``; ``act``: the no-op
    activation marker the engine passes)."""
    count, m2 = np.zeros(C, np.int64), np.zeros(C)
    mean[:] = 0.0
    _moments(moments, x, C, S_moments, steps, count, mean, m2)
    for c in range(C):
        var[c] = m2[c] / count[c]
    _normalize(normalize, x, y, C, S, scale, B, mean, var, epsilon, period, act)

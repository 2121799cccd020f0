"""Backward passes in one compiled call: the per-channel (BatchNormalization) and the
instance/group backward, as the engine runs them step by step (the reduction, the
float64 coefficients, the dX pass), composed here from the very same kernels and the
same float64 arithmetic, so the bits are the step-by-step path's.

Why one call: each step's launch from Python (its dispatch, its partial arrays, a
NumPy operation per float64 vector, waking the workers again) cost more than its loop
up to a few hundred thousand elements: a (1, 1280, 8, 8) channels-last GroupNorm
backward took 190 us step by step. The full path and the call plans
(:mod:`normkernels.ops.training_plans`) call these with every route decided (the
reduction and dX loops by :mod:`normkernels.kernels.backward_sums`' rules, serial or
parallel by the engine's policy).

A route is passed as a *tag*, an empty array whose rank names it, so each route
compiles alone: a flag would compile every loop of both routes into each kernel (4.8
s for the per-channel one on an empty cache). The tags: the loop (``PLANES`` 1-D,
``ROWS`` 2-D), the threads (``SERIAL`` 1-D: the one-thread twins, ``PARALLEL`` 2-D: the
parallel kernels, each launching its own parallel region) and the group statistics
(``RECOMPUTED`` 1-D, ``GIVEN`` 2-D).
"""

import numpy as np
from numba import njit
from numba.core.extending import overload

import normkernels.kernels.cache  # noqa: F401  (registers the cache locators before any @njit)
from normkernels.kernels.backward_dx import (
    apply_planes,
    apply_planes_serial,
    apply_rows,
    apply_rows_serial,
    group_coefficients,
)
from normkernels.kernels.backward_sums import (
    PLANE_CHUNK,
    block_rows,
    merge_group_sums,
    merge_plane_sums,
    merge_row_group_sums,
    merge_row_sums,
    plane_moment_sums,
    plane_moment_sums_serial,
    plane_sums,
    plane_sums_serial,
    row_moment_sums,
    row_moment_sums_serial,
    row_sums,
    row_sums_serial,
)
from normkernels.kernels.elements import load
from normkernels.kernels.options import KERNEL_OPTIONS, OVERLOAD_OPTIONS

PLANES = np.empty(0)  # the route tags
ROWS = np.empty((0, 0))
SERIAL = PLANES
PARALLEL = ROWS
RECOMPUTED = PLANES
GIVEN = ROWS


def _pick(par, serial, parallel):
    """The kernel of the threads tag ``par`` (compile time)."""
    return serial if par.ndim == 1 else parallel


def _apply(tag, par, x, dy, dx, C, S, m, a, b, k):
    """The dX pass by the planes loop (``tag`` 1-D), or by rows of ``C * S`` columns
    with per-column tables (2-D), as the engine's ``grad_apply``."""
    raise NotImplementedError("only callable from @njit code")


@overload(_apply, jit_options=OVERLOAD_OPTIONS)
def _apply_impl(tag, par, x, dy, dx, C, S, m, a, b, k):
    if tag.ndim == 1:
        kernel = _pick(par, apply_planes_serial, apply_planes)

        def planes(tag, par, x, dy, dx, C, S, m, a, b, k):
            kernel(x, dy, dx, C, S, m, a, b, k)
        return planes
    kernel = _pick(par, apply_rows_serial, apply_rows)

    def rows(tag, par, x, dy, dx, C, S, m, a, b, k):
        P = C * S
        tm, ta, tb, tk = (np.empty(P, m.dtype), np.empty(P, m.dtype), np.empty(P, m.dtype),
                          np.empty(P, m.dtype))
        for j in range(P):
            c = j // S
            tm[j], ta[j], tb[j], tk[j] = m[c], a[c], b[c], k[c]
        kernel(x, dy, dx, P, block_rows(x.size // P, P), tm, ta, tb, tk)
    return rows


def _channel_sums(tag, par, x, dy, C, S, mean, sum_dy, sum_dyx):
    """Per-channel ``(sum dy, sum dy (x - mean))`` by planes (``tag`` 1-D) or rows
    (2-D), as the engine's ``channel_grad_sums``."""
    raise NotImplementedError("only callable from @njit code")


@overload(_channel_sums, jit_options=OVERLOAD_OPTIONS)
def _channel_sums_impl(tag, par, x, dy, C, S, mean, sum_dy, sum_dyx):
    if tag.ndim == 1:
        kernel = _pick(par, plane_sums_serial, plane_sums)

        def planes(tag, par, x, dy, C, S, mean, sum_dy, sum_dyx):
            parts = x.size // S * ((S + PLANE_CHUNK - 1) // PLANE_CHUNK)
            part1, part2 = np.empty(parts), np.empty(parts)
            kernel(x, dy, C, S, mean, part1, part2)
            merge_plane_sums(part1, part2, C, S, sum_dy, sum_dyx)
        return planes
    kernel = _pick(par, row_sums_serial, row_sums)

    def rows(tag, par, x, dy, C, S, mean, sum_dy, sum_dyx):
        P = C * S
        rows_per_block = block_rows(x.size // P, P)
        blocks = (x.size // P + rows_per_block - 1) // rows_per_block
        part1, part2, table = np.empty((blocks, P)), np.empty((blocks, P)), np.empty(P)
        for j in range(P):
            table[j] = mean[j // S]
        kernel(x, dy, P, rows_per_block, table, part1, part2)
        merge_row_sums(part1, part2, C, S, sum_dy, sum_dyx)
    return rows


def _group_sums(tag, par, x, dy, planes, S, group, count, mean, m2, total1, total2):
    """The instance/group backward's one reduction of a view, by planes of ``S``
    (``tag`` 1-D) or by rows of ``planes`` columns (2-D), as the engine's
    ``group_grad_sums``."""
    raise NotImplementedError("only callable from @njit code")


@overload(_group_sums, jit_options=OVERLOAD_OPTIONS)
def _group_sums_impl(tag, par, x, dy, planes, S, group, count, mean, m2, total1, total2):
    if tag.ndim == 1:
        kernel = _pick(par, plane_moment_sums_serial, plane_moment_sums)

        def by_planes(tag, par, x, dy, planes, S, group, count, mean, m2, total1, total2):
            parts = planes * ((S + PLANE_CHUNK - 1) // PLANE_CHUNK)
            q0, q1, q2, q3 = np.empty(parts), np.empty(parts), np.empty(parts), np.empty(parts)
            kernel(x, dy, S, q0, q1, q2, q3)
            merge_group_sums(q0, q1, q2, q3, S, group, count, mean, m2, total1, total2)
        return by_planes
    kernel = _pick(par, row_moment_sums_serial, row_moment_sums)

    def by_rows(tag, par, x, dy, planes, S, group, count, mean, m2, total1, total2):
        n_rows = x.size // planes
        rows = block_rows(n_rows, planes)
        blocks = (n_rows + rows - 1) // rows
        p0, p1 = np.empty((blocks, planes)), np.empty((blocks, planes))
        p2, p3 = np.empty((blocks, planes)), np.empty((blocks, planes))
        kernel(x, dy, planes, rows, p0, p1, p2, p3)
        merge_row_group_sums(p0, p1, p2, p3, rows, n_rows, group, count, mean, m2, total1,
                             total2)
    return by_rows


def _statistics(stats, sums, par, x, dy, planes, S, group, first, given_mean, given_r,
                epsilon, count, mean, r, total1, total2):
    """A view's group statistics (``count``, ``mean``, ``r``) and per-plane sums: with
    ``stats`` 1-D recomputed in the one reduction (``_group_sums``), with ``stats`` 2-D
    the caller's (groups ``first ...`` of ``given_mean``, ``given_r``) and the sums
    around them (``_channel_sums``, each plane around its group's mean)."""
    raise NotImplementedError("only callable from @njit code")


@overload(_statistics, jit_options=OVERLOAD_OPTIONS)
def _statistics_impl(stats, sums, par, x, dy, planes, S, group, first, given_mean, given_r,
                     epsilon, count, mean, r, total1, total2):
    if stats.ndim == 1:
        def recomputed(stats, sums, par, x, dy, planes, S, group, first, given_mean, given_r,
                       epsilon, count, mean, r, total1, total2):
            m2 = np.empty(mean.size)
            _group_sums(sums, par, x, dy, planes, S, group, count, mean, m2, total1, total2)
            for g in range(mean.size):
                r[g] = 1.0 / np.sqrt(m2[g] / count[g] + epsilon)
        return recomputed

    def given(stats, sums, par, x, dy, planes, S, group, first, given_mean, given_r, epsilon,
              count, mean, r, total1, total2):
        table = np.empty(planes)
        for g in range(mean.size):
            mean[g] = given_mean[first + g]
            r[g] = given_r[first + g]
            count[g] = x.size // mean.size
        for p in range(planes):
            table[p] = mean[p // group]
        _channel_sums(sums, par, x, dy, planes, S, table, total1, total2)
    return given


@njit(**KERNEL_OPTIONS)
def channel_backward(x, dy, dx, C, S, scale, mean, stats, is_var, epsilon, sums, apply, par,
                     residual, like, dscale, dB):
    """BatchNormalization's training backward: per-channel sums around ``mean`` (route
    tag ``sums``), the group backward's coefficients with a channel a group (``r`` from
    ``stats``: the variance with ``epsilon``, or with ``is_var`` False the inverse
    standard deviation), the dX pass (tag ``apply``), on the threads of tag ``par``;
    writes dscale and dB (float64, per channel). ``like``: an empty array of the
    compute dtype."""
    mean64, r, gamma, counts = np.empty(C), np.empty(C), np.empty(C), np.empty(C)
    for c in range(C):
        mean64[c] = np.float64(load(mean, c))
        gamma[c] = np.float64(load(scale, c))
        v = np.float64(load(stats, c))
        r[c] = 1.0 / np.sqrt(v + epsilon) if is_var else v
        counts[c] = x.size // C
    sum_dyx = np.empty(C)
    _channel_sums(sums, par, x, dy, C, S, mean64, dB, sum_dyx)  # dB: the sums of dY
    m, a, b, k = (np.empty(C, like.dtype), np.empty(C, like.dtype), np.empty(C, like.dtype),
                  np.empty(C, like.dtype))
    group_coefficients(gamma, mean64, r, dB, sum_dyx, 1, counts, residual, m, a, b, k, dscale)
    _apply(apply, par, x, dy, dx, C, S, m, a, b, k)


@njit(**KERNEL_OPTIONS)
def group_backward(x, dy, dx, views, planes, S, group, C, scale, epsilon, given_mean, given_r,
                   stats, sums, apply, par, residual, like, dscale, dB):
    """The instance/group backward over ``views`` equal views (the whole tensor of
    channels-first memory, or each channels-last sample) of ``planes`` planes of ``S``
    (route tag ``sums`` 2-D: a sample's rows of ``planes`` columns, ``S`` 1), ``group``
    planes a group: per view its statistics and sums (``_statistics``: tag ``stats``),
    the coefficients, dscale and dB added up (the views' rows of ``C`` in order, as the
    step-by-step path's cumulative sums), the dX pass (tag ``apply``); on the threads
    of tag ``par``. ``given_mean``, ``given_r``: float64 per (view, group), read with
    ``stats`` 2-D only."""
    size = x.size // views
    groups = planes // group
    gamma = np.empty(planes)
    for p in range(planes):
        gamma[p] = np.float64(load(scale, p % C))
    dscale[:] = 0.0
    dB[:] = 0.0
    for v in range(views):
        lo = v * size
        xv, dyv, dxv = x[lo:lo + size], dy[lo:lo + size], dx[lo:lo + size]
        count, mean, r = np.empty(groups), np.empty(groups), np.empty(groups)
        total1, total2 = np.empty(planes), np.empty(planes)
        _statistics(stats, sums, par, xv, dyv, planes, S, group, v * groups, given_mean,
                    given_r, epsilon, count, mean, r, total1, total2)
        m, a, b, k = (np.empty(planes, like.dtype), np.empty(planes, like.dtype),
                      np.empty(planes, like.dtype), np.empty(planes, like.dtype))
        terms = np.empty(planes)
        group_coefficients(gamma, mean, r, total1, total2, group, count, residual, m, a, b, k,
                           terms)
        for c in range(C):
            t, u = terms[c], total1[c]
            for p in range(c + C, planes, C):
                t += terms[p]
                u += total1[p]
            dscale[c] += t
            dB[c] += u
        _apply(apply, par, xv, dyv, dxv, planes, S, m, a, b, k)

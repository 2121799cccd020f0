"""Backward passes, part two: the kernels that write dX. The per-channel
normalizations' dX pass (after the reduction of :mod:`normkernels.kernels.backward_sums`,
which fixes the shape of loop), and the row normalizations' backward (LayerNorm,
RMSNorm), which reduces and writes each row in one go.

Layout contract as elsewhere: element ``i`` of the flat arrays belongs to channel
``(i // S) % C``. Two shapes of loop, chosen by ``S`` as the reduction chose them
(``backward_sums.GRAD_MIN_PLANE``):

* **planes** (NCX): blocks of ``APPLY_BLOCK`` elements with one channel's coefficients
  per plane segment.
* **rows** (small ``S``: NXC, short planes): X is rows of ``P = C * S`` columns, with
  per-column tables of the coefficients.

The dX pass computes ``dY * A + (x - m) * B + K`` in the compute dtype (float32;
float64 for float64 X) and rounds once to X's dtype; it may write over dY. Where dX
is larger than the caches the ``*_streaming`` kernels write it with streaming stores
(its lines are not read before they are written).

The row normalizations have statistics per row and parameters per column: work items
of whole rows, each row's statistics recomputed in float64 while the row is in cache
(unless the caller gives them), the parameter gradients added into per-item column
partials that are merged in item order (the same bits for any thread count).
"""

import numpy as np
from numba import njit, prange
from numba.core.extending import overload

import normkernels.kernels.cache  # noqa: F401  (registers the cache locators before any @njit)
from normkernels.kernels.cache import serial_twin
from normkernels.kernels.elements import load, store
from normkernels.kernels.lanes import (
    deviations,
    lane_count,
    lane_sum,
    load_lanes,
    scaled,
    shifted,
    shifted_sums,
    store_lanes,
    zeros,
)
from normkernels.kernels.lp import store_rounded
from normkernels.kernels.options import (
    HELPER_OPTIONS,
    INLINE_OPTIONS,
    KERNEL_OPTIONS,
    OVERLOAD_OPTIONS,
    VECTOR_BYTES,
)
from normkernels.kernels.scale_shift import elements_to_alignment
from normkernels.kernels.vectors import store_fence, stream_grad, stream_grad_tables

APPLY_BLOCK = 1 << 16  # elements per work item of the planes dX pass
ROW_ITEMS = 64  # row backward: work items at most (their partials merge in order)
ROW_ITEM_ELEMENTS = 1 << 14  # row backward: elements per work item at least (about)


# --- the dX pass ---

@njit(**HELPER_OPTIONS)
def apply_run(x, dy, dx, m, a, b, k):
    """``dx = dy * a + (x - m) * b + k`` over three slices of one channel."""
    for i in range(x.size):
        store(dx, i, load(dy, i) * a + (load(x, i) - m) * b + k)


@njit(**HELPER_OPTIONS)
def _apply_segment(x, dy, dx, lo, hi, m, a, b, k):
    """:func:`apply_run` of elements ``lo..hi-1`` (ordinary stores)."""
    apply_run(x[lo:hi], dy[lo:hi], dx[lo:hi], m, a, b, k)


@njit(**INLINE_OPTIONS)
def _planes_block(x, dy, dx, blk, C, S, m, a, b, k, run):
    """Block ``blk`` of ``APPLY_BLOCK`` elements: ``run`` (:func:`_apply_segment` or
    :func:`_stream_run`, fixed when the kernel compiles) per plane segment, with that
    plane's channel's coefficients."""
    lo = blk * APPLY_BLOCK
    hi = min(x.size, lo + APPLY_BLOCK)
    while lo < hi:
        p = lo // S
        end = min(hi, (p + 1) * S)
        c = p % C
        run(x, dy, dx, lo, end, m[c], a[c], b[c], k[c])
        lo = end


@njit(parallel=True, **KERNEL_OPTIONS)
def apply_planes(x, dy, dx, C, S, m, a, b, k):
    """dX of every element, blocks of ``APPLY_BLOCK`` elements in parallel, one
    channel's coefficients per plane segment."""
    for blk in prange((x.size + APPLY_BLOCK - 1) // APPLY_BLOCK):
        _planes_block(x, dy, dx, blk, C, S, m, a, b, k, _apply_segment)


@njit(**HELPER_OPTIONS)
def apply_row(x, dy, dx, m, a, b, k):
    """One row against per-column tables (vectorised across the columns)."""
    for j in range(x.size):
        store(dx, j, load(dy, j) * a[j] + (load(x, j) - m[j]) * b[j] + k[j])


@njit(parallel=True, **KERNEL_OPTIONS)
def apply_rows(x, dy, dx, P, rows_per_block, m, a, b, k):
    """dX of rows of ``P`` columns with per-column coefficient tables, blocks of rows
    in parallel."""
    n_rows = x.size // P
    for blk in prange((n_rows + rows_per_block - 1) // rows_per_block):
        first = blk * rows_per_block
        for r in range(first, min(n_rows, first + rows_per_block)):
            lo = r * P
            apply_row(x[lo:lo + P], dy[lo:lo + P], dx[lo:lo + P], m, a, b, k)


@njit(**HELPER_OPTIONS)
def _stream_run(x, dy, dx, lo, hi, m, a, b, k):
    """:func:`apply_run` of ``lo..hi-1`` with streaming stores: a scalar head up to
    dx's 64-byte alignment, streaming vectors, a scalar tail."""
    width = VECTOR_BYTES // dx.itemsize
    head = min(hi - lo, elements_to_alignment(dx[lo:hi]))
    body_end = lo + head + (hi - lo - head) // width * width
    apply_run(x[lo:lo + head], dy[lo:lo + head], dx[lo:lo + head], m, a, b, k)
    for i in range(lo + head, body_end, width):
        stream_grad(x, dy, dx, i, m, a, b, k)
    apply_run(x[body_end:hi], dy[body_end:hi], dx[body_end:hi], m, a, b, k)


@njit(parallel=True, **KERNEL_OPTIONS)
def apply_planes_streaming(x, dy, dx, C, S, m, a, b, k):
    """:func:`apply_planes` with streaming stores (dX larger than the caches: its
    lines are not read before they are written)."""
    for blk in prange((x.size + APPLY_BLOCK - 1) // APPLY_BLOCK):
        _planes_block(x, dy, dx, blk, C, S, m, a, b, k, _stream_run)
        store_fence()


@njit(**HELPER_OPTIONS)
def _apply_flat(x, dy, dx, lo, hi, P, m, a, b, k):
    """Elements ``lo..hi-1`` against per-column tables of period ``P``, scalar."""
    for i in range(lo, hi):
        j = i % P
        store(dx, i, load(dy, i) * a[j] + (load(x, i) - m[j]) * b[j] + k[j])


@njit(parallel=True, **KERNEL_OPTIONS)
def apply_rows_streaming(x, dy, dx, P, rows_per_block, m, a, b, k):
    """:func:`apply_rows` with streaming stores; the tables hold ``P + L`` entries
    (wrapped), so a vector at any phase reads inside them."""
    n_rows = x.size // P
    width = VECTOR_BYTES // dx.itemsize
    for blk in prange((n_rows + rows_per_block - 1) // rows_per_block):
        lo = blk * rows_per_block * P
        hi = min(n_rows, (blk + 1) * rows_per_block) * P
        head = min(hi - lo, elements_to_alignment(dx[lo:hi]))
        body_end = lo + head + (hi - lo - head) // width * width
        _apply_flat(x, dy, dx, lo, lo + head, P, m, a, b, k)
        phase = (lo + head) % P
        for i in range(lo + head, body_end, width):
            stream_grad_tables(x, dy, dx, i, m, a, b, k, phase)
            phase += width
            while phase >= P:
                phase -= P
        _apply_flat(x, dy, dx, body_end, hi, P, m, a, b, k)
        store_fence()


# one-thread twins (see normkernels.kernels.cache.serial_twin)
apply_planes_serial = serial_twin(apply_planes, **KERNEL_OPTIONS)
apply_rows_serial = serial_twin(apply_rows, **KERNEL_OPTIONS)


# --- row normalizations (LayerNorm, RMSNorm): statistics per row, parameters per column ---

@njit(**HELPER_OPTIONS)
def _row_sum(x):
    """``sum(x)`` in float64."""
    return shifted_sums(x, 0.0)[0]


@njit(**INLINE_OPTIONS)
def _row_moments(x, dy, gamma, mean, squares):
    """``(sum d^2, sum g, sum g d)`` with ``d = x - mean``, ``g = dy * gamma``, float64,
    in lanes (:mod:`normkernels.kernels.lanes`), then the tail in order; ``sum d^2``
    only when ``squares`` (else 0: given statistics do not need it, and it was a third
    of the loop)."""
    n = x.size
    count = lane_count(mean)
    a1 = zeros(mean)
    a2 = zeros(mean)
    a3 = zeros(mean)
    j = 0
    if squares:
        while j + count <= n:
            d = deviations(x, j, mean)
            g = load_lanes(dy, j, mean) * load_lanes(gamma, j, mean)
            a1 = a1 + d * d
            a2 = a2 + g
            a3 = a3 + g * d
            j += count
    else:
        while j + count <= n:
            d = deviations(x, j, mean)
            g = load_lanes(dy, j, mean) * load_lanes(gamma, j, mean)
            a2 = a2 + g
            a3 = a3 + g * d
            j += count
    q = lane_sum(a1)
    sg = lane_sum(a2)
    sgx = lane_sum(a3)
    for k in range(j, n):
        d = np.float64(load(x, k)) - mean
        g = np.float64(load(dy, k)) * gamma[k]
        if squares:
            q += d * d
        sg += g
        sgx += g * d
    return q, sg, sgx


def _dx_vectors(x, dy, dx, gamma, mean, r, mg, mgx, dgamma, dbeta):
    """The vector part of :func:`_row_backward`'s last loop; returns where the scalar
    tail starts. ``@njit`` only: chosen by ``dx``'s dtype when a kernel compiles."""
    raise NotImplementedError("_dx_vectors is only callable from @njit code")


@overload(_dx_vectors, inline="always", jit_options=OVERLOAD_OPTIONS)
def _dx_vectors_impl(x, dy, dx, gamma, mean, r, mg, mgx, dgamma, dbeta):
    if dx.dtype.bitwidth == 16:  # rounded to odd, then to 16 bits: the scalar loop
        return lambda x, dy, dx, gamma, mean, r, mg, mgx, dgamma, dbeta: 0

    def impl(x, dy, dx, gamma, mean, r, mg, mgx, dgamma, dbeta):
        # In lanes, as the scalar loop: a plain loop over five arrays of two dtypes was
        # not vectorised well (LLVM cannot rule out aliasing): 0.29 ns an element.
        count = lane_count(mean)
        j = 0
        while j + count <= x.size:
            xh = scaled(deviations(x, j, mean), r)
            dyv = load_lanes(dy, j, mean)
            store_lanes(dgamma, j, load_lanes(dgamma, j, mean) + dyv * xh)
            store_lanes(dbeta, j, load_lanes(dbeta, j, mean) + dyv)
            g = dyv * load_lanes(gamma, j, mean)
            store_lanes(dx, j, scaled(shifted(g, mg) - scaled(xh, mgx), r))
            j += count
        return j

    return impl


@njit(**HELPER_OPTIONS)
def _row_backward(x, dy, dx, gamma, centered, epsilon, given, mean, r, dgamma, dbeta):
    """One row (``x``, ``dy``, ``dx`` slices of K; ``gamma`` float64 per column): its
    statistics recomputed (float64, two passes: the row is in cache) unless ``given``
    (then ``mean`` and ``r``, the caller's), then ``dX = r (g - <g> - x_hat <g x_hat>)``
    with ``g = dY * gamma`` (RMS: no centring, no ``<g>``), and ``dY * x_hat``, ``dY``
    added into the column partials ``dgamma``, ``dbeta``."""
    K = x.size
    if not given:
        mean = _row_sum(x) / K if centered else 0.0
    elif not centered:
        mean = 0.0
    q, sg, sgx = _row_moments(x, dy, gamma, mean, not given)
    if not given:
        r = 1.0 / np.sqrt(q / K + epsilon)
    mg = sg / K if centered else 0.0
    mgx = sgx * r / K  # <g x_hat>
    for j in range(_dx_vectors(x, dy, dx, gamma, mean, r, mg, mgx, dgamma, dbeta), K):
        xh = (np.float64(load(x, j)) - mean) * r
        dyj = np.float64(load(dy, j))
        dgamma[j] += dyj * xh
        dbeta[j] += dyj
        store_rounded(dx, j, r * ((dyj * gamma[j] - mg) - xh * mgx))


@njit(parallel=True, **KERNEL_OPTIONS)
def rows_backward(x, dy, dx, K, gamma, centered, epsilon, stats, rows_per_item, part_dgamma,
                  part_dbeta):
    """Every row of ``K`` (``x.size // K`` rows), items of ``rows_per_item`` rows in
    parallel; item ``t`` adds its rows' parameter gradients into ``part_*[t]`` (merged
    afterwards in item order: the same bits for any thread count). ``stats``: per row
    (mean, r) in float64, the caller's statistics, or no rows (recompute them)."""
    M = x.size // K
    given = stats.shape[0] > 0
    for t in prange(part_dgamma.shape[0]):
        pg, pb = part_dgamma[t], part_dbeta[t]
        for j in range(K):
            pg[j] = 0.0
            pb[j] = 0.0
        for row in range(t * rows_per_item, min(M, (t + 1) * rows_per_item)):
            lo = row * K
            mean, r = (stats[row, 0], stats[row, 1]) if given else (0.0, 0.0)
            _row_backward(x[lo:lo + K], dy[lo:lo + K], dx[lo:lo + K], gamma, centered,
                          epsilon, given, mean, r, pg, pb)


def row_items(M, K):
    """``(items, rows_per_item)`` of :func:`rows_backward` over ``M`` rows of ``K``, by
    the shape alone (the same bits for any thread count): few for a small call, whose
    column partials would otherwise outweigh its rows."""
    items = max(1, min(M, ROW_ITEMS, M * K // ROW_ITEM_ELEMENTS))
    rows_per_item = -(-M // items)
    return -(-M // rows_per_item), rows_per_item


@njit(parallel=True, **KERNEL_OPTIONS)
def modulated_rows_backward(x, dy, dx, K, T, gamma, epsilon, rows_per_item, part_dgamma,
                            part_dbeta):
    """:func:`rows_backward` (centred, statistics recomputed) of AdaLN's samples of
    ``T`` rows, sample ``n`` with its ``K`` values of the ``N * K`` float64 ``gamma``, in
    one launch: items of ``rows_per_item`` rows of one sample, as :func:`row_items` of
    the sample alone makes them, so a sample's partials (merged afterwards in item
    order) are the bits :func:`rows_backward` gives it alone."""
    per_sample = (T + rows_per_item - 1) // rows_per_item
    for t in prange(part_dgamma.shape[0]):
        n = t // per_sample
        first = n * T + (t % per_sample) * rows_per_item
        pg, pb = part_dgamma[t], part_dbeta[t]
        for j in range(K):
            pg[j] = 0.0
            pb[j] = 0.0
        g = gamma[n * K:(n + 1) * K]
        for row in range(first, min((n + 1) * T, first + rows_per_item)):
            lo = row * K
            _row_backward(x[lo:lo + K], dy[lo:lo + K], dx[lo:lo + K], g, True, epsilon, False,
                          0.0, 0.0, pg, pb)


@njit(**KERNEL_OPTIONS)
def group_coefficients(gamma, gmean, r, sum_dy, sum_dyx, Cg, M, residual, m, a, b, k, terms):
    """The group backward's coefficients of ``dX = dY * A + (x - m) * B + K`` per plane
    ``p`` of group ``g = p // Cg`` (``Cg`` consecutive planes a group, ``M[g]`` elements),
    from the float64 per-plane sums: ``A = gamma r``, ``B = -r^3 sum_g(gamma sum_dyx) /
    M``, ``K = -r sum_g(gamma sum_dy) / M``, ``m`` the group's mean, each rounded to
    the compute dtype of ``m, a, b, k`` (``residual``: float32 arithmetic, the mean's
    residual ``B (m - mean)`` folded into K first), and ``terms = r sum_dyx`` (float64,
    the scale gradient's). The arithmetic of
    :meth:`normkernels.engine.Engine.group_coefficients`, its twin: the group sums in
    plane order, one rounding per operation (one compiled call, not a dozen NumPy
    steps: 30 us of a small backward)."""
    for g in range(gmean.size):
        p0 = g * Cg
        g1 = gamma[p0] * sum_dy[p0]
        g2 = gamma[p0] * sum_dyx[p0]
        for p in range(p0 + 1, p0 + Cg):
            g1 += gamma[p] * sum_dy[p]
            g2 += gamma[p] * sum_dyx[p]
        rg = r[g]
        bg = -rg * rg * rg * g2 / M[g]
        kg = -rg * g1 / M[g]
        mean = gmean[g]
        for p in range(p0, p0 + Cg):
            m[p] = mean
            if residual:
                rounded = np.float64(m[p])
                kp = kg + (bg * (rounded - mean) if np.isfinite(rounded) else 0.0)
            else:
                kp = kg
            a[p] = gamma[p] * rg
            b[p] = bg
            k[p] = kp
            terms[p] = rg * sum_dyx[p]


rows_backward_serial = serial_twin(rows_backward, **KERNEL_OPTIONS)
modulated_rows_backward_serial = serial_twin(modulated_rows_backward, **KERNEL_OPTIONS)

"""The per-channel backward passes through an activation and residual epilogue, fused:
``dZ = dY * act'(Z)`` (or ReLU's mask) is made inside the backward's reduction and dX
pass, never written to memory unless the caller keeps it (``out``: dR, or dX to be
overwritten by the plain dX pass; ``ops/epilogue_backward.kept``).

Layouts as the plain passes (:mod:`normkernels.kernels.backward_sums`,
:mod:`normkernels.kernels.backward_dx`), and their bits: the sums are the same sums
in the same order, dX the same expression, so the base engine's composition (dZ
written, then the plain kernels) is their twin bit for bit.

* **planes** (channels-first): dZ in the lanes of the loops (:func:`dz_lanes` in the
  reduction, :func:`grad_lanes` in the dX pass): one pass over X, dY (and Y or R)
  with the arithmetic in between its loads. A buffer of dZ handed to the plain loops
  ran the memory-bound and the compute-bound halves one after the other (2.5-3x the
  plain backward; ``docs/design.md``).
* **rows** (channels-last, per-column tables): four rows' dZ at a time into a buffer
  in L1, reduced in the plain kernel's order; the dX pass a row's at a time.

:func:`dz_store` is the element rule (the heads, tails and rows): ReLU's mask is ``Y >
0`` (the forward's output) or ``Z > 0``, dY selected or +0 in X's dtype; a smooth
activation's ``dY * act'(Z)`` is in the compute dtype (float32 for 16-bit X).
``Z = (x - m) * a + b (+ res)`` per channel, as the forward's scale-shift loops compute
it (:mod:`normkernels.kernels.scale_shift`). The lanes do the same operations lane by
lane: the same bits.
"""

import numpy as np
from llvmlite import ir
from numba import njit, prange, types
from numba.core.extending import intrinsic, overload

import normkernels.kernels.cache  # noqa: F401  (registers the cache locators before any @njit)
from normkernels.kernels.activation_grad import build_derivative, derivative
from normkernels.kernels.activations import ActivationType, residual_slice, with_residual
from normkernels.kernels.backward_dx import APPLY_BLOCK, apply_row, apply_run
from normkernels.kernels.backward_sums import put_partials, row_item
from normkernels.kernels.cache import serial_twin
from normkernels.kernels.elements import load, store
from normkernels.kernels.lanes import (
    Lanes,
    deviations,
    lane_count,
    lane_sum,
    load_storage,
    widened,
    zeros,
)
from normkernels.kernels.options import (
    INLINE_OPTIONS,
    KERNEL_OPTIONS,
    OVERLOAD_OPTIONS,
    VECTOR_BYTES,
)
from normkernels.kernels.scale_shift import elements_to_alignment
from normkernels.kernels.statistics import COLUMN_TILE, PLANE_CHUNK, ROW_UNROLL, deviation
from normkernels.kernels.vectors import broadcast, storage_codec, store_fence, store_vector


def dz_store(act, mask, res, x, dy, dz, i, m, a, b):
    """``dz[i]``, the gradient at the activation's input of element ``i``; ``@njit``
    only."""
    raise NotImplementedError("dz_store is only callable from @njit code")


@overload(dz_store, inline="always", jit_options=OVERLOAD_OPTIONS)
def _dz_store(act, mask, res, x, dy, dz, i, m, a, b):
    # load/store and selects, not ``dz[i] = dy[i]`` under a branch: that loop was not
    # vectorised (0.34 ns an element for a copy). X's dtype through its compute dtype
    # and back is exact.
    if not isinstance(mask, types.NoneType):  # ReLU's mask from the forward's Y
        def from_mask(act, mask, res, x, dy, dz, i, m, a, b):
            store(dz, i, kept(load(mask, i), load(dy, i)))
        return from_mask
    if act.kind == "none":  # a residual alone: dZ is dY
        def copied(act, mask, res, x, dy, dz, i, m, a, b):
            store(dz, i, load(dy, i))
        return copied
    if act.kind == "relu":
        def relu(act, mask, res, x, dy, dz, i, m, a, b):
            store(dz, i, kept(with_residual(res, i, (load(x, i) - m) * a + b), load(dy, i)))
        return relu

    def smooth(act, mask, res, x, dy, dz, i, m, a, b):
        store(dz, i, load(dy, i) * derivative(act, with_residual(res, i,
                                                                (load(x, i) - m) * a + b)))
    return smooth


@intrinsic
def kept(typingctx, z, g):
    """``g`` where ``z > 0``, else +0 (``z`` NaN: +0), in ``g``'s float type: a select,
    never a product (an infinite ``g`` under a 0 of the mask gives 0). An intrinsic: a
    branch in an inlined overload left Numba's SSA pass a variable out of scope."""
    if not (isinstance(z, types.Float) and isinstance(g, types.Float)):
        return None

    def codegen(context, builder, sig, args):
        zero = ir.Constant(args[0].type, 0.0)
        positive = builder.fcmp_ordered(">", args[0], zero)
        return builder.select(positive, args[1], ir.Constant(args[1].type, 0.0))

    return g(z, g), codegen


def _dz_ir(builder, loaded, scalar, kind, has_mask, has_res, count):
    """IR of dZ of ``count`` elements in the compute dtype, lane by lane as
    :func:`dz_store` computes one: ``loaded(name)`` gives the vector of ``"x"``,
    ``"dy"``, ``"mask"`` or ``"res"`` there, ``scalar(name)`` Z's ``"m"``, ``"a"``,
    ``"b"`` broadcast."""
    g = loaded("dy")
    zero = ir.Constant(g.type, [ir.Constant(g.type.element, 0.0)] * count)
    if has_mask:  # ReLU's mask from Y
        return builder.select(builder.fcmp_ordered(">", loaded("mask"), zero), g, zero)
    if kind == "none":
        return g
    z = builder.fmul(builder.fsub(loaded("x"), scalar("m")), scalar("a"))
    z = builder.fadd(z, scalar("b"))
    if has_res:
        z = builder.fadd(z, loaded("res"))
    if kind == "relu":
        return builder.select(builder.fcmp_ordered(">", z, zero), g, zero)
    return builder.fmul(g, build_derivative(builder, kind, z))


def _epilogue_typed(act, mask, res, x, dy, index):
    return (isinstance(act, ActivationType) and isinstance(index, types.Integer)
            and all(isinstance(v, types.NoneType) or (isinstance(v, types.Array) and v.ndim == 1)
                    for v in (mask, res)) and isinstance(x, types.Array)
            and isinstance(dy, types.Array))


def _ir_loaders(context, builder, sig, args, positions, index, count):
    """``loaded``, ``scalar`` for :func:`_dz_ir`: ``positions`` maps names to argument
    positions."""
    def loaded(name):
        k = positions[name]
        return load_storage(context, builder, sig.args[k], args[k], index, count)

    def scalar(name):
        return broadcast(builder, args[positions[name]], count)

    return loaded, scalar


@intrinsic
def dz_lanes(typingctx, act, mask, res, x, dy, index, m, a, b, like, out):
    """dZ of elements ``index..index + count - 1`` as float64 :class:`Lanes` (``like``
    float64): each lane computed as :func:`dz_store` computes it, in the compute dtype
    (the same operations lane by lane, so the same bits), then widened exactly; also
    stored into ``out`` (None: not) in its dtype, where dZ is exact (X's). dZ never
    goes through memory: the reduction overlaps its loads with its arithmetic."""
    if like != types.float64 or not _epilogue_typed(act, mask, res, x, dy, index):
        return None
    if not (isinstance(out, types.NoneType) or (isinstance(out, types.Array)
                                                and storage_codec(out.dtype) is not None)):
        return None
    lanes = Lanes(types.float64)
    positions = dict(mask=1, res=2, x=3, dy=4, m=6, a=7, b=8)

    def codegen(context, builder, sig, args):
        i = context.cast(builder, args[5], sig.args[5], types.intp)
        loaded, scalar = _ir_loaders(context, builder, sig, args, positions, i, lanes.count)
        dz = _dz_ir(builder, loaded, scalar, act.kind, not isinstance(mask, types.NoneType),
                    not isinstance(res, types.NoneType), lanes.count)
        if not isinstance(out, types.NoneType):
            narrow = storage_codec(out.dtype)[3]
            kept = dz if narrow is None else narrow(builder, dz, lanes.count)
            store_vector(context, builder, out, args[10], i, kept, False)
        if dz.type.element != ir.DoubleType():
            dz = builder.fpext(dz, ir.VectorType(ir.DoubleType(), lanes.count))
        return dz

    return lanes(act, mask, res, x, dy, index, m, a, b, like, out), codegen


def _grad_lanes_typer(streaming):
    def typer(typingctx, act, mask, res, x, dy, dx, dres, index, zm, za, zb, m, a, b, k):
        """One 64-byte vector of dX (and of dR, ``dres`` an array): dZ as
        :func:`dz_lanes` makes it, then ``dZ * a + (x - m) * b + k`` in the compute dtype
        (the order of :func:`normkernels.kernels.backward_dx.apply_run`), rounded once;
        ``streaming``: non-temporal stores at a 64-byte aligned ``dx[index]``."""
        if not (_epilogue_typed(act, mask, res, x, dy, index) and isinstance(dx, types.Array)
                and x.dtype == dx.dtype and storage_codec(dx.dtype) is not None):
            return None
        compute = types.float64 if dx.dtype == types.float64 else types.float32
        if any(t != compute for t in (zm, za, zb, m, a, b, k)):
            return None
        positions = dict(mask=1, res=2, x=3, dy=4, m=8, a=9, b=10)

        def codegen(context, builder, sig, args):
            i = context.cast(builder, args[7], sig.args[7], types.intp)
            count, _, _, narrow = storage_codec(dx.dtype)
            loaded, scalar = _ir_loaders(context, builder, sig, args, positions, i, count)
            dz = _dz_ir(builder, loaded, scalar, act.kind, not isinstance(mask, types.NoneType),
                        not isinstance(res, types.NoneType), count)
            cm, ca, cb, ck = (broadcast(builder, args[j], count) for j in (11, 12, 13, 14))
            y = builder.fadd(builder.fadd(builder.fmul(dz, ca),
                                          builder.fmul(builder.fsub(loaded("x"), cm), cb)), ck)
            if narrow is not None:
                y = narrow(builder, y, count)
                dz = narrow(builder, dz, count)
            store_vector(context, builder, dx, args[5], i, y, streaming)
            if not isinstance(dres, types.NoneType):
                store_vector(context, builder, dres, args[6], i, dz, False)
            return context.get_dummy_value()

        return types.void(act, mask, res, x, dy, dx, dres, index, zm, za, zb, m, a, b, k), codegen

    return intrinsic(typer)


grad_lanes = _grad_lanes_typer(False)
stream_grad_lanes = _grad_lanes_typer(True)


@njit(**INLINE_OPTIONS)
def _dz_span(x, dy, mask, res, dz, lo, hi, at, m, a, b, act):
    """``dz[at:at + hi - lo]`` from elements ``lo..hi-1`` of one channel."""
    xs, gs = x[lo:hi], dy[lo:hi]
    ms, rs = residual_slice(mask, lo, hi), residual_slice(res, lo, hi)
    out = dz[at:at + hi - lo]
    for i in range(hi - lo):
        dz_store(act, ms, rs, xs, gs, out, i, m, a, b)


# --- planes (channels-first memory): chunks of one plane ---


TAIL = 16  # a lane count of float64: the reduction's tail


@njit(**INLINE_OPTIONS)
def _span_sums_of_dz(x, dy, mask, res, lo, hi, m, a, b, act, mu, like, out):
    """``(sum dz, sum dz * (x - mu))`` over elements ``lo..hi-1`` of one channel, in the
    order of :func:`normkernels.kernels.lanes.paired_sums` (lanes over the whole span,
    then the tail): dZ made in the lanes (:func:`dz_lanes`), the tail's through a
    buffer of ``like``'s dtype; dZ also written to ``out`` (None: not)."""
    xs, gs = x[lo:hi], dy[lo:hi]
    ms, rs = residual_slice(mask, lo, hi), residual_slice(res, lo, hi)
    os = residual_slice(out, lo, hi)
    n = hi - lo
    count = lane_count(mu)
    body = n // count * count
    a3 = zeros(mu)
    a4 = zeros(mu)
    for i in range(0, body, count):
        g = dz_lanes(act, ms, rs, xs, gs, i, m, a, b, mu, os)
        a3 = a3 + g
        a4 = a4 + g * deviations(xs, i, mu)
    s3 = lane_sum(a3)
    s4 = lane_sum(a4)
    if body < n:
        dz = np.empty(n - body, like.dtype)
        _dz_span(x, dy, mask, res, dz, lo + body, hi, 0, m, a, b, act)
        copy_into(residual_slice(out, lo + body, hi), dz)
        for k in range(n - body):
            g = widened(dz, k, mu)
            s3 += g
            s4 += g * (widened(xs, body + k, mu) - mu)
    return s3, s4


@njit(parallel=True, **KERNEL_OPTIONS)
def plane_sums(x, dy, C, S, mean, part1, part2, act, mask, res, zm, za, zb, like, out):
    """:func:`normkernels.kernels.backward_sums.plane_sums` of dZ (its bits: the same
    sums in the same order). ``zm, za, zb``: Z's coefficients per channel; ``like``:
    an empty array of dZ's dtype; ``out``: where dZ is written too (None: nowhere)."""
    chunks = (S + PLANE_CHUNK - 1) // PLANE_CHUNK
    for item in prange(part1.size):
        p = item // chunks
        c = p % C
        lo = p * S + (item % chunks) * PLANE_CHUNK
        hi = min((p + 1) * S, lo + PLANE_CHUNK)
        part1[item], part2[item] = _span_sums_of_dz(x, dy, mask, res, lo, hi, zm[c], za[c],
                                                    zb[c], act, mean[c], like, out)


def copy_into(out, dz):
    """``out[i] = dz[i]`` rounded to out's dtype over ``out``'s length (nothing when
    ``out`` is None); ``@njit`` only."""
    raise NotImplementedError("copy_into is only callable from @njit code")


@overload(copy_into, inline="always", jit_options=OVERLOAD_OPTIONS)
def _copy_into(out, dz):
    if isinstance(out, types.NoneType):
        return lambda out, dz: None

    def impl(out, dz):
        for i in range(out.size):
            store(out, i, load(dz, i))
    return impl


@njit(**INLINE_OPTIONS)
def _scalar_part(x, dy, dx, dres, lo, hi, m, a, b, k, act, mask, res, zm, za, zb, dz):
    """Elements ``lo..hi-1`` of one channel one by one: dZ into ``dz``, then dR and dX
    from it (the heads and tails of the vector loop)."""
    for s in range(lo, hi, dz.size):
        e = min(hi, s + dz.size)
        _dz_span(x, dy, mask, res, dz, s, e, 0, zm, za, zb, act)
        copy_into(residual_slice(dres, s, e), dz)
        apply_run(x[s:e], dz, dx[s:e], m, a, b, k)


@njit(**INLINE_OPTIONS)
def _segment(x, dy, dx, dres, lo, hi, m, a, b, k, act, mask, res, zm, za, zb, dz, streaming):
    """dX (and dR) of elements ``lo..hi-1`` of one channel: 64-byte vectors
    (:func:`grad_lanes`; streaming: from dX's first 64-byte boundary), scalar ends."""
    width = VECTOR_BYTES // dx.itemsize
    head = min(hi - lo, elements_to_alignment(dx[lo:hi])) if streaming else 0
    body_end = lo + head + (hi - lo - head) // width * width
    _scalar_part(x, dy, dx, dres, lo, lo + head, m, a, b, k, act, mask, res, zm, za, zb, dz)
    for i in range(lo + head, body_end, width):
        if streaming:
            stream_grad_lanes(act, mask, res, x, dy, dx, dres, i, zm, za, zb, m, a, b, k)
        else:
            grad_lanes(act, mask, res, x, dy, dx, dres, i, zm, za, zb, m, a, b, k)
    _scalar_part(x, dy, dx, dres, body_end, hi, m, a, b, k, act, mask, res, zm, za, zb, dz)


@njit(**INLINE_OPTIONS)
def _planes_block(x, dy, dx, dres, blk, C, S, m, a, b, k, act, mask, res, zm, za, zb, like,
                  streaming):
    """Block ``blk`` of ``APPLY_BLOCK`` elements, plane segment by plane segment."""
    lo = blk * APPLY_BLOCK
    hi = min(x.size, lo + APPLY_BLOCK)
    dz = np.empty(TAIL * 2, like.dtype)
    pos = lo
    while pos < hi:
        end = min(hi, (pos // S + 1) * S)
        c = (pos // S) % C
        _segment(x, dy, dx, dres, pos, end, m[c], a[c], b[c], k[c], act, mask, res, zm[c],
                 za[c], zb[c], dz, streaming)
        pos = end


@njit(parallel=True, **KERNEL_OPTIONS)
def apply_planes(x, dy, dx, dres, C, S, m, a, b, k, act, mask, res, zm, za, zb, like):
    """:func:`normkernels.kernels.backward_dx.apply_planes` of dZ, and ``dres = dZ``
    (``dres`` None: no residual)."""
    for blk in prange((x.size + APPLY_BLOCK - 1) // APPLY_BLOCK):
        _planes_block(x, dy, dx, dres, blk, C, S, m, a, b, k, act, mask, res, zm, za, zb,
                      like, False)


@njit(parallel=True, **KERNEL_OPTIONS)
def apply_planes_streaming(x, dy, dx, dres, C, S, m, a, b, k, act, mask, res, zm, za, zb,
                           like):
    """:func:`apply_planes` with streaming stores of dX."""
    for blk in prange((x.size + APPLY_BLOCK - 1) // APPLY_BLOCK):
        _planes_block(x, dy, dx, dres, blk, C, S, m, a, b, k, act, mask, res, zm, za, zb,
                      like, True)
        store_fence()


# --- rows (channels-last memory, short planes): rows of P columns, per-column tables ---

@njit(**INLINE_OPTIONS)
def _dz_rows(x, dy, mask, res, dz, first, last, j0, j1, P, zm, za, zb, act, out):
    """dZ of rows ``first..last-1``, columns ``j0..j1-1``, into ``dz`` (rows of
    ``j1 - j0``), and into ``out`` (None: not)."""
    width = j1 - j0
    tm, ta, tb = zm[j0:j1], za[j0:j1], zb[j0:j1]
    for r in range(first, last):
        lo = r * P + j0
        xs, gs = x[lo:lo + width], dy[lo:lo + width]
        ms, rs = residual_slice(mask, lo, lo + width), residual_slice(res, lo, lo + width)
        row = dz[(r - first) * width:(r - first + 1) * width]
        for j in range(width):  # load: no negative-index wrap-around (it kept LLVM scalar)
            dz_store(act, ms, rs, xs, gs, row, j, load(tm, j), load(ta, j), load(tb, j))
        copy_into(residual_slice(out, lo, lo + width), row)


@njit(parallel=True, **KERNEL_OPTIONS)
def row_sums(x, dy, P, rows_per_block, mu, part1, part2, act, mask, res, zm, za, zb, like,
             out):
    """:func:`normkernels.kernels.backward_sums.row_sums` of dZ (its sums in its order:
    four rows a sweep, then the tail), each sweep's dZ made first into a buffer (in L1
    for rows of up to 2048 columns). ``zm, za, zb``: Z's coefficients per column."""
    n_rows = x.size // P
    n_tiles = (P + COLUMN_TILE - 1) // COLUMN_TILE
    for item in prange(part1.shape[0] * n_tiles):
        blk, j0, j1, first, last = row_item(item, n_tiles, P, rows_per_block, n_rows)
        width = j1 - j0
        dz = np.empty(ROW_UNROLL * width, like.dtype)
        m = mu[j0:j1].copy()
        s1 = np.zeros(width)
        s2 = np.zeros(width)
        r = first
        while r + ROW_UNROLL <= last:
            _dz_rows(x, dy, mask, res, dz, r, r + ROW_UNROLL, j0, j1, P, zm, za, zb, act, out)
            x0, x1 = x[r * P + j0:r * P + j1], x[(r + 1) * P + j0:(r + 1) * P + j1]
            x2, x3 = x[(r + 2) * P + j0:(r + 2) * P + j1], x[(r + 3) * P + j0:(r + 3) * P + j1]
            for j in range(width):
                a0 = np.float64(load(dz, j))
                a1 = np.float64(load(dz, width + j))
                a2 = np.float64(load(dz, 2 * width + j))
                a3 = np.float64(load(dz, 3 * width + j))
                s1[j] += (a0 + a1) + (a2 + a3)
                s2[j] += ((a0 * deviation(x0, j, m[j]) + a1 * deviation(x1, j, m[j]))
                          + (a2 * deviation(x2, j, m[j]) + a3 * deviation(x3, j, m[j])))
            r += ROW_UNROLL
        for tail in range(r, last):
            _dz_rows(x, dy, mask, res, dz, tail, tail + 1, j0, j1, P, zm, za, zb, act, out)
            xr = x[tail * P + j0:tail * P + j1]
            for j in range(width):
                g = np.float64(load(dz, j))
                s1[j] += g
                s2[j] += g * deviation(xr, j, m[j])
        put_partials(part1, blk, j0, s1)
        put_partials(part2, blk, j0, s2)


@njit(parallel=True, **KERNEL_OPTIONS)
def apply_rows(x, dy, dx, dres, P, rows_per_block, m, a, b, k, act, mask, res, zm, za, zb,
               like):
    """:func:`normkernels.kernels.backward_dx.apply_rows` of dZ, and ``dres = dZ``, a
    row's dZ at a time."""
    n_rows = x.size // P
    for blk in prange((n_rows + rows_per_block - 1) // rows_per_block):
        first = blk * rows_per_block
        dz = np.empty(P, like.dtype)
        for r in range(first, min(n_rows, first + rows_per_block)):
            lo = r * P
            _dz_rows(x, dy, mask, res, dz, r, r + 1, 0, P, P, zm, za, zb, act, None)
            copy_into(residual_slice(dres, lo, lo + P), dz)
            apply_row(x[lo:lo + P], dz, dx[lo:lo + P], m, a, b, k)


plane_sums_serial = serial_twin(plane_sums, **KERNEL_OPTIONS)
apply_planes_serial = serial_twin(apply_planes, **KERNEL_OPTIONS)
row_sums_serial = serial_twin(row_sums, **KERNEL_OPTIONS)
apply_rows_serial = serial_twin(apply_rows, **KERNEL_OPTIONS)

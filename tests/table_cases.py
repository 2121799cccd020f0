"""Workloads of the operator table for tests: every (record, mode) of
``normkernels.operators.OPERATORS`` with small inputs, its float64 formula, its
statistic groups and a tolerance, built from the record's helpers only (the bench's
``make_inputs`` and ``numpy_call`` are the model). A new record is covered by the
tests that iterate :data:`CASES` with no edit here; a new family is covered too, with
one statistic group for the tolerance and the float64 formula's word on where a NaN
reaches (:func:`group_kind` names the known families' groups).

The data differ per statistic group (:func:`structured`), so a row, channel or
sample normalized with another's statistics or parameters is off by far more than
:func:`tolerance` (``test_table.py`` checks that premise).
"""

import warnings
from dataclasses import dataclass

import numpy as np
from oracle import BFLOAT16, F16, F32, F64, ulp, unit_roundoff

from normkernels.operators import BACKWARD, OPERATORS
from normkernels.operators.record import qk_heads

# X's shape per kind of record, in NCX order (row normalizations: X's shape, rows over
# the last axis). C = 6: GROUPS gives groups of 3 channels (2 groups), and LRN's window
# of 5 does not reach across all channels. Small: every call is a few microseconds, so
# the file's time is the kernels' compile (or cache load) time.
CHANNEL_SHAPE = (3, 6, 5, 7)
ROW_SHAPE = (3, 4, 24)
GRID = 16  # the skip operators' inputs are multiples of 1/16 (see quantize)


@dataclass(frozen=True)
class Case:
    op: object  # the Operator record
    mode: str

    @property
    def id(self):
        return f"{self.op.name}-{self.mode}"

    @property
    def function_name(self):
        return self.op.target(self.mode)[0]

    def layouts(self):
        return self.op.layouts

    def dtypes(self):
        return tuple(np.dtype(_DTYPES[d]) for d in self.op.dtypes)

    @property
    def writes_out(self):
        """Does the call take ``out`` (a Y of X's shape and dtype)?"""
        return self.op.takes_out


_DTYPES = {"float16": F16, "bfloat16": BFLOAT16, "float32": F32, "float64": F64}
CASES = [Case(op, mode) for op in OPERATORS.values() for mode in op.modes]


def ncx_shape(op):
    return ROW_SHAPE if op.rows else CHANNEL_SHAPE


def channel_axis(op, ndim, data_format):
    """The axis of the per-channel parameters (``Workload.channel_axis``)."""
    return 1 if data_format == "NCX" or ndim <= 2 else ndim - 1


def quantize(a, limit):
    """``a`` on the grid of multiples of 1/GRID, within +-``limit``; an all-positive
    array (a scale, a variance) stays at least 1/GRID. Every input is a multiple of
    1/16 below 16 in magnitude, so it is exact in bfloat16 and float16 and so is a
    sum of three of them below 16 (the skip operators add input + skip + bias in X's
    dtype: the float64 formula then adds the same numbers)."""
    v = np.asarray(a, np.float64)
    q = np.clip(np.round(v * GRID) / GRID, -limit, limit)
    if v.size and np.all(v > 0):
        q = np.maximum(q, 1.0 / GRID)
    return q.astype(a.dtype)


def structured(rng, shape, lead):
    """``z * s + o``, ``z`` standard normal, with an offset ``o`` and a scale ``s`` per
    index of the ``lead`` leading axes (N and C; a row normalization's row axes): both
    increasing functions of one rank, the leading indices' digits in a mixed radix with
    each axis's digits shuffled. Every (n, c) or row then has its own mean, standard
    deviation and mean square (each block of ``z`` is standardized), and so has
    every channel over N and every (n, group): the channels' means differ by a step of
    the rank at least, the samples' by C steps."""
    dims = shape[:lead]
    rank = np.zeros(dims, int)
    for a, n in enumerate(dims):
        view = [1] * lead
        view[a] = n
        rank = rank * n + rng.permutation(n).reshape(view)
    t = rank / max(1, rank.size - 1)  # in [0, 1]
    o = (0.25 + 3.0 * t).reshape(*dims, *[1] * (len(shape) - lead))
    s = (0.5 * 2.6 ** t).reshape(o.shape)  # 0.5 .. 1.3
    z = rng.standard_normal(shape)
    rest = tuple(range(lead, len(shape)))
    if rest:  # each block exactly mean 0 and std 1: no chance likeness of two groups
        z = z - z.mean(axis=rest, keepdims=True)
        z = z / z.std(axis=rest, keepdims=True)
    return z * s + o


@dataclass
class Workload:
    case: Case
    dtype: np.dtype
    data_format: str
    X: np.ndarray
    params: tuple
    axis: int

    @property
    def op(self):
        return self.case.op

    @property
    def mode(self):
        return self.case.mode

    def call(self, X=None, params=None, out=None, path=None, engine=None):
        X = self.X if X is None else X
        params = self.params if params is None else params
        return self.op.call(X, params, self.mode, self.data_format, out=out, engine=engine,
                            path=path)

    def exact(self, X=None, params=None):
        """The float64 formula's outputs, as a tuple (Y; dX; mean and variance)."""
        X = self.X if X is None else X
        params = self.params if params is None else params
        with np.errstate(all="ignore"), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            result = self.op.formula(X, params, self.mode, self.axis, F64)
        return tuple(result) if isinstance(result, tuple) else (result,)

    def arrays(self):
        """Every array of the call: X and the parameters."""
        return (self.X, *[p for p in self.params if isinstance(p, np.ndarray)])


def make(case, dtype, data_format, rng, shape=None):
    """X (structured per statistic group, see :func:`structured`) and the record's
    parameters (``Operator.params``); for a record with a skip input, all on the 1/16
    grid (:func:`quantize`). Other data are not: sums of grid numbers are exact, in
    any order, and would hide a merge order that depends on the path."""
    op, mode = case.op, case.mode
    shape = ncx_shape(op) if shape is None else shape
    lead = len(shape) - 1 if op.rows else min(2, len(shape))
    if op.family == "qk":  # per head: each head its own statistics
        D = qk_heads(shape[-1])["head_dim"]
        X = structured(rng, (*shape[:-1], shape[-1] // D, D), len(shape)).reshape(shape)
    else:
        X = structured(rng, shape, lead)
    if data_format == "NXC" and len(shape) > 2 and not op.rows:
        X = np.moveaxis(X, 1, -1)
    X = np.ascontiguousarray(X).astype(dtype)
    if op.skip:
        X = quantize(X, 7)
    axis = channel_axis(op, X.ndim, data_format)
    C = op.columns(shape)
    params = op.params(rng, C, dtype, X.shape, mode, X, axis)
    if op.skip:
        params = tuple(quantize(p, 4) for p in params)
    return Workload(case, np.dtype(dtype), data_format, X, params, axis)


def primary(case, result):
    """The outputs the formula gives, from a call's result (the bench's ``_error``):
    Y (dX), or the mean and variance of moments."""
    if case.op.tuple_output:
        return tuple(result)
    if isinstance(result, (tuple, list)):
        return (result[0],)
    return (result,)


def outputs(result):
    return tuple(result) if isinstance(result, (tuple, list)) else (result,)


# --- statistic groups ---

def _indices(shape, data_format, op):
    """(n, c, C) index arrays of X's elements (c: the channel, by the layout)."""
    idx = np.indices(shape)
    if len(shape) < 2:
        return idx[0], np.zeros(shape, int), 1
    axis = channel_axis(op, len(shape), data_format)
    return idx[0], idx[axis], shape[axis]


def group_kind(case):
    """What a NaN in one element of X reaches in Y (dX): "element", "row", "channel",
    "instance" ((n, c)), "group" ((n, group)), "window" (LRN: the channels whose window
    holds it, same n and position), or None for a family this module does not know
    (the tests then take the formula's word)."""
    op, mode = case.op, case.mode
    if op.family == "qk":  # a q or k head; a v element reaches only itself
        return "head"
    if op.rows:
        return "row"
    if op.family == "mvn":  # statistics over axes (0, 2, 3): per channel
        return "channel"
    if op.family == "lrn":
        return "window"
    if op.family == "group":
        return "group"
    if op.family != "channel":
        return None
    if op.reads_only:
        return "channel"
    if not op.batch_statistics:  # statistics per (n, c): instance normalization
        return "instance"
    if mode == "training":
        return "channel"
    if mode == BACKWARD:
        return "channel" if op.mode_kwargs.get(BACKWARD, {}).get("training", True) \
            else "element"
    return "element"  # inference with given statistics


def statistic_groups(case, shape, data_format):
    """An integer label per element of X: elements with one label share their
    statistics (the tolerance's groups). Elementwise inference is labelled per
    channel (its parameters'), LRN per (n, c); None for an unknown family."""
    op = case.op
    kind = group_kind(case)
    if kind is None:
        return None
    if kind == "row":
        rows = int(np.prod(shape[:-1]))
        return np.broadcast_to(np.arange(rows).reshape(*shape[:-1], 1), shape)
    if kind == "head":  # per (row, head); the v heads of a row: one label (copied, exact)
        heads = qk_heads(shape[-1])
        last = heads["num_q_heads"] + heads["num_kv_heads"]  # the first v head
        head = np.minimum(np.arange(shape[-1]) // heads["head_dim"], last)
        rows = np.arange(int(np.prod(shape[:-1]))).reshape(*shape[:-1], 1)
        return rows * (last + 1) + head
    n, c, C = _indices(shape, data_format, op)
    if kind in ("channel", "element"):
        return c
    if kind in ("instance", "window"):
        return n * C + c
    G = op.group_count(C)
    return n * G + c // (C // G)


def nan_reach(case, shape, data_format, where):
    """The elements of Y a NaN at X[where] makes NaN (:func:`group_kind`), or None."""
    kind = group_kind(case)
    if kind is None:
        return None
    labels = statistic_groups(case, shape, data_format)
    if kind == "element" or (kind == "head" and where[-1] >= shape[-1] - _v_width(shape)):
        mask = np.zeros(shape, bool)  # given statistics; QK-norm's v, left as it was
        mask[where] = True
        return mask
    if kind == "window":
        size = case.op.mode_kwargs[case.mode]["size"]
        _, c, _ = _indices(shape, data_format, case.op)
        axis = channel_axis(case.op, len(shape), data_format)
        c0 = where[axis]
        same_place = np.ones(shape, bool)
        for a, i in enumerate(where):
            if a != axis:
                same_place &= np.indices(shape)[a] == i
        reach = (c - (size - 1) // 2 <= c0) & (c0 <= c + size // 2)
        return same_place & reach
    return labels == labels[where]


def _v_width(shape):
    heads = qk_heads(shape[-1])
    return heads["num_kv_heads"] * heads["head_dim"]


# --- tolerance ---

def _per_group(values, labels, fn):
    """fn over each group of ``values`` (labels: small non-negative ints), broadcast
    back to the elements."""
    flat = labels.reshape(-1)
    out = np.empty(flat.max() + 1)
    v = values.reshape(-1)
    for g in np.unique(flat):
        out[g] = fn(v[flat == g])
    return out[flat].reshape(labels.shape)


# The allowance, in units of the compute dtype's unit roundoff times the data's
# conditioning, for the kernels' arithmetic against the float64 formula. The error
# model (tests/oracle.py, docs/guide/numerics.md) is a handful of roundings of the compute
# dtype on terms no larger than the group's largest output, plus the statistics'
# error, which grows with |mean| / std of the group (the centring; the skip add's
# rounding in X's dtype). Measured worst over every record, mode, dtype, layout and
# path of this battery and 20 seeds: 7.6 for float64 X (the float64 formula's own
# roundings count as much as the kernels' there), 1.6 for float32, and 16-bit outputs
# at most 0.7 beyond their half ulp. 32 leaves room for other data without letting a
# mixed-up row or channel (off by 1% of its outputs at least: test_table.py checks
# the data) through.
ROUNDINGS = 32


def compute_dtype(x_dtype):
    return F64 if np.dtype(x_dtype) == F64 else F32


def conditioning(X, labels):
    """``1 + |mean| / std`` of each element's statistic group in X (float64; of its
    finite elements)."""
    x = np.asarray(X, np.float64)
    x = np.where(np.isfinite(x), x, np.nan)
    if labels is None:
        labels = np.zeros(x.shape, int)
    with np.errstate(all="ignore"):
        mean = _per_group(x, labels, np.nanmean)
        std = _per_group(x, labels, np.nanstd)
        return 1 + np.abs(mean) / std


def tolerance(work, got, exact, labels=None, factor=ROUNDINGS):
    """Allowed |got - exact| per element: ``factor`` roundings of the compute dtype on
    the largest |output| of the element's statistic group, times its conditioning, and
    half an ulp of a 16-bit output (the one rounding to it)."""
    exact = np.asarray(exact, np.float64)
    # an output narrower than the compute dtype (float32 scales of float64 X) rounds to it
    u = max(unit_roundoff(compute_dtype(work.dtype)), unit_roundoff(compute_dtype(got.dtype)))
    shaped = labels is not None and exact.shape == labels.shape
    with np.errstate(all="ignore"):
        magnitude = np.where(np.isfinite(exact), np.abs(exact), 0.0)
        if shaped:
            ref = _per_group(magnitude, labels, np.max)
            cond = conditioning(work.X, labels)
        else:
            ref = np.max(magnitude, initial=0.0)
            cond = np.nanmax(conditioning(work.X, None))
        tol = factor * u * cond * ref + 1e-300
        if np.dtype(got.dtype).itemsize == 2:
            tol = tol + 0.5 * ulp(np.abs(exact) + tol, got.dtype)
        elif np.dtype(got.dtype).kind == "i":  # a quantized output: rounded to integers
            tol = tol + 0.5
    assert np.all(np.isfinite(tol)), "the tolerance is not finite (a constant group?)"
    return tol


def error_ratio(got, exact, tol):
    """max |got - exact| / tol over the elements finite in ``exact`` (NaN and
    infinities must match exactly: asserted)."""
    g = np.asarray(got).astype(np.float64)
    e = np.broadcast_to(np.asarray(exact, np.float64), g.shape)
    assert g.shape == np.shape(exact), f"shape {g.shape}, formula {np.shape(exact)}"
    nan = np.isnan(e)
    assert np.array_equal(np.isnan(g), nan), (
        f"NaN at {np.argwhere(np.isnan(g) != nan)[:4].tolist()} (got NaN: "
        f"{np.isnan(g).sum()}, the formula: {nan.sum()})")
    inf = np.isinf(e)
    assert np.array_equal(g[inf], e[inf]), "infinities differ"
    finite = ~nan & ~inf
    if not finite.any():
        return 0.0
    err = np.abs(g[finite] - e[finite])
    ratio = err / np.broadcast_to(tol, g.shape)[finite]
    assert not np.isnan(ratio).any(), "NaN error ratio"  # would compare as within
    return float(np.max(ratio))


def assert_close(got, exact, tol, what):
    ratio = error_ratio(got, exact, tol)
    if ratio > 1:
        g = np.asarray(got).astype(np.float64)
        e = np.asarray(exact, np.float64)
        with np.errstate(invalid="ignore"):
            bad = np.abs(g - e) > tol
        where = np.argwhere(bad)[:3].tolist()
        raise AssertionError(f"{what}: {bad.sum()} of {bad.size} elements off the float64 "
                             f"formula, worst {ratio:.3g}x the tolerance; first at {where}: "
                             f"got {g[bad][:3]}, formula {e[bad][:3]}")
    return ratio

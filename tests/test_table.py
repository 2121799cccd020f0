"""The operator table's battery: every (record, mode) of
``normkernels.operators.OPERATORS``, through the record's helpers only, so a record
added to the table is covered here with no edit (tests/table_cases.py builds the
workloads; its docstring says how the data differ per statistic group).

Properties, each over the record's dtypes and layouts where they matter:

1. routes: every execution path (``normkernels.engine.PATHS``, forced through the
   spec layer) agrees with the float64 formula within a tolerance of a few roundings
   of the compute dtype, and gives the default call's bits (docs/guide/numerics.md: the
   paths give identical results, bit for bit);
2. rounding: a 16-bit output is the float64 formula rounded once (within one ulp,
   and bit for bit nearly everywhere), NaN-free;
3. hostile input: integer X, a wrong ``out``, inputs left unmodified (read-only
   ones too), a NaN or an infinity confined to its statistic group, an empty batch;
4. reliability: byte-swapped inputs, strided, reversed and Fortran-order views,
   memory in the other layout's order, ``out=`` (contiguous or strided), and
   concurrent calls from threads on different data give the bits of the plain call.

Routes, rounding and read-only inputs run every dtype of the record; the others
float32 (or the record's first dtype), each in every layout of the record. Kernels
compile once per dtype, layout and path; with a warm kernel cache the file takes a
few seconds.

The other batteries (tests/test_paths.py, test_rounding.py, test_hostile.py,
test_reliability.py) go deeper for the operators they name; this one keeps every
record honest on the properties all of them share.
"""

import concurrent.futures
import inspect
import re
import sys

import numpy as np
import pytest
from arrays import assert_identical
from oracle import ulp
from table_cases import (
    CASES,
    assert_close,
    make,
    nan_reach,
    outputs,
    primary,
    statistic_groups,
    tolerance,
)

import normkernels
from normkernels.engine import PATHS
from normkernels.operators import BACKWARD, OPERATORS

F32 = np.dtype(np.float32)


def params_of(cases, dtypes):
    """pytest params ``(case, dtype, data_format)`` over each record's layouts:
    ``dtypes`` is "all" (the record's), "16-bit", "swappable" (those with a
    byte-swapped form: not ml_dtypes' bfloat16, whose ``newbyteorder`` is a void
    dtype) or "one" (float32, or the record's first dtype when it has no float32)."""
    out = []
    for case in cases:
        chosen = case.dtypes()
        if dtypes == "16-bit":
            chosen = [d for d in chosen if d.itemsize == 2]
        elif dtypes == "swappable":
            chosen = [d for d in chosen if d.name != "bfloat16"]
        elif dtypes == "one":
            chosen = [F32 if F32 in chosen else chosen[0]]
        for dtype in chosen:
            for fmt in case.layouts():
                out.append(pytest.param(case, dtype, fmt, id=f"{case.id}-{dtype.name}-{fmt}"))
    return out


ALL = params_of(CASES, "all")
ONE = params_of(CASES, "one")
WRITERS = [c for c in CASES if c.writes_out]
# the records whose Y has X's dtype (moments' statistics are float32, quantized Y int8)
LIKE_X = [c for c in CASES if not c.op.tuple_output]
SIXTEEN_BIT = params_of(LIKE_X, "16-bit")
SWAPPABLE = params_of(CASES, "swappable")


def same_outputs(got, want, what):
    got, want = outputs(got), outputs(want)
    assert len(got) == len(want), f"{what}: {len(got)} outputs, expected {len(want)}"
    for k, (a, b) in enumerate(zip(got, want, strict=True)):
        try:
            assert_identical(np.asarray(a), np.asarray(b))
        except AssertionError:
            raise AssertionError(f"{what}: output {k} differs from the plain call's bits "
                                 f"({np.asarray(a).dtype}{np.shape(a)} vs "
                                 f"{np.asarray(b).dtype}{np.shape(b)})") from None


def check_formula(work, result, what, X=None):
    """Every output the formula gives is within :func:`table_cases.tolerance` of it."""
    X = work.X if X is None else X
    labels = statistic_groups(work.case, X.shape, work.data_format)
    exact = work.exact(X=X)
    got = primary(work.case, result)
    assert len(got) == len(exact)
    for k, (g, e) in enumerate(zip(got, exact, strict=True)):
        assert_close(g, e, tolerance(work, g, e, labels), f"{what}, output {k}")


def x_argument(case, work):
    """The public function's name for X (``inspect.signature``; its position from the
    record's ``arguments``)."""
    args = case.op.arguments(work.X, work.params, case.mode)
    position = next(i for i, a in enumerate(args) if a is work.X)
    fn = getattr(normkernels, case.function_name)
    return list(inspect.signature(fn).parameters)[position]


def names(message, word):
    return re.search(rf"(?<![\w.]){re.escape(word)}(?!\w)", message) is not None


# --- 1. routes ---

@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("case,dtype,data_format", ALL)
def test_every_path_agrees_with_the_formula_and_the_default_bits(rng, case, dtype,
                                                                 data_format, path):
    work = make(case, dtype, data_format, rng)
    forced = work.call(path=path)
    check_formula(work, forced, f"path {path}")
    same_outputs(forced, work.call(), f"path {path}")


# --- 2. rounding ---

def round_once(exact, dtype):
    """float64 ``exact`` rounded once, to nearest even, to the 16-bit ``dtype``: by
    round-to-odd to float32 (truncate, then set the last bit when inexact), whose
    rounding to 16 bits then equals the direct one (float32 keeps more than two
    extra bits)."""
    e = np.asarray(exact, np.float64)
    f = e.astype(np.float32)
    inexact = f.astype(np.float64) != e
    toward_zero = np.abs(f.astype(np.float64)) > np.abs(e)
    f = np.where(inexact & toward_zero, np.nextafter(f, np.float32(0)), f)
    odd = np.where(inexact, f.view(np.uint32) | np.uint32(1), f.view(np.uint32))
    return odd.view(np.float32).astype(dtype)


@pytest.mark.parametrize("case,dtype,data_format", SIXTEEN_BIT)
def test_sixteen_bit_outputs_are_the_formula_rounded_once(rng, case, dtype, data_format):
    """The kernels compute in float32 and round once. The float32 value differs from
    the exact one by the arithmetic's error, far below an ulp of the 16-bit output,
    but where the exact value lies within that error of a midpoint between two 16-bit
    numbers, rounding each of them once may pick neighbours: so within 1 ulp, and
    not further (16-bit arithmetic, or a rounding of a rounded value, drifts by
    several). Where an output cancels (``(x - m) * a`` nearly ``-B``), the float32
    arithmetic's error is not below an ulp of the tiny result: it is allowed on top,
    as in the routes test. And bit
    for bit almost everywhere: a midpoint that close is rare, while truncation
    misrounds half of the outputs."""
    work = make(case, dtype, data_format, rng)
    got = primary(case, work.call())
    labels = statistic_groups(case, work.X.shape, data_format)
    for g, e in zip(got, work.exact(), strict=True):
        assert g.dtype == dtype, f"output dtype {g.dtype}, X's {dtype}"
        assert not np.isnan(g).any(), "NaN in the output of finite inputs"
        want = round_once(e, dtype)
        a, b = g.astype(np.float64), want.astype(np.float64)
        # the float32 arithmetic's own error (tolerance() without its half ulp), which
        # matters only where an output cancels to far below its terms
        arithmetic = tolerance(work, np.float32(0), e, labels)
        step = ulp(np.maximum(np.abs(a), np.abs(b)), dtype)
        off = np.abs(a - b) / (step + arithmetic)
        assert off.max() <= 1, (f"{(off > 1).sum()} outputs more than 1 ulp from the "
                                f"formula rounded once, worst {off.max():g} ulp")
        misrounded = np.count_nonzero(g.view(np.uint16) != want.view(np.uint16))
        assert misrounded <= 1 + g.size // 100, (
            f"{misrounded} of {g.size} outputs are not the formula rounded once")


# --- 3. hostile input ---

@pytest.mark.parametrize("case,dtype,data_format", ONE)
def test_integer_x_is_rejected_by_name(rng, case, dtype, data_format):
    work = make(case, dtype, data_format, rng)
    name = x_argument(case, work)
    with pytest.raises((TypeError, ValueError)) as raised:
        work.call(X=work.X.astype(np.int32))
    assert names(str(raised.value), name), (
        f"the error does not name {name!r}: {raised.value}")


@pytest.mark.parametrize("defect", ["shape", "dtype"])
@pytest.mark.parametrize("case,dtype,data_format", params_of(WRITERS, "one"))
def test_a_wrong_out_is_rejected(rng, case, dtype, data_format, defect):
    work = make(case, dtype, data_format, rng)
    X = work.X
    if defect == "shape":
        out = np.empty((*X.shape[:-1], X.shape[-1] + 1), X.dtype)
    else:
        out = np.empty(X.shape, np.float32 if X.dtype == np.float64 else np.float64)
    with pytest.raises((TypeError, ValueError)) as raised:
        work.call(out=out)
    assert names(str(raised.value), "out"), f"the error does not name out: {raised.value}"


@pytest.mark.parametrize("case,dtype,data_format", ALL)
def test_inputs_are_never_modified(rng, case, dtype, data_format):
    """Writeable inputs are left as they were; read-only ones are accepted and give
    the same bits."""
    work = make(case, dtype, data_format, rng)
    before = [a.copy() for a in work.arrays()]
    plain = work.call()
    for a, b in zip(work.arrays(), before, strict=True):
        assert_identical(a, b)
    frozen = [a.copy() for a in work.arrays()]
    for a in frozen:
        a.setflags(write=False)
    same_outputs(work.call(X=frozen[0], params=_replace_arrays(work.params, frozen[1:])),
                 plain, "read-only inputs")
    for a, b in zip(frozen, before, strict=True):
        assert_identical(a, b)


def _replace_arrays(params, arrays):
    it = iter(arrays)
    return tuple(next(it) if isinstance(p, np.ndarray) else p for p in params)


@pytest.mark.parametrize("value", [np.nan, np.inf])
@pytest.mark.parametrize("path", [None, *PATHS])
@pytest.mark.parametrize("case,dtype,data_format", ONE)
def test_a_special_value_stays_in_its_statistic_group(rng, case, dtype, data_format, path,
                                                      value):
    """A NaN or an infinity in one element of X reaches only the outputs of its
    statistic group (``table_cases.group_kind``: its row, channel, (n, c), (n, group),
    LRN's window, or the element itself when the statistics are given): a NaN makes
    exactly them NaN, as the float64 formula does; every output outside the group
    keeps the bits it has without the special value, and every output matches the
    formula (an infinity: an infinite mean and a NaN variance, or zeros where it only
    enlarges a norm, as the formula computes).

    Keeping the bits outside holds for float32 X, the dtype run here. For float64 X
    in channels-last memory it does not, by a last bit: the rows statistics kernel
    (``kernels/statistics.py: row_partials``) redoes a whole block of rows by two
    passes when one column's one-pass sums cancel or are NaN, so the other columns of
    the block change their rounding: within the stated accuracy, no NaN spreads, and
    the documentation does not promise those bits."""
    work = make(case, dtype, data_format, rng)
    clean = primary(case, work.call(path=path))
    X = work.X.copy()
    where = np.unravel_index(X.size // 2 + 1, X.shape)
    X[where] = value
    if case.op.quantized and np.dtype(case.op.quantized).kind == "i":
        # an integer Y has no NaN to give the group: the call says so, naming X
        with pytest.raises(ValueError) as raised:
            work.call(X=X, path=path)
        assert names(str(raised.value), x_argument(case, work)), raised.value
        return
    got = primary(case, work.call(X=X, path=path))
    exact = work.exact(X=X)
    reach = nan_reach(case, X.shape, data_format, where)
    labels = statistic_groups(case, X.shape, data_format)
    for k, (g, e, c) in enumerate(zip(got, exact, clean, strict=True)):
        tol = np.broadcast_to(tolerance(work, g, e, labels), e.shape)
        if case.mode == BACKWARD and np.isinf(value):
            # the guide holds the forward operators to the formula's special values;
            # a backward pass folds dX into dY * A + (x - m) * B + K, where an infinite
            # B meets x - m = 0 or inf - inf: non-finite where the formula is (its
            # group), not always the same infinity or NaN
            finite = np.isfinite(e)
            assert np.array_equal(np.isfinite(g), finite), f"output {k}: non-finite elsewhere"
            assert_close(g[finite], e[finite], tol[finite], f"output {k}")
        else:
            assert_close(g, e, tol, f"output {k}")
        spread = ~np.isfinite(e)
        assert 0 < spread.sum() < e.size  # the premise: one group of several
        if e.shape != X.shape:  # statistics (moments): the formula's word, above
            continue
        if reach is None:  # a family table_cases does not know: the formula's reach
            reach = spread
        assert reach.sum() < reach.size
        if np.isnan(value):
            assert np.array_equal(np.isnan(e), reach), "the formula's reach is not the group"
            assert np.array_equal(np.isnan(g), reach), (
                f"output {k}: NaN at {np.isnan(g).sum()} elements, its group has "
                f"{reach.sum()}")
        assert_identical(g[~reach], c[~reach])


@pytest.mark.parametrize("case,dtype,data_format", ONE)
def test_an_empty_batch(rng, case, dtype, data_format):
    """N = 0: an empty Y (statistics of their usual shape), or a ValueError naming X.
    Inputs of X's shape and per-sample parameters lose their samples too."""
    work = make(case, dtype, data_format, rng)
    X = work.X[:0]
    params = tuple(p[:0] if isinstance(p, np.ndarray) and (p.shape == work.X.shape or
                                                           case.op.per_sample) else p
                   for p in work.params)
    try:
        result = work.call(X=X, params=params)
    except ValueError as exc:
        assert names(str(exc), x_argument(case, work)), f"unclear error: {exc}"
        return
    full = outputs(work.call())
    assert len(outputs(result)) == len(full)
    for g, f in zip(primary(case, result), primary(case, full), strict=True):
        # Y (dX) of X's shape is empty, and so are outputs per row (a quantized Y's
        # scales); statistics per channel keep their shape
        if f.shape == work.X.shape:
            assert g.shape == X.shape
        elif case.op.rows and f.shape[:-1] == work.X.shape[:-1]:
            assert g.shape == (*X.shape[:-1], f.shape[-1])
        else:
            assert g.shape == f.shape
    for g, f in zip(outputs(result), full, strict=True):
        assert np.asarray(g).dtype == np.asarray(f).dtype
    if case.mode == BACKWARD:  # the parameter gradients are sums over no element
        for g in outputs(result)[1:]:
            assert np.all(np.asarray(g) == 0), "a gradient of an empty batch is not 0"


# --- 4. reliability ---

@pytest.mark.parametrize("case,dtype,data_format", SWAPPABLE)
def test_byte_swapped_inputs_give_the_same_bits(rng, case, dtype, data_format):
    work = make(case, dtype, data_format, rng)
    swapped = [a.astype(a.dtype.newbyteorder()) if a.dtype.itemsize > 1 else a
               for a in work.arrays()]
    assert not swapped[0].dtype.isnative
    params = _replace_arrays(work.params, swapped[1:])
    if case.op.in_place:  # written in place: a clear error, not a silent conversion
        with pytest.raises(TypeError) as raised:
            work.call(X=swapped[0], params=params)
        assert names(str(raised.value), x_argument(case, work)), raised.value
        return
    same_outputs(work.call(X=swapped[0], params=params), work.call(), "byte-swapped inputs")


def _view(a, kind):
    """``a``'s values as a non-contiguous view: every other element of a wider last
    axis, reversed memory along the first or the last axis, or Fortran order (every
    axis reversed in memory: LpNormalization's columns loop reads it in place)."""
    if kind == "step2-last":
        base = np.zeros((*a.shape[:-1], 2 * a.shape[-1]), a.dtype)
        base[..., ::2] = a
        return base[..., ::2]
    if kind == "reversed-first":
        return a[::-1].copy()[::-1]
    if kind == "reversed-last":
        return a[..., ::-1].copy()[..., ::-1]
    return np.asfortranarray(a)


@pytest.mark.parametrize("kind", ["step2-last", "reversed-first", "reversed-last", "fortran"])
@pytest.mark.parametrize("case,dtype,data_format", ONE)
def test_views_give_the_bits_of_contiguous_copies(rng, case, dtype, data_format, kind):
    """X and every input of X's shape (skip, dY) as views."""
    work = make(case, dtype, data_format, rng)
    X = _view(work.X, kind)
    assert not X.flags.c_contiguous and np.array_equal(X, work.X)
    params = tuple(_view(p, kind) if isinstance(p, np.ndarray) and p.shape == X.shape else p
                   for p in work.params)
    try:
        got = work.call(X=X, params=params)
    except ValueError as exc:  # written in place, and not through such a view: said so
        if not (case.op.in_place and names(str(exc), x_argument(case, work))):
            raise
        return
    same_outputs(got, work.call(), f"{kind} views")


TWO_LAYOUTS = [c for c in CASES if set(c.layouts()) == {"NCX", "NXC"}]


@pytest.mark.parametrize("case,dtype,data_format", params_of(TWO_LAYOUTS, "one"))
def test_memory_in_the_other_layout(rng, case, dtype, data_format):
    """X (and dY) in the other layout's memory order, e.g. a logically NCX tensor
    stored channels-last (PyTorch's channels_last): either run as that layout
    (ops/common.py ``physical_layout``: no copy), giving the bits of the call in that
    layout, or copied, giving the plain call's bits."""
    work = make(case, dtype, data_format, rng)
    other = "NXC" if data_format == "NCX" else "NCX"
    src, dst = (1, -1) if data_format == "NCX" else (-1, 1)  # the channel axis, there

    def physical(a):  # contiguous in the other layout
        return np.ascontiguousarray(np.moveaxis(a, src, dst))

    def as_given(a):  # the same values in the given layout, that memory underneath
        return np.moveaxis(physical(a), dst, src)

    X = as_given(work.X)
    assert not X.flags.c_contiguous and np.array_equal(X, work.X)
    shaped = [isinstance(p, np.ndarray) and p.shape == work.X.shape for p in work.params]
    got = work.call(X=X, params=tuple(as_given(p) if k else p
                                      for p, k in zip(work.params, shaped, strict=True)))
    there = outputs(case.op.call(physical(work.X), tuple(
        physical(p) if k else p for p, k in zip(work.params, shaped, strict=True)),
        case.mode, other))
    there = tuple(np.moveaxis(r, dst, src) if np.shape(r) == physical(work.X).shape else r
                  for r in there)
    try:
        same_outputs(got, there, f"run as {other}")
    except AssertionError:
        same_outputs(got, work.call(), f"neither run as {other} nor as a copy:")


@pytest.mark.parametrize("kind", ["contiguous", "strided"])
@pytest.mark.parametrize("case,dtype,data_format", params_of(WRITERS, "one"))
def test_out_gives_the_bits_of_a_new_array(rng, case, dtype, data_format, kind):
    work = make(case, dtype, data_format, rng)
    out = np.full_like(work.X, np.nan) if kind == "contiguous" else _view(
        np.full_like(work.X, np.nan), "step2-last")
    result = work.call(out=out)
    assert primary(case, result)[0] is out, "the first output is not out"
    same_outputs(result, work.call(), f"{kind} out=")


@pytest.mark.parametrize("case,dtype,data_format", ONE)
def test_threads_give_the_bits_of_sequential_calls(case, dtype, data_format):
    """4 threads, 64 calls on 4 inputs of different data over the default and every
    forced path (parallel launches from several threads at once), each compared with
    the sequential call: state shared between calls (scratch, plans) would mix them.
    The interpreter switches threads every microsecond meanwhile, so the Python
    between the kernels (which release the GIL) interleaves too."""
    works = [make(case, dtype, data_format, np.random.default_rng(seed)) for seed in range(4)]
    routes = (None, *PATHS)
    expected = {(k, path): w.call(path=path) for k, w in enumerate(works) for path in routes}
    jobs = [(k % 4, routes[k // 4 % len(routes)]) for k in range(64)]
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        with concurrent.futures.ThreadPoolExecutor(4) as pool:
            results = list(pool.map(lambda job: works[job[0]].call(path=job[1]), jobs))
    finally:
        sys.setswitchinterval(interval)
    for job, result in zip(jobs, results, strict=True):
        same_outputs(result, expected[job], f"a threaded call (input, path) {job}")


@pytest.mark.parametrize("case,dtype,data_format", ONE)
def test_a_mixed_up_group_would_be_far_outside_the_tolerance(rng, case, dtype, data_format):
    """The premise of the checks against the formula: every two statistic groups of
    the data differ in mean or standard deviation by at least 2% of the larger
    standard deviation (RMS normalization: in root mean square, by 2% of the larger
    one), so normalizing one with the other's statistics moves its outputs by at
    least 1% (the scales are at least 1/2), while the tolerance stays below a
    hundredth of that (plus, for a 16-bit output, its half ulp: 0.05% of the value
    for float16, 0.4% for bfloat16). (Measured over 60 seeds: 4% apart at least.)"""
    work = make(case, dtype, data_format, rng)
    labels = statistic_groups(case, work.X.shape, data_format)
    if labels is None:  # a family table_cases does not know: one group, nothing to mix
        return
    x = work.X.astype(np.float64).reshape(-1)
    flat = labels.reshape(-1)
    stats = np.array([(x[flat == g].mean(), x[flat == g].std()) for g in np.unique(flat)])
    m, sd = stats[:, 0], stats[:, 1]
    if case.op.family in ("rms", "qk"):  # what it divides by: the root mean square
        rms = np.sqrt(m * m + sd * sd)
        apart = np.abs(rms[:, None] - rms[None]) / np.maximum(rms[:, None], rms[None])
    else:
        apart = np.maximum(np.abs(m[:, None] - m[None]), np.abs(sd[:, None] - sd[None]))
        apart = apart / np.maximum(sd[:, None], sd[None])
    np.fill_diagonal(apart, np.inf)
    assert apart.min() > 0.02, "two statistic groups of the data look alike"
    for e in work.exact():  # the arithmetic's part (a 16-bit output adds its half ulp)
        arithmetic = tolerance(work, np.float32(0), e, labels)
        assert arithmetic.max() < 1e-4 * max(1.0, np.abs(e).max())


def test_every_record_and_mode_is_here():
    """The battery is the table's: every (record, mode) pair of OPERATORS is a case,
    and each property's parametrization holds each case (every dtype and layout for
    the routes)."""
    pairs = {f"{op.name}-{m}" for op in OPERATORS.values() for m in op.modes}
    assert {c.id for c in CASES} == pairs
    for params in (ALL, ONE):
        assert {p.values[0].id for p in params} == pairs
    assert {p.values[0].id for p in params_of(WRITERS, "one")} == {c.id for c in WRITERS}
    assert len(ALL) == sum(len(c.dtypes()) * len(c.layouts()) for c in CASES)
    assert {p.values[0].id for p in SIXTEEN_BIT} == {
        c.id for c in LIKE_X if any(d.itemsize == 2 for d in c.dtypes())}

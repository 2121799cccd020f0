"""Every record and mode of the operator table: a call plan (normkernels/ops/plans.py)
never serves a call it was not made for.

Driven by the table, so an operator that gains a plan is covered by adding it there:
each test makes a first plain call (which leaves a plan where the operator has
plans), then calls that a plan must either serve exactly or hand back to the full
checks, and compares each outcome (every output bit for bit, or the exception's type
and message) with the full path's on fresh arrays built the same way (an explicit
``path`` never uses or makes a plan). tests/test_plans.py has the per-operator detail
(attribute types, signed zeros, policy changes, the store's bound).
"""

import contextlib

import numpy as np
import pytest
from arrays import BFLOAT16, assert_identical

from normkernels.bench import workloads
from normkernels.operators import OPERATORS
from normkernels.ops import plans, training_plans

CASES = [(name, mode) for name, op in OPERATORS.items() for mode in op.modes]
IDS = [f"{name}-{mode}" for name, mode in CASES]
ROW_FAMILIES = ("layer", "rms")
HAS_PLANS = {("batchnorm", "inference"), ("batchnorm", "training"), ("batchnorm-inference",
             "inference"), ("instancenorm", "inference"), ("moments", "inference"),
             ("layernorm", "inference"), ("rmsnorm", "inference"),
             ("simplified-layernorm", "inference"), ("skip-layernorm", "inference"),
             ("skip-simplified-layernorm", "inference"), ("layernorm-onednn", "inference"),
             ("rmsnorm-onednn", "inference"), ("groupnorm", "inference"),
             ("fused-add-rmsnorm", "inference"), ("fused-add-layernorm", "inference"),
             ("groupnorm-ort", "inference"), ("batchnorm", "backward"),
             ("instancenorm", "backward"), ("groupnorm", "backward"),
             ("layernorm", "backward"), ("rmsnorm", "backward"),
             ("batchnorm-training-onednn", "training"), ("batchnorm-training-onednn", "backward"),
             ("mvn", "inference"), ("lpnorm", "inference")}


@pytest.fixture(autouse=True)
def fresh_plans():
    plans.clear()
    yield
    plans.clear()


def _shape(record, C=16):
    return (6, 3, 24) if record.family in ROW_FAMILIES else (2, C, 3, 5)


def _inputs(op, mode, layout, seed, shape=None, dtype="float32"):
    record = OPERATORS[op]
    work = workloads.custom_workload(op, mode, shape or _shape(record), dtype, layout)
    X, params = workloads.make_inputs(work, seed)
    return work, X, list(params)


def _outcome(call):
    """The outputs of ``call()`` as copies, or the exception's type and message."""
    try:
        result = call()
    except (ValueError, TypeError) as exc:
        return type(exc), str(exc)
    arrays = result if isinstance(result, tuple) else (result,)
    return [np.array(a, copy=True) for a in arrays]


def _same(got, want):
    if isinstance(want, tuple):
        assert got == want, f"plan: {got}, full checks: {want}"
        return
    assert isinstance(got, list), f"the planned call raised {got}; the full path did not"
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        assert_identical(g, w)


def _run(op, mode, layout, X, params, out, path=None):
    return lambda: OPERATORS[op].call(X, params, mode, layout, out, path=path)


def _copies(X, params):
    return X.copy(), [p.copy() for p in params]


def _plan_made(op, mode):
    if (op, mode) in HAS_PLANS:
        assert plans.stored_keys(), f"{op} {mode}: the first call left no plan"


# (fused: a training or backward plan serves its calls by its one-call kernel from the
# first, normkernels/ops/training_plans.py)
SERVED = [(op, mode, False) for op, mode in CASES] + [
    (op, mode, True) for op, mode in CASES if mode in ("backward", "training")]


@pytest.mark.parametrize("op,mode,fused", SERVED,
                         ids=[f"{op}-{mode}{'-fused' * fused}" for op, mode, fused in SERVED])
@pytest.mark.parametrize("out_kind", ["none", "out"])
def test_a_plan_serves_new_values_as_the_full_path_does(op, mode, fused, out_kind):
    record = OPERATORS[op]
    with training_plans.fusing() if fused else contextlib.nullcontext():
        _serves_new_values(op, mode, out_kind, record)


def _serves_new_values(op, mode, out_kind, record):
    for layout in record.layouts:
        plans.clear()
        _, X, params = _inputs(op, mode, layout, 1)
        out = None if out_kind == "none" or record.reads_only else np.empty_like(X)
        _run(op, mode, layout, X, params, out)()
        _plan_made(op, mode)
        _, X2, params2 = _inputs(op, mode, layout, 2)
        X[...] = X2
        for p, q in zip(params, params2, strict=True):
            p[...] = q
        got = _outcome(_run(op, mode, layout, X, params, out))  # same arrays, new values
        Xc, pc = _copies(X2, params2)
        want = _outcome(_run(op, mode, layout, Xc, pc, None if out is None
                             else np.empty_like(X), path="serial"))
        _same(got, want)


CHANGES = [(op, mode, change) for op, mode in CASES
           for change in ("strides", "shape", "float64", "float16", "bfloat16",
                          "X alone bfloat16")
           if change in ("strides", "shape") or change.split()[-1] in OPERATORS[op].dtypes]


@pytest.mark.parametrize("op,mode,change", CHANGES,
                         ids=[f"{op}-{mode}-{change}" for op, mode, change in CHANGES])
def test_other_metadata_is_not_served_by_the_plan(op, mode, change):
    """After plans for contiguous X (with and without ``out``): a strided view of the
    same shape, another channel count or row length, another dtype (of every array, or
    of X alone: an error or a result as the full checks decide). The bfloat16 changes
    follow plans for float16 (the same strides: only the dtype tells them apart)."""
    record = OPERATORS[op]
    layout = record.layouts[-1]
    first = "float16" if change.endswith("bfloat16") else "float32"
    _, X, params = _inputs(op, mode, layout, 1, dtype=first)
    _run(op, mode, layout, X, params, np.empty_like(X))()
    _run(op, mode, layout, X, params, None)()
    _plan_made(op, mode)
    shape = dtype = None
    if change == "shape":
        shape = (6, 3, 40) if record.family in ROW_FAMILIES else (2, 8, 3, 5)
    elif change.startswith("float") or change == "bfloat16":
        dtype = change
    _, X2, params2 = _inputs(op, mode, layout, 2, shape, dtype or first)
    if change == "X alone bfloat16":
        X2 = X2.astype(BFLOAT16)
    if change == "strides":
        wide = np.zeros((*X2.shape[:-1], 2 * X2.shape[-1]), X2.dtype)
        wide[..., ::2] = X2
        X2 = wide[..., ::2]
    for given_out in (False, True):
        out = np.empty(X2.shape, X2.dtype) if given_out else None
        got = _outcome(_run(op, mode, layout, X2, params2, out))
        Xc, pc = _copies(X2, params2)
        if change == "strides":
            wide = np.zeros_like(wide)
            wide[..., ::2] = Xc
            Xc = wide[..., ::2]
        out = np.empty(X2.shape, X2.dtype) if given_out else None
        _same(got, _outcome(_run(op, mode, layout, Xc, pc, out, path="serial")))


OUTS = [(op, mode, kind) for op, mode in CASES if OPERATORS[op].takes_out
        for kind in ("read-only", "overlaps X", "is X", "is a parameter")
        if kind != "is a parameter" or OPERATORS[op].skip or mode == "backward"]


@pytest.mark.parametrize("op,mode,out_kind", OUTS,
                         ids=[f"{op}-{mode}-{kind}" for op, mode, kind in OUTS])
def test_out_is_checked_again_after_a_plan(op, mode, out_kind):
    """``out`` read-only, overlapping X by half, X itself (in place), or a parameter
    of X's shape (dY, skip): what the full checks say, error or result."""
    record = OPERATORS[op]
    layout = record.layouts[0]
    _, X, params = _inputs(op, mode, layout, 1)
    _run(op, mode, layout, X, params, np.empty_like(X))()
    _plan_made(op, mode)

    def build(seed):
        _, X, params = _inputs(op, mode, layout, seed)
        if out_kind == "read-only":
            out = np.empty_like(X)
            out.flags.writeable = False
        elif out_kind == "overlaps X":
            flat = np.zeros(X.size + X.size // 2, X.dtype)
            flat[X.size // 2:] = X.ravel()
            X = flat[X.size // 2:].reshape(X.shape)
            out = flat[:X.size].reshape(X.shape)
        elif out_kind == "is X":
            out = X
        else:
            out = next(p for p in params if p.shape == X.shape and p.dtype == X.dtype)
        return X, params, out

    got = _outcome(_run(op, mode, layout, *build(2)))
    X2, params2, out2 = build(2)
    want = _outcome(_run(op, mode, layout, X2, params2, out2, path="serial"))
    _same(got, want)


REUSED = {("batchnorm", "inference"), ("batchnorm-inference", "inference"),
          ("instancenorm", "inference"), ("layernorm", "inference"), ("rmsnorm", "inference"),
          ("simplified-layernorm", "inference"), ("skip-layernorm", "inference"),
          ("skip-simplified-layernorm", "inference"), ("layernorm-onednn", "inference"),
          ("rmsnorm-onednn", "inference"), ("groupnorm", "inference")}
# the records that take out (the in-place ones' calls here run on copies: tests/test_llm_rows.py
# serves their buffers again)
REUSE_CASES = [(op, mode) for op, mode in CASES if OPERATORS[op].takes_out]


@pytest.mark.parametrize("op,mode", REUSE_CASES, ids=[f"{op}-{mode}" for op, mode in REUSE_CASES])
@pytest.mark.parametrize("in_place", [False, True], ids=["out", "in-place"])
def test_the_same_arrays_again_are_served_as_the_full_path(op, mode, in_place):
    """A network's pattern: the same array objects at every call, new values written
    into them in between. From the fifth call the planned operators run a bound call
    (ops/plans.py, Reuse); every call must still equal the full path on copies, and
    an ``out`` made read-only afterwards must fail as the full checks fail."""
    record = OPERATORS[op]
    for layout in record.layouts:
        plans.clear()
        _, X, params = _inputs(op, mode, layout, 1)
        out = X if in_place else np.empty_like(X)
        for seed in range(2, 9):  # bound at the fourth call (ops/plans.py, Reuse)
            _, X2, params2 = _inputs(op, mode, layout, seed)
            X[...] = X2
            for p, q in zip(params, params2, strict=True):
                p[...] = q
            got = _outcome(_run(op, mode, layout, X, params, out))
            Xc, pc = _copies(X2, params2)
            want = _outcome(_run(op, mode, layout, Xc, pc, Xc if in_place else
                                 np.empty_like(Xc), path="serial"))
            _same(got, want)
        # instance and group normalization of channels-last memory have no bound call
        if (op, mode) in REUSED and not (op in ("instancenorm", "groupnorm")
                                         and layout == "NXC"):
            assert plans.bound_calls(), f"{op} {layout}: the same arrays were never bound"
        out.flags.writeable = False
        got = _outcome(_run(op, mode, layout, X, params, out))
        out.flags.writeable = True
        Xc, pc = _copies(X, params)
        read_only = Xc if in_place else np.empty_like(Xc)
        read_only.flags.writeable = False
        _same(got, _outcome(_run(op, mode, layout, Xc, pc, read_only, path="serial")))


@pytest.mark.parametrize("op,mode", REUSE_CASES, ids=[f"{op}-{mode}" for op, mode in REUSE_CASES])
def test_other_objects_after_a_bound_call_are_not_served_by_it(op, mode):
    """Bound to (X, params, out): another ``out``, another X of the same metadata, and
    buffers alternating between two sets are each computed for themselves; the old
    ``out`` is left as it was."""
    record = OPERATORS[op]
    layout = record.layouts[0]
    _, X, params = _inputs(op, mode, layout, 1)
    out = np.empty_like(X)
    for _ in range(5):
        _run(op, mode, layout, X, params, out)()
    if (op, mode) in REUSED:
        assert plans.bound_calls() == 1, f"{op}: the arrays were not bound"
    _, Y, params_y = _inputs(op, mode, layout, 2)
    for args in [(X, params, np.empty_like(X)), (Y, params, out), (X, params_y, out),
                 (Y, params_y, np.empty_like(X)), (X, params, out), (Y, params, out)]:
        target = args[2]
        before = out.copy()
        got = _outcome(_run(op, mode, layout, *args))
        Xc, pc = _copies(args[0], args[1])
        _same(got, _outcome(_run(op, mode, layout, Xc, pc, np.empty_like(Xc), path="serial")))
        if target is not out:
            assert_identical(out, before)


@pytest.mark.parametrize("op,mode", REUSE_CASES, ids=[f"{op}-{mode}" for op, mode in REUSE_CASES])
@pytest.mark.parametrize("limits", ["none", "two entries", "no budget"])
def test_layers_of_one_shape_each_get_their_own_bound_call(op, mode, limits, monkeypatch):
    """Three layers of one shape (one plan), each with its own arrays, called in turn
    for four passes with new values each pass: every result equals the full path's;
    each layer is bound (unless the per-plan or byte limit says no, and then the
    results are still right)."""
    if limits == "two entries":
        monkeypatch.setattr(plans, "REUSE_ENTRIES", 2)
    elif limits == "no budget":
        monkeypatch.setattr(plans, "REUSE_BUDGET_BYTES", 0)
    record = OPERATORS[op]
    layout = record.layouts[0]
    layers = [_inputs(op, mode, layout, seed)[1:] for seed in (1, 2, 3)]
    outs = [np.empty_like(X) for X, _ in layers]
    for pass_ in range(4):
        for k, ((X, params), out) in enumerate(zip(layers, outs, strict=True)):
            _, X2, params2 = _inputs(op, mode, layout, 10 * pass_ + k)
            X[...] = X2
            for p, q in zip(params, params2, strict=True):
                p[...] = q
            got = _outcome(_run(op, mode, layout, X, params, out))
            Xc, pc = _copies(X2, params2)
            _same(got, _outcome(_run(op, mode, layout, Xc, pc, np.empty_like(Xc),
                                     path="serial")))
    if (op, mode) in REUSED and limits == "none":
        assert plans.bound_calls() == 3, f"{op}: {plans.bound_calls()} of 3 layers bound"
    if limits == "no budget":
        assert plans.bound_calls() == 0


def test_new_views_every_call_are_never_bound_and_stop_being_looked_at():
    """A caller that passes new views of its arrays at every call (an adapter making
    NumPy views of tensors): the views' ids come back once freed, but they are other
    objects, so nothing is bound, the results stay right, and after REUSE_STRIKES the
    plan stops looking. A persistent layer of the same shape, called in between, is
    still bound."""
    import normkernels as nk

    rng = np.random.default_rng(0)
    X = rng.standard_normal((4, 32)).astype(np.float32)
    s, b = rng.standard_normal(32).astype(np.float32), rng.standard_normal(32).astype(np.float32)
    Y = np.empty_like(X)
    for _ in range(3 * plans.REUSE_STRIKES):  # a tight loop: the views' ids come back
        nk.layer_normalization(X[:], s[:], b[:], out=Y[:])
    (plan,) = [p for p in plans._plans.values() if hasattr(p, "reuse")]
    assert plan.reuse.strikes >= plans.REUSE_STRIKES and not plan.reuse.entries
    plans.clear()
    P, Q = X + 1, np.empty_like(X)
    for _ in range(3 * plans.REUSE_STRIKES):
        X[...] = rng.standard_normal(X.shape)
        got = nk.layer_normalization(X[:], s[:], b[:], out=Y[:]).copy()
        assert_identical(got, nk.layer_normalization(X.copy(), s, b, out=np.empty_like(X)))
        nk.layer_normalization(P, s, b, out=Q)
    (plan,) = [p for p in plans._plans.values() if hasattr(p, "reuse") and p.reuse.entries]
    assert [entry[0][0] for entry in plan.reuse.entries.values()] == [P]

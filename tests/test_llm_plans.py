"""Call plans of the LLM operators at decode sizes: Gemma's ``rms_normalization(...,
offset=)``, ``quantized_rms_normalization`` / ``quantized_layer_normalization`` and
``gated_rms_normalization``.

A planned call (the second and later, and the bound calls after the third with the
same arrays) gives the bits of the first, unplanned one; a call that differs in any
way a plan depends on (an attribute, its type, the sign of a zero, a dtype, a shape,
strides, the parameters' values) gives the bits of a fresh unplanned call
(``plans.clear()`` first); read-only inputs make neither a new plan nor a compile.
"""

import ml_dtypes
import numpy as np
import pytest
from arrays import BFLOAT16, assert_identical
from test_compiles import kernel_signatures  # every kernel's compiled signatures

import normkernels as nk
from normkernels.ops import plans

FP8 = ml_dtypes.float8_e4m3fn
DTYPES = [np.dtype(np.float32), BFLOAT16]
DTYPE_IDS = ["float32", "bfloat16"]
SHAPES = [(1, 4096), (4, 4096), (3, 2, 256)]


@pytest.fixture(autouse=True)
def fresh_plans():
    plans.clear()
    yield
    plans.clear()


def _fresh(call):
    """``call()`` on the full path: no plan before it, none kept after it."""
    plans.clear()
    try:
        return call()
    finally:
        plans.clear()


def _same(a, b):
    """Bit-identical results (an array, or a tuple of them)."""
    a, b = (a, b) if isinstance(a, tuple) else ((a,), (b,))
    assert len(a) == len(b)
    for u, v in zip(a, b, strict=True):
        if u.dtype in (np.dtype(np.int8), np.dtype(FP8)):
            assert u.shape == v.shape and u.dtype == v.dtype
            assert u.tobytes() == v.tobytes()
        else:
            assert_identical(u, v)


def _data(rng, shape, dtype):
    x = rng.standard_normal(shape).astype(dtype)
    z = rng.standard_normal(shape).astype(dtype)
    w = rng.uniform(-1.5, 1.5, shape[-1]).astype(dtype)
    b = rng.standard_normal(shape[-1]).astype(dtype)
    return x, z, w, b


def _gemma(x, z, w, b, out=None, **kw):
    kw.setdefault("offset", 1.0)
    return nk.rms_normalization(x, w, epsilon=kw.pop("epsilon", 1e-6), out=out, **kw)


def _quantized(kind):
    def call(x, z, w, b, out=None, **kw):
        kw.setdefault("dtype", np.int8)
        if kind == "rms":
            return nk.quantized_rms_normalization(x, w, **kw)
        return nk.quantized_layer_normalization(x, w, b, **kw)

    return call


def _gated(x, z, w, b, out=None, **kw):
    return nk.gated_rms_normalization(x, z, w, kw.pop("bias", None), out=out, **kw)


OPS = {"gemma": _gemma, "quantized_rms": _quantized("rms"),
       "quantized_layer": _quantized("layer"), "gated": _gated}

# per operator: keyword sets a serving loop passes (each planned on its own)
VARIANTS = {
    "gemma": [{}, {"rounding": "llama"}, {"offset": 0.5}, {"offset": 1}],
    "quantized_rms": [{}, {"dtype": FP8}, {"dtype": FP8, "static_scale": 0.01},
                      {"group_size": 128}, {"scale_ub": 0.02}, {"offset": 1.0}],
    "quantized_layer": [{}, {"dtype": FP8}, {"dtype": np.int8, "static_scale": 0.02},
                        {"group_size": 64}],
    "gated": [{}, {"group_size": 128}, {"norm_before_gate": False}, {"epsilon": 1e-5}],
}


def _cases():
    for op, variants in VARIANTS.items():
        for k, kw in enumerate(variants):
            yield pytest.param(op, kw, id=f"{op}-{k}")


def _outs(op, x):
    """The ``out`` forms of ``op`` (the quantized operators take none)."""
    if op.startswith("quantized"):
        return [None]
    return [None, "out"] + (["x"] if op == "gated" else [])


@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("op,kw", list(_cases()))
def test_planned_calls_give_the_first_calls_bits(rng, op, kw, dtype, shape):
    x, z, w, b = _data(rng, shape, dtype)
    call = OPS[op]
    for form in _outs(op, x):
        plans.clear()
        xs = x.copy()
        out = {None: None, "out": np.empty_like(x), "x": xs}[form]
        first = call(xs, z, w, b, out=out, **kw)
        first = tuple(a.copy() for a in first) if isinstance(first, tuple) else first.copy()
        assert len(plans.stored_keys()) == 1
        for _ in range(6):  # planned, then (out given) bound to these very arrays
            if form == "x":
                xs[...] = x
            _same(call(xs, z, w, b, out=out, **kw), first)
        assert len(plans.stored_keys()) == 1
        # the same arrays with out: bound (gated: not with a zero epsilon)
        assert plans.bound_calls() == (form is not None and kw.get("epsilon", 1) != 0)


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("op", list(OPS))
def test_parameters_changed_in_place_are_read_again(rng, op, dtype):
    """A plan (and a bound call: Gemma's remakes offset + weight) reads the values."""
    x, z, w, b = _data(rng, (4, 512), dtype)
    out = None if op.startswith("quantized") else np.empty_like(x)
    call = OPS[op]
    for _ in range(5):
        call(x, z, w, b, out=out)
    w[:] = rng.uniform(-1, 1, w.size).astype(dtype)
    b[:] = rng.standard_normal(b.size).astype(dtype)
    x[:] = rng.standard_normal(x.shape).astype(dtype)
    got = call(x, z, w, b, out=out)
    got = tuple(a.copy() for a in got) if isinstance(got, tuple) else got.copy()
    _same(got, _fresh(lambda: call(x, z, w, b, out=None if out is None else out.copy())))


def _strided(a):
    """``a``'s values in a view whose rows are apart (other strides, rows contiguous)."""
    wide = np.zeros((*a.shape[:-1], 2 * a.shape[-1]), a.dtype)
    wide[..., :a.shape[-1]] = a
    return wide[..., :a.shape[-1]]


# (op, the first call's keywords, a second call's, how the arrays change)
CHANGES = [
    ("gemma", {}, {"offset": 0.5}, None),
    ("gemma", {}, {"offset": 1}, None),
    ("gemma", {}, {"offset": np.float64(1.0)}, None),
    ("gemma", {}, {"rounding": "llama"}, None),
    ("gemma", {}, {"epsilon": 1e-3}, None),
    ("gemma", {}, {}, "dtype"),
    ("gemma", {}, {}, "shape"),
    ("gemma", {}, {}, "strides"),
    ("gemma", {}, {}, "weight dtype"),
    ("gemma", {"offset": 0.0}, {"offset": 1.0}, None),
    ("quantized_rms", {}, {"dtype": FP8}, None),
    ("quantized_rms", {"dtype": FP8, "static_scale": 0.01},
     {"dtype": FP8, "static_scale": 0.02}, None),
    ("quantized_rms", {"dtype": FP8, "static_scale": 0.01}, {"dtype": FP8}, None),
    ("quantized_rms", {"group_size": 128}, {"group_size": 64}, None),
    ("quantized_rms", {"group_size": 128}, {}, None),
    ("quantized_rms", {}, {"scale_ub": 0.005}, None),
    ("quantized_rms", {}, {"epsilon": 1e-2}, None),
    ("quantized_rms", {"epsilon": 0.0}, {"epsilon": -0.0}, None),
    ("quantized_rms", {"dtype": FP8, "offset": 0.0}, {"dtype": FP8, "offset": -0.0},
     "zero weight"),
    ("quantized_rms", {}, {"offset": 1.0}, None),
    ("quantized_rms", {}, {}, "dtype"),
    ("quantized_rms", {}, {}, "shape"),
    ("quantized_rms", {}, {}, "strides"),
    ("quantized_layer", {}, {"dtype": FP8}, None),
    ("quantized_layer", {}, {}, "no bias"),
    ("quantized_layer", {}, {}, "strides"),
    ("gated", {}, {"epsilon": 1e-3}, None),
    ("gated", {"epsilon": 0.0}, {"epsilon": -0.0}, "zero x"),
    ("gated", {}, {"group_size": 128}, None),
    ("gated", {}, {"norm_before_gate": False}, None),
    ("gated", {}, {"bias": "b"}, None),
    ("gated", {}, {}, "dtype"),
    ("gated", {}, {}, "shape"),
    ("gated", {}, {}, "strides"),
]


def _changed(rng, how, x, z, w, b):
    if how == "dtype":
        return tuple(a.astype(np.float64) for a in (x, z, w, b))
    if how == "shape":
        return tuple(a[..., :256].copy() for a in (x, z, w, b))
    if how == "strides":
        return _strided(x), _strided(z), w, b
    if how == "weight dtype":
        return x, z, w.astype(np.float64), b
    if how == "zero weight":
        return x, z, np.full_like(w, -0.0), b
    if how == "zero x":
        return np.zeros_like(x), z, w, b
    if how == "no bias":
        return x, z, w, None
    return x, z, w, b


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("op,first_kw,kw,how", CHANGES,
                         ids=[f"{c[0]}-{k}" for k, c in enumerate(CHANGES)])
def test_a_plan_serves_only_its_own_calls(rng, op, first_kw, kw, how, dtype):
    x, z, w, b = _data(rng, (4, 512), dtype)
    call = OPS[op]
    kw = {k: (b if v == "b" else v) for k, v in kw.items()}
    for _ in range(3):
        call(x, z, w, b, **first_kw)
    assert len(plans.stored_keys()) == 1
    args = _changed(rng, how, x, z, w, b)
    got = call(*args, **kw)
    got = tuple(a.copy() for a in got) if isinstance(got, tuple) else got.copy()
    _same(got, _fresh(lambda: call(*args, **kw)))
    planned = call(*args, **kw)  # and the new call's own plan, once made
    _same(planned, got)


def _read_only(a):
    a = a.copy()
    a.flags.writeable = False
    return a


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("op,kw", list(_cases()))
def test_read_only_inputs_make_no_plan_and_no_compile(rng, op, kw, dtype):
    x, z, w, b = _data(rng, (4, 512), dtype)
    call = OPS[op]
    for _ in range(3):
        want = call(x, z, w, b, **kw)
    keys, compiled = plans.stored_keys(), kernel_signatures()
    frozen = [_read_only(a) for a in (x, z, w, b)]
    for _ in range(3):
        _same(call(*frozen, **kw), want)
    assert plans.stored_keys() == keys
    assert kernel_signatures() == compiled


def test_a_read_only_gated_weight_compiles_nothing(rng):
    """engine/numba_gated.py's tables() hands the kernels writeable weights."""
    x, z, w, b = _data(rng, (4, 512), np.float32)
    _gated(x, z, w, b)
    compiled = kernel_signatures()
    _gated(x, z, _read_only(w), b)
    assert kernel_signatures() == compiled


def test_a_read_only_out_or_residual_gets_the_full_checks(rng):
    x, z, w, b = _data(rng, (1, 4096), np.float32)
    out = np.empty_like(x)
    for _ in range(4):
        _gemma(x, z, w, b, out=out)
        _gated(x, z, w, b, out=out)
    out.flags.writeable = False
    for call in (_gemma, _gated):
        with pytest.raises(ValueError, match="read-only"):
            call(x, z, w, b, out=out)
    r = rng.standard_normal(x.shape).astype(np.float32)
    for _ in range(3):
        nk.quantized_rms_normalization(x, w, dtype=np.int8, residual=r)
    r.flags.writeable = False
    with pytest.raises(ValueError, match="read-only"):
        nk.quantized_rms_normalization(x, w, dtype=np.int8, residual=r)


def test_a_planned_quantized_call_with_a_residual(rng):
    x, _, w, _ = _data(rng, (4, 4096), BFLOAT16)
    r = rng.standard_normal(x.shape).astype(BFLOAT16)
    r0 = r.copy()
    first = nk.quantized_rms_normalization(x, w, dtype=np.int8, residual=r)
    first_r = r.copy()
    r[...] = r0
    _same(nk.quantized_rms_normalization(x, w, dtype=np.int8, residual=r), first)
    _same(r, first_r)
    with pytest.raises(ValueError, match="shares memory"):  # x as the residual: full checks
        nk.quantized_rms_normalization(r, w, dtype=np.int8, residual=r)


def test_a_planned_int8_call_reports_nan(rng):
    x, _, w, _ = _data(rng, (4, 512), np.float32)
    nk.quantized_rms_normalization(x, w, dtype=np.int8)
    x[2, 7] = np.nan
    with pytest.raises(ValueError, match="NaN quotients y / s in 1 row"):
        nk.quantized_rms_normalization(x, w, dtype=np.int8)
    assert len(plans.stored_keys()) == 1

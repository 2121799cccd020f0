"""The activation= and add= epilogues of LayerNormalization and RMSNormalization:
``Y = act(normalized * scale + B + add)`` in the row kernels' one pass, against the
float64 oracle (tests/oracle.py), bit for bit across every engine path (fused serial,
parallel and streaming, split, from statistics), the vector bodies and the scalar
heads and tails, and unchanged bits without an epilogue."""

import numpy as np
import pytest
from arrays import FLOAT_IDS, FLOATS, assert_identical
from oracle import (
    activation,
    activation_tolerance,
    assert_close,
    row_norm,
    row_tolerance,
    ulp,
    unit_roundoff,
)

import normkernels as nk
from normkernels import reference
from normkernels.engine import policy
from normkernels.engine.numba_engine import ENGINE
from normkernels.kernels import activations
from normkernels.ops import layer_normalization as ln_spec
from normkernels.ops import rms_normalization as rms_spec
from normkernels.ops import rows as rows_spec

F16, BF16, F32, F64 = FLOATS
EPS = 1e-5
KINDS = [k for k in activations.KINDS if k != "none"]  # "gelu" too, where it exists
# (shape, axis): odd rows (scalar heads and tails around the vectors), rows of one
# element, 1-D, 3-D normalized from axis 1 and from the last axis, rows of 300
SHAPES = {"odd": ((5, 37), -1), "k1": ((7, 1), -1), "1d": ((71,), 0), "3d-axis1": ((3, 4, 11), 1),
          "3d-last": ((3, 4, 11), -1), "rows-300": ((2, 300), -1)}


def _data(rng, shape, axis, dtype, offset=3.0, spread=(0.5, 2)):
    """X whose rows each have their own mean and spread, and per-column parameters."""
    a = axis % len(shape)
    lead = shape[:a] + (1,) * (len(shape) - a)
    X = (rng.standard_normal(shape) * rng.uniform(*spread, lead)
         + rng.uniform(-offset, offset, lead)).astype(dtype)
    cols = shape[a:]
    scale = (rng.uniform(0.5, 2, cols) * rng.choice([-1, 1], cols)).astype(dtype)
    return X, scale, rng.standard_normal(cols).astype(dtype)


def _call(op, X, scale, B, axis, **kw):
    if op == "layer":
        return nk.layer_normalization(X, scale, B, axis=axis, **kw)
    return nk.rms_normalization(X, scale, axis=axis, **kw)


def expected(op, X, scale, B, axis, kind, add):
    """The oracle's ``act(y + add)`` and its tolerance: the row normalization's bound in
    the activations' compute dtype (float32 unless X is float64), the rounding of the
    sum (in the row arithmetic, then to float32 for float32 X), then the activation's
    bound, or half an ulp of a 16-bit Y without one."""
    centered = op == "layer"
    B = B if centered else None
    y, mean, var = row_norm(X, scale, B, EPS, axis, centered=centered)
    cd = F64 if X.dtype == F64 else F32
    tol = row_tolerance(X, scale, B, mean, var, EPS, cd, centered=centered)
    if add is not None:
        y = y + add.astype(F64)
        tol = tol + 2 * unit_roundoff(cd) * np.abs(y)
    if kind is None:
        if X.dtype.itemsize == 2:
            tol = tol + 0.5 * ulp(np.abs(y) + tol, X.dtype)
        return y, tol
    return activation(kind, y), activation_tolerance(kind, y, tol, X.dtype)


@pytest.mark.parametrize("with_add", [False, True], ids=["no-add", "add"])
@pytest.mark.parametrize("kind", [None, *KINDS])
@pytest.mark.parametrize("dtype", FLOATS, ids=FLOAT_IDS)
@pytest.mark.parametrize("op", ["layer", "rms"])
def test_matches_oracle(rng, op, dtype, kind, with_add):
    for shape_id, (shape, axis) in SHAPES.items():
        X, scale, B = _data(rng, shape, axis, dtype)
        add = (rng.standard_normal(shape) * 2).astype(dtype) if with_add else None
        before = X.copy()
        Y = _call(op, X, scale, B, axis, activation=kind, add=add)
        assert Y.dtype == X.dtype and Y.shape == X.shape
        assert_identical(X, before)
        exact, tol = expected(op, X, scale, B, axis, kind, add)
        assert_close(Y, exact, tol, f"{shape_id} {kind} add={with_add}")


@pytest.mark.parametrize("kind", ["relu", "silu"])
@pytest.mark.parametrize("dtype", FLOATS, ids=FLOAT_IDS)
@pytest.mark.parametrize("op", ["layer", "rms"])
def test_large_offsets_and_strided_views(rng, op, dtype, kind):
    """Rows of mean 1e4 and std 1 (the mean's residual matters), read from a view with
    a row stride (in place) and from element-strided and transposed views (copied),
    the residual likewise: the same bits as from contiguous copies, within the
    oracle's bound."""
    big = np.empty((4, 2 * 6, 97), dtype)
    X = big[:, ::2]  # rows of 97 with a row stride of 194
    X[...] = _data(rng, (4, 6, 97), -1, dtype, offset=0.0)[0].astype(F64) + 1e4
    _, scale, B = _data(rng, (4, 6, 97), -1, dtype)
    R = (rng.standard_normal(X.shape) * 3).astype(dtype)
    want = _call(op, np.ascontiguousarray(X), scale, B, -1, activation=kind, add=R)
    exact, tol = expected(op, X, scale, B, -1, kind, R)
    assert_close(want, exact, tol)
    element_strided = np.empty((4, 6, 2 * 97), dtype)[..., ::2]
    element_strided[...] = R
    transposed = np.asfortranarray(R)
    for x in (X, np.asfortranarray(X)):
        for r in (R, element_strided, transposed, np.ascontiguousarray(R)):
            assert_identical(_call(op, x, scale, B, -1, activation=kind, add=r), want)
    wide = np.empty((4, 3 * 6, 97), dtype)[:, ::3]  # read in place, a row stride of its own
    wide[...] = R
    assert_identical(_call(op, X, scale, B, -1, activation=kind, add=wide), want)


# --- every engine path gives the same bits ---------------------------------------------

SPLIT = {"SPLIT_ROWS_PER_THREAD": 1 << 20}  # every row count splits
EPILOGUES = {"silu+add": ("silu", True), "relu": ("relu", False), "add": (None, True)}


@pytest.fixture
def routes(monkeypatch):
    taken = []
    monkeypatch.setattr(policy, "_trace", taken.append)
    monkeypatch.setattr(policy, "ASLEEP_SERIAL_FACTOR", 0)
    return taken


def _engine_rows(centered, x, scale, B, path, kind, res):
    """The engine's call on 2-D rows: ``(Y, mean, var)``."""
    y = np.empty_like(x)
    mean, var = ENGINE.normalize_rows(x, y, scale, B if centered else None, EPS, centered,
                                      path=path, act=activations.for_kind(kind), res=res)
    return y, mean, var


@pytest.mark.parametrize("epilogue", EPILOGUES)
@pytest.mark.parametrize("dtype", FLOATS, ids=FLOAT_IDS)
@pytest.mark.parametrize("op", ["layer", "rms"])
def test_every_path_gives_the_same_bits(rng, monkeypatch, routes, op, dtype, epilogue):
    """Fused rows (serial, parallel, streaming), split rows (parallel, streaming) and the
    normalize pass from statistics (serial, parallel, streaming) on rows of 203 (odd:
    vectors, scalar heads at every alignment, tails) give the same bits, and the
    statistics are those of the call without an epilogue."""
    kind, with_add = EPILOGUES[epilogue]
    centered = op == "layer"
    X, scale, B = _data(rng, (24, 203), -1, dtype)
    R = (rng.standard_normal(X.shape) * 2).astype(dtype) if with_add else None
    want, mean, var = _engine_rows(centered, X, scale, B, "serial", kind, R)
    exact, tol = expected(op, X, scale, B, -1, kind, R)
    assert_close(want, exact, tol)
    plain = _engine_rows(centered, X, scale, B, "serial", None, None)
    assert_identical(mean, plain[1])
    assert_identical(var, plain[2])
    for path in ("parallel", "streaming"):
        assert_identical(_engine_rows(centered, X, scale, B, path, kind, R)[0], want)
    assert {"rows/fused/serial", "rows/fused/parallel"} <= set(routes)
    with monkeypatch.context() as m:
        for name, value in SPLIT.items():
            m.setattr(policy, name, value)
        for path in ("parallel", "streaming"):
            routes.clear()
            got, m_split, v_split = _engine_rows(centered, X, scale, B, path, kind, R)
            assert any(r.startswith("rows/split/") for r in routes), routes
            assert_identical(got, want)
            assert_identical(m_split, mean)
            assert_identical(v_split, var)
    for path in ("serial", "parallel", "streaming"):
        routes.clear()
        y = np.empty_like(X)
        ENGINE.rows_from_statistics(X, y, scale, B if centered else None, EPS, centered, mean,
                                    var, path, act=activations.for_kind(kind), res=R)
        assert any(r.startswith("rows/from-statistics/") for r in routes), routes
        assert_identical(y, want)
    # offsets of a row: the output at every alignment of y (the heads change)
    for lo in (1, 3, 17):
        xs, ys = X[:, lo:], np.empty((24, 203 - lo), dtype)
        ENGINE.normalize_rows(xs, ys, scale[lo:], B[lo:] if centered else None, EPS, centered,
                              path="serial", act=activations.for_kind(kind),
                              res=None if R is None else R[:, lo:])
        exact, tol = expected(op, xs, scale[lo:], B[lo:], -1, kind,
                              None if R is None else R[:, lo:])
        assert_close(ys, exact, tol, f"columns from {lo}")


@pytest.mark.parametrize("kind", ["silu", "relu"])
@pytest.mark.parametrize("dtype", [F32, BF16], ids=["float32", "bfloat16"])
def test_split_path_of_a_long_row(rng, routes, dtype, kind):
    """One row of 70001 on the parallel path splits (statistics in chunks, the normalize
    pass over runs of columns): the bits of the fused serial kernel."""
    X, scale, B = _data(rng, (1, 70001), -1, dtype)
    R = rng.standard_normal(X.shape).astype(dtype)
    got = ln_spec.layer_normalization(X, scale, B, activation=kind, add=R, engine=ENGINE,
                                      path="parallel")
    assert "rows/split/parallel" in routes
    assert_identical(got, _engine_rows(True, X, scale, B, "serial", kind, R)[0])
    exact, tol = expected("layer", X, scale, B, -1, kind, R)
    assert_close(got, exact, tol)


@pytest.mark.parametrize("kind", [None, *KINDS])
@pytest.mark.parametrize("dtype", FLOATS, ids=FLOAT_IDS)
def test_twin_given_the_kernels_statistics(rng, dtype, kind):
    """The NumPy twin's normalize pass (given the kernels' statistics): the kernels'
    bits up to the activation (none, ReLU: all of them), and its activation (NumPy's
    exp) within the activation's bound of the same value."""
    X, scale, B = _data(rng, (9, 45), -1, dtype)
    R = rng.standard_normal(X.shape).astype(dtype)
    got, mean, var = _engine_rows(True, X, scale, B, "serial", kind, R)
    twin = np.empty_like(X)
    reference.normalize_rows_from(X, twin, scale, B, EPS, True, mean, var, kind, R)
    if kind in (None, "relu"):
        assert_identical(got, twin)
        return
    # the value the activation sees: the sum rounded to float32 unless X is float64
    pre = np.empty(X.shape, F64 if dtype == F64 else F32)
    reference.normalize_rows_from(X, pre, scale, B, EPS, True, mean, var, None, R)
    tol = activation_tolerance(kind, pre.astype(F64), 0.0, dtype)
    assert_close(got, activation(kind, pre), tol, "kernels")
    # the twin's own evaluation (NumPy's exp, math.erfc): a few units more
    slack = 32 * unit_roundoff(F64 if dtype == F64 else F32) * np.abs(pre.astype(F64))
    tol = activation_tolerance(kind, pre.astype(F64), slack, dtype)
    assert_close(twin, activation(kind, pre), tol, "twin")
    spec_twin = reference.layer_normalization(X, scale, B, activation=kind, add=R)
    exact, tol = expected("layer", X, scale, B, -1, kind, R)
    assert_close(spec_twin, exact, tol, "twin through the spec layer")


# --- the epilogue sees the plain call's value; no epilogue keeps the old bits -----------


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("dtype", [F32, F64], ids=["float32", "float64"])
@pytest.mark.parametrize("op", ["layer", "rms"])
def test_activation_of_the_plain_y(rng, op, dtype, kind):
    """float32/float64 Y: the activation of the plain call's Y exactly as the
    activations compute it (the per-channel loop's epilogue on Y itself); float64 with
    add: ``act(Y + add)`` of the plain Y, bit for bit (one float64 rounding of the sum)."""
    X, scale, B = _data(rng, (6, 83), -1, dtype)
    plain = _call(op, X, scale, B, -1)
    one, zero = np.ones(1, dtype), np.zeros(1, dtype)

    def act_of(y):
        out = np.empty_like(y)
        ENGINE.scale_shift(np.ascontiguousarray(y), out, 1, y.size, zero, one,
                           np.full(1, -0.0, dtype), "serial", act=activations.for_kind(kind))
        return out

    assert_identical(_call(op, X, scale, B, -1, activation=kind), act_of(plain))
    if dtype == F64:
        R = rng.standard_normal(X.shape)
        assert_identical(_call(op, X, scale, B, -1, add=R), plain + R)
        assert_identical(_call(op, X, scale, B, -1, activation=kind, add=R), act_of(plain + R))


@pytest.mark.parametrize("dtype", FLOATS, ids=FLOAT_IDS)
@pytest.mark.parametrize("op", ["layer", "rms"])
def test_no_epilogue_keeps_the_bits(rng, op, dtype):
    """activation=None and add=None are the call without them, which is the twin's
    arithmetic on the kernels' statistics bit for bit (the rule the plain kernels always
    followed), on the fused and split paths; Mean and InvStdDev do not depend on the
    epilogue."""
    centered = op == "layer"
    for shape in ((5, 37), (3, 300), (40, 7)):
        X, scale, B = _data(rng, shape, -1, dtype)
        plain = _call(op, X, scale, B, -1)
        assert_identical(_call(op, X, scale, B, -1, activation=None, add=None), plain)
        for path in ("serial", "parallel"):
            y, mean, var = _engine_rows(centered, X, scale, B, path, None, None)
            twin = np.empty_like(X)
            reference.normalize_rows_from(X, twin, scale, B if centered else None, EPS,
                                          centered, mean, var)
            assert_identical(y, twin)
            assert_identical(y, plain)
    X, scale, B = _data(rng, (4, 50), -1, dtype)
    outputs = nk.layer_normalization(X, scale, B, num_outputs=3)
    fused = nk.layer_normalization(X, scale, B, num_outputs=3, activation="silu", add=X)
    for a, b in zip(outputs[1:], fused[1:], strict=True):
        assert_identical(a, b)


def test_no_extra_compile_without_an_epilogue(rng):
    """Calls without an epilogue compile one signature of each kernel, whatever the
    epilogue calls before them compiled."""
    from normkernels.kernels import rows

    X, scale, B = _data(rng, (3, 40), -1, F32)
    nk.layer_normalization(X, scale, B)
    before = set(rows.rows_serial.signatures)
    nk.layer_normalization(X, scale, B, activation=None, add=None)
    nk.layer_normalization(X[::-1], scale, B)  # a view: the same kernel types
    assert set(rows.rows_serial.signatures) == before
    plain = [s for s in before if str(s[-1]) == "Activation(none)" and str(s[-2]) == "none"]
    assert len(plain) >= 1


# --- the general path (parameters along the leading axes; RMS with another scale dtype) --


@pytest.mark.parametrize("kind", ["relu", "silu"])
def test_general_path(rng, kind):
    """Parameters that vary along the leading axes, and RMS with scale of another dtype
    (Y of scale's dtype): NumPy applies the parameters and the residual, the engine the
    activation; within the oracle's bound, and the fused path's bits where the
    parameters are the same along the leading axes."""
    X, _, _ = _data(rng, (4, 6, 33), -1, F32)
    R = rng.standard_normal(X.shape).astype(F32)
    scale = rng.uniform(0.5, 2, (4, 1, 33)).astype(F32)  # per sample: the general path
    B = rng.standard_normal((4, 1, 33)).astype(F32)
    Y = nk.layer_normalization(X, scale, B, activation=kind, add=R)
    exact, tol = expected("layer", X, np.broadcast_to(scale, X.shape),
                          np.broadcast_to(B, X.shape), -1, kind, R)
    assert_close(Y, exact, tol)
    # scale broadcast along the leading axes but equal there: the fused path's bits
    s1, b1 = scale[:1], B[:1]
    fused = nk.layer_normalization(X, s1.reshape(1, 33), b1.reshape(1, 33), activation=kind,
                                   add=R)
    general = nk.layer_normalization(X, np.repeat(s1, 4, 0), np.repeat(b1, 4, 0),
                                     activation=kind, add=R)
    assert_identical(general, fused)
    for s_dtype in (F64, BF16):  # RMS, T != V: Y of scale's dtype
        s = rng.uniform(0.5, 2, 33).astype(s_dtype)
        Y = nk.rms_normalization(X, s, activation=kind, add=R)
        assert Y.dtype == s_dtype
        y, mean, var = row_norm(X, s, None, EPS, -1, centered=False)
        y = y + R.astype(F64)
        tol = row_tolerance(X, s, None, mean, var, EPS, F32, centered=False)
        tol = tol + 2 * unit_roundoff(F32) * np.abs(y)
        assert_close(Y, activation(kind, y), activation_tolerance(kind, y, tol, s_dtype))


# --- bind, out=, errors -----------------------------------------------------------------


@pytest.mark.parametrize("op", ["layer", "rms"])
def test_bind_out_and_in_place(rng, op):
    X, scale, B = _data(rng, (8, 64), -1, F32)
    R = rng.standard_normal(X.shape).astype(F32)
    want = _call(op, X, scale, B, -1, activation="silu", add=R)
    out = np.empty_like(X)
    args = (X, scale, B) if op == "layer" else (X, scale)
    fn = nk.layer_normalization if op == "layer" else nk.rms_normalization
    call = nk.bind(fn, *args, activation="silu", add=R, out=out)
    assert_identical(out, want)
    R[...] = rng.standard_normal(R.shape)  # the bound call reads the arrays' contents
    X[...] = X[::-1]
    assert call() is out
    want = _call(op, X, scale, B, -1, activation="silu", add=R)
    assert_identical(out, want)
    Rc = R.copy()  # the residual stream updated in place
    assert _call(op, X, scale, B, -1, activation="silu", add=Rc, out=Rc) is Rc
    assert_identical(Rc, want)
    Xc = X.copy()
    assert _call(op, Xc, scale, B, -1, activation="silu", add=R, out=Xc) is Xc
    assert_identical(Xc, want)
    # a plan of the plain call never serves an epilogue call, nor the reverse
    plain = _call(op, X, scale, B, -1)
    for kind in (None, "relu", None, "relu"):
        got = _call(op, X, scale, B, -1, activation=kind, out=out)
        assert_identical(got, plain if kind is None else np.where(plain < 0, F32.type(0),
                                                                  plain))


@pytest.mark.parametrize("op", ["layer", "rms"])
def test_errors(rng, op):
    X, scale, B = _data(rng, (4, 8), -1, F32)
    fn = ln_spec.layer_normalization if op == "layer" else rms_spec.rms_normalization
    args = (X, scale, B) if op == "layer" else (X, scale)
    for bad in ("gelu_erf", "SiLU", 1, True):
        with pytest.raises(ValueError, match="activation must be None or one of"):
            fn(*args, activation=bad, engine=ENGINE)
    for bad in (X[:2], X.astype(F64), X.reshape(8, 4), np.ones(8, F32), object(), "X"):
        with pytest.raises(ValueError, match="add must have X's shape and dtype"):
            fn(*args, add=bad, engine=ENGINE)
    big = np.zeros((5, 8), F32)
    with pytest.raises(ValueError, match="out overlaps add"):
        fn(*args, add=big[:4], out=big[1:], engine=ENGINE)
    name = "LayerNormalization" if op == "layer" else "RMSNormalization"
    with pytest.raises(ValueError, match=name):
        fn(*args, activation="tanh", engine=ENGINE)


def test_rows_spec_keeps_the_epilogue_off_plain_engines(rng):
    """An engine call without an epilogue passes no epilogue arguments (engines written
    before epilogues keep working)."""
    seen = []

    class Plain:
        def normalize_rows(self, x, y, scale, B, epsilon, centered, skip=None, bias=None,
                           sums=None, path=None):
            seen.append(x.shape)
            return ENGINE.normalize_rows(x, y, scale, B, epsilon, centered, path=path)

    X, scale, B = _data(rng, (3, 16), -1, F32)
    Y = rows_spec.normalize(X, 1, scale, B, EPS, True, Plain())[0]
    assert seen == [(3, 16)]
    assert_identical(Y, nk.layer_normalization(X, scale, B))

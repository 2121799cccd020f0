"""LpNormalization (opsets 1, 22) and LRN (opsets 1, 13): the kernels against an
independent extended-precision oracle written from the ONNX text, against the NumPy
twin, on every route, and on hostile input.

Tolerances: float32 and float64 within 2 ulps of the exact value (the oracle computes
in long double), float64 plus the error bound of its float64 sums (the norm's K terms,
the window's size); float16 and bfloat16 within 1 ulp of the exact value rounded to
the dtype (the kernels round a float64 result once).
"""

import math
import subprocess
import sys
import textwrap

import ml_dtypes
import numpy as np
import pytest
from arrays import BFLOAT16, FLOAT_IDS, FLOATS, assert_identical
from oracle import WIDE, lp_oracle, lrn_oracle, ulp_close, wide_ulp

import normkernels
from normkernels import reference
from normkernels.engine import policy
from normkernels.engine.numba_engine import ENGINE
from normkernels.ops import lp_normalization as lp_spec
from normkernels.ops import lrn as lrn_spec

F16, F32, F64 = np.dtype(np.float16), np.dtype(np.float32), np.dtype(np.float64)
def close_to_twin(got, twin):
    """The twin's norms are NumPy's float64 sums: the same bits after rounding but at
    rare ties (narrow dtypes), within a few float64 roundings of the norm (float64)."""
    assert got.dtype == twin.dtype and got.shape == twin.shape
    g, t = got.astype(np.float64).astype(WIDE), twin.astype(np.float64).astype(WIDE)
    assert np.array_equal(np.isnan(g), np.isnan(t))
    bound = (4 if got.dtype == F64 else 1) * wide_ulp(t, got.dtype)
    assert ((np.abs(g - t) <= bound) | np.isnan(t) | (g == t)).all()


def data(rng, shape, dtype, scale=1.0):
    return (rng.standard_normal(shape) * scale).astype(dtype)


def spaced(shape, dtype):
    """Distinct, mostly nonzero values of either sign (a strided pattern)."""
    n = math.prod(shape)
    return ((np.arange(n) % 23 - 11) * 0.37 + 0.05).reshape(shape).astype(dtype)


@pytest.fixture
def routes(monkeypatch):
    """The engine routes taken during the test."""
    taken = []
    monkeypatch.setattr(policy, "_trace", taken.append)
    return taken


DTYPES = pytest.mark.parametrize("dtype", FLOATS, ids=FLOAT_IDS)

# --- LpNormalization ---

LP_SHAPES = [(7,), (5, 3), (2, 3, 5), (2, 3, 4, 5), (1, 3, 2, 3, 4)]
LP_CASES = [(shape, axis) for shape in LP_SHAPES for axis in range(-len(shape), 0)]


@DTYPES
@pytest.mark.parametrize("p", [1, 2])
@pytest.mark.parametrize("shape,axis", LP_CASES,
                         ids=[f"{len(s)}d-axis{a}" for s, a in LP_CASES])
def test_lp_matches_oracle_and_twin(rng, dtype, p, shape, axis):
    X = data(rng, shape, dtype)
    before = X.copy()
    Y = normkernels.lp_normalization(X, axis=axis, p=p)
    assert_identical(X, before)
    ulp_close(Y, lp_oracle(X, axis, p), dtype, terms=X.shape[axis])
    close_to_twin(Y, reference.lp_normalization(X, axis=axis, p=p))


LONG_CASES = {  # rows longer than SHORT_ROW, chunked columns, a tensor above the serial limit
    "long-rows": ((3, 700), -1),
    "chunked-columns": ((2, 9, 1100), 1),
    "small-inner": ((50, 6, 3), 1),
    "parallel-rows": ((300, 260), 1),
    "parallel-columns": ((4, 130, 150), 1),
}


@DTYPES
@pytest.mark.parametrize("name", list(LONG_CASES))
def test_lp_long_and_parallel(rng, dtype, name):
    shape, axis = LONG_CASES[name]
    X = data(rng, shape, dtype)
    for p in (1, 2):
        Y = normkernels.lp_normalization(X, axis=axis, p=p)
        ulp_close(Y, lp_oracle(X, axis, p), dtype, terms=X.shape[axis])
        close_to_twin(Y, reference.lp_normalization(X, axis=axis, p=p))


@pytest.mark.parametrize("route,shape,axis,path", [
    ("lp/rows/serial", (6, 70), -1, "serial"),
    ("lp/rows/parallel", (6, 70), -1, "parallel"),
    ("lp/columns/serial", (3, 5, 40), 1, "serial"),
    ("lp/columns/parallel", (3, 5, 40), 1, "parallel"),
    ("lp/columns/parallel", (3, 5, 40), 0, "streaming"),
])
def test_lp_routes(rng, routes, route, shape, axis, path):
    for dtype in (F32, BFLOAT16):
        X = data(rng, shape, dtype)
        Y = lp_spec.lp_normalization(X, axis=axis, p=2, engine=ENGINE, path=path)
        assert route in routes
        assert set(routes) <= set(policy.ROUTES)
        ulp_close(Y, lp_oracle(X, axis, 2), dtype, terms=X.shape[axis])
        serial = lp_spec.lp_normalization(X, axis=axis, p=2, engine=ENGINE, path="serial")
        assert_identical(Y, serial)  # every path gives the same bits


@DTYPES
def test_lp_views(rng, dtype):
    """Strided, transposed (read in place: a permutation of C order) and reversed views."""
    base = data(rng, (6, 8, 10), dtype)
    views = [base[::2, 1:, ::3], base.transpose(2, 0, 1), base[:, ::-1], base[..., 3],
             np.asfortranarray(base)]
    for X in views:
        for axis in range(X.ndim):
            Y = normkernels.lp_normalization(X, axis=axis, p=2)
            ulp_close(Y, lp_oracle(X, axis, 2), dtype, terms=X.shape[axis])
    T = base.transpose(2, 0, 1)
    assert normkernels.lp_normalization(T, axis=0).strides == T.strides  # X's memory order


def test_lp_large_and_tiny_float64():
    cases = [[1e200, 1e200], [1.7e308, 1.7e308, -1e308], [1e300] * 5, [1e200, 1.0, -3e199],
             [5e-324, 5e-324], [1e-320, -3e-320, 0.0], [1e-160, 2e-160], [1e-300, 1.0]]
    for values in cases:
        X = np.array(values)
        for p in (1, 2):
            Y = normkernels.lp_normalization(X, p=p)
            ulp_close(Y, lp_oracle(X, -1, p), F64, terms=X.shape[-1])
            close_to_twin(Y, reference.lp_normalization(X, p=p))
    Y = normkernels.lp_normalization(np.array([1e200, 1e200]))
    assert np.allclose(Y, [math.sqrt(0.5)] * 2, rtol=0, atol=2e-16)
    columns = np.array([[1e200, 5e-324, 1.0], [1e200, 5e-324, 0.0]])  # the columns loop
    ulp_close(normkernels.lp_normalization(columns, axis=0), lp_oracle(columns, 0, 2), F64,
                 terms=2)


@DTYPES
def test_lp_large_values(dtype):
    top = float(ml_dtypes.finfo(dtype).max)
    X = np.array([[top, top, -top], [top / 2, 1.0, 0.0]]).astype(dtype)
    for p in (1, 2):
        for axis in (0, 1):
            ulp_close(normkernels.lp_normalization(X, axis=axis, p=p),
                         lp_oracle(X, axis, p), dtype, terms=X.shape[axis])


@DTYPES
def test_lp_zero_vectors_give_zeros(rng, dtype):
    X = data(rng, (4, 6, 5), dtype)
    X[1] = 0
    X[2, :, 3] = 0
    X[3, 2, :] = -0.0
    for axis in (0, 1, 2):
        for p in (1, 2):
            Y = normkernels.lp_normalization(X, axis=axis, p=p)
            assert not np.isnan(Y.astype(np.float64)).any()
            ulp_close(Y, lp_oracle(X, axis, p), dtype, terms=X.shape[axis])
    Y = normkernels.lp_normalization(np.array([-0.0, 0.0, -0.0], dtype))
    assert np.array_equal(np.signbit(Y.astype(np.float64)), [True, False, True])


@DTYPES
def test_lp_nan_stays_in_its_vector(rng, dtype):
    X = data(rng, (5, 40), dtype)
    X[2, 7] = np.nan
    X[4, 0] = np.inf
    for axis in (0, 1):
        Y = normkernels.lp_normalization(X, axis=axis).astype(np.float64)
        exact = lp_oracle(X, axis, 2)
        ulp_close(Y.astype(dtype), exact, dtype, terms=X.shape[axis])
        nan_vectors = np.isnan(Y).any(axis=axis)
        assert nan_vectors.sum() == 2, "NaN leaked out of its vector"


@DTYPES
def test_lp_out_and_in_place(rng, dtype):
    X = data(rng, (4, 5, 6), dtype)
    exact = lp_oracle(X, 1, 2)
    out = np.empty_like(X)
    assert normkernels.lp_normalization(X, axis=1, out=out) is out
    ulp_close(out, exact, dtype, terms=5)
    strided = np.empty((4, 5, 12), dtype)[..., ::2]
    assert normkernels.lp_normalization(X, axis=1, out=strided) is strided
    assert_identical(strided, out)
    Z = X.copy()
    assert normkernels.lp_normalization(Z, axis=1, out=Z) is Z
    assert_identical(Z, out)
    V = X.copy().transpose(2, 0, 1)[::2]  # in place on a strided view (copied inside)
    want = normkernels.lp_normalization(V, axis=2)
    normkernels.lp_normalization(V, axis=2, out=V)
    assert_identical(V, want)
    buffer = data(rng, 41, dtype)  # out overlaps X partially: read from a copy
    src, dst = buffer[:40], buffer[1:]
    exact = lp_oracle(src.copy(), -1, 1)
    normkernels.lp_normalization(src, p=1, out=dst)
    ulp_close(dst, exact, dtype, terms=40)


def test_lp_opsets_and_dtypes():
    X = np.array([[3.0, -4.0]], ml_dtypes.bfloat16)
    ulp_close(normkernels.lp_normalization(X), lp_oracle(X, -1, 2), BFLOAT16)
    with pytest.raises(TypeError, match=r"LpNormalization-1: input has dtype bfloat16"):
        normkernels.lp_normalization(X, opset=21)
    for opset in (1, 21):
        Y = normkernels.lp_normalization(X.astype(np.float16), opset=opset, p=1)
        assert np.array_equal(Y, np.array([[3 / 7, -4 / 7]], np.float16))


ROUNDING_CASES = [1 + 2**-8 + 2**-30, 1 + 2**-8, 1 + 2**-8 - 2**-30, -(1 + 2**-8 + 2**-40),
                  1 + 2**-11 + 2**-40, 1 + 2**-11, 3 * 2**-135 + 2**-160, 2**-150, -2**-160,
                  7e-8, 65519.99, 65520.0, 3.4e38, 3.3961e38, 1e300, np.inf, -np.inf, np.nan,
                  0.0, -0.0]


@pytest.mark.parametrize("dtype", [F16, BFLOAT16], ids=["float16", "bfloat16"])
def test_float64_results_round_once_to_16_bits(dtype):
    """The kernels' store of a float64 result (round-to-odd to float32, then to nearest
    even) is the correct rounding: 1 + 2**-8 + 2**-30 is bfloat16 1 + 2**-7, where a
    float32 step first (ml_dtypes' float64 cast) gives 1."""
    from numba import njit

    from normkernels.dtypes import storage_view
    from normkernels.kernels import lp as lp_kernels

    @njit
    def store_all(arr, values):
        for i in range(values.size):
            lp_kernels.store_rounded(arr, i, values[i])

    values = np.array(ROUNDING_CASES)
    got = np.empty(values.size, dtype)
    store_all(storage_view(got), values)
    assert_identical(got, reference.round_once(values, dtype))
    if dtype == F16:  # NumPy rounds float64 to float16 correctly
        with np.errstate(over="ignore"):
            assert_identical(got, values.astype(F16))
    else:
        assert float(got[0]) == 1 + 2**-7 and float(got[1]) == 1.0 and float(got[2]) == 1.0
        assert float(values[:1].astype(BFLOAT16)[0]) == 1.0  # why round_once exists


@pytest.mark.parametrize("kwargs,error,match", [
    ({"p": 3}, ValueError, r"LpNormalization-22: p must be 1 or 2 .*got 3"),
    ({"p": 0}, ValueError, r"p must be 1 or 2"),
    ({"p": 2.0}, TypeError, r"p must be an integer"),
    ({"p": True}, TypeError, r"p must be an integer"),
    ({"axis": 3}, ValueError, r"axis must be in \[-3, 3\) for 3-D input, got 3"),
    ({"axis": -4}, ValueError, r"axis must be in \[-3, 3\)"),
    ({"axis": 1.0}, TypeError, r"axis must be an integer"),
    ({"opset": 0}, ValueError, r"opset must be an integer >= 1"),
    ({"out": np.empty((2, 3, 5), np.float32)}, ValueError, r"out must have the shape and dtype"),
    ({"out": np.empty((2, 3, 4), np.float64)}, ValueError, r"out must have the shape and dtype"),
    ({"out": [0.0] * 24}, TypeError, r"out must be a numpy.ndarray"),
])
def test_lp_rejects(kwargs, error, match):
    X = np.ones((2, 3, 4), np.float32)
    before = X.copy()
    with pytest.raises(error, match=match):
        normkernels.lp_normalization(X, **kwargs)
    assert_identical(X, before)


def test_lp_rejects_inputs():
    with pytest.raises(TypeError, match=r"input has dtype int32; allowed: float16"):
        normkernels.lp_normalization(np.ones(3, np.int32))
    with pytest.raises(ValueError, match=r"at least 1 dimension"):
        normkernels.lp_normalization(np.float32(1.0))
    read_only = np.empty(3, np.float32)
    read_only.flags.writeable = False
    with pytest.raises(ValueError, match=r"out is read-only"):
        normkernels.lp_normalization(np.ones(3, np.float32), out=read_only)
    assert normkernels.lp_normalization(np.ones((0, 3), np.float32)).shape == (0, 3)
    assert normkernels.lp_normalization(np.ones((3, 0), np.float32), axis=1).shape == (3, 0)


# --- LRN ---

LRN_SHAPES = [(2, 5, 7), (1, 6, 3, 4), (1, 4, 2, 3, 2), (2, 1, 3, 3), (3, 5)]
LRN_CASES = [(shape, size) for shape in LRN_SHAPES for size in range(1, shape[1] + 3)]


def lrn_attributes(size):
    """Attributes strong enough for the window to matter: beta 0.75 (the narrow
    dtypes' sqrt form) for odd sizes, other betas (pow) for even ones."""
    return {"alpha": 1.5, "beta": 0.75 if size % 2 else 0.6, "bias": 0.8}


@DTYPES
@pytest.mark.parametrize("shape,size", LRN_CASES,
                         ids=[f"{len(s)}d-C{s[1]}-size{n}" for s, n in LRN_CASES])
def test_lrn_matches_oracle_and_twin(rng, dtype, shape, size):
    X = data(rng, shape, dtype)
    before = X.copy()
    attrs = lrn_attributes(size)
    Y = normkernels.lrn(X, size=size, **attrs)
    assert_identical(X, before)
    ulp_close(Y, lrn_oracle(X, size, **attrs), dtype, terms=size + 2)
    assert_identical(Y, reference.lrn(X, size=size, **attrs))


@DTYPES
@pytest.mark.parametrize("size", [2, 3, 5])
def test_lrn_channels_last(rng, dtype, size):
    """NXC input, and NCX input stored channels-last, give the NCX results."""
    attrs = lrn_attributes(size)
    X = data(rng, (2, 7, 3, 5), dtype)
    want = normkernels.lrn(X, size=size, **attrs)
    nxc = np.ascontiguousarray(np.moveaxis(X, 1, -1))
    Y = normkernels.lrn(nxc, size=size, data_format="NXC", **attrs)
    ulp_close(Y, lrn_oracle(nxc, size, data_format="NXC", **attrs), dtype, terms=size + 2)
    assert_identical(np.moveaxis(Y, -1, 1), want)
    assert_identical(Y, reference.lrn(nxc, size=size, data_format="NXC", **attrs))
    stored_last = np.moveaxis(nxc, -1, 1)  # NCX view of channels-last memory
    assert_identical(normkernels.lrn(stored_last, size=size, **attrs), want)


@DTYPES
def test_lrn_defaults_views_and_parallel(rng, dtype, routes):
    base = data(rng, (3, 8, 9, 10), dtype, scale=30.0)
    for X in (base[:, ::2, 1:, ::3], base[::-1], base.transpose(0, 1, 3, 2)):
        ulp_close(normkernels.lrn(X, size=3), lrn_oracle(X, 3, 1e-4, 0.75, 1.0), dtype,
                     terms=5)
    big = data(rng, (2, 12, 60, 61), dtype)  # above the serial limit
    for fmt, X in (("NCX", big), ("NXC", np.ascontiguousarray(np.moveaxis(big, 1, -1)))):
        Y = normkernels.lrn(X, size=5, alpha=0.5, data_format=fmt)
        ulp_close(Y, lrn_oracle(X, 5, 0.5, 0.75, 1.0, fmt), dtype, terms=7)
        assert_identical(Y, reference.lrn(X, size=5, alpha=0.5, data_format=fmt))
    assert {"lrn/planes/parallel", "lrn/rows/parallel"} <= set(routes)


@pytest.mark.parametrize("route,fmt,path", [
    ("lrn/planes/serial", "NCX", "serial"), ("lrn/planes/parallel", "NCX", "parallel"),
    ("lrn/planes/parallel", "NCX", "streaming"), ("lrn/rows/serial", "NXC", "serial"),
    ("lrn/rows/parallel", "NXC", "parallel"),
])
def test_lrn_routes(rng, routes, route, fmt, path):
    for dtype in (F64, F16):
        X = data(rng, (3, 6, 70), dtype)
        Y = lrn_spec.lrn(X, size=4, alpha=0.9, data_format=fmt, engine=ENGINE, path=path)
        assert route in routes
        assert set(routes) <= set(policy.ROUTES)
        ulp_close(Y, lrn_oracle(X, 4, 0.9, 0.75, 1.0, fmt), dtype, terms=6)
        assert_identical(Y, reference.lrn(X, size=4, alpha=0.9, data_format=fmt))


@DTYPES
def test_lrn_large_values_and_nan(rng, dtype):
    # float64: squares beyond its range would make the base inf (Y 0; documented)
    top = 1e150 if dtype == F64 else float(ml_dtypes.finfo(dtype).max)
    X = data(rng, (2, 5, 4), dtype)
    X[0, :, 0] = np.array([top, -top / 3, top / 2, 1.0, 0.0]).astype(dtype)
    X[1, 2, 3] = np.nan
    attrs = {"alpha": 1.0, "beta": 0.75, "bias": 1.0}
    Y = normkernels.lrn(X, size=3, **attrs)
    exact = lrn_oracle(X, 3, **attrs)
    ulp_close(Y, exact, dtype, terms=5)
    nan = np.isnan(Y.astype(np.float64))
    assert np.array_equal(np.argwhere(nan), [[1, 1, 3], [1, 2, 3], [1, 3, 3]])
    if dtype != F64:  # float32 squares beyond float32's range: float64 holds them
        assert np.isfinite(Y.astype(np.float64)[0, :, 0]).all()
        assert (Y.astype(np.float64)[0, :3, 0] != 0).all()


@DTYPES
def test_lrn_out_and_in_place(rng, dtype):
    X = data(rng, (2, 4, 3, 3), dtype)
    want = normkernels.lrn(X, size=3, alpha=2.0)
    out = np.empty((2, 4, 3, 6), dtype)[..., ::2]
    assert normkernels.lrn(X, size=3, alpha=2.0, out=out) is out
    assert_identical(out, want)
    Z = X.copy()
    assert normkernels.lrn(Z, size=3, alpha=2.0, out=Z) is Z
    assert_identical(Z, want)
    buffer = data(rng, 2 * 4 * 9 + 1, dtype)
    src, dst = buffer[:-1].reshape(2, 4, 3, 3), buffer[1:].reshape(2, 4, 3, 3)
    expected = normkernels.lrn(src.copy(), size=3, alpha=2.0)
    normkernels.lrn(src, size=3, alpha=2.0, out=dst)
    assert_identical(dst, expected)


def test_lrn_huge_size(rng):
    """A size beyond 2C + 1 windows every channel; alpha is still divided by it."""
    X = data(rng, (2, 3, 4), F32)
    for size in (7, 10**6, 2**70):
        Y = normkernels.lrn(X, size=size, alpha=size * 0.5, beta=0.6)
        ulp_close(Y, lrn_oracle(X, size, size * 0.5, 0.6, 1.0), F32)
        assert_identical(Y, reference.lrn(X, size=size, alpha=size * 0.5, beta=0.6))


def test_lrn_opsets():
    X = np.ones((1, 3, 2), ml_dtypes.bfloat16)
    normkernels.lrn(X, size=3)
    with pytest.raises(TypeError, match=r"LRN-1: X has dtype bfloat16; allowed: float16, "
                                         r"float32, float64"):
        normkernels.lrn(X, size=3, opset=12)
    Y = normkernels.lrn(X.astype(np.float32), size=3, opset=1)
    ulp_close(Y, lrn_oracle(X.astype(np.float32), 3, 1e-4, 0.75, 1.0), F32)


@pytest.mark.parametrize("kwargs,error,match", [
    ({"size": None}, TypeError, r"LRN-13: attribute 'size' is required"),
    ({"size": 0}, ValueError, r"size must be a positive integer .*got 0"),
    ({"size": -3}, ValueError, r"size must be a positive integer"),
    ({"size": 3.0}, TypeError, r"size must be an integer"),
    ({"size": 3, "alpha": float("nan")}, ValueError, r"alpha must be finite"),
    ({"size": 3, "beta": "0.75"}, TypeError, r"beta must be a float"),
    ({"size": 3, "bias": float("inf")}, ValueError, r"bias must be finite"),
    ({"size": 3, "data_format": "NHWC"}, ValueError, r"data_format must be one of"),
    ({"size": 3, "opset": 0}, ValueError, r"opset must be an integer >= 1"),
    ({"size": 3, "out": np.empty((2, 3, 5), np.float32)}, ValueError, r"out must have the shape"),
    ({"size": 3, "out": np.empty((2, 3, 4), np.float16)}, ValueError, r"out must have the shape"),
])
def test_lrn_rejects(kwargs, error, match):
    X = np.ones((2, 3, 4), np.float32)
    before = X.copy()
    with pytest.raises(error, match=match):
        normkernels.lrn(X, **kwargs)
    assert_identical(X, before)


def test_lrn_rejects_inputs():
    with pytest.raises(ValueError, match=r"X must have at least 2 dimensions"):
        normkernels.lrn(np.ones(4, np.float32), size=1)
    with pytest.raises(TypeError, match=r"X has dtype float16|X has dtype int64"):
        normkernels.lrn(np.ones((2, 3), np.int64), size=1)
    with pytest.raises(TypeError, match=r"LRN\(\) missing|required keyword-only argument"):
        normkernels.lrn(np.ones((2, 3), np.float32))  # size has no default
    assert normkernels.lrn(np.ones((0, 3, 2), np.float32), size=3).shape == (0, 3, 2)


# --- peers and laziness ---


def _ort_run(node, X):
    onnx = pytest.importorskip("onnx")
    ort = pytest.importorskip("onnxruntime")
    from onnx import TensorProto

    helper = onnx.helper
    graph = helper.make_graph(
        [node], "g", [helper.make_tensor_value_info("X", TensorProto.FLOAT, list(X.shape))],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, list(X.shape))])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 22)])
    model.ir_version = 10
    onnx.checker.check_model(model)
    session = ort.InferenceSession(model.SerializeToString(),
                                   providers=["CPUExecutionProvider"])
    return session.run(None, {"X": X})[0]


@pytest.mark.parametrize("p,axis", [(1, -1), (2, -1), (1, 1), (2, 0)])
def test_lp_matches_onnxruntime(rng, p, axis):
    """onnxruntime computes in float32: within a few float32 ulps."""
    helper = pytest.importorskip("onnx.helper")

    X = data(rng, (3, 16, 5), F32)
    X[0, :, 0] = 0  # a zero vector for the last-axis and axis-1 cases
    got = normkernels.lp_normalization(X, axis=axis, p=p)
    peer = _ort_run(helper.make_node("LpNormalization", ["X"], ["Y"], axis=axis, p=p), X)
    assert np.all(np.abs(got - peer) <= 8 * np.spacing(np.abs(got))), np.max(np.abs(got - peer))


@pytest.mark.parametrize("size", [3, 5])
def test_lrn_matches_onnxruntime(rng, size):
    helper = pytest.importorskip("onnx.helper")

    X = data(rng, (2, 7, 5, 6), F32, scale=3.0)
    attrs = {"alpha": 0.7, "beta": 0.6, "bias": 1.5}
    got = normkernels.lrn(X, size=size, **attrs)
    peer = _ort_run(helper.make_node("LRN", ["X"], ["Y"], size=size, **attrs), X)
    assert np.all(np.abs(got - peer) <= 8 * np.spacing(np.abs(got))), np.max(np.abs(got - peer))


def test_import_compiles_no_lp_lrn_kernel():
    code = textwrap.dedent("""
        import normkernels
        normkernels.lp_normalization, normkernels.lrn
        from numba.core.dispatcher import Dispatcher
        from normkernels.kernels import lp, lrn
        kernels = [k for m in (lp, lrn) for k in vars(m).values() if isinstance(k, Dispatcher)]
        assert len(kernels) > 15, len(kernels)
        print(sum(len(k.signatures) for k in kernels))
    """)
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            check=True)
    assert result.stdout.strip() == "0"

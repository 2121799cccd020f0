"""Hostile input, property-based: random shapes, dtypes, flags, attribute values,
parameter lengths and ``out`` arrays at every public function and ``run_node``. The
only outcomes allowed: a result that matches the float64 oracle, or a TypeError /
ValueError / NotImplementedError naming what is wrong. Never a crash, a Numba error
leaking out, or a modified input."""

import math

import ml_dtypes
import numpy as np
import pytest
from oracle import batch_norm, batch_norm_training, instance_norm

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

import normkernels as nk  # noqa: E402

ALLOWED = (TypeError, ValueError, NotImplementedError)
FLOATS = ["float16", "bfloat16", "float32", "float64", ">f4", "<f8"]
OTHERS = ["int8", "int32", "uint16", "bool", "complex64", "object", "datetime64[s]"]
SETTINGS = settings(max_examples=250, deadline=None, derandomize=True,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


def dtype_of(name):
    return np.dtype(ml_dtypes.bfloat16) if name == "bfloat16" else np.dtype(name)


@st.composite
def tensors(draw, dtypes=FLOATS + OTHERS):
    ndim = draw(st.integers(0, 5))
    shape = tuple(draw(st.lists(st.integers(0, 5), min_size=ndim, max_size=ndim)))
    dtype = dtype_of(draw(st.sampled_from(dtypes)))
    values = np.random.default_rng(draw(st.integers(0, 2**32 - 1))).standard_normal(
        int(np.prod(shape, dtype=np.int64)) * 2 + 1)
    if dtype.kind == "M":
        base = values.astype(np.int64).astype(dtype)
    elif dtype.kind == "O":
        base = values.astype(object)
    elif dtype.kind == "c":
        base = values.astype(dtype)
    else:
        base = (values * 3).astype(dtype) if dtype.kind != "b" else values > 0
    kind = draw(st.sampled_from(["contiguous", "strided", "read-only", "scalar-array"]))
    n = int(np.prod(shape, dtype=np.int64))
    if kind == "strided" and ndim > 0:
        arr = base[:2 * n:2].reshape(shape) if n else base[:0].reshape(shape)
    else:
        arr = base[:n].reshape(shape).copy()
    if kind == "read-only":
        arr.flags.writeable = False
    return arr


def channels(X, data_format):
    if X.ndim == 0:
        return 1
    if X.ndim == 1:
        return 1
    return X.shape[1] if data_format == "NCX" else X.shape[-1]


@st.composite
def parameters(draw, X, data_format, count):
    C = channels(X, data_format)
    out = []
    for _ in range(count):
        length = draw(st.sampled_from([C, C, C, C + 1, max(C - 1, 0), None]))
        dtype = dtype_of(draw(st.sampled_from(FLOATS + ["float32"] * 4 + ["int32", "object"])))
        if length is None:
            out.append(draw(st.sampled_from([1.0, "x", None, [1.0] * C])))
            continue
        values = np.random.default_rng(draw(st.integers(0, 99))).uniform(0.5, 2, length)
        out.append(values.astype(dtype) if dtype.kind != "O" else values.astype(object))
    return out


@st.composite
def valid_case(draw, min_ndim, params_like):
    """A float X (native or not, strided or read-only) with well-formed parameters:
    ``params_like(X)`` gives the dtype the operator wants for them."""
    X = draw(tensors(dtypes=FLOATS).filter(lambda x: x.ndim >= min_ndim and x.size > 0))
    fmt = draw(st.sampled_from(["NCX", "NXC"]))
    C = channels(X, fmt)
    rng = np.random.default_rng(draw(st.integers(0, 99)))
    dtype = params_like(X)
    params = [rng.uniform(-2, 2, C), rng.standard_normal(C), rng.standard_normal(C),
              rng.uniform(0.25, 4, C)]
    return X, fmt, [p.astype(dtype) for p in params]


def native(X):
    return X.dtype.newbyteorder("=")


ATTRIBUTE_VALUES = st.sampled_from([None, None, None, 1e-5, 0.0, -1.0, float("nan"),
                                    float("inf"), 1e30, "x", [1.0], True, 2])


def snapshot(values):
    return [(v.copy(), v.flags.writeable) if isinstance(v, np.ndarray) else v
            for v in values]


def assert_unchanged(before, values):
    for old, new in zip(before, values, strict=True):
        if isinstance(new, np.ndarray):
            arr, writeable = old
            assert new.flags.writeable == writeable
            if arr.dtype.kind == "O":
                assert all(a is b or a == b for a, b in zip(arr.ravel(), new.ravel(),
                                                            strict=True))
            else:
                assert arr.tobytes() == new.tobytes(), "an input was modified"


def close(got, exact, dtype):
    got = np.asarray(got, np.float64)
    wide = dtype_of(dtype.name) in (np.dtype(np.float16), np.dtype(ml_dtypes.bfloat16))
    tol = 2e-2 if wide else 1e-4
    both_nan = np.isnan(got) & np.isnan(exact)
    ok = both_nan | np.isclose(got, exact, rtol=tol, atol=tol) | (got == exact)
    assert ok.all(), (got[~ok][:5], exact[~ok][:5])


def call(fn, values, kwargs):
    before = snapshot(values)
    try:
        result = fn(*values, **kwargs)
    except ALLOWED as exc:
        assert str(exc), "an error without a message"
        assert_unchanged(before, values)
        return None
    assert_unchanged(before, values)
    return result


def floats_ok(arrays):
    dtypes = [np.asarray(a).dtype for a in arrays]
    return all(d.kind == "f" or d == np.dtype(ml_dtypes.bfloat16) for d in dtypes)


def attribute_ok(value, positive=True):
    if value is None:
        return True
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    return math.isfinite(value) and (value > 0 or not positive)


@SETTINGS
@given(st.data())
def test_batch_normalization(data):
    if data.draw(st.booleans()):
        X, fmt, params = data.draw(valid_case(1, lambda X: np.float32))
        opset = data.draw(st.sampled_from([15, 22]))
        eps = data.draw(st.sampled_from([None, 1e-5, 1e-3, 0.0]))
    else:
        X = data.draw(tensors())
        fmt = data.draw(st.sampled_from(["NCX", "NXC", "NCX", "nchw"]))
        params = data.draw(parameters(X, fmt, 4))
        opset = data.draw(st.sampled_from([15, 15, 14, 9, 7, 6, 1, 0, 22, "15"]))
        eps = data.draw(ATTRIBUTE_VALUES)
    training = data.draw(st.sampled_from([None, 0, 1]))
    kwargs = {"epsilon": eps, "opset": opset, "data_format": fmt}
    if training is not None and opset in (14, 15):
        kwargs["training_mode"] = training
    result = call(nk.batch_normalization, [X, *params], kwargs)
    if result is None:
        return
    Y = result[0] if isinstance(result, tuple) else result
    assert Y.shape == X.shape and Y.dtype == X.dtype.newbyteorder("=")
    assert floats_ok([X, *params]) and attribute_ok(eps, positive=False)
    e = 1e-5 if eps is None else eps
    if X.size == 0:
        return
    if isinstance(result, tuple):
        close(Y, batch_norm_training(X, *params, e, 0.9, fmt)[0], X.dtype)
    else:
        close(Y, batch_norm(X, *params, e, fmt), X.dtype)


@SETTINGS
@given(st.data())
def test_instance_normalization(data):
    if data.draw(st.booleans()):
        X, fmt, params = data.draw(valid_case(3, native))
        params = params[:2]
        opset = 22
        eps = data.draw(st.sampled_from([None, 1e-5, 1e-3]))
    else:
        X = data.draw(tensors())
        fmt = data.draw(st.sampled_from(["NCX", "NXC"]))
        params = data.draw(parameters(X, fmt, 2))
        opset = data.draw(st.sampled_from([22, 6, 1, 0, 23]))
        eps = data.draw(ATTRIBUTE_VALUES)
    extra = data.draw(st.sampled_from([{}, {}, {"consumed_inputs": [0]}]))
    result = call(nk.instance_normalization, [X, *params],
                  {"epsilon": eps, "opset": opset, "data_format": fmt, **extra})
    if result is None:
        return
    assert result.shape == X.shape and floats_ok([X, *params])
    e = 1e-5 if eps is None else eps
    if X.size == 0:
        return
    close(result, instance_norm(X, *params, e, fmt)[0], X.dtype)


@SETTINGS
@given(st.data())
def test_batch_norm_inference_and_moments(data):
    if data.draw(st.booleans()):
        bf16 = np.dtype(ml_dtypes.bfloat16)
        X, fmt, params = data.draw(valid_case(2, lambda X: bf16 if X.dtype == bf16
                                              else np.float32).filter(
            lambda case: case[0].dtype.newbyteorder("=") != np.float64))
        eps = data.draw(st.sampled_from([1e-5, 1e-3]))
    else:
        X = data.draw(tensors())
        fmt = data.draw(st.sampled_from(["NXC", "NCX", "nhwc"]))
        params = data.draw(parameters(X, fmt, 4))
        eps = data.draw(ATTRIBUTE_VALUES)
    result = call(nk.batch_norm_inference, [X, *params], {"epsilon": eps, "data_format": fmt})
    if result is not None and X.size:
        close(result, batch_norm(X, *params, eps, fmt), X.dtype)
    stats = call(nk.moments, [X], {"data_format": fmt})
    if stats is not None:
        assert floats_ok([X]) and len(stats) == 2
    partial = call(nk.partial_moments, [X], {"data_format": fmt})
    if partial is not None:
        assert np.all(partial.count >= 0)


@SETTINGS
@given(st.data())
def test_out_arrays(data):
    X = data.draw(tensors(dtypes=["float32", "float16"]))
    params = data.draw(parameters(X, "NCX", 4))
    kind = data.draw(st.sampled_from(["X", "new", "wrong-shape", "wrong-dtype", "read-only",
                                      "list", "overlap"]))
    out = {"X": X, "new": np.empty_like(X), "wrong-shape": np.empty((*X.shape, 1), X.dtype),
           "wrong-dtype": np.empty(X.shape, np.float64), "list": [0.0],
           "read-only": np.empty_like(X), "overlap": None}[kind]
    if kind == "read-only":
        out.flags.writeable = False
    if kind == "overlap":
        if X.size < 2:
            return
        buf = np.empty(X.size + 1, X.dtype)
        buf[:X.size] = X.ravel()
        X = buf[:X.size].reshape(X.shape)
        out = buf[1:].reshape(X.shape)
    values = [X, *params]
    if kind == "X":  # in place: X is the output, so only the parameters must stay
        values_check = params
        before = snapshot(values_check)
        try:
            nk.batch_normalization(*values, out=out)
        except ALLOWED:
            pass
        assert_unchanged(before, values_check)
        return
    result = call(nk.batch_normalization, values, {"out": out})
    if result is not None:
        assert kind == "new" and result is out


@SETTINGS
@given(st.data())
def test_run_node(data):
    onnx = pytest.importorskip("onnx")
    from onnx import helper

    from normkernels import onnx as nko

    op = data.draw(st.sampled_from(["BatchNormalization", "InstanceNormalization",
                                    "LayerNormalization"]))
    n_inputs = {"BatchNormalization": 5, "InstanceNormalization": 3}.get(op, 2)
    X = data.draw(tensors(dtypes=["float32", "float16", "int32", "float64"]))
    params = data.draw(parameters(X, "NCX", n_inputs - 1))
    attrs = {}
    for name in data.draw(st.lists(st.sampled_from(["epsilon", "momentum", "spatial",
                                                    "is_test", "training_mode",
                                                    "consumed_inputs", "bogus"]),
                                   max_size=3, unique=True)):
        attrs[name] = data.draw(st.sampled_from([1e-5, 0.9, 1, 0, -1.0, [0, 1]]))
    outputs = data.draw(st.sampled_from([["y"], ["y", "m", "v"], ["y", "", "v"],
                                         ["y", "a", "b", "c", "d"]]))
    try:
        node = helper.make_node(op, [f"i{k}" for k in range(n_inputs)], outputs, **attrs)
    except Exception:
        return  # onnx refuses the attribute itself
    opset = data.draw(st.sampled_from([None, 1, 6, 7, 9, 14, 15, 22, 0]))
    del onnx
    before = snapshot([X, *params])
    result = call(nko.run_node, [node, [X, *params], opset], {})
    assert_unchanged(before, [X, *params])
    if result is not None:
        assert len(result) == len(outputs)
        assert all((r is None) == (not name) for r, name in zip(result, outputs, strict=True))

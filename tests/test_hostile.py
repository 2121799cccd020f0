"""Hostile input, property-based: random shapes, dtypes, flags, attribute values,
parameter lengths and ``out`` arrays at every public function and ``run_node``.

Each call is judged by a small validity model of its spec layer (``*_model`` below:
which arguments are invalid for the drawn input, and with which exception type). The
only outcomes allowed:

* the model finds every argument valid: the call succeeds and its result matches the
  float64 oracle within the error model of ``oracle.py``;
* the model names offending arguments: the call raises TypeError / ValueError /
  NotImplementedError whose message names one of them (as a word, case-sensitive)
  with an exception type that fits that argument's defect.

Never a crash, a Numba error leaking out, or a modified input. Each fuzzer mixes
plausible calls (which mostly succeed and are checked against the oracle), calls with
one defect (which reach the deep checks, so a message that stops naming its argument
is caught) and wholly hostile calls; ``test_each_attribute_defect`` goes through every
bad attribute, opset and data_format value once. ``merge_moments`` is fuzzed for its
algebra (identity, order, associativity) and against the statistics of the
concatenation.
"""

import math
import numbers
import re
import warnings

import ml_dtypes
import numpy as np
import pytest
from arrays import assert_identical
from oracle import (
    BFLOAT16,
    F16,
    F32,
    F64,
    assert_close,
    batch_norm,
    batch_norm_training,
    batch_statistics,
    compute_dtype,
    instance_norm,
    instance_tolerance,
    rounded_statistic_tolerance,
    statistics_tolerance,
    tolerance,
    training_tolerance,
    unit_roundoff,
)

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

import normkernels as nk  # noqa: E402

ALLOWED = (TypeError, ValueError, NotImplementedError)
FLOATS = ["float16", "bfloat16", "float32", "float64", ">f4", "<f8"]
OTHERS = ["int8", "int32", "uint16", "bool", "complex64", "object", "datetime64[s]"]
SETTINGS = settings(max_examples=250, deadline=None, derandomize=True,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
U64 = unit_roundoff(F64)
MISSING = object()  # an argument left out of the call
ANY_SIDE = st.integers(0, 5)
SIDES = st.sampled_from([0, 1, 1, 2, 2, 3, 3, 4, 5, 5])  # for valid tensors: few zeros


def dtype_of(name):
    return BFLOAT16 if name == "bfloat16" else np.dtype(name)


# --- inputs ---

@st.composite
def tensors(draw, dtypes=FLOATS + OTHERS, min_ndim=0, max_ndim=5, sides=ANY_SIDE):
    ndim = draw(st.integers(min_ndim, max_ndim))
    shape = tuple(draw(st.lists(sides, min_size=ndim, max_size=ndim)))
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
    """C as the library counts it: axis 1 (NCX) or the last axis; 1 for 0-D and 1-D."""
    if X.ndim <= 1:
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
def well_formed(draw, shape, dtypes):
    """scale, B, mean, var (var > 0) of ``shape`` in ``dtypes``, some of them in
    non-native byte order or read-only."""
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    values = [rng.uniform(-2, 2, shape), rng.standard_normal(shape),
              rng.standard_normal(shape), rng.uniform(0.25, 4, shape)]
    out = []
    for v, dtype in zip(values, dtypes, strict=False):
        p = v.astype(dtype)
        how = draw(st.sampled_from(["plain", "plain", "plain", "swapped", "read-only"]))
        if how == "swapped" and dtype.itemsize > 2:
            p = p.astype(dtype.newbyteorder(">"))
        elif how == "read-only":
            p.flags.writeable = False
        out.append(p)
    return out


@st.composite
def spoiled_tensor(draw, X):
    """X with one defect (maybe): another dtype, another rank, or empty."""
    kind = draw(st.sampled_from(["dtype", "dtype", "fewer axes", "more axes", "scalar",
                                 "empty"]))
    if kind == "dtype":
        dtype = dtype_of(draw(st.sampled_from(["int32", "bool", "complex64", "object",
                                               "float16", "bfloat16", "float64"])))
        return (X.astype(np.float32) > 0 if dtype.kind == "b" else
                X.astype(np.float32).astype(dtype))
    if kind == "fewer axes":  # 1-D: 0-D (an empty X has no element to keep)
        if X.ndim > 1:
            return X.reshape(-1)
        return X.reshape(-1)[:1].reshape(()) if X.size else np.zeros((), X.dtype)
    if kind == "more axes":
        return X[..., None]
    if kind == "scalar":
        return X.reshape(-1)[:1].reshape(()) if X.size else X.dtype.type(1)
    return X[:0]


@st.composite
def spoiled_parameter(draw, p):
    """A parameter of shape (C,) with one defect (maybe)."""
    kind = draw(st.sampled_from(["longer", "shorter", "column", "scalar", "dtype", "dtype",
                                 "str", "None", "list"]))
    if kind == "longer":
        return np.concatenate([p, p[:1]]) if p.size else np.ones(1, p.dtype)
    if kind == "shorter":
        return p[:-1]
    if kind == "column":
        return p.reshape(-1, 1)
    if kind == "scalar":
        return p[0] if p.size else p.dtype.type(1)
    if kind == "dtype":
        dtype = dtype_of(draw(st.sampled_from(["int32", "object", "complex64", "float16",
                                               "bfloat16", "float32", "float64"])))
        return p.astype(np.float32).astype(dtype)
    return {"str": "x", "None": None, "list": p.astype(np.float64).tolist()}[kind]


def native(X):
    return X.dtype.newbyteorder("=")


def as_native(value):
    """``value`` as the library sees it: an array in native byte order."""
    arr = np.asarray(value)
    return arr if arr.dtype.isnative else arr.astype(arr.dtype.newbyteorder("="))


def native_dtype(value):
    return as_native(value).dtype if isinstance(value, np.ndarray) else np.asarray(value).dtype


ATTRIBUTE_VALUE_LIST = [None, None, None, 1e-5, 0.0, -1.0, float("nan"), float("inf"), 1e30,
                        "x", "1e-3", b"1e-3", [1.0], True, 2, np.float32(1e-3),
                        np.array(1e-5)]
ATTRIBUTE_VALUES = st.sampled_from(ATTRIBUTE_VALUE_LIST)
# the one defect of a FLOAT attribute (or not: ONNX takes any sign, and any real number
# will do: NumPy scalars, bfloat16, ints)
FLOAT_DEFECT_LIST = [float("nan"), float("nan"), float("inf"), -float("inf"), "x", "1e-3",
                     b"1e-3", [1.0], np.array(1e-3), np.array([1e-3]), True, np.bool_(False),
                     0.0, -1.0, 1e30, 10**400, np.float32(1e-3), np.float64(0.5),
                     np.int64(2), BFLOAT16.type(0.25)]
FLOAT_DEFECTS = st.sampled_from(FLOAT_DEFECT_LIST)
# the one defect of an INT flag (training_mode, is_test, spatial), or not: any integer,
# NumPy's and bools too, though training_mode and spatial only 0 or 1
INT_DEFECTS = st.sampled_from(["x", "1", b"1", [0], [1], 1.0, 0.0, np.float64(1.0), None,
                               2, -1, 0, 1, True, False, np.int64(1), np.uint8(0),
                               np.bool_(True)])
# opsets: integers >= 1 (NumPy's too) are valid
OPSET_DEFECTS = [0, -1, "15", True, 14.0, None, [15], np.float64(15.0), np.bool_(True),
                 np.int64(0)]


# --- calls: inputs kept, outcome as the model says ---

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


class Bad(dict):
    """What a validity model found: offending argument name -> the exception types
    that fit its defect (several when it is wrong in several ways)."""

    def add(self, name, exc):
        self[name] = (*self.get(name, ()), exc)

    def merge(self, other):
        for name, kinds in other.items():
            for exc in kinds:
                self.add(name, exc)


def names(message, name):
    return re.search(rf"(?<!\w){re.escape(name)}(?!\w)", message) is not None


def call(fn, args, kwargs, bad, watched=None):
    """``fn(*args, **kwargs)``: refused with a message naming an offending argument
    when ``bad`` lists any, else a result. ``watched`` (default ``args``) must come out
    unmodified either way."""
    watched = args if watched is None else watched
    before = snapshot(watched)
    try:
        result = fn(*args, **kwargs)
    except ALLOWED as exc:
        assert_unchanged(before, watched)
        message = f"{type(exc).__name__}: {exc}"
        assert bad, f"valid arguments refused: {message}"
        fits = [n for n, kinds in bad.items() if names(str(exc), n) and isinstance(exc, kinds)]
        assert fits, f"{message!r} names none of the offending arguments {dict(bad)}"
        return None
    assert_unchanged(before, watched)
    assert not bad, f"invalid arguments accepted: {dict(bad)}"
    return result


# --- validity models of the spec layer (ops/*.py, the user guide, the specs) ---

NO_BF16 = (F16, F32, F64)
ALL_FLOATS = (F16, BFLOAT16, F32, F64)
FORMATS = ("NCX", "NXC")


def integer(value):
    """A Python or NumPy integer, not a bool."""
    return isinstance(value, (int, np.integer)) and not isinstance(value, bool)


def version(opset, versions):
    """The since-version serving ``opset`` (every operator here starts at 1), None when
    ``opset`` is not an integer >= 1 (a Python or NumPy integer, not a bool)."""
    if not integer(opset) or opset < 1:
        return None
    return max(v for v in versions if v <= opset)


def float_attribute(bad, name, value, positive=False):
    """A FLOAT attribute: a real number (a Python or NumPy one, bfloat16 too; not a
    bool, a string, bytes, a sequence or an array), finite (and > 0 when
    ``positive``). Its value, or None after recording the defect."""
    real = isinstance(value, numbers.Real) or (isinstance(value, np.generic)
                                               and value.dtype == BFLOAT16)
    if value is MISSING or isinstance(value, (bool, np.bool_)) or not real:
        bad.add(name, TypeError)
        return None
    try:
        number = float(value)
    except OverflowError:  # an int beyond float64's range
        number = math.inf
    if not math.isfinite(number) or (positive and number <= 0):
        bad.add(name, ValueError)
        return None
    return number


def int_attribute(bad, name, value, choices=None):
    """An INT attribute: an integer (Python or NumPy, bools too), one of ``choices``
    when given. Its value, or None after recording the defect."""
    if not isinstance(value, (int, np.integer, np.bool_)):
        bad.add(name, TypeError)
        return None
    if choices is not None and int(value) not in choices:
        bad.add(name, ValueError)
        return None
    return int(value)


def same_view(a, b):
    return (a.__array_interface__["data"][0] == b.__array_interface__["data"][0]
            and a.shape == b.shape and a.strides == b.strides and a.dtype == b.dtype)


def out_model(bad, out, X, params):
    """``out``: an ndarray, X's shape and (native) dtype, writeable, sharing memory
    with no input except by being X itself (inputs in non-native byte order are
    converted copies, so they share nothing)."""
    if not isinstance(out, np.ndarray):
        bad.add("out", TypeError)
        return
    x = np.asarray(X)
    if out.shape != x.shape or out.dtype != native_dtype(x):
        bad.add("out", ValueError)
        return
    if not out.flags.writeable:
        bad.add("out", ValueError)
    if x.dtype.isnative and np.shares_memory(out, x) and not same_view(out, x):
        bad.add("out", ValueError)
    for p in params:
        if isinstance(p, np.ndarray) and p.dtype.isnative and np.shares_memory(out, p):
            bad.add("out", ValueError)


BN_INPUTS = ("X", "scale", "B", "input_mean", "input_var")
BN_ATTRIBUTES = {1: {"consumed_inputs", "epsilon", "is_test", "momentum", "spatial"},
                 6: {"epsilon", "is_test", "momentum", "spatial"},
                 7: {"epsilon", "momentum", "spatial"},
                 9: {"epsilon", "momentum"},
                 14: {"epsilon", "momentum", "training_mode"},
                 15: {"epsilon", "momentum", "training_mode"}}
# the inputs bound to one type variable: T (1-9); T, U (14); T, T1, T2 (15)
BN_TYPES = {1: [BN_INPUTS], 6: [BN_INPUTS], 7: [BN_INPUTS], 9: [BN_INPUTS],
            14: [BN_INPUTS[:3], BN_INPUTS[3:]],
            15: [BN_INPUTS[:1], BN_INPUTS[1:3], BN_INPUTS[3:]]}


def bn_model(X, params, attrs, opset, fmt, num_outputs=None, saved_var="variance", out=None):
    """ONNX BatchNormalization: ``(bad, plan)``; ``plan`` (None when the version or
    the mode is undecided) says what a call computes."""
    bad = Bad()
    values = dict(zip(BN_INPUTS, (X, *params), strict=True))
    given = {k: v for k, v in attrs.items() if v is not None}
    since = version(opset, BN_ATTRIBUTES)
    if since is None:
        bad.add("opset", ValueError)
    else:
        for name in given.keys() - BN_ATTRIBUTES[since]:
            bad.add(name, TypeError)
        if since == 1 and "consumed_inputs" not in given:  # required by the schema
            bad.add("consumed_inputs", TypeError)
    fmt_ok = fmt in FORMATS
    if not fmt_ok:
        bad.add("data_format", ValueError)
    dtypes = {n: native_dtype(v) for n, v in values.items()}
    if since is not None:
        allowed = ALL_FLOATS if since >= 14 else NO_BF16  # bfloat16 from opset 14
        for n, d in dtypes.items():
            if d not in allowed:
                bad.add(n, TypeError)
        for group in BN_TYPES[since]:
            if len({dtypes[n] for n in group}) > 1:
                for n in group:
                    bad.add(n, TypeError)
    x = np.asarray(X)
    if x.ndim < 1 or (since == 1 and x.ndim != 4):
        bad.add("X", ValueError)
    eps = float_attribute(bad, "epsilon", given.get("epsilon", 1e-5))  # any sign
    # checked in every mode, whether the mode uses them or not
    momentum = float_attribute(bad, "momentum", given.get("momentum", 0.9))  # any sign
    if not isinstance(saved_var, str) or saved_var not in ("variance", "inv_std"):
        bad.add("saved_var", ValueError)  # at every opset
    if out is not None:
        out_model(bad, out, X, params)
    if since is None:
        return bad, None
    # INT attributes the version has: integers; training_mode and spatial 0 or 1,
    # is_test any (nonzero: test mode)
    flags = {name: int_attribute(bad, name, given.get(name, default), choices)
             for name, default, choices in (("training_mode", 0, (0, 1)),
                                            ("is_test", 0, None), ("spatial", 1, (0, 1)))
             if name in BN_ATTRIBUTES[since]}
    training = None
    if since >= 14:  # the mode is training_mode; the outputs are fixed
        if num_outputs is not None:
            bad.add("num_outputs", TypeError)
        if flags["training_mode"] is not None:
            training = bool(flags["training_mode"])
    else:
        n = 1 if num_outputs is None else num_outputs
        if not integer(n) or not 1 <= n <= 5:
            bad.add("num_outputs", ValueError)
        elif since in (1, 6):  # is_test (default 0: training)
            if flags["is_test"] is not None:
                training = not flags["is_test"]
                if not training and n > 1:
                    bad.add("is_test", ValueError)
                    bad.add("num_outputs", ValueError)
        else:  # 7, 9: the outputs requested select the mode
            training = n > 1
    spatial = bool(flags["spatial"]) if "spatial" in flags and flags["spatial"] is not None \
        else True  # an invalid spatial is refused before the parameters are looked at
    if x.ndim >= 1 and fmt_ok:
        C = channels(x, fmt)
        sample = x.shape[1:] if x.ndim > 1 else ()
        for n in BN_INPUTS[1:]:
            shape = np.shape(values[n])
            ok = (shape == (C,) if spatial else  # spatial=0: one value per activation
                  shape == sample or (not sample and shape == (1,))
                  or (since in (1, 6) and shape == (C,)))
            if not ok:
                bad.add(n, ValueError)
    if training and x.size == 0:  # batch statistics of nothing
        bad.add("X", ValueError)
    if training is None:
        return bad, None
    return bad, {"since": since, "training": training, "eps": eps, "momentum": momentum,
                 "spatial": spatial, "num_outputs": num_outputs, "saved_var": saved_var}


def bn_output_count(plan):
    if not plan["training"]:
        return 1
    return 3 if plan["since"] >= 14 else (plan["num_outputs"] or 1)


IN_VERSIONS = {1: ({"consumed_inputs", "epsilon"}, NO_BF16),
               6: ({"epsilon"}, NO_BF16),
               22: ({"epsilon"}, ALL_FLOATS)}


def in_model(X, params, attrs, opset, fmt, out=None):
    """ONNX InstanceNormalization: ``(bad, epsilon)``."""
    bad = Bad()
    values = dict(zip(("input", "scale", "B"), (X, *params), strict=True))
    given = {k: v for k, v in attrs.items() if v is not None}
    since = version(opset, IN_VERSIONS)
    if since is None:
        bad.add("opset", ValueError)
    else:
        for name in given.keys() - IN_VERSIONS[since][0]:
            bad.add(name, TypeError)
    eps = float_attribute(bad, "epsilon", given.get("epsilon", 1e-5))  # any sign
    fmt_ok = fmt in FORMATS
    if not fmt_ok:
        bad.add("data_format", ValueError)
    dtypes = {n: native_dtype(v) for n, v in values.items()}
    if since is not None:
        for n, d in dtypes.items():
            if d not in IN_VERSIONS[since][1]:
                bad.add(n, TypeError)
    if len(set(dtypes.values())) > 1:  # one type T
        for n in values:
            bad.add(n, TypeError)
    x = np.asarray(X)
    if x.ndim < 3 or (since == 1 and x.ndim != 4):
        bad.add("input", ValueError)
    if x.ndim >= 3 and fmt_ok:
        C = channels(x, fmt)
        for n in ("scale", "B"):
            if np.shape(values[n]) != (C,):
                bad.add(n, ValueError)
        spatial = math.prod(x.shape[2:] if fmt == "NCX" else x.shape[1:-1])
        if spatial == 0 and x.shape[0] * C > 0:  # statistics of nothing
            bad.add("input", ValueError)
    if out is not None:
        out_model(bad, out, X, params)
    return bad, eps


BNI_PARAMS = ("gamma", "beta", "mean", "variance")


def bni_model(X, params, epsilon, fmt, out=None):
    """oneDNN BatchNormInference: ``(bad, epsilon)``."""
    bad = Bad()
    if fmt not in FORMATS:
        bad.add("data_format", ValueError)
    x_dtype = native_dtype(X)
    if x_dtype not in (F32, F16, BFLOAT16):  # T1
        bad.add("input", TypeError)
    dtypes = {n: native_dtype(p) for n, p in zip(BNI_PARAMS, params, strict=True)}
    for n, d in dtypes.items():
        if d not in (F32, BFLOAT16):  # T2
            bad.add(n, TypeError)
    if len(set(dtypes.values())) > 1:
        for n in BNI_PARAMS:
            bad.add(n, TypeError)
    elif dtypes["gamma"] == BFLOAT16 and x_dtype != BFLOAT16:  # bf16 with bf16 only
        for n in ("input", *BNI_PARAMS):
            bad.add(n, TypeError)
    x = np.asarray(X)
    if x.ndim < 2:
        bad.add("input", ValueError)
    eps = float_attribute(bad, "epsilon", epsilon, positive=True)  # required
    if x.ndim >= 2 and fmt in FORMATS:
        for n, p in zip(BNI_PARAMS, params, strict=True):
            if np.shape(p) != (channels(x, fmt),):
                bad.add(n, ValueError)
    if out is not None:
        out_model(bad, out, X, params)
    return bad, eps


def moments_model(X, fmt, partial):
    bad = Bad()
    if fmt not in FORMATS:
        bad.add("data_format", ValueError)
    if native_dtype(X) not in ALL_FLOATS:
        bad.add("X", TypeError)
    x = np.asarray(X)
    if x.ndim < 1:
        bad.add("X", ValueError)
    elif not partial and fmt in FORMATS and x.size == 0 and channels(x, fmt) > 0:
        bad.add("X", ValueError)  # moments of nothing (partial_moments: count 0)
    return bad


# --- results against the oracle ---

def expect_statistic(got, exact, dtype, propagated, shape, what):
    """A statistic computed in float64 within ``propagated`` of ``exact`` and rounded
    once to ``dtype``; one past the dtype's range rounds to an infinity."""
    assert isinstance(got, np.ndarray) and got.dtype == dtype and got.shape == shape, \
        (what, type(got), getattr(got, "dtype", None), getattr(got, "shape", None))
    exact = np.asarray(exact, np.float64).reshape(shape)
    with np.errstate(invalid="ignore", over="ignore"):
        tol = rounded_statistic_tolerance(exact, dtype, np.broadcast_to(propagated, shape))
        got = got.astype(np.float64)
        edge = np.isfinite(exact) & (np.abs(exact) + tol > float(ml_dtypes.finfo(dtype).max))
    if edge.any():
        near = np.abs(got[edge] - exact[edge]) <= tol[edge]
        overflow = np.isinf(got[edge]) & (np.sign(got[edge]) == np.sign(exact[edge]))
        assert np.all(near | overflow), f"{what}: beyond the dtype's range"
        got, exact, tol = got[~edge], exact[~edge], tol[~edge]
    assert_close(got, exact, tol, what)


def per_activation(X, params, fmt):
    """spatial=0: X as N x F activations, each parameter as F values (shape of one
    sample, or (C,) broadcast over its channel's positions in opsets 1 and 6)."""
    sample = X.shape[1:] if X.ndim > 1 else ()
    X2 = X.reshape(X.shape[0], math.prod(sample))
    flat = []
    for p in params:
        if p.shape == sample or (not sample and p.shape == (1,)):
            flat.append(p.reshape(-1))
        else:
            axis_shape = [1] * len(sample)
            axis_shape[0 if fmt == "NCX" else -1] = -1
            flat.append(np.broadcast_to(p.reshape(axis_shape), sample).reshape(-1))
    return X2, flat


def expect_batch_normalization(outputs, X, params, plan, fmt):
    """The outputs a call returned (a prefix of them, None where not wanted) against
    the float64 oracle: Y with ``oracle.tolerance`` (inference) or
    ``oracle.training_tolerance``, statistics within the statistics error model and
    one rounding to their dtype."""
    Xn, ps = as_native(X), [as_native(p) for p in params]
    Y = outputs[0]
    if Y is not None:
        assert isinstance(Y, np.ndarray) and Y.shape == Xn.shape and Y.dtype == Xn.dtype
    if plan["spatial"]:
        X2, ps2, f2 = Xn, ps, fmt
        stat_shape = (channels(Xn, fmt),)
    else:
        X2, ps2 = per_activation(Xn, ps, fmt)
        f2 = "NCX"
        stat_shape = Xn.shape[1:] or (1,)
    for got in outputs[1:]:
        assert got is None or got.shape == stat_shape
    if Xn.size == 0:
        return
    eps = plan["eps"]
    if not plan["training"]:
        rounded = ps2[2].dtype.itemsize > compute_dtype(X2.dtype).itemsize
        assert_close(Y.reshape(X2.shape), batch_norm(X2, *ps2, eps, f2),
                     tolerance(X2, *ps2, eps, f2, X2.dtype, mean_rounded=rounded))
        return
    m = plan["momentum"]
    exact_Y, exact_rm, exact_rv, mean, var = batch_norm_training(X2, *ps2, eps, m, f2)
    if Y is not None:
        assert_close(Y.reshape(X2.shape), exact_Y,
                     training_tolerance(X2, ps2[0], ps2[1], mean, var, eps, f2))
    d_mean, d_var = statistics_tolerance(mean, var, X2.dtype)
    dtype = ps2[2].dtype  # T2 (15), U (14), T (1-9)
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        inv_std = 1 / np.sqrt(var + eps)
        expected = [
            (exact_rm, abs(1 - m) * d_mean + 4 * U64 * (np.abs(ps2[2].astype(F64) * m)
                                                      + np.abs(mean * (1 - m)))),
            (exact_rv, abs(1 - m) * d_var + 4 * U64 * (np.abs(ps2[3].astype(F64) * m)
                                                     + np.abs(var * (1 - m)))),
            (mean, d_mean),
            (var, d_var) if plan["saved_var"] == "variance" else
            (inv_std, 1.01 * d_var / (2 * (var + eps) ** 1.5)),
        ]
    for k, (got, (exact, propagated)) in enumerate(zip(outputs[1:], expected, strict=False)):
        if got is not None:
            expect_statistic(got.reshape(-1), exact, dtype, propagated, (exact.size,),
                             f"output {k + 1}")


def expect_instance(Y, X, params, eps, fmt):
    Xn, (scale, B) = as_native(X), [as_native(p) for p in params]
    assert isinstance(Y, np.ndarray) and Y.shape == Xn.shape and Y.dtype == Xn.dtype
    if Xn.size == 0:
        return
    exact, mean, var = instance_norm(Xn, scale, B, eps, fmt)
    assert_close(Y, exact, instance_tolerance(Xn, scale, B, mean, var, eps, fmt, Xn.dtype))


def expect_moments(result, X, fmt, partial):
    """``partial_moments``: exact counts, mean and M2 / count within the statistics
    error model; ``moments``: the same, then rounded to float32 (16-bit X) or float64."""
    Xn = as_native(X)
    C = channels(Xn, fmt)
    if partial:
        count, mean, M2 = result
        assert count.dtype == np.int64 and mean.dtype == M2.dtype == np.float64
        assert count.shape == mean.shape == M2.shape == (C,)
        np.testing.assert_array_equal(count, Xn.size // C if C else 0)
        if Xn.size == 0:
            assert not mean.any() and not M2.any()
            return
        var = M2 / count
    else:
        mean, var = result
        wide = F64 if Xn.dtype in (F32, F64) else F32
        assert mean.dtype == var.dtype == wide and mean.shape == var.shape == (C,)
        if C == 0:
            return
    exact_mean, exact_var = batch_statistics(Xn, fmt)
    d_mean, d_var = statistics_tolerance(exact_mean, exact_var, Xn.dtype)
    if partial:
        assert_close(mean, exact_mean, d_mean, "mean")
        assert_close(var, exact_var, d_var, "variance")
    else:
        expect_statistic(mean, exact_mean, mean.dtype, d_mean, (C,), "mean")
        expect_statistic(var, exact_var, var.dtype, d_var, (C,), "variance")


# --- one call each: the model's verdict, then the oracle ---

def check_batch_normalization(X, params, attrs, opset, fmt, num_outputs=None,
                              saved_var="variance"):
    kwargs = dict(attrs, opset=opset, data_format=fmt, num_outputs=num_outputs,
                  saved_var=saved_var)
    bad, plan = bn_model(X, params, attrs, opset, fmt, num_outputs, saved_var)
    result = call(nk.batch_normalization, [X, *params], kwargs, bad)
    if result is None:
        return
    count = bn_output_count(plan)
    assert isinstance(result, tuple) == (count > 1)
    outputs = list(result) if count > 1 else [result]
    assert len(outputs) == count
    expect_batch_normalization(outputs, X, params, plan, fmt)


def check_instance_normalization(X, params, attrs, opset, fmt):
    bad, eps = in_model(X, params, attrs, opset, fmt)
    result = call(nk.instance_normalization, [X, *params],
                  dict(attrs, opset=opset, data_format=fmt), bad)
    if result is not None:
        expect_instance(result, X, params, eps, fmt)


def check_batch_norm_inference(X, params, eps, fmt):
    kwargs = {"data_format": fmt} if eps is MISSING else {"epsilon": eps, "data_format": fmt}
    bad, epsilon = bni_model(X, params, eps, fmt)
    result = call(nk.batch_norm_inference, [X, *params], kwargs, bad)
    if result is None:
        return
    Xn, ps = as_native(X), [as_native(p) for p in params]
    assert result.shape == Xn.shape and result.dtype == Xn.dtype
    if X.size:
        assert_close(result, batch_norm(Xn, *ps, epsilon, fmt),
                     tolerance(Xn, *ps, epsilon, fmt, Xn.dtype))


# every defect of an attribute, opset or data_format, each operator (the fuzzers below
# draw these too, but not each one surely)
# (and values that are not defects but were once refused or mishandled)
ATTRIBUTE_DEFECTS = [float("nan"), float("inf"), -float("inf"), "x", "1e-3", b"1e-3", [1.0],
                     np.array(1e-3), True, np.bool_(False), None, 0.0, -1.0, 1e30, 10**400, 2,
                     np.float32(1e-3), np.int64(2), BFLOAT16.type(0.25)]
# the INT flags, each where its version has it (opset 15: training_mode; 6: is_test;
# 7: spatial); is_test=1 and 2 are test mode, so one output
FLAG_DEFECTS = ["x", "1", [0], 1.0, np.float64(0.0), None, 2, -1, True, np.int64(1),
                np.bool_(False)]
DEFECT_CASES = (
    [("bn", {"epsilon": v}) for v in ATTRIBUTE_DEFECTS]
    + [("bn", {"momentum": v, "training_mode": mode}) for v in ATTRIBUTE_DEFECTS
       for mode in (0, 1)]
    + [("bn", {"momentum": v, "opset": 9, "num_outputs": 1}) for v in ("x", "0.9", float("nan"))]
    + [("bn", {"training_mode": v}) for v in FLAG_DEFECTS]
    + [("bn", {"opset": 6, "is_test": v}) for v in FLAG_DEFECTS]
    + [("bn", {"opset": 7, "spatial": v, "num_outputs": 3}) for v in FLAG_DEFECTS]
    + [("in", {"epsilon": v}) for v in ATTRIBUTE_DEFECTS]
    + [("bni", {"epsilon": v}) for v in [*ATTRIBUTE_DEFECTS, MISSING, -1e-5]]
    + [(op, {"opset": v}) for op in ("bn", "in") for v in OPSET_DEFECTS]
    + [("bn", {"opset": v}) for v in (np.int64(15), np.int32(14), np.uint8(9), np.int16(6))]
    + [("in", {"opset": v}) for v in (np.int64(22), np.uint8(6), np.int64(1))]
    + [(op, {"data_format": v}) for op in ("bn", "in", "bni") for v in ["nchw", "NCHW", None]]
    + [("bn", {"opset": 15, "is_test": 1}), ("bn", {"opset": 9, "training_mode": 0}),
       ("bn", {"opset": 9, "spatial": 1}), ("bn", {"opset": 14, "spatial": 0}),
       ("bn", {"opset": 6, "is_test": 1, "consumed_inputs": [0]}),
       ("bn", {"opset": 15, "num_outputs": 1}), ("bn", {"opset": 9, "num_outputs": 6}),
       ("bn", {"opset": 6, "is_test": 1, "num_outputs": 3}),
       ("bn", {"training_mode": 1, "saved_var": "std"}),
       # saved_var is checked at every opset and in every mode
       ("bn", {"saved_var": "std"}), ("bn", {"opset": 14, "saved_var": None}),
       ("bn", {"opset": 9, "saved_var": b"variance"}),
       ("bn", {"opset": 6, "is_test": 1, "saved_var": ["inv_std"]}),
       ("bn", {"opset": 9, "num_outputs": 5, "saved_var": "inv_std"}),
       ("bn", {"opset": 9, "num_outputs": np.int64(3)}),
       ("in", {"opset": 22, "consumed_inputs": [0]}), ("in", {"opset": 1, "consumed_inputs": [0]})]
)


def defect_id(case):
    op, given = case
    return "-".join([op, *(f"{k}={'missing' if v is MISSING else repr(v)[:40]}"
                           for k, v in given.items())])


@pytest.mark.parametrize("op,given", DEFECT_CASES, ids=map(defect_id, DEFECT_CASES))
def test_each_attribute_defect(op, given):
    rng = np.random.default_rng(0)
    X = rng.standard_normal((2, 3, 4, 5)).astype(np.float32)
    given = dict(given)
    fmt = given.pop("data_format", "NXC" if op == "bni" else "NCX")
    C = 3 if fmt != "NXC" else 5
    params = [rng.uniform(-2, 2, C), rng.standard_normal(C), rng.standard_normal(C),
              rng.uniform(0.25, 4, C)]
    params = [p.astype(np.float32) for p in params]
    if op == "bn":
        opset = given.pop("opset", 15)
        num_outputs = given.pop("num_outputs", None)
        saved_var = given.pop("saved_var", "variance")
        check_batch_normalization(X, params, given, opset, fmt, num_outputs, saved_var)
    elif op == "in":
        opset = given.pop("opset", 22)
        check_instance_normalization(X, params[:2], given, opset, fmt)
    else:
        check_batch_norm_inference(X, params, given.get("epsilon", 1e-5), fmt)


# --- the operators ---

BN_OPSETS = [1, 6, 7, 9, 14, 15, 15, 22]
# how an opset comes: mostly a Python int, sometimes a NumPy integer
OPSET_TYPES = st.sampled_from([int, int, int, np.int64, np.int32, np.uint8])


@st.composite
def plausible_batch_normalization(draw):
    """Arguments that fit the drawn opset's record, mostly: the model still judges."""
    opset = draw(OPSET_TYPES)(draw(st.sampled_from(BN_OPSETS)))
    since = version(opset, BN_ATTRIBUTES)
    X = draw(tensors(FLOATS if since >= 14 else [d for d in FLOATS if d != "bfloat16"],
                     min_ndim=4 if since == 1 else 1, max_ndim=4 if since == 1 else 5,
                     sides=SIDES))
    fmt = draw(st.sampled_from(FORMATS))
    attrs = {"epsilon": draw(st.sampled_from([None, 1e-5, 1e-3, 0.0, 2, np.float32(1e-3),
                                              BFLOAT16.type(0.25)])),
             "momentum": draw(st.sampled_from([None, 0.9, 0.0, 0.5, -1.0, np.float64(0.5),
                                               np.int64(1)]))}
    if since >= 14:
        attrs["training_mode"] = draw(st.sampled_from([None, 0, 1, True, np.int64(1),
                                                       np.bool_(False)]))
    if since in (1, 6):  # nonzero is test mode
        attrs["is_test"] = draw(st.sampled_from([None, 0, 1, 2, -1, np.int8(1), False]))
    if since <= 7:
        attrs["spatial"] = draw(st.sampled_from([None, None, 1, 0, True, np.int64(0),
                                                 np.bool_(True)]))
    if since == 1:
        attrs["consumed_inputs"] = draw(st.sampled_from([None, [0, 0, 0, 1, 1]]))
    num_outputs = (draw(st.sampled_from([None, 1, 2, 3, 5, np.int64(3)])) if since < 14
                   else None)
    saved_var = draw(st.sampled_from(["variance", "inv_std"]))
    floats = st.sampled_from(ALL_FLOATS)
    t1 = draw(floats) if since == 15 else native(X)
    t2 = draw(floats) if since >= 14 else native(X)
    C = channels(X, fmt)
    shape = (C,)
    if attrs.get("spatial") == 0:
        sample = X.shape[1:] or (1,)
        shape = draw(st.sampled_from([sample, (C,)] if since in (1, 6) else [sample]))
    params = draw(well_formed(shape, (t1, t1, t2, t2)))
    return X, params, opset, attrs, fmt, num_outputs, saved_var


# the one defect (or not) of each target of test_batch_normalization that is no tensor
BN_DEFECTS = {"epsilon": FLOAT_DEFECTS, "momentum": FLOAT_DEFECTS, "flag": INT_DEFECTS,
              "attribute": st.sampled_from([0, 1, [0], "1", 1.0]),
              "opset": st.sampled_from(OPSET_DEFECTS),
              "data_format": st.sampled_from(["nchw", "NHWC", None]),
              "num_outputs": st.sampled_from([0, 6, True, 2.0, 3, np.int64(0), np.float64(3.0),
                                              "3"]),
              # (saved_var, in inference): refused in every mode
              "saved_var": st.tuples(st.sampled_from(["std", None, b"variance", "Variance",
                                                      ["inv_std"]]), st.booleans())}


@SETTINGS
@given(st.data())
def test_batch_normalization(data):
    branch = data.draw(st.sampled_from(["plausible", "one defect", "hostile"]))
    if branch == "one defect":  # the target, and its value unless it is a tensor, up front
        target = data.draw(st.sampled_from([*BN_INPUTS, *BN_INPUTS, "epsilon", "epsilon",
                                            "momentum", "momentum", "flag", "flag",
                                            "attribute", "opset", "data_format",
                                            "num_outputs", "saved_var"]))
        value = data.draw(BN_DEFECTS[target]) if target in BN_DEFECTS else None
    if branch != "hostile":
        X, params, opset, attrs, fmt, num_outputs, saved_var = data.draw(
            plausible_batch_normalization())
    if branch == "one defect":
        if target == "X":
            X = data.draw(spoiled_tensor(X))
        elif target in BN_INPUTS:
            k = BN_INPUTS.index(target) - 1
            params[k] = data.draw(spoiled_parameter(params[k]))
        elif target in ("epsilon", "momentum"):  # in every mode
            attrs[target] = value
        elif target == "flag":  # an INT flag of the opset's version (none in 9)
            flags = sorted({"training_mode", "is_test", "spatial"}
                           & BN_ATTRIBUTES[version(opset, BN_ATTRIBUTES)]) or ["training_mode"]
            attrs[data.draw(st.sampled_from(flags))] = value
        elif target == "attribute":
            attrs[data.draw(st.sampled_from(sorted(BN_SIGNATURE)))] = value
        elif target == "opset":
            opset = value
        elif target == "data_format":
            fmt = value
        elif target == "num_outputs":
            num_outputs = value
        else:  # in every mode, at every opset
            saved_var, inference = value
            if inference:
                since = version(opset, BN_ATTRIBUTES)
                if since >= 14:
                    attrs["training_mode"] = 0
                elif since in (1, 6):
                    attrs["is_test"], num_outputs = 1, None
                else:  # 7, 9: one output
                    num_outputs = 1
    if branch == "hostile":
        X = data.draw(tensors())
        fmt = data.draw(st.sampled_from(["NCX", "NXC", "NCX", "nchw"]))
        params = data.draw(parameters(X, fmt, 4))
        opset = data.draw(st.sampled_from([15, 15, 14, 9, 7, 6, 1, 0, 22, "15", True, 14.0,
                                           np.int64(15), np.int32(6), np.float64(9.0)]))
        flag = st.sampled_from([None, None, None, 0, 1, 1, 2, -1, True, np.int64(1), "x", 1.0,
                                [0]])
        attrs = {"epsilon": data.draw(ATTRIBUTE_VALUES),
                 "momentum": data.draw(ATTRIBUTE_VALUES),
                 "training_mode": data.draw(flag),
                 "is_test": data.draw(flag),
                 "spatial": data.draw(st.one_of(st.none(), flag)),
                 "consumed_inputs": data.draw(st.sampled_from([None, None, None, [0]]))}
        num_outputs = data.draw(st.sampled_from([None, None, None, None, 1, 3, 5, 6, 0, True,
                                                 np.int64(3)]))
        saved_var = data.draw(st.sampled_from(["variance"] * 4 + ["inv_std", "std", None]))
    check_batch_normalization(X, params, attrs, opset, fmt, num_outputs, saved_var)


def test_saved_inv_std_of_a_zero_variance_is_inf():
    """Opsets 1-9 training, saved_var="inv_std": a zero var + epsilon (one element per
    channel, epsilon=0) gives inf, as 1 / sqrt(var + epsilon) does, with no warning
    (it once leaked NumPy's divide-by-zero RuntimeWarning)."""
    X = np.array([0.5], np.float32)
    params = [np.ones(1, np.float32)] * 4
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        outputs = nk.batch_normalization(X, *params, opset=6, epsilon=0.0, num_outputs=5,
                                         saved_var="inv_std")
    assert outputs[4].dtype == np.float32 and outputs[4][0] == np.inf
    assert outputs[2][0] == np.float32(0.9) and outputs[3][0] == 0.5  # running var, saved mean


@st.composite
def plausible_instance_normalization(draw):
    opset = draw(OPSET_TYPES)(draw(st.sampled_from([1, 6, 7, 22, 23])))
    since = version(opset, IN_VERSIONS)
    X = draw(tensors(FLOATS if since == 22 else [d for d in FLOATS if d != "bfloat16"],
                     min_ndim=4 if since == 1 else 3, max_ndim=4 if since == 1 else 5,
                     sides=SIDES))
    fmt = draw(st.sampled_from(FORMATS))
    attrs = {"epsilon": draw(st.sampled_from([None, 1e-5, 1e-3, 0.0, np.float32(1e-3),
                                              np.int64(1)]))}
    if since == 1:
        attrs["consumed_inputs"] = draw(st.sampled_from([None, [0, 0, 0]]))
    params = draw(well_formed((channels(X, fmt),), (native(X),) * 2))
    return X, params, opset, attrs, fmt


IN_DEFECTS = {"epsilon": FLOAT_DEFECTS, "consumed_inputs": st.just([0]),
              "opset": st.sampled_from(OPSET_DEFECTS),
              "data_format": st.sampled_from(["nchw", "NHWC", None])}


@SETTINGS
@given(st.data())
def test_instance_normalization(data):
    branch = data.draw(st.sampled_from(["plausible", "one defect", "hostile"]))
    if branch == "one defect":  # the target, and its value unless it is a tensor, up front
        target = data.draw(st.sampled_from(["input", "scale", "B"] * 2 + [
            "epsilon", "epsilon", "epsilon", "consumed_inputs", "opset", "data_format"]))
        value = data.draw(IN_DEFECTS[target]) if target in IN_DEFECTS else None
    if branch != "hostile":
        X, params, opset, attrs, fmt = data.draw(plausible_instance_normalization())
    if branch == "one defect":
        if target == "input":
            X = data.draw(spoiled_tensor(X))
        elif target in ("scale", "B"):
            k = ("scale", "B").index(target)
            params[k] = data.draw(spoiled_parameter(params[k]))
        elif target in ("epsilon", "consumed_inputs"):
            attrs[target] = value
        elif target == "opset":
            opset = value
        else:
            fmt = value
    if branch == "hostile":
        X = data.draw(tensors())
        fmt = data.draw(st.sampled_from(["NCX", "NXC", "NCX", "nchw"]))
        params = data.draw(parameters(X, fmt, 2))
        opset = data.draw(st.sampled_from([22, 6, 1, 0, 23, "22", np.int64(22), 22.0]))
        attrs = {"epsilon": data.draw(ATTRIBUTE_VALUES),
                 "consumed_inputs": data.draw(st.sampled_from([None, None, [0]]))}
    check_instance_normalization(X, params, attrs, opset, fmt)


BNI_DEFECTS = {"epsilon": st.sampled_from([*FLOAT_DEFECT_LIST, MISSING, None, -1e-5]),
               "data_format": st.sampled_from(["nchw", "NHWC", None])}


@SETTINGS
@given(st.data())
def test_batch_norm_inference(data):
    branch = data.draw(st.sampled_from(["plausible", "one defect", "hostile"]))
    if branch == "one defect":  # the target, and its value unless it is a tensor, up front
        target = data.draw(st.sampled_from(["input", *BNI_PARAMS] * 2
                                           + ["epsilon", "epsilon", "epsilon", "data_format"]))
        value = data.draw(BNI_DEFECTS[target]) if target in BNI_DEFECTS else None
    if branch != "hostile":
        X = data.draw(tensors(["float32", "float16", "bfloat16", ">f4"], min_ndim=2,
                              sides=SIDES))
        fmt = data.draw(st.sampled_from(FORMATS))
        t2 = data.draw(st.sampled_from([F32, BFLOAT16] if native(X) == BFLOAT16 else [F32]))
        params = data.draw(well_formed((channels(X, fmt),), (t2,) * 4))
        eps = data.draw(st.sampled_from([1e-5, 1e-3, 2, 1e30]))
    if branch == "one defect":
        if target == "input":
            X = data.draw(spoiled_tensor(X))
        elif target in BNI_PARAMS:
            k = BNI_PARAMS.index(target)
            params[k] = data.draw(spoiled_parameter(params[k]))
        elif target == "epsilon":
            eps = value
        else:
            fmt = value
    if branch == "hostile":
        X = data.draw(tensors())
        fmt = data.draw(st.sampled_from(["NXC", "NCX", "nhwc"]))
        params = data.draw(parameters(X, fmt, 4))
        eps = data.draw(st.sampled_from([*ATTRIBUTE_VALUE_LIST, MISSING]))
    check_batch_norm_inference(X, params, eps, fmt)


@SETTINGS
@given(st.data())
def test_moments(data):
    X = data.draw(tensors(FLOATS, sides=SIDES) if data.draw(st.booleans()) else tensors())
    fmt = data.draw(st.sampled_from(["NCX", "NXC", "NCX", "NXC", "nhwc"]))
    for fn, partial in ((nk.moments, False), (nk.partial_moments, True)):
        result = call(fn, [X], {"data_format": fmt}, moments_model(X, fmt, partial))
        if result is not None:
            expect_moments(result, X, fmt, partial)


@SETTINGS
@given(st.data())
def test_out_arrays(data):
    X = data.draw(tensors(dtypes=["float32", "float16"], sides=SIDES))
    if data.draw(st.sampled_from([True, True, True, False])):
        params = data.draw(well_formed((channels(X, "NCX"),), (np.dtype(np.float32),) * 4))
    else:
        params = data.draw(parameters(X, "NCX", 4))
    kind = data.draw(st.sampled_from(["X", "new", "wrong-shape", "wrong-dtype", "read-only",
                                      "list", "overlap", "parameter"]))
    out = {"X": X, "new": np.empty_like(X), "wrong-shape": np.empty((*X.shape, 1), X.dtype),
           "wrong-dtype": np.empty(X.shape, np.float64), "list": [0.0],
           "read-only": np.empty_like(X), "overlap": None, "parameter": None}[kind]
    if kind == "read-only":
        out.flags.writeable = False
    if kind == "overlap":
        if X.size < 2:
            return
        buf = np.empty(X.size + 1, X.dtype)
        buf[:X.size] = X.ravel()
        X = buf[:X.size].reshape(X.shape)
        out = buf[1:].reshape(X.shape)
    if kind == "parameter":  # B is a view into out
        C = channels(X, "NCX")
        if not 0 < C <= X.size or not isinstance(params[0], np.ndarray):
            return
        out = np.zeros(X.shape, X.dtype)
        params = [params[0].astype(X.dtype), out.reshape(-1)[:C], *params[2:]]
    values = [X, *params]
    original = X.copy()
    bad, plan = bn_model(X, params, {}, 15, "NCX", out=out)
    # in place: X is the output, so only the parameters must stay
    result = call(nk.batch_normalization, values, {"out": out}, bad,
                  watched=params if kind == "X" else values)
    if result is not None:
        assert kind in ("X", "new") and result is out
        expect_batch_normalization([result], original, params, plan, "NCX")


# --- ONNX nodes ---

BN_SIGNATURE = {"epsilon", "momentum", "training_mode", "is_test", "spatial",
                "consumed_inputs"}
IN_SIGNATURE = {"epsilon", "consumed_inputs"}


def node_model(op, inputs, attrs, outputs, opset):
    """``run_node``: ``(bad, plan)``. Attributes go to the operator as keywords (one
    it does not take is Python's TypeError naming it); opsets 1-9 get the number of
    outputs the node declares; a node declaring more outputs than the mode produces
    is a ValueError about its outputs."""
    bad = Bad()
    if op not in ("BatchNormalization", "InstanceNormalization"):
        bad.add(op, NotImplementedError)
        return bad, None
    arity = 5 if op == "BatchNormalization" else 3
    if len(inputs) != arity:
        bad.add("inputs", ValueError)
        return bad, None
    signature = BN_SIGNATURE if op == "BatchNormalization" else IN_SIGNATURE
    for name in attrs.keys() - signature:
        bad.add(name, TypeError)
    known = {k: v for k, v in attrs.items() if k in signature}
    if op == "InstanceNormalization":
        inner, eps = in_model(inputs[0], inputs[1:], known, 22 if opset is None else opset,
                              "NCX")
        bad.merge(inner)
        if len(outputs) > 1:
            bad.add("outputs", ValueError)
        return bad, eps
    opset = 15 if opset is None else opset
    since = version(opset, BN_ATTRIBUTES)
    requested = len(outputs)
    while requested and not outputs[requested - 1]:
        requested -= 1
    num_outputs = max(1, requested) if since is not None and since < 14 else None
    inner, plan = bn_model(inputs[0], inputs[1:], known, opset, "NCX", num_outputs)
    bad.merge(inner)
    if plan is not None and bn_output_count(plan) < len(outputs):
        bad.add("outputs", ValueError)
    return bad, plan


@SETTINGS
@given(st.data())
def test_run_node(data):
    pytest.importorskip("onnx")
    from onnx import helper

    from normkernels import onnx as nko

    op = data.draw(st.sampled_from(["BatchNormalization", "InstanceNormalization"] * 2
                                   + ["Relu"]))
    n_inputs = {"BatchNormalization": 5, "InstanceNormalization": 3}.get(op, 2)
    opset = data.draw(st.sampled_from([None, 1, 6, 7, 9, 14, 15, 22, 0]))
    plausible = data.draw(st.sampled_from([True, True, False]))
    if plausible:  # float inputs of one dtype, attributes the opset's version has
        low = 4 if opset == 1 else 3 if op == "InstanceNormalization" else 1
        X = data.draw(tensors(dtypes=["float32", "float16", "float64"], min_ndim=low,
                              max_ndim=4, sides=SIDES))
        rng = np.random.default_rng(data.draw(st.integers(0, 99)))
        params = [rng.uniform(0.5, 2, channels(X, "NCX")).astype(native(X))
                  for _ in range(n_inputs - 1)]
        since = version(15 if opset is None else opset, BN_ATTRIBUTES)
        attribute_names = (sorted(BN_ATTRIBUTES.get(since, {"epsilon"}) - {"spatial"})
                           if op == "BatchNormalization" else ["epsilon"])
        outputs = data.draw(st.sampled_from([["y"], ["y"], ["y", "m", "v"], ["y", "", "v"],
                                             ["y", "a", "b", "c", "d"]]
                                            if op == "BatchNormalization" else
                                            [["y"], ["y"], ["y"], ["y", "m", "v"]]))
    else:
        X = data.draw(tensors(dtypes=["float32", "float16", "int32", "float64"]))
        params = data.draw(parameters(X, "NCX", n_inputs - 1))
        attribute_names = ["epsilon", "momentum", "spatial", "is_test", "training_mode",
                           "consumed_inputs", "bogus"]
        outputs = data.draw(st.sampled_from([["y"], ["y", "m", "v"], ["y", "", "v"],
                                             ["y", "a", "b", "c", "d"]]))
    inputs = [X, *params]
    arity = "same" if plausible else data.draw(st.sampled_from(["same"] * 4 + ["fewer", "more"]))
    if arity == "fewer":
        inputs = inputs[:-1]
    elif arity == "more":
        inputs = [*inputs, inputs[-1]]
    attrs = {}
    for name in data.draw(st.lists(st.sampled_from(attribute_names), max_size=3, unique=True)):
        # as ONNX types them: FLOAT, INT (2 and -1: only is_test takes them), STRING
        # (bytes when read back), INTS; a FLOAT where an INT is due is refused
        attrs[name] = data.draw(st.sampled_from([1e-5, 0.9, 1, 0, 2, -1, -1.0, "1e-3",
                                                 [0, 1]]))
    try:
        node = helper.make_node(op, [f"i{k}" for k in range(n_inputs)], outputs, **attrs)
    except Exception:
        return  # onnx refuses the attribute itself
    # as the node holds them (FLOAT attributes are float32)
    read = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    bad, plan = node_model(op, inputs, read, outputs, opset)
    result = call(nko.run_node, [node, inputs, opset], {}, bad, watched=inputs)
    if result is None:
        return
    assert isinstance(result, list) and len(result) == len(outputs)
    assert all((r is None) == (not name) for r, name in zip(result, outputs, strict=True))
    if op == "InstanceNormalization":
        expect_instance(result[0], X, params, plan, "NCX")
    else:
        expect_batch_normalization(result, X, params, plan, "NCX")


# --- merge_moments ---

def merged(a, b, bound_a=(0.0, 0.0), bound_b=(0.0, 0.0)):
    """``merge_moments(a, b)`` (its inputs unmodified), and how far its mean and M2 may
    lie from Chan's formula in exact arithmetic on the exact partials, given such
    bounds for ``a`` and ``b``: first order in float64's unit roundoff, doubled."""
    before = snapshot([*a, *b])
    m = nk.merge_moments(a, b)
    assert_unchanged(before, [*a, *b])
    n_a, n_b = a.count.astype(F64), b.count.astype(F64)
    n = np.maximum(n_a + n_b, 1)
    w_a, w_b = n_a / n, n_b / n
    delta = np.abs(b.mean - a.mean)
    t = delta * delta * n_a * w_b  # the between-partials term of M2
    e_mean = w_a * bound_a[0] + w_b * bound_b[0] + U64 * (np.abs(m.mean) + 4 * delta * w_b)
    e_m2 = (bound_a[1] + bound_b[1] + 2 * delta * (bound_a[0] + bound_b[0]) * n_a * w_b
            + U64 * (2 * np.abs(m.M2) + 6 * t))
    return m, (2 * e_mean, 2 * e_m2)


def assert_same_merge(x, bound_x, y, bound_y, what):
    np.testing.assert_array_equal(x.count, y.count)
    for k, name in ((1, "mean"), (2, "M2")):
        err = np.abs(x[k] - y[k])
        allowed = bound_x[k - 1] + bound_y[k - 1]
        assert np.all(err <= allowed), (what, name, err, allowed)


def assert_identical_moments(x, y):
    for a, b in zip(x, y, strict=True):
        assert_identical(np.asarray(a), np.asarray(b))


@SETTINGS
@given(st.data())
def test_merge_moments(data):
    ndim = data.draw(st.integers(1, 4))
    shape = tuple(data.draw(st.lists(st.integers(0, 6), min_size=ndim, max_size=ndim)))
    dtype = dtype_of(data.draw(st.sampled_from(["float16", "bfloat16", "float32",
                                                "float64", "float64"])))
    fmt = data.draw(st.sampled_from(FORMATS))
    offset = data.draw(st.sampled_from([0.0, 0.0, 3.0, 1e4]))
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1)))
    X = (rng.standard_normal(shape) * 3 + offset).astype(dtype)
    C = channels(X, fmt)

    def partial(piece):
        return nk.partial_moments(piece, data_format=fmt)

    whole = partial(X)
    # identity: a partial of an empty slice (count 0) changes nothing, bit for bit
    empty = partial(X[:0])
    np.testing.assert_array_equal(empty.count, 0)
    for m in (nk.merge_moments(whole, empty), nk.merge_moments(empty, whole)):
        assert_identical_moments(m, whole)
    # split along N, or along a spatial axis
    spatial_axes = (list(range(2, ndim)) if fmt == "NCX" else list(range(1, ndim - 1)))
    axis = data.draw(st.sampled_from([0, 0, *spatial_axes]))
    length = X.shape[axis]
    cut = st.integers(0, length)
    a, b, c = (partial(p) for p in np.split(X, sorted(data.draw(
        st.lists(cut, min_size=2, max_size=2))), axis=axis))
    # order: merge(a, b) and merge(b, a) within float64 rounding of Chan's formula
    ab, bound_ab = merged(a, b)
    ba, bound_ba = merged(b, a)
    assert_same_merge(ab, bound_ab, ba, bound_ba, "order")
    # associativity
    left, bound_left = merged(ab, c, bound_ab)
    bc, bound_bc = merged(b, c)
    right, bound_right = merged(a, bc, (0.0, 0.0), bound_bc)
    assert_same_merge(left, bound_left, right, bound_right, "associativity")
    # any split, merged in any order, gives the statistics of the whole
    pieces = np.split(X, sorted(data.draw(st.lists(cut, max_size=4))), axis=axis)
    parts = [partial(pieces[k]) for k in data.draw(st.permutations(range(len(pieces))))]
    while len(parts) > 1:
        k = data.draw(st.integers(0, len(parts) - 2))
        parts[k:k + 2] = [merged(parts[k], parts[k + 1])[0]]
    for total in (parts[0], left, right):
        np.testing.assert_array_equal(total.count, whole.count)
        if X.size == 0:
            assert not total.mean.any() and not total.M2.any()
            continue
        exact_mean, exact_var = batch_statistics(X, fmt)
        d_mean, d_var = statistics_tolerance(exact_mean, exact_var, dtype)
        assert_close(total.mean, exact_mean, d_mean, "merged mean")
        assert_close(total.M2 / total.count, exact_var, d_var, "merged variance")
    # partials of different channel counts do not merge
    other = partial(np.ones((2, C + 1), np.float32) if fmt == "NXC" or ndim > 1
                    else np.ones((2, 2), np.float32))
    if other.count.shape != whole.count.shape:
        for pair in ((whole, other), (other, whole)):
            with pytest.raises(ValueError, match="must describe the same channels"):
                nk.merge_moments(*pair)

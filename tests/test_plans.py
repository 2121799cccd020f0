"""Call plans (normkernels/ops/plans.py) never serve a call they were not made for.

Each test makes a first call (which leaves a plan), checks that a plan was made, and
then makes a call that differs in one way a plan must notice: other strides, dtype,
attribute type, an ``out`` that is read-only, overlaps X, or shares memory with a
parameter (really, or only by its bounds), parameters changed in place, a policy
changed at run time. Every result is compared bit for bit with the slow twin
(which makes no plans: it runs on another engine, part of the key) and with the
float64 oracle; every error must be the one the full checks give.
"""

import contextlib

import numpy as np
import pytest
from arrays import BFLOAT16, assert_identical
from oracle import (
    assert_close,
    batch_norm,
    batch_statistics,
    group_tolerance,
    instance_norm,
    instance_tolerance,
    statistics_tolerance,
    tolerance,
    training_tolerance,
)
from oracle import group_norm as oracle_group_norm

import normkernels as nk
from normkernels import reference
from normkernels.engine import policy
from normkernels.ops import batch_norm_inference as bni_spec
from normkernels.ops import batch_normalization as bn_spec
from normkernels.ops import onednn_training, plans

SHAPE = (2, 5, 6, 7)  # NCX; serial path


@pytest.fixture(autouse=True)
def fresh_plans():
    plans.clear()
    yield
    plans.clear()


def _params(rng, C, dtype=np.float32):
    scale, B, mean = (rng.normal(size=C).astype(dtype) for _ in range(3))
    var = rng.uniform(0.5, 2.0, C).astype(dtype)
    return [scale, B, mean, var]


def _check(Y, X, params, epsilon=1e-5, data_format="NCX", twin=None):
    want = batch_norm(X, *params, epsilon, data_format)
    assert_close(Y, want, tolerance(X, *params, epsilon, data_format, X.dtype))
    if twin is not None:
        assert_identical(Y, twin)


def _forbid_full_path(monkeypatch):
    """Make the full path fail: a call that gets through used its plan."""
    def boom(*args, **kwargs):
        raise AssertionError("the full path ran: the plan was not used")
    monkeypatch.setattr(bn_spec, "prepare", boom)
    monkeypatch.setattr(bni_spec.common, "check_data_format", boom)


OPS = {
    "onnx": lambda X, p, **kw: nk.batch_normalization(X, *p, **kw),
    "onednn": lambda X, p, **kw: nk.batch_norm_inference(
        X, *p, epsilon=kw.pop("epsilon", 1e-5), data_format=kw.pop("data_format", "NCX"),
        **kw),
}
TWINS = {
    "onnx": lambda X, p, **kw: reference.batch_normalization(X, *p, **kw),
    "onednn": lambda X, p, **kw: reference.batch_norm_inference(
        X, *p, epsilon=kw.pop("epsilon", 1e-5), data_format=kw.pop("data_format", "NCX"),
        **kw),
}


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("data_format", ["NCX", "NXC"])
@pytest.mark.parametrize("out_kind", ["none", "out", "inplace"])
def test_second_call_uses_the_plan(rng, monkeypatch, op, data_format, out_kind):
    shape = SHAPE if data_format == "NCX" else (2, 6, 7, 5)
    params = _params(rng, 5)
    first = rng.normal(3, 2, shape).astype(np.float32)
    X = rng.normal(-1, 0.5, shape).astype(np.float32)

    def call(X):
        out = {"none": None, "out": np.empty_like(X), "inplace": X}[out_kind]
        return OPS[op](X, params, data_format=data_format, out=out), out

    call(first.copy())
    assert len(plans.stored_keys()) == 1
    twin = TWINS[op](X, params, data_format=data_format)
    _forbid_full_path(monkeypatch)
    Y, out = call(Xc := X.copy())
    assert Y is out if out is not None else Y.shape == X.shape
    _check(Y, X, params, data_format=data_format, twin=twin)
    if out_kind != "inplace":
        assert_identical(Xc, X)


def test_channels_last_memory_uses_its_plan(rng, monkeypatch):
    """Logically NCX, stored channels-last (PyTorch's channels_last): no copy, and Y
    in the same memory order."""
    params = _params(rng, 5)
    X = np.ascontiguousarray(rng.normal(size=(2, 6, 7, 5)).astype(np.float32))
    X = X.transpose(0, 3, 1, 2)  # NCX view of NXC memory
    nk.batch_normalization(X, *params)
    twin = reference.batch_normalization(X, *params)
    _forbid_full_path(monkeypatch)
    Y = nk.batch_normalization(X, *params)
    assert Y.strides == X.strides
    _check(Y, X, params, twin=twin)


def test_other_strides_get_the_full_path(rng):
    params = _params(rng, 5)
    X = rng.normal(size=SHAPE).astype(np.float32)
    nk.batch_normalization(X, *params)
    wide = rng.normal(size=(2, 5, 6, 14)).astype(np.float32)
    strided = wide[..., ::2]  # the same shape, other strides: not the plan's layout
    Y = nk.batch_normalization(strided, *params)
    _check(Y, strided, params, twin=reference.batch_normalization(strided, *params))
    out = np.empty_like(X)
    nk.batch_normalization(X, *params, out=out)
    strided_out = np.zeros((2, 5, 6, 14), np.float32)[..., ::2]
    Y = nk.batch_normalization(X, *params, out=strided_out)
    assert Y is strided_out
    _check(Y, X, params, twin=reference.batch_normalization(X, *params))
    reversed_scale = params[0][::-1].copy()[::-1]  # negative stride parameter
    Y = nk.batch_normalization(X, reversed_scale, *params[1:])
    _check(Y, X, [reversed_scale, *params[1:]])


@pytest.mark.parametrize("dtype", [np.float16, BFLOAT16, np.float64])
def test_other_dtype_gets_its_own_result(rng, dtype):
    params = _params(rng, 5)
    X = rng.normal(size=SHAPE).astype(np.float32)
    nk.batch_normalization(X, *params)
    Xd = X.astype(dtype)
    Y = nk.batch_normalization(Xd, *params)
    assert Y.dtype == dtype
    _check(Y, Xd, params, twin=reference.batch_normalization(Xd, *params))


def test_other_dtype_error_still_raised(rng):
    params = _params(rng, 5)
    X = rng.normal(size=SHAPE).astype(np.float32)
    nk.batch_normalization(X, *params, opset=9)
    with pytest.raises(TypeError, match="X has dtype bfloat16"):
        nk.batch_normalization(X.astype(BFLOAT16), *params, opset=9)
    with pytest.raises(TypeError, match="int32"):
        nk.batch_normalization(X.astype(np.int32), *params, opset=9)


def test_non_native_byte_order_is_converted(rng):
    params = _params(rng, 5)
    X = rng.normal(size=SHAPE).astype(np.float32)
    nk.batch_normalization(X, *params)
    swapped = X.astype(">f4")
    for _ in range(2):  # the second call may not have left a plan for ">f4"
        Y = nk.batch_normalization(swapped, *params)
        _check(Y, X, params, twin=reference.batch_normalization(X, *params))
    assert all(key[24] != np.dtype(">f4") for key in plans.stored_keys())


@pytest.mark.parametrize("name,good,bad", [
    ("training_mode", 0, 0.0), ("epsilon", 1e-3, "1e-3"), ("opset", 15, 15.0),
    ("spatial", 1, 1.0), ("is_test", 1, 1.5)])
def test_attribute_of_another_type_still_raises(rng, name, good, bad):
    params = _params(rng, 5)
    X = rng.normal(size=SHAPE).astype(np.float32)
    opset = 6 if name in ("spatial", "is_test") else 15
    kwargs = {"opset": opset, name: good}
    nk.batch_normalization(X, *params, **kwargs)
    nk.batch_normalization(X, *params, **kwargs)
    with pytest.raises((TypeError, ValueError), match=name):
        nk.batch_normalization(X, *params, **{**kwargs, name: bad})


def test_bool_and_numpy_attributes(rng):
    """Valid attributes of other types (bool, NumPy scalars) give the same result."""
    params = _params(rng, 5)
    X = rng.normal(size=SHAPE).astype(np.float32)
    want = nk.batch_normalization(X, *params, training_mode=0, epsilon=1e-3)
    for tm, eps in [(False, 1e-3), (np.int64(0), np.float64(1e-3)), (0, np.float32(1e-3))]:
        Y = nk.batch_normalization(X, *params, training_mode=tm, epsilon=eps)
        twin = reference.batch_normalization(X, *params, training_mode=tm, epsilon=eps)
        assert_identical(Y, twin)
        if type(eps) is not np.float32:
            assert_identical(Y, want)


def test_signed_zero_epsilon(rng):
    """-0.0 and 0.0 are equal keys; a variance of -0.0 tells them apart (1/-0 is -inf)."""
    X = rng.normal(size=(1, 2, 4, 8)).astype(np.float32)
    params = [np.ones(2, np.float32), np.zeros(2, np.float32), np.zeros(2, np.float32),
              np.array([-0.0, 1.0], np.float32)]
    for eps in (0.0, -0.0, 0.0, -0.0):
        Y = nk.batch_normalization(X, *params, epsilon=eps)
        want = batch_norm(X, *params, eps)  # the float64 oracle: -0.0 + -0.0 is -0.0
        assert np.isinf(want[0, 0]).all()
        assert_identical(Y[0, 0], want[0, 0].astype(np.float32))


def test_signed_zero_momentum_has_a_plan_of_its_own(rng):
    """A training call with momentum 0.0 (the PyTorch adapter's) leaves a plan, and a
    call with -0.0 (an equal key but for the sign) is not served by it: each sign runs
    the full path once and then its own plan, with the full path's bits."""
    X = rng.normal(size=(2, 3, 4, 4)).astype(np.float32)
    params = _params(rng, 3)
    for i, momentum in enumerate((0.0, 0.0, -0.0, -0.0)):
        got = nk.batch_normalization(X, *params, training_mode=1, momentum=momentum)
        want = _spec_call(bn_spec, "batch_normalization")(X, *params, training_mode=1,
                                                          momentum=momentum)
        for a, b in zip(got, want, strict=True):
            assert_identical(a, b)
        assert len(plans.stored_keys()) == 1 + (i >= 2), i


@pytest.mark.parametrize("op", OPS)
def test_read_only_out_after_a_plan(rng, op):
    params = _params(rng, 5)
    X = rng.normal(size=SHAPE).astype(np.float32)
    out = np.empty_like(X)
    OPS[op](X, params, out=out)
    OPS[op](X, params, out=out)
    frozen = np.zeros_like(X)
    frozen.flags.writeable = False
    with pytest.raises(ValueError, match="out is read-only"):
        OPS[op](X, params, out=frozen)
    assert not frozen.any()
    X.flags.writeable = False
    with pytest.raises(ValueError, match="out is read-only"):
        OPS[op](X, params, out=X)


@pytest.mark.parametrize("op", OPS)
def test_out_overlapping_x_after_a_plan(rng, op):
    size = int(np.prod(SHAPE))
    buf = rng.normal(size=size + 7).astype(np.float32)
    X = buf[:size].reshape(SHAPE)
    params = _params(rng, 5)
    OPS[op](X, params, out=np.empty_like(X))
    before = buf.copy()
    shifted = buf[7:].reshape(SHAPE)  # same shape, strides, dtype as a plain out
    with pytest.raises(ValueError, match="overlaps X"):
        OPS[op](X, params, out=shifted)
    assert_identical(buf, before)


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("which", range(4))
def test_out_sharing_a_parameter_after_a_plan(rng, op, which):
    size = int(np.prod(SHAPE))
    X = rng.normal(size=SHAPE).astype(np.float32)
    params = _params(rng, 5)
    OPS[op](X, params, out=np.empty_like(X))
    buf = rng.normal(size=size).astype(np.float32)
    out = buf.reshape(SHAPE)
    shared = list(params)
    shared[which] = buf[100:105]
    before = buf.copy()
    with pytest.raises(ValueError, match="shares memory with"):
        OPS[op](X, shared, out=out)
    assert_identical(buf, before)


def test_bounds_overlap_without_sharing(rng):
    """out inside the gaps of a strided parameter: the plan's bounds check hands the
    call to the full checks, which find no shared element and compute it."""
    size = int(np.prod(SHAPE))
    stride = size + 8
    buf = rng.uniform(0.5, 2.0, 5 * stride).astype(np.float32)
    var = buf[::stride]  # 5 elements, far apart
    out = buf[1:1 + size].reshape(SHAPE)  # between var[0] and var[1]
    scale, B, mean = _params(rng, 5)[:3]
    X = rng.normal(size=SHAPE).astype(np.float32)
    plain_var = np.empty(5 * stride, np.float32)[::stride]
    plain_var[:] = var
    nk.batch_normalization(X, scale, B, mean, plain_var, out=np.empty_like(X))
    assert len(plans.stored_keys()) == 1
    want = reference.batch_normalization(X, scale, B, mean, var.copy())
    Y = nk.batch_normalization(X, scale, B, mean, var, out=out)
    assert Y is out
    assert_identical(Y, want)


def test_parameters_changed_in_place_are_read_again(rng):
    params = _params(rng, 5)
    X = rng.normal(size=SHAPE).astype(np.float32)
    nk.batch_normalization(X, *params)
    for p in params:
        p *= 1.5
    Y = nk.batch_normalization(X, *params)
    _check(Y, X, params, twin=reference.batch_normalization(X, *params))


@pytest.mark.skipif(not policy.streaming_supported(), reason="streaming needs x86-64")
def test_policy_changes_apply_to_planned_calls(rng, monkeypatch):
    """The path is decided on every call, never stored in a plan."""
    taken = []
    monkeypatch.setattr(policy, "_trace", taken.append)
    params = _params(rng, 8)
    X = rng.normal(size=(8, 8, 96, 96)).astype(np.float32)
    out = np.empty_like(X)
    nk.batch_normalization(X, *params, out=out)
    nk.batch_normalization(X, *params, out=out)
    assert taken[-1] == "scale_shift/planes/parallel"
    monkeypatch.setenv(policy.STREAMING_ENV, "always")
    nk.batch_normalization(X, *params, out=out)
    assert taken[-1] == "scale_shift/planes/streaming"
    monkeypatch.setattr(policy, "NORMALIZE_SERIAL_MAX_ELEMENTS", X.size)
    Y = nk.batch_normalization(X, *params, out=out)
    assert taken[-1] == "scale_shift/planes/serial"
    _check(Y, X, params, twin=reference.batch_normalization(X, *params))


def test_store_is_bounded(rng, monkeypatch):
    monkeypatch.setattr(plans, "LIMIT", 3)
    params = _params(rng, 5)
    for n in range(1, 8):
        X = rng.normal(size=(n, 5, 3)).astype(np.float32)
        _check(nk.batch_normalization(X, *params), X, params)
        assert 1 <= len(plans.stored_keys()) <= 3


def test_no_plan_for_explicit_paths_and_array_likes(rng):
    params = _params(rng, 5)
    X = rng.normal(size=SHAPE).astype(np.float32)
    Y = nk.batch_normalization(X.tolist(), *[p.tolist() for p in params])
    assert Y.dtype == np.float64
    from normkernels.engine.numba_engine import ENGINE
    bn_spec.batch_normalization(X, *params, engine=ENGINE, path="serial")
    assert not plans.stored_keys()


# --- instance normalization ---


def _instance_full_path(X, scale, B, data_format):
    from normkernels.engine.numba_engine import ENGINE
    from normkernels.ops import instance_normalization as in_spec
    return in_spec.instance_normalization(X, scale, B, data_format=data_format, engine=ENGINE,
                                          path="serial")


@pytest.mark.parametrize("data_format", ["NCX", "NXC"])
@pytest.mark.parametrize("out_kind", ["none", "out", "inplace"])
def test_instance_second_call_uses_the_plan(rng, monkeypatch, data_format, out_kind):
    from normkernels.ops import instance_normalization as in_spec
    shape = SHAPE if data_format == "NCX" else (2, 6, 7, 5)
    scale, B = _params(rng, 5)[:2]
    X = rng.normal(-1, 0.5, shape).astype(np.float32)

    def call(X):
        out = {"none": None, "out": np.empty_like(X), "inplace": X}[out_kind]
        return nk.instance_normalization(X, scale, B, data_format=data_format, out=out), out

    call(rng.normal(size=shape).astype(np.float32))
    assert len(plans.stored_keys()) == 1
    want = _instance_full_path(X, scale, B, data_format)
    monkeypatch.setattr(in_spec, "prepare", lambda *a: pytest.fail("full path ran"))
    Y, out = call(Xc := X.copy())
    assert Y is out if out is not None else Y.shape == X.shape
    assert_identical(Y, want)
    exact, mean, var = instance_norm(X, scale, B, 1e-5, data_format)
    assert_close(Y, exact, instance_tolerance(X, scale, B, mean, var, 1e-5, data_format,
                                              X.dtype))
    if out_kind != "inplace":
        assert_identical(Xc, X)


def test_instance_out_errors_after_a_plan(rng):
    size = int(np.prod(SHAPE))
    scale, B = _params(rng, 5)[:2]
    buf = rng.normal(size=size + 5).astype(np.float32)
    X = buf[:size].reshape(SHAPE)
    nk.instance_normalization(X, scale, B, out=np.empty_like(X))
    before = buf.copy()
    with pytest.raises(ValueError, match="overlaps X"):
        nk.instance_normalization(X, scale, B, out=buf[5:].reshape(SHAPE))
    other = rng.normal(size=size).astype(np.float32)
    with pytest.raises(ValueError, match="shares memory with scale"):
        nk.instance_normalization(X, other[7:12], B, out=other.reshape(SHAPE))
    frozen = np.zeros_like(X)
    frozen.flags.writeable = False
    with pytest.raises(ValueError, match="read-only"):
        nk.instance_normalization(X, scale, B, out=frozen)
    assert_identical(buf, before)
    assert not frozen.any()
    with pytest.raises(TypeError, match="epsilon"):
        nk.instance_normalization(X, scale, B, epsilon="1e-5", out=np.empty_like(X))
    with pytest.raises(TypeError, match="bfloat16"):
        nk.instance_normalization(X.astype(BFLOAT16), scale.astype(BFLOAT16),
                                  B.astype(BFLOAT16), opset=6)


# --- training and moments: plans that skip the checks their key proves ---


def test_training_plan(rng, monkeypatch):
    params = _params(rng, 5)
    X = rng.normal(2, 3, SHAPE).astype(np.float32)
    first = nk.batch_normalization(X, *params, training_mode=1)
    assert len(plans.stored_keys()) == 1
    twin_out = np.empty_like(X)
    want = nk.batch_normalization(X, *params, training_mode=1, out=twin_out)  # full path
    monkeypatch.setattr(bn_spec, "prepare", lambda *a: pytest.fail("full path ran"))
    again = nk.batch_normalization(X, *params, training_mode=1)
    for a, b in zip((*first, *want), (*again, *again), strict=True):
        assert_identical(a, b)
    mean, var = batch_statistics(X)
    assert_close(again[0], batch_norm(X, params[0], params[1], mean, var, 1e-5),
                 training_tolerance(X, params[0], params[1], mean, var, 1e-5, "NCX"))
    monkeypatch.undo()
    with pytest.raises(ValueError, match="shares memory with input_mean"):
        buf = np.empty(int(np.prod(SHAPE)), np.float32)
        nk.batch_normalization(X, params[0], params[1], buf[:5], params[3], training_mode=1,
                               out=buf.reshape(SHAPE))


def test_moments_plan(rng, monkeypatch):
    from normkernels.ops import moments as moments_spec
    X = rng.normal(1e4, 1, (3, 4, 5, 6)).astype(np.float32)
    first = nk.moments(X)
    assert len(plans.stored_keys()) == 1
    monkeypatch.setattr(moments_spec, "statistics", lambda *a, **k: pytest.fail("full path"))
    Y = rng.normal(size=(3, 4, 5, 6)).astype(np.float32)
    got = nk.moments(Y)
    monkeypatch.undo()
    want = nk.moments(Y.tolist())  # the full path (a list makes no plan)
    for a, b in zip(got, want, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-12)
    mean, var = batch_statistics(Y)
    d_mean, d_var = statistics_tolerance(mean, var, Y.dtype)
    assert_close(got[0], mean, d_mean, "mean")
    assert_close(got[1], var, d_var, "variance")
    assert_identical(nk.moments(X)[0], first[0])
    swapped = Y.astype(">f4")
    for a, b in zip(nk.moments(swapped), nk.moments(Y), strict=True):
        assert_identical(a, b)
    with pytest.raises(TypeError, match="X has dtype int32"):
        nk.moments(Y.astype(np.int32))


# --- row normalizations ---

ROW_OPS = {
    "layer": lambda X, p, **kw: nk.layer_normalization(X, *p, **kw),
    "layer3": lambda X, p, **kw: nk.layer_normalization(X, *p, num_outputs=3, **kw),
    "rms": lambda X, p, **kw: nk.rms_normalization(X, p[0], **kw),
    "simplified": lambda X, p, **kw: nk.simplified_layer_normalization(X, p[0], num_outputs=2,
                                                                       **kw),
    "skip": lambda X, p, **kw: nk.skip_layer_normalization(X, X[0] * 0.5, *p, p[1],
                                                           num_outputs=3, **kw),
    "skip-simplified": lambda X, p, **kw: nk.skip_simplified_layer_normalization(
        X, X[0] * 0.5, p[0], p[1], **kw),
    "onednn-layer": lambda X, p, **kw: nk.layer_norm(X, *p, **kw),
    "onednn-layer-nostats": lambda X, p, **kw: nk.layer_norm(X, *p, keep_stats=False, **kw),
    "onednn-rms": lambda X, p, **kw: nk.rms_norm(X, p[0], **kw),
}
ROW_TWINS = {
    "layer": lambda X, p, **kw: reference.layer_normalization(X, *p, **kw),
    "layer3": lambda X, p, **kw: reference.layer_normalization(X, *p, num_outputs=3, **kw),
    "rms": lambda X, p, **kw: reference.rms_normalization(X, p[0], **kw),
    "simplified": lambda X, p, **kw: reference.simplified_layer_normalization(
        X, p[0], num_outputs=2, **kw),
    "skip": lambda X, p, **kw: reference.skip_layer_normalization(X, X[0] * 0.5, *p, p[1],
                                                                  num_outputs=3, **kw),
    "skip-simplified": lambda X, p, **kw: reference.skip_simplified_layer_normalization(
        X, X[0] * 0.5, p[0], p[1], **kw),
    "onednn-layer": lambda X, p, **kw: reference.layer_norm(X, *p, **kw),
    "onednn-layer-nostats": lambda X, p, **kw: reference.layer_norm(X, *p, keep_stats=False,
                                                                   **kw),
    "onednn-rms": lambda X, p, **kw: reference.rms_norm(X, p[0], **kw),
}


def _outputs(result):
    return result if isinstance(result, tuple) else (result,)


def _same_as_twin(got, want):
    for g, w in zip(_outputs(got), _outputs(want), strict=True):
        np.testing.assert_allclose(np.asarray(g, np.float64), np.asarray(w, np.float64),
                                   rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("op", ROW_OPS)
@pytest.mark.parametrize("out_kind", ["none", "out", "inplace"])
def test_row_plans_give_the_full_paths_results(rng, op, out_kind):
    """The second call (a plan) gives what the first (the full path) gave, bit for bit,
    from new contents of the same arrays; both agree with the twin."""
    X = rng.standard_normal((3, 4, 24)).astype(np.float32) * 2 + 1
    p = [rng.standard_normal(24).astype(np.float32) for _ in range(2)]
    keep = X.copy()
    out = None if out_kind == "none" else X if out_kind == "inplace" else np.empty_like(X)
    first = [np.copy(r) for r in _outputs(ROW_OPS[op](X, p, out=out))]
    assert plans.stored_keys(), "no plan was made"
    X[...] = keep * 0.5 - 3  # new contents: the plan must read them
    p[0] *= 2
    second = ROW_OPS[op](X, p, out=out)
    X2 = keep * 0.5 - 3
    want = ROW_TWINS[op](X2, p)
    _same_as_twin(second, want)
    assert not np.array_equal(first[0], _outputs(second)[0])
    X[...] = keep  # the first call's inputs again: the plan gives the first call's bits
    p[0] /= 2
    for got, want in zip(_outputs(ROW_OPS[op](X, p, out=out)), first, strict=True):
        assert_identical(np.asarray(got), want)


@pytest.mark.parametrize("op", ROW_OPS)
def test_row_plans_check_out_again(rng, op):
    """A planned call with an out that is read-only, or that shares memory with a
    parameter, fails as the full path does."""
    X = rng.standard_normal((3, 4, 24)).astype(np.float32)
    p = [rng.standard_normal(24).astype(np.float32) for _ in range(2)]
    ROW_OPS[op](X, p, out=np.empty_like(X))
    assert plans.stored_keys()
    locked = np.empty_like(X)
    locked.flags.writeable = False
    with pytest.raises(ValueError, match="read-only"):
        ROW_OPS[op](X, p, out=locked)
    big = np.empty(X.size, np.float32)
    shared = big.reshape(X.shape)  # out of X's shape and strides, p[0] inside it
    p_in = [big[-24:], p[1]]
    p_in[0][...] = p[0]
    with pytest.raises(ValueError, match="shares memory"):
        ROW_OPS[op](X, p_in, out=shared)


def test_row_plans_key_on_strides_and_dtype(rng):
    X = rng.standard_normal((6, 32)).astype(np.float32)
    s, b = np.ones(32, np.float32), np.zeros(32, np.float32)
    nk.layer_normalization(X, s, b)
    view = np.repeat(X, 2, axis=0)[::2]  # X's contents with other strides
    assert_identical(nk.layer_normalization(view, s, b), nk.layer_normalization(X.copy(), s, b))
    X64 = X.astype(np.float64)
    got = nk.layer_normalization(X64, s.astype(np.float64), b.astype(np.float64))
    assert got.dtype == np.float64
    with pytest.raises(ValueError, match="axis"):
        nk.layer_normalization(X, s, b, axis=2)


def test_onednn_row_plans_key_on_every_attribute(rng):
    """A plan of oneDNN LayerNorm/RMSNorm serves only calls with its attributes: the
    statistics outputs (keep_stats), epsilon and the normalized axes."""
    X = rng.standard_normal((4, 6, 8)).astype(np.float32)
    g, b = rng.uniform(0.5, 2, 8).astype(np.float32), rng.normal(size=8).astype(np.float32)
    with_stats = nk.layer_norm(X, g, b)
    assert plans.stored_keys()
    assert isinstance(with_stats, tuple) and len(with_stats) == 3
    only_y = nk.layer_norm(X, g, b, keep_stats=False)
    assert isinstance(only_y, np.ndarray)
    assert_identical(only_y, with_stats[0])
    other_eps = nk.layer_norm(X, g, b, epsilon=0.5)
    assert not np.array_equal(other_eps[0], with_stats[0])
    plans.clear()
    nk.rms_norm(X, g)
    assert not np.array_equal(nk.rms_norm(X, g, epsilon=0.5), nk.rms_norm(X, g))
    with pytest.raises(ValueError, match="gamma"):
        nk.rms_norm(X.reshape(4, 48), g, begin_norm_axis=0)


@pytest.mark.parametrize("opset", [18, 21])
def test_group_normalization_plans_per_channel_parameters_only(rng, opset):
    """Opset 21 (a value per channel) plans and binds repeated calls; opset 18 (a value
    per group, repeated to the channels on every call) leaves no plan. New values in
    the same arrays, each call against the oracle and the slow twin."""
    C, G = 8, 4
    X = rng.normal(size=(2, C, 5, 3)).astype(np.float32)
    n = C if opset == 21 else G
    scale, bias = np.empty(n, np.float32), np.empty(n, np.float32)
    out = np.empty_like(X)
    for _ in range(4):
        X[...] = rng.normal(size=X.shape)
        scale[...] = rng.normal(size=n)
        bias[...] = rng.normal(size=n)
        Y = nk.group_normalization(X, scale, bias, num_groups=G, opset=opset, out=out)
        assert Y is out
        exact, mean, var, s, b = oracle_group_norm(X, scale, bias, G, 1e-5,
                                                   per_group=opset == 18)
        assert_close(Y, exact, group_tolerance(X, s, b, mean, var, 1e-5, "NCX", X.dtype))
        assert_identical(Y, reference.group_normalization(X, scale, bias, num_groups=G,
                                                          opset=opset))
    assert bool(plans.stored_keys()) == (opset == 21)
    assert plans.bound_calls() == (opset == 21)


EPILOGUE_CALLS = {
    "layer": lambda X, act, out=None: nk.layer_normalization(X, W8, B8, activation=act, out=out),
    "rms": lambda X, act, out=None: nk.rms_normalization(X, W8, activation=act, out=out),
    "group": lambda X, act, out=None: nk.group_normalization(X, W8, B8, num_groups=4,
                                                             activation=act, out=out),
    "ort-group": lambda X, act, out=None: nk.ort_group_norm(
        X, W8, B8, groups=4, activation=int(act == "silu"), out=out),
}
W8 = np.linspace(0.5, 2.0, 8).astype(np.float32)
B8 = np.linspace(-1.0, 1.0, 8).astype(np.float32)


@pytest.mark.parametrize("op", sorted(EPILOGUE_CALLS))
@pytest.mark.parametrize("out_kind", ["none", "out"])
def test_plans_key_on_the_activation(rng, op, out_kind):
    """Calls with an activation plan (and bind) as plain ones do, each under its own key:
    after plans for one activation, a call with another (none, SiLU, ReLU in turn) gives
    the full path's bits, never the planned activation's."""
    call = EPILOGUE_CALLS[op]
    shape = {"ort-group": (2, 3, 8), "group": (2, 8, 3)}.get(op, (6, 8))
    X = rng.standard_normal(shape).astype(np.float32)
    out = None if out_kind == "none" else np.empty(shape, np.float32)  # one object: bound
    acts = (None, "silu") if op == "ort-group" else (None, "silu", "relu")

    def run(act):
        return np.array(call(X, act, out), copy=True)

    plans.clear()
    want = {act: run(act) for act in acts}  # full paths (nothing planned yet)
    assert len({w.tobytes() for w in want.values()}) == len(acts)
    for act in (*acts, *acts, acts[1], acts[1], acts[0], acts[-1], acts[0]):
        assert_identical(run(act), want[act])
    assert len(plans.stored_keys()) == len(acts)
    # a bound call per activation (channels-last GroupNorm plans bind none)
    assert plans.bound_calls() == (0 if out is None or op == "ort-group" else len(acts))


# --- training and backward plans (normkernels/ops/training_plans.py) ---

def _channel(rng, shape, C, dtype=np.float32):
    X = rng.normal(3, 2, shape).astype(dtype)
    dY = rng.standard_normal(shape).astype(dtype)
    scale = rng.uniform(0.5, 2, C).astype(dtype)
    mean = rng.normal(3, 0.1, C).astype(dtype)
    var = rng.uniform(3, 5, C).astype(dtype)
    return X, dY, scale, mean, var


def _spec_call(module, function):
    from normkernels.engine.numba_engine import ENGINE

    return lambda *a, **kw: getattr(module, function)(*a, engine=ENGINE, path="serial", **kw)


def _backward_spec(function):
    from normkernels.ops import backward
    return _spec_call(backward, function)


# name -> (public call, full-path call) of (rng) -> the arguments and keywords
TRAINING_CASES = {
    # one channel: the moments of the whole tensor as one plane (not 64 rows of 9)
    "bn-training-C1": lambda rng: (
        "batch_normalization", bn_spec, (rng.normal(5, 2, (64, 1, 9)),
                                         *_params(rng, 1, np.float64)), {"training_mode": 1}),
    "bn-training-saved-inv-std": lambda rng: (
        "batch_normalization", bn_spec, (rng.normal(5, 2, (3, 4, 6)).astype(np.float32),
                                         *_params(rng, 4)),
        {"opset": 9, "num_outputs": 5, "saved_var": "inv_std"}),
    "bn-training-NXC": lambda rng: (
        "batch_normalization", bn_spec, (rng.normal(5, 2, (3, 5, 7)).astype(np.float64),
                                         *_params(rng, 7, np.float64)),
        {"training_mode": 1, "data_format": "NXC"}),
    "bn-backward-inv-std": lambda rng: (lambda X, dY, s, m, v: (
        "batch_normalization_backward", None, (dY, X, s, m),
        {"inv_std": (1 / np.sqrt(v.astype(np.float64) + 1e-3)).astype(np.float32)}))(
            *_channel(rng, (2, 5, 9), 5)),
    "bn-backward-rows": lambda rng: (lambda X, dY, s, m, v: (
        "batch_normalization_backward", None, (dY, X, s, m, v), {"epsilon": 1e-3}))(
            *_channel(rng, (40, 3, 5, 5), 3)),
    "bn-backward-bfloat16-NXC": lambda rng: (lambda X, dY, s, m, v: (
        "batch_normalization_backward", None, (dY, X, s, m, v), {"data_format": "NXC"}))(
            *_channel(rng, (2, 3, 4, 6), 6, BFLOAT16)),
    "onednn-backward": lambda rng: (lambda X, dY, s, m, v: (
        "batch_norm_training_backward", onednn_training, (X, dY, m, v, s), {"epsilon": 1e-3}))(
            *_channel(rng, (2, 3, 4, 6), 6)),
    "onednn-backward-no-gamma-NCX": lambda rng: (lambda X, dY, s, m, v: (
        "batch_norm_training_backward", onednn_training, (X, dY, m, v),
        {"epsilon": 1e-3, "data_format": "NCX"}))(*_channel(rng, (2, 3, 4, 6), 3)),
    "gn-backward-NXC": lambda rng: (lambda X, dY, s, m, v: (
        "group_normalization_backward", None, (dY, X, s),
        {"num_groups": 2, "data_format": "NXC"}))(*_channel(rng, (3, 5, 4, 6), 6)),
    "in-backward-float16": lambda rng: (lambda X, dY, s, m, v: (
        "instance_normalization_backward", None, (dY, X, s), {}))(
            *_channel(rng, (2, 3, 17), 3, np.float16)),
    "ln-backward-broadcast-scale": lambda rng: (
        "layer_normalization_backward", None,
        (rng.standard_normal((4, 6, 10)).astype(np.float32),
         rng.normal(2, 1, (4, 6, 10)).astype(np.float32),
         rng.uniform(0.5, 2, (1, 10)).astype(np.float32)), {"axis": 1}),
    "rms-backward-above-serial": lambda rng: (
        "rms_normalization_backward", None,
        (rng.standard_normal((300, 301)).astype(np.float32),
         rng.normal(2, 1, (300, 301)).astype(np.float32),
         rng.uniform(0.5, 2, 301).astype(np.float32)), {}),
    "lp-columns": lambda rng: (
        "lp_normalization", None, (rng.standard_normal((4, 6, 10)).astype(np.float32),),
        {"axis": 1, "p": 1}),
}


@pytest.mark.parametrize("fused", [False, True], ids=["steps", "fused"])
@pytest.mark.parametrize("name", sorted(TRAINING_CASES))
def test_training_and_backward_plans_give_the_full_paths_bits(rng, name, fused):
    """A training or backward call served by its plan (a training plan step by step,
    or by its fused one-call kernel) gives the bits of the full path at the serial
    path, on the routes the table's workloads do not reach: one channel, saved
    statistics, inv_std given, short planes in many rows, channels-last samples,
    16-bit dtypes, a broadcast scale, rows above the serial size, Lp over a middle axis."""
    from normkernels.ops import backward, lp_normalization, training_plans

    function, module, args, kwargs = TRAINING_CASES[name](rng)
    module = module or (lp_normalization if function == "lp_normalization" else backward)
    want = _spec_call(module, function)(*args, **kwargs)
    with training_plans.fusing() if fused else contextlib.nullcontext():
        for _ in range(3):  # the full path and its plan, then the planned calls
            got = getattr(nk, function)(*args, **kwargs)
            for a, b in zip(_outputs(got), _outputs(want), strict=True):
                assert_identical(a, b)
    assert plans.stored_keys(), f"{name}: no plan"


def test_backward_plan_hands_unaligned_arrays_to_the_full_path(rng):
    """An unaligned X (same shape, strides and dtype as the planned one) is not run by
    the entry points compiled for aligned arrays: the full path gives its result."""
    X, dY, scale, mean, var = _channel(rng, (2, 5, 9), 5)
    nk.batch_normalization_backward(dY, X, scale, mean, var)
    raw = np.zeros(X.nbytes + 1, np.uint8)
    unaligned = np.frombuffer(raw.data, np.float32, X.size, offset=1).reshape(X.shape)
    assert not unaligned.flags.aligned
    unaligned[...] = X  # frombuffer over a bytearray's memory: writeable
    got = nk.batch_normalization_backward(dY, unaligned, scale, mean, var)
    want = _backward_spec("batch_normalization_backward")(dY, X, scale, mean, var)
    for a, b in zip(got, want, strict=True):
        assert_identical(a, b)


def test_training_plans_fuse_after_their_count(rng, monkeypatch):
    """A training plan serves FUSE_AFTER calls step by step, then the fused kernel; the
    bits never change."""
    from normkernels.ops import training_plans

    monkeypatch.setattr(training_plans, "FUSE_AFTER", 3)
    X = rng.normal(5, 2, (2, 6, 5, 7)).astype(np.float32)
    args = (X, *_params(rng, 6))
    want = _spec_call(bn_spec, "batch_normalization")(*args, training_mode=1)
    for i in range(6):
        got = nk.batch_normalization(*args, training_mode=1)
        for a, b in zip(_outputs(got), _outputs(want), strict=True):
            assert_identical(a, b)
        plan = plans.get(plans.stored_keys()[0])
        assert (plan.fuse is None) == (i >= 4), i  # 0 made the plan, 1-3 stepped, 4 fused


@pytest.mark.parametrize("fmt", ["NCX", "NXC"])
@pytest.mark.parametrize("N,C,side", [(2, 8, 5), (2, 64, 40)], ids=["serial", "parallel"])
@pytest.mark.parametrize("name", ["group", "instance"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_statistics_plans_give_the_full_paths_bits(rng, name, fmt, N, C, side, dtype):
    """The PyTorch adapter's calls: the instance and group forward returning their
    statistics, and the backward given them, leave plans (at any size) that serve the
    later calls (the same plan objects) with the full path's bits on new values, out
    being X or dY included."""
    from normkernels.engine.numba_engine import ENGINE
    from normkernels.ops import backward, group_normalization, instance_normalization

    shape = (N, C, side, side) if fmt == "NCX" else (N, side, side, C)
    group = {"num_groups": 4} if name == "group" else {}
    forward = (group_normalization.group_normalization if name == "group" else
               instance_normalization.instance_normalization)
    grad = getattr(backward, f"{name}_normalization_backward")

    def calls(path, X, dY, w, b, out_of=None):
        y, m, r = forward(X, w, b, data_format=fmt, engine=ENGINE, path=path,
                          statistics=True, **group)
        out = {"X": X, "dY": dY}.get(out_of)
        dX = grad(dY, X, w, mean=m, inv_std=r, data_format=fmt, out=out, engine=ENGINE,
                  path=path, **group)
        return (y, m, r, *dX)

    kept = None
    for i, out_of in enumerate((None, None, None, "X", "dY")):
        X = rng.normal(3, 2, shape).astype(dtype)  # float64: every sum's order shows
        dY = rng.normal(size=shape).astype(dtype)
        w = rng.uniform(0.5, 2, C).astype(dtype)
        b = rng.normal(size=C).astype(dtype)
        want = calls("serial", X.copy(), dY.copy(), w, b, out_of)
        got = calls(None, X, dY, w, b, out_of)
        for a, e in zip(got, want, strict=True):
            assert_identical(a, e)
        if i == 0:
            kept = {k: plans.get(k) for k in plans.stored_keys()}
            assert len(kept) == 2 and None not in kept.values()
        elif out_of is None:  # served: the very plans the first call left
            assert all(plans.get(k) is plan for k, plan in kept.items())

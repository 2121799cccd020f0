"""normkernels.bind: a call prepared once for fixed arrays gives, at every call, what
the plain call gives on the arrays' current contents, and the errors it gives."""

import math

import numpy as np
import pytest
from arrays import BFLOAT16, assert_identical
from oracle import (
    assert_close,
    batch_norm,
    batch_statistics,
    instance_norm,
    instance_tolerance,
    statistics_tolerance,
    tolerance,
    training_tolerance,
)

import normkernels as nk
from normkernels.engine import policy

SHAPE = (2, 5, 6, 7)  # layer normalization: rows of 7


def _params(rng, C, dtype=np.float32):
    scale, B, mean = (rng.normal(size=C).astype(dtype) for _ in range(3))
    return [scale, B, mean, rng.uniform(0.5, 2.0, C).astype(dtype)]


def _change(rng, X, params):
    """New contents, same memory."""
    X[...] = rng.normal(4, 3, X.shape).astype(X.dtype)
    for p in params:
        p[...] = rng.uniform(0.5, 2.0, p.shape).astype(p.dtype)


def _fast(call):
    """The bound call is the compiled one (not the plain call)."""
    return call.__qualname__.startswith(("_checked", "_fast_in_place"))


@pytest.mark.parametrize("op", ["onnx", "onednn"])
@pytest.mark.parametrize("memory", ["NCX", "NXC", "channels_last_view"])
@pytest.mark.parametrize("out_kind", ["none", "out", "inplace"])
@pytest.mark.parametrize("dtype", [np.float32, np.float16, BFLOAT16])
def test_bound_call_reads_current_contents(rng, op, memory, out_kind, dtype):
    shape = SHAPE if memory == "NCX" else (2, 6, 7, 5)
    X = rng.normal(size=shape).astype(dtype)
    data_format = "NXC" if memory == "NXC" else "NCX"
    if memory == "channels_last_view":
        X = X.transpose(0, 3, 1, 2)  # NCX view of channels-last memory
    pdtype = BFLOAT16 if (op == "onednn" and dtype == BFLOAT16) else np.float32
    params = _params(rng, 5, pdtype)
    out = {"none": None, "out": np.empty_like(X), "inplace": X}[out_kind]
    fn = nk.batch_normalization if op == "onnx" else nk.batch_norm_inference
    kwargs = {"epsilon": 1e-3, "data_format": data_format, "out": out}
    call = nk.bind(fn, X, *params, **kwargs)
    assert _fast(call)
    for _ in range(3):
        _change(rng, X, params)
        source = X.copy()
        want = fn(source, *params, **{**kwargs, "out": None})
        Y = call()
        assert Y is out if out is not None else Y.shape == X.shape
        assert_identical(Y, want)
        assert_close(Y, batch_norm(source, *params, 1e-3, data_format),
                     tolerance(source, *params, 1e-3, data_format, X.dtype))
        if out_kind != "inplace":
            assert_identical(X, source)


def test_copied_or_converted_arrays_are_bound_as_the_plain_call(rng):
    """A strided X (copied by the spec layer), a non-native or list parameter
    (converted): the bound call must still see the arrays' later contents."""
    params = _params(rng, 5)
    wide = rng.normal(size=(2, 5, 6, 14)).astype(np.float32)
    X = wide[..., ::2]
    swapped = params[1].astype(">f4")
    for args in [(X, *params), (X.copy(), params[0], swapped, *params[2:])]:
        call = nk.bind(nk.batch_normalization, *args)
        assert not _fast(call)
        for _ in range(2):
            args[0][...] = rng.normal(size=args[0].shape)
            args[2][...] = rng.normal(size=5)
            Y = call()
            assert_identical(Y, nk.batch_normalization(*args))
            assert_close(Y, batch_norm(*args, 1e-5), tolerance(*args, 1e-5, "NCX", np.float32))


def test_large_tensor_decides_its_path_per_call(rng, monkeypatch):
    taken = []
    monkeypatch.setattr(policy, "_trace", taken.append)
    params = _params(rng, 8)
    X = rng.normal(size=(8, 8, 96, 96)).astype(np.float32)
    call = nk.bind(nk.batch_normalization, X, *params)
    assert_identical(call(), nk.batch_normalization(X, *params))
    monkeypatch.setattr(policy, "NORMALIZE_SERIAL_MAX_ELEMENTS", X.size)
    taken.clear()
    assert_identical(call(), nk.batch_normalization(X, *params))
    assert "scale_shift/planes/serial" in taken


@pytest.mark.parametrize("fn", [nk.layer_normalization, nk.rms_normalization,
                                nk.skip_layer_normalization])
def test_large_rows_decide_their_path_per_call(rng, monkeypatch, fn):
    """Rows above the serial size: the bound call launches the fused parallel kernel
    with the arguments resolved at binding, and still decides the path per call."""
    taken = []
    monkeypatch.setattr(policy, "_trace", taken.append)
    X = rng.normal(size=(2, 96, 768)).astype(np.float32)
    params = [rng.uniform(0.5, 2.0, 768).astype(np.float32) for _ in range(2)]
    if fn is nk.skip_layer_normalization:
        params = [rng.normal(size=(96, 768)).astype(np.float32), *params]
    elif fn is nk.rms_normalization:
        params = params[:1]
    out = np.empty_like(X)
    call = nk.bind(fn, X, *params, out=out)
    for serial_max in (policy.SERIAL_MAX_ELEMENTS, X.size):
        monkeypatch.setattr(policy, "SERIAL_MAX_ELEMENTS", serial_max)
        for _ in range(2):
            X[...] = rng.normal(3, 2, X.shape)
            params[0][...] = rng.normal(size=params[0].shape)
            taken.clear()
            got = call()
            got = got[0] if isinstance(got, tuple) else got
            want = fn(X.copy(), *[p.copy() for p in params])
            assert_identical(got, want[0] if isinstance(want, tuple) else want)
            assert ("rows/fused/serial" in taken) == (serial_max == X.size), taken


def test_errors_at_binding_and_at_the_call(rng):
    params = _params(rng, 5)
    X = rng.normal(size=SHAPE).astype(np.float32)
    with pytest.raises(TypeError, match="X has dtype int32"):
        nk.bind(nk.batch_normalization, X.astype(np.int32), *params)
    with pytest.raises(ValueError, match="overlaps X"):
        buf = np.zeros(X.size + 3, np.float32)
        nk.bind(nk.batch_normalization, buf[:X.size].reshape(SHAPE), *params,
                out=buf[3:].reshape(SHAPE))
    with pytest.raises(TypeError, match="normkernels operator"):
        nk.bind(np.add, X, X)
    out = np.empty_like(X)
    call = nk.bind(nk.batch_normalization, X, *params, out=out)
    out.flags.writeable = False
    with pytest.raises(ValueError, match="read-only"):
        call()


def test_functions_of_every_api_module_bind_and_only_they(rng):
    """bind takes the public function of any family module of normkernels.api, and
    refuses a function of the same name defined elsewhere."""
    X = rng.normal(size=(4, 8)).astype(np.float32)
    g = rng.normal(size=8).astype(np.float32)
    for fn, args in [(nk.layer_normalization, (X, g)), (nk.rms_norm, (X, g)),
                     (nk.lp_normalization, (X,))]:
        assert_identical(nk.bind(fn, *args)(), fn(*args))

    def batch_normalization(*args, **kwargs):
        return nk.batch_normalization(*args, **kwargs)

    with pytest.raises(TypeError, match="normkernels operator"):
        nk.bind(batch_normalization, X, *_params(rng, 8))


def test_other_operators_are_bound_as_plain_calls(rng):
    params = _params(rng, 5)
    X = rng.normal(size=SHAPE).astype(np.float32)
    training = nk.bind(nk.batch_normalization, X, *params, training_mode=1)
    instance = nk.bind(nk.instance_normalization, X, *params[:2])
    moments = nk.bind(nk.moments, X)
    X *= 2
    Y = training()[0]
    mean, var = batch_statistics(X)
    assert_close(Y, batch_norm(X, params[0], params[1], mean, var, 1e-5),
                 training_tolerance(X, params[0], params[1], mean, var, 1e-5, "NCX"))
    exact, imean, ivar = instance_norm(X, *params[:2], 1e-5)
    assert_close(instance(), exact,
                 instance_tolerance(X, *params[:2], imean, ivar, 1e-5, "NCX", X.dtype))
    d_mean, d_var = statistics_tolerance(mean, var, X.dtype)
    got_mean, got_var = moments()
    assert_close(got_mean, mean, d_mean, "mean")
    assert_close(got_var, var, d_var, "variance")
    for got, want in [(training(), nk.batch_normalization(X, *params, training_mode=1)),
                      (instance(), nk.instance_normalization(X, *params[:2])),
                      (moments(), nk.moments(X))]:
        for a, b in zip(got if isinstance(got, tuple) else (got,),
                        want if isinstance(want, tuple) else (want,), strict=True):
            assert_identical(a, b)


# --- every record of the operator table ---

def _bind_params():
    from table_cases import CASES

    return [pytest.param(case, dtype, fmt, id=f"{case.id}-{dtype.name}-{fmt}")
            for case in CASES for dtype in case.dtypes() for fmt in case.layouts()]


def _compiled_bind_expected(case, X, data_format):
    """Per-channel inference, the row normalizations, and instance and group
    normalization of channels-first memory bind to one compiled call (not the
    per-sample modulated ones: a kernel call per sample; nor the gated, quantized and
    QK-norm kernels, which bind as the plain call)."""
    op = case.op
    channels_first = data_format == "NCX" or X.ndim < 3 or math.prod(X.shape[1:-1]) == 1
    if op.quantized or op.epilogue == "silu gate" or op.family == "qk":
        return False
    return case.mode == "inference" and not op.per_sample and (
        op.family in ("layer", "rms") or op.function in ("batch_normalization",
                                                         "batch_norm_inference")
        or (op.function in ("instance_normalization", "group_normalization", "group_norm")
            and channels_first))


@pytest.mark.parametrize("with_out", [False, True])
@pytest.mark.parametrize("case,dtype,data_format", _bind_params())
def test_every_operator_binds_to_the_arrays_current_contents(case, dtype, data_format,
                                                             with_out):
    """Every (record, mode) of the table: the bound call gives, at each call, the bits
    of the plain call on the arrays' current contents (new data written into the same
    memory between calls), into ``out`` when given; the calls that can be one compiled
    call are."""
    from table_cases import make, outputs, primary

    op, mode = case.op, case.mode
    if with_out and not op.takes_out:
        pytest.skip("no out")
    work = make(case, dtype, data_format, np.random.default_rng(0))
    fn = getattr(nk, op.target(mode)[0])
    X, params = work.X, work.params
    args = op.arguments(X, params, mode)
    kwargs = op.kwargs(mode, data_format, op.channel_count(X, data_format))
    if with_out:
        kwargs["out"] = out = np.empty_like(primary(case, fn(*args, **kwargs))[0])
    call = nk.bind(fn, *args, **kwargs)
    if kwargs.get("out") is None or case.writes_out:
        assert _fast(call) == _compiled_bind_expected(case, X, data_format), \
            call.__qualname__
    for seed in (1, 2):
        fresh = make(case, dtype, data_format, np.random.default_rng(seed))
        for old, new in zip((X, *params), (fresh.X, *fresh.params), strict=True):
            if isinstance(old, np.ndarray):
                old[...] = new
        copies = [a.copy() if isinstance(a, np.ndarray) else a for a in args]
        want = fn(*copies, **{**kwargs, "out": None} if "out" in kwargs else kwargs)
        got = call()
        if with_out:
            assert primary(case, got)[0] is out
        if op.in_place:  # what it wrote: the given arrays, and the copies
            got, want = op.written(args, mode), op.written(copies, mode)
        got, want = outputs(got), outputs(want)
        assert len(got) == len(want)
        for a, b in zip(got, want, strict=True):
            assert_identical(np.asarray(a), np.asarray(b))


@pytest.mark.parametrize("fn", [nk.batch_normalization, nk.layer_normalization])
def test_read_only_arrays_are_read_at_every_call(rng, fn):
    """Read-only views of memory written elsewhere (small ones are copied on the plain
    path): the bound call reads the memory at every call, not a copy of binding time."""
    C = 5 if fn is nk.batch_normalization else 7
    buffers = [rng.normal(size=SHAPE).astype(np.float32)] + [
        rng.uniform(0.5, 2.0, C).astype(np.float32) for _ in range(4 if C == 5 else 2)]
    views = [b.view() for b in buffers]
    for v in views:
        v.flags.writeable = False
    call = nk.bind(fn, *views)
    assert _fast(call)
    for _ in range(2):
        for b in buffers:
            b[...] = rng.uniform(0.5, 2.0, b.shape)
        assert_identical(call(), fn(*[b.copy() for b in buffers]))


@pytest.mark.parametrize("fn,kwargs", [
    (nk.batch_normalization, {}), (nk.instance_normalization, {}),
    (nk.group_normalization, {"num_groups": 2}), (nk.layer_normalization, {})])
def test_strided_x_is_read_at_every_call(rng, fn, kwargs):
    """X a strided view (the spec layer copies it to run): the bound call must read
    the view's memory at each call, not the copy made at binding."""
    C = 4
    base = rng.normal(size=(2, C, 6, 10)).astype(np.float32)
    X = base[..., ::2]
    n_params = 4 if fn is nk.batch_normalization else 2
    width = X.shape[-1] if fn is nk.layer_normalization else C
    params = [rng.uniform(0.5, 2.0, width).astype(np.float32) for _ in range(n_params)]
    if fn is nk.layer_normalization:
        kwargs = {"axis": -1}
    call = nk.bind(fn, X, *params, **kwargs)
    for _ in range(2):
        base[...] = rng.normal(3, 2, base.shape)
        assert_identical(call(), fn(X.copy(), *params, **kwargs))


def _training_call(case, rng, out):
    """``(function, args, kwargs)`` of a small training or backward call."""
    X = rng.normal(3, 2, (2, 4, 3, 5)).astype(np.float32)
    dY = rng.normal(size=X.shape).astype(np.float32)
    C = X.shape[-1] if case in ("layer", "rms") or case.startswith("onednn") else 4
    scale, B = rng.uniform(0.5, 2, C).astype(np.float32), rng.normal(size=C).astype(np.float32)
    mean, var = rng.normal(size=C).astype(np.float32), rng.uniform(0.5, 2, C).astype(np.float32)
    kwargs = {"out": out}
    if case == "batch":
        return nk.batch_normalization_backward, (dY, X, scale, mean, var), kwargs
    if case == "training":
        return nk.batch_normalization, (X, scale, B, mean, var), {**kwargs, "training_mode": 1}
    if case == "onednn training":
        return (nk.batch_norm_forward_training, (X, mean, var, scale, B),
                {**kwargs, "epsilon": 1e-5})
    if case.startswith("onednn"):  # "onednn without gamma": diff_src alone
        return (nk.batch_norm_training_backward,
                (X, dY, mean, var, scale)[:4 if "without" in case else 5],
                {**kwargs, "epsilon": 1e-5})
    if case in ("group", "group given"):
        if case == "group given":
            kwargs["mean"] = rng.normal(size=(2, 2)).astype(np.float32)
            kwargs["inv_std"] = rng.uniform(0.5, 2, (2, 2)).astype(np.float32)
        return nk.group_normalization_backward, (dY, X, scale), {**kwargs, "num_groups": 2}
    if case == "instance":
        return nk.instance_normalization_backward, (dY, X, scale), kwargs
    fn = nk.layer_normalization_backward if case == "layer" else nk.rms_normalization_backward
    return fn, (dY, X, scale), kwargs


@pytest.mark.parametrize("out_given", [False, True])
@pytest.mark.parametrize("case", ["batch", "training", "onednn", "onednn without gamma",
                                  "onednn training", "group", "group given",
                                  "instance", "layer", "rms"])
def test_training_and_backward_calls_bind_their_plan(rng, monkeypatch, case, out_given):
    """A small training or backward call binds the plan its call leaves, through the
    plan's own ``bind``: views, the output and checks made once (the same output at
    every call, without the plan's per-call work), the arrays and statistics read at
    every call (the plain call's bits on their current contents); ``out`` made
    read-only since is the plain call's error."""
    from normkernels.ops import training_plans

    out = np.empty((2, 4, 3, 5), np.float32) if out_given else None
    fn, args, kwargs = _training_call(case, rng, out)
    call = nk.bind(fn, *args, **kwargs)
    assert call.__qualname__.startswith("_bound_plan"), call.__qualname__
    per_call = []  # the plans' own calls (the plain calls below take the full path)
    for plan in (training_plans.BatchTraining, training_plans.ChannelBackward,
                 training_plans.GroupBackward, training_plans.RowsBackward):
        monkeypatch.setattr(plan, "__call__", lambda *a, **k: per_call.append(a))
    arrays = [a for a in (*args, kwargs.get("mean"), kwargs.get("inv_std")) if a is not None]
    first = None
    for _ in range(3):
        for a in arrays:
            a[...] = rng.uniform(0.5, 2, a.shape)
        want = fn(*[a.copy() for a in args], **{
            k: v.copy() if isinstance(v, np.ndarray) else v for k, v in kwargs.items()
            if k != "out"})
        per_call.clear()
        got = call()
        assert not per_call  # the plan's bind, not the plan called each time
        got = got if isinstance(got, tuple) else (got,)
        want = want if isinstance(want, tuple) else (want,)
        assert len(got) == len(want)
        for a, b in zip(got, want, strict=True):
            assert_identical(a, b)
        first = got[0] if first is None else first
        assert got[0] is first and (out is None or first is out)
    first.flags.writeable = False
    if out is not None:
        with pytest.raises(ValueError, match="read-only"):
            call()
    else:  # the bound dX read-only: a plain call's new one
        got = call()
        assert (got[0] if isinstance(got, tuple) else got) is not first


@pytest.mark.parametrize("case", ["training, out is X", "backward, out is dY"])
def test_binding_a_call_that_writes_its_inputs_runs_it_once(rng, case):
    """Binding runs the call once to check it; a call that writes an input (``out`` an
    input) must not run twice at binding: the caller's arrays hold one call's result."""
    X = rng.normal(3, 2, (2, 4, 3, 5)).astype(np.float32)
    dY = rng.normal(size=X.shape).astype(np.float32)
    scale, B = rng.uniform(0.5, 2, 4).astype(np.float32), rng.normal(size=4).astype(np.float32)
    mean, var = rng.normal(size=4).astype(np.float32), rng.uniform(0.5, 2, 4).astype(np.float32)
    if case.startswith("training"):
        fn, args, kwargs, written = (nk.batch_normalization, (X, scale, B, mean, var),
                                     {"training_mode": 1, "out": X}, X)
    else:
        fn, args, kwargs, written = (nk.group_normalization_backward, (dY, X, scale),
                                     {"num_groups": 2, "out": dY}, dY)
    want = fn(*[a.copy() for a in args], **{**kwargs, "out": None})
    nk.bind(fn, *args, **kwargs)
    assert_identical(written, want[0])

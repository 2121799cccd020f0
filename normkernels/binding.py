"""Bound calls: a public call prepared once for fixed arrays, then repeated
(in the spirit of onnxruntime's io-binding), for the lowest per-call cost.

``bind(function, *args, **kwargs)`` checks the arguments as the call would, then
returns a zero-argument callable that computes ``function(*args, **kwargs)`` from
the arrays' *current* contents and returns the result (``out`` each time when given;
without it, the compiled and plan-bound calls return one output allocated at binding,
the others a new one). Where the call is per-channel inference,
a row normalization, or instance or group normalization of channels-first memory,
whose only output is Y, and its arrays need no conversion or copy, the callable is one
compiled call on the serial path (the kernel and its arguments resolved at binding).
A call served by a plan (:mod:`normkernels.ops.plans`: the training and backward
calls, MVN, Lp, moments) binds that plan: through the plan's own ``bind`` where it has
one (views, outputs and checks made once: the training and backward plans), else the
plan called without building its key. Anything else is bound as the plain call (still
correct, no faster). The arrays must
stay alive and keep their memory, as with io-binding; an ``out`` made read-only after
binding is an error at the call.
"""

import importlib
import inspect

import numpy as np

import normkernels.api as api
from normkernels.engine import Engine
from normkernels.engine.numba_engine import ENGINE
from normkernels.ops import plans


class _NotBindable(Exception):
    pass


def _no_epilogue(act, res):
    """The bound kernels have no epilogue (activation, residual): such a call is bound
    as the plain call."""
    if res is not None or (act is not None and getattr(act, "kind", act) != "none"):
        raise _NotBindable("epilogue")


class _Recorder(Engine):
    """An engine that records the one kernel call a spec function makes (per-channel
    inference, a row normalization, or instance or group normalization of
    channels-first memory) and computes nothing; any other engine method means the
    call is not bindable."""

    name = "recorder"
    call = None

    def inference(self, x, y, C, S, scale, B, mean, var, epsilon, path=None, guard=False,
                  act=None, res=None):
        _no_epilogue(act, res)
        self._record("inference", (x, y, C, S, scale, B, mean, var, epsilon))
        return True

    def instance_planes(self, x, y, C, S, scale, B, epsilon, path=None, group=1, act=None,
                        res=None):
        _no_epilogue(act, res)
        self._record("planes", (x, y, C, S, scale, B, epsilon, group))
        n_groups = x.size // S // group
        return np.zeros(n_groups), np.ones(n_groups)

    def normalize_rows(self, x, y, scale, B, epsilon, centered, skip=None, bias=None,
                       sums=None, path=None, act=None, res=None, rounding="once"):
        _no_epilogue(act, res)
        if sums is not None and sums is not skip:  # a fourth output; or the in-place add
            raise _NotBindable("sums")
        self._record("rows", (x, y, scale, B, epsilon, centered, skip, bias, sums, rounding))
        return np.zeros(x.shape[0]), np.ones(x.shape[0])

    def _record(self, kind, arguments):
        if self.call is not None:
            raise _NotBindable("two kernel calls")
        self.call = (kind, arguments)

    def __getattribute__(self, name):
        # any other engine method, the base class's or an engine mixin's (gated,
        # quantized rows): not bindable
        if (not name.startswith("_") and name not in _RECORDED
                and (callable(getattr(Engine, name, None)) or not hasattr(_Recorder, name))):
            raise _NotBindable(name)
        return super().__getattribute__(name)


_RECORDED = ("inference", "normalize_rows", "instance_planes")


def _spec(function):
    """The spec-layer function of a public operator, from the operator table (imported
    here: ``normkernels`` loads this module with its first operator), or the function
    of its name in a spec module its API module imports."""
    from normkernels.operators import OPERATORS

    for op in OPERATORS.values():
        for mode in op.modes:
            name, module = op.target(mode)
            if name == function.__name__:
                return getattr(importlib.import_module(f"normkernels.ops.{module}"), name)
    family = importlib.import_module(function.__module__)
    for value in vars(family).values():
        if (inspect.ismodule(value) and value.__name__.startswith("normkernels.ops.")
                and inspect.isfunction(getattr(value, function.__name__, None))):
            return getattr(value, function.__name__)
    return None


def bind(function, *args, **kwargs):
    """Bind a call: ``function(*args, **kwargs)`` prepared once for fixed arrays.

    The arguments are checked as the call checks them; the callable returned computes
    the call from the arrays' *current* contents and returns the result (``out``
    each time when given; else see the module docstring). Per-channel
    inference, row normalizations, and instance or group normalization of
    channels-first memory, whose only output is Y and whose arrays need no conversion
    or copy, are bound as one compiled call on the serial path; a call a plan serves
    (training and backward calls, MVN, Lp, moments) binds its plan; anything else as
    the plain call (still correct, no faster). The arrays must stay alive and keep their
    memory, as with onnxruntime's io-binding. See the module docstring.

    Parameters
    ----------
    function : callable
        A public operator of normkernels (``normkernels.layer_normalization``...).
    *args, **kwargs
        Its arguments, as they would be passed to it.

    Returns
    -------
    callable
        A function of no arguments that computes ``function(*args, **kwargs)`` and
        returns its result.

    Raises
    ------
    TypeError
        ``function`` is not a normkernels operator.
    TypeError, ValueError
        What ``function(*args, **kwargs)`` raises: the arguments are checked at
        binding. A bound call whose ``out`` was made read-only since raises
        ValueError.

    Examples
    --------
    >>> X = np.arange(8, dtype=np.float32).reshape(2, 4)
    >>> scale, Y = np.ones(4, np.float32), np.empty_like(X)
    >>> call = normkernels.bind(normkernels.rms_normalization, X, scale, out=Y)
    >>> X += 1  # new contents, the same memory
    >>> call() is Y
    True
    >>> np.array_equal(Y, normkernels.rms_normalization(X, scale))
    True
    """
    if not callable(function) or not _public(function):
        raise TypeError(f"bind: function must be a normkernels operator, got {function!r}")
    fast = _bound_kernel(function, args, kwargs)
    if fast is not None:
        return fast
    result = function(*args, **kwargs)  # the checks (and a first result), raising as the
    # call does; a call that writes its inputs (out=X, an in-place operator) runs once
    planned = None if _writes_inputs(result, args, kwargs) else _bound_plan(function, args,
                                                                            kwargs)
    return planned or (lambda: function(*args, **kwargs))


def _writes_inputs(result, args, kwargs):
    """Whether the call wrote an input array: it returned nothing (an in-place operator)
    or an output that may share memory with an input (``out`` itself aside)."""
    if result is None:
        return True
    outputs = [r for r in (result if isinstance(result, tuple) else (result,))
               if isinstance(r, np.ndarray)]
    inputs = [a for a in (*args, *(v for k, v in kwargs.items() if k != "out"))
              if isinstance(a, np.ndarray)]
    return any(np.may_share_memory(r, a) for r in outputs for a in inputs)


def _bound_plan(function, args, kwargs):
    """The call as its plan serves it (a second call, now that the first left the
    plan), bound: the plan's own ``bind`` (views, outputs and checks made once) where
    it has one, else the plan called without the key; None when no single plan served
    the whole call. A bound plan that hands the call back (None: ``out`` made
    read-only, or a path the plan does not take) makes the plain call."""
    with plans.recording() as ran:
        result = function(*args, **kwargs)
    if len(ran) != 1:
        return None
    plan, arguments, planned = ran[0]
    part = _part(result, planned)
    if part is None:  # the call returned more than its plan's result
        return None
    bind_plan = getattr(plan, "bind", None)
    run = bind_plan(*arguments) if bind_plan is not None else None
    if run is None:
        def run():
            return plan(*arguments)

    def call():
        result = run()
        return function(*args, **kwargs) if result is None else part(result)

    return call


def _part(result, planned):
    """How the call's result is made of its plan's: the whole, the first outputs (an
    operator with fewer outputs than the spec function it calls: RMSNormalization's
    backward has no dB), or the first alone; None: otherwise."""
    if result is planned:
        return lambda r: r
    if type(planned) is not tuple:
        return None
    if (type(result) is tuple and len(result) <= len(planned)
            and all(a is b for a, b in zip(result, planned, strict=False))):
        n = len(result)
        return lambda r: r[:n]
    if result is planned[0]:
        return lambda r: r[0]
    return None


def _bound_kernel(function, args, kwargs):
    """The compiled bound call, or None (the plain call then binds, and raises what the
    call raises)."""
    spec = _spec(function)
    if spec is None:
        return None
    try:  # the public function's arguments, its defaults applied, as it passes them
        arguments = inspect.signature(function).bind(*args, **kwargs)
    except TypeError:
        return None
    arguments.apply_defaults()
    recorder = _Recorder()
    try:
        result = spec(**arguments.arguments, engine=recorder, path="serial")
    except (_NotBindable, TypeError):  # training, instance norms...: the plain call
        return None
    if recorder.call is None or not (result is None or isinstance(result, np.ndarray)):
        return None
    inputs = [a for name, a in arguments.arguments.items()
              if isinstance(a, np.ndarray) and name != "out"]
    kind, recorded = recorder.call
    if result is None:  # in place: the rows' call writes its first input and the sums
        return _fast_in_place(recorded, inputs) if kind == "rows" else None
    if kind == "inference":
        return _fast(recorded, inputs, result)
    if kind == "planes":
        return _fast_planes(recorded, inputs, result)
    return _fast_rows(recorded, inputs, result)


def _public(function):
    """``function`` is one of the public operators (of any module of
    :mod:`normkernels.api`): by identity, so a wrapper or a same-named function
    elsewhere is not."""
    name = getattr(function, "__name__", None)
    return name in api.__all__ and getattr(api, name) is function


def _reads(views, inputs):
    """Every recorded input is exactly the memory of one of the call's arrays (not a
    copy or conversion, whose later contents the bound call would not see)."""
    return all(v is None or any(_same_memory(v, a) for a in inputs) for v in views)


def _fast(recorded, inputs, result):
    """The compiled bound inference call, or None when the spec layer converted or
    copied an array or Y is copied into ``out``."""
    x, y, C, S, scale, B, mean, var, epsilon = recorded
    if not _reads((x, scale, B, mean, var), inputs) or not _same_memory(y, result):
        return None
    return _checked(ENGINE.bind_inference(x, y, C, S, scale, B, mean, var, epsilon), result)


def _fast_rows(recorded, inputs, result):
    """The bound row normalization: one compiled call on the serial path."""
    x, y, scale, B, epsilon, centered, skip, bias, sums, rounding = recorded
    if (sums is not None or not _reads((x, scale, B, skip, bias), inputs)
            or not _same_memory(y, result)):
        return None
    return _checked(ENGINE.bind_rows(x, y, scale, B, epsilon, centered, skip, bias,
                                     rounding=rounding), result)


def _fast_in_place(recorded, inputs):
    """The bound in-place fused add (:func:`normkernels.fused_add_rms_norm`): x's rows
    written with Y and the residual's with the sums, when both are the arrays given
    (not copies) and the rest are read in place."""
    x, y, scale, B, epsilon, centered, skip, bias, sums, rounding = recorded
    if (sums is None or not _reads((x, scale, B, skip, bias), inputs)
            or not any(_same_memory(y, a) for a in inputs)):
        return None
    run = ENGINE.bind_rows(x, y, scale, B, epsilon, centered, skip, bias, sums, rounding)
    guarded = [a for a in inputs if _same_memory(y, a) or _same_memory(sums, a)]
    first, last = guarded[0], guarded[-1]  # x and the residual (one array: both)

    def call():  # two flags, not a generator over them: a decode step is 3 us
        if not (first.flags.writeable and last.flags.writeable):
            raise ValueError("bound call: an array written in place is read-only")
        run()

    return call


def _fast_planes(recorded, inputs, result):
    """The bound instance or group normalization of channels-first memory: one
    compiled call on the serial path."""
    x, y, C, S, scale, B, epsilon, group = recorded
    if not _reads((x, scale, B), inputs) or not _same_memory(y, result):
        return None
    return _checked(ENGINE.bind_instance_planes(x, y, C, S, scale, B, epsilon, group),
                    result)


def _checked(run, Y):
    def call():
        if not Y.flags.writeable:
            raise ValueError("bound call: out is read-only")
        run()
        return Y

    return call


def _same_memory(view, arr):
    """``view`` covers exactly ``arr``'s memory (a transpose or reshape of it)."""
    return (view.__array_interface__["data"][0] == arr.__array_interface__["data"][0]
            and view.size == arr.size and view.flags.c_contiguous
            and (arr.flags.c_contiguous or arr.transpose(_order(arr)).flags.c_contiguous))


def _order(arr):
    return sorted(range(arr.ndim), key=lambda i: -abs(arr.strides[i]))

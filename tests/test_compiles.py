"""No call compiles after the first of its kind.

For every (operator, mode, dtype, layout) of the table: one call, then the same call
with read-only inputs, read-only parameters only, a strided view, a negative-stride
view, ``out=`` given and ``out=X``, through ``bind``, the ONNX drop-in and the Dask
path. No kernel may gain a specialization: a flag the loops do not use (read-only,
writeable, contiguity of the caller's view) must not make a new Numba type, or a
server compiles for seconds after its warm-up. Counted on every Numba dispatcher of
``normkernels.kernels``; not a timing test.
"""

import importlib
import pkgutil

import numpy as np
import pytest
from numba.core.dispatcher import Dispatcher

import normkernels as nk
import normkernels.kernels as kernels_package
from normkernels.operators import BACKWARD, OPERATORS


def _dispatchers():
    found = {}
    for info in pkgutil.iter_modules(kernels_package.__path__):
        module = importlib.import_module(f"normkernels.kernels.{info.name}")
        for name, obj in vars(module).items():
            if isinstance(obj, Dispatcher):
                found[f"{info.name}.{name}"] = obj
    return found


DISPATCHERS = _dispatchers()


def kernel_signatures():
    return {name: set(d.signatures) for name, d in DISPATCHERS.items()}


def _new(before):
    after = kernel_signatures()
    return {name: sorted(map(str, after[name] - before[name])) for name in after
            if after[name] - before[name]}


def _cases():
    for op in OPERATORS.values():
        for mode in op.modes:
            for dtype in op.dtypes:
                for fmt in op.layouts:
                    yield pytest.param(op, mode, _dtype(dtype), fmt,
                                       id=f"{op.name}-{mode}-{dtype}-{fmt}")


def _dtype(name):
    import ml_dtypes

    return np.dtype(ml_dtypes.bfloat16) if name == "bfloat16" else np.dtype(name)


def _workload(rng, op, mode, dtype, fmt):
    shape = (4, 6, 40) if op.rows else (2, 6, 5, 7)  # NCX; skip: (batch, seq, hidden)
    X = (rng.standard_normal(shape) * 2 + 1).astype(dtype)
    if fmt == "NXC" and not op.rows:
        X = np.ascontiguousarray(np.moveaxis(X, 1, -1))
    axis = 1 if fmt == "NCX" else X.ndim - 1
    C = op.columns(X.shape) if op.rows else X.shape[axis]
    return X, op.params(rng, C, dtype, shape=X.shape, mode=mode, X=X, axis=axis)


def _read_only(a):
    a = a.copy()
    a.setflags(write=False)
    return a


def _strided(a):
    """``a``'s values in a view with a step of 2 along the last axis."""
    wide = np.empty((*a.shape[:-1], 2 * a.shape[-1]), a.dtype)
    wide[..., ::2] = a
    return wide[..., ::2]


def _reversed(a):
    """``a``'s values in a view with negative strides on the first axis."""
    return a[::-1].copy()[::-1]


def _output(result):
    return result[0] if isinstance(result, tuple) else result


@pytest.mark.parametrize("op,mode,dtype,fmt", list(_cases()))
def test_no_call_compiles_after_the_first(rng, op, mode, dtype, fmt):
    X, params = _workload(rng, op, mode, dtype, fmt)
    call = op.call  # the public function with the record's arguments
    entries = {"call": {  # the first variant of each entry point is its first call
        "first call": lambda x=X, p=params: call(x, p, mode, fmt),
        "read-only inputs": lambda: call(_read_only(X), tuple(map(_read_only, params)), mode,
                                         fmt),
        "read-only parameters": lambda: call(X, tuple(map(_read_only, params)), mode, fmt),
        "strided view": lambda: call(_strided(X), params, mode, fmt),
        "negative strides": lambda: call(_reversed(X), params, mode, fmt),
    }}
    if not op.reads_only:
        out = np.empty_like(_output(call(X, params, mode, fmt)))
        entries["call"]["out given"] = lambda: call(X, params, mode, fmt, out=out)
        if mode != BACKWARD and out.dtype == X.dtype:
            entries["call"]["out=X"] = lambda: _in_place(op, X.copy(), params, mode, fmt)
        entries["call"]["bind"] = lambda: _bound(op, X, params, mode, fmt)()
    # Dask's strategies that merge statistics run other kernels than the call (BN
    # training normalizes with the merged statistics by the inference kernels): its
    # own first call compiles those, and no later one may
    if op.chunked is not None and mode != BACKWARD and _has("dask"):
        entries["dask"] = {
            "first dask call": lambda: _on_dask(op, X, params, mode, fmt),
            "dask, read-only parameters": lambda: _on_dask(op, X, tuple(map(_read_only,
                                                                             params)),
                                                           mode, fmt),
            "dask, strided X": lambda: _on_dask(op, _strided(X), params, mode, fmt)}
    if (op.onnx is not None and op.onnx.implements and mode == "inference" and fmt == "NCX"
            and _has("onnx")):
        entries["onnx"] = {
            "first run_node": lambda: _on_onnx(op, X, params),
            "run_node, read-only initializers": lambda: _on_onnx(
                op, X, tuple(map(_read_only, params)))}
    compiled = {}
    for variants in entries.values():
        first, *later = variants.items()
        first[1]()
        before = kernel_signatures()
        for name, run in later:
            try:
                run()
            except ValueError as exc:  # a variant the operator refuses (out=X, say)
                if op.in_place and name in _VIEWS:  # written in place: not through a view
                    continue
                if name != "out=X":
                    raise
                assert "out" in str(exc)
            new = _new(before)
            if new:
                compiled[name] = new
            before = kernel_signatures()
    assert not compiled, compiled


_VIEWS = ("strided view", "negative strides")


def _in_place(op, X, params, mode, fmt):
    return op.call(X, params, mode, fmt, out=X)


def _bound(op, X, params, mode, fmt):
    fn = getattr(nk, op.target(mode)[0])
    kwargs = op.kwargs(mode, fmt, op.channel_count(X, fmt))
    return nk.bind(fn, *op.arguments(X, params, mode), **kwargs)


def _has(module):
    try:
        importlib.import_module(module)
    except ImportError:
        return False
    return True


def _on_dask(op, X, params, mode, fmt):
    """The Dask function on X in one chunk: its block is the first call's tensor."""
    import dask
    import dask.array as da

    import normkernels.dask as nkd

    args = [da.from_array(a, chunks=a.shape) if a.shape == X.shape else a
            for a in op.arguments(X, params, mode)]
    kwargs = op.kwargs(mode, fmt, op.channel_count(X, fmt))
    return dask.compute(getattr(nkd, op.function)(*args, **kwargs), scheduler="sync")


def _on_onnx(op, X, params):
    """The ONNX drop-in's run_node on a one-node model of the record's operator."""
    from onnx import helper

    import normkernels.onnx as nko

    args = op.arguments(X, params, "inference")
    attrs = {k: v for k, v in op.kwargs("inference", "NCX", op.channel_count(X, "NCX")).items()
             if k != "data_format"}
    node = helper.make_node(op.onnx.op_type, list(op.onnx.inputs[:len(args)]), ["Y"],
                            domain=op.onnx.domain or None, **attrs)
    return nko.run_node(node, list(args), op.onnx.model_opset)


# --- after normkernels.warmup, no call of what it warmed compiles, at any size ---

_AFTER_WARMUP = """
import sys, json
import numpy as np
import normkernels as nk
sys.path.insert(0, {tests!r})
import test_compiles as tc
from normkernels.operators import OPERATORS
from normkernels.warm import _STATISTICS_BACKWARD, DTYPES, _workload

name, dtype, layouts = {name!r}, {dtype!r}, {layouts!r}
nk.warmup([name], [dtype], layouts)
op = OPERATORS[name]
before = tc.kernel_signatures()
rng = np.random.default_rng(1)
compiled = []
# shapes the warmup does not use, at every scale the size policy tells apart
shapes = ([(1, 5), (3, 1000), (7, 33), (8192, 1024), (1, 200000)] if op.rows else
          [(1, 3, 1, 1), (3, 5, 7, 9), (2, 7, 301), (1, 64, 56, 56), (16, 64, 112, 112),
           (1, 1, 5000, 3), (128, 32, 6, 6)])
for mode in op.modes:
    for layout in layouts:
        if layout not in op.layouts:
            continue
        for shape in shapes:
            if op.family == "mvn" and len(shape) != 4:  # its default axes are 4-D ones
                continue
            X, params = _workload(rng, op, mode, DTYPES[dtype], layout, shape)
            X = X + np.asarray(1, X.dtype)
            with np.errstate(all="ignore"):
                op.call(X, params, mode, layout)
                op.call(tc._read_only(X), tuple(map(tc._read_only, params)), mode, layout)
                try:
                    op.call(tc._strided(X), params, mode, layout)
                except ValueError:  # written in place, and not through a view (QK-norm)
                    if not op.in_place:
                        raise
                if mode == "backward" and op.backward in _STATISTICS_BACKWARD:
                    C = op.channel_count(X, layout)
                    kwargs = op.kwargs(mode, layout, C)
                    lead = (X.shape[0], kwargs.get("num_groups", C))
                    getattr(nk, op.backward)(*op.arguments(X, params, mode),
                                             mean=np.zeros(lead), inv_std=np.ones(lead),
                                             **kwargs)
            new = tc._new(before)
            if new:
                compiled.append([mode, layout, list(shape), sorted(new)])
            before = tc.kernel_signatures()
print(json.dumps(compiled))
"""


def _warm_cases():
    for op in OPERATORS.values():
        yield pytest.param(op.name, "float32", id=f"{op.name}-float32")
    yield pytest.param("layernorm", "bfloat16", id="layernorm-bfloat16")
    yield pytest.param("batchnorm", "float16", id="batchnorm-float16")


@pytest.mark.parametrize("name,dtype", list(_warm_cases()))
def test_after_warmup_no_call_compiles(name, dtype):
    """In a fresh process: ``normkernels.warmup([name], [dtype])``, then calls of that
    operator in every mode and layout at sizes from one element per channel to 12M
    elements (shapes the warmup does not use), read-only and strided too: none
    compiles anything."""
    import json
    import pathlib
    import subprocess
    import sys

    code = _AFTER_WARMUP.format(tests=str(pathlib.Path(__file__).parent), name=name,
                                dtype=dtype, layouts=["NCX", "NXC"])
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=1200)
    assert done.returncode == 0, done.stderr[-3000:]
    compiled = json.loads(done.stdout.strip().splitlines()[-1])
    assert not compiled, compiled


def test_warmup_takes_a_dtype_its_name_or_a_list_and_names_a_wrong_one():
    from normkernels import warm

    def labels(dtypes):
        return [label for label, _ in warm.calls("rms_normalization", dtypes)]

    one = labels("float32")
    assert one and labels(np.float32) == one and labels([np.dtype(np.float32)]) == one
    with pytest.raises(TypeError, match="dtypes must be"):
        warm.calls("rms_normalization", 3)


def test_warm_backward_covers_every_route_of_the_one_call_kernels():
    """``Engine.warm_backward`` (run by the warm-up) compiles or loads every tag
    combination of the one-call backward kernels for a dtype, since which one a call
    takes depends on its shape: 8 of ``channel_backward`` (sums x dX loop x threads),
    16 of ``group_backward`` (and the statistics given or recomputed)."""
    import subprocess
    import sys

    code = (
        "import numpy as np\n"
        "from normkernels.engine.numba_engine import ENGINE\n"
        "from normkernels.kernels import backward_small as small\n"
        "ENGINE.warm_backward(np.dtype(np.float16))\n"
        "print(len(small.channel_backward.signatures), len(small.group_backward.signatures))\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=1200)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split() == ["8", "16"]

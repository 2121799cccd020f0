"""Reliability under real use: threads, processes, threading layers, memory, aliasing,
byte order, cache trouble and special values. Each guarantee of the guide's
"Guarantees" section is a test here (huge tensors: tests/test_huge.py; hostile input:
tests/test_hostile.py)."""

import ctypes
import os
import subprocess
import sys
import textwrap
import threading

import ml_dtypes
import numpy as np
import pytest
from arrays import assert_identical
from oracle import (
    assert_close,
    batch_norm,
    batch_norm_training,
    instance_norm,
    instance_tolerance,
    rounded_statistic_tolerance,
    statistics_tolerance,
    tolerance,
    training_tolerance,
)

import normkernels as nk

BF16 = np.dtype(ml_dtypes.bfloat16)
EPS = 1e-5
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run_python(code, timeout=900, **env):
    """Run ``code`` in a fresh interpreter; returns the completed process."""
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                          text=True, timeout=timeout, cwd=ROOT,
                          env={**os.environ, "PYTHONPATH": ROOT, **env})


def battery():
    """(name, callable) pairs covering every operator (the public functions and
    ``normkernels.onnx.run_node``), dtype family and layout, at sizes that take the
    serial, parallel and streaming paths. Each callable returns a tuple of all the
    outputs of its call (statistics included). Self-contained: the threading-layer
    test runs its source in a fresh interpreter."""
    import onnx.helper

    import normkernels.onnx

    # ONNX nodes: BatchNormalization-15 training with all 3 outputs, and
    # InstanceNormalization-22; run_node gets ONNX's layout (a strided view for NXC)
    train_node = onnx.helper.make_node(
        "BatchNormalization", ["X", "scale", "B", "mean", "var"],
        ["Y", "running_mean", "running_var"], training_mode=1, momentum=0.8)
    instance_node = onnx.helper.make_node("InstanceNormalization", ["X", "scale", "B"],
                                          ["Y"], epsilon=1e-3)
    rng = np.random.default_rng(7)
    calls = []

    def add(name, fn, *args, **kwargs):
        def call():
            result = fn(*args, **kwargs)
            return tuple(result) if isinstance(result, (tuple, list)) else (result,)
        calls.append((name, call))

    def merged(X, fmt, half):
        return nk.merge_moments(nk.partial_moments(X[:half], data_format=fmt),
                                nk.partial_moments(X[half:], data_format=fmt))

    for shape, dtype, fmt in [((2, 3, 5, 7), np.float32, "NCX"),
                              ((4, 16, 40, 40), np.float16, "NCX"),
                              ((4, 40, 40, 16), BF16, "NXC"),
                              ((8, 32, 64, 64), np.float32, "NCX"),
                              ((3, 5, 9), np.float64, "NXC")]:
        X = (rng.standard_normal(shape) * 2 + 1).astype(dtype)
        C = shape[1] if fmt == "NCX" else shape[-1]
        p = [rng.uniform(0.5, 2, C).astype(np.float32) for _ in range(4)]
        pt = [v.astype(dtype) for v in p]
        Xn = X if fmt == "NCX" else np.moveaxis(X, -1, 1)
        tag = f"{'x'.join(map(str, shape))}-{np.dtype(dtype).name}-{fmt}"
        add(f"bn-{tag}", nk.batch_normalization, X, *p, data_format=fmt)
        add(f"train-{tag}", nk.batch_normalization, X, *p, training_mode=1, data_format=fmt)
        add(f"in-{tag}", nk.instance_normalization, X, *pt[:2], data_format=fmt)
        add(f"moments-{tag}", nk.moments, X, data_format=fmt)
        add(f"partial-{tag}", nk.partial_moments, X, data_format=fmt)
        add(f"merged-{tag}", merged, X, fmt, shape[0] // 2)
        if np.dtype(dtype) != np.float64:  # oneDNN: f32, f16, bf16 (bf16 params with bf16)
            add(f"onednn-{tag}", nk.batch_norm_inference, X,
                *(pt if np.dtype(dtype) == BF16 else p), epsilon=1e-3, data_format=fmt)
        add(f"onnx-train-{tag}", normkernels.onnx.run_node, train_node, [Xn, *p], opset=15)
        add(f"onnx-in-{tag}", normkernels.onnx.run_node, instance_node, [Xn, *pt[:2]],
            opset=22)
    return calls


def as_tuple(result):
    return result if isinstance(result, tuple) else (result,)


def same_bits(a, b):
    """Same dtype, shape and bytes (outputs may be views in any memory order)."""
    a, b = np.asarray(a), np.asarray(b)
    return (a.dtype == b.dtype and a.shape == b.shape
            and np.ascontiguousarray(a).tobytes() == np.ascontiguousarray(b).tobytes())


def test_concurrent_calls_match_sequential_ones():
    """8 threads, every operator, mixed dtypes/layouts/sizes, 400 calls each."""
    calls = battery()
    expected = {name: as_tuple(fn()) for name, fn in calls}
    failures = []

    def worker(seed):
        order = np.random.default_rng(seed).integers(0, len(calls), 400)
        for k in order:
            name, fn = calls[k]
            got = as_tuple(fn())
            if len(got) != len(expected[name]) or not all(
                    same_bits(a, b) for a, b in zip(got, expected[name], strict=True)):
                failures.append(name)

    threads = [threading.Thread(target=worker, args=(seed,)) for seed in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=900)
    assert not any(t.is_alive() for t in threads), "a thread hung"
    assert failures == []


def test_concurrent_calls_with_an_out_per_thread():
    rng = np.random.default_rng(3)
    X = rng.standard_normal((8, 32, 64, 64)).astype(np.float32)
    p = [rng.uniform(0.5, 2, 32).astype(np.float32) for _ in range(4)]
    expected = nk.batch_normalization(X, *p, training_mode=1)[0]
    bad = []

    def worker():
        out = np.empty_like(X)
        for _ in range(100):
            nk.batch_normalization(X, *p, training_mode=1, out=out)
            if not np.array_equal(out, expected):
                bad.append(1)

    threads = [threading.Thread(target=worker) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=900)
    assert not bad and not any(t.is_alive() for t in threads)


CHILD = """
    import multiprocessing as mp, sys
    import numpy as np, onnx.helper, normkernels as nk, normkernels.onnx

    rng = np.random.default_rng(0)
    X = rng.standard_normal((8, 64, 56, 56)).astype(np.float32)
    Xl = np.ascontiguousarray(np.moveaxis(X, 1, -1))
    p = np.linspace(0.5, 2, 64).astype(np.float32)
    train = onnx.helper.make_node("BatchNormalization", ["X", "scale", "B", "mean", "var"],
                                  ["Y", "running_mean", "running_var"], training_mode=1)
    instance = onnx.helper.make_node("InstanceNormalization", ["X", "scale", "B"], ["Y"])

    def results():   # every output of every operator, both layouts: (dtype, shape, bytes)
        nxc = dict(data_format="NXC")
        calls = [
            nk.batch_normalization(X, p, p, p, p),
            nk.batch_normalization(Xl, p, p, p, p, **nxc),
            nk.batch_normalization(X, p, p, p, p, training_mode=1),
            nk.batch_normalization(Xl, p, p, p, p, training_mode=1, **nxc),
            nk.batch_norm_inference(X, p, p, p, p, epsilon=1e-3, data_format="NCX"),
            nk.batch_norm_inference(Xl, p, p, p, p, epsilon=1e-3, **nxc),
            nk.instance_normalization(X, p, p),
            nk.instance_normalization(Xl, p, p, **nxc),
            nk.moments(X),
            nk.moments(Xl, **nxc),
            nk.partial_moments(X),
            nk.partial_moments(Xl, **nxc),
            nk.merge_moments(nk.partial_moments(X[:3]), nk.partial_moments(X[3:])),
            nk.merge_moments(nk.partial_moments(Xl[:5], **nxc),
                             nk.partial_moments(Xl[5:], **nxc)),
            normkernels.onnx.run_node(train, [X, p, p, p, p], opset=15),
            normkernels.onnx.run_node(train, [np.moveaxis(Xl, -1, 1), p, p, p, p], opset=15),
            normkernels.onnx.run_node(instance, [X, p, p], opset=22),
            normkernels.onnx.run_node(instance, [np.moveaxis(Xl, -1, 1), p, p], opset=22),
        ]
        outputs = []
        for r in calls:
            outputs += list(r) if isinstance(r, (tuple, list)) else [r]
        assert len(outputs) == 36, len(outputs)
        return [(a.dtype.str, a.shape, np.ascontiguousarray(a).tobytes()) for a in outputs]

    def child(q):
        q.put(results())

    if __name__ == "__main__":
        parent = results()   # parallel kernels ran in the parent
        ctx = mp.get_context(sys.argv[1])
        q = ctx.Queue()
        proc = ctx.Process(target=child, args=(q,))
        proc.start()
        got = q.get(timeout=600)
        proc.join(30)
        assert proc.exitcode == 0, proc.exitcode
        assert len(got) == len(parent)
        differ = [k for k, (a, b) in enumerate(zip(got, parent)) if a != b]
        assert not differ, f"child results differ at outputs {differ}"
        print("ok")
"""


@pytest.mark.parametrize("method", ["fork", "spawn", "forkserver"])
def test_child_processes_can_call_every_operator(tmp_path, method):
    """A forked child of a process that used GNU OpenMP runs on one thread (Numba
    would terminate it), with the parent's bits; spawn and forkserver children run
    normally."""
    script = tmp_path / "child.py"
    script.write_text(textwrap.dedent(CHILD))
    done = subprocess.run([sys.executable, str(script), method], capture_output=True,
                          text=True, timeout=900, cwd=ROOT,
                          env={**os.environ, "PYTHONPATH": ROOT})
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-2000:]


LAYER_CHECK = """
    import threading, numba, numpy as np, normkernels as nk
    from tests_reliability_battery import battery
    calls = battery()
    expected = {name: fn() for name, fn in calls}
    errors = []
    def worker():
        for name, fn in calls * 3:
            got = fn()
            if len(got) != len(expected[name]):
                errors.append(name)
            for a, b in zip(got, expected[name]):
                if not (a.dtype == b.dtype and a.shape == b.shape and
                        np.ascontiguousarray(a).tobytes() == np.ascontiguousarray(b).tobytes()):
                    errors.append(name)
    threads = [threading.Thread(target=worker) for _ in range(4)]
    [t.start() for t in threads]; [t.join() for t in threads]
    assert not errors, errors
    np.savez("{out}", **{f"{name}/{k}": np.ascontiguousarray(v)
                         for name, outputs in expected.items() for k, v in enumerate(outputs)})
    print(numba.threading_layer(), numba.get_num_threads())
"""


def _layers():
    layers = ["omp", "workqueue"]
    try:
        import tbb  # noqa: F401
        layers.append("tbb")
    except ImportError:
        pass
    return layers


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("layer", _layers())
def test_every_threading_layer_gives_the_same_bits(tmp_path, layer, threads):
    """Same results under each Numba threading layer and thread count, with four
    Python threads calling at once (workqueue would abort: launches are serialised)."""
    helper = tmp_path / "tests_reliability_battery.py"
    helper.write_text("import numpy as np, ml_dtypes, normkernels as nk\n"
                      "BF16 = np.dtype(ml_dtypes.bfloat16)\n"
                      + textwrap.dedent(_source(battery)))
    out = tmp_path / f"{layer}-{threads}.npz"
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(LAYER_CHECK).replace("{out}", str(out))],
        capture_output=True, text=True, timeout=900, cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": ROOT, "NUMBA_THREADING_LAYER": layer,
             "NUMBA_NUM_THREADS": str(threads)})
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == [layer, str(threads)]
    # every output of every call (statistics included), saved as name/k
    here = {f"{name}/{k}": np.ascontiguousarray(v) for name, fn in battery()
            for k, v in enumerate(as_tuple(fn()))}
    with np.load(out) as there:
        assert sorted(there.files) == sorted(here)
        for key, value in here.items():
            saved = there[key]
            assert saved.shape == value.shape and saved.itemsize == value.itemsize, \
                (layer, threads, key)
            assert saved.tobytes() == value.tobytes(), (layer, threads, key)


def _source(fn):
    import inspect

    return inspect.getsource(fn)


@pytest.mark.parametrize("case", ["inference", "inference-out", "training", "instance"])
def test_peak_memory_is_y_and_nothing_proportional_to_x(case):
    """1 GB float32 input: the peak resident memory grows by at most Y + 10% (nothing
    at all beyond 10% of Y with out=)."""
    code = f"""
        import resource, numpy as np, normkernels as nk
        X = np.ones((16, 64, 512, 512), np.float32)    # 1 GiB, touched
        p = np.ones(64, np.float32)
        out = np.ones_like(X) if "{case}" == "inference-out" else None
        nk.batch_normalization(X[:1, :, :8], p, p, p, p)          # load numba and kernels
        nk.batch_normalization(X[:1, :, :8], p, p, p, p, training_mode=1)
        nk.instance_normalization(X[:1, :, :8], p, p)
        before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        if "{case}" == "inference-out":
            nk.batch_normalization(X, p, p, p, p, out=out)
        elif "{case}" == "inference":
            Y = nk.batch_normalization(X, p, p, p, p)
        elif "{case}" == "training":
            Y = nk.batch_normalization(X, p, p, p, p, training_mode=1)
        else:
            Y = nk.instance_normalization(X, p, p)
        after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        print(after - before, X.nbytes)
    """
    done = run_python(code)
    assert done.returncode == 0, done.stderr[-2000:]
    grew, nbytes = map(int, done.stdout.split())
    allowed = 0.1 * nbytes if case == "inference-out" else 1.1 * nbytes
    assert grew <= allowed, (case, grew / nbytes)


def test_in_place_training_computes_statistics_before_writing():
    rng = np.random.default_rng(1)
    X = rng.standard_normal((4, 3, 20, 20)).astype(np.float32)
    p = [rng.uniform(0.5, 2, 3).astype(np.float32) for _ in range(4)]
    expected = nk.batch_normalization(X, *p, training_mode=1)
    Xc = X.copy()
    got = nk.batch_normalization(Xc, *p, training_mode=1, out=Xc)
    assert got[0] is Xc
    for a, b in zip(got, expected, strict=True):
        assert_identical(a, b)
    Xi = X.copy()
    assert_identical(nk.instance_normalization(Xi, p[0], p[1], out=Xi),
                     nk.instance_normalization(X, p[0], p[1]))


def test_out_aliasing_a_parameter_or_part_of_x_is_refused():
    X = np.zeros((2, 3, 4, 4), np.float32)
    p = np.ones(3, np.float32)
    big = np.zeros(2 * X.size + 3, np.float32)
    with pytest.raises(ValueError, match="overlaps X"):
        nk.batch_normalization(big[:X.size].reshape(X.shape), p, p, p, p,
                               out=big[3:X.size + 3].reshape(X.shape))
    storage = np.zeros(X.size, np.float32)
    scale = storage[5:8]  # inside out
    out = storage.reshape(X.shape)
    with pytest.raises(ValueError, match="out shares memory with scale"):
        nk.instance_normalization(X, scale, p, out=out)


@pytest.mark.parametrize("dtype", ["f2", "f4", "f8"])
@pytest.mark.parametrize("order", [">", "<"])
def test_non_native_byte_order_and_read_only_inputs(order, dtype):
    """Byte-swapped (or native), read-only inputs: results in native order, within the
    oracle's error model (the oracle is given the same values in native order)."""
    rng = np.random.default_rng(2)
    X = rng.standard_normal((2, 3, 5, 6)).astype(f"{order}{dtype}")
    p = [rng.uniform(0.5, 2, 3).astype(f"{order}{dtype}") for _ in range(4)]
    for arr in (X, *p):
        arr.flags.writeable = False
    native = np.dtype(dtype)
    Xn, pn = X.astype(native), [v.astype(native) for v in p]
    Y = nk.batch_normalization(X, *p)
    assert Y.dtype == native
    assert_close(Y, batch_norm(Xn, *pn, EPS), tolerance(Xn, *pn, EPS, "NCX", native))
    Yt, running_mean, running_var = nk.batch_normalization(X, *p, training_mode=1)
    assert Yt.dtype == native
    exact_Y, exact_rm, exact_rv, mean, var = batch_norm_training(Xn, *pn, EPS, 0.9)
    assert_close(Yt, exact_Y, training_tolerance(Xn, pn[0], pn[1], mean, var, EPS, "NCX"))
    d_mean, d_var = statistics_tolerance(mean, var, native)
    assert_close(running_mean, exact_rm,
                 rounded_statistic_tolerance(exact_rm, native, 0.1 * d_mean), "running_mean")
    assert_close(running_var, exact_rv,
                 rounded_statistic_tolerance(exact_rv, native, 0.1 * d_var), "running_var")
    Yi = nk.instance_normalization(X, p[0], p[1])
    assert Yi.dtype == native
    exact_Yi, imean, ivar = instance_norm(Xn, pn[0], pn[1], EPS)
    assert_close(Yi, exact_Yi, instance_tolerance(Xn, pn[0], pn[1], imean, ivar, EPS, "NCX",
                                                  native))


CACHE_CALL = """
    import warnings, numpy as np, normkernels as nk
    X = np.ones((2, 3, 4, 4), np.float32); p = np.ones(3, np.float32)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        y = nk.batch_normalization(X, p, p, p, p, training_mode=1)[0]
    assert np.allclose(y, 1.0), y
    print(len(caught))
"""


def _cache_files(root):
    return [os.path.join(d, f) for d, _, files in os.walk(root) for f in files
            if f.endswith((".nbi", ".nbc"))]


# The child first makes sure it cannot create a file in the cache directory, so the
# test cannot pass on a directory that is writable after all.
UNWRITABLE_CACHE_CALL = """
    import os, sys
    probe = os.path.join(os.environ["NUMBA_CACHE_DIR"], "probe")
    try:
        open(probe, "x").close()
    except PermissionError:
        pass
    else:
        os.remove(probe)
        sys.exit("the cache directory is writable by this process: nothing to test")
""" + CACHE_CALL

_PR_CAPBSET_DROP, _PR_CAP_AMBIENT, _PR_CAP_AMBIENT_LOWER = 24, 47, 3
_CAP_DAC_OVERRIDE, _CAP_DAC_READ_SEARCH = 1, 2
_LINUX_CAPABILITY_VERSION_3 = 0x20080522


def _drop_dac_capabilities():
    """A ``preexec_fn`` that takes CAP_DAC_OVERRIDE and CAP_DAC_READ_SEARCH out of the
    bounding, ambient and inheritable sets before exec. For root, exec grants the
    permitted (and effective) set ``bounding | inheritable | ambient``, so the program
    run has neither capability: file modes apply to it. Without CAP_SETPCAP (any
    non-root user) the bounding-set drop fails with EPERM and is ignored: such a
    process has neither capability anyway. The child checks the outcome itself."""
    libc = ctypes.CDLL(None, use_errno=True)  # resolved here, not after fork
    prctl, capget, capset = libc.prctl, libc.capget, libc.capset
    ulong = ctypes.c_ulong
    header = (ctypes.c_uint32 * 2)(_LINUX_CAPABILITY_VERSION_3, 0)  # version, this thread
    data = (ctypes.c_uint32 * 6)()  # (effective, permitted, inheritable) x 2 words
    keep = 0xFFFFFFFF & ~((1 << _CAP_DAC_OVERRIDE) | (1 << _CAP_DAC_READ_SEARCH))

    def drop():
        for cap in (_CAP_DAC_OVERRIDE, _CAP_DAC_READ_SEARCH):
            prctl(_PR_CAPBSET_DROP, ulong(cap), ulong(0), ulong(0), ulong(0))
            prctl(_PR_CAP_AMBIENT, ulong(_PR_CAP_AMBIENT_LOWER), ulong(cap), ulong(0),
                  ulong(0))
        if capget(header, data) == 0:
            data[2] &= keep  # inheritable, capabilities 0-31
            capset(header, data)

    return drop


def test_unwritable_cache_directory(tmp_path):
    """A cache directory the process cannot write to (mode 0o500; for root, run with
    the capabilities that override file modes dropped): the call works, with at most
    one warning. Not skipped as root: if the directory cannot be made unwritable, the
    child's own check fails the test."""
    cache = tmp_path / "cache"
    cache.mkdir()
    cache.chmod(0o500)
    try:
        done = subprocess.run(
            [sys.executable, "-c", textwrap.dedent(UNWRITABLE_CACHE_CALL)],
            capture_output=True, text=True, timeout=900, cwd=ROOT,
            env={**os.environ, "PYTHONPATH": ROOT, "NUMBA_CACHE_DIR": str(cache)},
            preexec_fn=_drop_dac_capabilities())
    finally:
        cache.chmod(0o700)
    assert done.returncode == 0, done.stderr[-2000:]
    assert int(done.stdout.split()[-1]) <= 1


def test_cache_directory_that_is_a_file(tmp_path):
    """Numba cannot create its cache there (even as root): the call still works."""
    blocker = tmp_path / "not-a-directory"
    blocker.write_text("")
    done = run_python(CACHE_CALL, NUMBA_CACHE_DIR=str(blocker))
    assert done.returncode == 0, done.stderr[-2000:]
    assert int(done.stdout.split()[-1]) <= 1


def test_corrupt_cache_and_another_cpu(tmp_path):
    cache = tmp_path / "cache"
    first = run_python(CACHE_CALL, NUMBA_CACHE_DIR=str(cache))
    assert first.returncode == 0, first.stderr[-2000:]
    files = _cache_files(cache)
    assert files
    for path in files:  # corrupt every cached kernel and index
        with open(path, "r+b") as f:
            f.seek(max(0, os.path.getsize(path) // 2))
            f.write(b"\x00garbage\xff" * 8)
    corrupt = run_python(CACHE_CALL, NUMBA_CACHE_DIR=str(cache))
    assert corrupt.returncode == 0, corrupt.stderr[-2000:]
    assert int(corrupt.stdout.split()[-1]) <= 1
    other_cpu = run_python(CACHE_CALL, NUMBA_CACHE_DIR=str(cache), NUMBA_CPU_NAME="generic")
    assert other_cpu.returncode == 0, other_cpu.stderr[-2000:]
    assert int(other_cpu.stdout.split()[-1]) <= 1


SPECIALS = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, 1e30, -1e-30], np.float64)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_special_values_propagate_as_the_formula_says(dtype):
    """NaN/Inf anywhere: inference element by element as the float64 formula; a
    non-positive var + epsilon gives what the formula gives (inf or NaN)."""
    rng = np.random.default_rng(5)
    C = 7
    X = rng.standard_normal((3, C, 4, 5)).astype(dtype)
    X.reshape(-1)[rng.choice(X.size, 12, replace=False)] = rng.choice(SPECIALS, 12)
    scale, B, mean = (rng.standard_normal(C).astype(dtype) for _ in range(3))
    var = rng.uniform(0.5, 2, C).astype(dtype)
    scale[1], B[2], mean[3], var[4] = np.nan, np.inf, -np.inf, np.inf
    var[5] = -1e-5  # var + epsilon == 0
    var[6] = -1.0   # var + epsilon < 0
    Y = nk.batch_normalization(X, scale, B, mean, var, epsilon=EPS)
    exact = batch_norm(X, scale, B, mean, var, EPS)
    assert np.isnan(exact).any() and np.isinf(exact).any()
    # NaN exactly where the formula gives NaN, the same infinities, and the finite
    # elements within the error model
    assert_close(Y, exact, tolerance(X, scale, B, mean, var, EPS, "NCX", Y.dtype))


def test_special_values_in_statistics_stay_in_their_channel():
    X = np.random.default_rng(6).standard_normal((4, 5, 6, 6)).astype(np.float32)
    X[1, 0, 2, 2] = np.nan
    X[2, 1, 3, 3] = np.inf
    X[0, 2, 0, 0] = -np.inf
    mean, var = nk.moments(X)
    assert np.isnan(mean[0]) and np.isnan(var[0])
    assert mean[1] == np.inf and np.isnan(var[1])
    assert mean[2] == -np.inf and np.isnan(var[2])
    assert np.isfinite(mean[3:]).all() and np.isfinite(var[3:]).all()
    p = np.ones(5, np.float32)
    Y = nk.batch_normalization(X, p, p, p, p, training_mode=1)[0]
    assert np.isnan(Y[:, :3]).all() and np.isfinite(Y[:, 3:]).all()

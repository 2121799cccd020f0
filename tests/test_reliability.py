"""Reliability under real use: threads, processes, threading layers, memory, aliasing,
byte order, cache trouble and special values. Each guarantee of the README's
"Guarantees" section is a test here (huge tensors: tests/test_huge.py; hostile input:
tests/test_hostile.py)."""

import os
import subprocess
import sys
import textwrap
import threading

import ml_dtypes
import numpy as np
import pytest
from arrays import assert_identical
from oracle import batch_norm, batch_norm_training, instance_norm

import normkernels as nk

BF16 = np.dtype(ml_dtypes.bfloat16)
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run_python(code, timeout=240, **env):
    """Run ``code`` in a fresh interpreter; returns the completed process."""
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                          text=True, timeout=timeout, cwd=ROOT,
                          env={**os.environ, "PYTHONPATH": ROOT, **env})


def battery():
    """(name, callable) pairs covering every operator, dtype family and layout, at
    sizes that take the serial, parallel and streaming paths."""
    rng = np.random.default_rng(7)
    calls = []
    for shape, dtype, fmt in [((2, 3, 5, 7), np.float32, "NCX"),
                              ((4, 16, 40, 40), np.float16, "NCX"),
                              ((4, 40, 40, 16), BF16, "NXC"),
                              ((8, 32, 64, 64), np.float32, "NCX"),
                              ((3, 5, 9), np.float64, "NXC")]:
        X = (rng.standard_normal(shape) * 2 + 1).astype(dtype)
        C = shape[1] if fmt == "NCX" else shape[-1]
        p = [rng.uniform(0.5, 2, C).astype(np.float32) for _ in range(4)]
        pt = [v.astype(dtype) for v in p[:2]]
        tag = f"{'x'.join(map(str, shape))}-{np.dtype(dtype).name}-{fmt}"
        calls += [
            (f"bn-{tag}", lambda X=X, p=p, fmt=fmt: nk.batch_normalization(
                X, *p, data_format=fmt)),
            (f"train-{tag}", lambda X=X, p=p, fmt=fmt: nk.batch_normalization(
                X, *p, training_mode=1, data_format=fmt)),
            (f"in-{tag}", lambda X=X, pt=pt, fmt=fmt: nk.instance_normalization(
                X, *pt, data_format=fmt)),
            (f"moments-{tag}", lambda X=X, fmt=fmt: nk.moments(X, data_format=fmt)),
        ]
    return calls


def as_tuple(result):
    return result if isinstance(result, tuple) else (result,)


def test_concurrent_calls_match_sequential_ones():
    """8 threads, every operator, mixed dtypes/layouts/sizes, 400 calls each."""
    calls = battery()
    expected = {name: as_tuple(fn()) for name, fn in calls}
    failures = []

    def worker(seed):
        order = np.random.default_rng(seed).integers(0, len(calls), 400)
        for k in order:
            name, fn = calls[k]
            for got, want in zip(as_tuple(fn()), expected[name], strict=True):
                if not np.array_equal(np.asarray(got).view(np.uint8),
                                      np.asarray(want).view(np.uint8)):
                    failures.append(name)

    threads = [threading.Thread(target=worker, args=(seed,)) for seed in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
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
        t.join(timeout=300)
    assert not bad and not any(t.is_alive() for t in threads)


CHILD = """
    import multiprocessing as mp, sys
    import numpy as np, normkernels as nk

    rng = np.random.default_rng(0)
    X = rng.standard_normal((8, 64, 56, 56)).astype(np.float32)
    Xl = np.ascontiguousarray(np.moveaxis(X, 1, -1))
    p = np.linspace(0.5, 2, 64).astype(np.float32)

    def results():
        return [nk.batch_normalization(X, p, p, p, p),
                nk.batch_normalization(X, p, p, p, p, training_mode=1)[0],
                nk.batch_normalization(Xl, p, p, p, p, training_mode=1, data_format="NXC")[0],
                nk.instance_normalization(X, p, p), nk.instance_normalization(Xl, p, p,
                data_format="NXC"), nk.moments(X)[1], nk.moments(Xl, data_format="NXC")[1]]

    def child(q):
        q.put([r.tobytes() for r in results()])

    if __name__ == "__main__":
        parent = [r.tobytes() for r in results()]   # parallel kernels ran in the parent
        ctx = mp.get_context(sys.argv[1])
        q = ctx.Queue()
        proc = ctx.Process(target=child, args=(q,))
        proc.start()
        got = q.get(timeout=120)
        proc.join(30)
        assert proc.exitcode == 0, proc.exitcode
        assert got == parent, "child results differ"
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
                          text=True, timeout=300, cwd=ROOT,
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
            for a, b in zip(got if isinstance(got, tuple) else (got,),
                            expected[name] if isinstance(expected[name], tuple)
                            else (expected[name],)):
                if not np.array_equal(np.asarray(a).view(np.uint8),
                                      np.asarray(b).view(np.uint8)):
                    errors.append(name)
    threads = [threading.Thread(target=worker) for _ in range(4)]
    [t.start() for t in threads]; [t.join() for t in threads]
    assert not errors, errors
    np.savez("{out}", **{k: (v[0] if isinstance(v, tuple) else v) for k, v in
                         expected.items()})
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
        capture_output=True, text=True, timeout=300, cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": ROOT, "NUMBA_THREADING_LAYER": layer,
             "NUMBA_NUM_THREADS": str(threads)})
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == [layer, str(threads)]
    here = {name: as_tuple(fn())[0] for name, fn in battery()}
    with np.load(out) as there:
        for name, value in here.items():
            assert np.array_equal(np.asarray(value).view(np.uint8),
                                  there[name].view(np.uint8)), (layer, threads, name)


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


@pytest.mark.parametrize("order", [">", "<"])
def test_non_native_byte_order_and_read_only_inputs(order):
    rng = np.random.default_rng(2)
    X = rng.standard_normal((2, 3, 5, 6)).astype(f"{order}f4")
    p = [rng.uniform(0.5, 2, 3).astype(f"{order}f4") for _ in range(4)]
    for arr in (X, *p):
        arr.flags.writeable = False
    Y = nk.batch_normalization(X, *p)
    assert Y.dtype == np.float32
    np.testing.assert_allclose(Y, batch_norm(X, *p, 1e-5), rtol=1e-5, atol=1e-6)
    Yt = nk.batch_normalization(X, *p, training_mode=1)[0]
    np.testing.assert_allclose(Yt, batch_norm_training(X, *p, 1e-5, 0.9)[0], rtol=1e-5,
                               atol=1e-5)
    Yi = nk.instance_normalization(X, p[0], p[1])
    np.testing.assert_allclose(Yi, instance_norm(X, p[0], p[1], 1e-5)[0], rtol=1e-5,
                               atol=1e-5)


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


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only directories")
def test_unwritable_cache_directory(tmp_path):
    cache = tmp_path / "cache"
    cache.mkdir()
    cache.chmod(0o500)
    try:
        done = run_python(CACHE_CALL, NUMBA_CACHE_DIR=str(cache))
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
    Y = nk.batch_normalization(X, scale, B, mean, var, epsilon=1e-5)
    exact = batch_norm(X, scale, B, mean, var, 1e-5)
    np.testing.assert_array_equal(np.isnan(Y), np.isnan(exact))
    np.testing.assert_array_equal(np.isposinf(Y), np.isposinf(exact))
    np.testing.assert_array_equal(np.isneginf(Y), np.isneginf(exact))
    finite = np.isfinite(exact)
    np.testing.assert_allclose(Y[finite], exact[finite], rtol=1e-5, atol=1e-5)


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

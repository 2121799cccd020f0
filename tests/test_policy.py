"""The store policy: streaming stores only when a call's traffic exceeds the
last-level cache, and the NORMKERNELS_STREAMING override."""

import numpy as np
import pytest
from oracle import assert_close, batch_norm, tolerance

import normkernels as nk
from normkernels.engine import policy, threads

MB = 1 << 20


@pytest.fixture
def cache_of(monkeypatch):
    def set_cache(nbytes):
        monkeypatch.setattr(policy, "last_level_cache_bytes", lambda: nbytes)
    monkeypatch.delenv(policy.STREAMING_ENV, raising=False)
    monkeypatch.setattr(policy, "ASLEEP_SERIAL_FACTOR", 0)  # the sizes' own paths
    return set_cache


@pytest.mark.parametrize("text,expected", [("32768K", 32 * MB), ("1M", MB), ("2G", 2 << 30),
                                           ("512", 512), ("", 0), ("abcK", 0)])
def test_parse_cache_size(text, expected):
    assert policy.parse_size(text) == expected


def test_machine_cache_size_is_sane():
    size = policy.last_level_cache_bytes()
    assert 256 << 10 <= size <= 4 << 30


@pytest.mark.skipif(not policy.streaming_supported(), reason="streaming needs x86-64")
def test_streaming_only_beyond_the_cache(cache_of):
    y = np.empty(1 << 18, np.float32)  # 1 MB: X and Y together 2 MB
    cache_of(4 * MB)
    assert policy.choose_path(y) == "parallel"
    cache_of(2 * MB - 1)
    assert policy.choose_path(y) == "streaming"
    assert policy.choose_path(y[:1000]) == "serial"  # small stays serial whatever the cache


@pytest.mark.skipif(not policy.streaming_supported(), reason="streaming needs x86-64")
@pytest.mark.parametrize("mode,expected", [("always", "streaming"), ("never", "parallel"),
                                           ("auto", "parallel"), (" Always ", "streaming")])
def test_environment_override(cache_of, monkeypatch, mode, expected):
    cache_of(64 * MB)
    monkeypatch.setenv(policy.STREAMING_ENV, mode)
    assert policy.choose_path(np.empty(1 << 18, np.float32)) == expected
    big = np.empty(1 << 25, np.uint16)  # 64 MB
    assert policy.choose_path(big) == ("parallel" if mode == "never" else "streaming")


def test_bad_environment_value_names_the_variable(monkeypatch):
    monkeypatch.setenv(policy.STREAMING_ENV, "sometimes")
    X = np.ones((10, 4, 128, 128), np.float32)  # parallel size: the policy is read
    p = np.ones(4, np.float32)
    with pytest.raises(ValueError, match=r"NORMKERNELS_STREAMING.*always.*sometimes"):
        nk.batch_normalization(X, p, p, p, p)


@pytest.mark.skipif(not policy.streaming_supported(), reason="streaming needs x86-64")
@pytest.mark.parametrize("mode,route", [("never", "scale_shift/planes/parallel"),
                                        ("always", "scale_shift/planes/streaming")])
def test_public_call_follows_the_policy(rng, monkeypatch, mode, route):
    taken = []
    monkeypatch.setattr(policy, "_trace", taken.append)
    monkeypatch.setenv(policy.STREAMING_ENV, mode)
    X = rng.normal(3.0, 2.0, (8, 8, 96, 96)).astype(np.float32)
    scale, B, mean = (rng.normal(size=8).astype(np.float32) for _ in range(3))
    var = rng.uniform(0.5, 2.0, 8).astype(np.float32)
    Y = nk.batch_normalization(X, scale, B, mean, var)
    assert route in taken
    want = batch_norm(X, scale, B, mean, var, 1e-5)
    assert_close(Y, want, tolerance(X, scale, B, mean, var, 1e-5, "NCX", np.float32))


# --- sleeping workers: serial further while waking them would cost more ---


def test_serial_further_while_workers_sleep(monkeypatch):
    monkeypatch.setattr(policy.threads, "count", lambda: 2)
    limit = policy.SERIAL_MAX_ELEMENTS
    asleep = policy.asleep_serial_max(limit)
    assert asleep == limit * policy.ASLEEP_SERIAL_FACTOR // 2 > limit
    y = np.empty(asleep, np.float32)
    monkeypatch.setattr(threads, "workers_awake", lambda: False)
    assert policy.choose_path(y, asleep_rule=True) == "serial"
    assert policy.choose_path(y) != "serial"  # the statistics families: no rule
    assert policy.choose_path(np.empty(asleep + 64, np.float32), asleep_rule=True) != "serial"
    monkeypatch.setattr(threads, "workers_awake", lambda: True)
    assert policy.choose_path(y, asleep_rule=True) != "serial"
    assert policy.choose_path(y[:limit], asleep_rule=True) == "serial"


def test_only_inference_asks_for_the_sleeping_rule(rng, monkeypatch):
    """Instance norm of 7x7 planes is 2.5x slower on one thread: it keeps its limit."""
    taken = []
    monkeypatch.setattr(policy, "_trace", taken.append)
    monkeypatch.setattr(threads, "workers_awake", lambda: False)
    X = rng.normal(size=(2, 2048, 7, 7)).astype(np.float32)  # 200K elements
    p = np.ones(2048, np.float32)
    nk.instance_normalization(X, p, p)
    assert not any(route.endswith("/serial") for route in taken), taken
    taken.clear()
    nk.batch_normalization(X, p, p, p, p)
    assert taken == ["scale_shift/planes/serial"]


@pytest.mark.parametrize("n_threads,factor", [(1, 1), (2, 8), (3, 4), (9, 1), (64, 1)])
def test_sleeping_limit_shrinks_with_threads(monkeypatch, n_threads, factor):
    monkeypatch.setattr(policy.threads, "count", lambda: n_threads)
    assert policy.asleep_serial_max(1000) == 1000 * factor


def test_workers_awake_right_after_a_parallel_launch(monkeypatch):
    monkeypatch.setattr(threads, "_last_parallel_end", -1.0)
    assert not threads.workers_awake()
    monkeypatch.setattr(threads, "AWAKE_SECONDS", 60.0)  # no timing in tests
    assert not threads.workers_awake()
    with threads.launch_guard("parallel"):
        pass
    assert threads.workers_awake()  # the launch's end was recorded
    with threads.launch_guard("serial"):  # serial launches do not wake anything
        monkeypatch.setattr(threads, "_last_parallel_end", -1.0)
    assert not threads.workers_awake()


def test_thread_count_follows_numba_in_every_thread():
    """threads.count() reads Numba's C getter: the calling thread's setting, before and
    after set_num_threads, and in another thread."""
    import threading

    import numba

    from normkernels.engine import threads

    before = numba.get_num_threads()
    seen = {}
    try:
        assert threads.count() == before
        numba.set_num_threads(1)
        assert threads.count() == 1
        worker = threading.Thread(target=lambda: seen.update(
            count=threads.count(), numba=numba.get_num_threads()))
        worker.start()
        worker.join()
        assert seen["count"] == seen["numba"]
    finally:
        numba.set_num_threads(before)
    assert threads.count() == before

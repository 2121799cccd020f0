"""The two guards every parallel launch goes through, and the thread count.

* **Fork**: Numba terminates a child forked from a process that used its GNU OpenMP
  layer on the child's first parallel call ("fork() called from a process already
  using GNU OpenMP"). In such a child :func:`parallel_allowed` is False and the
  engine runs every call on the serial path (serial kernels and the one-thread twins
  of the parallel ones), which gives the same bits.
* **Launch**: Numba's workqueue layer aborts the process when two threads launch
  parallel kernels at once; under it (and until the layer is known) launches are
  serialised by :func:`launch_guard`.
"""

import contextlib
import os
import threading
import time

import numba
from numba.np.ufunc import parallel as _numba_parallel

_forked_from_openmp = False


def count():
    """``numba.get_num_threads()`` (the calling thread's setting), read through
    Numba's C getter once its threading layer runs: the public function takes two
    locks on every call (0.7 us; the three a planned LayerNorm call made were a fifth
    of its Python). Falls back to the public function (before the first launch, or if
    Numba's internals change)."""
    if getattr(_numba_parallel, "_is_initialized", False):
        getter = getattr(_numba_parallel, "_get_num_threads", None)
        if getter is not None:
            n = getter()
            if n > 0:
                return n
    return numba.get_num_threads()


def _after_fork_in_child():
    global _forked_from_openmp
    try:
        _forked_from_openmp = numba.threading_layer() == "omp"
    except ValueError:  # no parallel launch in the parent: nothing to avoid
        pass


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


def parallel_allowed():
    """False in a child forked after GNU OpenMP ran in the parent."""
    return not _forked_from_openmp


_LAUNCH_LOCK = threading.RLock()
_layer = None
_NO_GUARD = contextlib.nullcontext()
# When the last parallel launch ended (perf_counter seconds): Numba's workers spin
# only briefly after a parallel region (GOMP_SPINCOUNT, see kernels/__init__.py), then
# sleep, and waking them costs far more than a launch (docs/design.md).
_last_parallel_end = -1.0
AWAKE_SECONDS = 10e-6  # the workers are still spinning this soon after a launch


class _Parallel:
    """The context of a parallel launch: the lock when one is needed, and the time
    the launch ended."""

    __slots__ = ("lock",)

    def __init__(self, lock):
        self.lock = lock

    def __enter__(self):
        if self.lock is not None:
            self.lock.acquire()

    def __exit__(self, *exc):
        global _last_parallel_end
        _last_parallel_end = time.perf_counter()
        if self.lock is not None:
            self.lock.release()


_LOCKED = _Parallel(_LAUNCH_LOCK)
_UNLOCKED = _Parallel(None)


def workers_awake():
    """Whether a parallel launch ended so recently that the workers still spin."""
    return time.perf_counter() - _last_parallel_end < AWAKE_SECONDS


def launch_guard(path):
    """The context to launch a kernel of ``path`` in: none for serial kernels; for
    parallel ones, the process-wide lock under the workqueue layer (or before the
    layer is known), and the time the launch ends (:func:`workers_awake`)."""
    global _layer
    if path == "serial":
        return _NO_GUARD
    if _layer is None:
        # start the layer: a parallel kernel called from compiled code (the one-call
        # backward kernels) does not, and runs on an unstarted layer crash the process
        numba.get_num_threads()
        try:
            _layer = numba.threading_layer()
        except ValueError:  # not started yet: serialise the first launch
            return _LOCKED
    return _LOCKED if _layer == "workqueue" else _UNLOCKED

"""The two guards every parallel launch goes through.

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

import numba

_forked_from_openmp = False


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


def launch_guard(path):
    """The context to launch a kernel of ``path`` in: none for serial kernels; the
    process-wide lock for parallel ones under the workqueue layer (or before the
    layer is known)."""
    global _layer
    if path == "serial":
        return _NO_GUARD
    if _layer is None:
        try:
            _layer = numba.threading_layer()
        except ValueError:  # not started yet: serialise the first launch
            return _LAUNCH_LOCK
    return _LAUNCH_LOCK if _layer == "workqueue" else _NO_GUARD

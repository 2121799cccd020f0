"""``normkernels.warmup``: compile (or load from the disk cache) every kernel the
chosen operators, dtypes and layouts can run, so that no later call of them compiles
anything, at any size, through any entry point.

What runs, all from the operator table: each record's warmup cases (the calls that
force each execution path on the shapes that pick each kernel variant, see
:class:`normkernels.operators.record.WarmupCase`), then every mode of the record at
the sizes the size policy tells apart: a tiny tensor (one thread), a medium one and
one of 8M elements (threads, and streaming stores where the CPU has them), and a
single long row for the row normalizations (a row split across threads).
"""

import functools
import time

import numpy as np

from normkernels.dtypes import BFLOAT16, FLOAT16, FLOAT32, FLOAT64
from normkernels.operators import OPERATORS

DTYPES = {"float16": FLOAT16, "bfloat16": BFLOAT16, "float32": FLOAT32, "float64": FLOAT64}
LAYOUTS = ("NCX", "NXC")
# NCX shapes of the generic calls: the sizes the size policy tells apart; to them
# every record adds the shapes of all records' warmup cases of its kind (operators
# share kernels: oneDNN's training runs batch normalization's)
# (and many short planes: split statistics, per-row partials and gradient sums)
CHANNEL_SHAPES = ((2, 3, 4, 4), (4, 32, 28, 28), (8, 64, 128, 128), (128, 32, 6, 6))
ROW_SHAPES = ((4, 768), (512, 768), (2048, 4096), (1, 70001))


def _shapes(rows, threads):
    cases = {(c.ncx_shape[0] * threads, *c.ncx_shape[1:]) if c.per_thread else c.ncx_shape
             for op in OPERATORS.values() if op.rows == rows for c in op.warmup}
    return tuple(dict.fromkeys((*(ROW_SHAPES if rows else CHANNEL_SHAPES), *sorted(cases))))


def _select(label, given, known, aliases=None):
    """The entries of ``known`` named by ``given`` (None: all), in their order."""
    if given is None:
        return list(known)
    given = [given] if isinstance(given, str) else list(given)
    aliases = aliases or {}
    for g in given:
        if g not in known and g not in aliases:
            raise ValueError(f"normkernels.warmup: {label} {g!r} is not one of "
                             f"{', '.join(known)}")
    wanted = {aliases.get(g, g) for g in given}
    return [k for k in known if k in wanted]


def calls(ops=None, dtypes=None, layouts=None):
    """``(label, call)`` for everything :func:`warmup` runs (``ops``: record names
    such as "layernorm" or public function names such as "layer_normalization")."""
    names = _select("ops", ops, list(OPERATORS),
                    {op.function: op.name for op in OPERATORS.values()})
    if dtypes is not None:
        single = isinstance(dtypes, (str, np.dtype, type))  # one name or dtype
        if not single and not isinstance(dtypes, (list, tuple, set, frozenset)):
            raise TypeError(f"warmup: dtypes must be a dtype, its name, or a list of them; "
                            f"got {dtypes!r}")
        dtypes = [d if isinstance(d, str) else np.dtype(d).name
                  for d in ([dtypes] if single else dtypes)]
    dtype_names = _select("dtypes", dtypes, list(DTYPES))
    layout_names = _select("layouts", layouts, LAYOUTS)
    import numba

    threads = numba.get_num_threads()
    found = []
    for dtype_name in dtype_names:
        dtype = DTYPES[dtype_name]
        for op in (OPERATORS[n] for n in names):
            if dtype_name not in op.dtypes:
                continue
            for case in op.warmup:
                if case.data_format not in layout_names and not op.rows:
                    continue
                shape = case.ncx_shape
                if case.per_thread:  # the fused kernels need two planes per thread
                    shape = (shape[0] * threads, *shape[1:])
                for path in case.paths:
                    found.append((f"{dtype_name} {op.name} {case.label} ({path})",
                                  functools.partial(_run, op, case.mode, dtype,
                                                    case.data_format, shape, path)))
            for mode in op.modes:
                for layout in (("NCX",) if op.rows else layout_names):
                    if layout not in op.layouts:
                        continue
                    for shape in _shapes(op.rows, threads):
                        if op.family == "mvn":  # its default axes are a 4-D X's
                            shape = (*shape, *(1,) * (4 - len(shape)))
                        found.append((f"{dtype_name} {op.name} {mode} {layout} "
                                      f"{'x'.join(map(str, shape))}",
                                      functools.partial(_run, op, mode, dtype, layout, shape)))
        if any(OPERATORS[n].backward in _ONE_CALL_BACKWARD and dtype_name in OPERATORS[n].dtypes
               for n in names):
            found.append((f"{dtype_name} one-call backward kernels",
                          functools.partial(_warm_backward, dtype)))
    return found


# the backward functions whose kernels run in one call (Engine.channel_backward,
# group_backward), each route a compiled function of its own
_ONE_CALL_BACKWARD = ("batch_normalization_backward", "batch_norm_training_backward",
                      "instance_normalization_backward", "group_normalization_backward",
                      "ada_group_norm_backward")


def _warm_backward(dtype):
    from normkernels.engine.numba_engine import ENGINE

    ENGINE.warm_backward(dtype)


def _run(op, mode, dtype, layout, ncx_shape, path=None):
    """One call on zeros (made now: the 8M-element inputs are not kept); a small one
    twice, the second served by the plan the first left, with the fused step of a
    backward plan (:func:`normkernels.ops.training_plans.fusing`)."""
    from normkernels.engine import policy
    from normkernels.ops import training_plans

    X, params = _workload(np.random.default_rng(0), op, mode, dtype, layout, ncx_shape)
    _with_statistics(op, mode, X, params, layout, path)
    if path is not None:
        return op.call(X, params, mode, layout, None, None, path)
    if X.size > policy.SERIAL_MAX_ELEMENTS:
        return op.call(X, params, mode, layout)
    with training_plans.fusing():
        op.call(X, params, mode, layout)
        return op.call(X, params, mode, layout)


# the backward functions that take the forward's statistics (mean, inv_std per (n, group))
_STATISTICS_BACKWARD = ("instance_normalization_backward", "group_normalization_backward",
                        "ada_group_norm_backward")


def _with_statistics(op, mode, X, params, layout, path):
    """The instance/group backward with the forward's statistics given as well (the
    PyTorch adapter's call: its own reduction kernels, and on the streaming path the
    steps that run them)."""
    if mode != "backward" or op.backward not in _STATISTICS_BACKWARD:
        return
    import importlib

    from normkernels.engine.numba_engine import ENGINE

    function, spec = op.target(mode)
    C = op.channel_count(X, layout)
    kwargs = op.kwargs(mode, layout, C)
    lead = (X.shape[0], kwargs.get("num_groups", C))
    run = getattr(importlib.import_module(f"normkernels.ops.{spec}"), function)
    run(*op.arguments(X, params, mode), mean=np.zeros(lead), inv_std=np.ones(lead),
        engine=ENGINE, path=path, **kwargs)


def _workload(rng, op, mode, dtype, layout, ncx_shape):
    ncx = np.zeros(ncx_shape, dtype)
    X = np.moveaxis(ncx, 1, -1).copy() if layout == "NXC" and not op.rows else ncx
    axis = X.ndim - 1 if layout == "NXC" and X.ndim > 2 and not op.rows else 1
    C = op.columns(ncx_shape)
    return X, op.params(rng, C, dtype, X.shape, mode, X, axis)


def warmup(ops=None, dtypes=None, layouts=None, *, progress=None, jobs=1):
    """Compile, or load from the disk cache, every kernel of the operators ``ops``
    (record names such as ``"layernorm"`` or function names such as
    ``"layer_normalization"``; None: all) in ``dtypes`` (names or dtypes; None: each
    operator's dtypes) and ``layouts`` ("NCX", "NXC"; None: both): afterwards no call
    of them compiles anything, at any size, for views, read-only or writeable inputs,
    with or without ``out=``. Returns ``[(label, seconds), ...]``, one per call run.
    ``progress(i, n, label)`` is called before each.

    ``jobs`` > 1 (None: the machine's cores) compiles in that many fresh processes into
    the shared disk cache first, each taking whole (dtype, operator) groups, so that
    two processes rarely compile one kernel; this process then loads every kernel from
    the cache (milliseconds each). The labels' seconds are then the compiling
    processes' times.

    Parameters
    ----------
    ops : str or list of str, optional
        Operator record names or public function names; None: every operator.
    dtypes : str, dtype or list, optional
        "float16", "bfloat16", "float32", "float64", a dtype (``np.float32``), or a
        list of names or dtypes; None: each operator's dtypes.
    layouts : str or list of str, optional
        "NCX", "NXC" or both (None); row normalizations have one layout.
    progress : callable, optional
        ``progress(i, n, label)``, called before each of the ``n`` calls.
    jobs : int or None
        How many processes compile (default 1: this one; None: one per core).

    Returns
    -------
    list of (str, float)
        ``(label, seconds)`` for every call run, in order.

    Raises
    ------
    ValueError
        An unknown operator, dtype or layout name, ``jobs`` below 1.

    Examples
    --------
    >>> done = normkernels.warmup("rms_normalization", dtypes=["float32"])
    >>> label, seconds = done[0]
    >>> label.split()[:2]
    ['float32', 'rmsnorm']
    >>> all(seconds >= 0 for _, seconds in done)
    True
    """
    import os

    todo = calls(ops, dtypes, layouts)
    jobs = (os.cpu_count() or 1) if jobs is None else int(jobs)
    if jobs < 1:
        raise ValueError(f"normkernels.warmup: jobs must be at least 1, not {jobs}")
    compiled = {}
    if jobs > 1 and len(todo) > 1:
        compiled = _compile_in_processes(ops, dtypes, layouts, todo, jobs, progress)
    done = []
    for i, (label, call) in enumerate(todo):
        if progress is not None and not compiled:
            progress(i, len(todo), label)
        t0 = time.perf_counter()
        with np.errstate(all="ignore"):
            call()
        done.append((label, compiled.get(label, time.perf_counter() - t0)))
    return done


def _groups(todo):
    """Indices of ``todo`` by (dtype, operator), in order: a group's calls share
    kernels (one dtype, one family's loops), different groups few."""
    groups = {}
    for i, (label, _call) in enumerate(todo):
        groups.setdefault(tuple(label.split()[:2]), []).append(i)
    return list(groups.values())


def _compile_in_processes(ops, dtypes, layouts, todo, jobs, progress):
    """Run ``todo``'s groups in ``jobs`` fresh processes (spawned: a fork of a process
    that ran GNU OpenMP must not launch parallel kernels); {label: seconds}."""
    import concurrent.futures
    import multiprocessing

    import numba

    context = multiprocessing.get_context("spawn")
    threads = numba.get_num_threads()
    groups = _groups(todo)
    # the largest groups first, so that the last ones to finish are short
    groups.sort(key=len, reverse=True)
    seconds, finished = {}, 0
    with concurrent.futures.ProcessPoolExecutor(jobs, mp_context=context) as pool:
        futures = [pool.submit(_run_group, ops, dtypes, layouts, group, threads)
                   for group in groups]
        for future in concurrent.futures.as_completed(futures):
            for label, t in future.result():
                seconds[label] = t
                if progress is not None:
                    progress(finished, len(todo), label)
                finished += 1
    return seconds


def _run_group(ops, dtypes, layouts, indices, threads):
    """In a compiling process: the calls ``indices`` of :func:`calls` (the same list:
    it depends only on the arguments and the thread count, the parent's)."""
    import numba

    numba.set_num_threads(threads)
    todo = calls(ops, dtypes, layouts)
    done = []
    for i in indices:
        label, call = todo[i]
        t0 = time.perf_counter()
        with np.errstate(all="ignore"):
            call()
        done.append((label, time.perf_counter() - t0))
    return done

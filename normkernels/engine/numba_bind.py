"""The Numba engine's bound calls (:func:`normkernels.bind`): a call prepared once for
fixed arrays. On the serial path a bound call is one compiled call with every argument
resolved at binding (aliases of the arrays, never copies: the call must read their
memory each time); above it the path is decided per call, as the engine decides it."""

import numpy as np

from normkernels.dtypes import compute_dtype, storage_alias
from normkernels.engine import policy
from normkernels.engine.lazy import lazy
from normkernels.engine.numba_launch import (
    TABLE_FREE_ROWS,
    flat_rows,
    in_place_add,
    nothing,
    table_free,
)
from normkernels.engine.policy import took
from normkernels.engine.threads import launch_guard
from normkernels.kernels.activations import NONE, marker

# kernel modules: imported at first use (engine/lazy.py)
fused_add = lazy(__name__, "fused_add")
inference = lazy(__name__, "inference")
instance = lazy(__name__, "instance")
rows = lazy(__name__, "rows")


class BoundCalls:
    """The ``bind_*`` methods of :class:`normkernels.engine.numba_engine.NumbaEngine`
    (each falls back to the engine's own method, on ``self``)."""

    def bind_inference(self, x, y, C, S, scale, B, mean, var, epsilon):
        xs, ys = storage_alias(x.ravel()), storage_alias(y.ravel())
        # aliases, never copies: the call must read the arrays' memory each time
        p0, p1, p2, p3 = (storage_alias(scale), storage_alias(B), storage_alias(mean),
                          storage_alias(var))
        if ys.size > policy.NORMALIZE_SERIAL_MAX_ELEMENTS:  # the path decided per call
            return lambda: self.inference(x, y, C, S, scale, B, mean, var, epsilon)
        # serial: safe in any process (a forked child too) and one compiled call
        period = policy.inference_period(C, S, x.itemsize, ys.size)
        if period == 0:
            return compiled_call(inference.normalize_planes_serial,
                                 (xs, ys, C, S, p0, p1, p2, p3, float(epsilon), False, None,
                                  NONE))
        return compiled_call(inference.normalize_periodic_serial,
                             (xs, ys, C, S, p0, p1, p2, p3, float(epsilon), period, False, None,
                              NONE))

    def bind_instance_planes(self, x, y, C, S, scale, B, epsilon, group=1, act=None):
        """:meth:`instance_planes` for fixed arrays (see :func:`normkernels.bind`): on
        the serial path one compiled call (the fused kernel, every argument resolved
        here), else the engine call (its path decided per call). ``act``: the
        activation epilogue (a name; None: none)."""
        act = marker(act)
        if y.size > policy.SERIAL_MAX_ELEMENTS or y.size == 0:
            return lambda: self.instance_planes(x, y, C, S, scale, B, epsilon, group=group,
                                                act=act)
        # aliases, never copies: the call must read the arrays' memory each time
        xs, ys = storage_alias(x.ravel()), storage_alias(y.ravel())
        n_planes = xs.size // S
        cd = compute_dtype(x.dtype)
        per = n_planes if scale.size == n_planes else C  # parameters per (n, c): see
        # NumbaEngine.instance_planes
        args = (per, group, S, storage_alias(scale), storage_alias(B), float(epsilon),
                np.empty(n_planes // group), np.empty(n_planes // group),
                np.empty(n_planes, cd), np.empty(n_planes, cd), np.empty(n_planes, cd),
                None, act)
        return compiled_call(instance.fused_planes_serial, (xs, ys, *args))

    def bind_rows(self, x, y, scale, B, epsilon, centered, skip=None, bias=None, sums=None,
                  rounding="once", act=None):
        """:meth:`normalize_rows` for fixed arrays, as a zero-argument callable (see
        :func:`normkernels.bind`): every argument resolved here; on the serial path one
        compiled call, else the path decided per call and the fused kernel launched
        (the engine call where the rows split). ``sums`` (C-contiguous, the sums' rows)
        may be ``skip`` itself: the in-place fused add. ``act``: the activation epilogue
        (a name or marker; None: none)."""
        M, K = x.shape
        act = marker(NONE if act is None else act, rounding)

        def engine_call():
            self.normalize_rows(x, y, scale, B, epsilon, centered, skip=skip, bias=bias,
                                sums=sums, act=act, rounding=rounding)

        if x.size == 0 or not (scale.flags.c_contiguous and (B is None or B.flags.c_contiguous)):
            return engine_call
        # aliases, never copies: the call must read the arrays' memory each time
        (xs, xr), (ys, yr) = flat_rows(x, storage_alias), flat_rows(y, storage_alias)
        s = storage_alias(scale)
        b = s[:0] if B is None else storage_alias(B)
        skip_s = None if skip is None else storage_alias(skip).ravel()
        bias_t = s[:0] if bias is None or skip is None else storage_alias(bias)
        none = nothing(xs.dtype)
        sums_s = none if sums is None else storage_alias(sums).ravel()
        mean, var = np.empty(M), np.empty(M)
        epsilon = float(epsilon)
        if in_place_add(x, y, scale, B, skip, bias, sums, act, None):
            args = (xs, xr, skip_s, K, s, b, epsilon, centered, rounding == "llama", mean, var)
            if x.size <= policy.SERIAL_MAX_ELEMENTS:
                return compiled_call(fused_add.fused_add_rows_serial, args)

            def in_place_call():  # the path decided per call, as normalize_rows decides it
                path = policy.resolve_path(ys, None)
                if path == "serial" or policy.split_rows(M, K, path):
                    return engine_call()
                took("rows", "fused add", path)
                with launch_guard(path):
                    fused_add.fused_add_rows_parallel(*args, policy.rows_per_item(M, K))

            return in_place_call
        if x.size <= policy.SERIAL_MAX_ELEMENTS and table_free(x, y, skip, sums, act, None):
            kernel = fused_add.plain_rows_serial if centered else fused_add.plain_rms_rows_serial
            return compiled_call(kernel, (xs, xr, ys, yr, K, s, b, epsilon, rounding == "llama",
                                          mean, var))
        if x.size <= policy.SERIAL_MAX_ELEMENTS:  # serial: one compiled call
            kernel = rows.rows_serial if centered else rows.rms_rows_serial
            return compiled_call(kernel, (xs, xr, ys, yr, K, s, b, epsilon, mean, var, skip_s,
                                          bias_t, sums_s, 0, None, act))
        skip_p = none if skip_s is None else skip_s  # the parallel kernels: empty, not None

        def parallel_call():  # the path decided per call, as normalize_rows decides it
            path = policy.resolve_path(ys, None)
            if path == "serial" or policy.split_rows(M, K, path):
                return engine_call()
            took("rows", "fused", path)
            kernel = rows.rows_streaming if path == "streaming" else rows.rows_parallel
            with launch_guard(path):
                kernel(xs, xr, ys, yr, K, s, b, epsilon, centered, policy.rows_per_item(M, K),
                       mean, var, skip_p, bias_t, sums_s, 0, None, act)

        return parallel_call

    # --- direct calls: the serial kernel for arrays given at each call (an adapter that
    # has checked their metadata once, and allocates its outputs fresh) ---

    def direct_rows(self, M, K, storage, centered, rounding="once"):
        """``run(xs, ys, scale, B, epsilon, mean, var)`` over flat C-contiguous aligned
        arrays of ``M`` rows of ``K`` in the ``storage`` dtype (``B`` empty: none;
        ``mean`` and ``var``: ``M`` float64 each, written): one compiled serial call up
        to the serial size (its entry point: the dispatcher's typing of the arguments
        cost 3.5 of a (1, 64) LayerNorm's 4.2 us), above it the engine's call (its path
        decided per call)."""
        if M * K == 0:
            return None
        if M * K > policy.SERIAL_MAX_ELEMENTS:
            def engine_call(xs, ys, scale, B, epsilon, mean, var):
                mean[:], var[:] = self.normalize_rows(
                    xs.reshape(M, K), ys.reshape(M, K), scale, B if B.size else None, epsilon,
                    centered, rounding=rounding)
            return engine_call
        xs, s = np.empty(M * K, storage), np.empty(K, storage)
        llama = rounding == "llama"
        if M <= TABLE_FREE_ROWS:  # table_free: no skip, no epilogue, Y of X's dtype
            kernel = fused_add.plain_rows_serial if centered else fused_add.plain_rms_rows_serial
            run = entry_point(kernel, (xs, K, xs, K, K, s, s[:0], 1.0, llama, np.empty(M),
                                       np.empty(M)))
            return lambda xs, ys, scale, B, epsilon, mean, var: run(
                xs, K, ys, K, K, scale, B, epsilon, llama, mean, var)
        kernel = rows.rows_serial if centered else rows.rms_rows_serial
        none, act = nothing(storage), marker(NONE, rounding)
        run = entry_point(kernel, (xs, K, xs, K, K, s, s[:0], 1.0, np.empty(M), np.empty(M),
                                   None, s[:0], none, 0, None, act))
        return lambda xs, ys, scale, B, epsilon, mean, var: run(
            xs, K, ys, K, K, scale, B, epsilon, mean, var, None, scale[:0], none, 0, None, act)

    def direct_inference(self, C, S, storage, size, params):
        """``run(xs, ys, scale, B, mean, var, epsilon)`` for per-channel inference over
        flat C-contiguous aligned arrays of the ``storage`` dtype (channel ``(i // S) %
        C``; the four parameters of the storage dtypes ``params``), one compiled serial
        call (its entry point) up to the serial size, above it the engine's call."""
        if size == 0:
            return None
        if size > policy.NORMALIZE_SERIAL_MAX_ELEMENTS:
            def engine_call(xs, ys, p0, p1, p2, p3, eps):
                self.inference(xs, ys, C, S, p0, p1, p2, p3, eps)
            return engine_call
        period = policy.inference_period(C, S, np.dtype(storage).itemsize, size)
        xs, p = np.empty(size, storage), [np.empty(C, d) for d in params]
        if period == 0:
            run = entry_point(inference.normalize_planes_serial,
                              (xs, xs, C, S, *p, 1.0, False, None, NONE))
            return lambda xs, ys, p0, p1, p2, p3, eps: run(xs, ys, C, S, p0, p1, p2, p3, eps,
                                                           False, None, NONE)
        run = entry_point(inference.normalize_periodic_serial,
                          (xs, xs, C, S, *p, 1.0, period, False, None, NONE))
        return lambda xs, ys, p0, p1, p2, p3, eps: run(xs, ys, C, S, p0, p1, p2, p3, eps,
                                                       period, False, None, NONE)


def entry_point(kernel, sample):
    """``kernel``'s compiled entry point for the types of the ``sample`` arguments (a
    call that skips the dispatcher's typing of each argument: an activation marker's
    alone costs 2 us). Its caller passes arguments of exactly those types: arrays of
    the same dtype, rank, layout and flags (writeable, aligned) as the sample's."""
    import numba

    if not hasattr(kernel, "overloads"):  # not a dispatcher (a test's recording wrapper)
        return kernel
    signature = tuple(numba.typeof(a) for a in sample)
    kernel.compile(signature)  # or loads it from the disk cache; runs nothing
    entry = kernel.overloads.get(signature)
    return kernel if entry is None else entry.entry_point


def compiled_call(kernel, args):
    """``kernel(*args)`` as a zero-argument call of its compiled entry point for
    exactly these arguments' types: a decode step's bound call (one row of 4096) skips
    the dispatcher's typing of eleven arguments, about 0.3 us of its 3. The arguments
    are fixed objects, so their types cannot change; the caller guards the flags that
    Numba's types hold (an array made read-only after binding)."""
    import numba

    if not hasattr(kernel, "overloads"):  # not a dispatcher (a test's recording wrapper)
        return lambda: kernel(*args)
    signature = tuple(numba.typeof(a) for a in args)
    kernel.compile(signature)  # or loads it from the disk cache; runs nothing (in place)
    entry = kernel.overloads.get(signature)
    if entry is None:  # a signature the dispatcher keyed otherwise: dispatch each call
        return lambda: kernel(*args)
    run = entry.entry_point
    return lambda: run(*args)

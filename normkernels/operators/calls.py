"""How the calls of an operator record (:class:`normkernels.operators.Operator`) are
made: a workload's parameters, the keyword and positional arguments of each mode,
the call itself (the public function, or the spec layer on an engine), a bound call
for the bench, and the source of a first call for ``normkernels coldstart``.

Importing this module imports neither Numba nor the operators' spec modules.
"""

import importlib

import numpy as np

from normkernels.dtypes import BFLOAT16, FLOAT16, FLOAT32, FLOAT64
from normkernels.operators.record import BACKWARD, qk_heads


class OperatorCalls:
    """The calls of an :class:`normkernels.operators.Operator` (a mixin: it reads the
    record's fields ``name``, ``function``, ``spec``, ``backward``, ``backward_spec``,
    ``n_params``, ``param_dtype``, ``default_layout``, ``skip``, ``per_sample``,
    ``in_place``, ``mode_kwargs``, ``groups``, ``layout_attribute``, ``signature`` and its ``rows``,
    ``family``, ``takes_out``, ``batch_statistics`` and ``group_count``)."""

    def params(self, rng, C, dtype, shape=None, mode="inference", X=None, axis=1):
        """The parameters of a workload (``C``: :meth:`columns`; ``shape``: X's, for a
        skip input, dY and the sample count of :attr:`per_sample` parameters, (N, C)):
        float32 (bfloat16 for oneDNN ops on bfloat16 X), X's dtype for operators whose
        parameters share X's type. Always in the table's order (scale, B, mean, var);
        :attr:`signature` puts them in the function's.

        Mode "backward": what follows X in the backward call, dY first (of ``shape``, in
        X's dtype, the way ``skip`` comes first), then scale, and with
        :attr:`batch_statistics` the batch mean and population variance of ``X`` (over
        every axis but the channel ``axis``) in the parameters' dtype; a
        :attr:`per_sample` record's backward takes all of the forward's parameters."""
        pdt = self.parameter_dtype(dtype)
        size = (shape[0], C) if self.per_sample else C
        values = (rng.uniform(0.5, 2.0, size), rng.standard_normal(size),
                  rng.standard_normal(size), rng.uniform(0.5, 2.0, size))
        if mode == BACKWARD:
            dY = rng.standard_normal(shape).astype(dtype)
            if self.per_sample:
                return (dY, *(v.astype(pdt) for v in values[:self.n_params]))
            if not self.batch_statistics:
                return dY, values[0].astype(pdt)
            x = np.asarray(X, np.float64)
            reduced = tuple(i for i in range(x.ndim) if i != axis)
            return (dY, values[0].astype(pdt), x.mean(axis=reduced).astype(pdt),
                    x.var(axis=reduced).astype(pdt))
        params = tuple(v.astype(pdt) for v in values[:self.n_params])
        if self.skip:
            params = (rng.standard_normal(shape).astype(dtype), *params)
        return params

    def parameter_dtype(self, dtype):
        """The parameters' dtype for X of ``dtype``: float32 (bfloat16 for oneDNN ops on
        bfloat16 X), or X's dtype for operators whose parameters share X's type."""
        if self.param_dtype and dtype == BFLOAT16:
            return BFLOAT16
        return FLOAT32 if self.param_dtype == "float32" else dtype

    def kwargs(self, mode, data_format, C=None):
        """The keyword arguments of a call (``C``: X's channels, for the group count)."""
        kwargs = dict(self.mode_kwargs.get(mode, {}))
        if self.groups is not None:
            kwargs[self.groups[0]] = self.group_count(C)
        if self.family == "qk":  # C: the row length
            kwargs.update(qk_heads(C))
        if self.layout_attribute is not None:
            name, values = self.layout_attribute
            kwargs[name] = values[data_format]
        elif not (self.rows or self.family == "mvn"):
            kwargs["data_format"] = data_format
        return kwargs

    def channel_count(self, X, data_format):
        """C of a workload's X in ``data_format`` (a row normalization's: the row length)."""
        if self.rows:
            return X.shape[-1]
        if X.ndim < 2:
            return 1
        return X.shape[1] if data_format == "NCX" else X.shape[-1]

    def target(self, mode):
        """``(function, spec module)`` a call in ``mode`` runs."""
        if mode != BACKWARD:
            return self.function, self.spec
        if self.backward is None:
            raise ValueError(f"{self.name} has no mode {BACKWARD!r} (its modes: "
                             f"{', '.join(self.modes)})")
        return self.backward, self.backward_spec

    def arguments(self, X, params, mode):
        """The positional arguments: ``(X, *params)``; backward ``(dY, X, *rest)``; or
        in the order :attr:`signature` names for ``mode``."""
        args = (params[0], X, *params[1:]) if mode == BACKWARD else (X, *params)
        order = self.signature.get(mode)
        if order is None:
            return args
        by_name = dict(zip(self._table_names(mode), args, strict=False))  # records pass fewer
        return tuple(by_name[name] for name in order)

    def _table_names(self, mode):
        """The names of ``(X, *params)`` (backward: ``(dY, X, *rest)``) in the table's order."""
        if mode == BACKWARD:
            return ("dY", "X", "scale", *(("B",) if self.per_sample else ("mean", "var")))
        return ("X", "skip", "scale", "B", "mean", "var") if self.skip else (
            "X", "scale", "B", "mean", "var")

    def _names(self, mode):
        """The names of :meth:`arguments`' positional arguments, in order."""
        return self.signature.get(mode) or self._table_names(mode)

    def bound(self, X, params, mode="inference", data_format="NCX", out=None):
        """A zero-argument call of the public function (arguments bound once: the
        bench times this, so it adds nothing but the call itself)."""
        from normkernels import api

        fn = getattr(api, self.target(mode)[0])
        args = self.arguments(X, params, mode)
        kwargs = self.kwargs(mode, data_format, self.channel_count(X, data_format))
        if self.takes_out:
            kwargs["out"] = out
        if not self.in_place:
            return lambda: fn(*args, **kwargs)
        # a serving loop's call: in place on buffers of its own, every call (copies of
        # the inputs made once, so the caller's stay as they were)
        args, written = self._writable(args, mode)

        def in_place():
            fn(*args, **kwargs)
            return written
        return in_place

    def written(self, args, mode):
        """The arguments of ``args`` (:meth:`arguments`' order) an in-place call
        writes, Y first."""
        names = self._names(mode)
        return tuple(args[names.index(name)] for name in self.in_place)

    def _writable(self, args, mode):
        """``args`` with the arguments :attr:`in_place` names replaced by copies of the
        same strides, and those copies (Y first)."""
        names = self._names(mode)
        copies = {name: _same_strides_copy(args[names.index(name)]) for name in self.in_place}
        args = tuple(copies.get(name, a) for name, a in zip(names, args, strict=False))
        return args, tuple(copies[name] for name in self.in_place)

    def call(self, X, params, mode="inference", data_format="NCX", out=None, engine=None,
             path=None):
        """Run the operator: the public function, or with ``engine`` (and ``path``)
        its spec layer on that engine (the Numba engine when only ``path`` is given)."""
        function, module = self.target(mode)
        args = self.arguments(X, params, mode)
        kwargs = self.kwargs(mode, data_format, self.channel_count(X, data_format))
        if self.takes_out:
            kwargs["out"] = out
        if self.in_place:  # on copies of the inputs it writes (of their strides), returned
            args, written = self._writable(args, mode)
        if engine is None and path is None:
            from normkernels import api

            result = getattr(api, function)(*args, **kwargs)
        else:
            if engine is None:
                from normkernels.engine.numba_engine import ENGINE as engine
            spec = importlib.import_module(f"normkernels.ops.{module}")
            result = getattr(spec, function)(*args, engine=engine, path=path, **kwargs)
        return written if self.in_place else result

    def coldstart_call(self, mode):
        """Source of a first call, for ``normkernels coldstart`` (X defined, in NCX;
        parameters of ones in the dtype :meth:`parameter_dtype` gives for X's). Row
        normalizations take X's rows, X.reshape(-1, X.shape[-1]), and
        :attr:`per_sample` records X itself with parameters (N, C); the backward's dY
        is X, its mean and var parameters."""
        x = "X.reshape(-1, X.shape[-1])" if self.rows and not self.per_sample else "X"
        p = "np.ones(X.shape[1], P)"
        if self.rows or self.per_sample:  # per column, or (N, C)
            C = "X.shape[-1]" if self.rows else "X.shape[1]"
            if self.family == "qk":
                C = f"{_QK_HEADS}['head_dim']"
            p = f"np.ones({f'(X.shape[0], {C})' if self.per_sample else C}, P)"
        # the parameters' dtype by X's (the rule of :meth:`parameter_dtype`)
        dtypes = {d.name: self.parameter_dtype(d).name
                  for d in (FLOAT16, BFLOAT16, FLOAT32, FLOAT64)}
        prefix = f"P = {dtypes!r}[X.dtype.name]\n"
        if mode == BACKWARD:
            count = 3 if self.batch_statistics else self.n_params if self.per_sample else 1
            args = ", ".join([x, x, *[p] * count])
        elif self.signature.get(mode):
            args = ", ".join(x if name in ("X", "skip") else p for name in self.signature[mode])
        else:  # an input written in place gets its own copy
            skip = f"{x}.copy()" if self.in_place else x
            args = ", ".join([x, *[skip] * self.skip, *[p] * self.n_params])
        kwargs = {k: repr(v) for k, v in self.mode_kwargs.get(mode, {}).items()}
        if self.groups is not None:  # the largest divisor of C up to GROUPS
            kwargs[self.groups[0]] = f"int(np.gcd(X.shape[1], {self.groups[1]}))"
        if self.family == "qk":  # the heads of X's rows: its parameters are one head's
            kwargs.update({k: f"{_QK_HEADS}[{k!r}]" for k in ("num_q_heads", "num_kv_heads",
                                                              "head_dim")})
        if self.default_layout != "NCX":  # the workloads' X is NCX
            kwargs["data_format"] = "'NCX'"
        if self.layout_attribute is not None:
            name, values = self.layout_attribute
            kwargs[name] = repr(values["NCX"])
        extra = "".join(f", {k}={v}" for k, v in kwargs.items())
        return f"{prefix}nk.{self.target(mode)[0]}({args}{extra})"


# the heads of a qkv row in a first call's source (which sees only nk, np, X and p)
_QK_HEADS = "__import__('normkernels.operators.record').operators.record.qk_heads(X.shape[-1])"


def _same_strides_copy(a):
    """A copy of ``a`` in new memory laid out as ``a``'s (its strides, its byte order):
    an in-place call on it takes the path the call on ``a`` would."""
    strides = a.strides
    low = sum(s * (n - 1) for s, n in zip(strides, a.shape, strict=True) if s < 0)
    high = sum(s * (n - 1) for s, n in zip(strides, a.shape, strict=True) if s > 0)
    if a.size == 0:
        return a.copy()
    memory = np.empty(high - low + a.itemsize, np.uint8)
    copy = np.ndarray(a.shape, a.dtype, memory, offset=-low, strides=strides)
    copy[...] = a
    return copy

"""How the calls of an operator record (:class:`normkernels.operators.Operator`) are
made: a workload's parameters, the keyword and positional arguments of each mode,
the call itself (the public function, or the spec layer on an engine), a bound call
for the bench, and the source of a first call for ``normkernels coldstart``.

Importing this module imports neither Numba nor the operators' spec modules.
"""

import importlib

import numpy as np

from normkernels.dtypes import BFLOAT16, FLOAT32
from normkernels.operator_record import BACKWARD


class OperatorCalls:
    """The calls of an :class:`normkernels.operators.Operator` (a mixin: it reads the
    record's fields ``name``, ``function``, ``spec``, ``backward``, ``backward_spec``,
    ``n_params``, ``param_dtype``, ``skip``, ``per_sample``, ``reads_only``,
    ``mode_kwargs``, ``groups``, ``layout_attribute``, ``signature`` and its ``rows``,
    ``family``, ``batch_statistics`` and ``group_count``)."""

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
        pdt = FLOAT32 if self.param_dtype == "float32" else dtype
        if self.name == "batchnorm-inference" or (self.param_dtype and dtype == BFLOAT16):
            pdt = BFLOAT16 if dtype == BFLOAT16 else FLOAT32
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

    def kwargs(self, mode, data_format, C=None):
        """The keyword arguments of a call (``C``: X's channels, for the group count)."""
        kwargs = dict(self.mode_kwargs.get(mode, {}))
        if self.groups is not None:
            kwargs[self.groups[0]] = self.group_count(C)
        if self.layout_attribute is not None:
            name, values = self.layout_attribute
            kwargs[name] = values[data_format]
        elif not (self.rows or self.family == "mvn"):
            kwargs["data_format"] = data_format
        return kwargs

    def channel_count(self, X, data_format):
        """C of a workload's X in ``data_format``."""
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
        if mode == BACKWARD:
            names = ("dY", "X", "scale", *(("B",) if self.per_sample else ("mean", "var")))
            args = (params[0], X, *params[1:])
        else:
            names = ("X", "skip", "scale", "B", "mean", "var") if self.skip else (
                "X", "scale", "B", "mean", "var")
            args = (X, *params)
        order = self.signature.get(mode)
        if order is None:
            return args
        by_name = dict(zip(names, args, strict=False))  # records pass fewer
        return tuple(by_name[name] for name in order)

    def bound(self, X, params, mode="inference", data_format="NCX", out=None):
        """A zero-argument call of the public function (arguments bound once: the
        bench times this, so it adds nothing but the call itself)."""
        from normkernels import api

        fn = getattr(api, self.target(mode)[0])
        args = self.arguments(X, params, mode)
        kwargs = self.kwargs(mode, data_format, self.channel_count(X, data_format))
        if not self.reads_only:
            kwargs["out"] = out
        return lambda: fn(*args, **kwargs)

    def call(self, X, params, mode="inference", data_format="NCX", out=None, engine=None,
             path=None):
        """Run the operator: the public function, or with ``engine`` (and ``path``)
        its spec layer on that engine (the Numba engine when only ``path`` is given)."""
        function, module = self.target(mode)
        args = self.arguments(X, params, mode)
        kwargs = self.kwargs(mode, data_format, self.channel_count(X, data_format))
        if not self.reads_only:
            kwargs["out"] = out
        if engine is None and path is None:
            from normkernels import api

            return getattr(api, function)(*args, **kwargs)
        if engine is None:
            from normkernels.engine.numba_engine import ENGINE as engine
        spec = importlib.import_module(f"normkernels.ops.{module}")
        return getattr(spec, function)(*args, engine=engine, path=path, **kwargs)

    def coldstart_call(self, mode):
        """Source of a first call, for ``normkernels coldstart`` (X, p defined, X in
        NCX; row normalizations take X's rows, X.reshape(-1, X.shape[-1]), and
        :attr:`per_sample` records X itself with parameters (N, C); the backward's dY
        is X, its mean and var p)."""
        x = "X.reshape(-1, X.shape[-1])" if self.rows and not self.per_sample else "X"
        p = "p"
        if self.rows or self.per_sample:  # per column, or (N, C)
            C = "X.shape[-1]" if self.rows else "X.shape[1]"
            p = f"np.ones({f'(X.shape[0], {C})' if self.per_sample else C}, 'float32')"
        if mode == BACKWARD:
            count = 3 if self.batch_statistics else self.n_params if self.per_sample else 1
            args = ", ".join([x, x, *[p] * count])
        elif self.signature.get(mode):
            args = ", ".join(x if name in ("X", "skip") else p for name in self.signature[mode])
        else:
            args = ", ".join([x, *[x] * self.skip, *[p] * self.n_params])
        kwargs = {k: repr(v) for k, v in self.mode_kwargs.get(mode, {}).items()}
        if self.groups is not None:  # the largest divisor of C up to GROUPS
            kwargs[self.groups[0]] = f"int(np.gcd(X.shape[1], {self.groups[1]}))"
        if self.name in ("batchnorm-inference", "groupnorm-onednn",
                         "batchnorm-training-onednn"):  # oneDNN: NXC default
            kwargs["data_format"] = "'NCX'"
        if self.layout_attribute is not None:
            name, values = self.layout_attribute
            kwargs[name] = repr(values["NCX"])
        extra = "".join(f", {k}={v}" for k, v in kwargs.items())
        return f"nk.{self.target(mode)[0]}({args}{extra})"

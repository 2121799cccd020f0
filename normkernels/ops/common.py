"""Argument checks and layouts shared by the operators.

Everything here is O(C) or O(1) work in NumPy; the O(size) work is done by an
*engine* (:class:`normkernels.engine.Engine`): the Numba engine or the NumPy twin
(:class:`normkernels.reference.NumPyEngine`), which share this layer and so see
identical arguments.
"""

import functools
import math
import numbers
import sys
from dataclasses import dataclass

import numpy as np

from normkernels.dtypes import (
    BFLOAT16,
    FLOAT16,
    FLOAT32,
    FLOAT64,
    compute_dtype,
)

DATA_FORMATS = ("NCX", "NXC")
ALL_FLOATS = (FLOAT16, BFLOAT16, FLOAT32, FLOAT64)
NO_BF16 = (FLOAT16, FLOAT32, FLOAT64)  # ONNX's float types before bfloat16 was added
_NAMES = {FLOAT16: "float16", BFLOAT16: "bfloat16", FLOAT32: "float32", FLOAT64: "float64"}


def is_integer(value):
    """An integer that is not a bool: a Python int or a NumPy integer."""
    return isinstance(value, (int, np.integer)) and not isinstance(value, bool)


def check_opset(op, opset):
    """``opset`` as a Python int: an integer >= 1 (a Python int or a NumPy integer;
    not a bool, a float or a string)."""
    if not is_integer(opset) or opset < 1:
        raise ValueError(f"{op}: opset must be an integer >= 1, got {opset!r}")
    return int(opset)


@dataclass(frozen=True)
class Version:
    """One since-version of an ONNX operator: its attributes with their schema
    defaults, and those the schema requires. Operators subclass it with the fields
    that carry their per-version behaviour."""

    since: int
    attributes: dict  # name -> schema default
    required: tuple = ()  # attributes without a default: the caller must give them

    def label(self, op):
        return f"{op}-{self.since}"

    @property
    def counts_outputs(self):
        """Whether the caller says how many outputs the node has (``num_outputs``)."""
        return False


def version_in_force(op, versions, opset):
    """The version of ``op`` serving a model's ``opset``: the highest since-version
    at or below it (``versions``: since-version -> version record)."""
    opset = check_opset(op, opset)
    eligible = [v for v in versions if v <= opset]
    if not eligible:
        raise ValueError(f"{op}: no version at or below opset {opset} "
                         f"(versions: {', '.join(map(str, sorted(versions)))})")
    return versions[max(eligible)]


def version_lookup(op, versions):
    """``version_for(opset)``: :func:`version_in_force`, cached per opset (a Python
    int goes straight to the cache: per-call latency)."""
    in_force = functools.cache(lambda opset: version_in_force(op, versions, opset))

    def version_for(opset):
        return in_force(opset if type(opset) is int else check_opset(op, opset))

    version_for.__doc__ = f"The {op} version in force at ``opset`` (an integer >= 1)."
    return version_for


def resolve_attributes(label, version, given):
    """The version's schema defaults overlaid with the attributes the caller gave
    (not None); an attribute the version does not have, or a required one missing,
    is a TypeError."""
    attrs = dict(version.attributes)
    for name, value in given.items():
        if value is None:
            continue
        if name not in attrs:
            have = ", ".join(sorted(attrs))
            raise TypeError(f"{label} has no attribute {name!r} (its attributes: {have})")
        attrs[name] = value
    for name in version.required:
        if attrs[name] is None:
            raise TypeError(f"{label}: attribute {name!r} is required (the schema gives "
                            "it no default)")
    return attrs


def dtype_names(dtypes):
    return ", ".join(_NAMES[d] for d in dtypes)


def as_array(name, value):
    """``value`` as an ndarray (array-likes are converted by NumPy's rules); an array
    in non-native byte order is converted to native order (a copy; the kernels read
    native numbers)."""
    if not isinstance(value, np.ndarray):
        if hasattr(value, "__dlpack__"):
            return _from_dlpack(name, value)
        try:
            value = np.asarray(value)
        except Exception as exc:
            raise TypeError(f"{name}: cannot be converted to an array ({exc})") from None
    if not value.dtype.isnative:
        return value.astype(value.dtype.newbyteorder("="))
    return value


def _from_dlpack(name, value):
    """An array with ``__dlpack__`` (a torch tensor, a JAX CPU array) viewed as an
    ndarray over its memory (no copy). bfloat16 has no NumPy dtype for DLPack to
    give: a torch tensor of it is viewed through int16 as ``ml_dtypes.bfloat16``."""
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(value, torch.Tensor) and value.dtype == torch.bfloat16:
        if value.requires_grad:
            raise TypeError(f"{name}: a tensor that requires grad cannot be read in place "
                            "(pass tensor.detach(), or use normkernels.torch for autograd)")
        if value.device.type != "cpu":
            raise TypeError(f"{name}: normkernels computes on the CPU; got a tensor on "
                            f"{value.device}")
        return value.view(torch.int16).numpy().view(BFLOAT16)
    try:
        array = np.from_dlpack(value)
    except (BufferError, RuntimeError, TypeError, ValueError) as exc:
        raise TypeError(f"{name}: cannot be read through DLPack without a copy ({exc}); "
                        "pass a CPU array (detached, for a torch tensor that requires "
                        "grad)") from None
    if not array.dtype.isnative:
        return array.astype(array.dtype.newbyteorder("="))
    return array


def check_dtype(op, name, arr, allowed):
    if arr.dtype not in allowed:
        native = arr.dtype.newbyteorder("=")
        hint = (f" (non-native byte order: convert with .astype({native.name!r}))"
                if native in allowed else "")
        raise TypeError(
            f"{op}: {name} has dtype {arr.dtype}; allowed: {dtype_names(allowed)}{hint}"
        )


def check_same_dtype(op, type_var, named_arrays):
    """Inputs bound to one type variable of the spec must share one dtype."""
    dtypes = {arr.dtype for arr in named_arrays.values()}
    if len(dtypes) > 1:
        listed = ", ".join(f"{n}={a.dtype}" for n, a in named_arrays.items())
        raise TypeError(f"{op}: {', '.join(named_arrays)} share type {type_var} "
                        f"and must have one dtype, got {listed}")


def is_real_number(value):
    """A real number that is not a bool: a Python int or float, a NumPy integer or
    floating scalar (bfloat16 too), or another ``numbers.Real``. Strings, bytes,
    arrays (0-d too) and sequences are not."""
    if isinstance(value, (bool, np.bool_)):
        return False
    return isinstance(value, numbers.Real) or (isinstance(value, np.generic)
                                               and value.dtype == BFLOAT16)


def check_float_attribute(op, name, value, positive=False):
    """A FLOAT attribute: a finite real number (and > 0 when ``positive``), as a
    Python float."""
    if not is_real_number(value):
        raise TypeError(f"{op}: {name} must be a float (a real number), "
                        f"got {type(value).__name__} {value!r}")
    try:
        number = float(value)
    except OverflowError:  # an int or Fraction beyond float64's range
        raise ValueError(f"{op}: {name} must be finite, got a number beyond float64's "
                         f"range ({type(value).__name__})") from None
    if not math.isfinite(number):
        raise ValueError(f"{op}: {name} must be finite, got {number}")
    if positive and number <= 0:
        raise ValueError(f"{op}: {name} must be positive, got {number}")
    return number


def check_int_attribute(op, name, value, choices=None):
    """An INT attribute: an integer (a Python int or bool, a NumPy integer or bool),
    one of ``choices`` when given, as a Python int."""
    if not isinstance(value, (int, np.integer, np.bool_)):
        expected = f" ({' or '.join(map(str, choices))})" if choices else ""
        raise TypeError(f"{op}: {name} must be an integer{expected}, "
                        f"got {type(value).__name__} {value!r}")
    number = int(value)
    if choices is not None and number not in choices:
        raise ValueError(f"{op}: {name} must be {' or '.join(map(str, choices))}, "
                         f"got {number}")
    return number


EPILOGUES = ("relu", "silu", "gelu_tanh", "gelu")  # normkernels.kernels.activations.KINDS[1:]


def check_activation(op, activation):
    """An activation epilogue's name: None (none) or one of :data:`EPILOGUES`."""
    if activation is None or (isinstance(activation, str) and activation in EPILOGUES):
        return activation
    raise ValueError(f"{op}: activation must be None or one of {', '.join(EPILOGUES)}, "
                     f"got {activation!r}")


ROUNDINGS = ("once", "llama")  # normkernels.kernels.activations.ROUNDINGS


def check_rounding(op, rounding):
    """Where a row normalization rounds: "once" (Y only) or "llama" (the normalized
    value to Y's dtype before the scale multiplies it, as LlamaRMSNorm)."""
    if isinstance(rounding, str) and rounding in ROUNDINGS:
        return rounding
    raise ValueError(f"{op}: rounding must be one of {', '.join(map(repr, ROUNDINGS))}, "
                     f"got {rounding!r}")


def offset_scale(op, offset, scale, X):
    """Gemma's zero-centred weight: ``offset + scale`` computed in float32 (float64
    when X or scale is float64), or ``scale`` itself when ``offset`` is 0."""
    offset = check_float_attribute(op, "offset", offset)
    if offset == 0:
        return scale
    wide = FLOAT64 if FLOAT64 in (X.dtype, scale.dtype) else FLOAT32
    # one new array; no errstate (adding a finite offset raises no floating-point flag
    # that matters: the largest float32 plus 1 is itself, NaN and inf pass through)
    return np.add(scale, wide.type(offset), dtype=wide)


def check_epsilon(op, epsilon, positive=False):
    return check_float_attribute(op, "epsilon", epsilon, positive)


def check_data_format(op, data_format):
    if data_format not in DATA_FORMATS:
        raise ValueError(f"{op}: data_format must be one of {DATA_FORMATS}, got {data_format!r}")


def channel_count(X, data_format):
    """C: axis 1 for NCX, the last axis for NXC; 1 for 1-D input (ONNX: size-N X)."""
    if X.ndim == 1:
        return 1
    return X.shape[1] if data_format == "NCX" else X.shape[-1]


def check_channel_params(op, C, named_params):
    for name, p in named_params.items():
        if p.shape != (C,):
            raise ValueError(f"{op}: {name} must have shape ({C},) to match the "
                             f"{C} channels of X, got shape {p.shape}")


def same_view(a, b):
    """Whether ``a`` and ``b`` are the same view: the same memory, shape, strides and
    dtype."""
    return (a.__array_interface__["data"][0] == b.__array_interface__["data"][0]
            and a.shape == b.shape and a.strides == b.strides and a.dtype == b.dtype)


def check_out(op, out, X, params, inputs=None):
    """``out`` must be a writeable array of X's shape and dtype, and share memory with
    no input except by being X itself, or one of ``inputs`` (name -> array, X first:
    the inputs the kernel reads each element of before writing it; default X alone)."""
    inputs = {"X": X} if inputs is None else inputs
    x_name = next(iter(inputs))
    if not isinstance(out, np.ndarray):
        raise TypeError(f"{op}: out must be a numpy.ndarray, got {type(out).__name__}")
    if out.shape != X.shape or out.dtype != X.dtype:
        raise ValueError(f"{op}: out must have the shape and dtype of {x_name} "
                         f"({X.shape}, {X.dtype}), got ({out.shape}, {out.dtype})")
    if not out.flags.writeable:
        raise ValueError(f"{op}: out is read-only")
    for name, arr in inputs.items():
        if (np.may_share_memory(out, arr) and not same_view(out, arr)
                and np.shares_memory(out, arr)):
            raise ValueError(f"{op}: out overlaps {name} without being {name} itself "
                             f"(in-place needs out={name} exactly)")
    for name, p in params.items():
        if np.may_share_memory(out, p) and np.shares_memory(out, p):
            raise ValueError(f"{op}: out shares memory with {name}")


def _channels_last_order(ndim):
    return (0, *range(2, ndim), 1)


def _channels_first_order(ndim):
    return (0, ndim - 1, *range(1, ndim - 1))


def physical_layout(X, data_format):
    """How to run over X's memory: ``(order, S)`` where ``X.transpose(order)`` is
    C-contiguous and channel ``c`` of flat element ``i`` is ``(i // S) % C``; or
    ``None`` when X is neither channels-first nor channels-last in memory.

    A logically NCX tensor stored channels-last (PyTorch's channels_last) runs as
    NXC with no copy, and the reverse.
    """
    ndim = X.ndim
    if ndim <= 2:  # (N,) is N x 1; (N, C) is the same in both formats
        return (tuple(range(ndim)), 1) if X.flags.c_contiguous else None
    spatial = math.prod(X.shape[2:]) if data_format == "NCX" else math.prod(X.shape[1:-1])
    identity = tuple(range(ndim))
    if data_format == "NCX":
        candidates = ((identity, spatial), (_channels_last_order(ndim), 1))
    else:
        candidates = ((identity, 1), (_channels_first_order(ndim), spatial))
    for order, S in candidates:
        if X.transpose(order).flags.c_contiguous:
            return order, S
    return None


def layout_or_copy(X, data_format):
    """``(X, order, S)`` from :func:`physical_layout`, X replaced by a C-contiguous
    copy when it is neither channels-first nor channels-last in memory."""
    layout = physical_layout(X, data_format)
    if layout is None:
        X = np.ascontiguousarray(X)
        layout = physical_layout(X, data_format)
    return X, *layout


def contiguous_layout(X, data_format):
    """``(Xc, C, S)``: X itself, viewed C-contiguous in its memory order when it is
    channels-first or channels-last in memory, else a contiguous copy; channel ``c``
    of flat element ``i`` of ``Xc`` is ``(i // S) % C``."""
    X, order, S = layout_or_copy(X, data_format)
    return X.transpose(order), channel_count(X, data_format), S


def infer(X, scale, B, mean, var, epsilon, data_format, out, engine, path=None, act=None,
          res=None):
    """Y = act((X - mean) * scale / sqrt(var + epsilon) + B + res) per channel, written
    to ``out`` (or a new array); the engine folds the parameters (the rule of
    :func:`normkernels.reference.fold_parameters`). ``act``: an activation's name, or
    None; ``res``: a checked residual of X's shape and dtype, or None."""

    def kernel(x, y, C, S, r=None):
        extra = epilogue(act, r)
        return engine.inference(x, y, C, S, scale, B, mean, var, epsilon, path, **extra)

    return map_layout(X, data_format, out, kernel, res)


def fold_parameters(scale, B, mean, var, epsilon, dtype):
    """Per-channel ``(m, a, b)`` in the compute dtype of ``dtype`` such that
    ``(x - m) * a + b`` is ``(x - mean) * scale / sqrt(var + epsilon) + B``: the
    rule the kernels follow (:func:`normkernels.kernels.inference.fold`; also
    :func:`normkernels.reference.fold_parameters`).

    ``a`` is computed in float64 from the exact float64 values of the parameters and
    rounded once. When ``mean`` is wider than the compute dtype (a float64 mean with
    float32 X; every batch mean in training), ``m`` is its rounding and the residual
    ``(mean - m) * a`` is folded into ``b`` in float64: rounding the mean alone would
    cost up to half an ulp of |mean| in every output (5e-4 at mean 1e4, std 1).
    """
    cd = compute_dtype(dtype)
    with np.errstate(all="ignore"):  # IEEE results (inf, NaN), as the kernels give
        a64 = scale.astype(FLOAT64) / np.sqrt(var.astype(FLOAT64) + epsilon)
        a = a64.astype(cd)
        m = mean.astype(cd, copy=False)
        if mean.dtype.itemsize <= cd.itemsize:
            return m, a, B.astype(cd, copy=False)
        residual = np.where(np.isfinite(m), mean - m.astype(FLOAT64), 0.0)
        b = (B.astype(FLOAT64) - residual * a64).astype(cd)
    return m, a, b


def epilogue(act, res):
    """The keyword arguments of an engine call for an epilogue: none when there is none
    (engines without epilogues take none)."""
    extra = {} if act is None else {"act": act}
    if res is not None:
        extra["res"] = res
    return extra


def check_residual(op, name, res, X):
    """A residual added before the activation: an array of X's shape and dtype."""
    if res is None:
        return None
    res = as_array(name, res)
    if res.shape != X.shape or res.dtype != X.dtype:
        raise ValueError(f"{op}: {name} must have X's shape and dtype ({X.shape}, {X.dtype}), "
                         f"got ({res.shape}, {res.dtype})")
    return res


def map_layout(X, data_format, out, kernel, res=None):
    """Y from ``kernel(x, y, C, S)`` run over X's memory order, written to ``out`` (or
    a new array in X's memory order); with a residual ``res`` (X's shape), ``kernel(x,
    y, C, S, r)`` with ``r`` in x's memory order (copied there when it is not).

    ``x`` and ``y`` are C-contiguous views (X copied first when it is neither
    channels-first nor channels-last in memory) in which channel ``c`` of flat
    element ``i`` is ``(i // S) % C``: ``S`` is the spatial size for channels-first
    memory and 1 for channels-last.
    """
    C = channel_count(X, data_format)
    if X.size == 0:
        return np.empty_like(X) if out is None else out
    if X.flags.c_contiguous:  # the common case, kept short for small-tensor latency
        order = None
        S = math.prod(X.shape[2:]) if data_format == "NCX" and X.ndim > 2 else 1
    else:
        X, order, S = layout_or_copy(X, data_format)
    if out is not None and (out.flags.c_contiguous if order is None
                            else out.transpose(order).flags.c_contiguous):
        y = out
    else:
        y = np.empty_like(X)  # same memory order as X
    extra = ()
    if res is not None:  # the kernels read the residual in x's memory order
        extra = (np.ascontiguousarray(res if order is None else res.transpose(order)),)
    if order is None:
        kernel(X, y, C, S, *extra)
    else:
        kernel(X.transpose(order), y.transpose(order), C, S, *extra)
    if out is not None and y is not out:
        np.copyto(out, y)
        return out
    return y

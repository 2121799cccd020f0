"""ONNX LRN (local response normalization), opsets 1 and 13 (spec layer).

For X of shape (N, C, D1, ..., Dk): ``Y[n, c, d] = X[n, c, d] / (bias + alpha / size *
square_sum[n, c, d]) ** beta`` with ``square_sum`` the sum of ``X[n, i, d] ** 2`` over
``max(0, c - floor((size - 1) / 2)) <= i <= min(C - 1, c + ceil((size - 1) / 2))``.
``size`` is required; alpha (1e-4), beta (0.75) and bias (1.0) have defaults.
Versions:

* 1: T in float16, float32, float64;
* 13: adds bfloat16.

What normkernels decides where the spec is silent:

* rank: the schema states no rank rule and the formula reads for any k >= 0, so X
  needs at least 2 dimensions (N, C); onnxruntime runs only 4-D and the ONNX
  reference only 4-D too (with its channel loop over N, onnx/onnx issue #7805);
* ``size``: any positive integer, odd or even (even: one channel more above c, as
  the formula gives; torch's window is mirrored there); a window larger than C just
  meets the edges. alpha is divided by ``size`` even where the window is cut short;
* attributes are checked finite; the rest is IEEE arithmetic (a base of zero or
  below gives inf or NaN as the formula does; float64 squares beyond float64's range,
  |x| above about 1e154, make the base infinite and Y zero);
* ``data_format="NXC"`` (channels last, N x D1 ... Dk x C) is an extension;
* arithmetic is float64 for every dtype, rounded once to T
  (the loops: ``kernels/lrn.py``).
"""

from dataclasses import dataclass

import numpy as np

from normkernels.ops import common, lp_normalization
from normkernels.ops.common import ALL_FLOATS, NO_BF16

OP = "LRN"
MIN_RANK = 2


@dataclass(frozen=True)
class Version(common.Version):
    dtypes: tuple = NO_BF16  # allowed dtypes of T


_ATTRIBUTES = {"size": None, "alpha": 1e-4, "beta": 0.75, "bias": 1.0}
VERSIONS = {
    1: Version(1, _ATTRIBUTES, required=("size",)),
    13: Version(13, _ATTRIBUTES, required=("size",), dtypes=ALL_FLOATS),
}

version_for = common.version_lookup(OP, VERSIONS)


def check_size(label, size):
    """``size`` as a Python int: a positive integer."""
    if not common.is_integer(size):
        raise TypeError(f"{label}: size must be an integer (the number of channels to sum "
                        f"over), got {type(size).__name__} {size!r}")
    if size < 1:
        raise ValueError(f"{label}: size must be a positive integer (the number of channels "
                         f"to sum over), got {size}")
    return int(size)


def lrn(X, *, size=None, alpha=None, beta=None, bias=None, opset=13, data_format="NCX",
        out=None, engine, path=None):
    """Spec layer of :func:`normkernels.lrn`; ``engine.lrn`` runs the loops."""
    version = version_for(opset)
    label = version.label(OP)
    attrs = common.resolve_attributes(label, version, {"size": size, "alpha": alpha,
                                                       "beta": beta, "bias": bias})
    n = check_size(label, attrs["size"])
    a = common.check_float_attribute(label, "alpha", attrs["alpha"])
    b = common.check_float_attribute(label, "beta", attrs["beta"])
    k = common.check_float_attribute(label, "bias", attrs["bias"])
    common.check_data_format(label, data_format)
    X = common.as_array("X", X)
    common.check_dtype(label, "X", X, version.dtypes)
    if X.ndim < MIN_RANK:
        raise ValueError(f"{label}: X must have at least {MIN_RANK} dimensions (N x C x D1 "
                         f"... Dk), got shape {X.shape}")
    if out is not None:
        if isinstance(out, np.ndarray) and lp_normalization.out_overlaps(out, X):
            X = X.copy()  # out overwrites part of X: read from a copy
        common.check_out(label, out, X, {})
    return common.map_layout(X, data_format, out, lambda x, y, C, S: engine.lrn(
        x, y, C, S, n, a, b, k, path))

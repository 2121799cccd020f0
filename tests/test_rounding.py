"""16-bit outputs are rounded once, to nearest, ties to even, by every operator on
every path and in both layouts.

The tolerance tests (half an ulp beyond the float32 arithmetic, tests/oracle.py) catch
truncation but cannot tell round-half-up from round-half-even: both are half an ulp
off at a tie. Here the data make the float32 result exact and a tie for the output
dtype, so the correctly rounded answer is known bit for bit (the oracle rounds on the
bits, apart from NumPy's and ml_dtypes' conversions).
"""

import numpy as np
import pytest
from arrays import BFLOAT16, to_layout
from oracle import round_to_nearest_even

import normkernels as nk
from normkernels.engine import PATHS, policy
from normkernels.engine.numba_engine import ENGINE
from normkernels.ops import batch_norm_inference as bni_spec
from normkernels.ops import batch_normalization as bn_spec
from normkernels.ops import instance_normalization as in_spec

F16 = np.dtype(np.float16)
SIXTEEN_BIT = {"float16": F16, "bfloat16": BFLOAT16}
MANTISSA_BITS = {F16: 10, BFLOAT16: 7}
SHAPE = (2, 64, 8, 12)  # NCX; 12 288 elements: vector bodies, heads and tails


def in_one_to_two(rng, shape, dtype):
    """16-bit values in [1, 2) with random mantissas."""
    bits = MANTISSA_BITS[dtype]
    return (1 + rng.integers(0, 2**bits, shape) / 2**bits).astype(dtype)


def check_ties(Y, exact, dtype):
    half = 2.0 ** -(MANTISSA_BITS[dtype] + 1)
    fraction = np.abs(exact) / 2.0 ** np.floor(np.log2(np.abs(exact)))  # in [1, 2)
    ties = np.mod(fraction, 2 * half) == half
    assert ties.mean() > 0.4, "the data must be mostly ties"
    want = round_to_nearest_even(exact, dtype)
    got = np.ascontiguousarray(Y).view(np.uint16)
    wrong = got != want
    assert not wrong.any(), (f"{wrong.sum()} of {wrong.size} outputs misrounded, e.g. "
                             f"{exact[wrong][:3]} gave {Y[wrong][:3]}")


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("data_format", ["NCX", "NXC"])
@pytest.mark.parametrize("op", ["bn", "onednn"])
@pytest.mark.parametrize("name", list(SIXTEEN_BIT))
def test_inference_rounds_ties_to_even(rng, name, op, data_format, path):
    """``y = x * scale + B`` exactly in float32 (var + epsilon = 1, mean 0), with B half
    an ulp of the output: every output with |y| in [1, 2) is a tie."""
    dtype = SIXTEEN_BIT[name]
    X = in_one_to_two(rng, to_layout(SHAPE, data_format), dtype)
    C = SHAPE[1]
    pdt = BFLOAT16 if op == "onednn" and dtype == BFLOAT16 else np.float32
    scale = rng.choice([-1.0, 1.0], C)
    B = np.full(C, 2.0 ** -(MANTISSA_BITS[dtype] + 1))
    params = [v.astype(pdt) for v in (scale, B, np.zeros(C), np.full(C, 0.75))]
    if op == "bn":
        Y = bn_spec.batch_normalization(X, *params, epsilon=0.25, data_format=data_format,
                                        engine=ENGINE, path=path)
    else:
        Y = bni_spec.batch_norm_inference(X, *params, epsilon=0.25, data_format=data_format,
                                          engine=ENGINE, path=path)
    shape = (1, C, 1, 1) if data_format == "NCX" else (1, 1, 1, C)
    exact = X.astype(np.float64) * scale.reshape(shape) + B.reshape(shape)
    check_ties(Y, exact, dtype)


def plus_minus_two(shape, data_format):
    """Every (n, c) alternates +2 and -2 over its spatial positions: mean 0 and
    variance 4 exactly, for batch and instance statistics alike."""
    ncx = (shape[0], shape[-1], *shape[1:-1]) if data_format == "NXC" else shape
    signs = np.where(np.arange(int(np.prod(ncx[2:]))) % 2 == 0, 2.0, -2.0)
    X = np.broadcast_to(signs.reshape(ncx[2:]), ncx)
    return np.ascontiguousarray(np.moveaxis(X, 1, -1) if data_format == "NXC" else X)


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("data_format", ["NCX", "NXC"])
@pytest.mark.parametrize("op", ["training", "instance"])
@pytest.mark.parametrize("name", list(SIXTEEN_BIT))
def test_statistics_operators_round_ties_to_even(rng, name, op, data_format, path,
                                                 monkeypatch):
    """With statistics mean 0 and variance 4 (exact) and epsilon 0, ``y = +-scale + B``
    exactly; per-channel scales ``1 + k ulp`` (k even and odd) and B half an ulp make
    every output a tie."""
    dtype = SIXTEEN_BIT[name]
    shape = to_layout(SHAPE, data_format)
    X = plus_minus_two(shape, data_format).astype(dtype)
    C = SHAPE[1]
    ulp = 2.0 ** -MANTISSA_BITS[dtype]
    scale = (1 + rng.permutation(C) * ulp) * rng.choice([-1.0, 1.0], C)
    B = np.full(C, ulp / 2)
    if op == "training":
        params = [v.astype(dtype) for v in (scale, B, np.zeros(C), np.ones(C))]
        Y = bn_spec.batch_normalization(X, *params, epsilon=0.0, training_mode=1,
                                        data_format=data_format, engine=ENGINE, path=path)[0]
        mean, var = nk.moments(X, data_format=data_format)
    else:
        params = [v.astype(dtype) for v in (scale, B)]
        if data_format == "NXC" and path != "serial":  # the per-sample route too
            monkeypatch.setattr(policy, "SAMPLE_CALL_MIN_ELEMENTS", 1)
        Y = in_spec.instance_normalization(X, *params, epsilon=0.0, data_format=data_format,
                                           engine=ENGINE, path=path)
        mean, var = np.zeros(1), np.full(1, 4.0)
    assert np.all(mean == 0) and np.all(var == 4)  # the premise: exact statistics
    cshape = (1, C, 1, 1) if data_format == "NCX" else (1, 1, 1, C)
    exact = X.astype(np.float64) / 2 * scale.reshape(cshape) + B.reshape(cshape)
    check_ties(Y, exact, dtype)

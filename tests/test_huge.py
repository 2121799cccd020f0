"""Tensors of more than 2**31 elements (float16, 4.3 GB each for X and Y): no 32-bit
index overflow in any kernel of any operator (moments, ONNX inference and training,
oneDNN inference, instance normalization), in either layout, checked against the
float64 oracle's error model. Slow (about three minutes on 2 cores, 9 GB resident) but
run in CI."""

import numpy as np
import pytest
from oracle import (
    assert_close,
    batch_norm,
    rounded_statistic_tolerance,
    statistics_tolerance,
    tolerance,
)

import normkernels as nk

F16, F32 = np.dtype(np.float16), np.dtype(np.float32)

SPATIAL = (32768, 32769)  # 2 * 32768 * 32769 = 2**31 + 65536 elements with C = 2
CHUNK = 1 << 24


def pattern(n):
    """A float16 tensor of n elements that is cheap to make and not periodic in C:
    x[i] = ((i * 7919) % 2003) / 1000 - 1, made chunk by chunk."""
    x = np.empty(n, np.float16)
    for lo in range(0, n, CHUNK):
        i = np.arange(lo, min(n, lo + CHUNK), dtype=np.int64)
        x[lo:lo + i.size] = ((i * 7919) % 2003) / 1000.0 - 1.0
    return x


def exact_stats(x, C, channel_of):
    """Per-channel mean and population variance in float64, chunk by chunk, two
    passes (``channel_of(lo, hi)`` gives the channel of each element of a chunk)."""
    n = np.zeros(C)
    total = np.zeros(C)
    for lo in range(0, x.size, CHUNK):
        hi = min(x.size, lo + CHUNK)
        c = channel_of(lo, hi)
        total += np.bincount(c, x[lo:hi].astype(np.float64), C)
        n += np.bincount(c, minlength=C)
    mean = total / n
    m2 = np.zeros(C)
    for lo in range(0, x.size, CHUNK):
        hi = min(x.size, lo + CHUNK)
        c = channel_of(lo, hi)
        m2 += np.bincount(c, (x[lo:hi].astype(np.float64) - mean[c]) ** 2, C)
    return mean, m2 / n


def check_samples(Y, X, channel_of, scale, B, mean, var, epsilon, statistics=False):
    """Y at sampled indices (both ends, both sides of 2**31, 2000 random) against the
    float64 oracle with the error model of tests/oracle.py for float16 output: half an
    ulp of float16 beyond the float32 arithmetic bound, plus, with ``statistics`` (the
    kernel computed mean and var from X; here they are the exact ones), the effect of
    the statistics' error and of rounding the batch mean to float32."""
    n = X.size
    idx = np.concatenate([np.arange(16), np.arange(2**31 - 8, 2**31 + 8),
                          np.arange(n - 16, n),
                          np.random.default_rng(0).integers(0, n, 2000)])
    c = np.concatenate([channel_of(i, i + 1) for i in idx])
    x = X[idx]
    # per-element parameters (the oracle takes arrays of X's shape as they are)
    params = [np.asarray(v)[c] for v in (scale, B, mean, var)]
    exact = batch_norm(x, *params, epsilon)
    tol = tolerance(x, *params, epsilon, "NCX", F16, mean_rounded=statistics,
                    statistics_of=F16 if statistics else None)
    assert_close(Y[idx], exact, tol)


@pytest.mark.slow
def test_more_than_2_to_the_31_elements_in_both_layouts():
    n = 2 * SPATIAL[0] * SPATIAL[1]
    assert n > 2**31
    flat = pattern(n)
    out = np.empty_like(flat)
    scale = np.array([1.5, -0.5], np.float32)
    B = np.array([0.25, 2.0], np.float32)
    layouts = {
        "NCX": (flat.reshape(1, 2, *SPATIAL),
                lambda lo, hi: (np.arange(lo, hi) >= n // 2).astype(np.int64)),
        "NXC": (flat.reshape(1, *SPATIAL, 2), lambda lo, hi: np.arange(lo, hi) % 2),
    }
    for fmt, (X, channel_of) in layouts.items():
        mean, var = exact_stats(flat, 2, channel_of)
        got_mean, got_var = nk.moments(X, data_format=fmt)
        d_mean, d_var = statistics_tolerance(mean, var, F16)  # then rounded to float32
        assert_close(got_mean, mean, rounded_statistic_tolerance(mean, got_mean.dtype, d_mean),
                     "mean")
        assert_close(got_var, var, rounded_statistic_tolerance(var, got_var.dtype, d_var),
                     "variance")
        mean32, var32 = mean.astype(F32), var.astype(F32)
        Y = out.reshape(X.shape)
        out[:] = 0
        nk.batch_normalization(X, scale, B, mean32, var32, data_format=fmt, out=Y)
        check_samples(out, flat, channel_of, scale, B, mean32, var32, 1e-5)
        out[:] = 0  # oneDNN: float16 input, float32 parameters, epsilon required
        nk.batch_norm_inference(X, scale, B, mean32, var32, epsilon=1e-3, data_format=fmt,
                                out=Y)
        check_samples(out, flat, channel_of, scale, B, mean32, var32, 1e-3)
        out[:] = 0
        nk.batch_normalization(X, scale, B, np.zeros(2, np.float32), np.ones(2, np.float32),
                               training_mode=1, data_format=fmt, out=Y)
        check_samples(out, flat, channel_of, scale, B, mean, var, 1e-5, statistics=True)
        out[:] = 0
        scale16, B16 = scale.astype(np.float16), B.astype(np.float16)
        nk.instance_normalization(X, scale16, B16, data_format=fmt,
                                  out=Y)  # N = 1: the batch statistics
        check_samples(out, flat, channel_of, scale16, B16, mean, var, 1e-5, statistics=True)

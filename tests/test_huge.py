"""Tensors of more than 2**31 elements (float16, 4.3 GB each for X and Y): no 32-bit
index overflow in any kernel, in either layout. Slow (about a minute) but run in CI."""

import numpy as np
import pytest

import normkernels as nk

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


def check_samples(Y, X, mean, var, scale, B, channel_of):
    n = X.size
    idx = np.concatenate([np.arange(16), np.arange(2**31 - 8, 2**31 + 8),
                          np.arange(n - 16, n),
                          np.random.default_rng(0).integers(0, n, 2000)])
    c = np.concatenate([channel_of(i, i + 1) for i in idx])
    x = X[idx].astype(np.float64)
    want = (x - mean[c]) / np.sqrt(var[c] + 1e-5) * scale[c] + B[c]
    got = Y[idx].astype(np.float64)
    np.testing.assert_allclose(got, want, rtol=2e-3, atol=2e-3)  # float16 output


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
        np.testing.assert_allclose(got_mean, mean, rtol=1e-6, atol=1e-7)
        np.testing.assert_allclose(got_var, var, rtol=1e-6)
        Y = out.reshape(X.shape)
        nk.batch_normalization(X, scale, B, mean.astype(np.float32), var.astype(np.float32),
                               data_format=fmt, out=Y)
        check_samples(out, flat, mean, var, scale, B, channel_of)
        out[:] = 0
        nk.batch_normalization(X, scale, B, np.zeros(2, np.float32), np.ones(2, np.float32),
                               training_mode=1, data_format=fmt, out=Y)
        check_samples(out, flat, mean, var, scale, B, channel_of)
        out[:] = 0
        nk.instance_normalization(X, scale.astype(np.float16), B.astype(np.float16),
                                  data_format=fmt, out=Y)  # N = 1: the same statistics
        check_samples(out, flat, mean, var, scale.astype(np.float16).astype(np.float64),
                      B.astype(np.float16).astype(np.float64), channel_of)

"""normkernels.numba: the jitted row, plane and span functions called from a user's
own @njit code (serial and prange), bit for bit the public functions' results."""

import numba
import numpy as np
import pytest
from arrays import assert_identical

import normkernels as nk
from normkernels.numba import layer_norm_row, moments, normalize_plane, rms_norm_row

DTYPES = [np.float32, np.float64]


@numba.njit
def _user_rows(X, scale, bias, Y, stats):
    for r in range(X.shape[0]):
        stats[r, 0], stats[r, 1] = layer_norm_row(X[r], scale, bias, 1e-5, Y[r])


@numba.njit(parallel=True)
def _user_rows_parallel(X, scale, Y, inv):
    for r in numba.prange(X.shape[0]):
        inv[r] = rms_norm_row(X[r], scale, 1e-6, Y[r])


@numba.njit
def _user_planes(X, mean, var, scale, bias, Y):
    for c in range(X.shape[0]):
        normalize_plane(X[c], mean[c], var[c], scale[c], bias[c], 1e-5, Y[c])


@pytest.mark.parametrize("dtype", DTYPES, ids=["float32", "float64"])
@pytest.mark.parametrize("K", [1, 7, 64, 300, 5000])
def test_rows_from_user_code_match_the_public_functions(dtype, K):
    rng = np.random.default_rng(K)
    X = (1e4 + rng.standard_normal((5, K))).astype(dtype)  # a large offset
    scale, bias = rng.standard_normal(K).astype(dtype), rng.standard_normal(K).astype(dtype)
    Y, stats = np.empty_like(X), np.empty((5, 2))
    _user_rows(X, scale, bias, Y, stats)
    want, mean, inv = nk.layer_normalization(X, scale, bias, stash_type=11, num_outputs=3)
    assert_identical(Y, want)
    np.testing.assert_array_equal(stats[:, 0], mean.ravel())
    np.testing.assert_array_equal(stats[:, 1], inv.ravel())
    inv_r = np.empty(5)
    _user_rows_parallel(X, scale, Y, inv_r)
    want, inv = nk.simplified_layer_normalization(X, scale, epsilon=1e-6, stash_type=11,
                                                  num_outputs=2)
    assert_identical(Y, want)
    np.testing.assert_array_equal(inv_r, inv.ravel())


@pytest.mark.parametrize("dtype", DTYPES, ids=["float32", "float64"])
def test_planes_and_moments_match_the_public_functions(dtype):
    rng = np.random.default_rng(1)
    C, S = 3, 97
    X = (5 + 2 * rng.standard_normal((C, S))).astype(dtype)
    mean, var = rng.standard_normal(C).astype(dtype), (rng.random(C) + .5).astype(dtype)
    scale, bias = rng.standard_normal(C).astype(dtype), rng.standard_normal(C).astype(dtype)
    Y = np.empty_like(X)
    _user_planes(X, mean, var, scale, bias, Y)
    want = nk.batch_normalization(X[None], scale, bias, mean, var)[0]
    assert_identical(Y, want)
    m, v = nk.moments(X[None])
    for c in range(C):
        got = moments(X[c])
        np.testing.assert_allclose(got, (m[c], v[c]), rtol=1e-14, atol=0)
        exact = X[c].astype(np.float64)
        np.testing.assert_allclose(got, (exact.mean(), exact.var()), rtol=1e-12)


def test_bad_arguments_raise():
    x = np.ones(8, np.float32)
    with pytest.raises(ValueError, match="one size"):
        layer_norm_row(x, x, x, 1e-5, np.empty(4, np.float32))
    with pytest.raises(ValueError, match="scale and bias"):
        rms_norm_row(x, np.ones(3, np.float32), 1e-5, np.empty_like(x))
    with pytest.raises(ValueError, match="bias"):
        layer_norm_row(x, x, np.ones(2, np.float32), 1e-5, np.empty_like(x))

"""Float32 rows in float32 lanes (issue 47): the error bound at its edges.

On a target with FMA the row kernels normalize float32 rows in float32 lanes
(``normkernels.kernels.row_vectors``): ``t = x - m``, ``n = fma(t, a_hi, fma(t, a_lo,
c))``, ``y = fma(n, scale, B)`` with the float64 statistics' ``m`` rounded, ``a_hi +
a_lo = 1 / sqrt(var + eps)`` and ``c`` the mean's residual. ``docs/design.md`` ("Float32
rows in float32 lanes") derives ``|n - exact| < 2 u |n|`` (``u = 2**-24``): ``t``'s
rounding and ``n``'s, the rest below ``u**2``. So with scale 1 and no B, Y is within 2
ulp of the float64 result; with an affine, ``fma`` adds one rounding of Y. Targets
without FMA keep float64 lanes (one rounding, half an ulp), so the same bounds hold
there (``test_portable`` runs this file's checks on them through the oracle).
"""

from fractions import Fraction

import numpy as np
import pytest
from oracle import row_norm, row_tolerance, ulp

import normkernels as nk
from normkernels import reference
from normkernels.reference.rows import fma32

F32, F64 = np.dtype(np.float32), np.dtype(np.float64)
EPS = 1e-5
U = 2.0 ** -24


def ulp_error(Y, y):
    return np.abs(Y.astype(F64) - y) / ulp(y, F32)


def rows(rng, M, K, mean_over_std, std=1.0):
    """Rows whose mean is ``mean_over_std`` standard deviations (signs alternate)."""
    sign = np.where(np.arange(M) % 2 == 0, 1.0, -1.0)[:, None]
    return ((rng.standard_normal((M, K)) + sign * mean_over_std) * std).astype(F32)


@pytest.mark.parametrize("op", ["layer_normalization", "rms_normalization"])
def test_random_rows_within_two_ulp(rng, op):
    """The issue's data (rows with means of -3..3 std), scale 1, no B: 2 ulp."""
    X = (rng.standard_normal((512, 768)) + rng.uniform(-3, 3, (512, 1))).astype(F32)
    ones = np.ones(768, F32)
    centered = op == "layer_normalization"
    Y = getattr(nk, op)(X, ones)
    y = row_norm(X, ones, None, EPS, centered=centered)[0]
    assert ulp_error(Y, y).max() <= 2.0


@pytest.mark.parametrize("mean_over_std", [0.0, 1e-3, 0.5, 1.0, 3.0, 10.0, 1e2, 1e3, 1e4])
@pytest.mark.parametrize("std", [1.0, 1e30, 1e-30], ids=["std1", "huge", "tiny"])
def test_mean_over_std_sweep_within_two_ulp(rng, mean_over_std, std):
    """|mean| / std from 0 to 1e4 (``x - m`` exact by Sterbenz when the mean dominates,
    rounded when it does not), rows of 1e30 and 1e-30 (eps then dominates: Y tiny),
    odd row lengths (scalar head and tail beside the vectors)."""
    X = rows(rng, 16, 301, mean_over_std, std)
    ones = np.ones(301, F32)
    y = row_norm(X, ones, None, EPS)[0]
    assert ulp_error(nk.layer_normalization(X, ones), y).max() <= 2.0
    if std != 1e-30:
        eps = 1e-30 * std * std  # epsilon negligible: Y of order 1 in every row
        y = row_norm(X, ones, None, eps)[0]
        assert ulp_error(nk.layer_normalization(X, ones, epsilon=eps), y).max() <= 2.0


def test_subnormal_rows(rng):
    """Rows of float32 subnormals and outputs in the subnormal range: the bound in
    units of the smallest spacing there."""
    X = (rng.standard_normal((8, 77)) * 1e-40).astype(F32)
    ones = np.ones(77, F32)
    for eps in (1e-75, 1e-80, 1e-90):  # var ~1e-80: Y of order 1, 0.1 and 1e-5
        y = row_norm(X, ones, None, eps)[0]
        assert ulp_error(nk.layer_normalization(X, ones, epsilon=eps), y).max() <= 2.0
    tiny = np.full(77, 1e-38, F32)  # Y near float32's smallest normal: subnormal results
    y = row_norm(X, tiny, None, 1e-80)[0]
    assert ulp_error(nk.layer_normalization(X, tiny, epsilon=1e-80), y).max() <= 2.0


@pytest.mark.parametrize("mean_over_std", [0.0, 3.0, 1e4])
def test_affine_bound(rng, mean_over_std):
    """Scale and B: ``|Y - y| <= 2 u |n scale| + u |y|`` (n's bound times the scale, then
    fma's one rounding) where they cancel too; every element also within the oracle's
    tolerance for float32 arithmetic."""
    K = 768
    X = rows(rng, 64, K, mean_over_std)
    scale = (rng.uniform(0.5, 2, K) * rng.choice([-1, 1], K)).astype(F32)
    y_plain = row_norm(X, np.ones(K, F32), None, EPS)[0]
    B = (-y_plain[0] * scale * rng.uniform(0.999, 1.001, K)).astype(F32)  # cancels in row 0
    Y = nk.layer_normalization(X, scale, B).astype(F64)
    y, mean, var = row_norm(X, scale, B, EPS)
    bound = 2 * U * np.abs(y_plain * scale.astype(F64)) * (1 + 1e-6) + U * np.abs(y) + 1e-45
    assert np.all(np.abs(Y - y) <= bound)
    assert np.all(np.abs(Y - y) <= row_tolerance(X, scale, B, mean, var, EPS, F32))


def test_twin_matches_kernels_bit_for_bit(rng):
    """The NumPy twin computes the target's arithmetic (float32 lanes with FMA, else
    float64 lanes): its Y equals the kernels' from the same float64 statistics, with a
    residual epilogue, on rows whose odd length puts elements in the scalar head and
    tail."""
    from normkernels.engine.numba_engine import ENGINE

    X = (rng.standard_normal((33, 203)) * 3 + 7).astype(F32)
    scale, B = rng.uniform(-2, 2, 203).astype(F32), rng.standard_normal(203).astype(F32)
    R = rng.standard_normal((33, 203)).astype(F32)
    for res in (None, R):
        got, twin = np.empty_like(X), np.empty_like(X)
        mean, var = ENGINE.normalize_rows(X[:, 1:], got[:, 1:], scale[1:], B[1:], EPS, True,
                                          res=None if res is None else res[:, 1:])
        reference.normalize_rows_from(X[:, 1:], twin[:, 1:], scale[1:], B[1:], EPS, True,
                                      mean, var, None, None if res is None else res[:, 1:])
        np.testing.assert_array_equal(got[:, 1:].view(np.int32), twin[:, 1:].view(np.int32))


def exact_fma32(a, b, c):
    """``a * b + c`` rounded to float32 by exact rational arithmetic (ties to even)."""
    exact = Fraction(float(a)) * Fraction(float(b)) + Fraction(float(c))
    near = np.float32(float(exact))
    candidates = (np.nextafter(near, np.float32(-np.inf)), near,
                  np.nextafter(near, np.float32(np.inf)))
    return min(candidates, key=lambda v: (abs(Fraction(float(v)) - exact),
                                          int(np.float32(v).view(np.int32)) & 1))


def test_fma32_is_correctly_rounded(rng):
    """The twin's FMA against exact rationals: random triples, products that cancel
    against the addend, tiny addends, and a sum whose float64 rounding is a float32
    midpoint (where ``float32(a * b + c)`` in float64 rounds twice, wrongly)."""
    a = rng.standard_normal(3000).astype(F32)
    b = rng.standard_normal(3000).astype(F32)
    c = np.concatenate([rng.standard_normal(1000), -(a[1000:2000].astype(F64) * b[1000:2000]),
                        rng.standard_normal(1000) * 1e-9]).astype(F32)
    got = fma32(a, b, c)
    want = np.array([exact_fma32(p, q, r) for p, q, r in zip(a, b, c, strict=True)], F32)
    np.testing.assert_array_equal(got.view(np.int32), want.view(np.int32))
    # exact 1 + 2**-23 + 2**-24 - 2**-60: float64 rounds it to the midpoint, which
    # rounds to even (1 + 2**-22); the correct rounding is 1 + 2**-23
    p, q, r = np.float32(1 + 2.0 ** -18), np.float32(2.0 ** -24 * (1 - 2.0 ** -18)), \
        np.float32(1 + 2.0 ** -23)
    assert np.float32(np.float64(p) * np.float64(q) + np.float64(r)) == np.float32(1 + 2.0 ** -22)
    assert fma32(p, q, r) == exact_fma32(p, q, r) == np.float32(1 + 2.0 ** -23)


def test_ill_scaled_rows_take_float64_lanes(rng):
    """Rows where float32 lanes would overflow (std 1e35: deviations near float32's
    max; |mean| 1e31) or ``a`` leaves float32's range (std 1e-40 with eps 1e-85:
    a ~ 1e40) beside ordinary rows: every row within 2 ulp (float64 lanes: half an
    ulp), and the twin decides row by row as the kernels do (the same bits)."""
    from normkernels.engine.numba_engine import ENGINE

    X = rng.standard_normal((6, 203))
    X[1] *= 1e35
    X[2] = X[2] + 1e31 / 3
    X[3] *= 3e38 / np.abs(X[3]).max()  # deviations up to 3e38 of both signs
    X[4] *= 1e-40
    X = X.astype(F32)
    ones = np.ones(203, F32)
    y = row_norm(X, ones, None, 1e-85)[0]
    Y = nk.layer_normalization(X, ones, epsilon=1e-85)
    assert np.all(np.isfinite(Y)) and ulp_error(Y, y).max() <= 2.0
    got, twin = np.empty_like(X), np.empty_like(X)
    mean, var = ENGINE.normalize_rows(X, got, ones, None, 1e-85, True)
    reference.normalize_rows_from(X, twin, ones, None, 1e-85, True, mean, var)
    np.testing.assert_array_equal(got.view(np.int32), twin.view(np.int32))

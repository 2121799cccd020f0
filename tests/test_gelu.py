"""The exact GELU epilogue (``activation="gelu"``: ``y Phi(y)``, PyTorch's
``gelu(approximate="none")``, built by normkernels/kernels/erf.py): its own error
against a long-double evaluation (tests/oracle.py's ``gelu_exact``), the scalar and
vector paths' bits, special values and PyTorch, a digest of its bits (the same on every
target: run this file under ``NUMBA_CPU_NAME=generic`` and ``x86-64-v3`` too), and the
normalizations with ``activation="gelu"`` against the float64 oracle."""

import hashlib

import numpy as np
import pytest
from arrays import FLOAT_IDS, FLOATS, assert_identical, random_params, random_tensor, to_layout
from numba import njit
from oracle import (
    activation,
    activation_tolerance,
    assert_close,
    batch_norm,
    gelu_exact,
    group_norm,
    group_tolerance,
    instance_norm,
    instance_tolerance,
    tolerance,
    unit_roundoff,
)

import normkernels as nk
from normkernels import reference
from normkernels.engine.numba_engine import ENGINE
from normkernels.kernels import activations

F32, F64 = np.dtype(np.float32), np.dtype(np.float64)
EPS = 1e-5
GELU = activations.for_kind("gelu")
# the oracle is only as good as float64 where long double is float64 (MSVC, macOS arm64)
WIDE_LONG_DOUBLE = np.finfo(np.longdouble).nmant >= 63
SQRT2 = np.sqrt(2.0)


def vector_gelu(x):
    """gelu of x in one plane of ``scale_shift`` (m 0, a 1, b -0.0: every x as it is,
    -0.0 included): the vector bodies, with a scalar head and tail."""
    y = np.empty_like(x)
    zero, one = np.zeros(1, x.dtype), np.ones(1, x.dtype)
    ENGINE.scale_shift(x, y, 1, x.size, zero, one, -zero, "serial", act=GELU)
    return y


@njit
def _scalar_loop(x, y):
    for i in range(x.size):
        y[i] = activations.activate(activations.GELU, x[i])


def scalar_gelu(x):
    """gelu of each x through ``activations.activate`` (the scalar path alone)."""
    y = np.empty_like(x)
    _scalar_loop(x, y)
    return y


def special_values(dtype):
    fi = np.finfo(dtype)
    return np.array([np.nan, -np.nan, np.inf, -np.inf, 0.0, -0.0, fi.smallest_subnormal,
                     -fi.smallest_subnormal, 3 * fi.smallest_subnormal, fi.tiny, -fi.tiny,
                     fi.max, -fi.max, 1e30, -1e30, 1e-30, -1e-30, 15.0, -15.0, 40.0, -40.0],
                    dtype)


def grid(dtype):
    """[-40, 40] in steps of 1/2000, scattered values where the curve bends, the
    boundaries of the approximations' intervals (in |y|: 0.84375, 1.25 and 1/0.35
    times sqrt 2) and of the clamp (15; 40) with their neighbours, the specials."""
    scattered = 12 * ((np.arange(40000) * 0.6180339887498949) % 1) - 6  # no RNG: fixed bits
    edges = np.array([0.84375 * SQRT2, 1.25 * SQRT2, SQRT2 / 0.35, 14.36, 15.0, 38.6, 40.0])
    near = (edges.astype(dtype)[:, None].view(f"i{np.dtype(dtype).itemsize}")
            + np.arange(-3, 4)).ravel().view(dtype)
    return np.concatenate([np.linspace(-40, 40, 160001).astype(dtype),
                           scattered.astype(dtype), near, -near,
                           special_values(dtype)])


# --- the activation itself ---------------------------------------------------------------


@pytest.mark.parametrize("dtype", [F32, F64], ids=["float32", "float64"])
def test_gelu_error_bound(dtype):
    """Within ACTIVATION_ULPS units of roundoff of |gelu(y)| (plus the subnormal floor)
    of the long-double value, on both paths (measured: 3.9 float32, 4.2 float64)."""
    if dtype == F64 and not WIDE_LONG_DOUBLE:
        pytest.skip("long double is float64 here: no oracle finer than float64")
    x = grid(dtype)
    exact = gelu_exact(x.astype(F64))
    tol = activation_tolerance("gelu", x.astype(F64), 0.0, dtype)
    finite = np.isfinite(exact)
    u = unit_roundoff(dtype)
    for got in (vector_gelu(x), scalar_gelu(x)):
        assert np.array_equal(np.isnan(got), np.isnan(exact))
        err = np.abs(got[finite].astype(np.longdouble) - exact[finite]).astype(F64)
        ratio = err / tol[finite]
        worst = int(np.argmax(ratio))
        assert ratio[worst] <= 1, (f"gelu({x[finite][worst]!r}) off by {ratio[worst]:.3g} "
                                   "times the tolerance")
        normal = np.abs(exact[finite]) > np.finfo(dtype).tiny
        in_u = err[normal] / (u * np.abs(exact[finite][normal].astype(F64)))
        assert in_u.max() <= activations.ACTIVATION_ULPS


@pytest.mark.parametrize("dtype", [F32, F64], ids=["float32", "float64"])
def test_scalar_and_vector_paths_agree(dtype):
    """The same bits from the scalar path and the vector bodies, and from planes of
    every length up to two vectors (heads and tails in the scalar loop)."""
    x = grid(dtype)
    vector = vector_gelu(x)
    assert_identical(scalar_gelu(x), vector)
    zero, one = np.zeros(1, dtype), np.ones(1, dtype)
    for n in (1, 3, 7, 15, 17, 31, 33):
        xs = x[:x.size // n * n]
        planes = np.empty_like(xs)
        ENGINE.scale_shift(xs, planes, 1, n, zero, one, -zero, "serial", act=GELU)
        assert_identical(planes, vector[:xs.size])


@pytest.mark.parametrize("dtype", [F32, F64], ids=["float32", "float64"])
def test_special_values(dtype):
    x = special_values(dtype)
    got = vector_gelu(x)
    assert_identical(scalar_gelu(x), got)
    underflow = -14.5 if dtype == F32 else -38.7  # gelu rounds to -0.0 below
    for value, result in zip(x, got, strict=True):
        if np.isnan(value) or value == -np.inf:  # gelu(-inf) = -inf * 0, PyTorch's NaN
            assert np.isnan(result), value
        elif value < underflow or (value == 0 and np.signbit(value)):
            assert result == 0 and np.signbit(result), value
        elif value == 0 or value >= 10:  # +0.0; y itself (1 - Phi(y) < 2^-54)
            assert result == value and not np.signbit(result), value
    tiny = np.finfo(dtype).smallest_subnormal
    assert got[x == tiny][0] in (0, tiny)  # exactly tiny / 2: rounded to 0 or to tiny
    assert_close(got, activation("gelu", x), activation_tolerance("gelu", x, 0.0, dtype))


@pytest.mark.parametrize("dtype", [F32, F64], ids=["float32", "float64"])
def test_matches_pytorch(dtype):
    """Within the tolerance of PyTorch's ``gelu`` plus its own error: it evaluates
    ``0.5 y (1 + erf(y / sqrt 2))``, which cancels below 0 (it is off by units of
    roundoff of |y|, not of |gelu(y)|: float32 ``gelu(-13)`` is 0 there, -7.95e-38
    here); the same special values one element at a time (its vectorised float32 path
    gives NaN for +inf)."""
    torch = pytest.importorskip("torch")
    F = torch.nn.functional
    x = np.linspace(-40, 40, 80001).astype(dtype)
    got = vector_gelu(x)
    theirs = F.gelu(torch.from_numpy(x)).numpy()
    tol = (activation_tolerance("gelu", x, 0.0, dtype)
           + 8 * unit_roundoff(dtype) * np.abs(x.astype(F64)))
    assert_close(got, theirs.astype(F64), tol, "gelu vs torch")
    specials = special_values(dtype)
    mine = vector_gelu(specials)
    for value, result in zip(specials, mine, strict=True):
        t = F.gelu(torch.from_numpy(np.array([value], dtype))).numpy()[0]
        assert np.isnan(t) == np.isnan(result), value
        if t == 0 and result == 0:
            assert np.signbit(t) == np.signbit(result), value
        elif np.isfinite(t):  # as on the grid: units of roundoff of |y|
            bound = (16 * unit_roundoff(dtype) * abs(float(value))
                     + 2 * float(np.finfo(dtype).smallest_subnormal))
            assert abs(float(t) - float(result)) <= bound, value
        else:
            assert t == result or np.isnan(t), value


def _digest(*arrays):
    """sha256 of the arrays' bytes, every NaN made the same (a NaN's payload and sign
    are the CPU's: x86's default NaN is negative, aarch64's positive)."""
    h = hashlib.sha256()
    for a in arrays:
        a = a.copy()
        a[np.isnan(a)] = np.nan
        h.update(a.tobytes())
    return h.hexdigest()[:16]


def test_bits_are_the_same_on_every_target():
    """The digest of gelu over the grid in float32 and float64 by both paths, as
    recorded on an AVX-512 CPU (znver4); the same under NUMBA_CPU_NAME=generic
    (baseline x86-64, no FMA) and x86-64-v3 (AVX2, FMA available, never contracted)."""
    outputs = []
    for dtype in (F32, F64):
        x = grid(dtype)
        outputs += [vector_gelu(x), scalar_gelu(x)]
    assert _digest(*outputs) == GRID_DIGEST


GRID_DIGEST = "c3b43e41d0b2ac63"


# --- activation="gelu" on the normalizations ---------------------------------------------


def wide_data(rng, ncx_shape, dtype, last):
    """X and per-channel parameters that spread Y over [-40, 40] (GELU's tail, its
    subnormals and underflow in float32, its linear end)."""
    N, C = ncx_shape[:2]
    b = (N, C) + (1,) * (len(ncx_shape) - 2)
    X = rng.standard_normal(ncx_shape) * rng.uniform(0.5, 2, b) + rng.uniform(-3, 3, b)
    if last:
        X = np.moveaxis(X, 1, -1)
    scale = rng.uniform(1, 12, C) * rng.choice([-1, 1], C)
    B = rng.uniform(-8, 8, C)
    return np.ascontiguousarray(X).astype(dtype), scale.astype(dtype), B.astype(dtype)


@pytest.mark.parametrize("dtype", FLOATS, ids=FLOAT_IDS)
@pytest.mark.parametrize("last", [1, 0], ids=["nxc", "ncx"])
def test_group_normalization_with_gelu(rng, last, dtype):
    X, scale, B = wide_data(rng, (2, 16, 9, 7), dtype, last)
    fmt = "NXC" if last else "NCX"
    Y = nk.group_normalization(X, scale, B, num_groups=4, data_format=fmt, activation="gelu")
    exact, mean, var, s, b = group_norm(X, scale, B, 4, EPS, fmt)
    tol = group_tolerance(X, s, b, mean, var, EPS, fmt, X.dtype)
    want, tol = activation("gelu", exact), activation_tolerance("gelu", exact, tol, X.dtype)
    assert_close(Y, want, tol)
    from normkernels.ops import group_normalization as spec

    twin = spec.group_normalization(X, scale, B, num_groups=4, data_format=fmt,
                                    activation="gelu", engine=reference.ENGINE)
    assert_close(twin, want, tol, "twin Y")


@pytest.mark.parametrize("dtype", FLOATS, ids=FLOAT_IDS)
@pytest.mark.parametrize("last", [1, 0], ids=["nxc", "ncx"])
def test_instance_normalization_with_gelu(rng, last, dtype):
    X, scale, B = wide_data(rng, (2, 8, 11, 5), dtype, last)
    fmt = "NXC" if last else "NCX"
    Y = nk.instance_normalization(X, scale, B, data_format=fmt, activation="gelu")
    exact, mean, var = instance_norm(X, scale, B, EPS, fmt)
    tol = instance_tolerance(X, scale, B, mean, var, EPS, fmt, X.dtype)
    assert_close(Y, activation("gelu", exact), activation_tolerance("gelu", exact, tol, X.dtype))


@pytest.mark.parametrize("dtype", FLOATS, ids=FLOAT_IDS)
@pytest.mark.parametrize("data_format", ["NCX", "NXC"])
def test_batch_normalization_with_gelu(rng, data_format, dtype):
    X = random_tensor(rng, to_layout((3, 6, 13, 7), data_format), dtype, std=3.0)
    scale, B, mean, var = random_params(rng, 6, (dtype,) * 4)
    scale = (scale.astype(F64) * 6).astype(dtype)  # Y over about [-40, 40]
    Y = nk.batch_normalization(X, scale, B, mean, var, data_format=data_format,
                               activation="gelu")
    exact = batch_norm(X, scale, B, mean, var, EPS, data_format)
    tol = tolerance(X, scale, B, mean, var, EPS, data_format, X.dtype)
    assert_close(Y, activation("gelu", exact), activation_tolerance("gelu", exact, tol, X.dtype))


def test_gelu_is_an_activation():
    assert "gelu" in activations.KINDS and activations.for_kind("gelu") is activations.GELU
    X = np.ones((1, 4, 2, 2), F32)
    s = np.ones(4, F32)
    with pytest.raises(ValueError, match="gelu_tanh, gelu"):
        nk.group_normalization(X, s, s, num_groups=2, activation="gelu_erf")

"""Adaptive LayerNorm (DiT's modulation, with the gated residual) against a float64
oracle written from the definitions (tests/oracle.py's row normalization with
per-sample parameters)."""

import numpy as np
import pytest
from arrays import FLOAT_IDS, FLOATS, assert_identical
from oracle import assert_close, row_norm, row_tolerance, ulp

import normkernels as nk
from normkernels import reference
from normkernels.engine.numba_engine import ENGINE
from normkernels.ops import modulated as spec

F32, F64 = np.dtype(np.float32), np.dtype(np.float64)
EPS = 1e-6
SHAPES = {"dit": (2, 9, 48), "n1": (1, 5, 32), "one-token": (4, 1, 24), "2d": (3, 40),
          "4d": (2, 3, 4, 16), "wide": (2, 3, 1500)}


def modulated(rng, shape, dtype, offset=0.0):
    N, C = shape[0], shape[-1]
    X = (rng.standard_normal(shape) * rng.uniform(0.5, 2, (N,) + (1,) * (len(shape) - 1))
         + offset).astype(dtype)
    shift = rng.standard_normal((N, C)).astype(dtype)
    scale = (rng.standard_normal((N, C)) * 0.5).astype(dtype)
    return X, shift, scale


def expected(X, shift, scale):
    """(Y, tolerance): LN(X) without affine, times ``1 + scale``, plus ``shift``."""
    N, C = X.shape[0], X.shape[-1]
    b = (N,) + (1,) * (X.ndim - 2) + (C,)
    s = 1 + scale.astype(F64).reshape(b)
    t = shift.astype(F64).reshape(b)
    exact, mean, var = row_norm(X, s, t, EPS)
    return exact, row_tolerance(X, s, t, mean, var, EPS, X.dtype)


@pytest.mark.parametrize("dtype", FLOATS, ids=FLOAT_IDS)
@pytest.mark.parametrize("shape_id", SHAPES)
def test_matches_oracle(rng, shape_id, dtype):
    X, shift, scale = modulated(rng, SHAPES[shape_id], dtype)
    before = X.copy()
    Y = nk.ada_layer_norm(X, shift, scale)
    assert Y.shape == X.shape and Y.dtype == X.dtype
    assert_identical(X, before)
    exact, tol = expected(X, shift, scale)
    assert_close(Y, exact, tol)
    twin = spec.ada_layer_norm(X, shift, scale, engine=reference.ENGINE)
    assert_close(twin, exact, tol, "twin Y")
    # (N, 1, ..., C) parameters, and parameters in another dtype
    b = (X.shape[0],) + (1,) * (X.ndim - 2) + (X.shape[-1],)
    assert_identical(nk.ada_layer_norm(X, shift.reshape(b), scale.reshape(b)), Y)
    other = nk.ada_layer_norm(X, shift.astype(F64), scale.astype(F64))
    assert_identical(other, Y)


def test_large_offsets_and_views(rng):
    X, shift, scale = modulated(rng, (2, 6, 64), F32, offset=1e4)
    exact, tol = expected(X, shift, scale)
    assert_close(nk.ada_layer_norm(X, shift, scale), exact, tol)
    big = np.zeros((2, 12, 130), F32)
    view = big[:, ::2, 1:65]
    view[...] = X
    assert_close(nk.ada_layer_norm(view, shift, scale), exact, tol)


@pytest.mark.parametrize("dtype", FLOATS, ids=FLOAT_IDS)
def test_zero_modulation_is_layer_normalization_bit_for_bit(rng, dtype):
    """AdaLN-Zero starts at scale = shift = 0: the output is plain LayerNorm exactly."""
    X, _, _ = modulated(rng, (3, 7, 40), dtype)
    zeros = np.zeros((3, 40), dtype)
    Y = nk.ada_layer_norm(X, zeros, zeros)
    assert_identical(Y, nk.layer_normalization(X, np.ones(40, dtype), epsilon=EPS))


@pytest.mark.parametrize("gated", [True, False], ids=["gate", "no-gate"])
@pytest.mark.parametrize("dtype", FLOATS, ids=FLOAT_IDS)
def test_gated_residual(rng, dtype, gated):
    X, shift, scale = modulated(rng, (2, 9, 48), dtype)
    R = (rng.standard_normal(X.shape) * 3).astype(dtype)
    gate = rng.standard_normal((2, 48)).astype(dtype) if gated else None
    inputs = (X.copy(), R.copy())
    Y, S = nk.ada_layer_norm(X, shift, scale, residual=R, gate=gate)
    assert_identical(X, inputs[0])
    assert_identical(R, inputs[1])
    g = gate.astype(F64)[:, None, :] if gated else 1.0
    exact_s = R.astype(F64) + g * X.astype(F64)
    assert S.dtype == X.dtype and S.flags.c_contiguous
    assert_close(S, exact_s, 0.5 * ulp(exact_s, dtype) + 2.0**-24 * np.abs(exact_s), "S")
    exact, tol = expected(S, shift, scale)
    assert_close(Y, exact, tol)
    assert_identical(Y, nk.ada_layer_norm(S, shift, scale))  # Y normalizes S as returned
    twin = spec.ada_layer_norm(X, shift, scale, residual=R, gate=gate, engine=reference.ENGINE)
    assert_close(twin[1], exact_s, 0.5 * ulp(exact_s, dtype) + 2.0**-24 * np.abs(exact_s),
                 "twin S")
    assert_close(twin[0], exact, tol, "twin Y")


@pytest.mark.parametrize("path", ["serial", "parallel", "streaming"])
def test_every_path_gives_the_same_bits(rng, path):
    X, shift, scale = modulated(rng, (2, 300, 96), F32)
    R = rng.standard_normal(X.shape).astype(F32)
    gate = rng.standard_normal((2, 96)).astype(F32)
    want = nk.ada_layer_norm(X, shift, scale, residual=R, gate=gate)
    got = spec.ada_layer_norm(X, shift, scale, residual=R, gate=gate, engine=ENGINE, path=path)
    assert_identical(got[0], want[0])
    assert_identical(got[1], want[1])


@pytest.mark.parametrize("path", ["serial", "parallel", "streaming"])
@pytest.mark.parametrize("N,T,C", [(16, 1, 64), (3, 17, 40), (2, 300, 96), (5, 7, 3)])
@pytest.mark.parametrize("dtype", FLOATS, ids=FLOAT_IDS)
def test_one_launch_gives_each_sample_its_row_normalization(rng, dtype, N, T, C, path):
    """The one-launch kernel (kernels/modulated.py) gives each sample the bits the row
    normalization gives it with its own tables (the engine's default, a call per
    sample), on every path: one row a sample, the table-free few rows, many rows,
    rows shorter than a vector."""
    from normkernels.engine import Engine

    X = (rng.standard_normal((N * T, C)) * 3 + 1).astype(dtype)
    s = 1 + rng.standard_normal((N, C)) * 0.5
    b = rng.standard_normal((N, C))
    got, want = np.empty_like(X), np.empty_like(X)
    ENGINE.modulated_rows(X, got, T, s, b, EPS, path)
    Engine.modulated_rows(ENGINE, X, want, T, s, b, EPS, path)
    assert_identical(got, want)


@pytest.mark.parametrize("path", ["serial", "parallel"])
@pytest.mark.parametrize("N,T,C", [(16, 1, 64), (3, 17, 40), (2, 300, 96), (3, 700, 33)])
@pytest.mark.parametrize("dtype", [F32, np.float64])
def test_one_launch_backward_gives_each_sample_its_row_backward(rng, dtype, N, T, C, path):
    """The one-launch backward (``backward_dx.modulated_rows_backward``) gives each
    sample the dX and parameter sums the row backward gives it alone (the engine's
    default, a call per sample), with several work items a sample too."""
    from normkernels.engine import Engine

    X = (rng.standard_normal((N * T, C)) * 3 + 1).astype(dtype)
    dY = rng.standard_normal((N * T, C)).astype(dtype)
    gamma = 1 + rng.standard_normal((N, C)) * 0.5
    got, want = np.empty_like(X), np.empty_like(X)
    sums = ENGINE.modulated_rows_backward(X, dY, got, T, gamma, EPS, path)
    expected_sums = Engine.modulated_rows_backward(ENGINE, X, dY, want, T, gamma, EPS, path)
    assert_identical(got, want)
    for a, b in zip(sums, expected_sums, strict=True):
        assert_identical(a, b)


def test_out_and_in_place(rng):
    X, shift, scale = modulated(rng, (2, 5, 32), F32)
    want = nk.ada_layer_norm(X, shift, scale)
    out = np.empty_like(X)
    assert nk.ada_layer_norm(X, shift, scale, out=out) is out
    assert_identical(out, want)
    Xc = X.copy()
    assert nk.ada_layer_norm(Xc, shift, scale, out=Xc) is Xc
    assert_identical(Xc, want)
    strided = np.empty((2, 5, 64), F32)[..., ::2]
    assert nk.ada_layer_norm(X, shift, scale, out=strided) is strided
    assert_identical(strided, want)


def test_errors(rng):
    X, shift, scale = modulated(rng, (2, 5, 8), F32)
    with pytest.raises(ValueError, match="shift must have shape"):
        nk.ada_layer_norm(X, shift[:1], scale)
    with pytest.raises(ValueError, match="scale must have shape"):
        nk.ada_layer_norm(X, shift, scale[:, :4])
    with pytest.raises(ValueError, match=r"gate .* needs residual"):
        nk.ada_layer_norm(X, shift, scale, gate=scale)
    with pytest.raises(ValueError, match="residual must have X's shape"):
        nk.ada_layer_norm(X, shift, scale, residual=X[:1])
    with pytest.raises(TypeError, match="T"):
        nk.ada_layer_norm(X, shift, scale, residual=X.astype(F64))
    with pytest.raises(ValueError, match="at least 2 dimensions"):
        nk.ada_layer_norm(X[0, 0], shift[0], scale[0])
    with pytest.raises(TypeError, match="X"):
        nk.ada_layer_norm(X.astype(np.int32), shift, scale)
    with pytest.raises(ValueError, match="epsilon must be finite"):
        nk.ada_layer_norm(X, shift, scale, epsilon=float("inf"))
    with pytest.raises(ValueError, match="out overlaps"):
        big = np.empty(X.size + 1, F32)
        nk.ada_layer_norm(big[:-1].reshape(X.shape), shift, scale,
                          out=big[1:].reshape(X.shape))


def test_agrees_with_the_torch_composite(rng):
    """What DiT's code computes: F.layer_norm without affine, eps 1e-6, then
    ``x * (1 + scale.unsqueeze(1)) + shift.unsqueeze(1)``, in float64."""
    torch = pytest.importorskip("torch")
    X, shift, scale = modulated(rng, (2, 9, 48), F64)
    R = rng.standard_normal(X.shape)
    gate = rng.standard_normal((2, 48))
    Y, S = nk.ada_layer_norm(X, shift, scale, residual=R, gate=gate)
    t = torch.from_numpy
    s = t(R) + t(gate).unsqueeze(1) * t(X)
    h = torch.nn.functional.layer_norm(s, (48,), eps=1e-6)
    want = h * (1 + t(scale).unsqueeze(1)) + t(shift).unsqueeze(1)
    np.testing.assert_allclose(S, s.numpy(), rtol=1e-15, atol=1e-15)
    np.testing.assert_allclose(Y, want.numpy(), rtol=1e-12, atol=1e-12)


# --- ada_group_norm ------------------------------------------------------------------

GN_SHAPES = {"sd": ((2, 32, 9, 7), 8), "n1": ((1, 16, 5, 5), 4), "n3-3d": ((3, 12, 33), 3),
             "big-planes": ((2, 64, 48, 48), 32)}


def ada_group_expected(X, shift, scale, G, fmt):
    from oracle import group_norm, group_tolerance

    C = X.shape[1] if fmt == "NCX" else X.shape[-1]
    z, mean, var, _, _ = group_norm(X, np.ones(C), np.zeros(C), G, 1e-5, fmt)
    N = X.shape[0]
    b = (N, C) + (1,) * (X.ndim - 2)
    ncx = z.shape if fmt == "NCX" else np.moveaxis(z, -1, 1).shape
    s = np.broadcast_to(1 + scale.astype(F64).reshape(b), ncx)
    t = np.broadcast_to(shift.astype(F64).reshape(b), ncx)
    if fmt == "NXC":
        s, t = np.moveaxis(s, 1, -1), np.moveaxis(t, 1, -1)
    exact = z * s + t
    return exact, group_tolerance(X, s, t, mean, var, 1e-5, fmt, X.dtype)


@pytest.mark.parametrize("fmt", ["NCX", "NXC"])
@pytest.mark.parametrize("dtype", FLOATS, ids=FLOAT_IDS)
@pytest.mark.parametrize("shape_id", GN_SHAPES)
def test_ada_group_norm_matches_oracle(rng, shape_id, dtype, fmt):
    shape, G = GN_SHAPES[shape_id]
    N, C = shape[:2]
    X = (rng.standard_normal(shape) * 2 + rng.uniform(-3, 3, (N, C) + (1,) * (len(shape) - 2)))
    if fmt == "NXC":
        X = np.moveaxis(X, 1, -1)
    X = np.ascontiguousarray(X).astype(dtype)
    shift = rng.standard_normal((N, C)).astype(dtype)
    scale = (rng.standard_normal((N, C)) * 0.5).astype(dtype)
    Y = nk.ada_group_norm(X, shift, scale, num_groups=G, data_format=fmt)
    exact, tol = ada_group_expected(X, shift, scale, G, fmt)
    assert_close(Y, exact, tol)
    twin = spec.ada_group_norm(X, shift, scale, num_groups=G, data_format=fmt,
                               engine=reference.ENGINE)
    assert_close(twin, exact, tol, "twin Y")
    for path in ("serial", "parallel", "streaming"):
        got = spec.ada_group_norm(X, shift, scale, num_groups=G, data_format=fmt,
                                  engine=ENGINE, path=path)
        assert_identical(got, Y)
    zeros = np.zeros((N, C), dtype)
    plain = nk.group_normalization(X, np.ones(C, dtype), np.zeros(C, dtype), num_groups=G,
                                   data_format=fmt)
    assert_identical(nk.ada_group_norm(X, zeros, zeros, num_groups=G, data_format=fmt), plain)


def test_ada_group_norm_sample_by_sample(rng):
    """Channels-last samples of at least SAMPLE_CALL_MIN_ELEMENTS run sample by sample,
    each with its own slice of the parameters."""
    X = rng.standard_normal((2, 96, 96, 128)).astype(F32)
    shift = rng.standard_normal((2, 128)).astype(F32)
    scale = rng.standard_normal((2, 128)).astype(F32)
    Y = nk.ada_group_norm(X, shift, scale, num_groups=32, data_format="NXC")
    exact, tol = ada_group_expected(X, shift, scale, 32, "NXC")
    assert_close(Y, exact, tol)


def test_ada_group_norm_bind_and_errors(rng):
    X = rng.standard_normal((2, 8, 4, 4)).astype(F32)
    shift, scale = rng.standard_normal((2, 8)).astype(F32), rng.standard_normal((2, 8)).astype(F32)
    out = np.empty_like(X)
    call = nk.bind(nk.ada_group_norm, X, shift, scale, num_groups=2, out=out)
    X[...] = rng.standard_normal(X.shape)
    scale[...] = rng.standard_normal(scale.shape)
    assert call() is out
    assert_identical(out, nk.ada_group_norm(X, shift, scale, num_groups=2))
    with pytest.raises(ValueError, match="shift must have shape"):
        nk.ada_group_norm(X, shift[:, :4], scale, num_groups=2)
    with pytest.raises(ValueError, match="scale must have shape"):
        nk.ada_group_norm(X, shift, scale[:1], num_groups=2)
    with pytest.raises(ValueError, match="num_groups must divide"):
        nk.ada_group_norm(X, shift, scale, num_groups=3)
    with pytest.raises(ValueError, match="at least 3 dimensions"):
        nk.ada_group_norm(X[:, :, 0, 0], shift, scale, num_groups=2)


def test_zero_shift_keeps_a_negative_zero():
    """The one value a zero shift could change: a normalized -0.0 (x - mean the
    smallest negative subnormal times a < 1 underflows to -0.0). LayerNorm without B
    keeps it (adding -0.0), and so does ada_layer_norm with shift 0."""
    tiny = np.nextafter(0.0, 1.0)
    X = np.array([[[-4.0, 4.0, -tiny, tiny]]])
    zeros = np.zeros((1, 4))
    ln = nk.layer_normalization(X, np.ones(4), epsilon=EPS)
    assert np.signbit(ln[0, 0, 2]) and ln[0, 0, 2] == 0
    assert_identical(nk.ada_layer_norm(X, zeros, zeros), ln)

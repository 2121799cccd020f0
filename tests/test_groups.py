"""Group normalizations (issue 12) against the float64 oracle and their NumPy twins.

ONNX GroupNormalization-18/-21, oneDNN Graph GroupNorm-1 and ONNX
MeanVarianceNormalization-9/-13 (fact sheet: specs/group-normalizations.md, sections 1,
2, 5 and 7). The kernels compute ``y = (x - m) * a + b`` per (n, group) (per kept index
for MVN) in float32 (float64 for float64 X) with float64 statistics: the error model
of instance normalization, with the group statistics broadcast to X's shape.
"""

import itertools
from concurrent.futures import ThreadPoolExecutor

import numba
import numpy as np
import pytest
from arrays import FLOAT_IDS, FLOATS, LAYOUTS, assert_identical, random_tensor, to_layout
from oracle import (
    assert_close,
    group_norm,
    group_statistics,
    group_tolerance,
    mean_variance_norm,
    mvn_tolerance,
    rounded_statistic_tolerance,
    row_norm,
    row_tolerance,
    statistics_tolerance,
)

import normkernels as nk
from normkernels import reference
from normkernels.engine import policy, threads
from normkernels.engine.numba_engine import ENGINE
from normkernels.ops import group_normalization as gn_spec
from normkernels.ops import mean_variance_normalization as mvn_spec

F16, BF16, F32, F64 = FLOATS
EPS = 1e-5
STASH_TYPES = (1, 10, 11, 16)
BIG = 1 << 40  # a FUSED_MAX_PLANE_BYTES that never splits by size


def dtype_id(dtype):
    return FLOAT_IDS[FLOATS.index(np.dtype(dtype))]


# --- data and checks -------------------------------------------------------------------


def group_data(rng, ncx_shape, dtype, data_format="NCX", offset=3.0):
    """X laid out as ``data_format`` whose every (n, c) has its own mean and spread: a
    group's statistics mix its channels, so a wrong group index (or a wrong sample)
    moves them far outside the tolerance."""
    N, C = ncx_shape[:2]
    bshape = (N, C) + (1,) * (len(ncx_shape) - 2)
    X = (rng.standard_normal(ncx_shape) * rng.uniform(0.5, 2, bshape)
         + rng.uniform(-offset, offset, bshape))
    if data_format == "NXC" and len(ncx_shape) > 2:
        X = np.moveaxis(X, 1, -1)
    return np.ascontiguousarray(X).astype(dtype)


def affine(rng, n, dtype):
    """Scale of both signs and a shift, ``n`` values each, all different."""
    scale = rng.uniform(0.5, 2, n) * rng.choice([-1, 1], n)
    return scale.astype(dtype), rng.standard_normal(n).astype(dtype)


def channels(X, data_format):
    return X.shape[1] if data_format == "NCX" or X.ndim == 2 else X.shape[-1]


def check_group(Y, X, scale, B, G, data_format, per_group=False, eps=EPS):
    """Y of group normalization of X against the oracle; returns (exact, tolerance)."""
    exact, mean, var, s, b = group_norm(X, scale, B, G, eps, data_format, per_group)
    assert Y.dtype == X.dtype and Y.shape == X.shape
    tol = group_tolerance(X, s, b, mean, var, eps, data_format, X.dtype)
    assert_close(Y, exact, tol)
    return exact, tol


def check_group_stats(X, G, data_format, mean_out, var_out, dtype):
    """oneDNN GroupNorm's mean and (population) variance outputs, (N, groups)."""
    _, _, mean, var = group_statistics(X, G, data_format)
    assert mean_out.shape == var_out.shape == (X.shape[0], G)
    assert mean_out.dtype == dtype and var_out.dtype == dtype
    d_mean, d_var = statistics_tolerance(mean, var, X.dtype)
    assert_close(mean_out, mean, rounded_statistic_tolerance(mean, dtype, d_mean), "mean")
    assert_close(var_out, var, rounded_statistic_tolerance(var, dtype, d_var), "variance")


def check_mvn(Y, X, axes):
    exact, mean, var = mean_variance_norm(X, axes)
    assert Y.dtype == X.dtype and Y.shape == X.shape
    tol = mvn_tolerance(X, mean, var, X.dtype)
    assert_close(Y, exact, tol)
    return exact, tol


def close_to_each_other(a, b, tol, what):
    """Two results each within ``tol`` of the oracle are within ``2 tol`` of each other."""
    assert_close(a, np.asarray(b).astype(np.float64), 2 * tol, what)


def dyadic(rng, shape, dtype):
    """Multiples of 1/4 in [-8, 8]: over groups of a power-of-two size every sum, mean,
    deviation and square is exact, so the statistics do not depend on the summation
    order and the kernels and the twin must agree bit for bit."""
    return (rng.integers(-32, 33, shape) / 4).astype(dtype)


# --- 1. GroupNormalization against the oracle ------------------------------------------

# name -> ((N, C, *spatial) in NCX terms, num_groups)
SHAPES = {
    "2d": ((5, 6), 3),
    "2d-G=C": ((4, 6), 6),  # one element per group: Y = B
    "3d": ((2, 6, 5), 2),
    "4d": ((2, 6, 4, 5), 3),
    "5d": ((2, 4, 2, 3, 4), 2),
    "N1": ((1, 8, 6, 6), 4),
    "G=C": ((3, 4, 7, 5), 4),
    "G=1": ((3, 4, 7, 5), 1),
    "spatial1": ((4, 6, 1, 1), 3),
    "odd": ((3, 21, 13, 17), 7),
    "short-planes": ((2, 12, 5, 5), 3),  # planes shorter than a vector
    "planes": ((2, 10, 61, 67), 5),  # above the serial threshold
}


@pytest.mark.parametrize("dtype", FLOATS, ids=FLOAT_IDS)
@pytest.mark.parametrize("shape_id", list(SHAPES))
def test_group_normalization_matches_oracle(rng, shape_id, dtype):
    ncx_shape, G = SHAPES[shape_id]
    for data_format in LAYOUTS:
        X = group_data(rng, ncx_shape, dtype, data_format)
        scale, B = affine(rng, ncx_shape[1], dtype)
        before = [v.copy() for v in (X, scale, B)]
        Y = nk.group_normalization(X, scale, B, num_groups=G, epsilon=EPS,
                                   data_format=data_format)
        _, tol = check_group(Y, X, scale, B, G, data_format)
        for v, copy in zip((X, scale, B), before, strict=True):
            assert_identical(v, copy)  # inputs untouched
        twin = reference.group_normalization(X, scale, B, num_groups=G, epsilon=EPS,
                                             data_format=data_format)
        check_group(twin, X, scale, B, G, data_format)
        close_to_each_other(Y, twin, tol, "kernel vs twin")


OPSET18_SHAPES = ["2d", "4d", "5d", "odd", "planes"]


@pytest.mark.parametrize("dtype", FLOATS, ids=FLOAT_IDS)
@pytest.mark.parametrize("shape_id", OPSET18_SHAPES)
def test_opset_18_scales_per_group(rng, shape_id, dtype):
    """GroupNormalization-18: scale and bias of shape (num_groups,), channel c takes
    its group's value; the same bits as -21 with the values repeated per channel."""
    ncx_shape, G = SHAPES[shape_id]
    C = ncx_shape[1]
    for fmt in LAYOUTS:
        X = group_data(rng, ncx_shape, dtype, fmt)
        scale, B = affine(rng, G, dtype)
        Y = nk.group_normalization(X, scale, B, num_groups=G, opset=18, data_format=fmt)
        check_group(Y, X, scale, B, G, fmt, per_group=True)
        repeated = nk.group_normalization(X, np.repeat(scale, C // G), np.repeat(B, C // G),
                                          num_groups=G, opset=21, data_format=fmt)
        assert_identical(Y, repeated)
        twin = reference.group_normalization(X, scale, B, num_groups=G, opset=18,
                                             data_format=fmt)
        check_group(twin, X, scale, B, G, fmt, per_group=True)


@pytest.mark.parametrize("opset,per_group", [(18, True), (19, True), (20, True), (21, False),
                                             (22, False), (30, False)])
def test_version_in_force(rng, opset, per_group):
    """Opsets 18-20 run GroupNormalization-18 (per group), 21 and later -21."""
    X = group_data(rng, (2, 6, 4, 5), F32)
    n = 2 if per_group else 6
    scale, B = affine(rng, n, F32)
    Y = nk.group_normalization(X, scale, B, num_groups=2, opset=opset)
    check_group(Y, X, scale, B, 2, "NCX", per_group=per_group)
    wrong = affine(rng, 6 if per_group else 2, F32)
    with pytest.raises(ValueError, match=r"scale must have shape"):
        nk.group_normalization(X, *wrong, num_groups=2, opset=opset)


def test_opsets_agree_when_groups_equal_channels(rng):
    X = group_data(rng, (2, 5, 6, 7), F32)
    scale, B = affine(rng, 5, F32)
    assert_identical(nk.group_normalization(X, scale, B, num_groups=5, opset=18),
                     nk.group_normalization(X, scale, B, num_groups=5, opset=21))


def test_no_version_before_18():
    X = np.zeros((2, 4, 3), F32)
    with pytest.raises(ValueError, match="no version at or below opset 17"):
        nk.group_normalization(X, np.ones(4, F32), np.zeros(4, F32), num_groups=2, opset=17)


# --- 2. oneDNN GroupNorm ------------------------------------------------------------------

DNNL_TYPES = [(F32, F32), (BF16, BF16), (BF16, F32), (F16, F32)]
DNNL_SHAPES = {"3d": ((2, 6, 5), 3), "4d": ((2, 6, 4, 5), 2), "5d": ((1, 4, 2, 3, 4), 2),
               "odd": ((3, 21, 13, 17), 7), "planes": ((2, 10, 61, 67), 5)}


@pytest.mark.parametrize("data_format", LAYOUTS)
@pytest.mark.parametrize("src_dtype,gamma_dtype", DNNL_TYPES,
                         ids=[f"{dtype_id(s)}-{dtype_id(g)}" for s, g in DNNL_TYPES])
@pytest.mark.parametrize("shape_id", list(DNNL_SHAPES))
def test_group_norm_matches_oracle(rng, shape_id, src_dtype, gamma_dtype, data_format):
    ncx_shape, G = DNNL_SHAPES[shape_id]
    X = group_data(rng, ncx_shape, src_dtype, data_format)
    gamma, beta = affine(rng, ncx_shape[1], gamma_dtype)
    before = X.copy()
    dst, mean, var = nk.group_norm(X, gamma, beta, groups=G, data_format=data_format)
    assert_identical(X, before)
    check_group(dst, X, gamma, beta, G, data_format)
    check_group_stats(X, G, data_format, mean, var, gamma_dtype)
    twin = reference.group_norm(X, gamma, beta, groups=G, data_format=data_format)
    check_group(twin[0], X, gamma, beta, G, data_format)
    check_group_stats(X, G, data_format, twin[1], twin[2], gamma_dtype)
    only = nk.group_norm(X, gamma, beta, groups=G, keep_stats=False, data_format=data_format)
    assert isinstance(only, np.ndarray)
    assert_identical(only, dst)


@pytest.mark.parametrize("data_format", LAYOUTS)
@pytest.mark.parametrize("dtype", [F16, BF16, F32], ids=["float16", "bfloat16", "float32"])
def test_group_norm_without_affine(rng, dtype, data_format):
    """use_affine=False: gamma 1 and beta 0, statistics in float32."""
    X = group_data(rng, (2, 8, 9, 11), dtype, data_format)
    dst, mean, var = nk.group_norm(X, groups=4, use_affine=False, data_format=data_format)
    C = 8
    check_group(dst, X, np.ones(C), np.zeros(C), 4, data_format)
    check_group_stats(X, 4, data_format, mean, var, F32)
    ones = nk.group_norm(X, np.ones(C, F32), np.zeros(C, F32), groups=4,
                         data_format=data_format)
    for a, b in zip((dst, mean, var), ones, strict=True):
        assert_identical(a, b)


def test_group_norm_matches_group_normalization(rng):
    """Same kernels: oneDNN's dst is GroupNormalization-21's Y (float32, NCX)."""
    X = group_data(rng, (2, 6, 9, 11), F32)
    gamma, beta = affine(rng, 6, F32)
    assert_identical(nk.group_norm(X, gamma, beta, groups=3, data_format="NCX")[0],
                     nk.group_normalization(X, gamma, beta, num_groups=3))


def test_group_norm_default_layout_is_channels_last(rng):
    X = group_data(rng, (2, 6, 5, 7), F32, "NXC")  # (2, 5, 7, 6)
    gamma, beta = affine(rng, 6, F32)
    dst, mean, var = nk.group_norm(X, gamma, beta, groups=3)
    check_group(dst, X, gamma, beta, 3, "NXC")
    check_group_stats(X, 3, "NXC", mean, var, F32)
    explicit = nk.group_norm(X, gamma, beta, groups=3, data_format="NXC")
    for a, b in zip((dst, mean, var), explicit, strict=True):
        assert_identical(a, b)
    with pytest.raises(ValueError, match=r"gamma must have shape \(6,\)"):
        nk.group_norm(X, *affine(rng, 5, F32), groups=1)  # C is the last axis, 6


@pytest.mark.parametrize("src,gamma,beta,match", [
    (F32, BF16, BF16, "gamma has dtype bfloat16"),
    (F16, F16, F16, "gamma has dtype float16"),
    (F16, BF16, BF16, "gamma has dtype bfloat16"),
    (BF16, BF16, F32, "share type T2"),
    (BF16, F64, F64, "gamma has dtype float64"),
    (F64, F64, F64, "src has dtype float64"),
])
def test_group_norm_dtype_rules(src, gamma, beta, match):
    X = np.ones((2, 3, 4), src)
    with pytest.raises(TypeError, match=match):
        nk.group_norm(X, np.ones(4, gamma), np.zeros(4, beta), groups=2)


def test_group_norm_affine_and_flags():
    X = np.ones((2, 3, 4), F32)
    g = np.ones(4, F32)
    with pytest.raises(ValueError, match=r"use_affine=True needs gamma and beta \(got gamma\)"):
        nk.group_norm(X, g, groups=2)
    with pytest.raises(ValueError, match=r"needs gamma and beta \(got neither\)"):
        nk.group_norm(X, groups=2)
    with pytest.raises(ValueError, match=r"use_affine=False takes no gamma or beta"):
        nk.group_norm(X, g, groups=2, use_affine=False)
    with pytest.raises(ValueError, match=r"use_affine=False takes no gamma or beta \(got beta"):
        nk.group_norm(X, beta=g, groups=2, use_affine=False)
    for flag in ("keep_stats", "use_affine"):
        with pytest.raises(TypeError, match=f"{flag} must be a bool"):
            nk.group_norm(X, g, g, groups=2, **{flag: 1})


@pytest.mark.parametrize("shape", [(6,), (2, 6)])
def test_group_norm_rank(shape):
    with pytest.raises(ValueError, match="at least 3 dimensions"):
        nk.group_norm(np.ones(shape, F32), np.ones(6, F32), np.zeros(6, F32), groups=2,
                      data_format="NCX")


def test_group_norm_in_place_and_empty_batch(rng):
    X = group_data(rng, (2, 12, 30, 30), BF16, "NXC")
    gamma, beta = affine(rng, 12, F32)
    dst, mean, var = nk.group_norm(X, gamma, beta, groups=4)
    result = nk.group_norm(X, gamma, beta, groups=4, out=X)
    assert result[0] is X
    assert_identical(X, dst)
    assert_identical(result[1], mean)
    assert_identical(result[2], var)
    empty = nk.group_norm(np.zeros((0, 5, 12), BF16), gamma.astype(BF16), beta.astype(BF16),
                          groups=3)
    assert empty[0].shape == (0, 5, 12)
    assert empty[1].shape == empty[2].shape == (0, 3) and empty[1].dtype == BF16


# --- 3. equivalences -----------------------------------------------------------------------


@pytest.mark.parametrize("data_format", LAYOUTS)
@pytest.mark.parametrize("dtype", FLOATS, ids=FLOAT_IDS)
@pytest.mark.parametrize("ncx_shape", [(2, 5, 6, 7), (2, 5, 61, 67)])
def test_one_channel_groups_are_instance_normalization(rng, ncx_shape, dtype, data_format):
    """num_groups = C: InstanceNormalization, bit for bit (the same loops, group 1)."""
    X = group_data(rng, ncx_shape, dtype, data_format)
    scale, B = affine(rng, ncx_shape[1], dtype)
    Y = nk.group_normalization(X, scale, B, num_groups=ncx_shape[1], data_format=data_format)
    assert_identical(Y, nk.instance_normalization(X, scale, B, data_format=data_format))
    check_group(Y, X, scale, B, ncx_shape[1], data_format)


@pytest.mark.parametrize("data_format", LAYOUTS)
@pytest.mark.parametrize("dtype", FLOATS, ids=FLOAT_IDS)
def test_one_group_is_layer_normalization(rng, dtype, data_format):
    """num_groups = 1: a layer normalization over C x spatial (axis 1), with the scale
    and bias broadcast along the channel axis."""
    ncx_shape = (3, 6, 9, 11)
    X = group_data(rng, ncx_shape, dtype, data_format)
    scale, B = affine(rng, 6, dtype)
    Y = nk.group_normalization(X, scale, B, num_groups=1, data_format=data_format)
    pshape = (6, 1, 1) if data_format == "NCX" else (6,)
    Scale = np.ascontiguousarray(np.broadcast_to(scale.reshape(pshape), X.shape[1:]))
    Bias = np.ascontiguousarray(np.broadcast_to(B.reshape(pshape), X.shape[1:]))
    y, mean, var = row_norm(X, Scale, Bias, EPS, axis=1)
    tol = row_tolerance(X, Scale, Bias, mean, var, EPS, dtype)
    assert_close(Y, y, tol)
    check_group(Y, X, scale, B, 1, data_format)
    layer = nk.layer_normalization(X, Scale, Bias, axis=1, epsilon=EPS)
    close_to_each_other(Y, layer, tol, "group vs layer normalization")


# --- 4. layouts and strides -------------------------------------------------------------------


@pytest.mark.parametrize("dtype", FLOATS, ids=FLOAT_IDS)
@pytest.mark.parametrize("layout", ["channels-last memory", "spatial stride 2", "reversed",
                                    "channels stride 2", "nxc spatial stride 2",
                                    "nxc reversed"])
def test_any_strides(rng, layout, dtype):
    G = 3
    if layout == "channels-last memory":  # NCX logically, NHWC in memory: no copy
        base = group_data(rng, (2, 6, 10, 12), dtype, "NXC")
        X, fmt = np.moveaxis(base, -1, 1), "NCX"
    elif layout == "spatial stride 2":
        X, fmt = group_data(rng, (2, 6, 20, 24), dtype)[:, :, ::2, ::2], "NCX"
    elif layout == "reversed":
        X, fmt = group_data(rng, (3, 6, 10, 12), dtype)[::-1, :, ::-1, ::-1], "NCX"
    elif layout == "channels stride 2":
        X, fmt = group_data(rng, (2, 12, 10, 12), dtype)[:, ::2], "NCX"
    elif layout == "nxc spatial stride 2":
        X, fmt = group_data(rng, (2, 6, 20, 24), dtype, "NXC")[:, ::2, ::2], "NXC"
    else:
        X, fmt = group_data(rng, (3, 6, 10, 12), dtype, "NXC")[::-1, ::-1, :, :], "NXC"
    assert not X.flags.c_contiguous
    scale, B = affine(rng, 6, dtype)
    Y = nk.group_normalization(X, scale, B, num_groups=G, data_format=fmt)
    check_group(Y, X, scale, B, G, fmt)
    contiguous = nk.group_normalization(np.ascontiguousarray(X), scale, B, num_groups=G,
                                        data_format=fmt)
    check_group(contiguous, X, scale, B, G, fmt)
    if layout == "channels-last memory":  # the rows loops on X's memory, order kept
        assert Y.transpose(0, 2, 3, 1).flags.c_contiguous
        assert_identical(Y.transpose(0, 2, 3, 1),
                         nk.group_normalization(base, scale, B, num_groups=G,
                                                data_format="NXC"))
    twin = reference.group_normalization(X, scale, B, num_groups=G, data_format=fmt)
    check_group(twin, X, scale, B, G, fmt)


# --- 5. hard data ---------------------------------------------------------------------


@pytest.mark.parametrize("dtype", FLOATS, ids=FLOAT_IDS)
@pytest.mark.parametrize("data_format", LAYOUTS)
def test_large_group_split_path(rng, monkeypatch, data_format, dtype):
    """(1, 4, 300000) in 2 groups: 600000 elements a group, more bytes than a fused
    group may have and fewer groups than threads: statistics and normalize split across
    the threads (NCX); one group over 4 x 300000 channels-last rows (NXC)."""
    taken = []
    monkeypatch.setattr(policy, "_trace", taken.append)
    X = group_data(rng, (1, 4, 300000), dtype, data_format)
    scale, B = affine(rng, 4, dtype)
    Y = nk.group_normalization(X, scale, B, num_groups=2, data_format=data_format)
    if data_format == "NCX":
        assert "instance_planes/split" in taken, taken
    else:
        assert any(r.startswith("instance_rows/") for r in taken), taken
    check_group(Y, X, scale, B, 2, data_format)


@pytest.mark.parametrize("dtype", [F32, F64], ids=["float32", "float64"])
@pytest.mark.parametrize("ncx_shape,G,data_format", [
    ((2, 6, 64, 64), 3, "NCX"), ((2, 6, 64, 64), 3, "NXC"), ((2, 6, 7, 7), 2, "NCX"),
    ((2, 6, 7, 7), 2, "NXC"), ((1, 4, 300000), 2, "NCX")])
def test_large_mean(rng, dtype, ncx_shape, G, data_format):
    """|mean| 1e4 with std 1: float64 statistics, the mean's rounding compensated (a
    one-pass E[x^2] - E[x]^2 in float32 would give noise)."""
    X = random_tensor(rng, to_layout(ncx_shape, data_format), dtype, mean=-1e4)
    scale, B = affine(rng, ncx_shape[1], dtype)
    Y = nk.group_normalization(X, scale, B, num_groups=G, data_format=data_format)
    check_group(Y, X, scale, B, G, data_format)
    if dtype == F32:
        dst, mean, var = nk.group_norm(X, scale, B, groups=G, data_format=data_format)
        assert_identical(dst, Y)
        check_group_stats(X, G, data_format, mean, var, F32)


@pytest.mark.parametrize("data_format", LAYOUTS)
@pytest.mark.parametrize("dtype", [F16, BF16], ids=["float16", "bfloat16"])
def test_16_bit_large_groups_do_not_overflow(rng, dtype, data_format):
    """Groups of 2 x 256 x 256 with mean 20: the sum of squares overflows float16
    (the -18 body's arithmetic in T); statistics are float32 runs joined in float64."""
    X = group_data(rng, (1, 4, 256, 256), F32, data_format, offset=0)
    X = (X + 20).astype(dtype)
    scale, B = affine(rng, 4, dtype)
    Y = nk.group_normalization(X, scale, B, num_groups=2, data_format=data_format)
    assert np.all(np.isfinite(Y.astype(F64)))
    check_group(Y, X, scale, B, 2, data_format)


@pytest.mark.parametrize("data_format", LAYOUTS)
@pytest.mark.parametrize("dtype", FLOATS, ids=FLOAT_IDS)
def test_constant_groups_give_B(rng, dtype, data_format):
    """Variance exactly 0 and x - mean exactly 0 (a constant group of a non-dyadic
    value): Y is B exactly, the other groups normal."""
    ncx_shape = (2, 6, 9, 11)
    X = group_data(rng, ncx_shape, dtype, data_format)
    scale, B = affine(rng, 6, dtype)
    ncx = np.moveaxis(X, -1, 1) if data_format == "NXC" else X  # a view
    ncx[1, 2:4] = np.asarray(0.1, dtype)  # (n=1, group 1)
    Y = nk.group_normalization(X, scale, B, num_groups=3, data_format=data_format)
    y = np.moveaxis(Y, -1, 1) if data_format == "NXC" else Y
    expected = np.broadcast_to(B[2:4].reshape(2, 1, 1), (2, 9, 11))
    assert_identical(np.ascontiguousarray(y[1, 2:4]), np.ascontiguousarray(expected))
    check_group(Y, X, scale, B, 3, data_format)


def plant(X, data_format, n, c, value):
    """``value`` at one element of (n, c) (NCX terms)."""
    ncx = np.moveaxis(X, -1, 1) if data_format == "NXC" else X
    ncx[(n, c) + (1,) * (X.ndim - 2)] = value


PATH_SHAPES = {"fused": ((2, 6, 20, 20), None), "split": ((2, 6, 10, 10), "parallel"),
               "short": ((2, 6, 5, 5), "serial")}


@pytest.mark.parametrize("data_format", LAYOUTS)
@pytest.mark.parametrize("dtype", FLOATS, ids=FLOAT_IDS)
@pytest.mark.parametrize("where", list(PATH_SHAPES))
def test_nan_stays_in_its_group(rng, where, dtype, data_format):
    """NaN in (n=1, c=2) makes the group (1, 1) of channels 2 and 3 NaN, nothing else;
    +Inf in (0, 5) makes group (0, 2) NaN (inf - inf)."""
    ncx_shape, path = PATH_SHAPES[where]
    X = group_data(rng, ncx_shape, dtype, data_format)
    scale, B = affine(rng, 6, dtype)
    plant(X, data_format, 1, 2, np.nan)
    plant(X, data_format, 0, 5, np.inf)
    Y = gn_spec.group_normalization(X, scale, B, num_groups=3, data_format=data_format,
                                    engine=ENGINE, path=path)
    nan = np.isnan(Y.astype(F64))
    nan_ncx = np.moveaxis(nan, -1, 1) if data_format == "NXC" else nan
    assert nan_ncx[1, 2:4].all() and nan_ncx[0, 4:6].all()
    assert nan.sum() == nan_ncx[1, 2:4].size + nan_ncx[0, 4:6].size
    check_group(Y, X, scale, B, 3, data_format)
    if dtype != F64:
        _, mean, var = gn_spec.group_norm(X, scale.astype(F32), B.astype(F32), groups=3,
                                          data_format=data_format, engine=ENGINE, path=path)
        assert np.isnan(mean[1, 1]) and np.isnan(var[1, 1]) and np.isnan(var[0, 2])
        assert mean[0, 2] == np.inf
        assert np.isfinite(np.delete(mean.ravel(), [2, 4])).all()
        assert np.isfinite(np.delete(var.ravel(), [2, 4])).all()


# --- 6. paths ----------------------------------------------------------------------------


@pytest.fixture
def routes_taken(monkeypatch):
    taken = []
    monkeypatch.setattr(policy, "_trace", taken.append)
    monkeypatch.setattr(policy, "ASLEEP_SERIAL_FACTOR", 0)
    monkeypatch.setattr(threads, "_forked_from_openmp", False)
    return taken


# name -> ((N, C, *spatial) NCX terms, groups, data_format, path, policy patch, routes)
ROUTE_CASES = {
    **{f"fused-{p}": ((4, 6, 24, 24), 3, "NCX", p, {}, {f"instance_planes/fused/{p}"})
       for p in ("serial", "parallel", "streaming")},
    "fused-short-serial": ((2, 6, 5, 5), 3, "NCX", "serial", {},
                           {"instance_planes/fused-short/serial"}),
    "fused-short-parallel": ((16, 48, 5, 5), 2, "NCX", "parallel", {},
                             {"instance_planes/fused-short/parallel"}),
    "split-small-groups": ((2, 6, 10, 10), 3, "NCX", "parallel", {},
                           {"instance_planes/split", "scale_shift/planes/parallel"}),
    "split-streaming": ((2, 6, 24, 24), 3, "NCX", "streaming", {"FUSED_MAX_PLANE_BYTES": 0},
                        {"instance_planes/split", "scale_shift/planes/streaming"}),
    "rows-serial": ((3, 8, 9, 11), 4, "NXC", "serial", {}, {"instance_rows/one-launch/serial"}),
    "rows-parallel": ((3, 8, 9, 11), 4, "NXC", "parallel", {},
                      {"instance_rows/one-launch/parallel"}),
    "rows-per-sample": ((3, 8, 9, 11), 4, "NXC", "streaming", {"SAMPLE_CALL_MIN_ELEMENTS": 1},
                        {"instance_rows/per-sample"}),
}


@pytest.mark.parametrize("dtype", FLOATS, ids=FLOAT_IDS)
@pytest.mark.parametrize("name", list(ROUTE_CASES))
def test_route_matches_oracle(rng, monkeypatch, routes_taken, name, dtype):
    ncx_shape, G, fmt, path, patch, routes = ROUTE_CASES[name]
    for attr, value in patch.items():
        assert hasattr(policy, attr), attr
        monkeypatch.setattr(policy, attr, value)
    X = group_data(rng, ncx_shape, dtype, fmt)
    scale, B = affine(rng, ncx_shape[1], dtype)
    before = X.copy()
    Y = gn_spec.group_normalization(X, scale, B, num_groups=G, data_format=fmt, engine=ENGINE,
                                    path=path)
    assert routes <= set(routes_taken), f"took {sorted(set(routes_taken))}"
    assert set(routes_taken) <= set(policy.ROUTES)
    assert_identical(X, before)
    check_group(Y, X, scale, B, G, fmt)
    # the same route without fusing Y's statistics into the kernels' output: oneDNN's
    # statistics outputs and dst
    if dtype != F64:
        p32 = [v.astype(F32) for v in (scale, B)]
        dst, mean, var = gn_spec.group_norm(X, *p32, groups=G, data_format=fmt, engine=ENGINE,
                                            path=path)
        check_group(dst, X, *p32, G, fmt)
        check_group_stats(X, G, fmt, mean, var, F32)


def run_paths(monkeypatch, X, scale, B, G, fmt, runs):
    """Y (and oneDNN's mean and variance for 16-bit and float32 X) on each of ``runs``
    ((path, policy patch)), with the routes each took."""
    results = []
    for path, patch in runs:
        taken = []
        monkeypatch.setattr(policy, "_trace", taken.append)
        for attr, value in patch.items():
            monkeypatch.setattr(policy, attr, value)
        Y = gn_spec.group_normalization(X, scale, B, num_groups=G, data_format=fmt,
                                        engine=ENGINE, path=path)
        stats = ()
        if X.dtype != F64:
            stats = gn_spec.group_norm(X, scale.astype(F32), B.astype(F32), groups=G,
                                       data_format=fmt, engine=ENGINE, path=path)[1:]
        results.append((Y, stats, set(taken)))
        monkeypatch.undo()
    return results


NCX_RUNS = [("serial", {}), ("parallel", {"FUSED_MAX_PLANE_BYTES": BIG}),
            ("streaming", {"FUSED_MAX_PLANE_BYTES": BIG}),
            ("parallel", {"FUSED_MAX_PLANE_BYTES": 0}),
            ("streaming", {"FUSED_MAX_PLANE_BYTES": 0})]
NXC_RUNS = [("serial", {}), ("parallel", {}), ("streaming", {}),
            ("streaming", {"SAMPLE_CALL_MIN_ELEMENTS": 1}),
            ("parallel", {"SAMPLE_CALL_MIN_ELEMENTS": 1})]


@pytest.mark.parametrize("dtype", FLOATS, ids=FLOAT_IDS)
@pytest.mark.parametrize("ncx_shape,G,fmt", [
    ((2, 6, 61, 67), 3, "NCX"), ((2, 6, 5, 7), 2, "NCX"), ((16, 48, 5, 5), 2, "NCX"),
    ((1, 4, 300000), 2, "NCX"), ((3, 8, 9, 11), 4, "NXC"), ((2, 12, 40, 50), 3, "NXC")])
def test_paths_are_bitwise_identical(rng, monkeypatch, dtype, ncx_shape, G, fmt):
    """Fused (serial, parallel, streaming) and split NCX groups, and the NXC rows loops
    (one launch, a call per sample) give the same Y and statistics, bit for bit: the
    statistics' order depends on the shape only, so the choice among the paths, which
    depends on the thread count, changes nothing."""
    X = group_data(rng, ncx_shape, dtype, fmt)
    scale, B = affine(rng, ncx_shape[1], dtype)
    results = run_paths(monkeypatch, X, scale, B, G, fmt,
                        NCX_RUNS if fmt == "NCX" else NXC_RUNS)
    check_group(results[0][0], X, scale, B, G, fmt)
    routes = set().union(*(r[2] for r in results))
    if fmt == "NCX":  # the runs took a fused and a split route
        assert "instance_planes/split" in routes and any("fused" in r for r in routes), routes
    else:
        assert {"instance_rows/per-sample", "instance_rows/one-launch/serial",
                "instance_rows/one-launch/parallel"} <= routes, routes
    for Y, stats, _ in results[1:]:
        assert_identical(Y, results[0][0])
        for got, want in zip(stats, results[0][1], strict=True):
            assert_identical(got, want)


@pytest.mark.parametrize("ncx_shape,G,fmt", [
    ((2, 16, 100, 100), 4, "NCX"), ((1, 4, 300000), 2, "NCX"), ((2, 16, 100, 100), 8, "NXC"),
    ((1, 640, 32, 32), 32, "NXC")])
def test_thread_count_independence(rng, ncx_shape, G, fmt):
    X = group_data(rng, ncx_shape, F32, fmt)
    scale, B = affine(rng, ncx_shape[1], F32)
    before = numba.get_num_threads()
    try:
        numba.set_num_threads(1)
        one = nk.group_norm(X, scale, B, groups=G, data_format=fmt)
        numba.set_num_threads(numba.config.NUMBA_NUM_THREADS)
        many = nk.group_norm(X, scale, B, groups=G, data_format=fmt)
    finally:
        numba.set_num_threads(before)
    for a, b in zip(one, many, strict=True):
        assert_identical(a, b)


def test_concurrent_calls_give_the_same_bits(rng):
    """Four threads at once (the kernels release the GIL) on different inputs and
    operators: each result as computed alone."""
    calls = []
    for fmt in LAYOUTS:
        X = group_data(rng, (2, 8, 48, 48), F32, fmt)
        s, b = affine(rng, 8, F32)
        calls.append(lambda X=X, s=s, b=b, fmt=fmt: nk.group_normalization(
            X, s, b, num_groups=4, data_format=fmt))
        calls.append(lambda X=X, s=s, b=b, fmt=fmt: nk.group_norm(
            X, s, b, groups=2, data_format=fmt)[0])
    M = group_data(rng, (4, 8, 40, 40), F32)
    calls.append(lambda: nk.mean_variance_normalization(M))
    calls.append(lambda: nk.mean_variance_normalization(M, axes=(1, 3)))
    alone = [call() for call in calls]
    with ThreadPoolExecutor(4) as pool:
        together = list(pool.map(lambda i: calls[i % len(calls)](), range(4 * len(calls))))
    for i, Y in enumerate(together):
        assert_identical(Y, alone[i % len(calls)])


# --- 7. the twin -------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", FLOATS, ids=FLOAT_IDS)
@pytest.mark.parametrize("loop", ["fused", "split", "rows"])
def test_twin_normalize_is_bitwise_given_kernel_statistics(rng, monkeypatch, loop, dtype):
    """The twin's normalize (folding per group, scale and B per channel) from the
    kernels' statistics gives the kernels' Y bit for bit; the statistics are the
    oracle's within the stated accuracy."""
    N, C, G = 2, 6, 3
    Cg = C // G
    if loop == "rows":
        X = group_data(rng, (N, C, 9, 11), dtype, "NXC")
        fmt = "NXC"
    else:
        X = group_data(rng, (N, C, 24, 24), dtype)
        fmt = "NCX"
        if loop == "split":
            monkeypatch.setattr(policy, "FUSED_MAX_PLANE_BYTES", 0)
    scale, B = affine(rng, C, dtype)
    Y, twin = np.empty_like(X), np.empty_like(X)
    if loop == "rows":
        mean, m2 = ENGINE.instance_rows(X, Y, N, C, scale, B, EPS, "parallel", group=Cg)
        reference.normalize_rows(X, twin, N, C, scale, B, EPS, mean, m2, group=Cg)
    else:
        S = 24 * 24
        mean, m2 = ENGINE.instance_planes(X, Y, C, S, scale, B, EPS, "parallel", group=Cg)
        reference.normalize_planes(X, twin, C, S, scale, B, EPS, mean, m2, group=Cg)
    assert_identical(Y, twin)
    check_group(Y, X, scale, B, G, fmt)
    count = X.size // (N * G)
    check_group_stats(X, G, fmt, mean.reshape(N, G), (m2 / count).reshape(N, G), F64)


@pytest.mark.parametrize("data_format", LAYOUTS)
@pytest.mark.parametrize("dtype", FLOATS, ids=FLOAT_IDS)
def test_dyadic_data_kernel_and_twin_agree_bitwise(rng, dtype, data_format):
    """Exact statistics (groups of 128 multiples of 1/4): kernel and twin, bit for bit."""
    X = dyadic(rng, to_layout((3, 8, 8, 8), data_format), dtype)
    scale, B = affine(rng, 8, dtype)
    Y = nk.group_normalization(X, scale, B, num_groups=4, data_format=data_format)
    assert_identical(Y, reference.group_normalization(X, scale, B, num_groups=4,
                                                      data_format=data_format))
    check_group(Y, X, scale, B, 4, data_format)
    if dtype != F64:
        g = [v.astype(F32) for v in (scale, B)]
        for a, b in zip(nk.group_norm(X, *g, groups=4, data_format=data_format),
                        reference.group_norm(X, *g, groups=4, data_format=data_format),
                        strict=True):
            assert_identical(a, b)


# --- 8. arguments -------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", FLOATS, ids=FLOAT_IDS)
def test_stash_type_accepted_values_change_nothing(rng, dtype):
    X = group_data(rng, (2, 6, 9, 11), dtype)
    scale, B = affine(rng, 6, dtype)
    default = nk.group_normalization(X, scale, B, num_groups=3)
    for stash in STASH_TYPES:
        assert_identical(nk.group_normalization(X, scale, B, num_groups=3, stash_type=stash),
                         default)
    assert_identical(nk.group_normalization(X, scale, B, num_groups=3,
                                            stash_type=np.int64(11)), default)


@pytest.mark.parametrize("stash,error", [(0, ValueError), (2, ValueError), (13, ValueError),
                                         (-1, ValueError), (1.0, TypeError), ("1", TypeError),
                                         (True, TypeError)])
def test_stash_type_rejected(stash, error):
    X = np.zeros((2, 4, 3), F32)
    with pytest.raises(error, match="stash_type"):
        nk.group_normalization(X, np.ones(4, F32), np.zeros(4, F32), num_groups=2,
                               stash_type=stash)


def test_stash_type_is_not_an_opset_18_attribute():
    X = np.zeros((2, 4, 3), F32)
    with pytest.raises(TypeError, match="GroupNormalization-18 has no attribute 'stash_type'"):
        nk.group_normalization(X, np.ones(2, F32), np.zeros(2, F32), num_groups=2, opset=18,
                               stash_type=1)


@pytest.mark.parametrize("groups,error,match", [
    (4, ValueError, r"num_groups must divide the number of channels C = 6 \(1 <= num_groups "
                    r"<= C and C % num_groups == 0\), got 4"),
    (12, ValueError, "num_groups must divide the number of channels C = 6"),
    (0, ValueError, "num_groups must divide"),
    (-3, ValueError, "num_groups must divide"),
    (2.0, TypeError, "num_groups must be an integer, got float"),
    (True, TypeError, "num_groups must be an integer, got bool"),
    ("3", TypeError, "num_groups must be an integer"),
    (None, TypeError, "num_groups must be an integer"),
])
def test_bad_num_groups(groups, error, match):
    X = np.zeros((2, 6, 3), F32)
    with pytest.raises(error, match=match):
        nk.group_normalization(X, np.ones(6, F32), np.zeros(6, F32), num_groups=groups)


def test_bad_groups_of_group_norm():
    X = np.zeros((2, 3, 6), F32)
    with pytest.raises(ValueError, match="groups must divide the number of channels C = 6"):
        nk.group_norm(X, np.ones(6, F32), np.zeros(6, F32), groups=4)
    with pytest.raises(TypeError, match="groups must be an integer"):
        nk.group_norm(X, np.ones(6, F32), np.zeros(6, F32), groups=np.float32(2))


def test_numpy_integer_num_groups(rng):
    X = group_data(rng, (2, 6, 9), F32)
    scale, B = affine(rng, 6, F32)
    assert_identical(nk.group_normalization(X, scale, B, num_groups=np.int32(3)),
                     nk.group_normalization(X, scale, B, num_groups=3))


@pytest.mark.parametrize("opset,shape,match", [
    (21, (3,), r"scale must have shape \(6,\) to match the 6 channels"),
    (21, (6, 1), r"scale must have shape \(6,\)"),
    (18, (6,), r"scale must have shape \(3,\), one value per group"),
    (18, (1,), r"scale must have shape \(3,\)"),
])
def test_wrong_scale_shape(opset, shape, match):
    X = np.zeros((2, 6, 4), F32)
    B = np.zeros(6 if opset == 21 else 3, F32)
    with pytest.raises(ValueError, match=match):
        nk.group_normalization(X, np.ones(shape, F32), B, num_groups=3, opset=opset)
    with pytest.raises(ValueError, match=match.replace("scale", "bias")):
        nk.group_normalization(X, B + 1, np.zeros(shape, F32), num_groups=3, opset=opset)


def test_dtype_errors():
    X = np.zeros((2, 6, 4), F32)
    with pytest.raises(TypeError, match="share type T"):
        nk.group_normalization(X, np.ones(6, F64), np.zeros(6, F64), num_groups=3)
    with pytest.raises(TypeError, match="share type T"):
        nk.group_normalization(X.astype(BF16), np.ones(6, BF16), np.zeros(6, F32),
                               num_groups=3)
    with pytest.raises(TypeError, match="X has dtype int32"):
        nk.group_normalization(X.astype(np.int32), np.ones(6, np.int32),
                               np.zeros(6, np.int32), num_groups=3)


def test_rank_layout_and_epsilon_errors():
    with pytest.raises(ValueError, match="at least 2 dimensions"):
        nk.group_normalization(np.zeros(6, F32), np.ones(1, F32), np.zeros(1, F32),
                               num_groups=1)
    X = np.zeros((2, 6, 4), F32)
    with pytest.raises(ValueError, match="data_format"):
        nk.group_normalization(X, np.ones(6, F32), np.zeros(6, F32), num_groups=3,
                               data_format="NHWC")
    with pytest.raises(ValueError, match="epsilon"):
        nk.group_normalization(X, np.ones(6, F32), np.zeros(6, F32), num_groups=3,
                               epsilon=float("nan"))


def test_zero_size():
    scale, B = np.ones(4, F32), np.zeros(4, F32)
    for fmt, shape in [("NCX", (0, 4, 3, 3)), ("NXC", (0, 3, 3, 4))]:
        Y = nk.group_normalization(np.zeros(shape, F32), scale, B, num_groups=2,
                                   data_format=fmt)
        assert Y.shape == shape and Y.dtype == F32
        out = np.empty(shape, F32)
        assert nk.group_normalization(np.zeros(shape, F32), scale, B, num_groups=2,
                                      data_format=fmt, out=out) is out
    for fmt, shape in [("NCX", (2, 4, 0, 3)), ("NXC", (2, 0, 3, 4)), ("NCX", (2, 4, 0))]:
        with pytest.raises(ValueError, match="zero-size spatial extent"):
            nk.group_normalization(np.zeros(shape, F32), scale, B, num_groups=2,
                                   data_format=fmt)


@pytest.mark.parametrize("data_format", LAYOUTS)
def test_out_and_in_place(rng, data_format):
    X = group_data(rng, (2, 6, 40, 40), F32, data_format)
    scale, B = affine(rng, 6, F32)
    expected = nk.group_normalization(X, scale, B, num_groups=3, data_format=data_format)
    out = np.empty_like(X)
    assert nk.group_normalization(X, scale, B, num_groups=3, data_format=data_format,
                                  out=out) is out
    assert_identical(out, expected)
    strided = np.empty((2, *X.shape[1:-1], 2 * X.shape[-1]), F32)[..., ::2]
    assert nk.group_normalization(X, scale, B, num_groups=3, data_format=data_format,
                                  out=strided) is strided
    assert_identical(np.ascontiguousarray(strided), expected)
    assert nk.group_normalization(X, scale, B, num_groups=3, data_format=data_format,
                                  out=X) is X
    assert_identical(X, expected)


def test_in_place_on_a_strided_view(rng):
    base = group_data(rng, (2, 12, 10, 10), F64)
    X = base[:, ::2]
    scale, B = affine(rng, 6, F64)
    expected = nk.group_normalization(X.copy(), scale, B, num_groups=2)
    untouched = base[:, 1::2].copy()
    assert nk.group_normalization(X, scale, B, num_groups=2, out=X) is X
    assert_identical(np.ascontiguousarray(X), expected)
    assert_identical(base[:, 1::2], untouched)


def test_out_errors():
    X = np.zeros((2, 6, 4), F32)
    scale, B = np.ones(6, F32), np.zeros(6, F32)
    with pytest.raises(ValueError, match="out must have the shape and dtype of X"):
        nk.group_normalization(X, scale, B, num_groups=3, out=np.empty((2, 6, 5), F32))
    with pytest.raises(ValueError, match="out must have the shape and dtype of X"):
        nk.group_normalization(X, scale, B, num_groups=3, out=np.empty((2, 6, 4), F64))
    readonly = np.empty_like(X)
    readonly.flags.writeable = False
    with pytest.raises(ValueError, match="out is read-only"):
        nk.group_normalization(X, scale, B, num_groups=3, out=readonly)
    base = np.zeros((2, 6, 5), F32)
    with pytest.raises(ValueError, match="overlaps X without being X itself"):
        nk.group_normalization(base[:, :, :4], scale, B, num_groups=3, out=base[:, :, 1:])
    with pytest.raises(TypeError, match=r"out must be a numpy\.ndarray"):
        nk.group_normalization(X, scale, B, num_groups=3, out=X.tolist())
    X2 = np.zeros((1, 6), F32)
    with pytest.raises(ValueError, match="out shares memory with scale"):
        nk.group_normalization(X2, scale, B, num_groups=3, out=scale.reshape(1, 6))
    with pytest.raises(ValueError, match="out shares memory with gamma"):
        nk.group_norm(np.zeros((1, 1, 6), F32), scale, B, groups=3,
                      out=scale.reshape(1, 1, 6))


# --- 9. MeanVarianceNormalization ---------------------------------------------------------


def mvn_data(rng, shape, dtype, offset=3.0):
    """X whose mean and spread differ along every axis, so every reduced group (any
    axes) has its own statistics."""
    X = rng.standard_normal(shape)
    for axis, n in enumerate(shape):
        bshape = [1] * len(shape)
        bshape[axis] = n
        X = X * rng.uniform(0.7, 1.4, bshape) + rng.uniform(-offset, offset, bshape)
    return X.astype(dtype)


AXES_4D = [axes for k in range(5) for axes in itertools.combinations(range(4), k)]


@pytest.mark.parametrize("axes", AXES_4D, ids=lambda a: "axes" + "".join(map(str, a)))
def test_mvn_matches_oracle(rng, axes):
    """Every subset of the axes of a 4-D X (none: every axis), every dtype."""
    for dtype in FLOATS:
        X = mvn_data(rng, (3, 4, 5, 6), dtype)
        before = X.copy()
        Y = nk.mean_variance_normalization(X, axes=axes)
        _, tol = check_mvn(Y, X, axes)
        assert_identical(X, before)
        twin = reference.mean_variance_normalization(X, axes=axes)
        check_mvn(twin, X, axes)
        close_to_each_other(Y, twin, tol, "kernel vs twin")


MVN_CASES = [
    ((7,), (0,)), ((7,), ()), ((7,), (-1,)), ((1,), ()), ((5, 3), (0,)), ((5, 3), (1,)),
    ((5, 3), (-2, -1)), ((2, 3, 5), (0, 2)), ((2, 3, 5), (1,)),
    ((2, 3, 4, 5, 6), (0, 2, 3)),  # the default on 5-D: kept axes 1 and 4 (a copy)
    ((2, 3, 4, 5, 6), (1, 3)), ((2, 3, 4, 5, 6), (2, 3, 4)), ((3, 5, 61, 67), (0, 2, 3)),
    ((2, 2000, 3), (1,)), ((3, 8, 33, 35), (1, 3)), ((40, 3, 7, 7), (0, 2, 3)),
]


@pytest.mark.parametrize("shape,axes", MVN_CASES,
                         ids=[f"{len(s)}d-axes{''.join(map(str, a))}" for s, a in MVN_CASES])
def test_mvn_ranks_and_axes(rng, shape, axes):
    for dtype in FLOATS:
        X = mvn_data(rng, shape, dtype)
        Y = nk.mean_variance_normalization(X, axes=axes)
        check_mvn(Y, X, axes)
        check_mvn(reference.mean_variance_normalization(X, axes=axes), X, axes)


def test_mvn_default_axes_and_their_spellings(rng):
    X = mvn_data(rng, (3, 4, 5, 6), F32)
    Y = nk.mean_variance_normalization(X)
    check_mvn(Y, X, (0, 2, 3))
    for axes in [(0, 2, 3), [3, 0, 2], (-4, -2, -1), np.array([0, 2, 3])]:
        assert_identical(nk.mean_variance_normalization(X, axes=axes), Y)
    for opset in (9, 13, 18):
        assert_identical(nk.mean_variance_normalization(X, opset=opset), Y)
    # every axis: an empty list or all of them
    assert_identical(nk.mean_variance_normalization(X, axes=()),
                     nk.mean_variance_normalization(X, axes=(0, 1, 2, 3)))


@pytest.mark.parametrize("dtype", FLOATS, ids=FLOAT_IDS)
@pytest.mark.parametrize("axes", [(0, 2, 3), (1,), (1, 3), (0, 2)])
def test_mvn_paths_are_bitwise_identical(rng, dtype, axes):
    X = mvn_data(rng, (4, 8, 33, 35), dtype)
    results = [mvn_spec.mean_variance_normalization(X, axes=axes, engine=ENGINE, path=p)
               for p in ("serial", "parallel", "streaming")]
    check_mvn(results[0], X, axes)
    for Y in results[1:]:
        assert_identical(Y, results[0])


@pytest.mark.parametrize("dtype", FLOATS, ids=FLOAT_IDS)
@pytest.mark.parametrize("axes", [(0, 2, 3), (1,), (1, 3), (2, 3)])
def test_mvn_dyadic_kernel_and_twin_agree_bitwise(rng, dtype, axes):
    """Exact statistics (power-of-two groups of multiples of 1/4, per-channel moments
    merged from two planes: a merge of three weighs by 1/3, inexactly): the same
    bits."""
    X = dyadic(rng, (2, 8, 8, 8), dtype)
    Y = nk.mean_variance_normalization(X, axes=axes)
    assert_identical(Y, reference.mean_variance_normalization(X, axes=axes))
    check_mvn(Y, X, axes)


@pytest.mark.parametrize("dtype", FLOATS, ids=FLOAT_IDS)
@pytest.mark.parametrize("axes", [(0, 2, 3), (2, 3), (1, 3)])
def test_mvn_constant_group_gives_zero(rng, dtype, axes):
    """A constant group (a non-dyadic value): std 0, y = 0 / (0 + 1e-9) = 0 exactly
    (onnxruntime's kernel gives NaN); the other groups normal."""
    X = mvn_data(rng, (3, 4, 5, 6), dtype)
    if axes == (0, 2, 3):
        X[:, 1] = np.asarray(0.1, dtype)
        sel = (slice(None), 1)
    elif axes == (2, 3):
        X[2, 1] = np.asarray(-7.3, dtype)
        sel = (2, 1)
    else:
        X[:, :, 2] = np.asarray(0.3, dtype)  # the groups (n, h=2) over axes 1 and 3
        sel = (slice(None), slice(None), 2)
    Y = nk.mean_variance_normalization(X, axes=axes)
    assert np.all(Y[sel].astype(F64) == 0)
    keep = np.ones(X.shape, bool)
    keep[sel] = False
    exact, mean, var = mean_variance_norm(X, axes)
    tol = mvn_tolerance(X, mean, var, dtype)
    assert_close(Y[keep], exact[keep], tol[keep])


@pytest.mark.parametrize("dtype", FLOATS, ids=FLOAT_IDS)
def test_twin_constant_groups(rng, dtype):
    """The twin keeps the operators' exact results on constant groups: Y = B for group
    normalization, 0 for MVN, as the kernels give them."""
    X = mvn_data(rng, (3, 4, 5, 6), dtype)
    X[2, 1] = np.asarray(-7.3, dtype)
    assert np.all(reference.mean_variance_normalization(X, axes=(2, 3))[2, 1] == 0)
    X[1, 2:4] = np.asarray(0.1, dtype)  # group (1, 1) of 2 groups
    scale, B = affine(rng, 4, dtype)
    for fn in (nk.group_normalization, reference.group_normalization):
        Y = fn(X, scale, B, num_groups=2)
        assert_identical(np.ascontiguousarray(Y[1, 2:4]),
                         np.ascontiguousarray(np.broadcast_to(B[2:4, None, None], (2, 5, 6))))


@pytest.mark.parametrize("dtype", FLOATS, ids=FLOAT_IDS)
@pytest.mark.parametrize("axes", [(0, 2, 3), (1, 3)])
def test_mvn_nan_stays_in_its_group(rng, dtype, axes):
    X = mvn_data(rng, (3, 4, 5, 6), dtype)
    X[1, 2, 3, 4] = np.nan
    Y = nk.mean_variance_normalization(X, axes=axes)
    nan = np.isnan(Y.astype(F64))
    group = (slice(None), 2) if axes == (0, 2, 3) else (1, slice(None), 3)
    assert nan[group].all() and nan.sum() == nan[group].size
    check_mvn(Y, X, axes)


@pytest.mark.parametrize("dtype", [F32, F64], ids=["float32", "float64"])
@pytest.mark.parametrize("shape,axes", [((3, 4, 64, 64), (0, 2, 3)), ((3, 4, 64, 64), (1, 3)),
                                        ((2, 3, 7, 7), (2, 3)), ((4, 70001), (1,))])
def test_mvn_large_mean(rng, dtype, shape, axes):
    X = random_tensor(rng, shape, dtype, mean=1e4)
    Y = nk.mean_variance_normalization(X, axes=axes)
    check_mvn(Y, X, axes)


@pytest.mark.parametrize("layout", ["strided", "reversed", "transposed"])
@pytest.mark.parametrize("axes", [(0, 2, 3), (1, 3)])
def test_mvn_any_strides_and_out(rng, layout, axes):
    if layout == "strided":
        X = mvn_data(rng, (3, 8, 10, 12), F32)[:, ::2, :, ::2]
    elif layout == "reversed":
        X = mvn_data(rng, (3, 4, 10, 6), F32)[::-1, :, ::-1]
    else:
        X = mvn_data(rng, (3, 6, 10, 4), F32).transpose(0, 3, 2, 1)
    Y = nk.mean_variance_normalization(X, axes=axes)
    check_mvn(Y, X, axes)
    out = np.empty_like(X)
    assert nk.mean_variance_normalization(X, axes=axes, out=out) is out
    assert_identical(out, Y)
    X2 = X.copy()
    assert nk.mean_variance_normalization(X2, axes=axes, out=X2) is X2
    assert_identical(X2, Y)


def test_mvn_in_place_and_out_errors(rng):
    X = mvn_data(rng, (3, 4, 10, 6), F32)
    for axes in [(0, 2, 3), (1, 3), ()]:
        expected = nk.mean_variance_normalization(X, axes=axes)
        Z = X.copy()
        assert nk.mean_variance_normalization(Z, axes=axes, out=Z) is Z
        assert_identical(Z, expected)
    with pytest.raises(ValueError, match="out must have the shape and dtype of X"):
        nk.mean_variance_normalization(X, out=np.empty(X.shape, F64))
    readonly = np.empty_like(X)
    readonly.flags.writeable = False
    with pytest.raises(ValueError, match="out is read-only"):
        nk.mean_variance_normalization(X, out=readonly)
    base = np.zeros((3, 4, 10, 7), F32)
    with pytest.raises(ValueError, match="overlaps X"):
        nk.mean_variance_normalization(base[..., :6], out=base[..., 1:])


@pytest.mark.parametrize("axes,error,match", [
    ((4,), ValueError, r"axis 4 of axes \(4,\) is out of range for a 4-D X \(each axis must "
                       r"be in \[-4, 3\]\)"),
    ((-5,), ValueError, "axis -5 of axes"),
    ((0, 0), ValueError, r"axes \(0, 0\) name an axis twice"),
    ((1, -3), ValueError, "name an axis twice"),
    ((1.0,), TypeError, "axes must be integers"),
    ((True,), TypeError, "axes must be integers"),
    (1, TypeError, "axes must be a sequence of integers"),
    ("023", TypeError, "axes must be a sequence of integers"),
])
def test_mvn_bad_axes(axes, error, match):
    with pytest.raises(error, match=match):
        nk.mean_variance_normalization(np.zeros((2, 3, 4, 5), F32), axes=axes)


def test_mvn_default_axes_need_4_dimensions():
    with pytest.raises(ValueError, match=r"axis 3 of axes \(0, 2, 3\) is out of range for a 3-D X"):
        nk.mean_variance_normalization(np.zeros((2, 3, 4), F32))


def test_mvn_types_and_opsets():
    X = np.ones((2, 3, 4, 5), BF16)
    with pytest.raises(TypeError, match="MeanVarianceNormalization-9: X has dtype bfloat16"):
        nk.mean_variance_normalization(X, opset=9)
    with pytest.raises(TypeError, match="MeanVarianceNormalization-9: X has dtype bfloat16"):
        nk.mean_variance_normalization(X, opset=12)
    assert nk.mean_variance_normalization(X, opset=13).dtype == BF16
    with pytest.raises(ValueError, match="no version at or below opset 8"):
        nk.mean_variance_normalization(X.astype(F32), opset=8)
    with pytest.raises(TypeError, match="X has dtype int32"):
        nk.mean_variance_normalization(np.ones((2, 3, 4, 5), np.int32))
    with pytest.raises(ValueError, match="at least one dimension"):
        nk.mean_variance_normalization(np.float32(1.0), axes=())


def test_mvn_zero_size():
    for shape in [(0, 3, 4, 5), (2, 3, 0, 5)]:
        Y = nk.mean_variance_normalization(np.zeros(shape, F32))
        assert Y.shape == shape and Y.dtype == F32


# --- 10. onnxruntime --------------------------------------------------------------------


def ort_run(node, opset, feeds):
    ort = pytest.importorskip("onnxruntime", reason="onnxruntime not installed")
    from onnx import TensorProto, helper

    inputs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in feeds]
    graph = helper.make_graph([node], "g", inputs,
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    # no onnx.checker: it rejects GroupNormalization-18 (deprecated), which onnxruntime
    # still runs; onnxruntime 1.31 rejects IR version 14 models
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)],
                              ir_version=10)
    options = ort.SessionOptions()
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    session = ort.InferenceSession(model.SerializeToString(), options,
                                   providers=["CPUExecutionProvider"])
    return session.run(None, feeds)[0]


@pytest.mark.parametrize("opset", [18, 21])
@pytest.mark.parametrize("ncx_shape,G", [((2, 6, 5, 7), 3), ((3, 8, 16), 2), ((2, 4, 9, 9), 4)])
def test_group_normalization_agrees_with_onnxruntime(rng, opset, ncx_shape, G):
    """onnxruntime expands the function body (one-pass variance in float32, less
    accurate): mean-0 data and a 1e-4 tolerance."""
    pytest.importorskip("onnx")
    from onnx import helper

    X = group_data(rng, ncx_shape, F32, offset=0.5)
    scale, B = affine(rng, G if opset == 18 else ncx_shape[1], F32)
    node = helper.make_node("GroupNormalization", ["x", "s", "b"], ["y"], num_groups=G,
                            epsilon=1e-5)
    theirs = ort_run(node, opset, {"x": X, "s": scale, "b": B})
    ours = nk.group_normalization(X, scale, B, num_groups=G, opset=opset)
    np.testing.assert_allclose(ours, theirs, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("axes", [(0, 2, 3), (2, 3), (1,), (1, 3), (0, 1, 2, 3), (-1,)])
def test_mvn_agrees_with_onnxruntime(rng, axes):
    """No constant groups: onnxruntime's kernel adds no epsilon (NaN there)."""
    pytest.importorskip("onnx")
    from onnx import helper

    X = mvn_data(rng, (3, 4, 6, 7), F32)
    node = helper.make_node("MeanVarianceNormalization", ["x"], ["y"], axes=list(axes))
    theirs = ort_run(node, 13, {"x": X})
    np.testing.assert_allclose(nk.mean_variance_normalization(X, axes=axes), theirs,
                               rtol=1e-4, atol=1e-4)

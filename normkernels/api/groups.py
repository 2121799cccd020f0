"""Normalizations over groups of channels, over axes, along one axis and over a
window of channels: ONNX GroupNormalization, onnxruntime's GroupNorm and SkipGroupNorm
(com.microsoft), MeanVarianceNormalization, LpNormalization and LRN."""

from normkernels.engine.numba_engine import ENGINE
from normkernels.ops import group_normalization as _gn
from normkernels.ops import lp_normalization as _lp
from normkernels.ops import lrn as _lrn
from normkernels.ops import mean_variance_normalization as _mvn
from normkernels.ops import ort_group_norm as _ort


def group_normalization(X, scale, bias, *, num_groups, epsilon=None, stash_type=None, opset=21,
                        data_format="NCX", activation=None, add=None, out=None):
    """ONNX GroupNormalization with the semantics of ``opset`` (18 or 21).

    The C channels split into ``num_groups`` consecutive groups of ``C / num_groups``;
    ``Y = (X - mean) / sqrt(var + epsilon) * scale + bias`` with the mean and population
    variance of every (n, group) over its channels and all spatial positions.

    Parameters
    ----------
    X : ndarray
        N x C x D1 ... Dn (``data_format="NCX"``, ONNX's layout; at least 2-D) or
        N x D1 ... Dn x C (``"NXC"``, channels last, as fast). float16, bfloat16,
        float32 or float64; any strides.
    scale, bias : ndarray
        X's dtype. Opset 21: shape (C,), one value per channel. Opset 18: shape
        (num_groups,), one value per group (the deprecated version's semantics, which
        onnxruntime and the ONNX ReferenceEvaluator still run).
    num_groups : int
        Required; must divide C (a ValueError otherwise).
    epsilon : float, optional
        Default 1e-5.
    stash_type : int, optional
        Opset 21: 1 (default), 10, 11 or 16, the values the function body accepts; any
        other is a ValueError. normkernels computes at least as precisely as each asks
        (see Notes), so the value changes no result.
    opset : int
        The model's opset; the version used is the highest at or below it.
    data_format : {"NCX", "NXC"}
        Where the channels are: axis 1 (ONNX's layout, the default) or the last axis
        (channels last).
    activation : str, optional
        An epilogue applied to Y in the same pass, before its one rounding (a package
        extension, not an ONNX attribute): None (default), "relu", "silu", "gelu_tanh" or
        "gelu" (PyTorch's definitions; the error bound in the user
        guide's "Diffusion models and fused epilogues" page, ``docs/guide/epilogues.md``).
    add : ndarray, optional
        A residual of X's shape and dtype added to the affine result before the
        activation, in the same pass (oneDNN's norm-add-relu; a package extension):
        ``Y = act(normalized * scale + B + add)``. May be ``out``.
    out : ndarray, optional
        Where to write Y (X's shape and dtype); may be X itself.

    Returns
    -------
    ndarray
        X's shape, dtype and memory order (``out`` when given).

    Raises
    ------
    TypeError
        A dtype other than the four floats, scale or bias not of X's dtype.
    ValueError
        X of fewer than 2 dimensions, ``num_groups`` not a divisor of C, scale or bias
        of another shape than the opset's, an unknown ``stash_type``, ``data_format`` or
        ``activation``, ``out`` not of X's shape and dtype.

    Notes
    -----
    Statistics are float64 (16-bit X: float32 runs joined in float64), centred (the
    function body's ``E[x^2] - E[x]^2`` loses every digit when ``|mean| / std`` is 1e4),
    in an order that depends only on the shape, so Y is bitwise the same for any thread
    count. The normalized value is scaled and shifted before its one rounding to X's
    dtype (the body rounds it to T first). NCX groups that fit in cache are normalized
    right after their statistics, so X is read from memory once.

    Examples
    --------
    >>> X = np.arange(16, dtype=np.float32).reshape(1, 4, 4)  # N x C x D, 2 groups
    >>> scale, bias = np.ones(4, np.float32), np.zeros(4, np.float32)
    >>> Y = normkernels.group_normalization(X, scale, bias, num_groups=2)
    >>> np.round(Y[0, :2], 4)  # the first group: channels 0 and 1
    array([[-1.5275, -1.0911, -0.6547, -0.2182],
           [ 0.2182,  0.6547,  1.0911,  1.5275]], dtype=float32)
    >>> G = X.reshape(1, 2, 8)
    >>> Z = (G - G.mean(-1, keepdims=True)) / np.sqrt(G.var(-1, keepdims=True) + 1e-5)
    >>> np.allclose(Y, Z.reshape(X.shape))
    True
    """
    return _gn.group_normalization(X, scale, bias, num_groups=num_groups, epsilon=epsilon,
                                   stash_type=stash_type, opset=opset, data_format=data_format,
                                   activation=activation, add=add, out=out, engine=ENGINE)


def mean_variance_normalization(X, *, axes=(0, 2, 3), opset=13, out=None):
    """ONNX MeanVarianceNormalization with the semantics of ``opset`` (9 or 13).

    ``Y = (X - mean) / (sqrt(var) + 1e-9)`` with the mean and population variance over
    ``axes``; the 1e-9 is the function body's constant, added to the standard
    deviation (there is no epsilon attribute), so a constant group gives 0 (where
    onnxruntime's kernel, which adds nothing, gives NaN).

    Parameters
    ----------
    X : ndarray
        Any rank. float16, float32, float64, and bfloat16 from opset 13; any strides.
    axes : sequence of int
        Default (0, 2, 3) (per channel of NCHW). Each in [-r, r-1], none twice (a
        ValueError otherwise, as ReduceMean has it; onnxruntime drops out-of-range
        axes); an empty sequence reduces every axis.
    opset : int
        The model's opset; the version used is the highest at or below it.
    out : ndarray, optional
        Where to write Y (X's shape and dtype); may be X itself.

    Returns
    -------
    ndarray
        X's shape and dtype (``out`` when given).

    Raises
    ------
    TypeError
        A dtype the opset does not allow.
    ValueError
        An axis out of range or named twice, ``out`` not of X's shape and dtype.

    Notes
    -----
    The body computes ``E[x^2] - E[x]^2`` (negative when it cancels, then NaN) and
    type-checks only for float32. Here the variance is centred and float64 (the
    package's moments kernels), ``1 / (std + 1e-9)`` is float64, and the normalize
    runs in float32 (float64 for float64 X), rounded once to X's dtype, for every T.
    Kept axes that are consecutive run in place; others through a transposed copy.

    Examples
    --------
    >>> X = np.arange(12, dtype=np.float32).reshape(1, 3, 2, 2)  # NCHW
    >>> Y = normkernels.mean_variance_normalization(X)  # per channel
    >>> np.round(Y[0, 0], 4)
    array([[-1.3416, -0.4472],
           [ 0.4472,  1.3416]], dtype=float32)
    >>> axes = (0, 2, 3)
    >>> mu, std = X.mean(axes, keepdims=True), X.std(axes, keepdims=True)
    >>> np.allclose(Y, (X - mu) / (std + 1e-9))
    True
    """
    return _mvn.mean_variance_normalization(X, axes=axes, opset=opset, out=out, engine=ENGINE)


def lp_normalization(input, *, axis=-1, p=2, opset=22, out=None):
    """ONNX LpNormalization with the semantics of ``opset`` (1 or 22).

    ``output = input / ||input||_p`` along ``axis``: ``||x||_1 = sum |x|``, ``||x||_2 =
    sqrt(sum x**2)``.

    Parameters
    ----------
    input : ndarray
        Any rank >= 1. float16, float32, float64, and bfloat16 from opset 22; any
        strides (a layout that is not a permutation of C-contiguous is copied first).
    axis : int
        The normalized axis, in ``[-input.ndim, input.ndim)``; default the last.
    p : int
        1 or 2 (the only orders the schema supports; anything else is a ValueError).
    opset : int
        The model's opset; the version used is the highest at or below it.
    out : ndarray, optional
        Where to write the output (input's shape and dtype); may be ``input`` itself,
        and may overlap it (input is then copied first).

    Returns
    -------
    ndarray
        The input's shape and dtype, in its memory order (``out`` when given).

    Raises
    ------
    TypeError
        A dtype the opset does not allow.
    ValueError
        ``axis`` out of range, ``p`` not 1 or 2, ``out`` not of input's shape and
        dtype.

    Notes
    -----
    p = 1 sums absolute values, as the formula says; the ONNX reference implementation
    (``onnx.reference``, before onnx/onnx PR #8427) sums ``x ** p`` without them and
    gets vectors with negative entries wrong ([1, -3] gives [-0.5, 1.5] there, [0.25,
    -0.75] here and in onnxruntime).

    A vector whose elements are all zero has norm 0 and gives zeros (each keeps its
    sign), as the spec text says since onnx/onnx PR #7618; onnxruntime and torch's
    ``F.normalize`` agree on exact zeros, but torch divides by ``max(norm, 1e-12)``
    while the spec, and normkernels, divide by the true norm however small.

    The norm is accumulated in float64 for every dtype and ``y`` computed in float64
    and rounded once to the input's dtype. For float64 input a sum of squares that
    overflows or underflows (a finite nonzero vector: [1e200, 1e200], subnormal
    values) is recomputed from the vector scaled by a power of two, as hypot does, so
    such vectors normalize to full precision. A NaN gives NaN in its own vector only;
    an infinite element gives the formula's IEEE result (``x / inf``).

    Examples
    --------
    >>> x = np.array([[3, 4], [1, -3]], np.float32)
    >>> normkernels.lp_normalization(x)
    array([[ 0.6   ,  0.8   ],
           [ 0.3162, -0.9487]], dtype=float32)
    >>> normkernels.lp_normalization(x, p=1)
    array([[ 0.4286,  0.5714],
           [ 0.25  , -0.75  ]], dtype=float32)
    >>> y = np.empty_like(x)
    >>> normkernels.lp_normalization(x, out=y) is y
    True
    """
    return _lp.lp_normalization(input, axis=axis, p=p, opset=opset, out=out, engine=ENGINE)


def lrn(X, *, size, alpha=1e-4, beta=0.75, bias=1.0, opset=13, data_format="NCX", out=None):
    """ONNX LRN (local response normalization) with the semantics of ``opset`` (1 or 13).

    ``Y[n, c, d] = X[n, c, d] / (bias + alpha / size * square_sum[n, c, d]) ** beta``,
    ``square_sum`` the sum of ``X[n, i, d] ** 2`` over the channels ``max(0, c - (size -
    1) // 2) <= i <= min(C - 1, c + size // 2)``.

    Parameters
    ----------
    X : ndarray
        N x C x D1 ... Dk (``data_format="NCX"``, ONNX's layout) or N x D1 ... Dk x C
        (``"NXC"``, channels last, a normkernels extension). At least 2-D: the schema
        states no rank rule and the formula holds for k = 0 (onnxruntime and the ONNX
        reference run 4-D only). float16, float32, float64, and bfloat16 from opset
        13; any strides.
    size : int
        Required: the number of channels summed over, a positive integer, odd or even
        (even: one channel more above c than below, as the formula gives; torch's
        window is mirrored there). alpha is divided by ``size`` even at the edges,
        where the window holds fewer channels (the missing ones count as zeros).
    alpha, beta, bias : float
        Finite; defaults 1e-4, 0.75 and 1.0 (the schema's).
    opset : int
        The model's opset; the version used is the highest at or below it.
    data_format : {"NCX", "NXC"}
        Where the channels are: axis 1 (the default) or the last axis.
    out : ndarray, optional
        Where to write Y (X's shape and dtype); may be X itself, and may overlap it
        (X is then copied first).

    Returns
    -------
    ndarray
        X's shape, dtype and memory order (``out`` when given).

    Raises
    ------
    TypeError
        A dtype the opset does not allow.
    ValueError
        X of fewer than 2 dimensions, ``size`` not a positive integer, a non-finite
        alpha, beta or bias, an unknown ``data_format``, ``out`` not of X's shape and
        dtype.

    Notes
    -----
    Computed in float64 for every dtype (squares of float32 numbers are exact there)
    and rounded once to X's dtype. Each window is summed directly, never as a running
    sum (which cancels when a large channel leaves it). ``base ** beta`` is the C
    library's ``pow``; for float32 and 16-bit X with ``beta == 0.75`` it is
    ``sqrt(base) * sqrt(sqrt(base))``, within 2 float64 ulps of it. A base of zero or
    below gives what IEEE arithmetic gives (inf or NaN), and so do float64 squares
    beyond float64's range (``|x|`` above about 1e154: the base is infinite, Y zero).

    Examples
    --------
    >>> X = np.arange(1, 9, dtype=np.float32).reshape(1, 4, 2)  # N x C x D
    >>> Y = normkernels.lrn(X, size=3, alpha=0.1)
    >>> np.round(Y[0, 0], 4)
    array([0.8059, 1.3635], dtype=float32)
    >>> sq = np.pad(X**2, ((0, 0), (1, 1), (0, 0)))  # zeros beyond the edges
    >>> square_sum = sq[:, :-2] + sq[:, 1:-1] + sq[:, 2:]
    >>> np.allclose(Y, X / (1.0 + 0.1 / 3 * square_sum) ** 0.75)
    True
    """
    return _lrn.lrn(X, size=size, alpha=alpha, beta=beta, bias=bias, opset=opset,
                    data_format=data_format, out=out, engine=ENGINE)


def ort_group_norm(X, gamma, beta, *, groups, activation, epsilon=1e-5, channels_last=1,
                   out=None):
    """onnxruntime's GroupNorm (com.microsoft, version 1): group normalization with an
    optional SiLU, channels last by default. onnxruntime runs it on CUDA, ROCm and
    DirectML only; this is a CPU implementation.

    ``Y = act(gamma[c] * (X - mean) / sqrt(var + epsilon) + beta[c])`` with the mean and
    population variance of each (n, group of ``C / groups`` channels) over the group's
    channels and all spatial positions; ``act`` is SiLU (``y * sigmoid(y)``) when
    ``activation`` is 1, none when 0, applied before Y's one rounding.

    Parameters
    ----------
    X : ndarray
        (N, H, W, C) with ``channels_last=1`` (the default), (N, C, H, W) with 0; any
        rank from 3 (the schema's is 4). float16 or float32 (the schema), bfloat16 or
        float64 too; any strides.
    gamma, beta : ndarray
        Shape (C,), one dtype for both (the schema's M: float16 or float32; any float
        dtype here), which may differ from X's.
    groups : int
        Required; must divide C.
    activation : int
        Required: 0 (none) or 1 (SiLU).
    epsilon : float
        Default 1e-5.
    channels_last : int
        1 (default) or 0.
    out : ndarray, optional
        Where to write Y (X's shape and dtype); may be X itself.

    Returns
    -------
    ndarray
        X's shape and dtype (``out`` when given).

    Raises
    ------
    TypeError
        A dtype other than the four floats, gamma and beta not of one dtype.
    ValueError
        X of fewer than 3 dimensions, ``groups`` not a divisor of C, gamma or beta not
        of shape (C,), ``activation`` or ``channels_last`` not 0 or 1, ``out`` not of
        X's shape and dtype.

    Examples
    --------
    >>> X = np.arange(16, dtype=np.float32).reshape(1, 2, 2, 4)  # N x H x W x C
    >>> gamma, beta = np.ones(4, np.float32), np.zeros(4, np.float32)
    >>> Y = normkernels.ort_group_norm(X, gamma, beta, groups=2, activation=1)
    >>> GN = normkernels.group_normalization(X, gamma, beta, num_groups=2,
    ...                                      data_format="NXC")
    >>> np.allclose(Y, GN / (1 + np.exp(-GN)))  # SiLU
    True
    """
    return _ort.ort_group_norm(X, gamma, beta, groups=groups, activation=activation,
                               epsilon=epsilon, channels_last=channels_last, out=out,
                               engine=ENGINE)


def ort_skip_group_norm(X, gamma, beta, skip, bias=None, *, groups, activation, epsilon=1e-5,
                        channels_last=1, num_outputs=1, out=None):
    """onnxruntime's SkipGroupNorm (com.microsoft, version 1): ``S = X + skip + bias``,
    then :func:`ort_group_norm` of S.

    Parameters
    ----------
    X, gamma, beta, groups, activation, epsilon, channels_last, out
        As :func:`ort_group_norm`.
    skip : ndarray
        X's dtype; X's shape, or one value per (sample, channel): (N, 1, 1, C) or (N, C)
        for channels last, (N, C, 1, 1) or (N, C) for channels first.
    bias : ndarray, optional
        X's dtype, shape (C,).
    num_outputs : int
        1 (default): Y; 2: ``(Y, S)``.

    Returns
    -------
    ndarray or tuple
        Y, or ``(Y, S)``: S (a new C-contiguous array of X's shape and dtype) is ``(X +
        skip) + bias`` rounded once to X's dtype, and Y is the normalization of S as
        returned (as the package's SkipLayerNormalization).

    Raises
    ------
    TypeError, ValueError
        As :func:`ort_group_norm`; also skip or bias of another shape or dtype, and
        ``num_outputs`` not 1 or 2.

    Examples
    --------
    >>> X = np.arange(16, dtype=np.float32).reshape(1, 2, 2, 4)  # N x H x W x C
    >>> gamma, beta = np.ones(4, np.float32), np.zeros(4, np.float32)
    >>> skip = np.array([[1, 1, 2, 2]], np.float32)  # (N, C)
    >>> Y, S = normkernels.ort_skip_group_norm(X, gamma, beta, skip, groups=2,
    ...                                        activation=0, num_outputs=2)
    >>> S[0, 0]
    array([[1., 2., 4., 5.],
           [5., 6., 8., 9.]], dtype=float32)
    >>> np.allclose(Y, normkernels.ort_group_norm(S, gamma, beta, groups=2, activation=0))
    True
    """
    return _ort.ort_skip_group_norm(X, gamma, beta, skip, bias, groups=groups,
                                    activation=activation, epsilon=epsilon,
                                    channels_last=channels_last, num_outputs=num_outputs,
                                    out=out, engine=ENGINE)

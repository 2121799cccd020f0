"""The public operators: NumPy arrays in, NumPy arrays out, Numba kernels inside."""

from normkernels.engine.numba_engine import ENGINE
from normkernels.ops import backward as _bwd
from normkernels.ops import batch_norm_inference as _bni
from normkernels.ops import batch_normalization as _bn
from normkernels.ops import group_normalization as _gn
from normkernels.ops import instance_normalization as _in
from normkernels.ops import layer_norm as _dnnl_rows
from normkernels.ops import layer_normalization as _ln
from normkernels.ops import lp_normalization as _lp
from normkernels.ops import lrn as _lrn
from normkernels.ops import mean_variance_normalization as _mvn
from normkernels.ops import moments as _moments
from normkernels.ops import onednn_training as _dnnl_train
from normkernels.ops import rms_normalization as _rms
from normkernels.ops import skip_layer_normalization as _skip


def batch_normalization(X, scale, B, input_mean, input_var, *, epsilon=None, momentum=None,
                        training_mode=None, is_test=None, spatial=None, consumed_inputs=None,
                        num_outputs=None, saved_var="variance", opset=15, data_format="NCX",
                        out=None):
    """ONNX BatchNormalization with the semantics of ``opset``.

    Inference: ``Y = (X - input_mean) / sqrt(input_var + epsilon) * scale + B`` per
    channel. Training: the same with the batch mean and population variance of X, and
    ``running = input * momentum + batch * (1 - momentum)`` (ONNX's convention:
    ``momentum`` weighs the old value, the opposite of PyTorch's).

    Parameters
    ----------
    X : ndarray
        N x C x D1 ... Dn (``data_format="NCX"``, ONNX's layout), N x D1 ... Dn x C
        (``"NXC"``), or 1-D of size N (C = 1). float16, bfloat16 (opset >= 14),
        float32 or float64; any strides.
    scale, B, input_mean, input_var : ndarray
        Shape (C,). Opset 15: scale/B share one float dtype (T1), mean/var another
        (T2), each independent of X. Opset 14: scale/B have X's dtype. Opsets 1-9:
        everything has X's dtype.
    epsilon, momentum, training_mode, is_test, spatial, consumed_inputs
        ONNX attributes; ``None`` means the opset's schema default. Passing an
        attribute the opset does not have is a TypeError, and so is leaving out
        ``consumed_inputs`` at opsets 1-5 (the schema requires it; its value is
        accepted and ignored).
    num_outputs : int, optional
        Opsets 1-9: how many outputs the node has (1 to 5: Y, mean, var, saved_mean,
        saved_var); in opsets 7 and 9 it selects the mode (1 = inference).
    saved_var : {"variance", "inv_std"}
        Opsets 1-9 training: saved_var as the spec words it (the batch variance), or
        onnxruntime's 1 / sqrt(var + epsilon).
    opset : int
        The model's opset; the version used is the highest at or below it.
    out : ndarray, optional
        Where to write Y (X's shape and dtype); may be X itself.

    Returns
    -------
    Y : ndarray, or a tuple
        Y has X's shape, dtype and memory order (``out`` when given). Training returns
        ``(Y, running_mean, running_var)`` in opsets 14/15 and the first
        ``num_outputs`` of ``(Y, mean, var, saved_mean, saved_var)`` in opsets 1-9;
        statistics have input_mean's dtype and are new arrays.

    Notes
    -----
    Arithmetic is float32 (float64 for float64 X); float16/bfloat16 results are
    rounded once from it. Parameters are folded to ``a = scale / sqrt(var + eps)``
    in float64 and rounded once to the compute dtype, as are mean and B. Batch
    statistics are computed in one read of X (float64 sums; for 16-bit X float32 runs
    joined in float64), in an order independent of the thread count. ``spatial=0``
    (opsets 1, 6, 7) normalizes each activation over N: parameters then have the
    shape of one sample, ``X.shape[1:]`` (opsets 1/6 also accept (C,), broadcast),
    and so do the statistics returned.
    """
    return _bn.batch_normalization(
        X, scale, B, input_mean, input_var, epsilon=epsilon, momentum=momentum,
        training_mode=training_mode, is_test=is_test, spatial=spatial,
        consumed_inputs=consumed_inputs, num_outputs=num_outputs, saved_var=saved_var,
        opset=opset, data_format=data_format, out=out, engine=ENGINE)


def batch_norm_inference(input, gamma, beta, mean, variance, *, epsilon, data_format="NXC",
                         out=None):
    """oneDNN Graph BatchNormInference-1.

    ``output = (input - mean) / sqrt(variance + epsilon) * gamma + beta`` per channel.

    Parameters
    ----------
    input : ndarray
        At least 2-D; channels last (``data_format="NXC"``, the default) or at axis 1
        (``"NCX"``). float32, float16 or bfloat16.
    gamma, beta, mean, variance : ndarray
        Shape (C,), one dtype: float32, or bfloat16 when ``input`` is bfloat16.
    epsilon : float
        Required, finite and positive.
    out : ndarray, optional
        Where to write the output; may be ``input`` itself.
    """
    return _bni.batch_norm_inference(input, gamma, beta, mean, variance, epsilon=epsilon,
                                     data_format=data_format, out=out, engine=ENGINE)


def instance_normalization(input, scale, B, *, epsilon=None, consumed_inputs=None, opset=22,
                           data_format="NCX", out=None):
    """ONNX InstanceNormalization with the semantics of ``opset`` (1, 6 or 22).

    ``y = scale * (x - mean) / sqrt(var + epsilon) + B`` with the mean and population
    variance of every (n, c) over the spatial axes.

    Parameters
    ----------
    input : ndarray
        N x C x D1 ... Dn (``data_format="NCX"``, ONNX's layout; opset 1: exactly
        4-D) or N x D1 ... Dn x C (``"NXC"``, channels last). float16, float32,
        float64, and bfloat16 from opset 22; any strides.
    scale, B : ndarray
        Shape (C,), the dtype of ``input``.
    epsilon : float, optional
        Default 1e-5 (the schema's).
    consumed_inputs : optional
        Opset 1's legacy attribute: accepted and ignored; a TypeError in later opsets.
    opset : int
        The model's opset; the version used is the highest at or below it.
    out : ndarray, optional
        Where to write the output (input's shape and dtype); may be ``input`` itself.

    Returns
    -------
    ndarray
        The input's shape, dtype and memory order (``out`` when given).

    Notes
    -----
    Statistics are accumulated in float64 (16-bit input: float32 runs joined in
    float64; the ONNX reference accumulates float16 in float16 and overflows on large
    planes), in an order that
    does not depend on the thread count. Each plane is normalized right after its
    statistics while it is still in cache (NCX), so X is read from memory about once.
    """
    return _in.instance_normalization(input, scale, B, epsilon=epsilon,
                                      consumed_inputs=consumed_inputs, opset=opset,
                                      data_format=data_format, out=out, engine=ENGINE)


def moments(X, *, data_format="NCX"):
    """Per-channel mean and population variance of X.

    Channels are axis 1 (``"NCX"``) or the last axis (``"NXC"``); a 1-D X is one
    channel. One read of X, float64 accumulation (16-bit X: float32 runs joined in
    float64, variance within 1e-6 relative), bitwise the same for any thread count.
    Returns float64 arrays for float32/float64 X, float32 for float16/bfloat16.
    """
    return _moments.moments(X, data_format=data_format, engine=ENGINE)


def partial_moments(X, *, data_format="NCX"):
    """Mergeable per-channel statistics of X: ``Moments(count, mean, M2)`` (int64,
    float64, float64 arrays of shape (C,); M2 = sum of squared deviations). Combine
    partials of chunks or micro-batches with :func:`merge_moments`; the variance is
    ``M2 / count``. An empty X gives count 0 (the identity of the merge)."""
    return _moments.partial_statistics(X, data_format, ENGINE)


def merge_moments(a, b):
    """Merge two partials from :func:`partial_moments` (Chan's formula): the
    statistics of the concatenation, without a second pass over the data."""
    return _moments.merge(a, b)


def layer_normalization(X, Scale, B=None, *, axis=-1, epsilon=1e-5, stash_type=1,
                        num_outputs=1, opset=17, out=None):
    """ONNX LayerNormalization-17.

    Per row (the axes ``axis, ..., X.ndim - 1``): ``Y = (X - mean) / sqrt(var +
    epsilon) * Scale + B`` with the mean and population variance of the row.

    Parameters
    ----------
    X : ndarray
        Any rank >= 1; float16, bfloat16, float32 or float64; any strides (rows that
        are contiguous are read in place, others copied first).
    Scale, B : ndarray
        X's dtype; broadcast unidirectionally to X (typically ``X.shape[axis:]``; B is
        optional).
    axis : int
        The first normalized axis, in ``[-X.ndim, X.ndim)``.
    epsilon : float
    stash_type : int
        The dtype of Mean and InvStdDev: 1 (float32), 16 (bfloat16), or 11 (float64, a
        normkernels extension).
    num_outputs : int
        1: Y; 2: (Y, Mean); 3: (Y, Mean, InvStdDev).
    out : ndarray, optional
        Where to write Y (X's shape and dtype); may be X itself.

    Returns
    -------
    Y, or a tuple with ``Mean`` and ``InvStdDev`` of shape ``X.shape[:axis] + (1,) *
    (X.ndim - axis)`` in the stash type.

    Notes
    -----
    Statistics are float64 by two passes over each row while it is in cache (the
    function body's ``E[x^2] - E[x]^2`` in float32 returns NaN or digits of noise for
    rows like 4e4 + [0, 1, 2, 3]); X is read from memory once. Y is computed in float32
    (float64 for float64 X) and rounded once; for 16-bit X that skips the body's
    rounding of the normalized value to X's type before Scale and B.
    """
    return _ln.layer_normalization(X, Scale, B, axis=axis, epsilon=epsilon,
                                   stash_type=stash_type, num_outputs=num_outputs, opset=opset,
                                   out=out, engine=ENGINE)


def rms_normalization(X, scale, *, axis=-1, epsilon=1e-5, stash_type=1, opset=23, out=None):
    """ONNX RMSNormalization-23.

    Per row (the axes ``axis, ...``): ``Y = X / sqrt(mean(X**2) + epsilon) * scale``.

    Parameters
    ----------
    X : ndarray
        Any rank >= 1; float16, bfloat16, float32 or float64 (T).
    scale : ndarray
        Any of the four float dtypes (V); broadcasts unidirectionally to X.
    stash_type : int
        1, 10, 11 or 16 (the body's legal values): checked, with no effect on the
        result: the mean square is always accumulated in float64.
    out : ndarray, optional
        Where to write Y (X's shape, scale's dtype).

    Returns
    -------
    Y of X's shape and scale's dtype (the schema's V). With T != V (which onnxruntime
    rejects) ``normalized * scale`` is computed in the wider dtype and rounded once.
    """
    return _rms.rms_normalization(X, scale, axis=axis, epsilon=epsilon, stash_type=stash_type,
                                  opset=opset, out=out, engine=ENGINE)


def simplified_layer_normalization(X, scale, *, axis=-1, epsilon=1e-5, stash_type=1,
                                   num_outputs=1, out=None):
    """onnxruntime's SimplifiedLayerNormalization (default domain, version 1): RMS
    normalization as :func:`rms_normalization`, with ``num_outputs=2`` also returning
    ``inv_std_var = 1 / sqrt(mean(X**2) + epsilon)`` of shape ``X.shape[:axis] + (1,
    ...)`` in float32 (``stash_type=1``) or float64 (11)."""
    return _rms.simplified_layer_normalization(X, scale, axis=axis, epsilon=epsilon,
                                               stash_type=stash_type, num_outputs=num_outputs,
                                               out=out, engine=ENGINE)


def skip_layer_normalization(input, skip, gamma, beta=None, bias=None, *, epsilon=1e-12,
                             num_outputs=1, out=None):
    """onnxruntime's SkipLayerNormalization (com.microsoft): layer normalization over the
    last axis of ``s = input + skip (+ bias)``, fused in one pass.

    Parameters
    ----------
    input : ndarray
        (batch, seq, hidden) or (tokens, hidden); float16, bfloat16, float32 or float64.
    skip : ndarray
        input's shape, or (1, seq, hidden) or (seq, hidden) (repeated over the batch).
    gamma, beta, bias : ndarray
        (hidden,), input's dtype; beta and bias optional (bias is added before the
        normalization).
    num_outputs : int
        1 to 4: output, mean, inv_std_var (float32, ``input.shape[:-1] + (1,)``),
        input_skip_bias_sum (``s`` in input's dtype).
    out : ndarray, optional
        Where to write output; may be ``input``.

    ``s`` is rounded to input's dtype before it is normalized, so ``output`` is the
    layer normalization of ``input_skip_bias_sum``.
    """
    return _skip.skip_layer_normalization(input, skip, gamma, beta, bias, epsilon=epsilon,
                                          num_outputs=num_outputs, out=out, engine=ENGINE)


def skip_simplified_layer_normalization(input, skip, gamma, bias=None, *, epsilon=1e-12,
                                        num_outputs=1, out=None):
    """onnxruntime's SkipSimplifiedLayerNormalization (com.microsoft): RMS normalization
    of ``s = input + skip (+ bias)`` over the last axis, times gamma. Arguments and
    outputs as :func:`skip_layer_normalization` (no beta); the ``mean`` output is zeros,
    as onnxruntime returns it."""
    return _skip.skip_simplified_layer_normalization(input, skip, gamma, bias,
                                                     epsilon=epsilon, num_outputs=num_outputs,
                                                     out=out, engine=ENGINE)


def layer_norm(src, gamma=None, beta=None, *, begin_norm_axis=-1, epsilon=1e-5,
               keep_stats=True, use_affine=True, out=None):
    """oneDNN Graph LayerNorm-1.

    ``dst = gamma * (src - mean) / sqrt(variance + epsilon) + beta`` over the axes
    ``begin_norm_axis, ...``. src is float32, bfloat16 or float16; gamma and beta
    (required with ``use_affine``, forbidden without) have the normalized shape and
    dtype float32 (or bfloat16 for bfloat16 src). Returns dst, or with ``keep_stats``
    (the default) ``(dst, mean, variance)``: statistics of shape
    ``src.shape[:begin_norm_axis]`` in gamma's dtype (float32 without gamma); the
    variance is the population variance, without epsilon.
    """
    return _dnnl_rows.layer_norm(src, gamma, beta, begin_norm_axis=begin_norm_axis,
                                 epsilon=epsilon, keep_stats=keep_stats,
                                 use_affine=use_affine, out=out, engine=ENGINE)


def rms_norm(src, gamma=None, *, begin_norm_axis=-1, epsilon=1e-5, out=None):
    """oneDNN Graph RMSNorm-1: ``dst = gamma * src / sqrt(mean(src**2) + epsilon)`` over
    the axes ``begin_norm_axis, ...``; gamma optional, broadcastable to src (float32;
    bfloat16 for bfloat16 src, float16 for float16 src). dst has src's dtype."""
    return _dnnl_rows.rms_norm(src, gamma, begin_norm_axis=begin_norm_axis, epsilon=epsilon,
                               out=out, engine=ENGINE)


def group_normalization(X, scale, bias, *, num_groups, epsilon=None, stash_type=None, opset=21,
                        data_format="NCX", out=None):
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
    out : ndarray, optional
        Where to write Y (X's shape and dtype); may be X itself.

    Returns
    -------
    ndarray
        X's shape, dtype and memory order (``out`` when given).

    Notes
    -----
    Statistics are float64 (16-bit X: float32 runs joined in float64), centred (the
    function body's ``E[x^2] - E[x]^2`` loses every digit when |mean| / std is 1e4),
    in an order that depends only on the shape, so Y is bitwise the same for any thread
    count. The normalized value is scaled and shifted before its one rounding to X's
    dtype (the body rounds it to T first). NCX groups that fit in cache are normalized
    right after their statistics, so X is read from memory once.
    """
    return _gn.group_normalization(X, scale, bias, num_groups=num_groups, epsilon=epsilon,
                                   stash_type=stash_type, opset=opset, data_format=data_format,
                                   out=out, engine=ENGINE)


def group_norm(src, gamma=None, beta=None, *, groups, epsilon=1e-5, keep_stats=True,
               use_affine=True, data_format="NXC", out=None):
    """oneDNN Graph GroupNorm-1.

    ``dst = gamma * (src - mean) / sqrt(variance + epsilon) + beta`` per (n, group) of
    ``C / groups`` consecutive channels, over the group's channels and all spatial
    positions.

    Parameters
    ----------
    src : ndarray
        At least 3-D: N x D1 ... Dn x C (``data_format="NXC"``, oneDNN's default) or
        N x C x D1 ... Dn (``"NCX"``). float32, bfloat16 or float16.
    gamma, beta : ndarray, optional
        Shape (C,): float32 (or bfloat16 for bfloat16 src). Both required when
        ``use_affine`` (the default), neither allowed otherwise.
    groups : int
        Required; must divide C.
    epsilon : float
        Default 1e-5.
    keep_stats : bool
        Also return the statistics (the default).
    out : ndarray, optional
        Where to write dst (src's shape and dtype); may be src itself.

    Returns
    -------
    ndarray, or (dst, mean, variance)
        ``mean`` and ``variance`` (population, not its inverse square root) have shape
        (N, groups) and gamma's dtype (float32 without gamma).
    """
    return _gn.group_norm(src, gamma, beta, groups=groups, epsilon=epsilon,
                          keep_stats=keep_stats, use_affine=use_affine, data_format=data_format,
                          out=out, engine=ENGINE)


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

    Notes
    -----
    The body computes ``E[x^2] - E[x]^2`` (negative when it cancels, then NaN) and
    type-checks only for float32. Here the variance is centred and float64 (the
    package's moments kernels), ``1 / (std + 1e-9)`` is float64, and the normalize
    runs in float32 (float64 for float64 X), rounded once to X's dtype, for every T.
    Kept axes that are consecutive run in place; others through a transposed copy.
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
    out : ndarray, optional
        Where to write Y (X's shape and dtype); may be X itself, and may overlap it
        (X is then copied first).

    Returns
    -------
    ndarray
        X's shape, dtype and memory order (``out`` when given).

    Notes
    -----
    Computed in float64 for every dtype (squares of float32 numbers are exact there)
    and rounded once to X's dtype. Each window is summed directly, never as a running
    sum (which cancels when a large channel leaves it). ``base ** beta`` is the C
    library's ``pow``; for float32 and 16-bit X with ``beta == 0.75`` it is
    ``sqrt(base) * sqrt(sqrt(base))``, within 2 float64 ulps of it. A base of zero or
    below gives what IEEE arithmetic gives (inf or NaN), and so do float64 squares
    beyond float64's range (|x| above about 1e154: the base is infinite, Y zero).
    """
    return _lrn.lrn(X, size=size, alpha=alpha, beta=beta, bias=bias, opset=opset,
                    data_format=data_format, out=out, engine=ENGINE)


def batch_normalization_backward(dY, X, scale, mean, var=None, *, inv_std=None, epsilon=1e-5,
                                 training=True, data_format="NCX", out=None):
    """The gradient of BatchNormalization: ``(dX, dscale, dB)``.

    Training (``training=True``): ``mean`` and ``var`` are the batch mean and
    population variance the forward normalized with (``dX`` includes their dependence
    on X). Inference (``training=False``): the running statistics, constants, so ``dX =
    dY * scale / sqrt(var + epsilon)``.

    Parameters
    ----------
    dY, X : ndarray
        One shape and float dtype (f16, bf16, f32, f64); N x C x D1 ... Dn
        (``data_format="NCX"``), N x D1 ... Dn x C (``"NXC"``) or 1-D (C = 1); any
        strides (dY is read in X's memory order).
    scale, mean : ndarray
        Shape (C,), any float dtype.
    var : ndarray, optional
        Shape (C,): with ``epsilon``, ``r = 1 / sqrt(var + epsilon)`` (oneDNN's and
        PyTorch's eval-mode convention).
    inv_std : ndarray, optional
        Shape (C,): ``r`` itself (PyTorch's ``save_invstd``, onnxruntime's saved inverse
        standard deviation). Exactly one of ``var`` and ``inv_std``.
    out : ndarray, optional
        Where to write dX (X's shape and dtype); may be dY or X itself.

    Returns
    -------
    dX : ndarray
        X's shape, dtype and memory order.
    dscale, dB : ndarray
        Shape (C,), scale's dtype: ``sum(dY * x_hat)`` and ``sum(dY)`` per channel.

    Notes
    -----
    One reduction over (X, dY) gives every channel's ``sum(dY)`` and ``sum(dY * (x -
    mean))`` in float64, in an order that depends only on the shape (bitwise the same
    for any thread count); one pass writes ``dX = dY * A + (x - mean) * B + K`` in
    float32 (float64 for float64 X), rounded once.
    """
    return _bwd.batch_normalization_backward(dY, X, scale, mean, var, inv_std=inv_std,
                                             epsilon=epsilon, training=training,
                                             data_format=data_format, out=out, engine=ENGINE)


def instance_normalization_backward(dY, X, scale, *, epsilon=1e-5, mean=None, inv_std=None,
                                    data_format="NCX", out=None):
    """The gradient of InstanceNormalization: ``(dX, dscale, dB)``.

    The statistics of every (n, c) are recomputed from X (float64, as the forward's)
    unless ``mean`` and ``inv_std`` (``1 / sqrt(var + epsilon)``), shape (N, C), give
    them; ``dX`` includes their dependence on X. Arguments as
    :func:`batch_normalization_backward` (X at least 3-D); ``dscale`` and ``dB`` sum
    over n and the spatial axes, in scale's dtype.
    """
    return _bwd.instance_normalization_backward(dY, X, scale, epsilon=epsilon, mean=mean,
                                                inv_std=inv_std, data_format=data_format,
                                                out=out, engine=ENGINE)


def group_normalization_backward(dY, X, scale, *, num_groups, epsilon=1e-5, mean=None,
                                 inv_std=None, data_format="NCX", out=None):
    """The gradient of GroupNormalization-21 (scale per channel): ``(dX, dscale, dB)``.

    The statistics of every (n, group) are recomputed from X (float64) unless ``mean``
    and ``inv_std`` give them (shape (N, num_groups), as PyTorch's ``mean``/``rstd``;
    oneDNN's variance converts as ``1 / sqrt(variance + epsilon)``); ``dX`` includes
    their dependence on X. Arguments as :func:`batch_normalization_backward` (X at least
    2-D; ``num_groups`` must divide C); ``dscale`` and ``dB`` sum over n and the spatial
    axes, in scale's dtype.
    """
    return _bwd.group_normalization_backward(dY, X, scale, num_groups=num_groups,
                                             epsilon=epsilon, mean=mean, inv_std=inv_std,
                                             data_format=data_format, out=out, engine=ENGINE)


def layer_normalization_backward(dY, X, Scale, *, axis=-1, epsilon=1e-5, stash_type=1,
                                 mean=None, inv_std=None, out=None):
    """The gradient of LayerNormalization: ``(dX, dScale, dB)``.

    Per row (the axes ``axis..``) the mean and variance are recomputed from X (float64,
    two passes while the row is in cache); ``dX = r (g - <g> - x_hat <g x_hat>)`` with
    ``g = dY * Scale`` is evaluated in float64 and rounded once to X's dtype. ``dScale``
    and ``dB`` have Scale's shape and dtype (summed over every row, and over the axes
    Scale is broadcast along). ``stash_type`` is checked as the forward checks it; the
    arithmetic is float64 whatever its value. ``out``: dX's destination, may be dY.

    ``mean`` and ``inv_std``: the forward's Mean and InvStdDev outputs (shape
    ``X.shape[:axis]``, or followed by ones as ONNX gives them; any float dtype), used
    instead of recomputing the statistics (both or neither; ``epsilon`` is then unused).
    """
    return _bwd.layer_normalization_backward(dY, X, Scale, axis=axis, epsilon=epsilon,
                                             stash_type=stash_type, mean=mean, inv_std=inv_std,
                                             out=out, engine=ENGINE)


def rms_normalization_backward(dY, X, scale, *, axis=-1, epsilon=1e-5, inv_std=None, out=None):
    """The gradient of RMSNormalization: ``(dX, dscale)``, ``dX = r (g - x_hat <g
    x_hat>)`` with ``r = 1 / sqrt(mean(x^2) + epsilon)``, ``x_hat = x r``, ``g = dY *
    scale``; ``inv_std`` gives ``r`` per row (onnxruntime's ``inv_std_var``) instead of
    recomputing it; as :func:`layer_normalization_backward` otherwise."""
    return _bwd.rms_normalization_backward(dY, X, scale, axis=axis, epsilon=epsilon,
                                           inv_std=inv_std, out=out, engine=ENGINE)


def batch_norm_forward_training(src, mean, variance, gamma=None, beta=None, *, epsilon,
                                momentum=None, data_format="NXC", out=None):
    """oneDNN Graph BatchNormForwardTraining-1: ``(dst, running_mean, running_variance,
    batch_mean, batch_variance)``.

    ``dst = gamma * (src - batch_mean) / sqrt(batch_variance + epsilon) + beta`` per
    channel, the batch statistics over N and the spatial axes (population variance);
    ``running = momentum * old + (1 - momentum) * batch`` for mean and variance, with
    ``mean`` and ``variance`` the old running statistics. ``momentum=None`` uses 0.5:
    the operation document gives no default and the dnnl backend, its implementation,
    uses 0.5. gamma and beta are optional together (none: 1 and 0).

    Parameters
    ----------
    src : ndarray
        float32, bfloat16 or float16; N x D1 ... Dn x C (``data_format="NXC"``, the
        default) or N x C x D1 ... Dn (``"NCX"``), at least 2-D.
    mean, variance, gamma, beta : ndarray
        Shape (C,), float32 (or bfloat16 for bfloat16 src), one dtype.
    epsilon : float
        Required, positive.
    out : ndarray, optional
        Where to write dst (src's shape and dtype); may be src.

    Returns
    -------
    dst, running_mean, running_variance, batch_mean, batch_variance
        dst like src; the statistics of shape (C,) in mean's dtype.
    """
    return _dnnl_train.batch_norm_forward_training(src, mean, variance, gamma, beta,
                                                   epsilon=epsilon, momentum=momentum,
                                                   data_format=data_format, out=out,
                                                   engine=ENGINE)


def batch_norm_training_backward(src, diff_dst, mean, variance, gamma=None, *, epsilon,
                                 data_format="NXC", out=None):
    """oneDNN Graph BatchNormTrainingBackward-1: ``(diff_src, diff_gamma, diff_beta)``
    when gamma is given, else ``diff_src``.

    The training-mode gradient of BatchNormForwardTraining's dst: ``mean`` and
    ``variance`` are the batch statistics the forward returned, ``epsilon`` the
    forward's (``r = 1 / sqrt(variance + epsilon)``). Without gamma diff_src is computed
    for gamma = 1. Types and layouts as :func:`batch_norm_forward_training`; ``out``
    (diff_src) may be diff_dst or src. Computed as
    :func:`batch_normalization_backward`.
    """
    return _dnnl_train.batch_norm_training_backward(src, diff_dst, mean, variance, gamma,
                                                    epsilon=epsilon, data_format=data_format,
                                                    out=out, engine=ENGINE)


def layer_norm_backward(src, diff_dst, mean, variance, gamma=None, beta=None, *,
                        begin_norm_axis=-1, epsilon=1e-5, use_affine=True, out=None):
    """oneDNN Graph LayerNormBackward-1: ``(diff_src, diff_gamma, diff_beta)`` with
    ``use_affine`` (gamma and beta required; the gradients have gamma's shape and
    dtype), else ``diff_src``.

    ``mean`` and ``variance`` are :func:`layer_norm`'s statistics outputs (shape
    ``src.shape[:begin_norm_axis]``), used as given: ``r = 1 / sqrt(variance +
    epsilon)``. Types as :func:`layer_norm`; ``out`` (diff_src) may be diff_dst or src.
    Computed as :func:`layer_normalization_backward` (float64 per row, rounded once).
    """
    return _dnnl_train.layer_norm_backward(src, diff_dst, mean, variance, gamma, beta,
                                           begin_norm_axis=begin_norm_axis, epsilon=epsilon,
                                           use_affine=use_affine, out=out, engine=ENGINE)

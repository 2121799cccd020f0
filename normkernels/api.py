"""The public operators: NumPy arrays in, NumPy arrays out, Numba kernels inside."""

from normkernels.kernels.dispatch import scale_shift
from normkernels.ops import batch_norm_inference as _bni
from normkernels.ops import batch_normalization as _bn


def batch_normalization(X, scale, B, input_mean, input_var, *, epsilon=None, momentum=None,
                        training_mode=None, is_test=None, spatial=None, consumed_inputs=None,
                        opset=15, data_format="NCX", out=None):
    """ONNX BatchNormalization with the semantics of ``opset``.

    ``Y = (X - input_mean) / sqrt(input_var + epsilon) * scale + B`` per channel.

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
        attribute the opset does not have is a TypeError.
    opset : int
        The model's opset; the version used is the highest at or below it.
    out : ndarray, optional
        Where to write Y (X's shape and dtype); may be X itself.

    Returns
    -------
    Y : ndarray
        X's shape, dtype and memory order (``out`` when given).

    Notes
    -----
    Arithmetic is float32 (float64 for float64 X); float16/bfloat16 results are
    rounded once from it. Parameters are folded to ``a = scale / sqrt(var + eps)``
    in float64 and rounded once to the compute dtype, as are mean and B.
    Training mode, opsets 7 and 9, and ``spatial=0`` raise NotImplementedError
    (the training-mode feature).
    """
    return _bn.batch_normalization(
        X, scale, B, input_mean, input_var, epsilon=epsilon, momentum=momentum,
        training_mode=training_mode, is_test=is_test, spatial=spatial,
        consumed_inputs=consumed_inputs, opset=opset, data_format=data_format, out=out,
        engine=scale_shift)


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
                                     data_format=data_format, out=out, engine=scale_shift)

"""ONNX InstanceNormalization."""

from normkernels.engine.numba_engine import ENGINE
from normkernels.ops import instance_normalization as _in


def instance_normalization(input, scale, B, *, epsilon=None, consumed_inputs=None, opset=22,
                           data_format="NCX", activation=None, add=None, out=None):
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
        Where to write the output (input's shape and dtype); may be ``input`` itself.

    Returns
    -------
    ndarray
        The input's shape, dtype and memory order (``out`` when given).

    Raises
    ------
    TypeError
        A dtype the opset does not allow, scale or B not of input's dtype, an attribute
        the opset does not have.
    ValueError
        input of fewer than 3 dimensions (opset 1: not 4-D), scale or B not of shape
        (C,), a zero-size spatial extent, an unknown ``data_format`` or
        ``activation``, ``out`` not of input's shape and dtype.

    Notes
    -----
    Statistics are accumulated in float64 (16-bit input: float32 runs joined in
    float64; the ONNX reference accumulates float16 in float16 and overflows on large
    planes), in an order that
    does not depend on the thread count. Each plane is normalized right after its
    statistics while it is still in cache (NCX), so X is read from memory about once.

    Examples
    --------
    >>> x = np.arange(12, dtype=np.float32).reshape(1, 3, 4)  # N x C x D
    >>> scale, B = np.array([1, 2, 3], np.float32), np.zeros(3, np.float32)
    >>> y = normkernels.instance_normalization(x, scale, B)
    >>> np.round(y[0], 4)
    array([[-1.3416, -0.4472,  0.4472,  1.3416],
           [-2.6833, -0.8944,  0.8944,  2.6833],
           [-4.0249, -1.3416,  1.3416,  4.0249]], dtype=float32)
    >>> mu, var = x.mean(-1, keepdims=True), x.var(-1, keepdims=True)
    >>> np.allclose(y, scale[:, None] * (x - mu) / np.sqrt(var + 1e-5))
    True
    """
    return _in.instance_normalization(input, scale, B, epsilon=epsilon,
                                      consumed_inputs=consumed_inputs, opset=opset,
                                      data_format=data_format, activation=activation,
                                      add=add, out=out, engine=ENGINE)

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
                                      data_format=data_format, activation=activation,
                                      add=add, out=out, engine=ENGINE)

"""oneDNN Graph BatchNormInference-1 (spec layer).

``epsilon`` is required and positive; ``data_format`` is "NXC" (default, channels
last) or "NCX". T1 (input, output) is f32, f16 or bf16; T2 (gamma, beta, mean,
variance) is f32 or bf16, and bf16 only when T1 is bf16. Input is at least 2-D
(N and C).
"""

from normkernels.ops import common, plans
from normkernels.ops.common import BFLOAT16, FLOAT16, FLOAT32

OP = "BatchNormInference"
T1 = (FLOAT32, FLOAT16, BFLOAT16)
T2 = (FLOAT32, BFLOAT16)
_PARAMS = ("gamma", "beta", "mean", "variance")


def batch_norm_inference(input, gamma, beta, mean, variance, *, epsilon, data_format="NXC",
                         out=None, engine, path=None):
    """Spec layer of :func:`normkernels.batch_norm_inference`."""
    key = given = None
    if path is None:  # a plan of an earlier call with this metadata (see ops/plans.py)
        try:
            key = (OP, engine, epsilon, data_format, type(epsilon), type(data_format),
                   type(input), input.shape, input.strides, input.dtype,
                   type(gamma), gamma.shape, gamma.strides, gamma.dtype,
                   type(beta), beta.shape, beta.strides, beta.dtype,
                   type(mean), mean.shape, mean.strides, mean.dtype,
                   type(variance), variance.shape, variance.strides, variance.dtype,
                   plans.out_key(out, input))
            plan = plans.get(key)
        except (AttributeError, TypeError):  # not arrays, or an unhashable attribute
            key = plan = None
        if plan is not None:
            Y = plan(input, gamma, beta, mean, variance, out)
            if Y is not None:
                return Y
        given = (input, gamma, beta, mean, variance)
    common.check_data_format(OP, data_format)
    X = common.as_array("input", input)
    values = (gamma, beta, mean, variance)
    params = {n: common.as_array(n, v) for n, v in zip(_PARAMS, values, strict=True)}
    common.check_dtype(OP, "input", X, T1)
    for name, p in params.items():
        common.check_dtype(OP, name, p, T2)
    common.check_same_dtype(OP, "T2", params)
    if params["gamma"].dtype == BFLOAT16 and X.dtype != BFLOAT16:
        raise TypeError(f"{OP}: T2 (gamma, beta, mean, variance) can be bfloat16 only when "
                        f"T1 (input) is bfloat16; input is {X.dtype}")
    if X.ndim < 2:
        raise ValueError(f"{OP}: input must have at least 2 dimensions (N and C), "
                         f"got shape {X.shape}")
    eps = common.check_epsilon(OP, epsilon, positive=True)
    common.check_channel_params(OP, common.channel_count(X, data_format), params)
    if out is not None:
        common.check_out(OP, out, X, params)
    Y = common.infer(X, *params.values(), eps, data_format, out, engine, path)
    if key is not None and plans.plain(given, (X, *params.values())):
        plans.add(key, plans.inference(engine, eps, X, data_format, out))
    return Y

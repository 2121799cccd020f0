"""vLLM's CPU normalization operators as torch custom operators (namespace
``normkernels``), for a serving stack to call in place of its own.

vLLM's CPU backend calls ``torch.ops._C.rms_norm(out, input, weight, epsilon)`` and
``torch.ops._C.fused_add_rms_norm(input, residual, weight, epsilon)`` (in place: the
residual becomes ``input + residual``, the input its normalization); its Gemma layers
compute ``x_hat * (1 + weight)`` in float32. The operators here take exactly those
arguments, mutate exactly those tensors, and compute with normkernels'
:func:`normkernels.rms_normalization` and :func:`normkernels.fused_add_rms_norm`, bit
for bit:

* ``torch.ops.normkernels.vllm_rms_norm(out, input, weight, epsilon)``: Llama's rounding
  (``weight * x_hat.to(dtype)``, vLLM's ``RMSNorm.forward_native``);
* ``torch.ops.normkernels.vllm_fused_add_rms_norm(input, residual, weight, epsilon)``;
* ``torch.ops.normkernels.vllm_gemma_rms_norm(out, input, weight, epsilon)`` and
  ``vllm_gemma_fused_add_rms_norm(input, residual, weight, epsilon)``: ``1 + weight``
  in float32, one rounding (vLLM's ``GemmaRMSNorm``).

Each has a fake (it returns nothing and mutates its arguments), so ``torch.compile``
traces it. To use them where vLLM calls its own: ``import normkernels.torch.serving``,
then point the stack's op at them, e.g. ``vllm._custom_ops.rms_norm = lambda out, x,
w, eps: torch.ops.normkernels.vllm_rms_norm(out, x, w, eps)``. Rows are the last axis;
a row stride other than the last axis' extent is read in place, a non-contiguous last
axis through a copy (normkernels' rule).
"""

import torch
from torch import Tensor

from normkernels import api
from normkernels.torch.ops import NS
from normkernels.torch.tensors import array


def _check_weight(input, weight):
    if weight.dim() != 1 or input.dim() < 1 or weight.shape[0] != input.shape[-1]:
        raise ValueError(f"weight must be 1-D of input's last extent ({input.shape[-1]}), got "
                         f"shape {tuple(weight.shape)}")


def _rms(out, input, weight, epsilon, offset, rounding):
    _check_weight(input, weight)
    if out.shape != input.shape or out.dtype != input.dtype:
        raise ValueError(f"out must have input's shape {tuple(input.shape)} and dtype "
                         f"{input.dtype}, got {tuple(out.shape)} {out.dtype}")
    api.rms_normalization(array(input, "input"), array(weight, "weight"), axis=-1,
                          epsilon=epsilon, offset=offset, rounding=rounding,
                          out=array(out, "out"))


def _fused(input, residual, weight, epsilon, offset, rounding):
    _check_weight(input, weight)
    api.fused_add_rms_norm(array(input, "input"), array(residual, "residual"),
                           array(weight, "weight"), epsilon=epsilon, offset=offset,
                           rounding=rounding)


@torch.library.custom_op(f"{NS}::vllm_rms_norm", mutates_args=("out",))
def vllm_rms_norm(out: Tensor, input: Tensor, weight: Tensor, epsilon: float) -> None:
    """vLLM's ``rms_norm(out, input, weight, epsilon)``: Llama's rounding."""
    _rms(out, input, weight, epsilon, 0.0, "llama")


@torch.library.custom_op(f"{NS}::vllm_fused_add_rms_norm", mutates_args=("input", "residual"))
def vllm_fused_add_rms_norm(input: Tensor, residual: Tensor, weight: Tensor,
                            epsilon: float) -> None:
    """vLLM's in-place ``fused_add_rms_norm(input, residual, weight, epsilon)``."""
    _fused(input, residual, weight, epsilon, 0.0, "llama")


@torch.library.custom_op(f"{NS}::vllm_gemma_rms_norm", mutates_args=("out",))
def vllm_gemma_rms_norm(out: Tensor, input: Tensor, weight: Tensor, epsilon: float) -> None:
    """Gemma's: ``x_hat * (1 + weight)`` in float32, one rounding."""
    _rms(out, input, weight, epsilon, 1.0, "once")


@torch.library.custom_op(f"{NS}::vllm_gemma_fused_add_rms_norm",
                         mutates_args=("input", "residual"))
def vllm_gemma_fused_add_rms_norm(input: Tensor, residual: Tensor, weight: Tensor,
                                  epsilon: float) -> None:
    """Gemma's with the residual add, in place."""
    _fused(input, residual, weight, epsilon, 1.0, "once")


OPERATORS = (vllm_rms_norm, vllm_fused_add_rms_norm, vllm_gemma_rms_norm,
             vllm_gemma_fused_add_rms_norm)
for _op in OPERATORS:
    _op.register_fake(lambda *args: None)

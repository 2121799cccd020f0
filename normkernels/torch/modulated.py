"""diffusers' modulated normalizations (``AdaLayerNormZero``, ``AdaLayerNormZeroSingle``,
``AdaLayerNorm``, ``AdaLayerNormContinuous``, ``AdaGroupNorm``), swapped by
:func:`normkernels.torch.replace_modules` (their code digests, :data:`CODES`, are
part of :data:`normkernels.torch.zoo.CODES`).

Each class projects an embedding with its own layers (torch computes those), then
``norm(x) * (1 + scale) + shift``: three passes over x in torch, one here
(:func:`normkernels.ada_layer_norm`, :func:`normkernels.ada_group_norm`: the
modulation enters the normalize pass before Y's one rounding, where torch rounds
after each operation; the results agree within the error model, not bit for bit).
Without a gradient wanted only: training runs the class's own forward (whose inner
``nn.LayerNorm`` is swapped as any other), and so does any call whose broadcasting or
dtype promotion the fused operators do not have (parameters of another dtype than x,
an x of another rank, a norm with its own weight, diffusers' ``FP32LayerNorm``).
"""

import torch
from torch import nn

from normkernels import api
from normkernels.torch import eager, modules
from normkernels.torch.tensors import FLOATS, array

_LAYER_NORMS = (nn.LayerNorm, modules.LayerNorm)  # exact classes: FP32LayerNorm differs


def _fused(x, *params):
    """Whether the one-pass operator computes the call: no gradient, CPU tensors of
    one float dtype, nothing empty."""
    return (eager.route(x, *params) == eager.PLAIN and x.dtype in FLOATS
            and x.device.type == "cpu" and x.numel() > 0
            and all(p.dtype == x.dtype and p.device.type == "cpu" for p in params))


def _plain_layer_norm(norm, channels):
    """The eps of ``norm`` when it is torch's LayerNorm over ``channels`` without its
    own weight and bias, else None."""
    if type(norm) in _LAYER_NORMS and norm.weight is None and norm.bias is None \
            and tuple(norm.normalized_shape) == (channels,):
        return norm.eps
    return None


def ada_layer_norm(norm, x, shift, scale):
    """``norm(x) * (1 + scale[:, None]) + shift[:, None]`` for x (N, T, C) and shift,
    scale (N, C) (or (C,): every sample), in one pass; None where the class's own
    code must run."""
    if x.dim() != 3:
        return None
    eps = _plain_layer_norm(norm, x.shape[-1])
    if eps is None or not _fused(x, shift, scale):
        return None
    want = (x.shape[0], x.shape[-1])
    if shift.dim() == 1:  # one modulation for every sample (AdaLayerNorm's chunk_dim=0)
        shift, scale = shift.expand(want), scale.expand(want)
    if tuple(shift.shape) != want or tuple(scale.shape) != want:
        return None
    y = torch.empty(x.shape, dtype=x.dtype)  # contiguous, as torch's layer_norm returns
    api.ada_layer_norm(array(x, "x"), array(shift, "shift"), array(scale, "scale"),
                       epsilon=eps, out=array(y, "out"))
    return y


def ada_group_norm(x, num_groups, eps, shift, scale):
    """``group_norm(x) * (1 + scale[..., None, None]) + shift[..., None, None]`` for x
    (N, C, H, W) (any memory format) and shift, scale (N, C); None where the class's
    own code must run (it raises torch's errors)."""
    if x.dim() != 4 or not _fused(x, shift, scale):
        return None
    n, c = x.shape[:2]
    if tuple(shift.shape) != (n, c) or tuple(scale.shape) != (n, c) or c % num_groups \
            or c // num_groups * x.shape[2] * x.shape[3] == 1:
        return None
    y = torch.empty_like(x)  # x's memory format, as torch's group_norm keeps it
    api.ada_group_norm(array(x, "x"), array(shift, "shift"), array(scale, "scale"),
                       num_groups=num_groups, epsilon=eps, out=array(y, "out"))
    return y


class _AdaLayerNormZero:
    """DiT's, SD3's and FLUX's adaLN-Zero: six modulations, the first two fused."""

    def forward(self, x, timestep=None, class_labels=None, hidden_dtype=None, emb=None):
        if self.emb is not None:
            emb = self.emb(timestep, class_labels, hidden_dtype=hidden_dtype)
        emb = self.linear(self.silu(emb))
        shift_msa, scale_msa, gate_msa, shift_mlp, scale_mlp, gate_mlp = emb.chunk(6, dim=1)
        y = ada_layer_norm(self.norm, x, shift_msa, scale_msa)
        if y is None:
            y = self.norm(x) * (1 + scale_msa[:, None]) + shift_msa[:, None]
        return y, gate_msa, shift_mlp, scale_mlp, gate_mlp


class _AdaLayerNormZeroSingle:
    """FLUX's single-stream adaLN-Zero: three modulations, the first two fused."""

    def forward(self, x, emb=None):
        emb = self.linear(self.silu(emb))
        shift_msa, scale_msa, gate_msa = emb.chunk(3, dim=1)
        y = ada_layer_norm(self.norm, x, shift_msa, scale_msa)
        if y is None:
            y = self.norm(x) * (1 + scale_msa[:, None]) + shift_msa[:, None]
        return y, gate_msa


class _AdaLayerNorm:
    """``chunk_dim`` 1: (shift, scale) per sample; 0: (scale, shift) for every sample."""

    def forward(self, x, timestep=None, temb=None):
        if self.emb is not None:
            temb = self.emb(timestep)
        temb = self.linear(self.silu(temb))
        if self.chunk_dim == 1:
            shift, scale = temb.chunk(2, dim=1)
            y = ada_layer_norm(self.norm, x, shift, scale)
            shift, scale = shift[:, None, :], scale[:, None, :]
        else:
            scale, shift = temb.chunk(2, dim=0)
            y = ada_layer_norm(self.norm, x, shift, scale) if temb.dim() == 1 else None
        return self.norm(x) * (1 + scale) + shift if y is None else y


class _AdaLayerNormContinuous:
    """The final norm of SD3's and FLUX's transformers: (scale, shift) per sample."""

    def forward(self, x, conditioning_embedding):
        emb = self.linear(self.silu(conditioning_embedding).to(x.dtype))
        scale, shift = torch.chunk(emb, 2, dim=1)
        y = ada_layer_norm(self.norm, x, shift, scale)
        if y is None:
            y = self.norm(x) * (1 + scale)[:, None, :] + shift[:, None, :]
        return y


class _AdaGroupNorm:
    """The time-embedding GroupNorm of diffusers' ``ada_group`` ResNet blocks."""

    def forward(self, x, emb):
        if self.act:
            emb = self.act(emb)
        emb = self.linear(emb)
        if emb.dim() == 2:
            scale, shift = emb.chunk(2, dim=1)
            y = ada_group_norm(x, self.num_groups, self.eps, shift, scale)
            if y is not None:
                return y
        emb = emb[:, :, None, None]
        scale, shift = emb.chunk(2, dim=1)
        x = torch.nn.functional.group_norm(x, self.num_groups, eps=self.eps)
        return x * (1 + scale) + shift


# digest of the code (normkernels.torch.zoo.code_digest) -> (normkernels' forward, a
# class with that code)
CODES = {
    "7dde3fd906972362": (_AdaLayerNormZero,
                         "diffusers.models.normalization:AdaLayerNormZero"),
    "3f08086109088556": (_AdaLayerNormZeroSingle,
                         "diffusers.models.normalization:AdaLayerNormZeroSingle"),
    "38863becb00fabc4": (_AdaLayerNorm,
                         "diffusers.models.normalization:AdaLayerNorm"),
    "98e1fd5ac357813f": (_AdaLayerNormContinuous,
                         "diffusers.models.normalization:AdaLayerNormContinuous"),
    "183566226244e94c": (_AdaGroupNorm,
                         "diffusers.models.normalization:AdaGroupNorm"),
}

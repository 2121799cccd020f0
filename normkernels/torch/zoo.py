"""The model zoos' normalization classes (timm, transformers, diffusers), swapped by
:func:`normkernels.torch.replace_modules` with each class's own semantics.

A class is recognized by its code, not by its name: transformers copies Llama's RMSNorm
into some 140 models (Qwen2/3, Mistral, Phi-3, DeepSeek, Granite, ...), each a class of
its own, and the same code means the same semantics. A class of one of the zoos'
packages that defines ``forward`` itself is swapped when the code of its ``forward``
(and of ``_norm``, which some forwards call), with docstrings, comments, annotations and
decorators dropped, has a digest in :data:`CODES`. Code that differs in any token (a
zoo's new version, a user's subclass or edit) is not swapped and keeps its forward;
:func:`normkernels.torch.register_swap` adds a class by hand.

Each swapped forward computes with normkernels only where the result has the class's
exact semantics (its dtypes, its rounding order: Llama's ``weight *
x_hat.to(dtype)``, Gemma's ``1 + weight`` in float32, timm's fused activation modules);
any other call (a tensor off the CPU, float64 input where the class computes in
float32, parameters of another dtype, ``torch.compile`` tracing) runs the class's own.
Nothing here imports a zoo: a class is looked at when a model holding it is swapped.
"""

import ast
import hashlib
import inspect
import textwrap

import torch

from normkernels.torch import functional as F
from normkernels.torch import modulated, modules

ZOOS = ("timm.", "transformers.", "diffusers.")
_FLOAT32_COMPUTED = (torch.float16, torch.bfloat16, torch.float32)  # float64 is cast down


def code_digest(cls):
    """The digest of ``cls``'s normalized ``_norm`` and ``forward`` (those it defines
    itself); None without a ``forward`` of its own or its source."""
    if "forward" not in cls.__dict__:
        return None
    parts = []
    for name in ("_norm", "forward"):
        fn = cls.__dict__.get(name)
        if fn is None:
            continue
        try:
            tree = ast.parse(textwrap.dedent(inspect.getsource(fn)))
        except (OSError, TypeError, SyntaxError):
            return None
        node = tree.body[0]
        node.decorator_list, node.returns = [], None
        for arg in (*node.args.posonlyargs, *node.args.args, *node.args.kwonlyargs):
            arg.annotation = None
        node.body = [s for s in node.body  # docstrings, and strings used as comments
                     if not (isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant))]
        parts.append(ast.unparse(node))
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:16]


def _rows(x, weight):
    """A row normalization over x's last axis computed in float32 by the class, with a
    1-D weight (or none) of x's dtype: normkernels' semantics are the class's."""
    return (x.dtype in _FLOAT32_COMPUTED and x.device.type == "cpu" and x.dim() >= 1
            and (weight is None or (weight.dtype == x.dtype and weight.dim() == 1
                                    and weight.device.type == "cpu"
                                    and weight.shape[0] == x.shape[-1])))


def _rms(x, weight, eps, rounding="once", offset=0.0):
    """Y, or None where the class's own forward runs."""
    return F.rounded_rms_norm(x, weight, eps, rounding, offset) if _rows(x, weight) else None


class _LlamaRMSNorm:
    """transformers' LlamaRMSNorm and its copies: ``weight * x_hat.to(input_dtype)``."""

    def forward(self, hidden_states):
        y = _rms(hidden_states, self.weight, self.variance_epsilon, "llama")
        return super().forward(hidden_states) if y is None else y


class _T5LayerNorm:
    """T5's: ``x_hat`` rounded to a 16-bit weight's dtype, then ``weight * x_hat``; with
    the weight in x's dtype, Llama's rounding (float32: two roundings as well)."""

    def forward(self, hidden_states):
        y = _rms(hidden_states, self.weight, self.variance_epsilon, "llama")
        return super().forward(hidden_states) if y is None else y


class _Olmo2RMSNorm:
    """OLMo-2's (and GPT-OSS's): ``(weight * x_hat).to(input_dtype)``, one rounding."""

    def forward(self, hidden_states):
        y = _rms(hidden_states, self.weight, self.variance_epsilon)
        return super().forward(hidden_states) if y is None else y


class _GemmaRMSNorm:
    """Gemma's: ``x_hat * (1 + weight.float())`` in float32, one rounding."""

    def forward(self, x):
        y = _rms(x, self.weight, self.eps, offset=1.0)
        return super().forward(x) if y is None else y


class _Gemma3nRMSNorm:
    """Gemma-3n's and Gemma-4's: ``with_scale`` a weight, else none; one rounding."""

    def forward(self, hidden_states):
        weight = self.weight if self.with_scale else None
        y = _rms(hidden_states, weight, self.eps)
        return super().forward(hidden_states) if y is None else y


class _UnweightedRMSNorm:
    """``self._norm(x.float()).type_as(x)``: no weight."""

    def forward(self, x):
        y = _rms(x, None, self.eps)
        return super().forward(x) if y is None else y


class _DiffusersRMSNorm:
    """diffusers' RMSNorm: a weight of x's dtype (no bias) as T5's; none: one rounding."""

    def forward(self, hidden_states):
        if self.weight is not None and self.bias is not None:
            return super().forward(hidden_states)
        rounding = "once" if self.weight is None else "llama"
        y = _rms(hidden_states, self.weight, self.eps, rounding)
        return super().forward(hidden_states) if y is None else y


class _CohereLayerNorm:
    """Cohere's LayerNorm: centred, weight and no bias, in float32, one rounding."""

    def forward(self, hidden_states):
        w = self.weight
        if not _rows(hidden_states, w) or w is None:
            return super().forward(hidden_states)
        return F.layer_norm(hidden_states, w.shape, w, None, self.variance_epsilon)


def _layer_norm(self, x, channels_first):
    """torch.nn.LayerNorm's forward of ``self``; ``channels_first``: over the channels of
    (N, C, H, W) (a permuted view: normkernels reads it in place, no copy)."""
    if channels_first:
        y = _layer_norm(self, x.permute(0, 2, 3, 1), False)
        return y.permute(0, 3, 1, 2)
    return F.layer_norm(x, self.normalized_shape, self.weight, self.bias, self.eps)


def _fallback(self, x, *params, ndim=None):
    """Whether the class's own forward runs: timm's fast-norm flag, a call normkernels
    does not compute, or a rank the class's permutes do not take."""
    return (getattr(self, "_fast_norm", False) or not modules.ours(x, *params)
            or (ndim is not None and x.dim() != ndim))


class _ChannelsLayerNorm:
    """transformers' ConvNeXt-style LayerNorm: ``data_format`` "channels_first" (N, C,
    H, W) or "channels_last"."""

    def forward(self, features):
        first = self.data_format == "channels_first"
        if _fallback(self, features, self.weight, self.bias, ndim=4 if first else None):
            return super().forward(features)
        return _layer_norm(self, features, first)


class _TimmLayerNorm:
    def forward(self, x):
        if _fallback(self, x, self.weight, self.bias):
            return super().forward(x)
        return _layer_norm(self, x, False)


class _TimmLayerNorm2d:
    def forward(self, x):
        if _fallback(self, x, self.weight, self.bias, ndim=4):
            return super().forward(x)
        return _layer_norm(self, x, True)


class _TimmGroupNorm:
    def forward(self, x):
        if _fallback(self, x, self.weight, self.bias):
            return super().forward(x)
        return F.group_norm(x, self.num_groups, self.weight, self.bias, self.eps)


class _TimmRmsNorm:
    def forward(self, x):
        if _fallback(self, x, self.weight):
            return super().forward(x)
        return F.rms_norm(x, self.normalized_shape, self.weight, self.eps)


class _TimmBatchNormAct2d:
    def forward(self, x):
        if not modules.ours_batch_norm(self, x) or x.dim() != 4:
            return super().forward(x)
        return self.act(self.drop(modules.batch_norm(self, x)))


class _TimmGroupNormAct:
    def forward(self, x):
        if _fallback(self, x, self.weight, self.bias):
            return super().forward(x)
        return self.act(self.drop(F.group_norm(x, self.num_groups, self.weight, self.bias,
                                               self.eps)))


class _TimmLayerNormAct:
    def forward(self, x):
        if _fallback(self, x, self.weight, self.bias):
            return super().forward(x)
        return self.act(self.drop(_layer_norm(self, x, False)))


class _TimmLayerNormAct2d:
    def forward(self, x):
        if _fallback(self, x, self.weight, self.bias, ndim=4):
            return super().forward(x)
        return self.act(self.drop(_layer_norm(self, x, True)))


class _FrozenBatchNorm2d:
    """transformers' FrozenBatchNorm2d (DETR, RT-DETR, Grounding DINO and their copies):
    BatchNorm inference from buffers, eps 1e-5 (the class folds them into a scale and
    shift of their dtype as well, then rounds x * scale and the sum)."""

    def forward(self, x):
        if x.dim() != 4 or x.shape[1] != self.weight.shape[0] or not modules.ours(
                x, self.weight, self.bias, self.running_mean, self.running_var):
            return super().forward(x)
        return F.batch_norm(x, self.running_mean, self.running_var, self.weight, self.bias,
                            False, 0.0, 1e-5)


# digest of the code -> (normkernels' forward, a class with that code). The classes
# named are the ones tests build (tests/test_torch_zoo.py); a digest that no longer
# matches them there means the zoo changed that code.
CODES = {
    "9635bcd843f309a0": (_LlamaRMSNorm,
                         "transformers.models.llama.modeling_llama:LlamaRMSNorm"),
    "3152525beceb0d02": (_T5LayerNorm,
                         "transformers.models.t5.modeling_t5:T5LayerNorm"),
    "eef4e978a32aa4a4": (_Olmo2RMSNorm,
                         "transformers.models.olmo2.modeling_olmo2:Olmo2RMSNorm"),
    "d2c09eabcc5efb2e": (_GemmaRMSNorm,
                         "transformers.models.gemma.modeling_gemma:GemmaRMSNorm"),
    "9304bee9ba9ee436": (_Gemma3nRMSNorm,
                         "transformers.models.gemma3n.modeling_gemma3n:Gemma3nRMSNorm"),
    "e3105f4b9224a69d": (_UnweightedRMSNorm,
                         "transformers.models.nanochat.modeling_nanochat:NanoChatRMSNorm"),
    "8486c8e24319fcfd": (_DiffusersRMSNorm,
                         "diffusers.models.normalization:RMSNorm"),
    "ec976d1bff6235ff": (_CohereLayerNorm,
                         "transformers.models.cohere.modeling_cohere:CohereLayerNorm"),
    "47110db86b0bf38b": (_ChannelsLayerNorm,
                         "transformers.models.convnext.modeling_convnext:ConvNextLayerNorm"),
    "23d63967920a9766": (_TimmLayerNorm,
                         "timm.layers.norm:LayerNorm"),
    "9c58bcbc9f92c797": (_TimmLayerNorm2d,
                         "timm.layers.norm:LayerNorm2d"),
    "7f5270765e35f6e7": (_TimmGroupNorm,
                         "timm.layers.norm:GroupNorm"),
    "a1218df7e541df89": (_TimmRmsNorm,
                         "timm.layers.norm:RmsNorm"),
    "81f3f8b6b04abb7c": (_TimmBatchNormAct2d,
                         "timm.layers.norm_act:BatchNormAct2d"),
    "6cbfa0e71705c914": (_TimmGroupNormAct,
                         "timm.layers.norm_act:GroupNormAct"),
    "8118ce537f8ed909": (_TimmLayerNormAct,
                         "timm.layers.norm_act:LayerNormAct"),
    "32adb169b1fa2aca": (_TimmLayerNormAct2d,
                         "timm.layers.norm_act:LayerNormAct2d"),
    "db52c6d243284e3f": (_FrozenBatchNorm2d,
                         "transformers.models.detr.modeling_detr:DetrFrozenBatchNorm2d"),
    **modulated.CODES,
}


_SEEN = {}  # class -> normkernels' class, or None


def swap_for(cls):
    """normkernels' class for a zoo's class ``cls``, or None (registered on first sight
    with :func:`normkernels.torch.register_swap`)."""
    if cls in _SEEN:
        return _SEEN[cls]
    ours = None
    if cls.__module__.startswith(ZOOS):
        entry = CODES.get(code_digest(cls))
        if entry is not None:
            forward = entry[0]
            ours = modules.register_swap(cls, type(cls.__name__, (forward, cls), {
                "__module__": __name__, "__qualname__": cls.__qualname__,
                "__doc__": f"``{cls.__module__}.{cls.__qualname__}`` computed by normkernels: "
                           f"{forward.__doc__ or forward.__name__[1:]}"}))
    _SEEN[cls] = ours
    return ours


modules.FINDERS.append(swap_for)

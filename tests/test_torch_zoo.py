"""The model zoos' normalization classes swapped by normkernels.torch.replace_modules
(normkernels/torch/zoo.py), against the classes' own forwards as oracles: outputs and
gradients of each class, whole transformers and diffusers models, and which classes
the code digests recognize. Built from configs with random weights (no download); timm
where it imports (its torchvision does not beside torch's CPU build)."""

import copy
import importlib
import inspect
import re

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
import normkernels.torch as nt  # noqa: E402
from normkernels.torch import modules, zoo  # noqa: E402

F16, BF16, F32, F64 = torch.float16, torch.bfloat16, torch.float32, torch.float64
F32_EPS = torch.finfo(F32).eps
DTYPES = {"float16": F16, "bfloat16": BF16, "float32": F32}


def _import(path):
    module, name = path.split(":")
    try:
        return getattr(importlib.import_module(module), name)
    except Exception as exc:  # timm: torchvision's RuntimeError beside a CPU torch
        pytest.skip(f"{path} does not import here: {type(exc).__name__}: {exc}")


def _ulps(got, want):
    """|got - want| in units of the last place of want's dtype (at want's magnitude)."""
    eps = torch.finfo(want.dtype).eps
    w = want.double()
    return ((got.double() - w).abs() / (w.abs().clamp_min(1e-30) * eps)).max().item()


def _swapped_copy(module):
    """A swapped module computing with the same parameter tensors as ``module``."""
    ours = copy.copy(module)
    assert nt.replace_modules(ours) == [""], f"{type(module).__name__} was not swapped"
    assert type(ours).__module__ == "normkernels.torch.zoo"
    return ours


# class path, constructor, input shape: one of each code the table knows
RMS = {
    "llama": ("transformers.models.llama.modeling_llama:LlamaRMSNorm", lambda c: c(96, eps=1e-6)),
    "qwen3": ("transformers.models.qwen3.modeling_qwen3:Qwen3RMSNorm", lambda c: c(96, eps=1e-6)),
    "mistral": ("transformers.models.mistral.modeling_mistral:MistralRMSNorm",
                lambda c: c(96, eps=1e-5)),
    "t5": ("transformers.models.t5.modeling_t5:T5LayerNorm", lambda c: c(96, eps=1e-6)),
    "olmo2": ("transformers.models.olmo2.modeling_olmo2:Olmo2RMSNorm", lambda c: c(96, eps=1e-6)),
    "gemma": ("transformers.models.gemma.modeling_gemma:GemmaRMSNorm", lambda c: c(96, eps=1e-6)),
    "gemma3n": ("transformers.models.gemma3n.modeling_gemma3n:Gemma3nRMSNorm",
                lambda c: c(96, eps=1e-6)),
    "gemma3n-unscaled": ("transformers.models.gemma3n.modeling_gemma3n:Gemma3nRMSNorm",
                         lambda c: c(96, eps=1e-6, with_scale=False)),
    "unweighted": ("transformers.models.nanochat.modeling_nanochat:NanoChatRMSNorm",
                   lambda c: c(eps=1e-6)),
    "cohere": ("transformers.models.cohere.modeling_cohere:CohereLayerNorm",
               lambda c: c(96, eps=1e-5)),
    "diffusers": ("diffusers.models.normalization:RMSNorm", lambda c: c(96, eps=1e-6)),
    "diffusers-unweighted": ("diffusers.models.normalization:RMSNorm",
                             lambda c: c(96, eps=1e-6, elementwise_affine=False)),
}
# where the class rounds the normalized value to T before the weight (Llama's order)
LLAMA_ORDER = {"llama", "qwen3", "mistral", "t5", "diffusers"}


def _rms_module(case, dtype, gen):
    module = RMS[case][1](_import(RMS[case][0])).to(dtype)
    with torch.no_grad():
        for p in module.parameters():  # weights away from 1 (and Gemma's from 0)
            p.copy_(torch.randn(p.shape, generator=gen) * 0.5 + 0.2)
    return module


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", RMS)
def test_row_classes_match_their_forward(case, dtype):
    """Y of the swapped class against the class's own forward: 16-bit within one ulp
    of T, and bit for bit in >= 99% of the values (where a class rounds in Llama's
    order, so does the swap: rounding once instead differs in a quarter of them);
    float32 within the float32 computation's error."""
    gen = torch.Generator().manual_seed(7)
    module = _rms_module(case, DTYPES[dtype], gen)
    x = (torch.randn(4, 7, 96, generator=gen) * 3 + 1).to(DTYPES[dtype])
    ours = _swapped_copy(module)
    with torch.no_grad():
        want, got = module(x), ours(x)
    assert got.dtype == want.dtype and got.shape == want.shape
    if dtype == "float32":
        torch.testing.assert_close(got, want, rtol=4e-6, atol=1e-6)
        return
    assert _ulps(got, want) <= 1.0
    same = (got == want).double().mean().item()
    assert same >= 0.99, f"{case}: {same:.3f} of the values bit for bit"


@pytest.mark.parametrize("case", ["llama", "gemma", "olmo2", "cohere", "unweighted"])
def test_row_classes_gradients(case):
    """Input and weight gradients of the swapped class against autograd through the
    class's own forward (float32; bfloat16 within its rounding)."""
    for dtype, tol in ((F32, 2e-5), (BF16, 2e-2)):
        gen = torch.Generator().manual_seed(3)
        module = _rms_module(case, dtype, gen)
        ours = _swapped_copy(module)
        x = (torch.randn(5, 64, 96, generator=gen) + 0.5).to(dtype)
        dy = torch.randn(5, 64, 96, generator=gen).to(dtype)
        grads = []
        for m in (module, ours):
            m.zero_grad()
            xi = x.clone().requires_grad_()
            m(xi).backward(dy)
            grads.append([xi.grad] + [p.grad for p in m.parameters()])
        for want, got in zip(*grads, strict=True):
            assert got is not None and got.dtype == want.dtype
            scale = want.double().abs().max().item()
            assert (got.double() - want.double()).abs().max().item() <= tol * scale


def test_float64_and_foreign_weights_run_the_class_forward():
    """Llama casts float64 input down to float32: the swap runs the class's forward
    there (bit for bit), and for a weight of another dtype (type promotion) or 2-D."""
    gen = torch.Generator().manual_seed(1)
    module = _rms_module("llama", F32, gen)
    ours = _swapped_copy(module)
    x = torch.randn(3, 96, generator=gen)
    with torch.no_grad():
        assert torch.equal(ours(x.double()), module(x.double()))  # promotion
        module64 = _rms_module("llama", F64, gen)
        ours64 = _swapped_copy(module64)
        assert torch.equal(ours64(x.double()), module64(x.double()))  # computed in float32
        assert torch.equal(ours(x.bfloat16()), module(x.bfloat16()))  # float32 weight
        assert ours(x.bfloat16()).dtype == F32


FROZEN = "transformers.models.detr.modeling_detr:DetrFrozenBatchNorm2d"


def _frozen(dtype, gen, c=24):
    module = _import(FROZEN)(c)
    with torch.no_grad():
        module.weight.copy_(torch.randn(c, generator=gen))
        module.bias.copy_(torch.randn(c, generator=gen))
        module.running_mean.copy_(torch.randn(c, generator=gen) * 3)
        module.running_var.copy_(torch.rand(c, generator=gen) * 2 + 1e-3)
    return module.to(dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_frozen_batch_norm_folds_once(dtype):
    """DETR's FrozenBatchNorm2d (and its 13 copies): within half an ulp of T of the
    float64 normalization, plus float32's fold of the buffers (scale and shift rounded,
    then a multiply-add: two ulps of the terms where they cancel), any memory format;
    within the class's own roundings of its forward; the input gradient of autograd
    through the class's forward."""
    gen = torch.Generator().manual_seed(4)
    module = _frozen(DTYPES[dtype], gen)
    ours = _swapped_copy(module)
    x = (torch.randn(2, 24, 5, 3, generator=gen) * 2 + module.running_mean.float()[:, None, None]
         ).to(DTYPES[dtype])
    w, b, m, v = (t.double()[:, None, None] for t in (module.weight, module.bias,
                                                      module.running_mean, module.running_var))
    scale = w / (v + 1e-5).sqrt()
    exact = (x.double() - m) * scale + b
    terms = (x.double() * scale).abs() + (m * scale).abs() + b.abs()  # the class's fold
    eps = torch.finfo(DTYPES[dtype]).eps
    for xi in (x, x.to(memory_format=torch.channels_last)):
        with torch.no_grad():
            got, want = ours(xi), module(xi)
        assert got.dtype == want.dtype and got.stride() == want.stride()
        err = (got.double() - exact).abs()
        assert (err <= 0.5 * eps * exact.abs() + 2 * F32_EPS * terms).all()
        assert ((got.double() - want.double()).abs() <= 3 * eps * terms).all()
    if dtype == "float32":
        grads = []
        for m_ in (module, ours):
            xi = x.clone().requires_grad_()
            m_(xi).backward(torch.ones_like(x))
            grads.append(xi.grad)
        torch.testing.assert_close(grads[1], grads[0])
        # buffers of another dtype than x: torch promotes, the class's forward runs
        with torch.no_grad():
            assert torch.equal(ours(x.bfloat16()), module(x.bfloat16()))
        assert ours(x.bfloat16()).dtype == F32


def test_digests_recognize_copies_and_nothing_else():
    """Every class the table names has its digest; transformers' copies of Llama's
    RMSNorm (other models) share it; a class whose code differs in one token, a
    subclass that inherits forward, and a user's copy outside the zoos are not
    swapped."""
    for digest, (_, path) in zoo.CODES.items():
        if path.startswith("timm."):
            continue
        assert zoo.code_digest(_import(path)) == digest, path
    llama = zoo.code_digest(_import(RMS["llama"][0]))
    for path in ("transformers.models.qwen2.modeling_qwen2:Qwen2RMSNorm",
                 "transformers.models.phi3.modeling_phi3:Phi3RMSNorm",
                 "transformers.models.mixtral.modeling_mixtral:MixtralRMSNorm"):
        assert zoo.code_digest(_import(path)) == llama, path
    frozen = zoo.code_digest(_import(FROZEN))
    for path in ("transformers.models.rt_detr.modeling_rt_detr:RTDetrFrozenBatchNorm2d",
                 "transformers.models.conditional_detr.modeling_conditional_detr:"
                 "ConditionalDetrFrozenBatchNorm2d"):
        assert zoo.code_digest(_import(path)) == frozen, path
    Llama = _import(RMS["llama"][0])
    source = inspect.getsource(Llama.forward)
    namespace = {}
    exec("import torch\nclass Edited(torch.nn.Module):\n" + source.replace(
        "variance + self.variance_epsilon", "variance + 2 * self.variance_epsilon"), namespace)
    edited = namespace["Edited"]
    edited.__module__ = Llama.__module__
    inherits = type("Inherits", (Llama,), {"__module__": Llama.__module__})
    copied = type("Copied", (torch.nn.Module,), {"forward": Llama.forward,
                                                "__module__": "mymodels"})
    assert zoo.code_digest(copied) == llama
    for cls in (edited, inherits, copied):
        assert zoo.swap_for(cls) is None, cls.__name__


def test_unregister_and_restore_a_zoo_class():
    Llama = _import(RMS["llama"][0])
    model = torch.nn.Sequential(Llama(32), Llama(32))
    assert nt.replace_modules(model) == ["0", "1"]
    assert nt.restore_modules(model) == ["0", "1"]
    assert all(type(m) is Llama for m in model)
    nt.unregister_swap(Llama)
    try:
        assert nt.replace_modules(model) == []
    finally:
        nt.register_swap(Llama, modules.SWAPS.get(Llama) or zoo._SEEN[Llama])
    assert nt.replace_modules(model) == ["0", "1"]


NORMALIZATION = re.compile(r"Norm(Act)?(\dd)?\d?$")  # LayerNorm2d, BatchNormAct2d, GroupNorm1


def _count(model):
    """(normalization modules swapped, those left), by class name."""
    swapped, left = {}, {}
    for m in model.modules():
        name = type(m).__name__
        if NORMALIZATION.search(name):
            into = swapped if type(m).__module__.startswith("normkernels") else left
            into[name] = into.get(name, 0) + 1
    return swapped, left


def _llms():
    from transformers import (
        BertConfig,
        BertModel,
        Gemma2Config,
        Gemma2ForCausalLM,
        LlamaConfig,
        LlamaForCausalLM,
        Qwen3Config,
        Qwen3ForCausalLM,
        T5Config,
        T5EncoderModel,
    )
    small = dict(vocab_size=300, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                 num_attention_heads=4, num_key_value_heads=2)
    return {
        "llama": lambda: LlamaForCausalLM(LlamaConfig(**small)),
        "qwen3": lambda: Qwen3ForCausalLM(Qwen3Config(**small, head_dim=16)),
        "gemma2": lambda: Gemma2ForCausalLM(Gemma2Config(**small, head_dim=16)),
        "t5": lambda: T5EncoderModel(T5Config(vocab_size=300, d_model=64, d_kv=16, d_ff=128,
                                              num_layers=2, num_heads=4)),
        "bert": lambda: BertModel(BertConfig(vocab_size=300, hidden_size=64,
                                             intermediate_size=128, num_hidden_layers=2,
                                             num_attention_heads=4)),
    }


@pytest.mark.parametrize("name", ["llama", "qwen3", "gemma2", "t5", "bert"])
def test_transformers_models_swap_every_normalization(name):
    """Every normalization module of the model is swapped (Qwen3's QK-norm included);
    its output with the swap is within the model's rounding of the original's, float32
    and bfloat16, and a training step's gradients too (float32)."""
    torch.manual_seed(0)
    model = _llms()[name]().eval()
    ids = torch.randint(0, 300, (2, 12))
    for dtype in (F32, BF16):
        model = model.to(dtype)
        with torch.no_grad():
            want = model(ids)[0]
            names = nt.replace_modules(model)
            got = model(ids)[0]
        swapped, left = _count(model)
        assert names and not left, (swapped, left)
        scale = want.double().abs().max().item()
        tol = 1e-5 if dtype == F32 else 0.1
        assert (got.double() - want.double()).abs().max().item() <= tol * scale
        nt.restore_modules(model)
    model = model.float()  # eval: no dropout, the same step twice
    grads = []
    for swap in (False, True):
        model.zero_grad()
        (nt.replace_modules if swap else nt.restore_modules)(model)
        out = model(ids)[0].float()  # a fixed projection (the square of a norm: none)
        out.backward(torch.randn(out.shape, generator=torch.Generator().manual_seed(5)))
        grads.append({n: p.grad.clone() for n, p in model.named_parameters()
                      if p.grad is not None})
    top = max(g.abs().max().item() for g in grads[0].values())  # BERT's key bias: 0 + noise
    for n, want in grads[0].items():
        torch.testing.assert_close(grads[1][n], want, rtol=1e-3, atol=1e-5 * top, msg=n)


def test_diffusers_unet_swaps_its_group_norms():
    diffusers = pytest.importorskip("diffusers")
    torch.manual_seed(0)
    model = diffusers.UNet2DModel(sample_size=16, in_channels=3, out_channels=3,
                                  block_out_channels=(32, 64), norm_num_groups=8,
                                  layers_per_block=1,
                                  down_block_types=("DownBlock2D", "AttnDownBlock2D"),
                                  up_block_types=("AttnUpBlock2D", "UpBlock2D")).eval()
    x = torch.randn(1, 3, 16, 16)
    with torch.no_grad():
        want = model(x, 3).sample
        nt.replace_modules(model)
        got = model(x, 3).sample
    swapped, left = _count(model)
    assert swapped.get("GroupNorm", 0) >= 10 and not left, (swapped, left)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("arch", ["vit_tiny_patch16_224", "convnext_atto", "resnet18",
                                  "efficientnet_b0"])
def test_timm_models_swap_every_normalization(arch):
    """timm's LayerNorm (ViT), LayerNorm2d (ConvNeXt: channels-first, read in place),
    BatchNorm2d and BatchNormAct2d (the activation after normkernels' BatchNorm)."""
    timm = pytest.importorskip("timm", exc_type=ImportError)
    _import("timm.layers.norm_act:BatchNormAct2d")  # skips where torchvision fails
    torch.manual_seed(0)
    model = timm.create_model(arch, pretrained=False).eval()
    x = torch.randn(1, 3, 64, 64) if "vit" not in arch else torch.randn(1, 3, 224, 224)
    with torch.no_grad():
        want = model(x)
        assert nt.replace_modules(model)
        got = model(x)
    swapped, left = _count(model)
    assert swapped and not left, (swapped, left)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4 * want.abs().max().item())


def test_bench_models_runs_and_counts_the_swaps(monkeypatch, capsys):
    """``normkernels bench --via torch --models`` on a small Llama: both module sets
    timed, every RMSNorm swapped, a row per mode."""
    import types

    from normkernels.bench import zoo_models

    def tiny(name):
        from transformers import LlamaConfig, LlamaForCausalLM
        model = LlamaForCausalLM(LlamaConfig(vocab_size=100, hidden_size=32,
                                             intermediate_size=64, num_hidden_layers=1,
                                             num_attention_heads=2))
        return model, lambda batch, gen: (torch.randint(0, 100, (batch, 8), generator=gen),)

    monkeypatch.setattr(zoo_models, "MODELS", {"llama": tiny, "missing": lambda n: 1 / 0})
    assert zoo_models.command(types.SimpleNamespace(repeat=1)) == 0
    out = capsys.readouterr().out
    assert "missing: skipped (ZeroDivisionError" in out
    rows = [line for line in out.splitlines() if line.startswith("| llama | 3/3 |")]
    assert len(rows) == 3, out
    assert all(float(cell) > 0 for row in rows for cell in row.split("|")[4:9]), rows

"""``normkernels bench --via torch --models``: the model zoos' models (transformers,
diffusers, timm where each imports) built from configs with random weights, run with
their own normalization modules and with normkernels' (``replace_modules`` and
``restore_modules`` on the same model, alternating): batch-1 inference, a batched
inference, and a training step (forward, backward, SGD), each with the time spent in
the normalization modules (forward hooks around each: the same overhead both ways)
and per model the modules swapped, out of all, and the classes left."""

import re
import statistics
import time

# LayerNorm2d, BatchNormAct2d, FrozenBatchNorm2d, ..., and diffusers' modulated norms
# (AdaLayerNormSingle is an embedding, not a norm)
NORMALIZATION = re.compile(r"Norm(Act)?(\dd)?\d?$|^AdaLayerNorm(Zero|ZeroSingle|Continuous)$")


def _transformers(name):
    import torch
    import transformers as t

    small = dict(vocab_size=1000, hidden_size=512, intermediate_size=1408,
                 num_hidden_layers=4, num_attention_heads=8, num_key_value_heads=4)
    build = {
        "llama": lambda: t.LlamaForCausalLM(t.LlamaConfig(**small)),
        "qwen3": lambda: t.Qwen3ForCausalLM(t.Qwen3Config(**small, head_dim=64)),
        "gemma2": lambda: t.Gemma2ForCausalLM(t.Gemma2Config(**small, head_dim=64)),
        "bert": lambda: t.BertModel(t.BertConfig(vocab_size=1000, hidden_size=768,
                                                 intermediate_size=3072, num_hidden_layers=4,
                                                 num_attention_heads=12)),
    }[name]
    return build(), lambda batch, gen: (torch.randint(0, 1000, (batch, 128), generator=gen),)


def _diffusers(name):
    import diffusers
    import torch

    if name == "dit":  # DiT-B/2 at 256 x 256 (32 x 32 latents), four of its 12 blocks
        model = diffusers.DiTTransformer2DModel(num_attention_heads=12, attention_head_dim=64,
                                                in_channels=4, num_layers=4, sample_size=32,
                                                patch_size=2, num_embeds_ada_norm=1000)
        return model, lambda batch, gen: (torch.randn(batch, 4, 32, 32, generator=gen),
                                          torch.randint(0, 1000, (batch,), generator=gen),
                                          torch.randint(0, 1000, (batch,), generator=gen))
    model = diffusers.UNet2DModel(sample_size=32, block_out_channels=(64, 128, 128),
                                  down_block_types=("DownBlock2D", "AttnDownBlock2D",
                                                    "DownBlock2D"),
                                  up_block_types=("UpBlock2D", "AttnUpBlock2D", "UpBlock2D"),
                                  norm_num_groups=32, layers_per_block=1)
    return model, lambda batch, gen: (torch.randn(batch, 3, 32, 32, generator=gen), 10)


def _timm(name):
    import timm
    import torch

    size = 224 if name.startswith("vit") else 160
    return timm.create_model(name, pretrained=False), lambda batch, gen: (
        torch.randn(batch, 3, size, size, generator=gen),)


MODELS = {"llama": _transformers, "qwen3": _transformers, "gemma2": _transformers,
          "bert": _transformers, "unet2d": _diffusers, "dit": _diffusers, "resnet50": _timm,
          "vit_base_patch16_224": _timm, "convnext_tiny": _timm}


def census(model):
    """(swapped, total, {class left: count}) of the normalization modules."""
    swapped = total = 0
    left = {}
    for m in model.modules():
        name = type(m).__name__
        if NORMALIZATION.search(name):
            total += 1
            if type(m).__module__.startswith("normkernels"):
                swapped += 1
            else:
                left[name] = left.get(name, 0) + 1
    return swapped, total, left


def _output(out):
    for attr in ("logits", "sample", "last_hidden_state"):
        if hasattr(out, attr):
            return getattr(out, attr)
    return out[0] if isinstance(out, tuple) else out


class _NormClock:
    """Seconds spent in the normalization modules' forwards (hooks on each)."""

    def __init__(self, model):
        self.seconds, self.handles, self.depth = 0.0, [], 0
        for m in model.modules():
            if NORMALIZATION.search(type(m).__name__):
                self.handles.append(m.register_forward_pre_hook(self._start))
                self.handles.append(m.register_forward_hook(self._stop))

    def _start(self, module, args):  # a norm inside a norm (AdaLayerNormZero's) counts once
        if not self.depth:
            self.t0 = time.perf_counter()
        self.depth += 1

    def _stop(self, module, args, out):
        self.depth -= 1
        if not self.depth:
            self.seconds += time.perf_counter() - self.t0

    def remove(self):
        for h in self.handles:
            h.remove()


def time_model(name, repeat=5, batch=8):
    """Per mode: median ms of the whole call and of its normalization forwards, torch's
    modules and normkernels', alternating on the same model and inputs."""
    import torch

    import normkernels.torch as nt

    model, make = MODELS[name](name)
    gen = torch.Generator().manual_seed(0)
    nt.replace_modules(model)
    swapped, total, left = census(model)
    nt.restore_modules(model)
    modes = {"batch-1 inference": (1, False), f"batch-{batch} inference": (batch, False),
             f"batch-{batch} training step": (batch, True)}
    rows = []
    for mode, (size, training) in modes.items():
        args = make(size, gen)
        model.train(training)
        opt = torch.optim.SGD(model.parameters(), lr=1e-6) if training else None
        times = {"torch": [], "normkernels": []}
        norms = {"torch": [], "normkernels": []}
        for i in range(2 * repeat + 2):  # the first round of each: warm-up
            who = "normkernels" if i % 2 else "torch"
            (nt.replace_modules if i % 2 else nt.restore_modules)(model)
            clock = _NormClock(model)
            start = time.perf_counter()
            if training:
                opt.zero_grad()
                _output(model(*args)).float().square().mean().backward()
                opt.step()
            else:
                with torch.inference_mode():
                    model(*args)
            if i >= 2:
                times[who].append(time.perf_counter() - start)
                norms[who].append(clock.seconds)
            clock.remove()
        nt.restore_modules(model)
        ms = {k: 1e3 * statistics.median(v) for k, v in times.items()}
        norm_ms = {k: 1e3 * statistics.median(v) for k, v in norms.items()}
        rows.append({"model": name, "mode": mode, "ms": ms, "norm_ms": norm_ms,
                     "ratio": ms["normkernels"] / ms["torch"], "swapped": swapped,
                     "total": total, "left": left})
    return rows


def command(args):
    """Run every model that builds here; print and return the markdown table."""
    lines = ["| model | swapped / norms | mode | torch ms | swapped ms | swapped / torch | "
             "norms ms, torch | norms ms, swapped |", "|---|---|---|---:|---:|---:|---:|---:|"]
    for name in MODELS:
        try:
            rows = time_model(name, repeat=args.repeat or 5)
        except Exception as exc:  # a zoo not installed, or torchvision beside a CPU torch
            print(f"{name}: skipped ({type(exc).__name__}: {str(exc)[:80]})", flush=True)
            continue
        for r in rows:
            left = ", ".join(f"{k} {v}" for k, v in r["left"].items()) or "none left"
            print(f"{name:22s} {r['mode']:26s} torch {r['ms']['torch']:8.2f} ms  swapped "
                  f"{r['ms']['normkernels']:8.2f} ms  {r['ratio']:.2f}  norms "
                  f"{r['norm_ms']['torch']:.2f} -> {r['norm_ms']['normkernels']:.2f} ms  "
                  f"[{r['swapped']}/{r['total']}: {left}]", flush=True)
            lines.append(f"| {name} | {r['swapped']}/{r['total']} | {r['mode']} | "
                         f"{r['ms']['torch']:.3g} | {r['ms']['normkernels']:.3g} | "
                         f"{r['ratio']:.2f} | {r['norm_ms']['torch']:.3g} | "
                         f"{r['norm_ms']['normkernels']:.3g} |")
    print("\n".join(lines))
    return 0

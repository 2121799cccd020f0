"""``normkernels bench --via torch``: normkernels.torch's modules against torch.nn's,
inside PyTorch, layer after layer.

For each network of :mod:`normkernels.bench.networks` (the normalization layers of
ResNet-50, BERT-base, Llama, ViT and the SD-1.5 UNet), every layer gets its own
torch.nn module, input and output gradient; a pass runs every layer once in network
order: the forward alone under ``torch.inference_mode`` (eval mode), or forward and
backward in training mode (dX and the parameter gradients). The torch modules and
their swapped copies (``normkernels.torch.replace_modules``) alternate, each result
checked against torch's first; the median pass time of each is reported, with
normkernels' time over torch's (below 1: normkernels faster). A tiny-tensor row gives
the per-call cost of each route: the NumPy call, the eager adapter, the custom operator
through torch's dispatcher, and torch.
"""

import copy
import statistics
import time

import numpy as np

from normkernels.bench import networks
from normkernels.operators import operator

TRAINING = ("resnet50-b32-ncx", "bert-b8", "sd15-unet")
INFERENCE = ("resnet50-b1-ncx", "bert-b1", "llama-decode", "vit-b16", "sd15-unet")
BUDGET_SECONDS = 20.0


# torch.nn's module for an operator's torch.nn.functional function (the table's
# ``torch``), built for a layer's input shape
_MODULES = {
    "batch_norm": lambda nn, shape: nn.BatchNorm2d(shape[1]),
    "group_norm": lambda nn, shape: nn.GroupNorm(32, shape[1]),
    "layer_norm": lambda nn, shape: nn.LayerNorm(shape[-1]),
    "rms_norm": lambda nn, shape: nn.RMSNorm(shape[-1], eps=1e-5),
}


def _module(nn, op, shape):
    make = _MODULES.get(operator(op).torch)
    if make is None:
        raise ValueError(f"no torch module for {op}")
    return make(nn, shape)


def layers(network, training, seed=0):
    """``(theirs, ours, inputs, grads)``: a torch.nn module per layer, its swapped
    copy, each layer's input (channels_last for NXC networks) and output gradient."""
    import torch

    import normkernels.torch as nt

    gen = torch.Generator().manual_seed(seed)
    theirs, ours, inputs, grads = [], [], [], []
    for shape in network.shapes:
        module = _module(torch.nn, network.op, shape)
        with torch.no_grad():
            for p in module.parameters():
                p.copy_(torch.randn(p.shape, generator=gen))
            if getattr(module, "running_mean", None) is not None:
                module.running_mean.copy_(torch.randn(shape[1], generator=gen))
                module.running_var.copy_(torch.rand(shape[1], generator=gen) + 0.5)
        swapped = copy.deepcopy(module)
        nt.replace_modules(swapped)
        x = torch.randn(shape, generator=gen)
        if network.layout == "NXC" and x.dim() == 4:
            x = x.contiguous(memory_format=torch.channels_last)
        for m in (module, swapped):
            m.train(training)
        theirs.append(module)
        ours.append(swapped)
        inputs.append(x.requires_grad_(training))
        grads.append(torch.randn(x.shape, generator=gen).to(memory_format=torch.preserve_format)
                     if training else None)
    return theirs, ours, inputs, grads


def _pass(modules, inputs, grads, training):
    import torch

    def run():
        if not training:
            with torch.inference_mode():
                for m, x in zip(modules, inputs, strict=True):
                    m(x)
            return
        for m, x, g in zip(modules, inputs, grads, strict=True):
            m(x).backward(g)
    return run


def check(theirs, ours, inputs, grads, training):
    """The largest difference of the swapped layers' Y (and dX) from torch's, relative
    to the largest value."""
    import torch

    worst = 0.0
    for a, b, x, g in zip(theirs, ours, inputs, grads, strict=True):
        pairs = []
        if training:
            for m in (a, b):
                x.grad = None
                y = m(x)
                y.backward(g)
                pairs.append((y.detach(), x.grad.clone()))
            x.grad = None
        else:
            with torch.inference_mode():
                pairs = [(a(x),), (b(x),)]
        for want, got in zip(*pairs, strict=True):
            scale = max(1.0, want.abs().max().item())
            worst = max(worst, (got.double() - want.double()).abs().max().item() / scale)
    return worst


def time_network(name, training, repeat=7, threads=None):
    import torch

    if threads:
        torch.set_num_threads(threads)
    network = networks.NETWORKS[name]
    theirs, ours, inputs, grads = layers(network, training)
    difference = check(theirs, ours, inputs, grads, training)
    runs = {"torch": _pass(theirs, inputs, grads, training),
            "normkernels": _pass(ours, inputs, grads, training)}
    for run in runs.values():
        run()
    times = {k: [] for k in runs}
    start = time.perf_counter()
    for r in range(repeat):
        for k in (list(runs) if r % 2 == 0 else list(runs)[::-1]):
            t0 = time.perf_counter()
            runs[k]()
            times[k].append(time.perf_counter() - t0)
        if time.perf_counter() - start > BUDGET_SECONDS and r >= 2:
            break
    ms = {k: 1e3 * statistics.median(v) for k, v in times.items()}
    return {"network": name, "title": network.title,
            "mode": "forward + backward" if training else "forward (inference)",
            "ms": ms, "ratio": ms["normkernels"] / ms["torch"], "rounds": len(times["torch"]),
            "max_relative_difference": difference}


def tiny_calls(repeat=7, number=2000):
    """Per-call microseconds on (1, 16, 8, 8) BatchNorm (eval) and (16, 64) LayerNorm:
    the NumPy call with ``out=``, the adapter (eager), the custom operator through the
    dispatcher, torch."""
    import timeit

    import torch
    import torch.nn.functional as F

    import normkernels as nk
    import normkernels.torch as nt
    from normkernels.torch import ops

    gen = torch.Generator().manual_seed(0)
    x4, x2 = torch.randn(1, 16, 8, 8, generator=gen), torch.randn(16, 64, generator=gen)
    w, b, rm, rv = (torch.randn(16, generator=gen), torch.randn(16, generator=gen),
                    torch.randn(16, generator=gen), torch.rand(16, generator=gen) + 0.5)
    s, t = torch.randn(64, generator=gen), torch.randn(64, generator=gen)
    X4, Y4, X2, Y2 = x4.numpy(), np.empty((1, 16, 8, 8), np.float32), x2.numpy(), \
        np.empty((16, 64), np.float32)
    arrays = [a.numpy() for a in (w, b, rm, rv, s, t)]
    cases = {
        "batchnorm eval (1, 16, 8, 8)": {
            "numpy out=": lambda: nk.batch_normalization(X4, *arrays[:4], out=Y4),
            "adapter": lambda: nt.batch_norm(x4, rm, rv, w, b, False),
            "custom op": lambda: ops.batch_norm_inference(x4, w, b, rm, rv, 1e-5),
            "torch": lambda: F.batch_norm(x4, rm, rv, w, b, False)},
        "layernorm (16, 64)": {
            "numpy out=": lambda: nk.layer_normalization(X2, *arrays[4:], out=Y2),
            "adapter": lambda: nt.layer_norm(x2, (64,), s, t),
            "custom op": lambda: ops.layer_norm(x2, 1, s, t, 1e-5),
            "torch": lambda: F.layer_norm(x2, (64,), s, t)},
    }
    rows = []
    with torch.inference_mode():
        for title, calls in cases.items():
            best = {k: float("inf") for k in calls}
            for f in calls.values():
                f()
            for _ in range(repeat):
                for k, f in calls.items():
                    best[k] = min(best[k], timeit.timeit(f, number=number) / number * 1e6)
            rows.append((title, best))
    return rows


STEPS = {"resnet50-b32-step": ("ResNet-50 batch 32, 224x224 (53 BN)", "resnet50-b32-ncx"),
         "bert-b8-step": ("BERT-base batch 8, seq 128 (25 LN)", "bert-b8")}


def training_step(name, steps=3, threads=None):
    """Median seconds of an SGD training step of a whole model with torch's modules
    and with them swapped (alternating), the normalization layers' forward + backward
    pass of the same shapes (:func:`time_network`), and their share of each step."""
    import torch

    import normkernels.torch as nt
    from normkernels.bench import torch_models

    if threads:
        torch.set_num_threads(threads)
    torch.manual_seed(0)
    if name.startswith("resnet50"):
        theirs = torch_models.resnet50()
        data = (torch.randn(32, 3, 224, 224), torch.randint(0, 1000, (32,)))
    else:
        theirs = torch_models.bert_base()
        data = (torch.randint(0, 30522, (8, 128)), torch.randint(0, 2, (8,)))
    ours = copy.deepcopy(theirs)
    nt.replace_modules(ours)
    models = {"torch": theirs, "normkernels": ours}
    opts = {k: torch.optim.SGD(m.parameters(), lr=1e-3) for k, m in models.items()}

    def step(k):
        opts[k].zero_grad()
        loss = torch.nn.functional.cross_entropy(models[k](data[0]), data[1])
        loss.backward()
        opts[k].step()
        return loss.item()

    times = {k: [] for k in models}
    losses = {k: step(k) for k in models}  # warm-up (and the first losses, compared)
    for r in range(steps):
        for k in (list(models) if r % 2 == 0 else list(models)[::-1]):
            t0 = time.perf_counter()
            step(k)
            times[k].append(time.perf_counter() - t0)
    ms = {k: 1e3 * statistics.median(v) for k, v in times.items()}
    title, layers_name = STEPS[name]
    layers_ = time_network(layers_name, True, repeat=5, threads=threads)["ms"]
    return {"network": name, "title": title, "step_ms": ms, "norm_ms": layers_,
            "share": {k: layers_[k] / ms[k] for k in ms}, "first_losses": losses,
            "speedup": ms["torch"] / ms["normkernels"]}


def command(args):
    """The ``--via torch`` run (``args.network`` narrows it)."""
    try:
        import torch  # noqa: F401
    except ImportError:
        print("bench --via torch needs torch (pip install torch==2.13.0, a CPU build)")
        return 1
    wanted = args.network
    results = []
    for training, names in ((True, TRAINING), (False, INFERENCE)):
        for name in names:
            if wanted and name not in wanted:
                continue
            r = time_network(name, training, repeat=args.repeat or 7, threads=args.threads)
            results.append(r)
            print(f"{r['title']:<55} {r['mode']:<20} torch {r['ms']['torch']:9.2f} ms  "
                  f"normkernels {r['ms']['normkernels']:9.2f} ms  nk/torch {r['ratio']:.2f}  "
                  f"(max rel. diff {r['max_relative_difference']:.1e})", flush=True)
    lines = ["| network (layers) | pass | torch ms | normkernels ms | normkernels / torch |",
             "|---|---|---:|---:|---:|"]
    for r in results:
        lines.append(f"| {r['title']} | {r['mode']} | {r['ms']['torch']:.3g} | "
                     f"{r['ms']['normkernels']:.3g} | {r['ratio']:.2f} |")
    step_rows = []
    for name in STEPS:
        if wanted and name not in wanted:
            continue
        r = training_step(name, threads=args.threads)
        step_rows.append(r)
        print(f"{r['title']:<40} step torch {r['step_ms']['torch']:.0f} ms, swapped "
              f"{r['step_ms']['normkernels']:.0f} ms; norms {r['share']['torch']:.0%} -> "
              f"{r['share']['normkernels']:.0%} of the step", flush=True)
    if step_rows:
        lines += ["", "| training step (SGD) | step, torch's modules ms | step, swapped ms | "
                  "norm layers' share, torch | norm layers' share, swapped | step speedup |",
                  "|---|---:|---:|---:|---:|---:|"]
        for r in step_rows:
            lines.append(f"| {r['title']} | {r['step_ms']['torch']:.0f} | "
                         f"{r['step_ms']['normkernels']:.0f} | {r['share']['torch']:.0%} | "
                         f"{r['share']['normkernels']:.0%} | {r['speedup']:.2f} |")
    tiny = tiny_calls()
    lines += ["", "| per call, us | " + " | ".join(tiny[0][1]) + " |",
              "|---|" + "---:|" * len(tiny[0][1])]
    for title, best in tiny:
        lines.append(f"| {title} | " + " | ".join(f"{v:.2f}" for v in best.values()) + " |")
    table = "\n".join(lines)
    print(table)
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write(table + "\n")
    if args.json:
        import json

        with open(args.json, "w") as f:
            json.dump({"networks": results, "steps": step_rows, "tiny": tiny}, f, indent=1)
    return 0

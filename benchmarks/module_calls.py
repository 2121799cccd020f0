"""Per module call: a swapped module (normkernels.torch.replace_modules) against the
same torch module, at the sizes of issue 45's table, without and with gradients.

    python benchmarks/module_calls.py [--threads 2] [--repeat 7] [--only NAME]

Each row alternates the two modules over the same input, best of ``--repeat`` rounds
of calls sized to about 50 ms; prints microseconds per call and swapped / torch
(below 1: normkernels faster). The transformers rows need the ``[models]`` extra.
"""

import argparse
import copy
import time

import torch
from torch import nn

import normkernels.torch as nt


def _llama(width, dtype):
    from transformers.models.llama.modeling_llama import LlamaRMSNorm
    return LlamaRMSNorm(width).to(dtype)


CASES = [  # name, module factory, input shape, dtype
    ("LayerNorm(64)", lambda: nn.LayerNorm(64), (1, 64), torch.float32),
    ("LayerNorm(768)", lambda: nn.LayerNorm(768), (1, 128, 768), torch.float32),
    ("LayerNorm(768) b8", lambda: nn.LayerNorm(768), (8, 128, 768), torch.float32),
    ("BatchNorm2d(64) eval", lambda: nn.BatchNorm2d(64).eval(), (1, 64, 56, 56), torch.float32),
    ("GroupNorm(32, 320)", lambda: nn.GroupNorm(32, 320), (1, 320, 32, 32), torch.float32),
    ("RMSNorm(4096)", lambda: nn.RMSNorm(4096), (1, 4096), torch.float32),
    ("RMSNorm(4096) x64", lambda: nn.RMSNorm(4096), (64, 4096), torch.float32),
    ("LlamaRMSNorm(4096)", lambda: _llama(4096, torch.float32), (1, 4096), torch.float32),
    ("LlamaRMSNorm(4096) bf16", lambda: _llama(4096, torch.bfloat16), (1, 4096),
     torch.bfloat16),
    ("LlamaRMSNorm(4096) bf16 x64", lambda: _llama(4096, torch.bfloat16), (64, 4096),
     torch.bfloat16),
]


def _time(fn, calls):
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - start) / calls


def measure(factory, shape, dtype, grad, repeat):
    """(torch's, swapped) microseconds per call."""
    theirs = factory()
    ours = copy.deepcopy(theirs)
    assert nt.replace_modules(ours), "not swapped"
    x = torch.randn(shape).to(dtype)
    if grad:
        x.requires_grad_()
        dy = torch.randn(shape).to(dtype)

        def call(m):
            return lambda: m(x).backward(dy)
    else:
        def call(m):
            def run():
                with torch.no_grad():
                    m(x)
            return run
    fns = [call(theirs), call(ours)]
    for fn in fns:  # warm: compile, plans, first-touch
        for _ in range(3):
            fn()
    calls = max(5, int(0.05 / max(_time(fns[0], 3), 1e-7)))
    best = [float("inf")] * 2
    for _ in range(repeat):
        for i, fn in enumerate(fns):
            best[i] = min(best[i], _time(fn, calls))
    return best[0] * 1e6, best[1] * 1e6


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--only", default="")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    print(f"{'module':28s} {'shape':>16s} {'grad':>5s} {'torch us':>9s} {'ours us':>9s} "
          f"{'ours/torch':>10s}")
    for name, factory, shape, dtype in CASES:
        if args.only not in name:
            continue
        for grad in (False, True):
            try:
                t, o = measure(factory, shape, dtype, grad, args.repeat)
            except ImportError as exc:
                print(f"{name:28s} skipped: {exc}")
                break
            print(f"{name:28s} {shape!s:>16s} {grad!s:>5s} {t:9.1f} {o:9.1f} "
                  f"{o / t:10.2f}", flush=True)


if __name__ == "__main__":
    main()

"""Quantized RMS normalization (int8 / float8_e4m3fn outputs) against the float output of
:func:`normkernels.rms_normalization` on the same input, and a torch composite
(``F.rms_norm``, then amax / div / round / clamp / to(int8)) when torch imports.

    python benchmarks/llm_quantized.py [--repeats 7]

Prints, per shape and dtype, the min time of several repeats (each a loop of calls long
enough to be timed, the functions' loops interleaved) and the ratio to the float
output (target: <= 1.10).
"""

import argparse
import time

import ml_dtypes
import numpy as np

import normkernels as nk

SHAPES = ((1, 4096), (4, 4096), (512, 4096))
DTYPES = (np.dtype(np.float32), np.dtype(ml_dtypes.bfloat16))
INT8 = np.int8
FP8 = ml_dtypes.float8_e4m3fn


def loops(fn, budget=0.01):
    """Calls of ``fn`` per timed loop: about ``budget`` seconds."""
    fn()
    n = 1
    while True:
        start = time.perf_counter()
        for _ in range(n):
            fn()
        t = time.perf_counter() - start
        if t >= budget / 4 or n >= 1 << 16:
            return max(1, int(n * budget / max(t, 1e-9)))
        n *= 4


def timed(fns, repeats):
    """Min seconds per call of each of ``fns``, their loops interleaved (the machine is
    shared: a busy phase then slows every function alike)."""
    counts = [loops(fn) for fn in fns]
    best = [np.inf] * len(fns)
    for _ in range(repeats):
        for k, (fn, n) in enumerate(zip(fns, counts, strict=True)):
            start = time.perf_counter()
            for _ in range(n):
                fn()
            best[k] = min(best[k], (time.perf_counter() - start) / n)
    return best


def torch_composite(x, w):
    try:
        import torch
    except ImportError:
        return None
    if x.dtype == np.dtype(ml_dtypes.bfloat16):
        xt = torch.from_numpy(x.view(np.int16)).view(torch.bfloat16)
        wt = torch.from_numpy(w.view(np.int16)).view(torch.bfloat16)
    else:
        xt, wt = torch.from_numpy(x), torch.from_numpy(w)
    K = x.shape[-1]

    def run():
        with torch.inference_mode():
            y = torch.nn.functional.rms_norm(xt.float(), (K,), wt.float(), 1e-6)
            s = y.abs().amax(dim=-1, keepdim=True).clamp(min=1.1920929e-07) / 127.0
            return (y / s).round().clamp(-128, 127).to(torch.int8), s

    return run


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    cases = {
        "int8 dynamic": dict(dtype=INT8),
        "fp8 dynamic": dict(dtype=FP8),
        "fp8 static": dict(dtype=FP8, static_scale=0.01),
        "int8 group128": dict(dtype=INT8, group_size=128),
    }
    header = f"{'shape':>12} {'dtype':>9} {'float out us':>13}"
    header += "".join(f" {name:>14}" for name in cases) + f" {'torch int8':>14}"
    print(header)
    for shape in SHAPES:
        for dt in DTYPES:
            x = rng.standard_normal(shape).astype(dt)
            w = (1 + 0.1 * rng.standard_normal(shape[-1])).astype(dt)
            fns = [lambda x=x, w=w: nk.rms_normalization(x, w, epsilon=1e-6)]
            fns += [lambda x=x, w=w, kw=kw: nk.quantized_rms_normalization(x, w, **kw)
                    for kw in cases.values()]
            composite = torch_composite(x, w)
            if composite is not None:
                fns.append(composite)
            base, *times = timed(fns, args.repeats)
            row = f"{shape!s:>12} {dt.name:>9} {base * 1e6:13.1f}"
            for t in times:
                row += f" {t * 1e6:7.1f} ({t / base:4.2f}x)"
            if composite is None:
                row += f" {'n/a':>14}"
            print(row, flush=True)
    print("times in microseconds per call (min of repeats); (ratio to the float output)")


if __name__ == "__main__":
    main()

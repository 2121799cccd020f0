"""GroupNorm + SiLU (onnxruntime's com.microsoft GroupNorm) against the same
normalization without the epilogue and against the unfused torch composite, and
adaptive LayerNorm (with and without the gated residual) against its torch composite,
at the shapes of issue 31's targets, in one process, interleaved (ratios, not times,
are what holds on a shared machine).

    python bench/fused_epilogues.py [--repeat 15] [--dtype float32]

For each shape and layout: the minimum over ``repeat`` rounds of one call each of

* ``gn``: ``normkernels.group_normalization`` (32 groups, ``out=`` preallocated);
* ``gn+silu``: ``normkernels.ort_group_norm(..., activation=1)`` into the same ``out``;
* ``torch gn+silu``: ``F.silu(F.group_norm(x, 32, w, b))`` on a tensor in the same
  memory format (channels_last for NXC), the composite a torch user writes;
* ``torch gn``: ``F.group_norm`` alone;

and the ratios the issue sets targets for: ``gn+silu / gn`` (<= 1.10) and ``gn+silu /
torch gn+silu`` (<= 0.5). AdaLN at (8, 1024, 1152): ``ada_layer_norm`` against
``layer_normalization`` (the same rows without modulation) and against DiT's torch code
(``F.layer_norm`` without affine, then ``* (1 + scale) + shift``; with the residual,
``x + gate * h`` first). BatchNorm inference + add + ReLU at (32, 64, 112, 112) against
BatchNorm alone and against ``F.relu(F.batch_norm(x) + r)``.
"""

import argparse
import time

import numpy as np

import normkernels as nk

SHAPES = ((1, 512, 64, 64), (1, 128, 256, 256), (2, 320, 64, 64))


def _min_time(fn, repeat):
    fn()
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def _runs(x, g, b, layout, torch, F):
    """The four calls of one workload (``x`` in ``layout`` memory order)."""
    out = np.empty_like(x)
    xt = torch.from_numpy(x)
    if layout == "NXC":
        xt = xt.movedim(-1, 1)  # channels_last memory, NCHW logically
    gt, bt = torch.from_numpy(g), torch.from_numpy(b)
    last = int(layout == "NXC")
    return {
        "gn": lambda: nk.group_normalization(x, g, b, num_groups=32, data_format=layout,
                                             out=out),
        "gn+silu": lambda: nk.ort_group_norm(x, g, b, groups=32, activation=1,
                                             channels_last=last, out=out),
        "torch gn+silu": lambda: F.silu(F.group_norm(xt, 32, gt, bt)),
        "torch gn": lambda: F.group_norm(xt, 32, gt, bt),
    }


def _ada_runs(rng, dtype, torch, F):
    N, T, C = 8, 1024, 1152
    h = rng.standard_normal((N, T, C)).astype(dtype)
    x = rng.standard_normal((N, T, C)).astype(dtype)
    shift, scale, gate = (rng.standard_normal((N, C)).astype(dtype) for _ in range(3))
    ones = np.ones(C, dtype)
    out = np.empty_like(h)
    ht, xt, st, ct, gt = (torch.from_numpy(a) for a in (h, x, shift, scale, gate))

    def torch_ada(v):
        return F.layer_norm(v, (C,), eps=1e-6) * (1 + ct.unsqueeze(1)) + st.unsqueeze(1)

    return {
        "ln": lambda: nk.layer_normalization(h, ones, epsilon=1e-6, out=out),
        "adaln": lambda: nk.ada_layer_norm(h, shift, scale, out=out),
        "torch adaln": lambda: torch_ada(ht),
        "adaln+residual": lambda: nk.ada_layer_norm(h, shift, scale, residual=x, gate=gate,
                                                    out=out),
        "torch adaln+residual": lambda: torch_ada(xt + gt.unsqueeze(1) * ht),
    }


def _bn_runs(rng, dtype, torch, F):
    shape = (32, 64, 112, 112)
    x = rng.standard_normal(shape).astype(dtype)
    r = rng.standard_normal(shape).astype(dtype)
    p = [rng.standard_normal(64).astype(dtype) for _ in range(3)]
    p.append(rng.uniform(0.5, 2, 64).astype(dtype))
    out = np.empty_like(x)
    xt, rt = torch.from_numpy(x), torch.from_numpy(r)
    pt = [torch.from_numpy(v) for v in p]
    return {
        "bn": lambda: nk.batch_normalization(x, *p, out=out),
        "bn+add+relu": lambda: nk.batch_normalization(x, *p, add=r, activation="relu", out=out),
        "torch bn+add+relu": lambda: F.relu(F.batch_norm(xt, pt[2], pt[3], pt[0], pt[1]) + rt),
        "torch bn": lambda: F.batch_norm(xt, pt[2], pt[3], pt[0], pt[1]),
    }


def _best(runs, repeat, torch):
    best = dict.fromkeys(runs, float("inf"))
    with torch.no_grad():
        for fn in runs.values():
            fn()
        for _ in range(repeat):  # interleaved rounds
            for name, fn in runs.items():
                best[name] = min(best[name], _min_time(fn, 1))
    return {k: v * 1e3 for k, v in best.items()}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=15)
    parser.add_argument("--dtype", default="float32")
    args = parser.parse_args(argv)
    import numba
    import torch
    import torch.nn.functional as F

    torch.set_num_threads(numba.get_num_threads())
    rng = np.random.default_rng(0)
    dtype = np.dtype(args.dtype)
    print("| shape | layout | gn ms | gn+silu ms | torch gn+silu ms | torch gn ms | "
          "gn+silu / gn | gn+silu / torch gn+silu |")
    print("|---|---|---:|---:|---:|---:|---:|---:|")
    for shape in SHAPES:
        C = shape[1]
        for layout in ("NCX", "NXC"):
            x = rng.standard_normal(shape).astype(dtype)
            if layout == "NXC":
                x = np.ascontiguousarray(np.moveaxis(x, 1, -1))
            g = rng.standard_normal(C).astype(dtype)
            b = rng.standard_normal(C).astype(dtype)
            ms = _best(_runs(x, g, b, layout, torch, F), args.repeat, torch)
            print(f"| {'x'.join(map(str, shape))} | {layout} | {ms['gn']:.3f} | "
                  f"{ms['gn+silu']:.3f} | {ms['torch gn+silu']:.3f} | {ms['torch gn']:.3f} | "
                  f"{ms['gn+silu'] / ms['gn']:.2f} | "
                  f"{ms['gn+silu'] / ms['torch gn+silu']:.2f} |")
    ms = _best(_ada_runs(rng, dtype, torch, F), args.repeat, torch)
    print()
    print("| 8x1024x1152 | ms | / ln | / torch |")
    print("|---|---:|---:|---:|")
    print(f"| layer_normalization | {ms['ln']:.3f} | 1.00 | - |")
    print(f"| ada_layer_norm | {ms['adaln']:.3f} | {ms['adaln'] / ms['ln']:.2f} | "
          f"{ms['adaln'] / ms['torch adaln']:.2f} |")
    print(f"| ada_layer_norm + gated residual | {ms['adaln+residual']:.3f} | "
          f"{ms['adaln+residual'] / ms['ln']:.2f} | "
          f"{ms['adaln+residual'] / ms['torch adaln+residual']:.2f} |")
    print(f"| torch: adaln {ms['torch adaln']:.3f} ms, with the residual "
          f"{ms['torch adaln+residual']:.3f} ms | | | |")
    ms = _best(_bn_runs(rng, dtype, torch, F), max(3, args.repeat // 3), torch)
    print()
    print("| 32x64x112x112 | bn ms | bn+add+relu ms | torch bn+add+relu ms | torch bn ms | "
          "fused / bn | fused / torch |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    print(f"| NCX | {ms['bn']:.2f} | {ms['bn+add+relu']:.2f} | {ms['torch bn+add+relu']:.2f} | "
          f"{ms['torch bn']:.2f} | {ms['bn+add+relu'] / ms['bn']:.2f} | "
          f"{ms['bn+add+relu'] / ms['torch bn+add+relu']:.2f} |")


if __name__ == "__main__":
    main()

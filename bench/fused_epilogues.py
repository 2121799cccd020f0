"""GroupNorm + SiLU (onnxruntime's com.microsoft GroupNorm) against the same
normalization without the epilogue and against the unfused torch composite, at the
shapes of issue 31's targets, in one process, interleaved (ratios, not times, are what
holds on a shared machine).

    python bench/fused_epilogues.py [--repeat 15] [--dtype float32]

For each shape and layout: the minimum over ``repeat`` rounds of one call each of

* ``gn``: ``normkernels.group_normalization`` (32 groups, ``out=`` preallocated);
* ``gn+silu``: ``normkernels.ort_group_norm(..., activation=1)`` into the same ``out``;
* ``torch gn+silu``: ``F.silu(F.group_norm(x, 32, w, b))`` on a tensor in the same
  memory format (channels_last for NXC), the composite a torch user writes;
* ``torch gn``: ``F.group_norm`` alone;

and the ratios the issue sets targets for: ``gn+silu / gn`` (<= 1.10) and ``gn+silu /
torch gn+silu`` (<= 0.5).
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
            runs = _runs(x, g, b, layout, torch, F)
            best = dict.fromkeys(runs, float("inf"))
            with torch.no_grad():
                for fn in runs.values():
                    fn()
                for _ in range(args.repeat):  # interleaved rounds
                    for name, fn in runs.items():
                        best[name] = min(best[name], _min_time(fn, 1))
            ms = {k: v * 1e3 for k, v in best.items()}
            print(f"| {'x'.join(map(str, shape))} | {layout} | {ms['gn']:.3f} | "
                  f"{ms['gn+silu']:.3f} | {ms['torch gn+silu']:.3f} | {ms['torch gn']:.3f} | "
                  f"{ms['gn+silu'] / ms['gn']:.2f} | "
                  f"{ms['gn+silu'] / ms['torch gn+silu']:.2f} |")


if __name__ == "__main__":
    main()

"""Backward passes against BN inference on the same tensor and PyTorch's backward, cold.

    python bench/backward.py                       # (32, 64, 112, 112) f32, NCX and NXC
    python bench/backward.py --shape 8,64,56,56 --dtype float16

Times, interleaved in one process with the caches flushed (256 MB written) before
each call, medians of ``--repeat``: BN inference (``normkernels.batch_normalization``,
out=), ``normkernels.batch_normalization_backward`` (training, out=), and when torch is
installed ``torch.ops.aten.native_batch_norm_backward`` on the same data (channels-last
memory for NXC, as a PyTorch user has it). Until the backward operators have their
records in the operator table (issue 17), this script is their benchmark.
"""

import argparse
import statistics
import time

import numpy as np

import normkernels as nk
from normkernels.benchmarks import DTYPES

FLUSH_BYTES = 256 << 20


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", default="32,64,112,112", help="N,C,spatial... (NCX order)")
    parser.add_argument("--dtype", default="float32", choices=list(DTYPES))
    parser.add_argument("--repeat", type=int, default=7)
    args = parser.parse_args(argv)
    shape = tuple(int(v) for v in args.shape.split(","))
    dtype = DTYPES[args.dtype]
    flush = np.empty(FLUSH_BYTES // 4, np.float32)
    rng = np.random.default_rng(0)
    try:
        import torch
    except ImportError:
        torch = None
    print(f"{'layout':6} {'BN inf ms':>9} {'backward ms':>11} {'/ BN inf':>8} {'torch ms':>8} "
          f"{'nk / torch':>10}")
    for fmt in ("NCX", "NXC"):
        ms = time_layout(fmt, shape, dtype, args.repeat, flush, rng, torch)
        torch_ms = ms.get("torch")
        print(f"{fmt:6} {ms['inference']:9.2f} {ms['backward']:11.2f} "
              f"{ms['backward'] / ms['inference']:7.2f}x "
              + (f"{torch_ms:8.2f} {ms['backward'] / torch_ms:9.2f}x" if torch_ms else
                 f"{'-':>8} {'-':>10}"))


def time_layout(fmt, shape, dtype, repeat, flush, rng, torch):
    """Median milliseconds of each call on one layout's tensors."""
    C = shape[1]
    X = rng.standard_normal(shape, dtype=np.float32).astype(dtype)
    dY = rng.standard_normal(shape, dtype=np.float32).astype(dtype)
    if fmt == "NXC":
        X, dY = (np.ascontiguousarray(np.moveaxis(a, 1, -1)) for a in (X, dY))
    out = np.empty_like(X)
    scale, zero = np.ones(C, np.float32), np.zeros(C, np.float32)
    x = np.moveaxis(X, -1, 1) if fmt == "NXC" else X
    axes = (0, *range(2, x.ndim))
    mean, var = x.mean(axes, dtype=np.float64), x.var(axes, dtype=np.float64)
    calls = {
        "inference": lambda: nk.batch_normalization(X, scale, zero, zero, scale,
                                                    data_format=fmt, out=out),
        "backward": lambda: nk.batch_normalization_backward(dY, X, scale, mean, var,
                                                            data_format=fmt, out=out),
    }
    if torch is not None and dtype == np.float32:
        import numba

        torch.set_num_threads(numba.get_num_threads())  # the same threads as the kernels
        xt = torch.from_numpy(x)
        dyt = torch.from_numpy(np.moveaxis(dY, -1, 1) if fmt == "NXC" else dY)
        w = torch.ones(C)
        save_mean = torch.from_numpy(mean.astype(np.float32))
        save_invstd = torch.from_numpy((1 / np.sqrt(var + 1e-5)).astype(np.float32))
        calls["torch"] = lambda: torch.ops.aten.native_batch_norm_backward(
            dyt, xt, w, None, None, save_mean, save_invstd, True, 1e-5, [True] * 3)
    for call in calls.values():
        call()
    times = {k: [] for k in calls}
    for _ in range(repeat):
        for name, call in calls.items():
            flush[:] = 1.0
            start = time.perf_counter()
            call()
            times[name].append(time.perf_counter() - start)
    return {k: statistics.median(v) * 1e3 for k, v in times.items()}


if __name__ == "__main__":
    main()

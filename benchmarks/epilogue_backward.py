"""The backward passes through the fused epilogues and of the modulated normalizations
(BN + add + ReLU, GroupNorm + SiLU, AdaGroupNorm, AdaLN) against the same
normalization's backward without the epilogue and against PyTorch's autograd of the
unfused composite (``torch.autograd.grad`` of the graph built once: threshold_backward,
silu_backward, the modulation's products and ATen's normalization backward), in one
process, interleaved (ratios hold on a shared machine, times do not).

    python benchmarks/epilogue_backward.py [--repeat 7] [--dtype float32]

The minimum over ``repeat`` interleaved rounds of one call each; normkernels writes dX
to ``out=``.
"""

import argparse
import time

import numpy as np

import normkernels as nk


def _once(fn):
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def _best(runs, repeat):
    for fn in runs.values():
        fn()
    best = dict.fromkeys(runs, float("inf"))
    for _ in range(repeat):
        for name, fn in runs.items():
            best[name] = min(best[name], _once(fn))
    return {k: v * 1e3 for k, v in best.items()}


def _grad(torch, outputs, inputs, dy):
    return lambda: torch.autograd.grad(outputs, inputs, dy, retain_graph=True)


def _layout(fmt, *arrays):
    """NCX arrays, or their channels-last copies (NXC)."""
    if fmt == "NCX":
        return arrays
    return tuple(np.ascontiguousarray(np.moveaxis(v, 1, -1)) for v in arrays)


def bn_add_relu(rng, dtype, torch, F, shape=(32, 64, 112, 112), fmt="NCX", add=True):
    C = shape[1]
    x, r, dy = (rng.standard_normal(shape).astype(dtype) for _ in range(3))
    r = r if add else np.zeros_like(r)
    scale, B = rng.uniform(0.5, 2, C).astype(dtype), rng.standard_normal(C).astype(dtype)
    x64 = x.astype(np.float64)
    mean, var = x64.mean(axis=(0, 2, 3)), x64.var(axis=(0, 2, 3))
    leaves = [torch.tensor(v, requires_grad=True) for v in (x, scale, B, r)]
    if fmt == "NXC":
        leaves[0] = leaves[0].detach().to(memory_format=torch.channels_last).requires_grad_()
        leaves[3] = leaves[3].detach().to(memory_format=torch.channels_last).requires_grad_()
    z = F.batch_norm(leaves[0], None, None, leaves[1], leaves[2], training=True)
    out = F.relu(z + leaves[3] if add else z)
    grads = _grad(torch, out, leaves if add else leaves[:3], torch.from_numpy(dy).contiguous(
        memory_format=torch.channels_last if fmt == "NXC" else torch.contiguous_format))
    x, r, dy = _layout(fmt, x, r, dy)
    Y = nk.batch_normalization(x, scale, B, mean.astype(dtype), var.astype(dtype),
                               activation="relu", add=r if add else None, data_format=fmt)
    dx = np.empty_like(x)
    kw = dict(data_format=fmt, out=dx)
    return {
        "plain": lambda: nk.batch_normalization_backward(dy, x, scale, mean, var, **kw),
        "fused": lambda: nk.batch_normalization_backward(dy, x, scale, mean, var, **kw,
                                                         activation="relu", Y=Y,
                                                         add=r if add else None),
        "torch": grads,
    }


def gn_silu(rng, dtype, torch, F, shape, fmt="NCX", statistics=False):
    """``statistics``: the forward's mean and inv_std given (the PyTorch adapter's
    route); else recomputed from X."""
    C = shape[1]
    x, dy = (rng.standard_normal(shape).astype(dtype) for _ in range(2))
    g, b = rng.uniform(0.5, 2, C).astype(dtype), rng.standard_normal(C).astype(dtype)
    leaves = [torch.tensor(v, requires_grad=True) for v in (x, g, b)]
    if fmt == "NXC":
        leaves[0] = leaves[0].detach().to(memory_format=torch.channels_last).requires_grad_()
    out = F.silu(F.group_norm(leaves[0], 32, leaves[1], leaves[2]))
    grads = _grad(torch, out, leaves, torch.from_numpy(dy).contiguous(
        memory_format=torch.channels_last if fmt == "NXC" else torch.contiguous_format))
    x, dy = _layout(fmt, x, dy)
    dx = np.empty_like(x)
    kw = dict(num_groups=32, out=dx, data_format=fmt)
    if statistics:
        from normkernels.engine.numba_engine import ENGINE
        from normkernels.ops import group_normalization as spec

        _, mean, inv_std = spec.group_normalization(x, g, b, num_groups=32, data_format=fmt,
                                                    engine=ENGINE, statistics=True)
        kw.update(mean=mean, inv_std=inv_std)
    return {
        "plain": lambda: nk.group_normalization_backward(dy, x, g, **kw),
        "fused": lambda: nk.group_normalization_backward(dy, x, g, **kw, activation="silu",
                                                         B=b),
        "torch": grads,
    }


def ada_gn(rng, dtype, torch, F, shape):
    N, C = shape[:2]
    x, dy = (rng.standard_normal(shape).astype(dtype) for _ in range(2))
    shift, scale = (rng.standard_normal((N, C)).astype(dtype) for _ in range(2))
    ones = np.ones(C, dtype)
    dx = np.empty_like(x)
    leaves = [torch.tensor(v, requires_grad=True) for v in (x, shift, scale)]
    out = (F.group_norm(leaves[0], 32) * (1 + leaves[2][:, :, None, None])
           + leaves[1][:, :, None, None])
    return {
        "plain": lambda: nk.group_normalization_backward(dy, x, ones, num_groups=32, out=dx),
        "fused": lambda: nk.ada_group_norm_backward(dy, x, shift, scale, num_groups=32,
                                                    out=dx),
        "torch": _grad(torch, out, leaves, torch.from_numpy(dy)),
    }


def ada_ln(rng, dtype, torch, F, residual):
    N, T, C = 8, 1024, 1152
    x, dy, res, ds = (rng.standard_normal((N, T, C)).astype(dtype) for _ in range(4))
    shift, scale, gate = (rng.standard_normal((N, C)).astype(dtype) for _ in range(3))
    ones = np.ones(C, dtype)
    dx = np.empty_like(x)
    names = ("x", "shift", "scale") + (("res", "gate") if residual else ())
    values = dict(x=x, shift=shift, scale=scale, res=res, gate=gate)
    leaves = [torch.tensor(values[k], requires_grad=True) for k in names]
    src = leaves[0]
    if residual:
        src = leaves[3] + leaves[4][:, None, :] * leaves[0]
    out = (F.layer_norm(src, (C,), eps=1e-6) * (1 + leaves[2][:, None, :])
           + leaves[1][:, None, :])
    outputs, grads = [out], [torch.from_numpy(dy)]
    if residual:
        outputs.append(src)
        grads.append(torch.from_numpy(ds))
    kw = dict(residual=res, gate=gate, dS=ds) if residual else {}
    return {
        "plain": lambda: nk.layer_normalization_backward(dy, x, ones, epsilon=1e-6, out=dx),
        "fused": lambda: nk.ada_layer_norm_backward(dy, x, shift, scale, out=dx, **kw),
        "torch": lambda: torch.autograd.grad(outputs, leaves, grads, retain_graph=True),
    }


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--dtype", default="float32")
    args = parser.parse_args(argv)
    import numba
    import torch
    import torch.nn.functional as F

    torch.set_num_threads(numba.get_num_threads())
    rng = np.random.default_rng(0)
    dtype = np.dtype(args.dtype)
    cases = [("BN + add + ReLU", "32x64x112x112", lambda: bn_add_relu(rng, dtype, torch, F))]
    # the sizes: X of 8 and 32 MB, both layouts
    for mb, bn_shape, gn_shape, gn_last in ((8, (8, 64, 64, 64), (1, 512, 64, 64),
                                             (1, 128, 128, 128)),
                                            (32, (32, 64, 64, 64), (4, 512, 64, 64),
                                             (4, 128, 128, 128))):
        for fmt in ("NCX", "NXC"):
            label = f"{'x'.join(map(str, bn_shape))} {fmt} ({mb} MB)"
            cases.append(("BN + add + ReLU", label, lambda s=bn_shape, f=fmt: bn_add_relu(
                rng, dtype, torch, F, s, f)))
            cases.append(("BN + ReLU", label, lambda s=bn_shape, f=fmt: bn_add_relu(
                rng, dtype, torch, F, s, f, add=False)))
            shape = gn_shape if fmt == "NCX" else gn_last
            label = f"{'x'.join(map(str, shape))} {fmt} ({mb} MB)"
            cases.append(("GN + SiLU, statistics given", label, lambda s=shape, f=fmt: gn_silu(
                rng, dtype, torch, F, s, f, statistics=True)))
    for shape in ((1, 512, 64, 64), (1, 128, 256, 256)):
        label = "x".join(map(str, shape))
        cases.append(("GN + SiLU", label, lambda s=shape: gn_silu(rng, dtype, torch, F, s)))
        cases.append(("AdaGroupNorm", label, lambda s=shape: ada_gn(rng, dtype, torch, F, s)))
    cases.append(("AdaLN", "8x1024x1152", lambda: ada_ln(rng, dtype, torch, F, False)))
    cases.append(("AdaLN, gated residual", "8x1024x1152",
                  lambda: ada_ln(rng, dtype, torch, F, True)))
    print(f"backward passes, {dtype}, {numba.get_num_threads()} threads, min of "
          f"{args.repeat} interleaved rounds")
    print()
    print("| backward of | shape | plain ms | fused ms | torch ms | fused / plain | "
          "fused / torch |")
    print("|---|---|---:|---:|---:|---:|---:|")
    for name, label, make in cases:
        ms = _best(make(), args.repeat)
        print(f"| {name} | {label} | {ms['plain']:.2f} | {ms['fused']:.2f} | "
              f"{ms['torch']:.2f} | {ms['fused'] / ms['plain']:.2f} | "
              f"{ms['fused'] / ms['torch']:.2f} |", flush=True)


if __name__ == "__main__":
    main()

"""GroupNorm + SiLU (onnxruntime's com.microsoft GroupNorm) against the same
normalization without the epilogue and against the unfused torch composite, and
adaptive LayerNorm (with and without the gated residual) against its torch composite,
at the shapes of issue 31's targets, in one process, interleaved (ratios, not times,
are what holds on a shared machine).

    python benchmarks/fused_epilogues.py [--repeat 15] [--dtype float32]

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
BatchNorm alone and against ``F.relu(F.batch_norm(x) + r)``. Each composite also runs
as onnxruntime's decomposed graph (``ort``: standard ONNX nodes, GroupNormalization-21
then Sigmoid and Mul; LayerNormalization-17 then Mul and Add; BatchNormalization, Add,
Relu), a session per model with every thread normkernels has; NCX only (ONNX's
layout), ``-`` where onnxruntime is not installed.
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


def _ort(nodes, inputs, feeds):
    """A call of onnxruntime on a graph of standard ONNX nodes (None without it)."""
    try:
        import numba
        import onnxruntime as ort
        from onnx import helper
    except ImportError:
        return None
    elem = helper.np_dtype_to_tensor_dtype(next(iter(feeds.values())).dtype)
    graph = helper.make_graph(
        nodes, "composite", [helper.make_tensor_value_info(n, elem, None) for n in inputs],
        [helper.make_tensor_value_info("Y", elem, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    model.ir_version = 10
    options = ort.SessionOptions()
    options.intra_op_num_threads = numba.get_num_threads()
    session = ort.InferenceSession(model.SerializeToString(), options,
                                   providers=["CPUExecutionProvider"])
    return lambda: session.run(None, feeds)


def _node(op, inputs, outputs, **attrs):
    from onnx import helper

    return helper.make_node(op, inputs, outputs, **attrs)


def _ort_gn_silu(x, g, b):
    return _ort([_node("GroupNormalization", ["X", "g", "b"], ["Z"], num_groups=32,
                       epsilon=1e-5),
                 _node("Sigmoid", ["Z"], ["S"]), _node("Mul", ["Z", "S"], ["Y"])],
                ["X", "g", "b"], {"X": x, "g": g, "b": b})


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
        "ort gn+silu": _ort_gn_silu(x, g, b) if layout == "NCX" else None,
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

    zeros = np.zeros(C, dtype)
    p = {"s1": (1 + scale)[:, None, :], "sh": shift[:, None, :], "g": gate[:, None, :],
         "one": ones, "zero": zeros}
    ada_nodes = [_node("LayerNormalization", ["S", "one", "zero"], ["L"], epsilon=1e-6),
                 _node("Mul", ["L", "s1"], ["M"]), _node("Add", ["M", "sh"], ["Y"])]
    names = ["S", "one", "zero", "s1", "sh"]
    ort_ada = _ort(ada_nodes, names, {"S": h, **{k: p[k] for k in names[1:]}})
    ort_res = _ort([_node("Mul", ["g", "H"], ["GH"]), _node("Add", ["R", "GH"], ["S"]),
                    *ada_nodes], ["H", "R", "g", *names[1:]],
                   {"H": h, "R": x, **{k: p[k] for k in ("g", *names[1:])}})
    return {
        "ort adaln": ort_ada,
        "ort adaln+residual": ort_res,
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
    ort_bn = _ort([_node("BatchNormalization", ["X", "s", "b", "m", "v"], ["Z"],
                         epsilon=1e-5),
                   _node("Add", ["Z", "R"], ["A"]), _node("Relu", ["A"], ["Y"])],
                  ["X", "s", "b", "m", "v", "R"],
                  {"X": x, "s": p[0], "b": p[1], "m": p[2], "v": p[3], "R": r})
    return {
        "ort bn+add+relu": ort_bn,
        "bn": lambda: nk.batch_normalization(x, *p, out=out),
        "bn+add+relu": lambda: nk.batch_normalization(x, *p, add=r, activation="relu", out=out),
        "torch bn+add+relu": lambda: F.relu(F.batch_norm(xt, pt[2], pt[3], pt[0], pt[1]) + rt),
        "torch bn": lambda: F.batch_norm(xt, pt[2], pt[3], pt[0], pt[1]),
    }


def _best(runs, repeat, torch):
    runs = {k: v for k, v in runs.items() if v is not None}
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
    print("| shape | layout | gn ms | gn+silu ms | torch gn+silu ms | ort gn+silu ms | "
          "gn+silu / gn | / torch gn+silu | / ort gn+silu |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|")
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
                  f"{ms['gn+silu']:.3f} | {ms['torch gn+silu']:.3f} | "
                  f"{_ms(ms, 'ort gn+silu')} | {ms['gn+silu'] / ms['gn']:.2f} | "
                  f"{_ratio(ms, 'gn+silu', 'torch gn+silu')} | "
                  f"{_ratio(ms, 'gn+silu', 'ort gn+silu')} |", flush=True)
    ms = _best(_ada_runs(rng, dtype, torch, F), args.repeat, torch)
    print()
    print("| 8x1024x1152 | ms | / ln | torch ms | / torch | ort ms | / ort |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    print(f"| layer_normalization | {ms['ln']:.3f} | 1.00 | | | | |")
    for label, key in (("ada_layer_norm", "adaln"),
                       ("ada_layer_norm + gated residual", "adaln+residual")):
        print(f"| {label} | {ms[key]:.3f} | {ms[key] / ms['ln']:.2f} | "
              f"{_ms(ms, 'torch ' + key)} | {_ratio(ms, key, 'torch ' + key)} | "
              f"{_ms(ms, 'ort ' + key)} | {_ratio(ms, key, 'ort ' + key)} |")
    ms = _best(_bn_runs(rng, dtype, torch, F), max(3, args.repeat // 3), torch)
    print()
    print("| 32x64x112x112 | bn ms | bn+add+relu ms | torch ms | ort ms | fused / bn | "
          "fused / torch | fused / ort |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    print(f"| NCX | {ms['bn']:.2f} | {ms['bn+add+relu']:.2f} | "
          f"{ms['torch bn+add+relu']:.2f} | {_ms(ms, 'ort bn+add+relu')} | "
          f"{ms['bn+add+relu'] / ms['bn']:.2f} | "
          f"{_ratio(ms, 'bn+add+relu', 'torch bn+add+relu')} | "
          f"{_ratio(ms, 'bn+add+relu', 'ort bn+add+relu')} |")


def _ms(ms, key):
    return f"{ms[key]:.3f}" if key in ms else "-"


def _ratio(ms, a, b):
    return f"{ms[a] / ms[b]:.2f}" if b in ms else "-"

if __name__ == "__main__":
    main()

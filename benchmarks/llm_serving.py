"""vLLM's fused residual add + RMSNorm and the Llama/Gemma RMSNorm forms at the sizes
of LLM serving: decode rows (1 and 4 tokens of 4096, warm: per-call cost) and prefill
(512 x 4096: bandwidth), in one process, interleaved (ratios hold on a shared machine,
times do not).

    python benchmarks/llm_serving.py [--repeat 200] [--dtype float32 bfloat16]

Columns, each the median over ``repeat`` interleaved rounds (one call each, several
calls per round at decode sizes):

* ``bind``: ``nk.bind(nk.fused_add_rms_norm, x, r, w)()``: one compiled call;
* ``plain``: ``nk.fused_add_rms_norm(x, r, w)`` (the planned call; the same buffers
  every call, as a serving loop passes them);
* ``torch``: vLLM's reference composite on torch CPU tensors, ``r.add_(x);
  F.rms_norm(r, (K,), w, eps)`` (in place on the residual, as vLLM's
  ``forward_native``; the Llama rounding is torch's own ``rms_norm``; torch with
  ``OMP_WAIT_POLICY=PASSIVE``: its spinning workers would take a core from the others);
* ``ort``: onnxruntime's SkipSimplifiedLayerNormalization (com.microsoft) with the sum
  as its fourth output, through ``run_with_iobinding`` on preallocated outputs
  (float32 only: its CPU provider has no bfloat16 kernel; thread spinning off);
* ``roofline`` (prefill): the time of two reads and two writes of x's bytes at the
  bandwidth of ``np.copyto`` between two such arrays (one read, one write), measured in
  the same rounds.

And the RMSNorm forms alone, ``rms_normalization(x, w, rounding="llama")`` and
``offset=1.0`` (Gemma), against ``rounding="once"`` (their cost over the plain kernel)
and against Hugging Face's LlamaRMSNorm and GemmaRMSNorm modules' arithmetic in torch.
"""

import argparse
import os
import time

import ml_dtypes
import numpy as np

import normkernels as nk

EPS = 1e-6
SHAPES = ((1, 4096), (4, 4096), (512, 4096))
DTYPES = {"float32": np.float32, "bfloat16": ml_dtypes.bfloat16}


def _per_call(fn, n):
    def run():
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        return (time.perf_counter() - t0) / n

    return run


def _medians(calls, repeat):
    """Median seconds per call of each entry, the entries interleaved round by round."""
    times = {k: [] for k in calls}
    for run in calls.values():
        run()
    for _ in range(repeat):
        for k, run in calls.items():
            times[k].append(run())
    return {k: float(np.median(v)) for k, v in times.items()}


def _ort_skip(x, r, w):
    try:
        import numba
        import onnxruntime as ort
        from onnx import helper
    except ImportError:
        return None
    if x.dtype == ml_dtypes.bfloat16:  # no bfloat16 kernel on onnxruntime's CPU provider
        return None
    elem = helper.np_dtype_to_tensor_dtype(x.dtype)
    node = helper.make_node("SkipSimplifiedLayerNormalization", ["X", "R", "W"],
                            ["Y", "", "", "S"], domain="com.microsoft", epsilon=EPS)
    io = [helper.make_tensor_value_info(n, elem, list(x.shape)) for n in ("X", "R")]
    graph = helper.make_graph([node], "skip", [*io, helper.make_tensor_value_info(
        "W", elem, [x.shape[1]])], [helper.make_tensor_value_info(n, elem, list(x.shape))
                                    for n in ("Y", "S")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21),
                                                    helper.make_opsetid("com.microsoft", 1)])
    model.ir_version = 10
    options = ort.SessionOptions()
    options.intra_op_num_threads = numba.get_num_threads()
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    try:
        session = ort.InferenceSession(model.SerializeToString(), options,
                                       providers=["CPUExecutionProvider"])
    except Exception:
        return None
    binding = session.io_binding()
    for name, arr in (("X", x), ("R", r), ("W", w)):
        binding.bind_cpu_input(name, arr)
    y, s = np.empty_like(x), np.empty_like(x)
    for name, arr in (("Y", y), ("S", s)):
        binding.bind_output(name, "cpu", 0, elem, arr.shape, arr.ctypes.data)
    keep = (x, r, w, y, s)  # the bound memory must outlive the binding

    def run():
        session.run_with_iobinding(binding)
        return keep

    return run


def _fused_runs(rng, shape, dtype, torch, F, n):
    x = rng.standard_normal(shape).astype(dtype)
    r = rng.standard_normal(shape).astype(dtype)
    w = rng.uniform(0.5, 2, shape[1]).astype(dtype)
    xs, rs = x.copy(), r.copy()  # the bench's buffers (their values drift: timing only)
    runs = {"bind": _per_call(nk.bind(nk.fused_add_rms_norm, xs, rs, w, epsilon=EPS), n),
            "plain": _per_call(lambda: nk.fused_add_rms_norm(xs, rs, w, epsilon=EPS), n)}
    if torch is not None:
        tdt = torch.bfloat16 if dtype == ml_dtypes.bfloat16 else torch.float32
        tx = torch.from_numpy(x.astype(np.float32)).to(tdt)
        tr = torch.from_numpy(r.astype(np.float32)).to(tdt)
        tw = torch.from_numpy(w.astype(np.float32)).to(tdt)

        def composite():
            tr.add_(tx)
            return F.rms_norm(tr, (shape[1],), tw, EPS)

        runs["torch"] = _per_call(composite, n)
    ort_call = _ort_skip(x, r, w)
    if ort_call is not None:
        runs["ort"] = _per_call(ort_call, n)
    if shape[0] >= 64:
        a, b = np.empty_like(x), np.empty_like(x)
        runs["copy"] = _per_call(lambda: np.copyto(a, b), n)
    return runs


def _rms_runs(rng, shape, dtype, torch, n):
    x = rng.standard_normal(shape).astype(dtype)
    w = rng.uniform(0.5, 2, shape[1]).astype(dtype)
    out = np.empty_like(x)
    runs = {"once": _per_call(lambda: nk.rms_normalization(x, w, epsilon=EPS, out=out), n),
            "llama": _per_call(lambda: nk.rms_normalization(x, w, epsilon=EPS, rounding="llama",
                                                            out=out), n),
            "gemma": _per_call(lambda: nk.rms_normalization(x, w, epsilon=EPS, offset=1.0,
                                                            out=out), n)}
    if torch is not None:
        tdt = torch.bfloat16 if dtype == ml_dtypes.bfloat16 else torch.float32
        tx = torch.from_numpy(x.astype(np.float32)).to(tdt)
        tw = torch.from_numpy(w.astype(np.float32)).to(tdt)

        def llama():  # transformers' LlamaRMSNorm.forward
            h = tx.to(torch.float32)
            h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + EPS)
            return tw * h.to(tdt)

        def gemma():  # transformers' GemmaRMSNorm.forward
            h = tx.float()
            h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + EPS)
            return (h * (1.0 + tw.float())).to(tdt)

        runs["torch llama"] = _per_call(llama, n)
        runs["torch gemma"] = _per_call(gemma, n)
    return runs


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=200)
    parser.add_argument("--dtype", nargs="+", default=list(DTYPES), choices=list(DTYPES))
    args = parser.parse_args(argv)
    # torch's OpenMP workers spin after each parallel region (and onnxruntime's, unless
    # told not to), taking a core from the next candidate on a 2-core machine
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    try:
        import torch
        import torch.nn.functional as F
    except ImportError:
        torch = F = None
    if torch is not None:
        import numba

        torch.set_num_threads(numba.get_num_threads())
    rng = np.random.default_rng(0)
    print("fused_add_rms_norm (vLLM): median us per call; ratios to torch's composite, "
          "onnxruntime and the roofline")
    print(f"{'dtype':9s} {'shape':12s} {'bind':>8s} {'plain':>8s} {'torch':>8s} {'ort':>8s} "
          f"{'roofline':>9s} {'plain/torch':>11s} {'plain/ort':>9s} {'roofline/plain':>14s}")
    for name in args.dtype:
        for shape in SHAPES:
            n = 50 if shape[0] < 64 else 1
            repeat = args.repeat if shape[0] < 64 else max(20, args.repeat // 4)
            ms = _medians(_fused_runs(rng, shape, DTYPES[name], torch, F, n), repeat)
            us = {k: v * 1e6 for k, v in ms.items()}
            roof = 2 * us["copy"] if "copy" in us else None  # 2 reads + 2 writes
            print(f"{name:9s} {shape!s:12s} {us['bind']:8.2f} {us['plain']:8.2f} "
                  f"{_f(us.get('torch'))} {_f(us.get('ort'))} {_f(roof, 9)} "
                  f"{_r(us['plain'], us.get('torch'), 11)} {_r(us['plain'], us.get('ort'), 9)} "
                  f"{_r(roof, us['plain'], 14)}")
    print()
    print("rms_normalization forms: median us per call; ratios to rounding='once' and to "
          "transformers' module arithmetic in torch")
    print(f"{'dtype':9s} {'shape':12s} {'once':>8s} {'llama':>8s} {'gemma':>8s} "
          f"{'llama/once':>10s} {'gemma/once':>10s} {'llama/torch':>11s} {'gemma/torch':>11s}")
    for name in args.dtype:
        for shape in SHAPES:
            n = 50 if shape[0] < 64 else 1
            repeat = args.repeat if shape[0] < 64 else max(20, args.repeat // 4)
            us = {k: v * 1e6 for k, v in
                  _medians(_rms_runs(rng, shape, DTYPES[name], torch, n), repeat).items()}
            print(f"{name:9s} {shape!s:12s} {us['once']:8.2f} {us['llama']:8.2f} "
                  f"{us['gemma']:8.2f} {_r(us['llama'], us['once'], 10)} "
                  f"{_r(us['gemma'], us['once'], 10)} "
                  f"{_r(us['llama'], us.get('torch llama'), 11)} "
                  f"{_r(us['gemma'], us.get('torch gemma'), 11)}")


def _f(value, width=8):
    return f"{'-':>{width}s}" if value is None else f"{value:{width}.2f}"


def _r(a, b, width):
    return f"{'-':>{width}s}" if a is None or b is None else f"{a / b:{width}.2f}"


if __name__ == "__main__":
    main()

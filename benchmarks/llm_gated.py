"""Gated RMSNorm and QK-norm against torch composites and a copy roofline.

    .venv/bin/python benchmarks/llm_gated.py [--repeats N]

* gated_rms_normalization (norm before gate, whole rows) on (1, 4096) and (512, 4096),
  float32 and bfloat16, against torch's ``F.rms_norm(x, (K,), w) * F.silu(z)``;
* qk_rms_normalization on a packed qkv (512, (32 + 2 * 8) * 128) = (512, 6144), float32
  and bfloat16, against the copy roofline (the q and k bytes read and written: the time
  ``np.copyto`` takes to copy that many bytes) and against torch's composite (a view per
  head, ``F.rms_norm`` of the q and k heads, copied back into the buffer).

Times are the minimum over ``--repeats`` rounds of a few calls each, measured in this
run; ratios are to baselines of the same run.
"""

import argparse
import time

import ml_dtypes
import numpy as np

import normkernels as nk

BF16 = np.dtype(ml_dtypes.bfloat16)


def best(fn, repeats, inner):
    """The fastest of ``repeats`` rounds, a round being the mean of ``inner`` calls
    (decode sizes) or, with ``inner`` 1, single calls (the 2 shared cores of this VM
    preempt a thread now and then: a parallel call then waits ~10 ms at its barrier)."""
    fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(inner):
            fn()
        times.append((time.perf_counter() - start) / inner)
    return min(times)


def to_torch(torch, a):
    if a.dtype == BF16:
        return torch.from_numpy(a.view(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(a)


def gated_cases():
    rng = np.random.default_rng(0)
    for shape in ((1, 4096), (512, 4096)):
        for dtype in (np.dtype(np.float32), BF16):
            x = rng.standard_normal(shape).astype(dtype)
            z = rng.standard_normal(shape).astype(dtype)
            w = rng.standard_normal(shape[-1]).astype(dtype)
            yield f"gated {shape[0]}x{shape[1]} {dtype.name}", x, z, w


QK = (512, 32, 8, 128)  # tokens, q heads, kv heads, head_dim (Qwen3-8B)


def qk_cases():
    rng = np.random.default_rng(1)
    M, nq, nkv, D = QK
    for dtype in (np.dtype(np.float32), BF16):
        qkv = rng.standard_normal((M, (nq + 2 * nkv) * D)).astype(dtype)
        qw, kw = (rng.uniform(0.5, 2, D).astype(dtype) for _ in range(2))
        yield f"qk_norm {M}x{(nq + 2 * nkv) * D} {dtype.name}", qkv, qw, kw


def rounds(shape, repeats):
    """``(rounds, calls per round)``: decode sizes average 200 calls a round."""
    return (repeats, 200) if shape[0] == 1 else (repeats * 6, 1)


def ours(repeats):
    """Our times (and the roofline), measured before torch is imported: torch's OpenMP
    workers, spinning after its calls, took a core from Numba's on this 2-core VM."""
    times = {}
    for name, x, z, w in gated_cases():
        out = np.empty_like(x)
        times[name] = (best(lambda x=x, z=z, w=w, out=out: nk.gated_rms_normalization(
            x, z, w, out=out), *rounds(x.shape, repeats)), None)
    M, nq, nkv, D = QK
    for name, qkv, qw, kw in qk_cases():
        n = M * (nq + nkv) * D  # q and k elements, read once and written once
        src, dst = np.ones(n, qkv.dtype), np.empty(n, qkv.dtype)
        roof = best(lambda src=src, dst=dst: np.copyto(dst, src), *rounds(qkv.shape, repeats))
        times[name] = (best(lambda qkv=qkv, qw=qw, kw=kw: nk.qk_rms_normalization(
            qkv, qw, kw, num_q_heads=nq, num_kv_heads=nkv, head_dim=D),
            *rounds(qkv.shape, repeats)), roof)
    return times


def theirs(torch, repeats):
    F = torch.nn.functional
    times = {}
    with torch.inference_mode():
        for name, x, z, w in gated_cases():
            tx, tz, tw = (to_torch(torch, v) for v in (x, z, w))
            times[name] = best(lambda tx=tx, tz=tz, tw=tw: F.rms_norm(
                tx, (tx.shape[-1],), tw, 1e-6) * F.silu(tz), *rounds(x.shape, repeats))
        M, nq, nkv, D = QK
        for name, qkv, qw, kw in qk_cases():
            t = to_torch(torch, qkv).view(M, nq + 2 * nkv, D)
            tq, tk = to_torch(torch, qw), to_torch(torch, kw)

            def composite(t=t, tq=tq, tk=tk):
                t[:, :nq] = F.rms_norm(t[:, :nq], (D,), tq, 1e-6)
                t[:, nq:nq + nkv] = F.rms_norm(t[:, nq:nq + nkv], (D,), tk, 1e-6)

            times[name] = best(composite, *rounds(qkv.shape, repeats))
    return times


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    start = time.perf_counter()
    mine = ours(args.repeats)
    import torch

    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; "
          f"min of {args.repeats} rounds of 200 calls (1 x 4096), else of "
          f"{6 * args.repeats} single calls")
    other = theirs(torch, args.repeats)
    print(f"{'case':28} {'ours us':>9} {'torch us':>9} {'torch/ours':>10} {'roof us':>8} "
          f"{'ours/roof':>9}")
    for name, (t, roof) in mine.items():
        extra = "" if roof is None else f" {roof * 1e6:8.1f} {t / roof:9.2f}"
        print(f"{name:28} {t * 1e6:9.1f} {other[name] * 1e6:9.1f} {other[name] / t:10.2f}"
              f"{extra}")
    print(f"({time.perf_counter() - start:.1f} s)")


if __name__ == "__main__":
    main()

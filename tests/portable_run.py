"""Run in a fresh process (by tests/test_portable.py) for one Numba target: every
warmup case of the operator table (every family, forward and backward, NCX and NXC,
serial, parallel and streaming paths) at float16, bfloat16 and float32 on random
data, and the 16-bit conversions over a structured sample of float32 bit patterns.
Writes every result to an .npz file, for a bit-for-bit comparison between targets.

    python tests/portable_run.py OUT.npz [OPERATOR,...]

With operator names, only their cases at float16 and bfloat16 (a quick run).
"""

import sys

import numpy as np

DTYPES = ("float16", "bfloat16", "float32")


def conversion_sample():
    """float32 bit patterns that reach every rounding case of both 16-bit formats:
    every (sign, exponent, top 10 fraction bits) with the low 13 bits at the float16
    rounding edges (0, 1, just below / at / above the tie), the same for bfloat16's low
    16 bits, and random patterns (float16's subnormal range rounds at higher bits)."""
    high = np.arange(1 << 19, dtype=np.uint32) << 13
    f16_edges = np.array([0, 1, 0xFFF, 0x1000, 0x1001, 0x1FFF], np.uint32)
    bf16_edges = np.array([0x7FFF, 0x8000, 0x8001, 0xFFFF], np.uint32)
    rng = np.random.default_rng(26)
    return np.concatenate([
        (high[:, None] | f16_edges).ravel(),
        ((high[::8, None] & 0xFFFF0000) | bf16_edges).ravel(),
        rng.integers(0, 1 << 32, 1 << 20, dtype=np.uint64).astype(np.uint32),
    ])


def _vector_conversion(dtype, direction):
    """An ``@njit`` loop converting 32 elements at a time with the vector bodies' own
    IR builders (``vectors.storage_codec``): ``direction`` "narrow" (float32 ->
    16-bit bits) or "widen"."""
    from llvmlite import ir
    from numba import njit, types
    from numba.core.extending import intrinsic

    from normkernels.kernels.vectors import storage_codec

    lanes, _, widen, narrow = storage_codec(dtype)
    i16, f32 = ir.IntType(16), ir.FloatType()
    source, target, build = (f32, i16, narrow) if direction == "narrow" else (i16, f32, widen)

    @intrinsic
    def convert(typingctx, src, dst, index):
        def codegen(context, builder, sig, args):
            def pointer(k, elem):
                data = context.make_array(sig.args[k])(context, builder, args[k]).data
                return builder.bitcast(builder.gep(data, [args[2]]),
                                       ir.VectorType(elem, lanes).as_pointer())

            value = builder.load(pointer(0, source), align=2)
            builder.store(build(builder, value, lanes), pointer(1, target), align=2)
            return context.get_dummy_value()

        return types.void(src, dst, index), codegen

    @njit
    def run(src, dst):
        for i in range(0, src.size - lanes + 1, lanes):
            convert(src, dst, i)

    return run


def conversions(bits):
    """The kernels' own conversions of float32 ``bits`` and of every 16-bit pattern:
    the scalar ``store``/``load`` and the vector bodies' builders, both ways."""
    from numba import njit, types

    from normkernels.kernels.elements import load, store

    @njit
    def narrow_scalar(x, out):
        for i in range(x.size):
            store(out, i, x[i])

    @njit
    def widen_scalar(h, out):
        for i in range(h.size):
            out[i] = load(h, i)

    x = bits.view(np.float32)
    results = {}
    for name, storage, nbtype in (("float16", np.uint16, types.uint16),
                                  ("bfloat16", np.int16, types.int16)):
        every16 = np.arange(1 << 16, dtype=np.uint16).view(storage)
        for label, run, src, dst in (
                ("narrow-scalar", narrow_scalar, x, np.empty(x.size, storage)),
                ("widen-scalar", widen_scalar, every16, np.empty(every16.size, np.float32)),
                ("narrow-vector", _vector_conversion(nbtype, "narrow"), x,
                 np.empty(x.size, storage)),
                ("widen-vector", _vector_conversion(nbtype, "widen"), every16,
                 np.empty(every16.size, np.float32))):
            run(src, dst)
            results[f"{label}-{name}"] = dst
    return results


def fill(rng, shape, dtype):
    """Random X with an offset (mean 3, std 2): the statistics and every rounding see
    ordinary data, no NaN (NaN payloads are the conversions' business, above)."""
    return (rng.standard_normal(shape) * 2 + 3).astype(dtype)


def flatten(result):
    if isinstance(result, np.ndarray):
        return [result]
    if hasattr(result, "_asdict"):
        result = tuple(result._asdict().values())
    if isinstance(result, (tuple, list)):
        return [a for r in result for a in flatten(r)]
    return [np.asarray(result)]


def reproductions(rng):
    """The calls issue 26 reported killing the process on AVX2 (x86-64-v3) and SSE2
    (generic) CPUs, at their own shapes: (name, call) at bfloat16 and float16."""
    import ml_dtypes

    import normkernels as nk

    calls = []
    for dtype in (np.dtype(ml_dtypes.bfloat16), np.dtype(np.float16)):
        for rows, cols in ((1, 3), (128, 768)):
            x = fill(rng, (rows, cols), dtype)
            g, b = fill(rng, cols, dtype), fill(rng, cols, dtype)
            calls += [(f"{dtype}/layer_normalization/{rows}x{cols}",
                       lambda x=x, g=g, b=b: nk.layer_normalization(x, g, b)),
                      (f"{dtype}/rms_normalization/{rows}x{cols}",
                       lambda x=x, g=g: nk.rms_normalization(x, g))]
        x = fill(rng, (2, 3, 4, 4), dtype)
        s, b, m = (fill(rng, 3, dtype) for _ in range(3))
        v = np.abs(fill(rng, 3, dtype))
        calls.append((f"{dtype}/batch_normalization/2x3x4x4",
                      lambda x=x, s=s, b=b, m=m, v=v: nk.batch_normalization(x, s, b, m, v)))
    return calls


def main(out, only=None):
    from normkernels.bench.cli import warmup_calls
    from normkernels.kernels.target import jit_target

    results = {}
    if only is None:
        results = {f"conversion/{k}": v for k, v in conversions(conversion_sample()).items()}
        for name, call in reproductions(np.random.default_rng(26)):
            results[f"reproduction/{name}"] = call()
    for dtype, op, case, path, call in warmup_calls(DTYPES if only is None else DTYPES[:2], fill):
        if only is not None and op.name not in only:
            continue
        for k, a in enumerate(flatten(call())):
            results[f"{dtype}/{op.name}/{case.label}/{case.mode}/{case.data_format}/"
                    f"{path}/{k}"] = a
    target = jit_target()
    np.savez(out, **{k: np.ascontiguousarray(v).view(np.uint8).reshape(-1)
                     for k, v in results.items()},
             __target__=np.array(f"{target.cpu} {sorted(target.found)}"))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2].split(",") if len(sys.argv) > 2 else None)

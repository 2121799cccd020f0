"""Digest of every public result over the default bench suite, the test shapes and
the operator table's warmup cases.

    python benchmarks/output_digest.py > before.json      # on the old code
    python benchmarks/output_digest.py > after.json       # on the new code
    python benchmarks/output_digest.py --compare before.json after.json

Uses only the public API and builds its own inputs, so it runs unchanged across a
refactor: equal digests mean bitwise-equal results (Y and every statistic, dtype and
shape included) for every call listed. Sizes cross the serial / parallel / streaming
thresholds, so each path of each operator is exercised; the thread count is Numba's
default.
"""

import argparse
import hashlib
import json
import sys

import ml_dtypes
import numpy as np

import normkernels as nk

DTYPES = {"float16": np.float16, "bfloat16": ml_dtypes.bfloat16, "float32": np.float32,
          "float64": np.float64}
# the default bench suite (NCX shapes) and the test suite's shapes, odd and degenerate
BENCH = [((32, 64, 112, 112), "float32", "NCX"), ((32, 64, 112, 112), "float32", "NXC"),
         ((32, 64, 112, 112), "float16", "NCX"), ((32, 64, 112, 112), "bfloat16", "NCX"),
         ((64, 2048, 7, 7), "float32", "NCX"), ((4096, 1024), "float32", "NCX"),
         ((8, 64, 256, 256), "float32", "NCX"), ((1, 16, 8, 8), "float32", "NCX")]
SHAPES = [(7,), (5, 3), (1, 1, 1, 1), (2, 3, 5), (2, 3, 4, 5), (2, 3, 2, 3, 4), (3, 5, 7, 9),
          (2, 64, 33), (1, 3, 40, 40), (4, 3, 100, 100), (2, 16, 256, 256), (3, 1, 2000),
          (70, 2, 3), (2, 130, 1, 1)]


def digest(value):
    h = hashlib.sha256()
    for v in value if isinstance(value, tuple) else (value,):
        v = np.asarray(v)
        h.update(f"{v.dtype.name}{v.shape}".encode())
        h.update(np.ascontiguousarray(v).view(np.uint8).tobytes())
    return h.hexdigest()[:16]


def layout(ncx_shape, fmt):
    if fmt == "NXC" and len(ncx_shape) > 2:
        return (ncx_shape[0], *ncx_shape[2:], ncx_shape[1])
    return ncx_shape


def inputs(ncx_shape, dtype, fmt, seed, offset=0.0, pdtype=np.float32, strided=False):
    rng = np.random.default_rng(seed)
    shape = layout(ncx_shape, fmt)
    big = (shape[0] * 2, *shape[1:]) if strided else shape
    X = (rng.standard_normal(big) * 2 + offset).astype(DTYPES[dtype])
    if strided:
        X = X[::2]
    C = ncx_shape[1] if len(ncx_shape) > 1 else 1
    p = [rng.uniform(0.5, 2.0, C), rng.standard_normal(C), rng.standard_normal(C) + offset,
         rng.uniform(0.5, 2.0, C)]
    return X, [v.astype(pdtype) for v in p]


def calls():
    """(label, zero-argument call) for every result compared."""
    cases = [(s, d, f, 0.0, False) for s, d, f in BENCH]
    for shape in SHAPES:
        for dtype in DTYPES:
            for fmt in ("NCX", "NXC"):
                if np.prod(shape) > 1 << 20 and dtype != "float32":
                    continue
                cases.append((shape, dtype, fmt, 0.0, False))
            cases.append((shape, dtype, "NCX", 1e4, True))
    for k, (shape, dtype, fmt, offset, strided) in enumerate(cases):
        label = f"{shape}-{dtype}-{fmt}-{offset:g}{'-strided' if strided else ''}"
        X, p = inputs(shape, dtype, fmt, k, offset, strided=strided)
        Xd, pd = inputs(shape, dtype, fmt, k, offset, DTYPES[dtype], strided)
        kw = {"data_format": fmt}
        yield f"bn15-inf {label}", lambda X=X, p=p, kw=kw: nk.batch_normalization(X, *p, **kw)
        yield f"bn15-train {label}", lambda X=X, p=p, kw=kw: nk.batch_normalization(
            X, *p, training_mode=1, momentum=0.7, **kw)
        if dtype != "bfloat16":
            yield f"bn9-train {label}", lambda X=Xd, p=pd, kw=kw: nk.batch_normalization(
                X, *p, opset=9, num_outputs=5, **kw)
            yield f"bn9-inv-std {label}", lambda X=Xd, p=pd, kw=kw: nk.batch_normalization(
                X, *p, opset=9, num_outputs=5, saved_var="inv_std", **kw)
            yield f"bn7-spatial0-train {label}", lambda X=Xd, kw=kw, k=k: nk.batch_normalization(
                X, *inputs_sample(X, k), opset=7, spatial=0, num_outputs=3, **kw)
            yield f"bn6-spatial0-inf {label}", lambda X=Xd, p=pd, kw=kw: nk.batch_normalization(
                X, *p, opset=6, spatial=0, is_test=1, **kw)
        if len(shape) >= 2 and dtype != "float64":
            pb = [v.astype(ml_dtypes.bfloat16) for v in p] if dtype == "bfloat16" else p
            yield f"onednn {label}", lambda X=X, p=pb, kw=kw: nk.batch_norm_inference(
                X, *p, epsilon=1e-3, **kw)
        if len(shape) >= 3:
            yield f"in22 {label}", lambda X=Xd, p=pd, kw=kw: nk.instance_normalization(
                X, *p[:2], **kw)
            if dtype != "bfloat16":
                yield f"in6 {label}", lambda X=Xd, p=pd, kw=kw: nk.instance_normalization(
                    X, *p[:2], epsilon=1e-2, opset=6, **kw)
        yield f"moments {label}", lambda X=X, kw=kw: nk.moments(X, **kw)
        yield f"partial {label}", lambda X=X, kw=kw: tuple(nk.partial_moments(X, **kw))
    yield from table_calls()


def table_calls():
    """Every warmup case of the operator table (every operator, forward and backward,
    NCX and NXC, each path its cases force) in every dtype, on random data with an
    offset: the operators the shapes above leave out (rows, groups, Lp, LRN, the
    backward passes, oneDNN's training operations)."""
    from normkernels.bench.cli import warmup_calls

    def fill(rng, shape, dtype):
        return (rng.standard_normal(shape) * 2 + 3).astype(dtype)

    for dtype, op, case, path, call in warmup_calls(fill=fill):
        yield (f"table {dtype}/{op.name}/{case.label}/{case.mode}/{case.data_format}/"
               f"{path}"), call


def inputs_sample(X, seed):
    """spatial=0 parameters: one value per activation (the shape of one sample)."""
    rng = np.random.default_rng(seed)
    sample = X.shape[1:] or (1,)
    p = [rng.uniform(0.5, 2.0, sample), rng.standard_normal(sample),
         rng.standard_normal(sample), rng.uniform(0.5, 2.0, sample)]
    return [v.astype(X.dtype) for v in p]


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--compare", nargs=2, metavar=("BEFORE", "AFTER"))
    args = parser.parse_args(argv)
    if args.compare:
        before, after = (json.load(open(p)) for p in args.compare)
        differ = sorted(k for k in before.keys() | after.keys()
                        if before.get(k) != after.get(k))
        for k in differ:
            print(f"differs: {k}: {before.get(k)} -> {after.get(k)}")
        print(f"{len(before)} results before, {len(after)} after, {len(differ)} differ")
        return 1 if differ else 0
    result = {}
    for label, call in calls():
        with np.errstate(all="ignore"):
            result[label] = digest(call())
    json.dump(result, sys.stdout, indent=0, sort_keys=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

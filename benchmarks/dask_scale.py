"""normkernels.dask at scale: training-mode BatchNormalization on an input larger
than this machine's memory, generated chunk by chunk and never materialised, and the
overhead of dask against the single-machine kernel on an input that fits.

    python benchmarks/dask_scale.py                 # 40 GB input, then a 2 GB comparison
    python benchmarks/dask_scale.py --gb 4 --fit-gb 1

Larger than memory: X is ``dask.array.random.default_rng(seed).standard_normal`` in
float32 (each chunk regenerated when needed); the batch statistics (a tree reduction
of normkernels' partial moments), the normalized Y reduced to a checksum, and the
running statistics are computed in one graph with the threaded scheduler; X is
therefore generated twice (statistics, then normalize). Reports the wall time, GB/s
of X processed (2 x its size), the time of generating X twice alone, and the peak
resident memory of the process.

Fits in memory: the same operator on a NumPy array, single-machine normkernels
against normkernels.dask on ``da.from_array`` of it (threaded scheduler), both
writing Y into a preallocated array (``out=``): the overhead ratio (target: at most
1.5x).
"""

import argparse
import resource
import statistics
import time

import numpy as np


def peak_rss_gb():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20


def larger_than_memory(gb, chunk_mb, seed=0):
    import dask
    import dask.array as da

    from normkernels import dask as nkd

    C, H, W = 64, 128, 128
    per_sample = C * H * W * 4
    N = int(gb * 2**30 // per_sample)
    n_chunk = max(1, int(chunk_mb * 2**20 // per_sample))
    rng = da.random.default_rng(seed)
    X = rng.standard_normal((N, C, H, W), chunks=(n_chunk, C, H, W), dtype=np.float32)
    p = [np.linspace(0.5, 2, C, dtype=np.float32) for _ in range(4)]
    with dask.config.set(scheduler="threads"):
        t0 = time.perf_counter()
        X.sum(dtype=np.float64).compute()
        t_gen = time.perf_counter() - t0
        t0 = time.perf_counter()
        # the statistics now (pass 1), then Y on them (pass 2): X is never held whole
        Y, _rm, rv = nkd.batch_normalization(X, *p, training_mode=1, compute_statistics=True)
        t_stats = time.perf_counter() - t0
        checksum, running_var = dask.compute(Y.sum(dtype=np.float64), rv)
        t_run = time.perf_counter() - t0
    nbytes = X.nbytes
    print(f"larger than memory: X {tuple(X.shape)} float32 = {nbytes / 2**30:.1f} GiB in "
          f"chunks of {n_chunk * per_sample / 2**20:.0f} MiB, threaded scheduler")
    print(f"  statistics ({t_stats:.1f} s) + normalize and checksum: {t_run:.1f} s in all, "
          f"{2 * nbytes / t_run / 1e9:.2f} GB/s of X processed (X generated in each pass)")
    print(f"  generating X alone (a sum): {t_gen:.1f} s ({nbytes / t_gen / 1e9:.2f} GB/s), "
          f"so the two passes' generation is about {2 * t_gen:.1f} s of the total")
    print(f"  checksum of Y {checksum:.6e} (N*H*W * sum(B) = {N * H * W * p[1].sum():.6e} "
          f"expected); running var {running_var[:3]} (0.9 * var + 0.1 * about 1)")
    print(f"  peak resident memory of the process: {peak_rss_gb():.2f} GiB")
    return t_run


def fits_in_memory(gb, chunk_mb, repeat=3):
    import dask
    import dask.array as da

    import normkernels as nk
    from normkernels import dask as nkd

    C, H, W = 64, 128, 128
    per_sample = C * H * W * 4
    N = max(2, int(gb * 2**30 // per_sample))
    X = np.random.default_rng(1).standard_normal((N, C, H, W), dtype=np.float32)
    p = [np.linspace(0.5, 2, C, dtype=np.float32) for _ in range(4)]
    out = np.empty_like(X)
    n_chunk = max(1, int(chunk_mb * 2**20 // per_sample))
    Xd = da.from_array(X, chunks=(n_chunk, C, H, W))

    def single():
        return nk.batch_normalization(X, *p, training_mode=1, out=out)

    def distributed():  # Y written straight into out, as the single-machine call does
        return nkd.batch_normalization(Xd, *p, training_mode=1, out=out)

    times = {"single": [], "dask": []}
    with dask.config.set(scheduler="threads"):
        single(), distributed()
        for _ in range(repeat):
            for name, fn in (("single", single), ("dask", distributed)):
                t0 = time.perf_counter()
                fn()
                times[name].append(time.perf_counter() - t0)
    med = {k: statistics.median(v) for k, v in times.items()}
    print(f"fits in memory: X {X.shape} float32 = {X.nbytes / 2**30:.2f} GiB, chunks of "
          f"{n_chunk * per_sample / 2**20:.0f} MiB: single-machine {med['single'] * 1e3:.0f} ms, "
          f"normkernels.dask (threads) {med['dask'] * 1e3:.0f} ms: "
          f"{med['dask'] / med['single']:.2f}x")
    return med


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--gb", type=float, default=40.0, help="size of the large input")
    parser.add_argument("--fit-gb", type=float, default=2.0, help="size of the in-memory one")
    parser.add_argument("--chunk-mb", type=float, default=128.0)
    args = parser.parse_args()
    if args.gb > 0:
        larger_than_memory(args.gb, args.chunk_mb)
    if args.fit_gb > 0:
        fits_in_memory(args.fit_gb, args.chunk_mb)


if __name__ == "__main__":
    main()

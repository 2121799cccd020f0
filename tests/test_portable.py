"""Every CPU Numba runs on: the kernels built for other targets than this machine's
give the same bits as here (issue 26).

Numba's JIT cannot link compiler-rt, so a 16-bit conversion the target has no
instruction for must never reach LLVM as ``fptrunc``/``fpext`` (it aborted the
process on AVX2 and SSE2 CPUs). Each target runs ``tests/portable_run.py`` in a fresh
process with an empty kernel cache, built for it with ``NUMBA_CPU_NAME`` and
``NUMBA_CPU_FEATURES=""`` (without the empty feature list Numba keeps this CPU's, and
an AVX-512 host would hide the crash):

* ``x86-64-v3``: AVX2, FMA, F16C, no AVX-512 (most laptops and cloud VMs): float16
  by F16C, bfloat16 on the bits;
* ``generic``: baseline x86-64 (SSE2): both 16-bit formats on the bits.
"""

import os
import shutil
import subprocess
import sys
import traceback
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

HERE = Path(__file__).resolve().parent
TARGETS = ("x86-64-v3", "generic")
pytestmark = pytest.mark.skipif(
    os.uname().machine not in ("x86_64", "amd64"), reason="the x86-64 targets")


def _run(out, cache, cpu=None, only=()):
    env = dict(os.environ, NUMBA_CACHE_DIR=str(cache))
    env.pop("NUMBA_CPU_NAME", None)
    env.pop("NUMBA_CPU_FEATURES", None)
    if cpu is not None:
        env.update(NUMBA_CPU_NAME=cpu, NUMBA_CPU_FEATURES="")
    only = [",".join(only)] if only else []
    return subprocess.Popen([sys.executable, str(HERE / "portable_run.py"), str(out), *only],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)


def _host_cache():
    from normkernels.bench.cli import cache_files

    return cache_files()[0]


def _in_this_process(out):
    """portable_run.py's run in this process: this machine's target and the suite's
    kernel cache, so that the kernels it compiles serve the rest of the suite too (in a
    process of its own it compiled them all a second time, a tenth of the suite's
    time). ``(0, "", out)``, or 1 and the traceback."""
    sys.path.insert(0, str(HERE))
    try:
        import portable_run

        portable_run.main(str(out))
    except Exception:
        return 1, traceback.format_exc(), out
    finally:
        sys.path.remove(str(HERE))
    return 0, "", out


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """{target: the results of portable_run.py built for it}; "host" is this machine
    with its own (the suite's) kernel cache, run while the others build with empty
    caches."""
    root = tmp_path_factory.mktemp("portable")
    procs = {cpu: _run(root / f"{cpu}.npz", root / f"{cpu}-cache", cpu) for cpu in TARGETS}
    results = {"root": root, "host": _in_this_process(root / "host.npz")}
    for name, proc in procs.items():
        output, _ = proc.communicate(timeout=3000)
        results[name] = (proc.returncode, output, root / f"{name}.npz")
    return results


def _load(results, name):
    code, output, path = results[name]
    assert code == 0, f"portable_run.py for {name} exited {code} (134: abort, -11/139: " \
                      f"segfault):\n{output[-3000:]}"
    with np.load(path) as data:
        return {k: data[k] for k in data.files}


@pytest.mark.parametrize("cpu", TARGETS)
def test_every_family_runs_on_other_targets(runs, cpu):
    """Every warmup case of the operator table (each family, forward and backward,
    NCX and NXC, serial/parallel/streaming) at float16, bfloat16 and float32, and the
    calls the issue reported aborting (LayerNorm and RMSNorm of (1, 3) and (128, 768),
    BatchNormalization of (2, 3, 4, 4), bfloat16 and float16), run to the end in a
    process built for ``cpu``, give every result the host gives, and the conversions
    give the host's bits."""
    host, other = _load(runs, "host"), _load(runs, cpu)
    assert str(other.pop("__target__")).startswith(cpu)
    host.pop("__target__")
    assert sorted(other) == sorted(host)
    assert len([k for k in host if not k.startswith("conversion/")]) > 200
    assert len([k for k in host if k.startswith("reproduction/")]) == 10
    differ = [k for k in host if k.startswith("conversion/")
              and not np.array_equal(host[k], other[k])]
    assert not differ, f"conversions differ from the host's on {cpu}: {differ}"


@pytest.mark.parametrize("cpu", TARGETS)
def test_every_family_gives_the_host_bits_on_other_targets(runs, cpu):
    """The same results as the host's kernels, bit for bit: every warmup case of the
    operator table at float16, bfloat16 and float32. This needs every reduction in a
    fixed order (kernels/lanes.py): an LLVM-vectorised sum follows the target's vector
    width and FMA, and gave last-bit differences on generic before. One exception, by
    design: float32 rows on a target without FMA (generic) keep float64 lanes, so
    their Y is compared with the host's within the bound (docs/design.md)."""
    host, other = _load(runs, "host"), _load(runs, cpu)
    fma = [" 'fma'" in str(r.pop("__target__")) for r in (host, other)]
    differ = [k for k in host if not np.array_equal(host[k], other[k])]
    if fma[0] != fma[1]:
        # float32 rows: float32 lanes with FMA, float64 lanes without (row_vectors):
        # both within the bound of the exact result, so within twice it of each other
        rows = [k for k in differ if k.startswith("float32/")]
        assert rows, "float32 rows gave the same bits with and without FMA"
        for k in rows:
            h, o = (r[k].view(np.float32).astype(np.float64) for r in (host, other))
            bound = 2.0 ** -20 * np.max(np.abs(h))  # 2 ulp + 2 u |n s| + half an ulp
            assert np.all(np.abs(h - o) <= bound), (k, np.max(np.abs(h - o)), bound)
        differ = [k for k in differ if k not in rows]
    assert not differ, f"{len(differ)} results differ from the host's on {cpu}: {differ[:20]}"


@pytest.mark.parametrize(("made_for", "used_by"), [("host", "x86-64-v3"),
                                                   ("x86-64-v3", "generic")])
def test_a_kernel_cache_made_for_one_cpu_does_not_crash_another(runs, tmp_path, made_for,
                                                                 used_by):
    """A kernel cache built on one machine and shipped to another (a container image):
    Numba keys each cached kernel on (triple, CPU name, features), so the kernels built
    for ``made_for`` (AVX-512 code from this host) are not loaded by a process built
    for ``used_by``: it compiles its own beside them, runs, and gives the same bits."""
    made = _host_cache() if made_for == "host" else runs["root"] / f"{made_for}-cache"
    _load(runs, made_for)  # its run succeeded, so its cache holds the kernels
    cache = tmp_path / "cache"
    shutil.copytree(made, cache)
    before = {p.relative_to(cache) for p in cache.rglob("*.nbc")}  # paths: names repeat
    # across the cache's directories (in-tree beside NUMBA_CACHE_DIR's kernels_<hash>/)
    # two light families are enough to show the other CPU's kernels are not loaded (the
    # bits of every family on each target are the runs' own test): 15 s each to compile
    proc = _run(tmp_path / "out.npz", cache, used_by, only=("lpnorm", "lrn"))
    output, _ = proc.communicate(timeout=1500)
    runs = dict(runs, quick=(proc.returncode, output, tmp_path / "out.npz"))
    quick, host = _load(runs, "quick"), _load(runs, "host")
    quick.pop("__target__")
    assert len(quick) >= 10
    differ = [k for k in quick if not np.array_equal(quick[k], host[k])]
    assert not differ, differ[:20]
    added = {p.relative_to(cache) for p in cache.rglob("*.nbc")} - before
    assert added, f"no kernel was compiled for {used_by}: {made_for}'s were loaded"


def _f16_reference(bits):
    """float32 bits -> float16 bits as the conversion instructions give them: NumPy's
    rounding for numbers, a NaN made quiet with its high payload bits and sign kept."""
    x = bits.view(np.float32)
    with np.errstate(over="ignore", invalid="ignore"):
        ref = x.astype(np.float16).view(np.uint16).copy()
    nan = np.isnan(x)
    ref[nan] = (((bits[nan] >> 16) & 0x8000) | 0x7E00 | ((bits[nan] >> 13) & 0x3FF))
    return ref


def _bf16_reference(bits):
    """float32 bits -> bfloat16 bits: ml_dtypes' rounding for numbers, a NaN made quiet
    with its high payload bits and sign kept (as ``vcvtneps2bf16`` does)."""
    x = bits.view(np.float32)
    with np.errstate(invalid="ignore"):
        ref = x.astype(ml_dtypes.bfloat16).view(np.uint16).copy()
    nan = np.isnan(x)
    ref[nan] = (bits[nan] >> 16) | 0x40
    return ref


def test_conversions_round_to_nearest_even_everywhere(runs):
    """The conversions of every target against NumPy and ml_dtypes (ties to even,
    overflow to infinity, subnormals exact, NaN quiet): float32 bit patterns at every
    rounding edge, and every 16-bit pattern widened."""
    sys.path.insert(0, str(HERE))
    try:
        from portable_run import conversion_sample
    finally:
        sys.path.remove(str(HERE))
    bits = conversion_sample()
    every16 = np.arange(1 << 16, dtype=np.uint16)
    f16_wide = every16.view(np.float16).astype(np.float32).view(np.uint32)
    f16_nan = np.isnan(every16.view(np.float16))
    f16_wide[f16_nan] |= 0x400000  # the instructions quiet a signalling NaN
    expected = {"narrow-float16": _f16_reference(bits), "narrow-bfloat16": _bf16_reference(bits),
                "widen-float16": f16_wide, "widen-bfloat16": every16.astype(np.uint32) << 16}
    for name in ("host", *TARGETS):
        got = _load(runs, name)
        for key, want in expected.items():
            direction, dtype = key.split("-")
            for kind in ("scalar", "vector"):
                have = got[f"conversion/{direction}-{kind}-{dtype}"].view(want.dtype)
                assert have.size == want.size, (name, key, kind)
                wrong = np.flatnonzero(have != want)
                source = bits if direction == "narrow" else every16
                assert wrong.size == 0, (
                    f"{name}: {kind} {key} of {wrong.size} values, e.g. "
                    f"{[(hex(source[i]), hex(have[i]), hex(want[i])) for i in wrong[:5]]}")


@pytest.mark.parametrize(("cpu", "f16", "bf16", "dq", "avx"), [
    ("generic", False, False, False, False),
    ("x86-64-v2", False, False, False, False),
    ("x86-64-v3", True, False, False, True),
    ("x86-64-v4", True, False, True, True),  # AVX-512 without BF16: Skylake-SP to Ice Lake
    ("skylake-avx512", True, False, True, True),
    ("sapphirerapids", True, True, True, True),
    ("znver4", True, True, True, True),
])
def test_the_probe_reads_what_each_target_has(cpu, f16, bf16, dq, avx):
    """What LLVM emits for each x86-64 target, as kernels/target.py reads it (the
    features of the CPU name: NUMBA_CPU_FEATURES empty)."""
    from normkernels.kernels.target import probe

    target = probe("x86_64-unknown-linux-gnu", cpu, "")
    assert (target.f16_native, target.bf16_native, target.avx512dq, target.avx) == (
        f16, bf16, dq, avx)
    assert ("integer bits" in target.conversions()["float16"]) == (not f16)
    assert ("vcvtneps2bf16" in target.conversions()["bfloat16"]) == bf16


def test_the_probe_follows_an_explicit_feature_list():
    """A host whose hypervisor hides AVX-512 behind a CPU name that has it: the feature
    list decides, not the name."""
    from normkernels.kernels.target import probe

    hidden = probe("x86_64-unknown-linux-gnu", "znver4",
                   "-avx512f,-avx512bw,-avx512dq,-avx512vl,-avx512bf16,-avx512cd,-avx512vnni,"
                   "-avx512vbmi,-avx512vbmi2,-avx512bitalg,-avx512vpopcntdq,-avx512ifma")
    assert hidden.f16_native and not hidden.bf16_native and not hidden.avx512dq
    assert "avx512f" not in hidden.features_shown()


def test_info_prints_the_target_and_the_conversion_paths(capsys):
    from normkernels.bench import cli
    from normkernels.kernels.target import jit_target

    assert cli.main(["info"]) == 0
    out = capsys.readouterr().out
    target = jit_target()
    assert f"kernels built for: {target.cpu}" in out
    for dtype, how in target.conversions().items():
        assert f"{dtype} conversions (narrow / widen): {how}" in out

"""What compiling costs a user, and the disk cache several processes share (issue 44):
saves from concurrent processes keep every entry, ``warmup(jobs=N)`` leaves nothing
to compile, a cached load skips the compiler's set-up, and ``coldstart --profile``
accounts for a first call's time. No timed assertions: counts and bits."""

import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

_SAVER = """
import sys
from numba.core.caching import IndexDataCacheFile
from normkernels.kernels import cache
cache._CACHE_DIRS.add({root!r})
f = IndexDataCacheFile({root!r}, "kernel", "stamp")
for i in range({n}):
    f.save(("{who}", i), ("{who}", i))
"""


def _python(code, **env):
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                          text=True, timeout=900, env={**os.environ, **env})


def test_concurrent_saves_keep_every_entry_with_its_own_data(tmp_path):
    """Two processes saving entries of one cached function at once (a parallel
    warm-up, two test workers): every entry stays in the index and names a data file
    holding its own data. Numba's save re-read the index without a lock, so the two
    lost each other's entries or gave two keys one data file."""
    root = str(tmp_path.resolve())
    n = 150
    procs = [subprocess.Popen([sys.executable, "-c", _SAVER.format(root=root, n=n, who=who)],
                              stderr=subprocess.PIPE, text=True) for who in ("a", "b")]
    for proc in procs:
        _, err = proc.communicate(timeout=900)
        assert proc.returncode == 0, err
    from numba.core.caching import IndexDataCacheFile

    from normkernels.kernels import cache

    cache._CACHE_DIRS.add(root)
    f = IndexDataCacheFile(root, "kernel", "stamp")
    index = f._load_index()
    assert sorted(index) == sorted((who, i) for who in "ab" for i in range(n))
    assert len(set(index.values())) == 2 * n
    for key in index:
        assert f.load(key) == key


def test_warmup_in_processes_leaves_nothing_to_compile(tmp_path):
    """``normkernels warmup --jobs 2`` into an empty cache, then a fresh process: its
    warm-up of the same loads every kernel and compiles none (the two compiling
    processes lost no entry of each other's), and a call gives the bits of a
    process that compiled for itself."""
    cache = str(tmp_path / "cache")
    done = subprocess.run([sys.executable, "-m", "normkernels", "warmup", "--ops", "lrn",
                           "--dtypes", "float32,float16", "--jobs", "2"], capture_output=True,
                          text=True, timeout=900, env={**os.environ, "NUMBA_CACHE_DIR": cache})
    assert done.returncode == 0, done.stderr[-3000:]
    assert "float16" in done.stdout and "float32" in done.stdout
    check = """
        import json
        import numpy as np
        import normkernels as nk
        from normkernels.bench import compile_profile
        r = compile_profile.profile(lambda: nk.warmup(["lrn"], ["float32", "float16"]))
        X = np.random.default_rng(0).standard_normal((2, 7, 5, 3)).astype(np.float16)
        y = nk.lrn(X, size=3)
        print(json.dumps([r["compiled"], r["loaded"], y.view(np.uint16).tolist()]))
    """
    warm = _python(check, NUMBA_CACHE_DIR=cache)
    assert warm.returncode == 0, warm.stderr[-3000:]
    compiled, loaded, bits = json.loads(warm.stdout.strip().splitlines()[-1])
    assert compiled == 0 and loaded > 0
    own = _python(check, NUMBA_CACHE_DIR=str(tmp_path / "own"))
    assert own.returncode == 0, own.stderr[-3000:]
    assert json.loads(own.stdout.strip().splitlines()[-1])[2] == bits


def test_a_cached_load_does_not_set_up_the_compiler_and_a_compile_after_it_works(tmp_path):
    """A process whose kernels all come from the disk cache never refreshes Numba's
    target context (every typing and lowering registry: a third of its first call);
    a kernel compiled after such loads, another dtype, still types and runs."""
    cache = str(tmp_path)
    code = """
        import json
        import numpy as np
        from numba.core import base
        calls = []
        refresh = base.BaseContext.refresh
        def counted(self):
            calls.append(1)
            return refresh(self)
        base.BaseContext.refresh = counted
        import normkernels as nk
        X = np.arange(24, dtype=np.float32).reshape(4, 6) / 7
        y = nk.layer_normalization(X, np.ones(6, np.float32), np.zeros(6, np.float32))
        first = len(calls)
        z = nk.layer_normalization(X.astype(np.float64), np.ones(6), np.zeros(6))
        print(json.dumps([first, len(calls), y.tolist(), z.tolist()]))
    """
    compiling = _python(code, NUMBA_CACHE_DIR=cache)
    assert compiling.returncode == 0, compiling.stderr[-3000:]
    first, _, y, _ = json.loads(compiling.stdout.strip().splitlines()[-1])
    assert first > 0  # it compiled: the compiler set itself up
    loading = _python(code.replace("X.astype(np.float64), np.ones(6), np.zeros(6)",
                                   "X.astype(np.float16), np.ones(6, np.float16), "
                                   "np.zeros(6, np.float16)"), NUMBA_CACHE_DIR=cache)
    assert loading.returncode == 0, loading.stderr[-3000:]
    first, after, y_cached, z = json.loads(loading.stdout.strip().splitlines()[-1])
    assert first == 0, "a load from the disk cache refreshed the target context"
    assert after > 0 and y_cached == y
    X = np.arange(24, dtype=np.float64).reshape(4, 6) / 7
    x16 = (X.astype(np.float32)).astype(np.float16).astype(np.float64)
    ref = (x16 - x16.mean(1, keepdims=True)) / np.sqrt(x16.var(1, keepdims=True) + 1e-5)
    assert np.abs(np.asarray(z) - ref).max() < 4e-3  # float16 outputs: within their ulp


def test_profile_accounts_for_a_first_call(tmp_path):
    """``coldstart --profile``: the first call of an operator in a fresh process with
    an empty cache, each compiled function's time split by stage; the rows add up to
    the call, the kernel the call runs is there with time in typing and LLVM."""
    from normkernels.bench import compile_profile

    result = compile_profile.first_call("lrn inference", (1, 3, 4, 4), "float32")
    rows = {name: stages for name, _total, stages in result["rows"]}
    assert result["compiled"] >= 1
    total = sum(sum(stages.values()) for stages in rows.values())
    assert total == pytest.approx(result["seconds"], rel=1e-6)
    kernels = [name for name in rows if name.startswith("kernels.lrn.")]
    assert kernels, sorted(rows)
    assert all(rows[kernels[0]][stage] > 0 for stage in ("typing", "lowering"))
    assert sum(rows[name]["LLVM"] for name in rows) > 0
    assert compile_profile.stage_of("nopython_type_inference [f]") == "typing"
    assert compile_profile.stage_of("native_parfor_lowering [f]") == "lowering"
    assert compile_profile.stage_of("parfor_prelowering_pass [f]") == "parfors"
    assert compile_profile.stage_of("inline_inlinables [f]") == "inlining"
    text = compile_profile.format_profile(result, limit=3)
    assert text.splitlines()[-1].split()[0] == "all"


@pytest.mark.parametrize("label", ["groupnorm backward", "skip-layernorm inference"])
def test_a_first_call_compiles_no_error_message_formatting(label):
    """A slice assignment from an array (``a[i, j0:j1] = b``) compiles Numba's
    shape-mismatch message: string formatting of the shapes, 1.4-2 s of a first call
    for an error no kernel can raise. The kernels store such runs element by element."""
    from normkernels.bench import compile_profile

    result = compile_profile.first_call(label, (2, 16, 8, 8), "float32")
    names = [name for name, _total, _stages in result["rows"]]
    assert [n for n in names if "unicode" in n or "raise_with_shape" in n] == [], names


def test_an_inlined_overload_is_typed_not_compiled():
    """An ``inline="always"`` overload's implementation is inlined as typed IR; Numba
    also compiled it whole (lowering and LLVM) for a call template nobody used.
    ``kernels.inlining`` stops that for this package's overloads: the implementation
    shows in a first call's profile with no lowering and no LLVM time."""
    from normkernels.bench import compile_profile

    result = compile_profile.first_call("layernorm backward", (2, 16, 8, 8), "float32")
    rows = {name: stages for name, _total, stages in result["rows"]}
    inlined = [name for name in rows if name.startswith("kernels.backward_dx._dx_vectors_impl")]
    assert inlined, sorted(rows)
    for name in inlined:
        assert rows[name]["lowering"] == 0 and rows[name]["LLVM"] == 0, (name, rows[name])


def test_no_kernel_assigns_a_slice_from_an_array():
    """The static side of the test above, over every kernel source: a slice assignment
    whose value is not a constant (``t[:] = -0.0`` is a fill, no shape check)."""
    import ast
    import pathlib

    import normkernels.kernels

    def jitted(function):
        return any("njit" in ast.unparse(d) for d in function.decorator_list)

    found, scanned = [], set()
    for path in sorted(pathlib.Path(normkernels.kernels.__file__).parent.glob("*.py")):
        functions = [f for f in ast.walk(ast.parse(path.read_text()))
                     if isinstance(f, ast.FunctionDef) and jitted(f)]
        scanned |= {f.name for f in functions}
        for node in (n for f in functions for n in ast.walk(f)):
            if not isinstance(node, ast.Assign):
                continue
            value = node.value.operand if isinstance(node.value, ast.UnaryOp) else node.value
            for target in node.targets:
                sliced = isinstance(target, ast.Subscript) and any(
                    isinstance(n, ast.Slice) for n in ast.walk(target.slice))
                if sliced and not isinstance(value, ast.Constant):
                    found.append(f"{path.name}:{node.lineno}")
    assert {"row_sums", "row_moment_sums", "rows_serial", "column_table"} <= scanned
    assert found == []

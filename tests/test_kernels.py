"""The kernel layer: execution paths, element conversions, streaming stores, caching."""

import os
import re
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from arrays import FLOAT_IDS, FLOATS, assert_identical, random_params
from numba import njit

from normkernels import reference
from normkernels.dtypes import BFLOAT16, FLOAT16, storage_view
from normkernels.engine import PATHS, policy
from normkernels.engine.numba_engine import ENGINE
from normkernels.kernels import backward_dx, scale_shift
from normkernels.kernels.activations import NONE, SILU
from normkernels.kernels.elements import load, store
from normkernels.ops import batch_normalization as bn_spec

# (shape, data_format): planes with tails, short planes (periodic tables), channels
# last, C = 1; each spans several parallel blocks.
KERNEL_CASES = {
    "planes": ((3, 5, 97, 101), "NCX"),
    "short-planes": ((101, 70, 3, 7), "NCX"),
    "short-planes-many-channels": ((2, 30000, 3, 3), "NCX"),  # tables too big: planes
    "nxc": ((3, 97, 101, 5), "NXC"),
    "nxc-C1": ((3, 97, 101, 1), "NXC"),
    "1d": ((150001,), "NCX"),
}


def wide_range_tensor(rng, shape, dtype):
    """Values from deep subnormal to near overflow of ``dtype``, with signs, zeros,
    NaN and Inf: exercises every widening and rounding case of the conversions."""
    finfo = np.finfo(np.float32 if dtype == BFLOAT16 else dtype)
    lo = np.log2(float(finfo.smallest_subnormal))
    hi = np.log2(float(finfo.max))
    x = np.exp2(rng.uniform(lo, hi, shape)) * rng.choice([-1.0, 1.0], shape)
    flat = x.reshape(-1)
    flat[::97] = 0.0
    flat[1::101] = -0.0
    flat[2::499] = np.nan
    flat[3::503] = np.inf
    with np.errstate(over="ignore"):
        return x.astype(dtype)


def run_path(X, params, data_format, path, out=None):
    return bn_spec.batch_normalization(X, *params, data_format=data_format, epsilon=0.0,
                                       out=out, engine=ENGINE, path=path)


@pytest.mark.parametrize("case", list(KERNEL_CASES))
@pytest.mark.parametrize("dtype", FLOATS, ids=FLOAT_IDS)
def test_paths_give_identical_results(rng, dtype, case):
    shape, data_format = KERNEL_CASES[case]
    C = 1 if len(shape) == 1 else shape[1] if data_format == "NCX" else shape[-1]
    X = wide_range_tensor(rng, shape, dtype)
    params = random_params(rng, C, (dtype,) * 4)
    expected = reference.batch_normalization(X, *params, data_format=data_format, epsilon=0.0)
    for path in PATHS:
        assert_identical(run_path(X, params, data_format, path), expected)
        unaligned = np.empty(X.size + 1, dtype)[1:].reshape(shape)
        run_path(X, params, data_format, path, out=unaligned)
        assert_identical(unaligned, expected)


@njit
def _widen_all(bits, out):
    for i in range(bits.size):
        out[i] = load(bits, i)


@njit
def _narrow_all(values, out):
    for i in range(values.size):
        store(out, i, values[i])


@pytest.mark.parametrize("dtype", [FLOAT16, BFLOAT16], ids=["float16", "bfloat16"])
def test_widening_is_exact_for_every_bit_pattern(dtype):
    all_values = np.arange(2**16, dtype=np.uint16).view(dtype)
    out = np.empty(all_values.size, np.float32)
    _widen_all(storage_view(all_values), out)
    with np.errstate(invalid="ignore"):
        assert_identical(out, all_values.astype(np.float32))


@pytest.mark.parametrize("dtype", [FLOAT16, BFLOAT16], ids=["float16", "bfloat16"])
def test_narrowing_rounds_to_nearest_even(rng, dtype):
    bits = rng.integers(0, 2**32, 2_000_000, dtype=np.uint64).astype(np.uint32)
    # ties and near-ties for both formats, subnormals, the overflow threshold
    specials = np.array([0x3F808000, 0x3F818000, 0x3F807FFF, 0x00008000, 0x00018000,
                         0x7F7FFFFF, 0x7F7F8000, 0x477FF000, 0x477FEFFF, 0x33800000,
                         0x33000000, 0x33000001, 0x80000001, 0x7FC00001, 0xFF800001],
                        dtype=np.uint32)
    values = np.concatenate([bits, specials]).view(np.float32)
    out = np.empty(values.size, dtype)
    _narrow_all(values, storage_view(out))
    with np.errstate(over="ignore", invalid="ignore"):
        assert_identical(out, values.astype(dtype))


def _uncached_asm(kernel, *args):
    fresh = njit(parallel=True)(kernel.py_func)
    fresh(*args)
    return "\n".join(fresh.inspect_asm().values())


@pytest.mark.skipif(not policy.streaming_supported(), reason="streaming needs x86-64")
@pytest.mark.parametrize("dtype", FLOATS, ids=FLOAT_IDS)
def test_streaming_kernels_emit_non_temporal_stores(dtype):
    """LLVM has dropped the non-temporal hint before (16-bit stores folded into
    vcvtps2ph): check the machine code of every dtype's streaming kernels."""
    x = storage_view(np.zeros(4096, dtype))
    cd = np.float64 if dtype == np.float64 else np.float32
    p = np.zeros(512, cd)
    for kernel, args in [
        (scale_shift.scale_shift_planes_streaming,
         (x, x.copy(), 4, 1024, p, p, p, 1024, None, NONE)),
        (scale_shift.scale_shift_planes_streaming,
         (x, x.copy(), 4, 1024, p, p, p, 1024, x.copy(), SILU)),
        (scale_shift.scale_shift_periodic_streaming, (x, x.copy(), 256, p, p, p, 1024, None, NONE)),
        (backward_dx.apply_planes_streaming, (x, x.copy(), x.copy(), 4, 1024, p, p, p, p)),
        (backward_dx.apply_rows_streaming, (x, x.copy(), x.copy(), 256, 4, p, p, p, p)),
    ]:
        asm = _uncached_asm(kernel, *args)
        assert re.search(r"\bv?movnt(ps|pd|dq)\b", asm), kernel.__name__
        assert "sfence" in asm, kernel.__name__


def _python(code, _env=None, **env):
    """Run ``code`` in a fresh interpreter (environment ``_env`` or ours, plus ``env``)."""
    base = os.environ if _env is None else _env
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)],
                          capture_output=True, text=True, env={**base, **env}, check=True)


def test_import_compiles_nothing():
    result = _python("""
        import sys, normkernels
        assert "numba" not in sys.modules, "import normkernels loaded numba"
        normkernels.batch_normalization  # loads the API, still compiles nothing
        from numba.core.dispatcher import Dispatcher
        from normkernels.kernels import (fold, inference, instance, lp, lrn, rows, scale_shift,
                                         statistics)
        modules = (scale_shift, fold, statistics, instance, inference, rows, lp, lrn)
        kernels = [k for m in modules for k in vars(m).values() if isinstance(k, Dispatcher)]
        assert len(kernels) > 30, len(kernels)
        print(sum(len(k.signatures) for k in kernels))
    """)
    assert result.stdout.strip() == "0"


def test_public_names_are_the_api_bind_and_warmup():
    """normkernels' lazy names (listed by hand, so importing it loads nothing) are the
    functions of every module of normkernels.api, re-exported there, bind and
    warmup."""
    import normkernels
    from normkernels import api

    assert sorted(normkernels.__all__) == sorted([*api.__all__, "bind", "warmup"])
    for name in api.__all__:
        assert getattr(normkernels, name) is getattr(api, name)
        assert getattr(api, name).__module__.startswith("normkernels.api."), name


def test_openmp_spin_count_is_lowered_unless_the_user_chose():
    """Idle OpenMP workers spinning for long starve other threads between kernels
    (see normkernels/kernels/__init__.py); a user's own setting wins."""
    code = """
        import os, normkernels.kernels
        print(os.environ.get("GOMP_SPINCOUNT"))
    """
    env = {k: v for k, v in os.environ.items() if k not in ("GOMP_SPINCOUNT", "OMP_WAIT_POLICY")}
    assert _python(code, _env=env).stdout.strip() == "1000"
    assert _python(code, _env=dict(env, GOMP_SPINCOUNT="5")).stdout.strip() == "5"
    assert _python(code, _env=dict(env, OMP_WAIT_POLICY="active")).stdout.strip() == "None"


def test_kernels_are_cached_in_numba_cache_dir(tmp_path):
    _python("""
        import numpy as np, normkernels
        x = np.ones((2, 3, 4), np.float16)
        p = np.ones(3, np.float32)
        normkernels.batch_normalization(x, p, p, p, p)
    """, NUMBA_CACHE_DIR=str(tmp_path))
    cached = {p.name for p in tmp_path.rglob("*.nbi")}
    assert any(name.startswith("inference.normalize_planes_serial") for name in cached)


def test_inliner_patch_installs_at_first_compile_and_keeps_results(tmp_path):
    """kernels/inlining.py: not at import (a process that only loads cached kernels
    never imports Numba's inliner), but before the first compile; compiled with it, a
    kernel with inlined helpers gives the bits of one compiled without it."""
    result = _python("""
        import numpy as np, normkernels
        import normkernels.kernels.cache
        from numba import njit
        from numba.core import inline_closurecall as icc
        from normkernels.kernels import inference
        from normkernels.kernels.activations import NONE
        before = getattr(icc.InlineWorker.inline_ir, "_normkernels", False)
        rng = np.random.default_rng(0)
        x = (rng.standard_normal((2, 3, 40, 40)) * 3 + 1e4).astype(np.float32)
        p = [rng.random(3).astype(np.float32) + 0.5 for _ in range(4)]
        y = normkernels.batch_normalization(x, *p)
        after = getattr(icc.InlineWorker.inline_ir, "_normkernels", False)
        icc.InlineWorker.inline_ir = icc.InlineWorker.inline_ir.__wrapped__
        plain = njit(cache=False)(inference.normalize_planes_serial.py_func)
        y2 = np.empty_like(x)
        plain(x.ravel(), y2.ravel(), 3, 1600, *p, 1e-5, False, None, NONE)
        print(before, after, np.array_equal(y.view(np.uint32), y2.view(np.uint32)))
    """, NUMBA_CACHE_DIR=str(tmp_path))
    assert result.stdout.split() == ["False", "True", "True"]


def test_a_top_level_compile_restarts_numba_label_counter():
    """Numba's global IR label counter about doubles at every inlining of an
    ``inline="always"`` helper; a process that compiles many kernels would end with
    block names past LLVM's length limit. kernels/inlining.py restarts it at each
    top-level compile: from a counter of 10^600 a kernel with inlined helpers still
    compiles, gives the right answer, and leaves the counter small."""
    result = _python("""
        import numpy as np
        import normkernels.kernels.cache
        from numba import njit
        from numba.core import ir_utils
        from normkernels.kernels.activations import with_residual

        @njit(cache=False)
        def add(res, x):
            out = np.empty_like(x)
            for i in range(x.size):
                out[i] = with_residual(res, i, with_residual(res, i, x[i]))
            return out

        ir_utils._the_max_label._value = 10**600
        x = np.arange(5.0)
        print(add(x, x).tolist() == (3 * x).tolist(), ir_utils._the_max_label._value < 10**6)
    """)
    assert result.stdout.split() == ["True", "True"]


def test_cache_stamp_covers_every_kernel_source():
    """An edit to elements.py or vectors.py must invalidate cached kernels."""
    locator = scale_shift.scale_shift_planes_serial._cache._impl.locator
    assert type(locator).__name__.startswith("PackageStamped")


@pytest.mark.parametrize("scale", [2.0**-100, 2.0**-20, 0.7], ids=["2^-100", "2^-20", "0.7"])
@pytest.mark.parametrize("case", ["planes", "nxc"])
@pytest.mark.parametrize("dtype", FLOATS, ids=FLOAT_IDS)
def test_subnormal_results_round_exactly(rng, dtype, case, scale):
    """Scaled-down values land in the subnormal range of float32 (bfloat16's vector
    path then leaves fptrunc, which flushes them, for the exact bit path) and of
    float16: every path must round them like the NumPy twin."""
    shape, data_format = KERNEL_CASES[case]
    C = shape[1] if data_format == "NCX" else shape[-1]
    X = wide_range_tensor(rng, shape, dtype)
    zeros, ones = np.zeros(C), np.ones(C)
    pdt = np.float64 if dtype == np.float64 else np.float32
    params = tuple(p.astype(pdt) for p in (ones * scale, zeros, zeros, ones))
    expected = reference.batch_normalization(X, *params, data_format=data_format, epsilon=0.0)
    if dtype != np.float64 and scale < 2.0**-50:  # the case is really exercised
        values = expected.astype(np.float64)
        assert ((values != 0) & (np.abs(values) < np.finfo(np.float32).tiny)).sum() > 1000 \
            or dtype == np.float16
    for path in PATHS:
        assert_identical(run_path(X, params, data_format, path), expected)

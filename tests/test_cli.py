"""The command line and the benchmark harness run, on the shared workload table."""

import json
import os
import subprocess
import sys
import textwrap

import ml_dtypes
import numpy as np
import pytest

from normkernels.bench import cli, harness, model_timing, report, workloads
from normkernels.operators import OPERATORS


def test_workload_table_runs_and_agrees_with_numpy():
    result = workloads.run_workload(workloads.WORKLOADS_BY_NAME["tiny-f32"], repeat=1)
    assert set(result["seconds"]) == {"normkernels", "copy", "read", "axpb", "numpy"}
    assert result["roofline"] == "copy"
    assert result["max_rel_err"]["numpy"] < 1e-5
    assert result["max_rel_err"]["normkernels"] < 1e-6


@pytest.mark.parametrize("op,mode", [(op.name, mode) for op in OPERATORS.values()
                                     for mode in op.modes])
def test_every_operator_and_mode_of_the_table_runs_on_a_small_tensor(op, mode):
    shape = (2, 3, 8) if OPERATORS[op].rows else (2, 3, 8, 8)  # skip operators: 2-D/3-D
    layout = OPERATORS[op].layouts[-1]  # NXC where the operator has it
    w = workloads.Workload(f"small-{op}-{mode}", op, shape, "float32", layout, mode)
    result = workloads.run_workload(w, repeat=1)
    assert result["max_rel_err"]["normkernels"] < 1e-5
    assert result["max_rel_err"]["numpy"] < 1e-5
    assert ("over_inference" in result) == (mode in OPERATORS[op].over_inference)


def test_warmup_compiles_the_fused_instance_kernels_at_any_thread_count():
    """With 4 threads, warmup's instance-norm case still takes the fused paths (they
    need twice as many planes as threads), and its progress total is its call count."""
    code = textwrap.dedent("""
        import numba
        from normkernels.bench import cli
        from normkernels.engine import policy
        assert numba.get_num_threads() == 4
        taken = []
        policy._trace = taken.append
        calls = cli.warmup_calls()
        for _, op, *_, call in calls:
            if op.name == "instancenorm":  # the count is of all; the kernels of one
                call()
        fused = {r for r in taken if r.startswith("instance_planes/fused/")}
        print(sorted(fused), len(calls))
    """)
    env = {**os.environ, "NUMBA_NUM_THREADS": "4"}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=env, check=True)
    fused, count = done.stdout.strip().rsplit(" ", 1)
    assert fused == str(sorted(f"instance_planes/fused/{p}"
                               for p in ("parallel", "serial", "streaming")))
    cases = sum(len(c.paths) for op in OPERATORS.values() for c in op.warmup
                for d in workloads.DTYPES if d in op.dtypes)
    assert int(count) == cases


def test_workload_inputs_match_their_description():
    for w in workloads.WORKLOADS:
        if np.prod(w.shape) > 1 << 22:
            continue
        X, params = workloads.make_inputs(w)
        assert X.shape == w.layout_shape and X.dtype == workloads.DTYPES[w.dtype]
        if w.operator.skip or w.mode == "backward":  # skip input / dY first, X's shape
            assert params[0].shape == X.shape and params[0].dtype == X.dtype
            assert not np.array_equal(params[0], X)
            params = params[1:]
        per_sample = w.operator.per_sample  # (N, C): scale and shift per sample
        assert all(p.shape == ((X.shape[0], w.channels) if per_sample else (w.channels,))
                   for p in params)
        if w.mode == "backward":  # scale (shift too per sample); BN: X's batch statistics
            assert len(params) == (3 if w.op == "batchnorm" else 2 if per_sample else 1)
        if w.mode == "backward" and w.op == "batchnorm":
            x = np.moveaxis(X.astype(np.float64), w.channel_axis, 0).reshape(w.channels, -1)
            assert np.allclose(params[1], x.mean(axis=1), atol=1e-6)
            assert np.allclose(params[2], x.var(axis=1), rtol=1e-6)


BACKWARD_OPS = [op for op in OPERATORS.values() if op.backward]


def _numeric_gradient(f, X, h=1e-5):
    """Central differences of the scalar ``f`` at every element of X (float64)."""
    grad = np.empty_like(X)
    for i in np.ndindex(X.shape):
        up, down = X.copy(), X.copy()
        up[i] += h
        down[i] -= h
        grad[i] = (f(up) - f(down)) / (2 * h)
    return grad


@pytest.mark.parametrize("op,layout", [(op.name, layout) for op in BACKWARD_OPS
                                       for layout in op.layouts])
def test_backward_formula_is_the_gradient_of_the_forward_formula(op, layout):
    """The bench's float64 check of dX (the formula of mode "backward") is the
    gradient of sum(dY * Y) for the forward formula, by central differences (BN:
    training, its mean and var X's batch statistics)."""
    record = OPERATORS[op]
    rng = np.random.default_rng(3)
    ncx = (3, 5) if record.rows else (2, 6, 3)  # groupnorm: 2 groups of 3 channels
    shape = ncx if layout == "NCX" else (2, 3, 6)
    axis = 1 if layout == "NCX" else 2
    X = rng.standard_normal(shape) * 2 + 0.5
    C = record.columns(ncx)
    dY, scale, *stats = record.params(rng, C, np.dtype(np.float64), shape, "backward", X,
                                      axis)
    forward = [scale, rng.standard_normal(C), *stats][:record.n_params]
    mode = "training" if "training" in record.modes else "inference"

    def loss(x):
        return float(np.sum(dY * record.formula(x, forward, mode, axis, x.dtype)))

    expected = _numeric_gradient(loss, X)
    got = record.formula(X, [dY, scale, *stats], "backward", axis, X.dtype)
    assert got.shape == X.shape
    np.testing.assert_allclose(got, expected, rtol=1e-6, atol=1e-7)


def test_backward_workloads_move_three_arrays_and_skip_the_onnx_peers(capsys):
    w = workloads.Workload("small-backward", "layernorm", (16, 40), "float32", mode="backward")
    result = workloads.run_workload(w, repeat=1, warmup=0,
                                    peers=["numpy", "onnx-ref", "onnxruntime", "openvino"])
    nbytes = 16 * 40 * 4
    assert result["roofline"] == "add" and result["bytes"] == 3 * nbytes
    assert {"add", "copy", "read", "axpb"} <= set(result["seconds"])
    for name, streams in (("normkernels", 3), ("numpy", 3), ("add", 3), ("copy", 2),
                          ("read", 1)):
        assert result["gbps"][name] == pytest.approx(
            streams * nbytes / result["seconds"][name] / 1e9)
    assert result["pct_of_roofline"] == pytest.approx(
        100 * result["seconds"]["add"] / result["seconds"]["normkernels"])
    for peer in ("onnx-ref", "onnxruntime", "openvino"):
        assert result["skipped"][peer] == f"{peer}: no ONNX operator for a backward pass"
    assert "backward" in workloads.SUITES and "backward" not in workloads.SUITES["default"]
    assert all(workloads.WORKLOADS_BY_NAME[n].mode == "backward"
               for n in workloads.SUITES["backward"])
    argv = ["bench", "--op", "groupnorm", "--mode", "backward", "--shape", "2,4,8,8",
            "--layout", "NXC", "--repeat", "1", "--peers", "numpy", "onnxruntime"]
    assert cli.main(argv) == 0
    out = capsys.readouterr().out
    assert "groupnorm-backward-2x4x8x8-float32-nxc" in out
    assert "no ONNX operator for a backward pass" in out
    assert cli.main(["bench", "--list"]) == 0
    assert "suite backward: backward-resnet-stem-f32-ncx" in capsys.readouterr().out


def test_coldstart_calls_run():
    """The first-call sources ``normkernels coldstart`` runs (every record and mode) are
    valid calls on its default shape (dY = X; mean and var ones; rows: X's rows)."""
    import normkernels as nk

    families = model_timing.COLD_START_FAMILIES
    assert set(families) == {f"{op.name} {mode}" for op in OPERATORS.values()
                             for mode in op.modes}
    assert {f"{op.name} backward" for op in BACKWARD_OPS} <= set(families)
    X = np.ones((2, 16, 8, 8), "float32")
    for family, call in families.items():
        _run_first_call(nk, family, call, X)
    # 16-bit X: the parameters in the dtype each operator takes with it (float32 ones
    # with bfloat16 X failed LayerNormalization's type rule)
    for family in ("layernorm inference", "batchnorm-inference inference",
                   "groupnorm-ort inference"):
        _run_first_call(nk, family, families[family], X.astype(ml_dtypes.bfloat16))


def _run_first_call(nk, family, call, X):
    names = {"nk": nk, "np": np, "X": X.copy()}
    *before, last = call.splitlines()
    exec("\n".join(before), names)
    result = eval(last, names)
    if result is None:  # in place: the call wrote X (a view of X's rows)
        result = names["X"]
    first = result[0] if isinstance(result, tuple) else result
    assert np.isfinite(np.asarray(first, np.float32)).all(), family


def test_bench_command(tmp_path, capsys):
    out = tmp_path / "r.json"
    assert cli.main(["bench", "--workload", "tiny-f32", "--repeat", "2", "--json", str(out)]) == 0
    table = capsys.readouterr().out
    assert "tiny-f32" in table and "GB/s" in table
    data = json.loads(out.read_text())
    assert data["results"][0]["workload"] == "tiny-f32"


def test_bench_rejects_unknown_workload(capsys):
    assert cli.main(["bench", "--workload", "nope"]) == 2
    assert "unknown workload" in capsys.readouterr().err
    assert cli.main(["bench", "--op", "moments", "--mode", "training"]) == 2
    assert "has no --mode training" in capsys.readouterr().err


def test_bench_custom_workload_with_every_output(tmp_path, capsys):
    files = {k: tmp_path / f"r.{k}" for k in ("json", "md", "png")}
    argv = ["bench", "--op", "instancenorm", "--shape", "2,3,8,8", "--dtype", "float16",
            "--layout", "NXC", "--repeat", "1", "--peers", "numpy", "onnxruntime",
            "--json", str(files["json"]), "--markdown", str(files["md"]),
            "--plot", str(files["png"])]
    assert cli.main(argv) == 0
    out = capsys.readouterr().out
    assert "instancenorm-inference-2x3x8x8-float16-nxc" in out
    data = json.loads(files["json"].read_text())
    assert data["threads"] >= 1 and "numba" in data["versions"]
    assert files["md"].read_text().startswith("| workload |")
    try:
        import matplotlib  # noqa: F401
        assert files["png"].stat().st_size > 1000
    except ImportError:
        assert not files["png"].exists()


PEER_CASES = [(op.name, mode, layout, dtype) for op in OPERATORS.values()
              for mode in op.modes for layout in op.layouts
              for dtype in ("float32", "bfloat16" if layout == "NXC" else "float16")
              if dtype in op.dtypes and (mode != "training" or dtype == "float32")]
# (training in 16 bits: the ONNX reference's statistics are 16-bit sums, far off)


@pytest.mark.parametrize("op,mode,layout,dtype", PEER_CASES)
def test_peers_compute_the_same_thing(op, mode, layout, dtype):
    """Every installed peer's Y agrees with normkernels' (the adapters are right)."""
    shape = (4, 6, 5) if OPERATORS[op].rows else (4, 3, 6, 5)  # skip operators: 2-D/3-D
    w = workloads.Workload(f"small-{op}", op, shape, dtype, layout, mode)
    result = workloads.run_workload(w, repeat=1, warmup=0, peers=list(cli.PEER_ORDER))
    assert "numpy" in result["ratios"]
    for peer in result["ratios"]:
        if dtype in ("float16", "bfloat16") and (
                peer == "numpy" or (peer == "torch" and OPERATORS[op].per_sample)):
            continue  # NumPy (torch's modulation composite) computes in the 16-bit dtype
        assert report.agrees(result, peer), (peer, result["agreement"][peer])
    assert set(result["ratios"]) | set(result["skipped"]) == set(cli.PEER_ORDER)


def test_info_and_warmup(capsys):
    """``info``, and ``warmup`` narrowed by its options (every operator and dtype: the
    compile-count tests of each operator, and test_compile_cost's ``--jobs``)."""
    assert cli.main(["info"]) == 0
    assert "threading layer" in capsys.readouterr().out
    assert cli.main(["warmup", "--ops", "lrn,lpnorm", "--dtypes", "bfloat16", "--layouts",
                     "NXC", "--jobs", "1"]) == 0
    rows = [line.split() for line in capsys.readouterr().out.splitlines()]
    assert {tuple(r[:2]) for r in rows if r[:1] == ["bfloat16"]} == {
        ("bfloat16", "lrn"), ("bfloat16", "lpnorm")}
    assert cli.main(["warmup", "--ops", "nosuch"]) == 2


def test_onnx_command_times_a_light_model(capsys):
    pytest.importorskip("onnx")
    assert cli.main(["onnx", "--model", "shufflenet", "--repeat", "1"]) == 0
    out = capsys.readouterr().out
    assert "onnx.reference" in out and "speedup" in out
    result = model_timing.evaluator_timing("shufflenet", repeat=1)
    assert result["normkernels"]["norm_nodes"] == 49
    assert result["normkernels"]["max_rel_err"] < 1e-5


def test_coldstart_measures_fresh_processes(monkeypatch, capsys):
    family = next(iter(model_timing.COLD_START_FAMILIES))
    monkeypatch.setattr(model_timing, "COLD_START_FAMILIES",
                        {family: model_timing.COLD_START_FAMILIES[family]})
    assert cli.main(["coldstart", "--shape", "2,3,8,8", "--repeat", "1"]) == 0
    out = capsys.readouterr().out
    assert "import numba" in out and "second call (us)" in out
    cells = _row(out, family.split()[0])
    assert cells[:2] == family.split()
    first, second, cached = float(cells[2]), float(cells[3]), float(cells[4])
    assert first > 0 and second > 0 and cached > 0


def _row(table, first):
    """The cells of the table line starting with ``first``."""
    return next(line.split() for line in table.splitlines() if line.split()[:1] == [first])


def test_bench_cache_state_is_chosen_and_reported(tmp_path, capsys):
    """--cache warm/cold is used as told and shows in the table and the JSON; without
    it a small workload is timed warm."""
    for cache in ("cold", "warm", None):
        out = tmp_path / f"{cache}.json"
        argv = ["bench", "--workload", "tiny-f32", "--repeat", "1", "--peers", "numpy",
                "--json", str(out)] + (["--cache", cache] if cache else [])
        assert cli.main(argv) == 0
        table = capsys.readouterr().out
        expected = cache or "warm"
        assert _row(table, "workload")[2] == "cache"
        assert _row(table, "tiny-f32")[2] == expected
        assert (f"{cache} caches" in table) == (cache is not None)
        assert json.loads(out.read_text())["results"][0]["cache"] == expected


def test_timed_medians_touches_warm_calls_and_flushes_cold_ones(monkeypatch):
    """Warm: every timed call follows an untimed call of itself; cold: a flush."""
    log = []
    calls = {"a": lambda: log.append("a"), "b": lambda: log.append("b")}
    workloads.timed_medians(calls, "warm", 2, warmup=0)
    assert log == ["a", "a", "b", "b", "b", "b", "a", "a"]
    log.clear()
    monkeypatch.setattr(harness, "flusher", lambda: lambda: log.append("flush"))
    workloads.timed_medians(calls, "cold", 1, warmup=0)
    assert log == ["flush", "a", "flush", "b"]
    with pytest.raises(ValueError, match="warm or cold"):
        workloads.timed_medians(calls, "hot", 1)


def test_max_relative_error_in_blocks_equals_the_whole():
    rng = np.random.default_rng(1)
    a = rng.standard_normal((7, 3, 5)).astype(np.float32)
    b = a.astype(np.float64) * (1 + 1e-3 * rng.standard_normal(a.shape))
    whole = workloads.max_relative_error(a, b)
    assert whole > 0
    for block in (1, 15, 16, 104):
        assert workloads.max_relative_error(a, b, block=block) == whole


def test_sweep_times_each_size_in_both_cache_states(tmp_path, capsys):
    from normkernels.bench import sweep

    files = {k: tmp_path / f"s.{k}" for k in ("json", "md")}
    argv = ["bench", "--sweep", "--sweep-max-elements", "5000", "--repeat", "1",
            "--json", str(files["json"]), "--markdown", str(files["md"])]
    assert cli.main(argv) == 0
    out = capsys.readouterr().out
    assert "batchnorm inference, float32, NCX, 2 sizes up to 5,000 elements" in out
    data = json.loads(files["json"].read_text())
    peers = [p for p in cli.PEER_ORDER if p != "onnx-ref"]  # the sweep's default
    assert data["peers"] == peers and data["sweep"]["caches"] == ["warm", "cold"]
    assert data["threads"] >= 1 and "load_average" in data
    assert data["sweep"]["shapes"] == [[1, 1, 1, 1], [1, 16, 8, 8]]
    compared = data["sweep"]["compared"]
    assert "numpy" in compared
    assert [(r["cache"], r["elements"]) for r in data["results"]] == [
        ("warm", 1), ("warm", 1024), ("cold", 1), ("cold", 1024)]
    for r in data["results"]:
        assert set(r["seconds"]) == {"normkernels", "copy", *compared}
        assert set(r["ratios"]) | set(r["skipped"]) == set(peers)
        assert r["bytes"] == 2 * 4 * r["elements"]
        assert r["gbps"]["normkernels"] == pytest.approx(
            r["bytes"] / r["seconds"]["normkernels"] / 1e9)
        assert 1 <= r["rounds"] <= sweep.MAX_ROUND_SCALE
        assert all(report.agrees(r, p) for p in r["ratios"])
    for cache in ("warm", "cold"):
        assert f"{sweep.CACHE_TITLES[cache]}:" in out
        assert f"### {sweep.CACHE_TITLES[cache]}" in files["md"].read_text()
        slower = data["crossovers"][cache]
        assert set(slower) == set(compared)
        for peer, points in slower.items():
            expected = [r["elements"] for r in data["results"]
                        if r["cache"] == cache and r["ratios"][peer] < 1]
            assert [p["elements"] for p in points] == expected
            line = next(ln.split(None, 2) for ln in out.splitlines()
                        if ln.split()[:2] == [cache, peer])
            assert (line[2] == "none") == (not expected)
            assert f"- {cache}, {peer}: {line[2]}" in files["md"].read_text()
    assert sweep.CROSSOVER_TITLE in out
    warm_table = out.split(sweep.CACHE_TITLES["warm"])[1].split(sweep.CACHE_TITLES["cold"])[0]
    assert _row(warm_table, "1,024")[1] == "1x16x8x8"


def test_sweep_plot_one_cache_state_nxc(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    from normkernels.bench import sweep

    png, js = tmp_path / "s.png", tmp_path / "s.json"
    argv = ["bench", "--sweep", "--sweep-max-elements", "1100", "--repeat", "1", "--cache",
            "cold", "--layout", "NXC", "--peers", "numpy", "--plot", str(png), "--json",
            str(js)]
    assert cli.main(argv) == 0
    out = capsys.readouterr().out
    assert sweep.CACHE_TITLES["cold"] in out and sweep.CACHE_TITLES["warm"] not in out
    data = json.loads(js.read_text())
    assert [r["workload"] for r in data["results"]] == [
        "batchnorm-inference-1x1x1x1-float32-nxc", "batchnorm-inference-1x16x8x8-float32-nxc"]
    assert data["results"][1]["shape"] == [1, 8, 8, 16]  # NXC storage of 1x16x8x8
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000


def test_sweep_crossovers_are_the_sizes_where_normkernels_is_slower():
    from normkernels.bench import sweep

    def result(cache, n, ratios):
        return {"cache": cache, "ncx_shape": [1, n], "elements": n, "ratios": ratios}

    results = [result("warm", 1, {"a": 0.5, "b": 2.0}), result("warm", 9, {"a": 1.5}),
               result("cold", 1, {"a": 3.0}), result("cold", 9, {"a": 0.9, "b": 0.8})]
    found = sweep.crossovers(results, ["a", "b", "c"], ("warm", "cold"))
    assert found == {
        "warm": {"a": [{"shape": [1, 1], "elements": 1, "ratio": 0.5}], "b": []},
        "cold": {"a": [{"shape": [1, 9], "elements": 9, "ratio": 0.9}],
                 "b": [{"shape": [1, 9], "elements": 9, "ratio": 0.8}]}}


@pytest.mark.parametrize("argv,message", [
    (["--cache", "hot"], "argument --cache: invalid choice: 'hot'"),
    (["--sweep", "--sweep-max-elements", "0"], "argument --sweep-max-elements: must be"),
    (["--sweep", "--sweep-max-elements", "many"], "argument --sweep-max-elements: not a"),
    (["--sweep-max-elements", "100"], "--sweep-max-elements needs --sweep"),
    (["--sweep", "--workload", "tiny-f32"], "--sweep times its own sizes"),
])
def test_bench_rejects_bad_cache_and_sweep_options(argv, message, capsys):
    with pytest.raises(SystemExit) as exc:
        cli.main(["bench", *argv])
    assert exc.value.code == 2
    assert message in capsys.readouterr().err

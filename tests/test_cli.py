"""The command line and the benchmark harness run, on the shared workload table."""

import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from normkernels import benchmarks, cli, model_timing
from normkernels.operators import OPERATORS


def test_workload_table_runs_and_agrees_with_numpy():
    result = benchmarks.run_workload(benchmarks.WORKLOADS_BY_NAME["tiny-f32"], repeat=1)
    assert set(result["seconds"]) == {"normkernels", "copy", "read", "axpb", "numpy"}
    assert result["roofline"] == "copy"
    assert result["max_rel_err"]["numpy"] < 1e-5
    assert result["max_rel_err"]["normkernels"] < 1e-6


@pytest.mark.parametrize("op,mode", [(op.name, mode) for op in OPERATORS.values()
                                     for mode in op.modes])
def test_every_operator_and_mode_of_the_table_runs_on_a_small_tensor(op, mode):
    w = benchmarks.Workload(f"small-{op}-{mode}", op, (2, 3, 8, 8), "float32", "NXC", mode)
    result = benchmarks.run_workload(w, repeat=1)
    assert result["max_rel_err"]["normkernels"] < 1e-5
    assert result["max_rel_err"]["numpy"] < 1e-5
    assert ("over_inference" in result) == (mode in OPERATORS[op].over_inference)


def test_warmup_compiles_the_fused_instance_kernels_at_any_thread_count():
    """With 4 threads, warmup's instance-norm case still takes the fused paths (they
    need twice as many planes as threads), and its progress total is its call count."""
    code = textwrap.dedent("""
        import numba
        from normkernels import cli
        from normkernels.engine import policy
        assert numba.get_num_threads() == 4
        taken = []
        policy._trace = taken.append
        calls = cli.warmup_calls()
        for *_, call in calls:
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
                for d in benchmarks.DTYPES if d in op.dtypes)
    assert int(count) == cases


def test_workload_inputs_match_their_description():
    for w in benchmarks.WORKLOADS:
        if np.prod(w.shape) > 1 << 22:
            continue
        X, params = benchmarks.make_inputs(w)
        assert X.shape == w.layout_shape and X.dtype == benchmarks.DTYPES[w.dtype]
        assert all(p.shape == (w.channels,) for p in params)


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
              for mode in op.modes for layout in benchmarks.LAYOUTS
              for dtype in ("float32", "bfloat16" if layout == "NXC" else "float16")
              if dtype in op.dtypes and (mode != "training" or dtype == "float32")]
# (training in 16 bits: the ONNX reference's statistics are 16-bit sums, far off)


@pytest.mark.parametrize("op,mode,layout,dtype", PEER_CASES)
def test_peers_compute_the_same_thing(op, mode, layout, dtype):
    """Every installed peer's Y agrees with normkernels' (the adapters are right)."""
    w = benchmarks.Workload(f"small-{op}", op, (4, 3, 6, 5), dtype, layout, mode)
    result = benchmarks.run_workload(w, repeat=1, warmup=0, peers=list(cli.PEER_ORDER))
    assert "numpy" in result["ratios"]
    for peer in result["ratios"]:
        if peer == "numpy" and dtype in ("float16", "bfloat16"):
            continue  # NumPy computes in the 16-bit dtype itself
        assert cli._agrees(result, peer), (peer, result["agreement"][peer])
    assert set(result["ratios"]) | set(result["skipped"]) == set(cli.PEER_ORDER)


def test_info_and_warmup(capsys):
    assert cli.main(["info"]) == 0
    assert "threading layer" in capsys.readouterr().out
    assert cli.main(["warmup"]) == 0
    assert "bfloat16" in capsys.readouterr().out


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
    assert f"{family}: first call, empty cache" in out and "import numba" in out

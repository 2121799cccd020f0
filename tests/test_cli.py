"""The command line and the benchmark harness run, on the shared workload table."""

import json

import numpy as np
import pytest

from normkernels import benchmarks, cli


def test_workload_table_runs_and_agrees_with_numpy():
    result = benchmarks.run_workload(benchmarks.WORKLOADS_BY_NAME["tiny-f32"], repeat=1)
    assert set(result["seconds"]) == {"normkernels", "copy", "read", "axpb", "numpy"}
    assert result["roofline"] == "copy"
    assert result["max_rel_err"]["numpy"] < 1e-5
    assert result["max_rel_err"]["normkernels"] < 1e-6


def test_every_op_of_the_table_runs_on_a_small_tensor():
    for op in ("batchnorm-training", "moments", "batchnorm-inference", "instancenorm"):
        w = benchmarks.Workload(f"small-{op}", op, (2, 3, 8, 8), "float32", "NXC")
        result = benchmarks.run_workload(w, repeat=1)
        assert result["max_rel_err"]["normkernels"] < 1e-5
        assert result["max_rel_err"]["numpy"] < 1e-5
        assert ("over_inference" in result) == (op in ("batchnorm-training", "instancenorm"))


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


@pytest.mark.parametrize("op,layout,dtype", [
    ("batchnorm", "NCX", "float32"), ("batchnorm", "NXC", "float16"),
    ("batchnorm-training", "NXC", "float32"), ("instancenorm", "NCX", "float32"),
    ("instancenorm", "NXC", "bfloat16"), ("batchnorm-inference", "NXC", "bfloat16"),
    ("moments", "NCX", "float64")])
def test_peers_compute_the_same_thing(op, layout, dtype):
    """Every installed peer's Y agrees with normkernels' (the adapters are right)."""
    w = benchmarks.Workload(f"small-{op}", op, (4, 3, 6, 5), dtype, layout)
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
    result = benchmarks.evaluator_timing("shufflenet", repeat=1)
    assert result["normkernels"]["norm_nodes"] == 49
    assert result["normkernels"]["max_rel_err"] < 1e-5


def test_coldstart_measures_fresh_processes(monkeypatch, capsys):
    monkeypatch.setattr(benchmarks, "COLD_START_FAMILIES",
                        {"moments": benchmarks.COLD_START_FAMILIES["moments"]})
    assert cli.main(["coldstart", "--shape", "2,3,8,8", "--repeat", "1"]) == 0
    out = capsys.readouterr().out
    assert "moments: first call, empty cache" in out and "import numba" in out

"""The command line and the benchmark harness run, on the shared workload table."""

import json

import numpy as np

from normkernels import benchmarks, cli


def test_workload_table_runs_and_agrees_with_numpy():
    result = benchmarks.run_workload(benchmarks.WORKLOADS_BY_NAME["tiny-f32"], repeat=1)
    assert set(result["seconds"]) == {"normkernels", "copy", "axpb", "numpy"}
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


def test_info_and_warmup(capsys):
    assert cli.main(["info"]) == 0
    assert "threading layer" in capsys.readouterr().out
    assert cli.main(["warmup"]) == 0
    assert "bfloat16" in capsys.readouterr().out


def test_onnx_command_times_a_light_model(capsys):
    import pytest

    pytest.importorskip("onnx")
    assert cli.main(["onnx", "--model", "shufflenet", "--repeat", "1"]) == 0
    out = capsys.readouterr().out
    assert "onnx.reference" in out and "speedup" in out
    result = benchmarks.evaluator_timing("shufflenet", repeat=1)
    assert result["normkernels"]["norm_nodes"] == 49
    assert result["normkernels"]["max_rel_err"] < 1e-5

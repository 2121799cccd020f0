"""``normkernels bench --suite networks``: the layer lists, the agreement check and the
command (timings are not asserted: machines here are shared)."""

import json

import numpy as np
import pytest

from normkernels.bench import cli, networks, peers


def test_resnet50_has_the_53_batchnorms_of_torchvision():
    shapes = networks.resnet50(2)
    assert len(shapes) == 53
    assert shapes[0] == (2, 64, 112, 112)
    # the first block of stage 2: conv1 before the stride, conv2/conv3/downsample after
    assert shapes[11:15] == ((2, 128, 56, 56), (2, 128, 28, 28), (2, 512, 28, 28),
                             (2, 512, 28, 28))
    assert shapes[-1] == (2, 2048, 7, 7)
    assert sum(s[1] == 2048 for s in shapes) == 4  # three blocks' conv3 and the downsample


def test_sd15_unet_groupnorms_follow_the_channels_and_skips():
    shapes = networks.sd15_unet(64)
    assert len(shapes) == 61
    assert shapes[0] == shapes[-1] == (1, 320, 64, 64)
    channels = [s[1] for s in shapes]
    assert 2560 in channels and 1920 in channels and 960 in channels  # concatenated skips
    assert {s[2] for s in shapes} == {8, 16, 32, 64}
    assert all(c % 32 == 0 for c in channels)  # 32 groups divide every layer


@pytest.mark.parametrize("name", list(networks.NETWORKS))
def test_every_network_builds_its_workloads(name):
    net = networks.NETWORKS[name]
    built = net.workloads()
    assert len(built) == len(net.shapes) > 0
    assert all(w.op == net.op and w.data_format == net.layout for w in built)


def test_a_pass_times_every_candidate_and_checks_them():
    result = networks.time_network(networks.NETWORKS["llama-decode"], peers=("numpy",),
                                   threads=2, repeat=3, warmup=1)
    assert set(result["ms"]) == {"normkernels", "bind", "numpy"}
    assert all(v > 0 for v in result["ms"].values())
    assert result["rounds"] == 3 and result["layers"] == 65
    assert result["max_relative_difference"]["bind"] == 0.0
    assert result["max_relative_difference"]["numpy"] < 1e-5
    peer, plain, bound = networks.ratios(result)
    assert peer == "numpy" and plain > 0 and bound > 0


def test_the_check_catches_a_peer_that_computes_something_else(monkeypatch):
    def wrong(workload, X, params, threads):
        return lambda: np.zeros_like(X)

    monkeypatch.setitem(peers.PEERS, "numpy", wrong)
    small = networks.Network("t", "t", "layernorm", "NCX", ((4, 64),) * 2)
    _, _, checked = networks.layer_calls(small, ("numpy",), 2)
    assert checked["numpy"] > 0.5


def test_bind_writes_its_own_result_not_the_plain_calls(monkeypatch):
    """bind and the plain call share ``out``: the check compares bind's Y with a copy
    of the plain call's, so a bind that wrote nothing would be caught."""
    small = networks.Network("t", "t", "rmsnorm", "NCX", ((4, 64),))
    calls, _, _ = networks.layer_calls(small, (), 2)
    expected = calls["normkernels"][0]().copy()
    out = calls["bind"][0]()
    out[...] = 0
    assert np.array_equal(calls["bind"][0](), expected)


def test_layers_of_one_shape_share_their_output():
    """Y is shared by the layers of one shape (as torch's allocator and an engine's
    memory plan reuse it), not one cold buffer per layer; the layers of another shape
    get their own, and onnxruntime's bound Y is a buffer of its own."""
    pytest.importorskip("onnxruntime")
    small = networks.Network("t", "t", "layernorm", "NCX", ((4, 64), (4, 64), (2, 32)))
    calls, skipped, checked = networks.layer_calls(small, ("onnxruntime",), 2)
    assert not skipped and checked["onnxruntime"] < 1e-5
    first, second, third = (call() for call in calls["normkernels"])
    assert first is second and third is not first and third.shape == (2, 32)
    ort = [call() for call in calls["onnxruntime"]]
    assert np.shares_memory(ort[0], ort[1]) and not np.shares_memory(ort[0], first)
    first[...] = 0
    assert calls["bind"][1]() is first and np.any(first != 0)  # bind writes it too


def test_networks_command(tmp_path, capsys):
    path = tmp_path / "n.json"
    argv = ["bench", "--suite", "networks", "--network", "llama-decode", "--repeat", "2",
            "--peers", "numpy", "--json", str(path), "--markdown", str(tmp_path / "n.md")]
    assert cli.main(argv) == 0
    text = capsys.readouterr().out
    assert "Llama-7B decode step" in text and "fastest peer / bind" in text
    data = json.loads(path.read_text())
    assert data["results"][0]["network"] == "llama-decode"
    assert "| Llama-7B decode" in (tmp_path / "n.md").read_text()


def test_networks_command_rejects_an_unknown_network(capsys):
    with pytest.raises(SystemExit):
        cli.main(["bench", "--suite", "networks", "--network", "nope"])
    assert "invalid choice" in capsys.readouterr().err


def _fused(layers=2, rows=4):
    return networks.Network("t", "t", "fused-add-rmsnorm", "NCX", ((rows, 64),) * layers)


def test_the_fused_network_checks_what_each_in_place_candidate_writes():
    result = networks.time_network(networks.NETWORKS["llama-decode-fused"], peers=("numpy",),
                                   threads=2, repeat=3, warmup=1)
    assert set(result["ms"]) == {"normkernels", "bind", "numpy"}
    assert result["layers"] == 65 and all(v > 0 for v in result["ms"].values())
    assert result["max_relative_difference"]["bind"] == 0.0  # X and the residual
    assert result["max_relative_difference"]["numpy"] < 1e-5


def test_in_place_candidates_write_only_their_own_arrays(monkeypatch):
    """bind's X and residual (seen by a spy on nk.bind) are its own: the plain call and
    the peers, called again and again, leave them as the check left them, and bind's
    next call is the fused add of exactly those."""
    import normkernels as nk

    seen, real = [], nk.bind
    monkeypatch.setattr(nk, "bind", lambda f, *a, **k: seen.append(a) or real(f, *a, **k))
    calls, _, checked = networks.layer_calls(_fused(), ("numpy",), 2)
    assert checked["bind"] == 0.0 and checked["numpy"] < 1e-5
    x, residual, weight = seen[0]
    assert not np.shares_memory(x, seen[1][0]) and not np.shares_memory(residual, seen[1][1])
    state = x.copy(), residual.copy()
    y = calls["numpy"][0]().copy()
    for _ in range(3):
        calls["normkernels"][0]()
        calls["normkernels"][1]()
        calls["bind"][1]()
        assert np.array_equal(calls["numpy"][0](), y)  # the peer's arrays: untouched
    assert np.array_equal(x, state[0]) and np.array_equal(residual, state[1])
    calls["bind"][0]()
    nk.fused_add_rms_norm(*state, weight, epsilon=1e-5, rounding="once")
    assert np.array_equal(x, state[0]) and np.array_equal(residual, state[1])


def test_the_check_catches_candidates_sharing_in_place_arrays(monkeypatch):
    """A planted bug: every candidate of a layer gets the same copies (bind then runs on
    what the plain call wrote, the peer reads it)."""
    private, shared = networks._private, {}

    def one_copy(workload, X, params):
        return shared.setdefault(id(X), private(workload, X, params))

    monkeypatch.setattr(networks, "_private", one_copy)
    _, _, checked = networks.layer_calls(_fused(), ("numpy",), 2)
    assert checked["bind"] > 0.1 and checked["numpy"] > 0.1


def test_fused_networks_command(tmp_path, capsys):
    argv = ["bench", "--suite", "networks", "--network", "llama-decode-fused", "--repeat",
            "2", "--peers", "numpy", "--json", str(tmp_path / "n.json")]
    assert cli.main(argv) == 0
    text = capsys.readouterr().out
    assert "vLLM's fused add + RMSNorm" in text and "differs" not in text
    data = json.loads((tmp_path / "n.json").read_text())
    assert data["results"][0]["max_relative_difference"]["bind"] == 0.0

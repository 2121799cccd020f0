"""``normkernels bench --via torch`` on small stand-ins for the networks: every layer
kind checked against torch, the table written, the training-step path run."""

import pytest

torch = pytest.importorskip("torch", reason="needs torch (pip install torch==2.13.0)")

from normkernels.bench import networks, via_torch  # noqa: E402
from normkernels.bench.cli import main  # noqa: E402

SMALL = {
    "resnet50-b32-ncx": networks.Network("resnet50-b32-ncx", "small BN", "batchnorm", "NCX",
                                         ((2, 4, 5, 5), (2, 8, 3, 3))),
    "bert-b8": networks.Network("bert-b8", "small LN", "layernorm", "NCX", ((2, 3, 16),)),
    "sd15-unet": networks.Network("sd15-unet", "small GN", "groupnorm", "NXC",
                                  ((1, 64, 4, 4),)),
    "llama-decode": networks.Network("llama-decode", "small RMS", "rmsnorm", "NCX",
                                     ((1, 32),)),
}


@pytest.mark.parametrize("training", [True, False], ids=["training", "inference"])
@pytest.mark.parametrize("name", list(SMALL))
def test_each_layer_kind_agrees_with_torch(monkeypatch, name, training):
    monkeypatch.setattr(networks, "NETWORKS", {**networks.NETWORKS, **SMALL})
    r = via_torch.time_network(name, training, repeat=2)
    assert r["max_relative_difference"] < 1e-5
    assert set(r["ms"]) == {"torch", "normkernels"} and r["rounds"] == 2


def test_a_planted_difference_is_seen(monkeypatch):
    """The agreement check can fail: a swapped LayerNorm with another epsilon."""
    theirs, ours, inputs, grads = via_torch.layers(SMALL["bert-b8"], True)
    ours[0].eps = 1.0
    assert via_torch.check(theirs, ours, inputs, grads, True) > 1e-3


def test_the_command_writes_its_table(monkeypatch, tmp_path):
    monkeypatch.setattr(networks, "NETWORKS", {**networks.NETWORKS, **SMALL})
    monkeypatch.setattr(via_torch, "tiny_calls", lambda: [("tiny", {"numpy out=": 1.0})])
    out = tmp_path / "t.md"
    assert main(["bench", "--via", "torch", "--network", "bert-b8", "--repeat", "2",
                 "--markdown", str(out)]) == 0
    text = out.read_text()
    assert "small LN" in text and "forward + backward" in text and "| tiny | 1.00 |" in text

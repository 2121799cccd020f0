"""normkernels.torch's direct route with gradients (normkernels/torch/direct.py): once a
call's metadata is proven, LayerNorm and RMSNorm modules run the forward kernel on
views, keep its statistics and run the engine's backward on views; every output and
gradient bit for bit the full path's."""

import copy

import pytest

torch = pytest.importorskip("torch", reason="needs torch (pip install torch==2.13.0)")
from torch import nn  # noqa: E402

import normkernels.torch as nt  # noqa: E402
from normkernels.torch import direct  # noqa: E402

DTYPES = [torch.float32, torch.float64, torch.bfloat16, torch.float16]
IDS = ["float32", "float64", "bfloat16", "float16"]


def _run(module, x, dy):
    """(y, dx, every parameter gradient) of one forward and backward."""
    module.zero_grad()
    x = x.clone().requires_grad_()
    y = module(x)
    if dy is None:
        y.sum().backward()  # autograd's expanded ones: a stride-0 gradient
    else:
        y.backward(dy)
    return [y.detach(), x.grad, *(p.grad for p in module.parameters())]


@pytest.mark.parametrize("dtype", DTYPES, ids=IDS)
def test_repeated_calls_with_grad_take_the_direct_route_bit_for_bit(monkeypatch, dtype):
    gen = torch.Generator().manual_seed(11)

    def r(*shape):
        return torch.randn(*shape, generator=gen, dtype=torch.float64).to(dtype)

    backward = []
    monkeypatch.setattr(direct, "rows_backward", lambda *a, _f=direct.rows_backward: (
        backward.append(1), _f(*a))[1])
    cases = [(nn.LayerNorm(24), (3, 25, 24)), (nn.LayerNorm(24), (2, 24)),
             (nn.RMSNorm(24, eps=1e-5), (3, 25, 24)), (nn.RMSNorm(24, eps=1e-5), (1, 24)),
             (nn.LayerNorm((4, 6)), (5, 4, 6)), (nn.LayerNorm(24, bias=False), (7, 24)),
             (nn.LayerNorm(1024), (40, 1024))]  # above the serial size: the engine's path
    for module, shape in cases:
        module = module.to(dtype)
        with torch.no_grad():
            for p in module.parameters():
                p.copy_(r(*p.shape))
        ours = copy.deepcopy(module)
        assert nt.replace_modules(ours)
        for step in range(3):
            x, dy = r(*shape), (None if step == 2 else r(*shape))
            direct.clear()
            before = len(backward)
            full = _run(ours, x, dy)  # a first call: the full path, which prepares
            assert len(backward) == before
            fast = _run(ours, x, dy)  # the direct route
            assert len(backward) == before + 1, "no direct route"
            for want, got in zip(full, fast, strict=True):
                assert got.dtype == want.dtype and torch.equal(got, want), (shape, step)
            # and torch's own in float64, within the dtype's rounding
            exact = _run(copy.deepcopy(module).double(), x.double(),
                         None if dy is None else dy.double())
            tol = {torch.float64: 1e-12, torch.float32: 1e-5}.get(dtype, 0.02)
            for want, got in zip(exact, fast, strict=True):
                err = (got.double() - want).abs().max().item()
                assert err <= tol * (want.abs().max().item() + 1), (shape, step)

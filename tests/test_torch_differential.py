"""A randomized differential test of every swapped torch.nn normalization module against
torch's own: random module configurations (affine, track_running_stats, momentum None,
default or given eps, groups), dtypes (16-bit input with float32 parameters too),
memory formats and strided views, train and eval, several steps of forward and
backward. Per step: the same outputs, input and parameter gradients and buffers within
the dtype's rounding (each checked against the float64 result: normkernels' error at
most twice torch's plus a few units of the dtype's rounding), and the same exception
type where torch raises."""

import copy

import pytest

torch = pytest.importorskip("torch", reason="needs torch (pip install torch==2.13.0)")
from torch import nn  # noqa: E402

import normkernels.torch as nt  # noqa: E402

CASES = 300  # per chunk; four chunks (on as many workers): about 20 s each once compiled
DTYPES = [torch.float32, torch.float64, torch.bfloat16, torch.float16]


def _config(rng):
    """(module, input shape, dtype, parameters' dtype, layout, training, a description)."""
    kind = rng.choice(["batch", "instance", "group", "layer", "rms"])
    dtype = DTYPES[rng.randrange(4)]
    rank = rng.choice([2, 3, 4, 5]) if kind == "batch" else rng.choice([3, 4, 5])
    N, C = rng.choice([1, 2, 3]), rng.choice([1, 2, 4, 6])
    spatial = [rng.choice([1, 2, 3, 5]) for _ in range(rank - 2)]
    shape = (N, C, *spatial)
    eps = rng.choice([None, 1e-3, 1e-5, 0.1])
    kw = {} if eps is None else {"eps": eps}
    affine = rng.random() < 0.8
    if kind == "batch":
        cls = {2: nn.BatchNorm1d, 3: nn.BatchNorm1d, 4: nn.BatchNorm2d, 5: nn.BatchNorm3d}[rank]
        module = cls(C, affine=affine, momentum=rng.choice([0.1, None, 0.5]),
                     track_running_stats=rng.random() < 0.8, **kw)
    elif kind == "instance":
        cls = {3: nn.InstanceNorm1d, 4: nn.InstanceNorm2d, 5: nn.InstanceNorm3d}[rank]
        module = cls(C, affine=affine, track_running_stats=rng.random() < 0.3, **kw)
    elif kind == "group":
        groups = rng.choice([g for g in (1, 2, 3, C) if C % g == 0])
        module = nn.GroupNorm(groups, C, affine=affine, **kw)
    else:
        n = rng.choice([1, 2]) if rank > 2 else 1
        normalized = shape[len(shape) - n:]
        if kind == "layer":
            module = nn.LayerNorm(normalized, elementwise_affine=affine,
                                  bias=rng.random() < 0.8, **kw)
        else:
            module = nn.RMSNorm(normalized, elementwise_affine=affine,
                                **({"eps": eps} if eps is not None else {}))
    mixed = kind == "batch" and dtype in (torch.float16, torch.bfloat16) and rng.random() < 0.5
    layout = rng.choice(["contiguous", "channels_last", "strided", "transposed"])
    training = rng.random() < 0.6
    return module, shape, dtype, torch.float32 if mixed else dtype, layout, training, (
        f"{type(module).__name__} {shape} {dtype} mixed={mixed} {layout} train={training} "
        f"affine={affine} eps={eps}")


def _input(shape, dtype, layout, gen):
    x = (torch.randn(shape, generator=gen, dtype=torch.float64) * 2 + 0.5)
    if layout == "channels_last" and len(shape) in (4, 5):
        fmt = torch.channels_last if len(shape) == 4 else torch.channels_last_3d
        return x.to(dtype).contiguous(memory_format=fmt)
    if layout == "strided":
        wide = torch.randn((*shape[:-1], 2 * shape[-1]), generator=gen, dtype=torch.float64)
        wide[..., ::2] = x
        return wide.to(dtype)[..., ::2]
    if layout == "transposed" and len(shape) >= 3:
        return x.to(dtype).transpose(0, 1).contiguous().transpose(0, 1)
    return x.to(dtype)


def _step(module, x, dy):
    """Outputs, gradients and buffers of one step (or the exception's type)."""
    module.zero_grad()
    x = x.detach().clone().requires_grad_()
    try:
        y = module(x)
        y.backward(dy.to(y.dtype))
    except (ValueError, RuntimeError) as exc:
        return type(exc)
    return [y.detach(), x.grad, *(p.grad for p in module.parameters()),
            *(b.clone() for b in module.buffers())]


def _inv_std_max(module, x):
    """The largest ``1 / sqrt(var + eps)`` of the module's normalization of ``x``."""
    eps = module.eps if getattr(module, "eps", None) is not None else 1e-5
    if isinstance(module, nn.modules.batchnorm._BatchNorm):
        if module.training or module.running_var is None:
            var = x.transpose(0, 1).reshape(x.shape[1], -1).var(1, unbiased=False)
        else:
            var = module.running_var
    elif isinstance(module, nn.modules.instancenorm._InstanceNorm):
        var = x.reshape(x.shape[0] * x.shape[1], -1).var(1, unbiased=False)
    elif isinstance(module, nn.GroupNorm):
        var = x.reshape(x.shape[0] * module.num_groups, -1).var(1, unbiased=False)
    else:
        rows = x.reshape(-1, *module.normalized_shape).flatten(1)
        var = rows.square().mean(1) if isinstance(module, nn.RMSNorm) else rows.var(
            1, unbiased=False)
    return (1.0 / (var.double() + eps).sqrt()).max().item()


def _err(a, exact):
    return (a.double() - exact.double()).abs().max().item() if a.numel() else 0.0


@pytest.mark.parametrize("chunk", range(4))
def test_every_swapped_module_against_torch(chunk):
    import random

    rng = random.Random(45 + chunk)
    gen = torch.Generator().manual_seed(45 + chunk)
    compared = 0
    for case in range(CASES):
        module, shape, dtype, pdtype, layout, training, what = _config(rng)
        with torch.no_grad():
            for p in module.parameters():
                p.copy_(torch.randn(p.shape, generator=gen) * 0.5 + 1)
        theirs, exact = module.to(pdtype), copy.deepcopy(module).double()
        ours = copy.deepcopy(theirs)
        nt.replace_modules(ours)
        if isinstance(module, nn.RMSNorm) and module.eps is None:  # torch's rule: the
            wide = dtype in (torch.float16, torch.bfloat16)  # computation dtype's epsilon
            exact.eps = torch.finfo(torch.float32 if wide else dtype).eps
        for m in (theirs, ours, exact):
            m.train(training)
        # float64: torch is the reference too (no wider one); its terms cancel by more
        unit = max(torch.finfo(dtype).eps, 1e-12)
        for step in range(2):
            x = _input(shape, dtype, layout, gen)
            dy = torch.randn(shape, generator=gen, dtype=torch.float64)
            want, got, ref = _step(theirs, x, dy), _step(ours, x, dy), _step(
                exact, x.double(), dy)
            terms = _inv_std_max(exact, x.double()) * max(
                [1.0] + [p.detach().abs().max().item() for p in exact.parameters()])
            if isinstance(want, type):
                assert got is want, f"case {case} step {step}: {what}: torch raised {want}"
                break
            assert not isinstance(got, type), f"case {case}: {what}: raised {got}"
            for i, (w, g, r) in enumerate(zip(want, got, ref, strict=True)):
                assert (g is None) == (w is None), f"case {case}: {what}: output {i}"
                if g is None:
                    continue
                assert g.dtype == w.dtype and g.shape == w.shape, f"case {case}: {what}: {i}"
                # Y and dX are sums of terms of x r and dY r (r = 1 / sqrt(var + eps)),
                # which cancel where var is 0 (a group of one value: Y = B, dX = 0)
                scale = r.double().abs().max().item() + 1.0
                if i < 2:
                    scale += terms * (x if i == 0 else dy).double().abs().max().item()
                else:  # dW = sum(dY x_hat): the same terms, summed
                    scale += terms * x.double().abs().max().item() * dy.abs().max().item() \
                        * x.numel() / max(1, g.numel())
                bound = 2 * _err(w, r) + (8 if i == 0 else 64) * unit * scale
                assert _err(g, r) <= bound, (
                    f"case {case} step {step}: {what}: output {i}: error {_err(g, r):.3g} "
                    f"against torch's {_err(w, r):.3g}")
                compared += 1
    assert compared > 5 * CASES  # most cases compare outputs, gradients and buffers

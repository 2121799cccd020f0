"""diffusers' modulated normalizations swapped by replace_modules
(normkernels/torch/modulated.py): the one-pass result against the class's own forward
evaluated in float64 (the oracle), the other outputs bit for bit, the calls the swap
leaves to the class's own code, and whole diffusers transformers."""

import copy

import numpy as np
import pytest

torch = pytest.importorskip("torch")
diffusers = pytest.importorskip("diffusers")
from diffusers.models import normalization as dn  # noqa: E402

import normkernels.torch as nt  # noqa: E402
from normkernels.torch import modulated  # noqa: E402

F16, BF16, F32, F64 = torch.float16, torch.bfloat16, torch.float32, torch.float64
C = 48


def _emb(n, width):
    return lambda gen, dtype: {"emb": torch.randn(n, width, generator=gen).to(dtype)}


# name -> (the class built, its inputs besides x: a function of (generator, dtype))
CASES = {
    "zero-labels": (lambda: dn.AdaLayerNormZero(C, num_embeddings=10),
                    lambda gen, dtype: {"timestep": torch.tensor([3, 5]),
                                        "class_labels": torch.tensor([1, 2]),
                                        "hidden_dtype": dtype}),
    "zero": (lambda: dn.AdaLayerNormZero(C), _emb(2, C)),
    "zero-single": (lambda: dn.AdaLayerNormZeroSingle(C), _emb(2, C)),
    "ada-per-sample": (lambda: dn.AdaLayerNorm(C, chunk_dim=1),
                       lambda gen, dtype: {"temb": torch.randn(2, C, generator=gen).to(dtype)}),
    "ada-every-sample": (lambda: dn.AdaLayerNorm(C, num_embeddings=10),
                         lambda gen, dtype: {"timestep": torch.tensor(4)}),
    "continuous": (lambda: dn.AdaLayerNormContinuous(C, 32, elementwise_affine=False, eps=1e-6),
                   lambda gen, dtype: {"conditioning_embedding":
                                       torch.randn(2, 32, generator=gen).to(dtype)}),
    "group": (lambda: dn.AdaGroupNorm(32, C, 8, act_fn="silu"), _emb(2, 32)),
}


def _module(case, dtype, seed=0):
    torch.manual_seed(seed)
    module = CASES[case][0]().to(dtype).eval()
    with torch.no_grad():  # modulations of about one: (1 + scale) far from 1, shifts too
        for p in module.parameters():
            p.mul_(4)
    return module


def _swapped(module):
    ours = copy.deepcopy(module)
    names = nt.replace_modules(ours)
    assert "" in names and type(ours).__module__ == "normkernels.torch.zoo", names
    return ours


def _x(case, dtype, gen, channels_last=False, offset=1.0):
    if case == "group":
        x = torch.randn(2, C, 5, 3, generator=gen) * 2 + offset
        return (x.to(memory_format=torch.channels_last) if channels_last else x).to(dtype)
    return (torch.randn(2, 7, C, generator=gen) * 2 + offset).to(dtype)


def _outputs(module, x, kwargs):
    with torch.no_grad():
        out = module(x, **kwargs)
    return out if isinstance(out, tuple) else (out,)


def _count_fused(monkeypatch):
    """The one-pass operators' calls, each as (shift, scale, keywords): float64 copies
    of the modulations they were given."""
    calls = []

    def spy(fn):
        def call(X, shift, scale, **kwargs):
            calls.append((np.asarray(shift, np.float64).copy(),
                          np.asarray(scale, np.float64).copy(), kwargs))
            return fn(X, shift, scale, **kwargs)
        return call

    for name in ("ada_layer_norm", "ada_group_norm"):
        monkeypatch.setattr(modulated.api, name, spy(getattr(modulated.api, name)))
    return calls


def _exact(x, shift, scale, kwargs):
    """The float64 oracle: x normalized (LayerNorm over the last axis, or GroupNorm of
    (N, C, H, W)), then ``* (1 + scale) + shift`` per sample and channel; and the sum
    of the terms' magnitudes (the scale of a cancellation), and the scale of a float32
    normalization's own error (torch's, at a large mean: ``|x| / std`` relative to
    the values, or its square where the variance is E[x^2] - E[x]^2)."""
    x = x.double()
    if x.dim() == 4:
        n = x.shape[0]
        g = x.reshape(n, kwargs["num_groups"], -1)
        std = (g.var(-1, unbiased=False, keepdim=True) + kwargs["epsilon"]).sqrt()
        xhat = ((g - g.mean(-1, keepdim=True)) / std).reshape(x.shape)
        cond = (g.abs() / std).reshape(x.shape)
        s, b = (torch.from_numpy(a)[:, :, None, None] for a in (scale, shift))
    else:
        std = (x.var(-1, unbiased=False, keepdim=True) + kwargs["epsilon"]).sqrt()
        xhat, cond = (x - x.mean(-1, keepdim=True)) / std, x.abs() / std
        s, b = (torch.from_numpy(a)[:, None, :] for a in (scale, shift))
    scaled = (xhat * (1 + s)).abs()
    return xhat * (1 + s) + b, scaled + b.abs(), (1 + s).abs() * cond + scaled * cond**2


@pytest.mark.parametrize("dtype", [F16, BF16, F32])
@pytest.mark.parametrize("case", CASES)
def test_one_pass_within_one_rounding_of_the_float64_forward(case, dtype, monkeypatch):
    """Y in one pass: within one ulp of T of the class's own forward in float64 (plus
    float32's rounding of the terms where they cancel), the shape and memory format
    torch gives; the gates and the other modulations bit for bit."""
    calls = _count_fused(monkeypatch)
    gen = torch.Generator().manual_seed(11)
    module = _module(case, dtype)
    ours = _swapped(module)
    for channels_last, offset in ((False, 1.0), (True, 1e3)):
        x = _x(case, dtype, gen, channels_last, offset)
        kwargs = CASES[case][1](gen, dtype)
        want, got = _outputs(module, x, kwargs), _outputs(ours, x, kwargs)
        assert len(got) == len(want) and calls, "the one-pass operator did not run"
        for w, g in zip(want[1:], got[1:], strict=True):
            assert torch.equal(w, g)
        w, g = want[0], got[0]
        assert g.dtype == w.dtype and g.shape == w.shape
        if case == "group":
            assert g.stride() == w.stride()
        shift, scale, kw = calls[-1]
        exact, terms, cond = _exact(x, shift, scale, kw)
        eps, eps32 = torch.finfo(dtype).eps, torch.finfo(F32).eps
        err = (g.double() - exact).abs()  # rounded once: half an ulp of T, and float32's
        assert (err <= 0.5 * eps * exact.abs() + 16 * eps32 * terms).all(), \
            (err / exact.abs()).max().item()
        # the class's own sequence rounds three times (each within an ulp of T of the
        # terms), after torch's normalization in float32 (whose channels-last GroupNorm
        # takes the variance as E[x^2] - E[x]^2: an error of eps * cond^2)
        torch_error = 2 * eps * terms + 8 * eps32 * cond
        assert ((g.double() - w.double()).abs() <= torch_error).all()


def test_bfloat16_one_pass_is_as_close_as_torch_s_sequence():
    """Rounded once, the one pass is at least as close to the float64 forward as
    torch's three roundings, over many values (AdaLayerNormZero, bfloat16)."""
    gen = torch.Generator().manual_seed(5)
    module = _module("zero", F32)
    ours = _swapped(module.to(BF16))
    module64 = copy.deepcopy(module).double()
    x = torch.randn(2, 256, C, generator=gen) * 3
    emb = torch.randn(2, C, generator=gen)
    want = _outputs(module, x.to(BF16), {"emb": emb.to(BF16)})[0].double()
    got = _outputs(ours, x.to(BF16), {"emb": emb.to(BF16)})[0].double()
    # the oracle from T's inputs and T's modulations
    exact = _outputs(module64, x.to(BF16).double(), {"emb": emb.to(BF16).double()})[0]
    assert (got - exact).abs().mean() <= (want - exact).abs().mean()


@pytest.mark.parametrize("case", CASES)
def test_gradients_and_other_calls_run_the_class_s_code(case, monkeypatch):
    """With a gradient wanted, parameters of another dtype than x, or a norm with its
    own weight, the class's code runs (its inner LayerNorm swapped: within float32's
    rounding of the original, gradients included); the one-pass operator is not
    called."""
    calls = _count_fused(monkeypatch)
    gen = torch.Generator().manual_seed(2)
    module = _module(case, F32)
    ours = _swapped(module)
    x = _x(case, F32, gen)
    kwargs = CASES[case][1](gen, F32)
    grads = []
    for m in (module, ours):
        m.zero_grad()
        xi = x.clone().requires_grad_()
        out = m(xi, **kwargs)
        y = out[0] if isinstance(out, tuple) else out
        y.backward(torch.ones_like(y))
        grads.append((y.detach(), xi.grad, [p.grad for p in m.parameters()]))
    assert not calls
    (y0, dx0, dp0), (y1, dx1, dp1) = grads
    torch.testing.assert_close(y1, y0, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(dx1, dx0, rtol=1e-4, atol=1e-4)
    for a, b in zip(dp0, dp1, strict=True):
        assert (a is None) == (b is None)
        if a is not None:
            torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-4 * a.abs().max().item())
    if case == "group":
        return
    # float64 parameters and a float32 x: torch promotes, the class's code runs
    module64 = _module(case, F64)
    ours64 = _swapped(module64)
    kw64 = CASES[case][1](gen, F64)
    try:
        want = _outputs(module64, x, kw64)
    except RuntimeError:  # AdaLayerNormContinuous casts the embedding to x's dtype
        with pytest.raises(RuntimeError):
            _outputs(ours64, x, kw64)
        return
    got = _outputs(ours64, x, kw64)
    assert not calls and got[0].dtype == want[0].dtype == F64
    torch.testing.assert_close(got[0], want[0], rtol=1e-5, atol=1e-5)


def test_a_norm_with_its_own_affine_runs_the_class_s_code(monkeypatch):
    calls = _count_fused(monkeypatch)
    gen = torch.Generator().manual_seed(3)
    module = dn.AdaLayerNormContinuous(C, 32).eval()  # elementwise_affine=True
    ours = _swapped(module)
    x, cond = torch.randn(2, 7, C, generator=gen), torch.randn(2, 32, generator=gen)
    torch.testing.assert_close(_outputs(ours, x, {"conditioning_embedding": cond})[0],
                               _outputs(module, x, {"conditioning_embedding": cond})[0])
    assert not calls


def test_errors_are_torch_s():
    """What torch rejects, the swap rejects with torch's exception: channels that
    the groups do not divide."""
    module = dn.AdaGroupNorm(8, 12, 5)
    ours = _swapped(module)
    x, emb = torch.randn(1, 12, 3, 3), torch.randn(1, 8)
    with pytest.raises(Exception) as want, torch.no_grad():
        module(x, emb)
    with pytest.raises(type(want.value)), torch.no_grad():
        ours(x, emb)


def test_diffusers_transformers_swap_their_modulated_norms(monkeypatch):
    """A small DiT and an SD3 transformer: every AdaLayerNorm* swapped, the one pass
    run, the output within float32's rounding of the original's."""
    calls = _count_fused(monkeypatch)
    torch.manual_seed(0)
    dit = diffusers.DiTTransformer2DModel(num_attention_heads=2, attention_head_dim=8,
                                          in_channels=4, num_layers=2, sample_size=8,
                                          patch_size=2, num_embeds_ada_norm=10).eval()
    sd3 = diffusers.SD3Transformer2DModel(sample_size=8, patch_size=2, in_channels=4,
                                          num_layers=2, attention_head_dim=8,
                                          num_attention_heads=2, joint_attention_dim=16,
                                          caption_projection_dim=16, pooled_projection_dim=8,
                                          out_channels=4).eval()
    inputs = {
        "dit": (dit, lambda m: m(torch.randn(2, 4, 8, 8, generator=gen),
                                 timestep=torch.tensor([1, 7]),
                                 class_labels=torch.tensor([2, 3])).sample),
        "sd3": (sd3, lambda m: m(torch.randn(2, 4, 8, 8, generator=gen),
                                 encoder_hidden_states=torch.randn(2, 5, 16, generator=gen),
                                 pooled_projections=torch.randn(2, 8, generator=gen),
                                 timestep=torch.tensor([1, 7])).sample),
    }
    for name, (model, run) in inputs.items():
        gen = torch.Generator().manual_seed(1)
        with torch.no_grad():
            want = run(model)
        names = nt.replace_modules(model)
        ada = [m for m in model.modules() if type(m).__name__.startswith("AdaLayerNorm")
               and type(m).__name__ != "AdaLayerNormSingle"]
        assert ada and all(type(m).__module__ == "normkernels.torch.zoo" for m in ada), name
        before = len(calls)
        gen = torch.Generator().manual_seed(1)
        with torch.no_grad():
            got = run(model)
        assert len(calls) - before >= len(ada), (name, names)
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4 * want.abs().max().item())
        nt.restore_modules(model)
        assert all(type(m).__module__.startswith("diffusers") for m in ada)

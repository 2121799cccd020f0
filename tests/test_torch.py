"""normkernels.torch: the custom operators (opcheck, gradcheck, against torch's own
functions in every dtype and memory format), the drop-in modules (same state, same
forward and backward, running statistics), replace_modules on small networks trained
side by side, torch.compile through the fakes, and the errors. Skipped without torch
(``pip install torch==2.13.0``, a CPU build); .ci/run installs it."""

import copy

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="needs torch (pip install torch==2.13.0)")

import torch.nn.functional as TF  # noqa: E402
from torch import nn  # noqa: E402

import normkernels.torch as nt  # noqa: E402
from normkernels.torch import functional, ops, tensors  # noqa: E402

DTYPES = [torch.float32, torch.float64, torch.bfloat16, torch.float16]
IDS = ["float32", "float64", "bfloat16", "float16"]
# |ours - torch's| allowed, relative to the largest |value|: both round the same
# float64-exact result, but torch computes 16-bit inputs' Y through float32 steps
TOL = {torch.float32: 2e-5, torch.float64: 1e-12, torch.bfloat16: 2e-2, torch.float16: 3e-3}


@pytest.fixture
def gen():
    return torch.Generator().manual_seed(0)


def _close(got, want, dtype, what):
    scale = max(1.0, want.detach().abs().max().item())
    err = (got.detach().double() - want.detach().double()).abs().max().item()
    assert err <= TOL[dtype] * scale * 4, f"{what}: max error {err:.3g} (scale {scale:.3g})"


def _cases(gen, dtype):
    """(name, ours, theirs, inputs): each normalization with weights and bias."""
    def t(*shape, channels_last=False):
        x = torch.randn(*shape, generator=gen, dtype=torch.float64).to(dtype)
        if channels_last:
            x = x.contiguous(memory_format=torch.channels_last)
        return x.requires_grad_()
    x4 = t(2, 6, 5, 7)
    w6, b6 = t(6), t(6)
    x3 = t(3, 5, 24)
    w24, b24 = t(24), t(24)
    rm, rv = torch.randn(6, generator=gen).to(dtype), torch.rand(6, generator=gen).to(dtype) + .5
    return [
        ("layer_norm", lambda x, w, b: nt.layer_norm(x, (24,), w, b),
         lambda x, w, b: TF.layer_norm(x, (24,), w, b), (x3, w24, b24)),
        ("layer_norm 2 axes", lambda x, w, b: nt.layer_norm(x, (5, 24), w, b),
         lambda x, w, b: TF.layer_norm(x, (5, 24), w, b), (x3, t(5, 24), t(5, 24))),
        ("rms_norm", lambda x, w: nt.rms_norm(x, (24,), w, 1e-5),
         lambda x, w: TF.rms_norm(x, (24,), w, 1e-5), (x3, w24)),
        ("group_norm", lambda x, w, b: nt.group_norm(x, 3, w, b),
         lambda x, w, b: TF.group_norm(x, 3, w, b), (x4, w6, b6)),
        ("group_norm channels_last", lambda x, w, b: nt.group_norm(x, 2, w, b),
         lambda x, w, b: TF.group_norm(x, 2, w, b), (t(2, 6, 5, 7, channels_last=True), w6, b6)),
        ("instance_norm", lambda x, w, b: nt.instance_norm(x, weight=w, bias=b),
         lambda x, w, b: TF.instance_norm(x, weight=w, bias=b), (x4, w6, b6)),
        ("batch_norm training", lambda x, w, b: nt.batch_norm(x, None, None, w, b, True),
         lambda x, w, b: TF.batch_norm(x, None, None, w, b, True), (x4, w6, b6)),
        ("batch_norm training channels_last",
         lambda x, w, b: nt.batch_norm(x, None, None, w, b, True),
         lambda x, w, b: TF.batch_norm(x, None, None, w, b, True),
         (t(2, 6, 5, 7, channels_last=True), w6, b6)),
        ("batch_norm eval", lambda x, w, b: nt.batch_norm(x, rm, rv, w, b, False),
         lambda x, w, b: TF.batch_norm(x, rm, rv, w, b, False), (x4, w6, b6)),
    ]


@pytest.mark.parametrize("dtype", DTYPES, ids=IDS)
def test_functions_match_torch_forward_and_backward(gen, dtype):
    """Y and every gradient against torch's functions (a random dY; then y.sum(),
    whose dY is an expanded tensor of stride 0); Y keeps X's memory format."""
    for name, ours, theirs, inputs in _cases(gen, dtype):
        y, want = ours(*inputs), theirs(*inputs)
        assert y.dtype == want.dtype and y.shape == want.shape, name
        assert y.stride() == inputs[0].stride(), f"{name}: Y's memory format"
        _close(y, want, dtype, f"{name} Y")
        dy = torch.randn(y.shape, generator=gen, dtype=torch.float64).to(dtype)
        got = torch.autograd.grad(y, inputs, dy)
        exp = torch.autograd.grad(want, inputs, dy)
        for k, (g, e) in enumerate(zip(got, exp, strict=True)):
            _close(g, e, dtype, f"{name} grad {k}")
        got = torch.autograd.grad(ours(*inputs).float().sum(), inputs)
        exp = torch.autograd.grad(theirs(*inputs).float().sum(), inputs)
        for k, (g, e) in enumerate(zip(got, exp, strict=True)):
            _close(g, e, dtype, f"{name} grad {k} of y.sum()")


def test_gradcheck_float64(gen):
    for name, ours, _, inputs in _cases(gen, torch.float64):
        assert torch.autograd.gradcheck(ours, inputs, eps=1e-6, atol=1e-6), name


def _sample_args(gen):
    x4 = torch.randn(2, 6, 5, 7, generator=gen, requires_grad=True)
    x3 = torch.randn(3, 5, 24, generator=gen, requires_grad=True)
    w6, b6 = torch.randn(6, generator=gen), torch.randn(6, generator=gen)
    w24, b24 = torch.randn(24, generator=gen), torch.randn(24, generator=gen)
    last = x4.detach().contiguous(memory_format=torch.channels_last).requires_grad_()
    return [
        (ops.layer_norm, (x3, 1, w24.requires_grad_(), b24.requires_grad_(), 1e-5)),
        (ops.layer_norm, (x3, 2, None, None, 1e-5)),
        (ops.rms_norm, (x3, 1, w24, 1e-6)),
        (ops.group_norm, (x4, 3, w6.requires_grad_(), b6.requires_grad_(), 1e-5)),
        (ops.group_norm, (last, 2, None, None, 1e-5)),
        (ops.instance_norm, (x4, w6, b6, 1e-5)),
        (ops.batch_norm_training, (x4, w6, b6, 1e-5)),
        (ops.batch_norm_training, (last, None, None, 1e-3)),
        (ops.batch_norm_inference, (x4, w6, b6, torch.randn(6, generator=gen),
                                    torch.rand(6, generator=gen) + 0.5, 1e-5)),
    ]


def test_opcheck_every_operator(gen):
    """Schema, fake (shape and dtype), autograd registration and AOT dispatch."""
    checked = set()
    for op, args in _sample_args(gen):
        torch.library.opcheck(op, args)
        checked.add(op)
    assert checked == set(ops.OPERATORS)


def test_torch_compile_of_a_swapped_block_runs(gen):
    """The fakes let torch.compile trace forward and backward (aot_eager: no C++
    compiler needed) and give the eager results."""
    model = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
                          nn.GroupNorm(4, 8), nn.Flatten(), nn.LayerNorm(8 * 36))
    nt.replace_modules(model)
    x = torch.randn(4, 3, 6, 6, generator=gen)
    model.eval()
    eager = model(x)
    compiled = torch.compile(model, backend="aot_eager", fullgraph=True)
    torch.testing.assert_close(compiled(x), eager)
    model.train()
    compiled(x).square().sum().backward()
    assert all(p.grad is not None for p in model.parameters())


def test_tensors_are_viewed_not_copied():
    for dtype in DTYPES:
        t = torch.arange(24, dtype=dtype).reshape(2, 3, 4)[:, 1:, ::2]
        a = tensors.array(t, "x")
        assert a.ctypes.data == t.data_ptr() and a.shape == tuple(t.shape)
        assert a.strides == tuple(s * t.element_size() for s in t.stride())
        np.testing.assert_array_equal(a.astype(np.float64), t.double().numpy())
        back = tensors.tensor(a)
        assert back.dtype == dtype and back.data_ptr() == t.data_ptr()


def test_errors_name_the_argument():
    x = torch.randn(2, 3, 4)
    with pytest.raises(TypeError, match="input: dtype must be float16"):
        nt.layer_norm(x.to(torch.complex64), (4,))
    with pytest.raises(TypeError, match="input: dtype must be float16"):
        nt.group_norm(torch.ones(2, 4, 3, dtype=torch.int32), 2)
    with pytest.raises(ValueError, match="input: normkernels computes on the CPU"):
        tensors.array(torch.empty(2, 3, device="meta"), "input")
    with pytest.raises(ValueError, match="normalized_shape"):
        nt.layer_norm(x, (3,))
    with pytest.raises(ValueError, match="running statistics"):
        nt.instance_norm(x, torch.zeros(3), torch.ones(3))
    with pytest.raises(ValueError, match="more than 1 value per channel"):
        nt.batch_norm(torch.randn(1, 3), None, None, training=True)
    # one spatial element: torch raises (its instance statistics would be 0 and x - x)
    for shape, module in (((2, 3, 1), nt.InstanceNorm1d(3)),
                          ((2, 3, 1, 1), nt.InstanceNorm2d(3, affine=True))):
        x = torch.randn(*shape)
        for call in (nt.instance_norm, module):
            with pytest.raises(ValueError, match="more than 1 spatial element"):
                call(x)
        torch_module = {1: nn.InstanceNorm1d, 2: nn.InstanceNorm2d}[len(shape) - 2](3)
        with pytest.raises(ValueError, match="more than 1 spatial element"):
            torch_module(torch.randn(*shape))
    with pytest.raises(ValueError, match="num_groups"):
        nt.group_norm(torch.randn(2, 6, 4), 4)


def test_double_backward_is_an_error_not_zeros():
    x = torch.randn(3, 8, requires_grad=True)
    (g,) = torch.autograd.grad(nt.layer_norm(x, (8,)).square().sum(), x, create_graph=True)
    with pytest.raises(RuntimeError):
        torch.autograd.grad(g.sum(), x)


MODULES = [
    (nn.BatchNorm1d, nt.BatchNorm1d, dict(num_features=6), (8, 6, 5)),
    (nn.BatchNorm2d, nt.BatchNorm2d, dict(num_features=6, momentum=None), (4, 6, 3, 5)),
    (nn.BatchNorm3d, nt.BatchNorm3d, dict(num_features=6, affine=False), (2, 6, 3, 2, 5)),
    (nn.BatchNorm2d, nt.BatchNorm2d, dict(num_features=6, track_running_stats=False),
     (4, 6, 3, 5)),
    (nn.InstanceNorm1d, nt.InstanceNorm1d, dict(num_features=6, affine=True), (4, 6, 9)),
    (nn.InstanceNorm2d, nt.InstanceNorm2d, dict(num_features=6), (4, 6, 3, 5)),
    (nn.InstanceNorm3d, nt.InstanceNorm3d, dict(num_features=6, affine=True), (2, 6, 3, 2, 5)),
    (nn.GroupNorm, nt.GroupNorm, dict(num_groups=3, num_channels=6), (4, 6, 3, 5)),
    (nn.GroupNorm, nt.GroupNorm, dict(num_groups=2, num_channels=6, affine=False), (4, 6, 7)),
    (nn.LayerNorm, nt.LayerNorm, dict(normalized_shape=(5, 6)), (4, 5, 6)),
    (nn.LayerNorm, nt.LayerNorm, dict(normalized_shape=6, bias=False), (4, 5, 6)),
    (nn.RMSNorm, nt.RMSNorm, dict(normalized_shape=6), (4, 5, 6)),
    (nn.RMSNorm, nt.RMSNorm, dict(normalized_shape=6, eps=1e-6, elementwise_affine=False),
     (4, 5, 6)),
]


@pytest.mark.parametrize("theirs,ours,kwargs,shape", MODULES,
                         ids=[f"{m[0].__name__}-{i}" for i, m in enumerate(MODULES)])
def test_modules_match_torch_over_steps(gen, theirs, ours, kwargs, shape):
    """Same state_dict keys (loaded both ways); three training steps then eval: Y,
    every parameter's gradient and every buffer (running statistics, batches) alike."""
    a = theirs(**kwargs)
    b = ours(**kwargs)
    assert list(a.state_dict()) == list(b.state_dict())
    with torch.no_grad():
        for p in a.parameters():
            p.copy_(torch.randn(p.shape, generator=gen))
    b.load_state_dict(a.state_dict())
    a.load_state_dict(b.state_dict())
    for step in range(4):
        if step == 3:
            a.eval()
            b.eval()
        x = torch.randn(shape, generator=gen)
        ya, yb = a(x.requires_grad_()), b(x)
        _close(yb, ya, torch.float32, f"step {step} Y")
        dy = torch.randn(ya.shape, generator=gen)
        for m, y in ((a, ya), (b, yb)):
            m.zero_grad()
            y.backward(dy)
        for (name, pa), pb in zip(a.named_parameters(), b.parameters(), strict=True):
            _close(pb.grad, pa.grad, torch.float32, f"step {step} d{name}")
        for (name, ba), bb in zip(a.named_buffers(), b.buffers(), strict=True):
            if ba.dtype.is_floating_point:
                _close(bb, ba, torch.float32, f"step {step} {name}")
            else:
                assert torch.equal(ba, bb), name


def _resnet_block():
    return nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
                         nn.Conv2d(8, 8, 3, padding=1), nn.GroupNorm(4, 8), nn.ReLU(),
                         nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 4))


def _encoder_block():
    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.layer = nn.TransformerEncoderLayer(16, 2, 32, dropout=0.0, batch_first=True)
            self.norm = nn.RMSNorm(16)
            self.head = nn.Linear(16, 4)

        def forward(self, x):
            return self.head(self.norm(self.layer(x)).mean(1))
    return Block()


@pytest.mark.parametrize("build,shape", [(_resnet_block, (8, 3, 8, 8)),
                                         (_encoder_block, (4, 10, 16))],
                         ids=["resnet-block", "encoder-block"])
def test_swapped_networks_train_like_torch(build, shape):
    """20 SGD steps of a network and of its copy with every normalization swapped:
    the same losses within float32 tolerance, and the same parameters after."""
    torch.manual_seed(0)
    theirs = build()
    ours = build()
    ours.load_state_dict(theirs.state_dict())
    swapped = nt.replace_modules(ours)
    assert swapped and all(type(m).__module__ == "normkernels.torch.modules"
                           for n, m in ours.named_modules() if n in swapped)
    if build is _encoder_block:  # the fast path of the encoder layer skips norm modules
        theirs.layer.norm_first = ours.layer.norm_first = False
    gen = torch.Generator().manual_seed(1)
    opts = [torch.optim.SGD(m.parameters(), lr=0.05) for m in (theirs, ours)]
    for step in range(20):
        x = torch.randn(shape, generator=gen)
        target = torch.randint(0, 4, (shape[0],), generator=gen)
        losses = []
        for model, opt in zip((theirs, ours), opts, strict=True):
            opt.zero_grad()
            loss = TF.cross_entropy(model(x), target)
            loss.backward()
            opt.step()
            losses.append(loss.item())
        assert abs(losses[0] - losses[1]) <= 1e-4 * max(1.0, abs(losses[0])), (step, losses)
    for pa, pb in zip(theirs.parameters(), ours.parameters(), strict=True):
        torch.testing.assert_close(pb, pa, rtol=1e-3, atol=1e-4)
    assert nt.restore_modules(ours) == swapped


def test_register_swap_adds_an_exact_class_and_restore_undoes_it(gen):
    """A subclass of a torch.nn class is not swapped until registered (exact classes
    only); registered ``like`` torch.nn.LayerNorm it computes through normkernels with
    torch's result, keeps its parameters, and ``restore_modules`` gives its class
    back. Registering checks its arguments; the docstring's example runs."""
    import doctest

    from normkernels.torch import modules

    class Timmish(nn.LayerNorm):  # a model zoo's LayerNorm: torch's semantics
        pass

    class Sub(Timmish):
        pass

    model = nn.Sequential(Timmish(8), Sub(8), nn.LayerNorm(8))
    assert nt.replace_modules(model) == ["2"]
    nt.restore_modules(model)
    ours = nt.register_swap(Timmish, like=nn.LayerNorm)
    try:
        weight = model[0].weight
        x = torch.randn(3, 8, generator=gen)
        want = model[0](x)
        assert nt.replace_modules(model) == ["0", "2"]
        assert type(model[0]) is ours and isinstance(model[0], Timmish)
        assert model[0].weight is weight and type(model[1]) is Sub
        calls = []
        original = modules.F.layer_norm
        modules.F.layer_norm = lambda *a, **k: calls.append(1) or original(*a, **k)
        try:
            got = model[0](x)
        finally:
            modules.F.layer_norm = original
        assert calls == [1]
        _close(got, want, torch.float32, "registered LayerNorm")
        assert nt.restore_modules(model) == ["0", "2"]
        assert type(model[0]) is Timmish
    finally:
        nt.unregister_swap(Timmish)
    assert nt.replace_modules(model) == ["2"]
    with pytest.raises(TypeError, match="ours must be a subclass of cls"):
        nt.register_swap(Timmish, nt.GroupNorm)
    with pytest.raises(ValueError, match="like must be one of"):
        nt.register_swap(Timmish, like=nn.Linear)
    with pytest.raises(TypeError, match="must subclass like"):
        nt.register_swap(Timmish, like=nn.GroupNorm)
    with pytest.raises(TypeError, match="not both or neither"):
        nt.register_swap(Timmish)
    assert doctest.testmod(modules).failed == 0


def test_modules_fall_back_to_torch_where_normkernels_cannot_run(gen):
    """Parameters of another dtype than the input (autocast's mixed case): torch's
    forward, the same result as the torch module's."""
    a, b = nn.LayerNorm(8), nt.LayerNorm(8)
    x = torch.randn(3, 8, generator=gen).to(torch.bfloat16)
    torch.testing.assert_close(b(x), a(x))


def test_batch_norm_of_16_bit_input_with_float32_parameters(gen):
    """BatchNorm2d with float32 parameters and buffers on bfloat16 input (autocast's
    case): normkernels computes it, strided or not, with the weight and bias gradients
    float32 sums (torch's strided path rounds them to bfloat16: 6.7998 came back as
    6.8125) and torch's running statistics."""
    x0 = torch.randn(2, 4, 6, 10, generator=gen).to(torch.bfloat16)
    g = torch.randn(2, 4, 6, 5, generator=gen).to(torch.bfloat16)
    got = {}
    for strided in (False, True):
        ours, theirs = nt.BatchNorm2d(4), nn.BatchNorm2d(4)
        x = x0[..., ::2] if strided else x0[..., ::2].contiguous()
        for module in (ours, theirs):
            xr = x.detach().clone() if not strided else x0.detach().clone()[..., ::2]
            xr.requires_grad_()
            y = module(xr)
            y.backward(g)
            got[strided, module is ours] = (y, xr.grad, module.weight.grad, module.bias.grad,
                                            module.running_mean, module.running_var)
    reference = got[False, False]  # torch, contiguous: float32 sums
    for key in ((False, True), (True, True)):
        y, dx, dw, db, mean, var = got[key]
        assert dw.dtype == db.dtype == torch.float32
        torch.testing.assert_close(db, reference[3], rtol=1e-6, atol=1e-6)
        torch.testing.assert_close(dw, reference[2], rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(mean, reference[4], rtol=1e-6, atol=1e-7)
        torch.testing.assert_close(var, reference[5], rtol=1e-6, atol=1e-7)
        _close(y, reference[0], torch.bfloat16, f"y {key}")
        _close(dx, reference[1], torch.bfloat16, f"dx {key}")


def test_rms_norm_default_epsilon_is_torchs(gen):
    """``eps=None``: the machine epsilon of the computation's dtype, as torch's rule
    (float32's for 16-bit input, not the 16-bit epsilon: 0.0078 for bfloat16); rows of
    magnitude 1e-3 (1e-2 for 16-bit) make epsilon a visible part of the mean square.
    The gradient of the input goes through the same epsilon."""
    for dtype in (torch.float32, torch.float64, torch.float16, torch.bfloat16):
        size = 1e-2 if dtype.itemsize == 2 else 1e-3
        x = (size * torch.randn(4, 16, generator=gen, dtype=torch.float64)).to(dtype)
        _close(nt.rms_norm(x, (16,)), TF.rms_norm(x, (16,)), dtype, str(dtype))
        m, t = nt.RMSNorm(16, dtype=dtype), nn.RMSNorm(16, dtype=dtype)
        xa, xb = x.clone().requires_grad_(), x.clone().requires_grad_()
        ya, yb = m(xa), t(xb)
        _close(ya, yb, dtype, f"module {dtype}")
        g = torch.randn(4, 16, generator=gen, dtype=torch.float64).to(dtype)
        ya.backward(g)
        yb.backward(g)
        _close(xa.grad, xb.grad, dtype, f"module {dtype}: dX")


class _Passing(torch.overrides.TorchFunctionMode):
    def __torch_function__(self, func, types, args=(), kwargs=None):
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["float32", "bfloat16"])
def test_eager_routes_and_the_operators_agree_bit_for_bit(gen, dtype):
    """The eager calls skip the dispatcher (normkernels/torch/eager.py): without grad
    (the function alone), with grad (an autograd.Function), and the custom operator
    (what compile and export trace) give the same Y and gradients, bit for bit."""
    from normkernels.torch import eager

    for name, ours, _, inputs in _cases(gen, dtype):
        assert eager.route(*inputs) == eager.GRAD
        y = ours(*inputs)
        grads = torch.autograd.grad(y, inputs, torch.ones_like(y))
        with torch.no_grad():
            assert eager.route(*inputs) == eager.PLAIN
            plain = ours(*inputs)
        with _Passing():  # any mode: the operators
            assert eager.route(*inputs) == eager.OP
            y_op = ours(*inputs)
        grads_op = torch.autograd.grad(y_op, inputs, torch.ones_like(y_op))
        assert torch.equal(plain, y) and torch.equal(y_op, y), name
        for g, h in zip(grads, grads_op, strict=True):
            assert torch.equal(g, h), name


def test_numpy_functions_read_dlpack_tensors_in_place(gen):
    """The public functions take any array with ``__dlpack__`` (a torch tensor here)
    without a copy, bfloat16 too, and return NumPy arrays; a tensor that requires
    grad is an error naming the argument."""
    import normkernels as nk
    from normkernels.ops import common

    for dtype in DTYPES:
        t = torch.randn(4, 6, 8, generator=gen).to(dtype)
        a = common.as_array("X", t)
        assert a.ctypes.data == t.data_ptr() and a.shape == (4, 6, 8)
        s = torch.ones(8, dtype=dtype)
        got = nk.layer_normalization(t, s)
        assert isinstance(got, np.ndarray)
        want = nk.layer_normalization(tensors.array(t, "X"), tensors.array(s, "s"))
        np.testing.assert_array_equal(got.astype(np.float64), want.astype(np.float64))
    with pytest.raises(TypeError, match=r"X: .*grad"):
        nk.layer_normalization(torch.randn(2, 8, requires_grad=True), np.ones(8, np.float32))
    with pytest.raises(TypeError, match=r"X: .*grad"):
        nk.layer_normalization(torch.randn(2, 8, requires_grad=True).to(torch.bfloat16),
                               np.ones(8, tensors.BFLOAT16))


@pytest.mark.parametrize("size", ["small", "large"])
@pytest.mark.parametrize("dtype", DTYPES, ids=IDS)
def test_repeated_calls_without_grad_take_the_direct_route_and_stay_exact(gen, dtype, size):
    """Without gradients, later calls with known metadata run the serial kernel on
    views (normkernels/torch/direct.py): new values in x, weights changed in place,
    weights given new memory (``.data =``), another x of the same shape but other
    strides: every result bit for bit the custom operator's (which never takes that
    route). Small: one serial kernel call; large (above the serial size): the
    engine's call."""
    from normkernels.torch import direct

    direct.clear()
    K, HW = (24, (4, 5)) if size == "small" else (1024, (64, 96))

    def r(*shape):
        return torch.randn(*shape, generator=gen, dtype=torch.float64).to(dtype)

    ln, rms, bn = nn.LayerNorm(K).to(dtype), nn.RMSNorm(K, eps=1e-5).to(dtype), \
        nn.BatchNorm2d(6).to(dtype).eval()
    with torch.no_grad():
        for p in [*ln.parameters(), *rms.parameters(), *bn.parameters()]:
            p.copy_(torch.randn(p.shape, generator=gen))
        bn.running_var.add_(1.5)
    calls = [
        (lambda x: nt.layer_norm(x, (K,), ln.weight, ln.bias),
         lambda x: ops.layer_norm(x, 1, ln.weight, ln.bias, 1e-5)[0], (3, 25, K), ln),
        (lambda x: nt.rms_norm(x, (K,), rms.weight, 1e-5),
         lambda x: ops.rms_norm(x, 1, rms.weight, 1e-5)[0], (3, 25, K), rms),
        (lambda x: nt.batch_norm(x, bn.running_mean, bn.running_var, bn.weight, bn.bias),
         lambda x: ops.batch_norm_inference(x, bn.weight, bn.bias, bn.running_mean,
                                            bn.running_var, 1e-5), (2, 6, *HW), bn),
        # a few rows: the table-free kernel; Llama's rounding (the zoos' RMSNorm classes)
        (lambda x: nt.layer_norm(x, (K,), ln.weight, ln.bias),
         lambda x: ops.layer_norm(x, 1, ln.weight, ln.bias, 1e-5)[0], (2, K), ln),
        (lambda x: functional.rounded_rms_norm(x, rms.weight, 1e-5, "llama"),
         lambda x: ops.rms_norm_y(x, 1, rms.weight, 1e-5, "llama"), (3, 25, K), rms),
        (lambda x: functional.rounded_rms_norm(x, rms.weight, 1e-5, "llama"),
         lambda x: ops.rms_norm_y(x, 1, rms.weight, 1e-5, "llama"), (2, K), rms),
    ]
    if dtype in (torch.float16, torch.bfloat16):  # float32 parameters (autocast's)
        bn32 = copy.deepcopy(bn).float()
        calls.append((lambda x: nt.batch_norm(x, bn32.running_mean, bn32.running_var,
                                              bn32.weight, bn32.bias),
                      lambda x: ops.batch_norm_inference(x, bn32.weight, bn32.bias,
                                                         bn32.running_mean, bn32.running_var,
                                                         1e-5), (2, 6, *HW), bn32))
    with torch.no_grad():
        for ours, op, shape, module in calls:
            for step in range(6):
                x = r(*shape)
                if step == 2:
                    module.weight.mul_(-1.5)  # in place
                if step == 3:
                    module.weight.data = r(*module.weight.shape).to(module.weight.dtype)
                if step == 4:
                    x = r(*shape[:-1], 2 * shape[-1])[..., ::2]  # other strides
                got, want = ours(x), op(x)
                assert got.dtype == x.dtype and got.shape == x.shape
                assert torch.equal(got, want), (shape, step)
    assert len([p for p in direct._prepared.values() if p]) == len(calls), "no direct route"


_GROUPED = {  # (the function, the operator's call, groups): GroupNorm of 3 groups, InstanceNorm
    "group": (lambda x, w, b: nt.group_norm(x, 3, w, b),
              lambda x, w, b: ops.group_norm(x, 3, w, b, 1e-5),
              lambda x, w, b: TF.group_norm(x, 3, w, b), 3),
    "instance": (lambda x, w, b: nt.instance_norm(x, weight=w, bias=b),
                 lambda x, w, b: ops.instance_norm(x, w, b, 1e-5),
                 lambda x, w, b: TF.instance_norm(x, weight=w, bias=b), 6),
}


@pytest.mark.parametrize("which", list(_GROUPED))
def test_a_gradient_in_another_memory_format_gives_the_same_bits(gen, which):
    """Autograd may hand dY in another memory format than x's (a contiguous gradient
    for a channels_last x): dX and the parameter gradients are those of dY in x's."""
    ours, _, _, _ = _GROUPED[which]
    x = torch.randn(2, 6, 5, 7, generator=gen).contiguous(memory_format=torch.channels_last)
    w, b = torch.randn(6, generator=gen), torch.randn(6, generator=gen)
    dy = torch.randn(2, 6, 5, 7, generator=gen)
    got = {}
    for fmt in (torch.contiguous_format, torch.channels_last):
        inputs = [t.clone().requires_grad_() for t in (x, w, b)]
        got[fmt] = torch.autograd.grad(ours(*inputs), inputs, dy.contiguous(memory_format=fmt))
    for g, e in zip(got[torch.contiguous_format], got[torch.channels_last], strict=True):
        assert torch.equal(g, e)


@pytest.mark.parametrize("channels_last", [False, True], ids=["NCX", "NXC"])
@pytest.mark.parametrize("which", list(_GROUPED))
def test_group_norm_backward_uses_the_forward_statistics(gen, monkeypatch, channels_last,
                                                         which):
    """GroupNorm's and InstanceNorm's forward operators return (and their autograd
    keeps) the float64 per-(n, group) mean and ``1 / sqrt(var + eps)`` they normalized
    with, as torch's native_group_norm does; the backward reads X and dY with them and
    never recomputes statistics (the engine's recomputing reduction fails here).
    Variance near epsilon: an inverse standard deviation without it would be off by
    half."""
    from normkernels.engine.numba_engine import ENGINE
    from normkernels.torch import eager

    ours, operator, theirs, groups = _GROUPED[which]
    x = torch.randn(2, 6, 5, 7, generator=gen, dtype=torch.float64) * 3e-3 + 0.5
    if channels_last:
        x = x.contiguous(memory_format=torch.channels_last)
    w, b = torch.randn(6, generator=gen, dtype=torch.float64), torch.randn(6, generator=gen,
                                                                           dtype=torch.float64)
    dy = torch.randn(2, 6, 5, 7, generator=gen, dtype=torch.float64)
    y, mean, rstd = operator(x, w, b)
    torch.testing.assert_close(y, theirs(x, w, b), rtol=1e-9, atol=1e-9)  # torch: sums
    flat = x.reshape(2, groups, -1)
    assert mean.shape == rstd.shape == (2, groups)
    assert mean.dtype == rstd.dtype == torch.float64
    torch.testing.assert_close(mean, flat.mean(-1), rtol=1e-13, atol=0)
    torch.testing.assert_close(rstd, 1 / torch.sqrt(flat.var(-1, unbiased=False) + 1e-5),
                               rtol=1e-12, atol=0)

    def recomputed(*args, **kwargs):
        raise AssertionError("the backward recomputed the statistics")

    def given_only(real, position):
        def check(*args, **kwargs):
            given = args[position] if len(args) > position else kwargs.get("given")
            assert given is not None and given is not False, "the statistics recomputed"
            return real(*args, **kwargs)
        return check

    monkeypatch.setattr(ENGINE, "group_grad_sums", recomputed)
    monkeypatch.setattr(ENGINE, "group_backward", given_only(ENGINE.group_backward, 10))
    monkeypatch.setattr(ENGINE, "direct_group_backward",
                        given_only(ENGINE.direct_group_backward, 7))
    inputs = [t.clone().requires_grad_() for t in (x, w, b)]
    expected = torch.autograd.grad(theirs(*inputs), inputs, dy)
    for mode in (None, _Passing):  # the eager autograd.Function, then the operators
        with mode() if mode else torch.enable_grad():
            assert eager.route(*inputs) == (eager.OP if mode else eager.GRAD)
            got = torch.autograd.grad(ours(*inputs), inputs, dy)
        for g, e in zip(got, expected, strict=True):
            torch.testing.assert_close(g, e, rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("fmt", ["contiguous", "channels_last", "channels_last_3d"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_large_outputs_are_laid_out_as_torchs(gen, fmt, dtype):
    """At HUGE_PAGE_BYTES and more the adapter's outputs (Y, dX) come from NumPy's
    allocator (transparent huge pages): the shape, strides and dtype of
    torch.empty_like, values as torch's, and tensors like any other (in-place ops)."""
    from normkernels.torch import tensors

    shape = (2, 64, 4, 64, 64) if fmt == "channels_last_3d" else (2, 64, 128, 128)
    x = torch.randn(shape, generator=gen).to(dtype)
    x = x.contiguous(memory_format=getattr(torch, fmt if fmt != "contiguous" else
                                           "contiguous_format"))
    assert x.numel() * x.element_size() >= tensors.HUGE_PAGE_BYTES
    y = tensors.empty_like(x)
    assert (y.shape, y.stride(), y.dtype) == (x.shape, x.stride(), x.dtype)
    w, b = torch.randn(64, generator=gen).to(dtype), torch.randn(64, generator=gen).to(dtype)
    inputs = [t.clone().requires_grad_() for t in (x, w, b)]
    got = nt.group_norm(inputs[0], 8, inputs[1], inputs[2])
    want = TF.group_norm(x.float(), 8, w.float(), b.float())
    assert got.stride() == x.stride()
    torch.testing.assert_close(got.float(), want, rtol=2e-2, atol=2e-2)
    dx = torch.autograd.grad(got, inputs[0], torch.ones_like(got))[0]
    assert dx.stride() == x.stride() and dx.dtype == dtype
    got.add_(1)  # an ordinary tensor

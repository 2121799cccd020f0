"""The torch composites the bench's torch peer times (:mod:`normkernels.bench.peers`):
what a torch user writes for a row normalization (a skip add, a gate, per-head
QK-norm or an int8 output around ``F.rms_norm`` / ``F.layer_norm``), for the
per-sample modulation, and the ATen backward operators by family."""

from normkernels.operators import EPSILON
from normkernels.operators.record import qk_heads


def rows(torch, F, op, x, p):
    """F.layer_norm / F.rms_norm over the last axis (eps always given: F.rms_norm's
    default is the dtype's machine epsilon); a skip add first, as a torch user writes."""
    if any(v.dtype != x.dtype for v in p[op.skip:]):
        p = p[:op.skip] + [v.to(x.dtype) for v in p[op.skip:]]  # torch: one dtype
    shape = (x.shape[-1],)

    if op.family == "lp":
        def run():
            with torch.no_grad():
                return F.normalize(x, p=2.0, dim=-1)
        return run

    if op.family == "qk":  # Qwen3's q_norm and k_norm on the heads of a packed qkv
        heads = qk_heads(x.shape[-1])
        q, k, D = heads["num_q_heads"], heads["num_kv_heads"], heads["head_dim"]

        def run():
            with torch.no_grad():
                h = x.unflatten(-1, (-1, D))
                return torch.cat([F.rms_norm(h[..., :q, :], (D,), p[0], eps=EPSILON),
                                  F.rms_norm(h[..., q:q + k, :], (D,), p[1], eps=EPSILON),
                                  h[..., q + k:, :]], dim=-2).flatten(-2)
        return run

    def run():
        with torch.no_grad():
            v, q, gate = x, p, None
            if op.epilogue == "silu gate":  # the skip input gates the output
                gate, q = q[0], q[1:]
            elif op.skip:
                v = v + q[0] + q[-1] if op.skip_bias else v + q[0]
                q = q[1:-1] if op.skip_bias else q[1:]
            if op.family == "rms":
                y = F.rms_norm(v, shape, q[0], eps=EPSILON)
            else:
                y = F.layer_norm(v, shape, q[0], q[1] if len(q) > 1 else None, eps=EPSILON)
            if gate is not None:
                y = y * F.silu(gate)
            if op.quantized is None:
                return y
            # int8 with a scale per row: vLLM's reference composite
            scale = y.abs().amax(dim=-1, keepdim=True).float() / 127
            return (y / scale).round().clamp(-128, 127).to(torch.int8), scale
    return run


def modulated(torch, F, op, x, p, backward):
    """The unfused composite of a per-sample modulation (parameters (N, C), torch: one
    dtype): ``F.layer_norm(x, (C,)) * (1 + scale[:, None]) + shift[:, None]`` (DiT) or
    ``F.group_norm(x, G) * (1 + scale[..., None, None]) + shift[..., None, None]``
    (diffusers' AdaGroupNorm), as many unit axes as X's rank needs. Backward (``p``: dY,
    scale, shift): dX by ``torch.autograd.grad`` of that graph, built once (the
    parameters' gradients too)."""
    N, C = p[-1].shape
    view = (N, *[1] * (x.ndim - 2), C) if op.rows else (N, C, *[1] * (x.ndim - 2))
    dy, scale, shift = [None, *p] if not backward else p
    scale, shift = scale.to(x.dtype).view(view), shift.to(x.dtype).view(view)

    def forward(v, s, b):
        if op.rows:
            return F.layer_norm(v, (C,), eps=EPSILON) * (1 + s) + b
        return F.group_norm(v, op.group_count(C), eps=EPSILON) * (1 + s) + b

    if not backward:
        def run():
            with torch.no_grad():
                return forward(x, scale, shift)
        return run
    leaves = tuple(t.detach().requires_grad_() for t in (x, scale, shift))
    with torch.enable_grad():
        y = forward(*leaves)

    def run():
        return torch.autograd.grad(y, leaves, dy, retain_graph=True)[0]
    return run


def backward(torch, op, x, p):
    """dX as PyTorch's autograd computes it: the ATen backward op it runs for the
    operator (RMS: autograd itself), with the parameters' gradients too (output_mask
    all true) and the forward's saved statistics computed before the timed call:

    * batch normalization: ``native_batch_norm_backward`` (train=True; save_mean, the
      batch mean; save_invstd = 1 / sqrt(var + eps), from the workload's mean and var);
    * instance normalization: what autograd of ``F.instance_norm`` runs:
      ``native_batch_norm_backward`` on the (1, N*C, ...) view of the contiguous X
      (statistics from ``native_batch_norm`` on it), dY reshaped the same way (a copy
      for channels-last dY) and dscale summed over N (the backward of the repeat);
    * group normalization: ``native_group_norm_backward`` (mean, rstd of shape
      (N, group) from ``native_group_norm``);
    * layer normalization: ``native_layer_norm_backward`` (mean, rstd from
      ``native_layer_norm``; a zero bias, so dB is computed);
    * RMS normalization: autograd of ``F.rms_norm`` (``torch.autograd.grad`` of the
      forward's graph, built once, ``retain_graph=True``; dX and dscale): torch 2.13
      declares ``_fused_rms_norm_backward`` but has no CPU kernel for it (CUDA only),
      and on CPU ``F.rms_norm`` is a composite whose backward runs its elementwise ops
      and reductions.

    16-bit X takes float32 parameters and statistics for batch normalization (as
    torch's mixed-type kernel does), X's dtype elsewhere (torch: one dtype)."""
    dy, scale, *stats = p
    mask = [True, True, True]
    if op.family == "channel" and op.batch_statistics:
        w = scale.to(torch.float32 if x.dtype != torch.float64 else x.dtype)
        mean64, var64 = (v.to(torch.float64) for v in stats)
        save_mean = mean64.to(w.dtype)
        save_invstd = (1 / torch.sqrt(var64 + EPSILON)).to(w.dtype)

        def run():
            return torch.ops.aten.native_batch_norm_backward(
                dy, x, w, None, None, save_mean, save_invstd, True, EPSILON, mask)[0]
        return run
    w = scale.to(x.dtype)
    N, C = x.shape[0], x.shape[1] if x.ndim > 1 else 1
    if op.family == "channel":  # instance normalization
        shape = (1, N * C, *x.shape[2:])
        xr = x.contiguous().view(shape)  # what the forward saves
        wr = w.repeat(N)
        _, save_mean, save_invstd = torch.ops.aten.native_batch_norm(
            xr, wr, None, None, None, True, 0.0, EPSILON)

        def run():
            dx, dw, db = torch.ops.aten.native_batch_norm_backward(
                dy.reshape(shape), xr, wr, None, None, save_mean, save_invstd, True,
                EPSILON, mask)
            dw.view(N, C).sum(0)
            db.view(N, C).sum(0)
            return dx.view(x.shape)
        return run
    if op.family == "group":
        groups = op.group_count(C)
        HxW = x[0, 0].numel()
        _, mean, rstd = torch.ops.aten.native_group_norm(x, w, None, N, C, HxW, groups,
                                                         EPSILON)

        def run():
            return torch.ops.aten.native_group_norm_backward(dy, x, mean, rstd, w, N, C, HxW,
                                                             groups, mask)[0]
        return run
    shape = [x.shape[-1]]
    if op.family == "layer":
        bias = torch.zeros_like(w)
        _, mean, rstd = torch.ops.aten.native_layer_norm(x, shape, w, bias, EPSILON)

        def run():
            return torch.ops.aten.native_layer_norm_backward(dy, x, shape, mean, rstd, w, bias,
                                                             mask)[0]
        return run
    if op.family == "rms":
        leaves = (x.detach().requires_grad_(), w.detach().requires_grad_())
        with torch.enable_grad():
            y = torch.nn.functional.rms_norm(leaves[0], shape, leaves[1], eps=EPSILON)

        def run():
            return torch.autograd.grad(y, leaves, dy, retain_graph=True)[0]
        return run
    return None  # no backward op for this family

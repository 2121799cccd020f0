"""vLLM's CPU normalization signatures as torch custom operators
(normkernels/torch/serving.py): in place on exactly the tensors vLLM's mutate, bit for
bit normkernels' NumPy functions, and torch.library.opcheck's checks."""

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="needs torch (pip install torch==2.13.0)")
import normkernels as nk  # noqa: E402
from normkernels.torch import serving, tensors  # noqa: E402

DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}
SHAPES = {"decode": (1, 4096), "rows": (5, 96), "3d": (2, 3, 64)}
EPS = 1e-6


def _data(shape, dtype, seed=0):
    gen = torch.Generator().manual_seed(seed)
    x = (torch.randn(shape, generator=gen) * 2 + 0.5).to(dtype)
    r = torch.randn(shape, generator=gen).to(dtype)
    w = (torch.rand(shape[-1], generator=gen) + 0.5).to(dtype)
    return x, r, w


def _np(t):
    return tensors.array(t, "t").copy()


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("gemma", [False, True], ids=["llama", "gemma"])
def test_operators_are_normkernels_functions_in_place(gemma, dtype, shape):
    x, r, w = _data(SHAPES[shape], DTYPES[dtype])
    kw = {"offset": 1.0, "rounding": "once"} if gemma else {"rounding": "llama"}
    out = torch.full_like(x, 7.0)
    x0, r0 = x.clone(), r.clone()
    op = serving.vllm_gemma_rms_norm if gemma else serving.vllm_rms_norm
    op(out, x, w, EPS)
    want = nk.rms_normalization(_np(x), _np(w), epsilon=EPS, **kw)
    np.testing.assert_array_equal(_np(out).view(np.uint8), want.view(np.uint8))
    assert torch.equal(x, x0)  # input untouched
    fused = serving.vllm_gemma_fused_add_rms_norm if gemma else serving.vllm_fused_add_rms_norm
    xs, rs = _np(x), _np(r)
    nk.fused_add_rms_norm(xs, rs, _np(w), epsilon=EPS, **kw)
    fused(x, r, w, EPS)
    np.testing.assert_array_equal(_np(x).view(np.uint8), xs.view(np.uint8))
    np.testing.assert_array_equal(_np(r).view(np.uint8), rs.view(np.uint8))
    assert not torch.equal(r, r0)  # the residual stream was written
    # the residual is the rounded sum; x the Llama-rounded normalization of it
    torch.testing.assert_close(r, (x0.double() + r0.double()).to(r.dtype), rtol=0, atol=0)


def test_opcheck_and_errors():
    x, r, w = _data((3, 64), torch.float32)
    for op, args in ((serving.vllm_rms_norm, (torch.empty_like(x), x, w, EPS)),
                     (serving.vllm_fused_add_rms_norm, (x.clone(), r.clone(), w, EPS)),
                     (serving.vllm_gemma_rms_norm, (torch.empty_like(x), x, w, EPS)),
                     (serving.vllm_gemma_fused_add_rms_norm, (x.clone(), r.clone(), w, EPS))):
        torch.library.opcheck(op, args)
    with pytest.raises(ValueError, match="out must have input's shape"):
        serving.vllm_rms_norm(torch.empty(3, 65), x, w, EPS)
    with pytest.raises(ValueError, match="weight"):
        serving.vllm_rms_norm(torch.empty_like(x), x, torch.ones(65), EPS)

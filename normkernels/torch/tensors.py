"""Torch tensors as NumPy arrays over the same memory, and NumPy results as tensors.

A CPU tensor's ``numpy()`` shares its memory (shape, strides and storage offset
kept); bfloat16 has no NumPy dtype of its own, so its bytes are viewed as int16 and
read as ``ml_dtypes.bfloat16`` (the dtype normkernels computes bfloat16 with).
Nothing here copies: an output is allocated by torch and written through its view.
"""

import ml_dtypes
import numpy as np
import torch

BFLOAT16 = np.dtype(ml_dtypes.bfloat16)
FLOATS = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def check(t, name):
    """``t`` is a strided CPU tensor of a float dtype normkernels computes; else an
    exception naming ``name`` and the rule."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.device.type != "cpu":
        raise ValueError(f"{name}: normkernels computes on the CPU; got a tensor on "
                         f"{t.device} (move it with .cpu(), or use torch's module there)")
    if t.layout != torch.strided:
        raise ValueError(f"{name}: a dense (strided) tensor is required, got {t.layout}")
    if t.dtype not in FLOATS:
        raise TypeError(f"{name}: dtype must be float16, bfloat16, float32 or float64, got "
                        f"{t.dtype}")


def array(t, name):
    """A checked CPU tensor as a NumPy array over its memory (no copy)."""
    if type(t) not in _PLAIN or not t.is_cpu or t.dtype not in _VIEWED \
            or t.layout is not _STRIDED:
        check(t, name)  # raises where the fast test above fails for a reason
    if t.requires_grad:
        t = t.detach()
    if t.is_neg():  # a lazily negated view (torch's neg bit): make the values real
        t = t.resolve_neg()
    if t.dtype is _BF16:
        return t.view(torch.int16).numpy().view(BFLOAT16)
    return t.numpy()


_PLAIN = (torch.Tensor, torch.nn.Parameter)
_VIEWED = frozenset(FLOATS)
_STRIDED = torch.strided
_BF16 = torch.bfloat16


def optional(t, name):
    return None if t is None else array(t, name)


def tensor(a):
    """A NumPy result as a tensor over the same memory."""
    a = np.asarray(a)
    if a.dtype == BFLOAT16:
        return torch.from_numpy(a.view(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(a)


# Outputs of at least this many bytes are allocated by NumPy, which asks the kernel for
# transparent huge pages at 4 MB and more (madvise): a new output's pages are faulted in
# on its first write, and with 4 KB pages that was the pass's cost several times over
# (a new 100 MB output written: 45 ms from torch's allocator, 11 ms from NumPy's,
# 3.5 ms into a reused buffer; docs/design.md).
HUGE_PAGE_BYTES = 1 << 22
STORAGE = {torch.float16: np.float16, torch.bfloat16: np.int16, torch.float32: np.float32,
           torch.float64: np.float64}


def empty_like(x):
    """``torch.empty_like(x)`` (same shape, dtype and memory format: contiguous or
    channels_last), its memory from NumPy at HUGE_PAGE_BYTES and more."""
    if x.numel() * x.element_size() < HUGE_PAGE_BYTES:
        return torch.empty_like(x)
    if x.is_contiguous():
        order = None
    elif x.dim() == 4 and x.is_contiguous(memory_format=torch.channels_last):
        order = (0, 2, 3, 1)
    elif x.dim() == 5 and x.is_contiguous(memory_format=torch.channels_last_3d):
        order = (0, 2, 3, 4, 1)
    else:  # another layout: torch's rules for it
        return torch.empty_like(x)
    shape = x.shape if order is None else [x.shape[d] for d in order]
    memory = torch.from_numpy(np.empty(shape, STORAGE[x.dtype])).untyped_storage()
    # set_: a tensor of its own over that memory, not a view (autograd forbids in-place
    # ops on a view made inside a custom Function: nn.ReLU(inplace=True) after a norm)
    return torch.empty(0, dtype=x.dtype).set_(memory, 0, x.shape, x.stride())


def numpy_dtype(dtype):
    """The NumPy dtype of a torch float dtype."""
    if dtype == torch.bfloat16:
        return BFLOAT16
    return torch.empty((), dtype=dtype).numpy().dtype

"""normkernels for PyTorch (needs torch, the ``[torch]`` extra; imported only here).

* ``normkernels.torch.replace_modules(model)``: swap every torch.nn BatchNorm,
  InstanceNorm, GroupNorm, LayerNorm and RMSNorm of a model for normkernels' (same
  parameters, buffers and ``state_dict``; :func:`restore_modules` undoes it);
  ``register_swap(cls, like=torch.nn.LayerNorm)`` adds a class with torch.nn's
  semantics (an exact class: a subclass of it is not swapped). The normalization
  classes of timm, transformers and diffusers models are swapped too, recognized by
  their code (``normkernels.torch.zoo``: Llama's RMSNorm and its copies, Gemma's,
  T5's, timm's LayerNorm2d and norm + activation modules, ...).
* The modules themselves (``BatchNorm2d``, ``LayerNorm``, ...) and the functions of
  ``torch.nn.functional`` with the same signatures (``layer_norm``, ``batch_norm``, ...).
* The custom operators under ``torch.ops.normkernels`` (``layer_norm``, ``rms_norm``,
  ``group_norm``, ``instance_norm``, ``batch_norm_training``, ``batch_norm_inference``
  and their backward operators): autograd, ``torch.compile`` and ``torch.export``
  work through them.

CPU tensors of float16, bfloat16, float32 and float64 are computed in place (NumPy
views of their memory, channels_last included); outputs have the input's memory
format, and from 4 MB on their memory comes from NumPy's allocator (transparent huge
pages: a new output is faulted in about 4x faster), so such a tensor's storage cannot
be resized.
"""

from normkernels.torch import zoo  # noqa: F401 (replace_modules then finds the zoos' classes)
from normkernels.torch.functional import (
    batch_norm,
    group_norm,
    instance_norm,
    layer_norm,
    rms_norm,
)
from normkernels.torch.modules import (
    BatchNorm1d,
    BatchNorm2d,
    BatchNorm3d,
    GroupNorm,
    InstanceNorm1d,
    InstanceNorm2d,
    InstanceNorm3d,
    LayerNorm,
    RMSNorm,
    register_swap,
    replace_modules,
    restore_modules,
    unregister_swap,
)

__all__ = ["BatchNorm1d", "BatchNorm2d", "BatchNorm3d", "GroupNorm", "InstanceNorm1d",
           "InstanceNorm2d", "InstanceNorm3d", "LayerNorm", "RMSNorm", "batch_norm",
           "group_norm", "instance_norm", "layer_norm", "register_swap", "replace_modules",
           "restore_modules", "rms_norm", "unregister_swap"]

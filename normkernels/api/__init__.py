"""The public operators: NumPy arrays in, NumPy arrays out, Numba kernels inside.

One module per family, each function a one-line call of its spec function
(``normkernels/ops/``) with the Numba engine, its docstring the contract:

* :mod:`normkernels.api.batch`: BatchNormalization; ``moments``, ``partial_moments``
  and ``merge_moments`` (per-channel statistics); ``fold_batch_norm`` (inference BN
  folded into the preceding Conv/Gemm weights)
* :mod:`normkernels.api.instance`: InstanceNormalization
* :mod:`normkernels.api.rows`: LayerNormalization, RMSNormalization and onnxruntime's
  SimplifiedLayerNormalization, SkipLayerNormalization, SkipSimplifiedLayerNormalization
* :mod:`normkernels.api.groups`: GroupNormalization, MeanVarianceNormalization,
  LpNormalization, LRN
* :mod:`normkernels.api.modulated`: the modulated norms of diffusion models
  (``ada_layer_norm``, ``ada_group_norm``) and their gradients
* :mod:`normkernels.api.backward`: the gradients of the ONNX-style operators
* :mod:`normkernels.api.onednn`: oneDNN Graph's operations (inference and training)
* :mod:`normkernels.api.llm`: LLM serving's fused residual add (in place);
  :mod:`normkernels.api.gated`: the gated RMSNorm and QK-norm;
  :mod:`normkernels.api.quantized`: normalizations with int8 and float8 outputs

Every public function a family module defines is re-exported here
(``normkernels.api.<name>``, found by the loop below: a new function needs no line
here) and loaded lazily as ``normkernels.<name>`` (named in ``normkernels.__all__``).
"""

import inspect

from normkernels.api import (
    backward,
    batch,
    gated,
    groups,
    instance,
    llm,
    modulated,
    onednn,
    quantized,
    rows,
)

__all__ = []
for _family in (backward, batch, gated, groups, instance, llm, modulated, onednn, quantized,
                rows):
    for _name, _value in vars(_family).items():
        # the functions a family module defines (not those it imports)
        if (inspect.isfunction(_value) and not _name.startswith("_")
                and _value.__module__ == _family.__name__):
            globals()[_name] = _value
            __all__.append(_name)
__all__.sort()

"""The public operators: NumPy arrays in, NumPy arrays out, Numba kernels inside.

One module per family, each function a one-line call of its spec function
(``normkernels/ops/``) with the Numba engine, its docstring the contract:

* :mod:`normkernels.api.batch`: BatchNormalization; ``moments``, ``partial_moments``
  and ``merge_moments`` (per-channel statistics)
* :mod:`normkernels.api.instance`: InstanceNormalization
* :mod:`normkernels.api.rows`: LayerNormalization, RMSNormalization and onnxruntime's
  SimplifiedLayerNormalization, SkipLayerNormalization, SkipSimplifiedLayerNormalization
* :mod:`normkernels.api.groups`: GroupNormalization, MeanVarianceNormalization,
  LpNormalization, LRN
* :mod:`normkernels.api.backward`: the gradients of the ONNX-style operators
* :mod:`normkernels.api.onednn`: oneDNN Graph's operations (inference and training)

Every public function is re-exported here (``normkernels.api.<name>``) and loaded
lazily as ``normkernels.<name>``.
"""

from normkernels.api.backward import (
    batch_normalization_backward,
    group_normalization_backward,
    instance_normalization_backward,
    layer_normalization_backward,
    rms_normalization_backward,
)
from normkernels.api.batch import batch_normalization, merge_moments, moments, partial_moments
from normkernels.api.groups import (
    group_normalization,
    lp_normalization,
    lrn,
    mean_variance_normalization,
)
from normkernels.api.instance import instance_normalization
from normkernels.api.onednn import (
    batch_norm_forward_training,
    batch_norm_inference,
    batch_norm_training_backward,
    group_norm,
    layer_norm,
    layer_norm_backward,
    rms_norm,
)
from normkernels.api.rows import (
    layer_normalization,
    rms_normalization,
    simplified_layer_normalization,
    skip_layer_normalization,
    skip_simplified_layer_normalization,
)

__all__ = ["batch_norm_forward_training", "batch_norm_inference",
           "batch_norm_training_backward", "batch_normalization",
           "batch_normalization_backward", "group_norm", "group_normalization",
           "group_normalization_backward", "instance_normalization",
           "instance_normalization_backward", "layer_norm", "layer_norm_backward",
           "layer_normalization", "layer_normalization_backward", "lp_normalization",
           "lrn", "mean_variance_normalization", "merge_moments", "moments",
           "partial_moments", "rms_norm", "rms_normalization",
           "rms_normalization_backward", "simplified_layer_normalization",
           "skip_layer_normalization", "skip_simplified_layer_normalization"]

"""normkernels: Numba CPU kernels for ONNX and oneDNN normalization operators.

Importing the package is cheap: Numba and the operators load on first use, and each
kernel compiles on its first call per (dtype, layout), then comes from the disk cache.
"""

__version__ = "0.1.0"
__all__ = ["ada_group_norm", "ada_group_norm_backward", "ada_layer_norm",
           "ada_layer_norm_backward", "batch_norm_forward_training",
           "batch_norm_inference",
           "batch_norm_training_backward", "batch_normalization",
           "batch_normalization_backward", "bind", "fold_batch_norm", "fused_add_layer_norm",
           "fused_add_rms_norm",
           "gated_rms_normalization", "gated_rms_normalization_backward", "group_norm",
           "group_normalization", "group_normalization_backward", "instance_normalization",
           "instance_normalization_backward", "layer_norm", "layer_norm_backward",
           "layer_normalization", "layer_normalization_backward", "lp_normalization",
           "lrn", "mean_variance_normalization", "merge_moments", "moments",
           "ort_group_norm", "ort_skip_group_norm",
           "partial_moments", "qk_rms_normalization", "quantized_layer_normalization",
           "quantized_rms_normalization", "rms_norm", "rms_normalization",
           "rms_normalization_backward", "simplified_layer_normalization",
           "skip_layer_normalization", "skip_simplified_layer_normalization", "warmup"]


def __getattr__(name):
    if name in ("onnx", "dask"):  # integrations (need the onnx / dask packages)
        import importlib

        return importlib.import_module(f"normkernels.{name}")
    if name in __all__:
        from normkernels import api, binding

        if name == "warmup":
            from normkernels.warm import warmup as value
        else:
            value = binding.bind if name == "bind" else getattr(api, name)
        globals()[name] = value  # later lookups skip this function
        return value
    raise AttributeError(f"module 'normkernels' has no attribute {name!r}")


def __dir__():
    return sorted([*globals(), *__all__])

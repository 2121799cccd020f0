"""Normalizations with quantized outputs (int8, float8_e4m3fn): vLLM's fused
``rms_norm_*_quant`` kernels."""

from normkernels.engine.numba_engine import ENGINE  # noqa: F401

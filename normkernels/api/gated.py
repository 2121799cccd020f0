"""The gated RMSNorm (Mamba-2, Qwen3-Next) and per-head QK-norm on a packed qkv."""

from normkernels.engine.numba_engine import ENGINE  # noqa: F401

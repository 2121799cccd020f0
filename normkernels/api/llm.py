"""The normalizations of LLM serving: vLLM's fused residual add (in place), Gemma's
zero-centred weight and Llama's rounding (keywords of :func:`rms_normalization`),
the gated RMSNorm of Mamba-2 and Qwen3-Next, per-head QK-norm on a packed qkv, and
normalizations with int8 or float8 outputs (``../shared/specs/llm-normalizations.md``
has the serving stacks' definitions)."""

from normkernels.engine.numba_engine import ENGINE  # noqa: F401

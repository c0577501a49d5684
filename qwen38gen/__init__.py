"""qwen38gen: emit, gate and check the batched CUDA decode program of Qwen3.8-27B."""

__version__ = "0.1.0"

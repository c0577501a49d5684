"""Weights: seeded synthetic tensors, HF-layout safetensors in and out, int4 g128 packing.

Tensors are plain numpy arrays keyed by their checkpoint names (``model.language_model.…``,
``lm_head.weight``, ``mtp.…``). bf16 tensors use ``ml_dtypes.bfloat16``.
"""

from __future__ import annotations

import zlib

import ml_dtypes
import numpy as np

from .config import ModelConfig

BF16 = np.dtype(ml_dtypes.bfloat16)

# Tensors the released Qwen3.5 checkpoints keep in fp32 (MODEL.md §2).
FP32_SUFFIXES = ("linear_attn.A_log", "linear_attn.norm.weight")


def _rng(seed: int, name: str) -> np.random.Generator:
    """One stream per tensor, so a tensor does not depend on the order others are drawn in."""
    return np.random.default_rng([seed, zlib.crc32(name.encode())])


def synthetic_tensor(name: str, shape: tuple[int, ...], seed: int) -> np.ndarray:
    """One seeded synthetic tensor with non-trivial statistics (MODEL.md §1.2).

    Linear weights ~ N(0, 1/in) so activations stay O(1); zero-centred norm weights (used as
    1 + w) ~ U(−0.5, 0.5); the GDN gated-norm weight (plain w) ~ U(0.5, 1.5); A_log ~ U(−1, 1);
    dt_bias ~ N(0, 0.5²); conv taps ~ N(0, 0.5²); the embedding ~ N(0, 1).
    """
    rng = _rng(seed, name)
    if name.endswith("embed_tokens.weight"):
        a = rng.standard_normal(shape)
    elif name.endswith("linear_attn.A_log"):
        a = rng.uniform(-1.0, 1.0, shape)
    elif name.endswith("linear_attn.dt_bias"):
        a = 0.5 * rng.standard_normal(shape)
    elif name.endswith("linear_attn.norm.weight"):
        a = rng.uniform(0.5, 1.5, shape)
    elif name.endswith("conv1d.weight"):
        a = 0.5 * rng.standard_normal(shape)
    elif len(shape) == 1:
        a = rng.uniform(-0.5, 0.5, shape)
    else:
        a = rng.standard_normal(shape) / np.sqrt(shape[-1])
    dtype = np.float32 if name.endswith(FP32_SUFFIXES) else BF16
    return a.astype(np.float32).astype(dtype)


def synthetic_weights(cfg: ModelConfig, seed: int = 0, mtp: bool = True) -> dict[str, np.ndarray]:
    """Every text tensor of ``cfg`` (plus MTP), seeded, under the checkpoint names."""
    return {n: synthetic_tensor(n, s, seed) for n, s in cfg.tensor_shapes(mtp=mtp).items()}

"""The preset geometries as data: the published dense Qwen3.5/3.6 sizes and the test models.
config.py builds a ModelConfig of each (``config.PRESETS``); `qwen38gen info --list` prints them.
"""

from __future__ import annotations

LINEAR = "linear_attention"
FULL = "full_attention"


def hybrid(n: int, interval: int = 4) -> tuple[str, ...]:
    """Layer types of n layers with a full-attention layer every `interval`-th."""
    return tuple(FULL if (i + 1) % interval == 0 else LINEAR for i in range(n))


PRESET_FIELDS: dict[str, dict] = {
    "qwen3.8-27b": dict(
        hidden_size=5120, num_hidden_layers=64, intermediate_size=17408,
        vocab_size=248320, num_attention_heads=24, num_key_value_heads=4, head_dim=256,
        linear_num_key_heads=16, linear_num_value_heads=48, linear_key_head_dim=128,
        linear_value_head_dim=128, linear_conv_kernel_dim=4, layer_types=hybrid(64),
        bos_token_id=248044, eos_token_id=248044,
    ),
    # The published dense Qwen3.5 sizes below 27B. Their text_config numbers, as released in
    # Qwen/Qwen3.5-{0.8B,2B,4B,9B}/config.json (read through public copies found with the search
    # tool: the 0.8B and 2B dicts in a Qwen3.5 MLX port's tests (cortexlab, tests of
    # models/architectures/qwen3_5), the 0.8B's full text_config in a Rust port's test (bos null,
    # eos 248044, mtp_num_hidden_layers 1, tie_word_embeddings true), the 4B's in a
    # qwen_drive checkpoint's vlm_config (hidden 2560, intermediate 9216, tied) and an MLX adapter
    # test (32 layers, 16/4 heads, 16/32 GDN heads), the 9B's full text_config in medrl's
    # architecture test (tie_word_embeddings false), and a size table over all four read off the
    # published config.json files (open_kernels recipes tests)). Every size shares the 27B's
    # per-head geometry: head_dim 256, rotary 64 (factor 0.25, mrope [11, 11, 10]), GDN heads of
    # 128 x 128, 16 GDN key heads, conv 4, a full-attention layer every fourth, vocab 248320,
    # rope_theta 1e7, eps 1e-6, one MTP layer. They differ in widths, in the GDN value heads per
    # key head (r = 1 for 0.8B/2B, 2 for 4B/9B, 3 for 27B) and in tied embeddings (0.8B-4B).
    "qwen3.5-0.8b": dict(
        hidden_size=1024, num_hidden_layers=24, intermediate_size=3584,
        vocab_size=248320, num_attention_heads=8, num_key_value_heads=2, head_dim=256,
        linear_num_key_heads=16, linear_num_value_heads=16, linear_key_head_dim=128,
        linear_value_head_dim=128, linear_conv_kernel_dim=4, layer_types=hybrid(24),
        tie_word_embeddings=True, eos_token_id=248044,
    ),
    "qwen3.5-2b": dict(
        hidden_size=2048, num_hidden_layers=24, intermediate_size=6144,
        vocab_size=248320, num_attention_heads=8, num_key_value_heads=2, head_dim=256,
        linear_num_key_heads=16, linear_num_value_heads=16, linear_key_head_dim=128,
        linear_value_head_dim=128, linear_conv_kernel_dim=4, layer_types=hybrid(24),
        tie_word_embeddings=True, eos_token_id=248044,
    ),
    "qwen3.5-4b": dict(
        hidden_size=2560, num_hidden_layers=32, intermediate_size=9216,
        vocab_size=248320, num_attention_heads=16, num_key_value_heads=4, head_dim=256,
        linear_num_key_heads=16, linear_num_value_heads=32, linear_key_head_dim=128,
        linear_value_head_dim=128, linear_conv_kernel_dim=4, layer_types=hybrid(32),
        tie_word_embeddings=True, eos_token_id=248044,
    ),
    "qwen3.5-9b": dict(
        hidden_size=4096, num_hidden_layers=32, intermediate_size=12288,
        vocab_size=248320, num_attention_heads=16, num_key_value_heads=4, head_dim=256,
        linear_num_key_heads=16, linear_num_value_heads=32, linear_key_head_dim=128,
        linear_value_head_dim=128, linear_conv_kernel_dim=4, layer_types=hybrid(32),
        eos_token_id=248044,
    ),
    "tiny": dict(
        hidden_size=512, num_hidden_layers=8, intermediate_size=1024,
        vocab_size=1024, num_attention_heads=6, num_key_value_heads=2, head_dim=256,
        linear_num_key_heads=2, linear_num_value_heads=6, linear_key_head_dim=128,
        linear_value_head_dim=128, linear_conv_kernel_dim=4, layer_types=hybrid(8),
    ),
    "toy": dict(
        hidden_size=64, num_hidden_layers=8, intermediate_size=96, vocab_size=256,
        num_attention_heads=4, num_key_value_heads=2, head_dim=32, linear_num_key_heads=2,
        linear_num_value_heads=6, linear_key_head_dim=16, linear_value_head_dim=24,
        linear_conv_kernel_dim=4, layer_types=hybrid(8), mrope_section=(2, 1, 1),
    ),
}

# The published dense sizes, smallest first (`qwen38gen info --list`); qwen3.8-27b is the 27B
# (Qwen/Qwen3.5-27B's text_config, docs/MODEL.md §1.1).
PUBLISHED = {"0.8B": "qwen3.5-0.8b", "2B": "qwen3.5-2b", "4B": "qwen3.5-4b", "9B": "qwen3.5-9b",
             "27B": "qwen3.8-27b"}

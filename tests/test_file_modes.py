"""Written files respect the umask: the emitted .cu and its manifest get 0o666 less the umask, a
quantized model folder 0o777 less it, as open() and mkdir() would give them (mkstemp and mkdtemp
alone give 0600 and 0700)."""

import os
import stat

import pytest

from qwen38gen.config import FULL, LINEAR, PRESETS, ModelConfig

# Every K a multiple of 128 (int4 g128), else as small as it gets: a checkpoint of 2 layers.
SMALL = ModelConfig(
    name="small", hidden_size=128, num_hidden_layers=2, intermediate_size=128, vocab_size=256,
    num_attention_heads=2, num_key_value_heads=1, head_dim=64, linear_num_key_heads=1,
    linear_num_value_heads=1, linear_key_head_dim=128, linear_value_head_dim=128,
    linear_conv_kernel_dim=4, layer_types=(LINEAR, FULL), mrope_section=(4, 2, 2))


@pytest.fixture(params=[0o022, 0o077])
def mask(request):
    old = os.umask(request.param)
    try:
        yield request.param
    finally:
        os.umask(old)


def mode(p) -> int:
    return stat.S_IMODE(os.stat(p).st_mode)


def test_emitted_files(tmp_path, mask):
    from qwen38gen.emit import emit_program, write_program
    from qwen38gen.lanes import Lanes
    from qwen38gen.outputs import write_text

    cu, man = write_program(emit_program(PRESETS["tiny"], Lanes.make(3)), tmp_path / "x.cu")
    assert mode(cu) == mode(man) == 0o666 & ~mask
    write_text(tmp_path / "run.json", "{}\n")   # run --json, bench --json, golden --update
    assert mode(tmp_path / "run.json") == 0o666 & ~mask


def test_quantized_folder(tmp_path, mask):
    from qwen38gen.quantize import quantize_checkpoint
    from qwen38gen.checkpoint import save_checkpoint
    from qwen38gen.weights import synthetic_weights

    cfg = SMALL
    save_checkpoint(cfg, synthetic_weights(cfg, 1), tmp_path / "hf")
    out = quantize_checkpoint(tmp_path / "hf", tmp_path / "q4")
    assert mode(out) == 0o777 & ~mask
    assert {mode(f) for f in out.iterdir()} == {0o666 & ~mask}

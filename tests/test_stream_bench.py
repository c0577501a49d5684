"""scripts/stream_bench.py, the measurement behind version 15's B = 1 analysis: its matrices are
the step's weights (the floor model's W), and its kernels compile (nvcc, no GPU needed)."""

import shutil
import sys
from pathlib import Path

import pytest

from qwen38gen.config import PRESETS

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
import stream_bench  # noqa: E402


def test_matrices_are_the_floor_models_weights():
    m = stream_bench.matrices()
    cfg = PRESETS["qwen3.8-27b"]
    assert len(m) == 4 * cfg.num_hidden_layers + 1
    assert sum(m) == pytest.approx(cfg.int4_weight_bytes(), rel=1e-3)
    assert m[-1] == max(m)   # the lm_head last


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not on PATH")
def test_kernels_compile(tmp_path):
    out = tmp_path / "stream.cubin"
    res = stream_bench.build(str(out))
    assert out.stat().st_size > 0
    names = {k.name for k in res.kernels}
    assert {"sb_launch5", "sb_persist5_pf", "sb_ws5_c128_r8", "sb_wsp5_c128_r8", "sb_wsp5_c0_r16",
            "sb_wsp5_c64_r24"} <= names
    assert not any(k.spill_stores or k.spill_loads for k in res.kernels)

"""scripts/attn_sweep.py, attn_tc's schedule sweep: its first variant (the bitwise and tolerance
reference of the run) is the program's schedule, every variant is named once and emitted, and its
launch figures are the ones the plan sizes the program's launch with."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))

import attn_sweep  # noqa: E402

from qwen38gen.plan import attention as PA  # noqa: E402
from qwen38gen.tuning import Tuning  # noqa: E402
from qwen38gen.config import PRESETS  # noqa: E402


def test_the_reference_is_the_programs_schedule():
    assert attn_sweep.VARIANTS[0] == (PA.ATTN_TC_NW, Tuning().attn_st, PA.ATTN_SPLIT,
                                       Tuning().attn_mb)
    assert attn_sweep.dyn_smem(attn_sweep.VARIANTS[0]) == PA.attn_tc_smem(PRESETS["qwen3.8-27b"], PA.ATTN_TC_NW,
                                                                           Tuning().attn_st)
    assert attn_sweep.part_floats() == PA.attn_part_floats(PRESETS["qwen3.8-27b"])


def test_every_variant_is_emitted_once():
    names = [attn_sweep.name(v) for v in attn_sweep.VARIANTS]
    assert len(names) == len(set(names))
    src = attn_sweep.source()
    for v, n in zip(attn_sweep.VARIANTS, names):
        assert f" {n}(" in src and f"q38::attn_tc<{attn_sweep.targs(v)}>(" in src
    assert "q38::attn<" not in src

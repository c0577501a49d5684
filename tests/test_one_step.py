"""scripts/one_step.py's scenario (what compute-sanitizer runs on the device: a prefill chunk, a
decode step and a continuous-batching refill at B = 3) on the emitted schedule's numpy emulation
(qwen38gen/emu/schedule.py): its assertions hold (positions; a refill prefill with the other slots
idle leaves their state alone), and the refilled slot then computes what a fresh slot computes
with the same tokens."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

from qwen38gen.config import PRESETS
from qwen38gen.emit import emit_program
from qwen38gen.emu.schedule import Emu
from qwen38gen.lanes import Lanes
from qwen38gen.weights import default_tensors

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
import one_step  # noqa: E402
from qwen38gen.inputs import put_chunk  # noqa: E402


class EmuSlots(Emu):
    """The emulation with Runtime.reset_slot's effect: a slot's recurrent state, conv ring and
    position zeroed, its KV cache left as it is."""

    def reset_slot(self, b: int):
        for name in ("rec", "conv"):
            a = self.get(name)
            a[:, b] = 0
            self.put(name, a)
        p = self.get("pos")
        p[b] = 0
        self.put("pos", p)


@pytest.fixture(scope="module")
def emu_setup():
    cfg = PRESETS["tiny"]
    man = emit_program(cfg, Lanes.make(3, pt=one_step.PT)).manifest
    return cfg, man, default_tensors(cfg)


@pytest.mark.slow
def test_refill_scenario_holds_and_equals_a_fresh_slot(emu_setup):
    cfg, man, t = emu_setup
    emu = EmuSlots(man, cfg, t, tmax=64)
    calls = []
    lines = one_step.scenario(emu, cfg, 3, True, lambda ph: (calls.append(ph), emu.run(ph)))
    # packed chunks (B = 3, pt 16: schedules for 8, 16, 32 and 48 rows): 22 rows, then 9
    assert calls == ["prefill_r32", "decode", "topk", "prefill_r16", "decode"]
    assert lines[1].startswith("refill: slot 1 reset and prefilled alone (9 tokens)")
    refilled = emu.get("logits")[1].copy()
    toks = emu.get("tokens")

    # the same refill tokens and the same next token into slot 1 of a fresh program
    fresh = EmuSlots(man, cfg, t, tmax=64)
    rng = np.random.default_rng(0)
    for n in (16, 5, 1):                                        # the first chunk's draws
        rng.integers(0, cfg.vocab_size, n)
    chunk = [list(map(int, rng.integers(0, cfg.vocab_size, n)))
             for n in (0, one_step.REFILL_TOKENS, 0)]
    fresh.run(put_chunk(fresh.put, man["schedule"], chunk))
    fresh.put("ntok", np.array([0, 1, 0], np.int32))
    fresh.put("tokens", np.array([0, toks[1], 0], np.int32))
    fresh.run("decode")
    assert list(fresh.get("pos")) == [0, one_step.REFILL_TOKENS + 1, 0]
    np.testing.assert_allclose(refilled, fresh.get("logits")[1], rtol=0, atol=1e-9)


def test_usage(capsys):
    with pytest.raises(SystemExit, match=r"usage: python3 scripts/one_step.py \[B \[refill\]\]"):
        one_step.main(["3", "twice"])

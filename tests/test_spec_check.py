"""`check --mtp` (qwen38gen.verify.check.check_spec) wired end to end on the CPU: the GPU Runtime is
replaced by the numpy schedule emulator (same executor interface), on the first golden prompts and
steps. The emulator is fp64 and the golden streams come from the bf16 GPU program, so this uses
prompts whose golden streams the reference reproduces exactly (checked first)."""

import dataclasses

import numpy as np

from qwen38gen.config import PRESETS
from qwen38gen.emit import emit_program
from qwen38gen.lanes import Lanes
from qwen38gen.verify import check as C
from qwen38gen.verify import golden as G
from qwen38gen.weights import default_tensors
from tests._blas_threads import single_threaded  # noqa: F401  (autouse: 1 BLAS thread)
from qwen38gen.emu.schedule import Emu


class EmuRuntime(Emu):
    def __init__(self, cubin, man, cfg, tensors, tmax):
        super().__init__(man, cfg, tensors, tmax)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def test_check_spec_on_emulator(monkeypatch):
    import qwen38gen.runtime as RT

    cfg = PRESETS[G.MODEL]
    g = G.load_golden()
    steps = 6
    from qwen38gen.quantize import int4_weights
    from qwen38gen.reference import Reference

    ref = Reference(cfg, int4_weights(cfg, default_tensors(cfg)), dtype=np.float64)
    cand = g.sequences[:6]
    gen = ref.generate([s["prompt"] for s in cand], steps)
    seqs = [dict(s, tokens=s["tokens"][:steps], topk=s["topk"][:steps])
            for s, r in zip(cand, gen) if r == s["tokens"][:steps]][:3]
    assert len(seqs) == 3
    g = dataclasses.replace(g, sequences=seqs, steps=steps)
    monkeypatch.setattr(RT, "Runtime", EmuRuntime)
    monkeypatch.setattr(C, "build", lambda cfg, lanes: (None, emit_program(cfg, lanes).manifest))
    res = C.check_spec(Lanes.make(2, pt=16, mtp=1), g, cfg)
    assert res.ok, res.rows
    assert len(res.rows) == 2 * 3 and {r[0] for r in res.rows} == {"own drafts", "forced right"}
    forced = [r for r in res.rows if r[0] == "forced right"]
    assert all(r[5].endswith("= 1.00") or r[6] == "1" for r in forced), forced


def test_bench_mtp_implied_tokens():
    from qwen38gen.perf.bench_mtp import tokens_per_step

    assert tokens_per_step(0.0, 3) == 1.0 and tokens_per_step(1.0, 2) == 3.0
    assert abs(tokens_per_step(0.5, 1) - 1.5) < 1e-12

"""The tolerance rule in golden.py is derived from the committed measurements, and the program
met it at every preset measured (docs/PRECISION.md).

* golden.YARDSTICK["reference"] is HF bf16's error of the device run (scripts/precision.py run,
  bench/precision/*-h100-precision.json): per depth the worst over presets, sequences and kinds, as
  a running maximum; logits by layer count likewise.
* golden.YARDSTICK["golden"] is the CPU run on the golden file (scripts/precision.py golden).
* The program's own errors in the device run are within golden.RULE × those, layer by layer.
"""

from __future__ import annotations

import json
from itertools import accumulate
from pathlib import Path

import pytest

from qwen38gen.verify import golden as G

HERE = Path(__file__).resolve().parents[1] / "bench" / "precision"
DEVICE = HERE / "2026-12-06-h100-precision.json"
GOLDEN = HERE / "2026-12-06-cpu-golden-yardstick.json"


def _by_depth(seqs, who=None):
    """{layer: worst error over sequences and kinds} of the sequences' state errors."""
    out = {}
    for s in seqs:
        st = s["state"] if who is None else s["state"][who]
        for L, kinds in st.items():
            out[int(L)] = max([out.get(int(L), 0.0), *kinds.values()])
    return out


def _envelope(by_depth: dict) -> tuple:
    return tuple(round(e, 4) for e in accumulate((by_depth[L] for L in sorted(by_depth)), max))


def test_reference_yardstick_is_the_device_measurement():
    docs = json.loads(DEVICE.read_text())
    merged = {}
    for d in docs:
        for L, e in _by_depth(d["runs"][0]["sequences"], "hf_bf16").items():
            merged[L] = max(merged.get(L, 0.0), e)
    assert G.YARDSTICK["reference"]["state"] == _envelope(merged)
    logits = {}
    for d in docs:
        e = max(x for s in d["runs"][0]["sequences"] for x in s["logits"]["hf_bf16"])
        logits[d["layers"]] = max(logits.get(d["layers"], 0.0), e)
    env = dict(zip(sorted(logits), accumulate((logits[n] for n in sorted(logits)), max)))
    assert G.YARDSTICK["reference"]["logits"] == tuple((n, round(e, 3)) for n, e in env.items())


def test_golden_yardstick_is_the_cpu_measurement():
    doc = json.loads(GOLDEN.read_text())
    assert G.YARDSTICK["golden"]["state"] == _envelope(_by_depth(doc["sequences"]))
    assert G.YARDSTICK["golden"]["logits"] == round(max(max(s["logits"])
                                                        for s in doc["sequences"]), 4)


@pytest.mark.parametrize("doc", json.loads(DEVICE.read_text()), ids=lambda d: d["model"])
def test_the_program_met_the_rule_at_every_preset(doc):
    for run in doc["runs"]:
        assert run["same_across_slots"]
        for s in run["sequences"]:
            assert s["nonfinite"] is None
            assert max(s["logits"]["program"]) <= G.tol_logits("reference", doc["layers"])
            for L, kinds in s["state"]["program"].items():
                for k, e in kinds.items():
                    assert e <= G.tol_state("reference", int(L)), (doc["model"], L, k, e)


def test_tolerances_grow_with_depth_and_extrapolate():
    ys = [G.tol_state("reference", L) for L in range(64)]
    assert ys == sorted(ys) and ys[63] == pytest.approx(2 * ys[31])
    assert G.tol_logits("reference", 64) == G.tol_logits("reference", 32)
    assert G.argmax_margin("golden", 8) == 2 * G.tol_logits("golden", 8)

"""qwen38gen/verify/precision.py's harness on the CPU: the program's runs are faked by the numpy
reference (fp32), HF transformers runs on the CPU. The reference equals HF fp32 to ~1e-5, so the
"program" errors must be that small at every step and layer, while HF bf16's are those of bf16
(far larger): this checks the wiring (HF's cache layout, the conv ring, per-layer keys, the
teacher forcing) that the device run relies on."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from qwen38gen.verify import golden as G  # noqa: E402
from qwen38gen.verify import precision as P  # noqa: E402
from qwen38gen.config import PRESETS  # noqa: E402
from qwen38gen.quantize import dequantized_weights  # noqa: E402
from qwen38gen.reference import Reference  # noqa: E402

from tests._blas_threads import single_threaded  # noqa: F401,E402
from tests.test_check_reference import conv_to_ring_state  # noqa: E402

pytestmark = pytest.mark.slow


def fake_run_batches(cfg, lanes, tensors, prompts, steps, tmax, keep_state=False, **_):
    """What run_batches returns, computed by the fp32 numpy reference (top-8 logits)."""
    ref = Reference(cfg, dequantized_weights(tensors))
    B = lanes.batch
    got, states = [], []
    for i in range(0, len(prompts), B):
        chunk = prompts[i:i + B]
        toks = ref.generate(chunk, steps)
        sts = []
        for p, t in zip(chunk, toks):
            lg, st = G.reference_logits(ref, p, t)
            top = [[[int(j), float(row[j])] for j in np.argsort(-row, kind="stable")[:8]]
                   for row in lg]
            got.append({"tokens": list(t), "topk": top, "nonfinite": None})
            sts.append(st)
        states.append(conv_to_ring_state(cfg, sts, tmax))
    return got, states


def test_measure_wiring_on_the_cpu(monkeypatch):
    monkeypatch.setattr(P, "run_batches", fake_run_batches)
    cfg = PRESETS["tiny"]
    doc = P.measure(cfg, batches=(3, 5), steps=4, device="cpu")
    assert [r["batch"] for r in doc["runs"]] == [3, 5] and doc["prompts"] == [1, 7, 16, 33]
    rows = P.summary_rows(doc)
    for r in rows:
        assert r["same_across_slots"]
        assert r["logit_program"] < 1e-3 and r["state_program"] < 1e-4, r
        assert 1e-3 < r["state_hf_bf16"] < 0.5 and r["logit_hf_bf16"] > 1e-3, r
        kinds = {k.split(":")[1] for k in r["per_layer"]}
        assert kinds == {"rec", "conv", "k", "v"}
        assert len(r["per_layer"]) == 2 * len(cfg.linear_layers) + 2 * len(cfg.full_layers)


def test_table_of_a_measurement(monkeypatch, tmp_path):
    import json
    import subprocess
    import sys

    monkeypatch.setattr(P, "run_batches", fake_run_batches)
    doc = P.measure(PRESETS["tiny"], batches=(3,), steps=3, device="cpu")
    path = tmp_path / "p.json"
    path.write_text(json.dumps([doc]))
    r = subprocess.run([sys.executable, "scripts/precision.py", "table", str(path)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("| model | layers | B |") and "| tiny | 8 | 3 |" in r.stdout

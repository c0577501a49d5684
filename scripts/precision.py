"""The precision measurement (qwen38gen/verify/precision.py) on the device, and its tables.

  python3 scripts/precision.py run --models tiny,qwen3.5-0.8b --batches 3,16 --json OUT.json
      [--budget SECONDS] [--jobs N]
  (GPU, PyCUDA, torch, transformers with Qwen3_5ForCausalLM; programs precompiled by
  `make device-prep`; a model is skipped, and said so, once the budget would be passed)

  python3 scripts/precision.py table OUT.json     (anywhere: the markdown of docs/PRECISION.md)

  python3 scripts/precision.py golden OUT.json    (CPU: HF bf16 against fp32 alone on the golden
  runs' prompts and tokens, the yardstick of the golden lock's tolerances)
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from qwen38gen.verify import precision as P  # noqa: E402
from qwen38gen.config import PRESETS  # noqa: E402

# seconds a model took on an H100 (or a guess before the first run), to skip what cannot finish
EXPECTED_S = {"tiny": 15, "qwen3.5-0.8b": 40, "qwen3.5-2b": 70, "qwen3.5-4b": 120,
              "qwen3.5-9b": 240}


def run(argv: list[str]) -> int:
    opts = dict(zip(argv[::2], argv[1::2]))
    models = opts.get("--models", "tiny,qwen3.5-0.8b,qwen3.5-2b,qwen3.5-4b").split(",")
    batches = tuple(int(b) for b in opts.get("--batches", "3,16").split(","))
    budget = float(opts.get("--budget", 420))
    jobs = int(opts.get("--jobs", os.cpu_count() or 1))
    out = Path(opts["--json"])
    t0, docs = time.time(), []
    for name in models:
        left = budget - (time.time() - t0)
        if left < EXPECTED_S.get(name, 60):
            print(f"{name}: SKIPPED ({left:.0f} s left of the budget, about "
                  f"{EXPECTED_S.get(name, 60)} s needed)", flush=True)
            continue
        t = time.time()
        cfg = PRESETS[name]
        tensors, deq = P.quantized_synthetic_parallel(cfg, jobs)
        tw = time.time() - t
        doc = P.measure(cfg, batches, tensors=tensors, deq=deq)
        doc["seconds"] = {"weights": round(tw, 1), "total": round(time.time() - t, 1)}
        docs.append(doc)
        out.write_text(json.dumps(docs, indent=1) + "\n")
        for r in P.summary_rows(doc):
            print(f"{name} B={r['batch']}: logits {r['logit_program']:.3f} σ (HF bf16 "
                  f"{r['logit_hf_bf16']:.3f}), state {r['state_program']:.2e} (HF bf16 "
                  f"{r['state_hf_bf16']:.2e}), worst per-layer ratio {r['state_ratio_per_layer']:.2f}"
                  f", slots alike {r['same_across_slots']} [{doc['seconds']['total']} s]",
                  flush=True)
    return 0


def table(path: str) -> int:
    docs = json.loads(Path(path).read_text())
    print("| model | layers | B | logits: program | logits: HF bf16 | state: program | "
          "state: HF bf16 | worst per-layer ratio | slots alike |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for doc in docs:
        for r in P.summary_rows(doc):
            print(f"| {r['model']} | {r['layers']} | {r['batch']} | {r['logit_program']:.3f} σ | "
                  f"{r['logit_hf_bf16']:.3f} σ | {r['state_program']:.2e} | "
                  f"{r['state_hf_bf16']:.2e} | {r['state_ratio_per_layer']:.2f} | "
                  f"{'yes' if r['same_across_slots'] else 'NO'} |")
    print()
    for doc in docs:
        r = P.summary_rows(doc)[0]
        print(f"{doc['model']} (B = {r['batch']}), per layer: program / HF bf16")
        print()
        print("| layer | kind | program | HF bf16 | ratio |")
        print("| --- | --- | --- | --- | --- |")
        for key, v in r["per_layer"].items():
            L, k = key.split(":")
            print(f"| {L} | {k} | {v['program']:.2e} | {v['hf_bf16']:.2e} | "
                  f"{v['program'] / max(v['hf_bf16'], 1e-30):.2f} |")
        print()
        steps = [max(s["logits"]["program"][i] for s in doc["runs"][0]["sequences"])
                 for i in range(doc["steps"])]
        hf = [max(s["logits"]["hf_bf16"][i] for s in doc["runs"][0]["sequences"])
              for i in range(doc["steps"])]
        print("logits by step (max over prompts, σ): program " +
              " ".join(f"{e:.3f}" for e in steps) + "; HF bf16 " + " ".join(f"{e:.3f}" for e in hf))
        print()
    return 0


def golden(path: str) -> int:
    from qwen38gen.verify import golden as G
    from qwen38gen.weights import default_tensors
    from qwen38gen.quantize import int4_weights

    cfg = PRESETS[G.MODEL]
    g = G.load_golden()
    doc = P.hf_yardstick(cfg, int4_weights(cfg, default_tensors(cfg)), g.sequences, "cpu")
    Path(path).write_text(json.dumps(doc, indent=1) + "\n")
    by_layer = {}
    for s in doc["sequences"]:
        for L, kinds in s["state"].items():
            by_layer.setdefault(int(L), []).extend(kinds.values())
    print("logits: HF bf16 max", max(max(s["logits"]) for s in doc["sequences"]))
    print("state by layer: " + " ".join(f"{L}:{max(v):.4f}" for L, v in sorted(by_layer.items())))
    return 0


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "golden":
        sys.exit(golden(sys.argv[2]))
    if len(sys.argv) >= 2 and sys.argv[1] == "run":
        sys.exit(run(sys.argv[2:]))
    if len(sys.argv) == 3 and sys.argv[1] == "table":
        sys.exit(table(sys.argv[2]))
    print(__doc__, file=sys.stderr)
    sys.exit(2)

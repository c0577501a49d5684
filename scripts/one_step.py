"""One prefill chunk and one decode step of the embedded default, launched kernel by kernel
(no graph), for compute-sanitizer:
`compute-sanitizer --tool memcheck python3 scripts/one_step.py B`.

`python3 scripts/one_step.py B refill` then also refills one slot the way continuous batching does
(qwen38gen/engine.py): slot 1 is reset (Runtime.reset_slot) and takes a prefill chunk of its own
while the other slots idle in it (ntok 0) and keep their state, then every slot decodes a step.
"""

import sys

import numpy as np

from qwen38gen.check import build, default_tensors
from qwen38gen.config import PRESETS
from qwen38gen.lanes import Lanes
from qwen38gen.runtime import Runtime

B = int(sys.argv[1]) if len(sys.argv) > 1 else 3
REFILL = sys.argv[2:] == ["refill"]
if len(sys.argv) > 3 or (len(sys.argv) == 3 and not REFILL):
    sys.exit("usage: python3 scripts/one_step.py [B [refill]]")
cfg = PRESETS["tiny"]
lanes = Lanes.make(B, pt=16)
cubin, man = build(cfg, lanes)
with Runtime(cubin, man, cfg, default_tensors(cfg), tmax=64) as rt:
    rng = np.random.default_rng(0)
    ntok = np.array([16, 5, 1][:B] + [7] * max(0, B - 3), np.int32)
    rt.put("tokens", rng.integers(0, cfg.vocab_size, B * 16).astype(np.int32))
    rt.put("ntok", ntok)
    rt.run_phase("prefill", graph=False)
    rt.put("ntok", np.ones(B, np.int32))
    rt.put("tokens", rt.get("next"))
    rt.run_phase("decode", graph=False)
    rt.run_phase("topk", graph=False)
    pos = rt.get("pos")
    assert list(pos) == list(ntok + 1), pos
    print("one prefill chunk + one decode step ran; pos", list(pos), "next", list(rt.get("next")))
    if REFILL:
        slot = min(1, B - 1)
        before = {n: rt.get(n) for n in ("rec", "conv")}
        rt.reset_slot(slot)
        fill = np.zeros(B, np.int32)
        fill[slot] = 9
        rt.put("tokens", rng.integers(0, cfg.vocab_size, B * 16).astype(np.int32))
        rt.put("ntok", fill)
        rt.run_phase("prefill", graph=False)
        after = rt.get("pos")
        want = pos.copy()
        want[slot] = 9
        assert list(after) == list(want), after
        for n, arr in before.items():   # the idle slots' state did not move
            now = rt.get(n)
            others = [b for b in range(B) if b != slot]
            assert np.array_equal(now[:, others], arr[:, others]), n
        rt.put("ntok", np.ones(B, np.int32))
        rt.put("tokens", rt.get("next"))
        rt.run_phase("decode", graph=False)
        assert list(rt.get("pos")) == list(want + 1)
        print(f"refill: slot {slot} reset and prefilled alone (9 tokens), the others idle and "
              "unchanged, then one decode step; pos", list(rt.get("pos")))

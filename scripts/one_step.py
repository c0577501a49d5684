"""One prefill chunk and one decode step of the embedded default, launched kernel by kernel
(no graph), for compute-sanitizer: `compute-sanitizer --tool memcheck python3 scripts/one_step.py`."""

import sys

import numpy as np

from qwen38gen.check import build, default_tensors
from qwen38gen.config import PRESETS
from qwen38gen.lanes import Lanes
from qwen38gen.runtime import Runtime

B = int(sys.argv[1]) if len(sys.argv) > 1 else 3
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

"""What several tests share.

* ``request_mix``: the request mix of the engine locks (tests/test_engine.py,
  tests/test_emu_backend.py, tests/gpu/test_engine.py): prompts of the given lengths (1 to 3
  prefill chunks) and max_tokens, all greedy or all sampled (temperature 0.8, a seed per request,
  top_k on every third, top_p on every other).
* ``assert_final_state``: the emulated program's final state against the reference's, as `check`
  compares them on the GPU, and a check that the comparison sees a wrong ring slot and a wrong V
  entry (tests/test_schedule_emulation.py, tests/test_published_sizes.py).
"""

from __future__ import annotations

import numpy as np

from qwen38gen.sampling import SamplingParams
from qwen38gen.serve.requests import Request, default_seed
from qwen38gen.verify.check import state_errors


def request_mix(mode: str, lengths, max_tokens, seed: int, vocab: int = 1024) -> list[Request]:
    rng = np.random.default_rng(seed)
    out = []
    for i, (n, m) in enumerate(zip(lengths, max_tokens)):
        prompt = tuple(int(t) for t in rng.integers(0, vocab, n))
        sp = (SamplingParams() if mode == "greedy" else
              SamplingParams(temperature=0.8, seed=default_seed(seed, i),
                             top_k=50 if i % 3 == 0 else -1, top_p=0.9 if i % 2 else 1.0))
        out.append(Request(f"r{i}", prompt, m, sampling=sp))
    return out


def assert_final_state(cfg, emu, st, B: int, tol: float) -> None:
    bufs = {n: emu.get(n) for n in ("rec", "conv", "kc", "vc", "pos")}
    for b in range(B):
        errs = state_errors(cfg, bufs, b, st, b)
        assert max(errs.values()) < tol, f"final state of sequence {b}: {errs}"
    bufs["conv"][0, 0] = np.roll(bufs["conv"][0, 0], 1, axis=0)
    bufs["vc"][0, 0, 0, 0, 0] += 1.0
    errs = state_errors(cfg, bufs, 0, st, 0)
    assert errs["conv"] > 1e-3 and errs["v"] > 1e-6, errs

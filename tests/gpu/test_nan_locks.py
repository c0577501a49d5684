"""The locks fail on the GPU program's non-finite outputs and say where (tests/test_nan_locks.py
is the CPU half). The tiny program's final norm weight gets one NaN / +inf / -inf: every logit of
every row is then non-finite. Runtime.generate (what golden --update, check and check --reference
run) must record where, the golden comparison must fail, the engine's guard on the device-sampling
backend (check --serve) must stop, and the speculative loop (check --mtp) must record it."""

from __future__ import annotations

from contextlib import contextmanager

import numpy as np
import pytest

from qwen38gen.verify import golden as G
from qwen38gen.serve.backends import RuntimeBackend
from qwen38gen.build import build
from qwen38gen.weights import default_tensors
from qwen38gen.config import PRESETS
from qwen38gen.serve.engine import Engine, NonFiniteLogits
from qwen38gen.lanes import Lanes
from qwen38gen.serve.requests import Request
from qwen38gen.runtime import Runtime
from qwen38gen.verify.serve_lock import serve_lock
from qwen38gen.verify.spec_runtime import speculative_run, tmax_needed

CFG = PRESETS["tiny"]
BAD = [float("nan"), float("inf"), float("-inf")]


def poisoned(bad, mtp=False):
    t = dict(default_tensors(CFG, mtp=mtp))
    w = np.array(t["model.language_model.norm.weight"], copy=True)
    w[7] = bad
    t["model.language_model.norm.weight"] = w
    return t


@pytest.mark.parametrize("bad", BAD)
def test_generate_records_and_the_comparison_fails(bad):
    cubin, man = build(CFG, Lanes.make(3, pt=16))
    prompts = [[1, 2, 3], [4] * 20, [9]]
    with Runtime(cubin, man, CFG, poisoned(bad), 40) as rt:
        runs = rt.generate(prompts, 4)
    for b, r in enumerate(runs):
        assert r["nonfinite"].startswith(f"sequence {b} step 0 logits["), r["nonfinite"]
        rep = G.compare_to_reference(r, np.zeros((4, CFG.vocab_size)), b)
        assert not rep.ok and rep.nonfinite == r["nonfinite"]


@pytest.mark.parametrize("bad", BAD)
def test_engine_guard_and_serve_lock_on_the_device_sampling_backend(bad):
    cubin, man = build(CFG, Lanes.make(2, pt=8))
    with Runtime(cubin, man, CFG, poisoned(bad), 40) as rt:
        with pytest.raises(NonFiniteLogits, match=r"request 'a' \(slot 0, position 3\): "
                                                  r"non-finite logits\["):
            Engine(RuntimeBackend(rt), check_finite=True).run(
                [Request("a", (1, 2, 3), 2, ignore_eos=True)])

        @contextmanager
        def backend_of(B):
            yield RuntimeBackend(rt)

        res, _ = serve_lock(backend_of, 2, 8, CFG)
    assert not res.ok and res.notes[0].startswith("FAIL: request ")


@pytest.mark.parametrize("bad", BAD)
def test_speculative_loop_records_nonfinite(bad):
    lanes = Lanes.make(2, pt=16, mtp=1)
    cubin, man = build(CFG, lanes)
    prompts = [[1, 2, 3], [4, 5]]
    with Runtime(cubin, man, CFG, poisoned(bad, mtp=True), tmax_needed(prompts, 3, 1)) as rt:
        _, st, _ = speculative_run(rt, man, prompts, 3)
    assert all(w and w.startswith(f"sequence {b} prefill logits[")
               for b, w in enumerate(st.nonfinite))

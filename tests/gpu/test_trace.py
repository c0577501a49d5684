"""The trace variant of a program (bench --trace) on the GPU: it computes what the program
computes, bit for bit, and one replay records every block of every launch in schedule order."""

import pytest

from qwen38gen.build import build
from qwen38gen.config import PRESETS
from qwen38gen.lanes import Lanes
from qwen38gen.perf import trace as T
from qwen38gen.runtime import Runtime
from qwen38gen.weights import default_tensors


@pytest.mark.parametrize("batch", [1, 3, 16])
def test_trace_variant_same_results_every_block_recorded(batch):
    cfg, lanes = PRESETS["tiny"], Lanes.make(batch)
    tensors = default_tensors(cfg)
    prompts = [[(5 * b + j) % 1000 + 1 for j in range(2 + b % 5)] for b in range(batch)]
    outs = []
    for trace in (False, True):
        cubin, man = build(cfg, lanes, trace=trace)
        with Runtime(cubin, man, cfg, tensors, tmax=40) as rt:
            outs.append(rt.generate(prompts, 5))
            if trace:
                recs, _ = T.record(rt, ctx=20)
                tl = T.timeline(recs, man, cfg)
    assert outs[0] == outs[1]
    sched = man["schedule"]["decode"]
    assert [s.kernel for s in tl.launches] == [s["k"] for s in sched]
    for sp in tl.launches:
        assert sp.start <= sp.release <= sp.end and sp.mid <= sp.end
    assert tl.step_us == pytest.approx(sum(s.advance for s in tl.launches), abs=1e-6)
    assert tl.step_us > 0 and tl.resolution_ns > 0

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


def test_mtp_trace_variant_records_the_verify_step():
    """bench --mtp K --trace: the mtp program's trace variant computes the verify step's tokens
    bit for bit as the program does, and one replay of the verify phase records every block of
    every one of its launches in schedule order."""
    from qwen38gen.perf.bench_mtp import spec_state

    cfg, lanes, ctx = PRESETS["tiny"], Lanes.make(3, pt=2, mtp=1), 20
    tensors = default_tensors(cfg, mtp=True)
    outs = []
    for trace in (False, True):
        cubin, man = build(cfg, lanes, trace=trace)
        with Runtime(cubin, man, cfg, tensors, tmax=40) as rt:
            spec_state(rt, cfg, 3, 1, ctx)
            rt.run_phase("verify")
            outs.append([rt.get(n).copy() for n in ("vnext", "emit", "vtok")])
            if trace:
                spec_state(rt, cfg, 3, 1, ctx)
                recs, _ = T.record(rt, ctx, phase="verify")
                tl = T.timeline(recs, man, cfg, phase="verify")
    assert all((a == b).all() for a, b in zip(*outs))
    assert [s.kernel for s in tl.launches] == [s["k"] for s in man["schedule"]["verify"]]
    assert tl.step_us > 0

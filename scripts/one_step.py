"""One prefill chunk and one decode step of the embedded default, launched kernel by kernel
(no graph), for compute-sanitizer:
`compute-sanitizer --tool memcheck python3 scripts/one_step.py B`.

`python3 scripts/one_step.py B refill` then also refills one slot the way continuous batching does
(qwen38gen/serve/engine.py): slot 1 is reset (Runtime.reset_slot) and takes a prefill chunk of its own
while the other slots idle in it (ntok 0) and keep their state, then every slot decodes a step.
(tests/test_one_step.py runs the same scenario on the schedule's numpy emulation.)
"""

from __future__ import annotations

import sys

import numpy as np

PT = 16
REFILL_TOKENS = 9


def scenario(rt, cfg, B: int, refill: bool, run) -> list[str]:
    """The steps on ``rt`` (put, get, reset_slot; ``run(phase)`` launches a phase), asserting the
    positions and that a refill leaves the idle slots' state alone; returns what to print."""
    from qwen38gen.inputs import put_chunk

    rng = np.random.default_rng(0)
    ntok = np.array([16, 5, 1][:B] + [7] * max(0, B - 3), np.int32)
    sched = rt.manifest["schedule"]

    def chunk(lengths):   # a packed chunk of random tokens, in the schedule that holds it
        return put_chunk(rt.put, sched, [list(map(int, rng.integers(0, cfg.vocab_size, n)))
                                         for n in lengths])

    run(chunk(ntok))
    rt.put("ntok", np.ones(B, np.int32))
    rt.put("tokens", rt.get("next"))
    run("decode")
    run("topk")
    pos = rt.get("pos")
    assert list(pos) == list(ntok + 1), pos
    nxt = list(rt.get("next"))
    lines = [f"one prefill chunk + one decode step ran; pos {list(pos)} next {nxt}"]
    if not refill:
        return lines
    slot = min(1, B - 1)
    before = {n: rt.get(n) for n in ("rec", "conv")}
    rt.reset_slot(slot)
    fill = np.zeros(B, np.int32)
    fill[slot] = REFILL_TOKENS
    run(chunk(fill))
    want = pos.copy()
    want[slot] = REFILL_TOKENS
    assert list(rt.get("pos")) == list(want), rt.get("pos")
    others = [b for b in range(B) if b != slot]
    for n, arr in before.items():   # the idle slots' state did not move
        assert np.array_equal(rt.get(n)[:, others], arr[:, others]), n
    rt.put("ntok", np.ones(B, np.int32))
    rt.put("tokens", rt.get("next"))
    run("decode")
    assert list(rt.get("pos")) == list(want + 1), rt.get("pos")
    lines.append(f"refill: slot {slot} reset and prefilled alone ({REFILL_TOKENS} tokens), the "
                 f"others idle and unchanged, then one decode step; pos {list(rt.get('pos'))}")
    return lines


def main(argv: list[str]) -> None:
    from qwen38gen.build import build
    from qwen38gen.weights import default_tensors
    from qwen38gen.config import PRESETS
    from qwen38gen.lanes import Lanes
    from qwen38gen.runtime import Runtime

    refill = argv[1:] == ["refill"]
    if len(argv) > 2 or (len(argv) == 2 and not refill) or (argv and not argv[0].isdigit()):
        sys.exit("usage: python3 scripts/one_step.py [B [refill]]")
    B = int(argv[0]) if argv else 3
    cfg = PRESETS["tiny"]
    cubin, man = build(cfg, Lanes.make(B, pt=PT, model=cfg))
    with Runtime(cubin, man, cfg, default_tensors(cfg), tmax=64) as rt:
        for line in scenario(rt, cfg, B, refill, lambda ph: rt.run_phase(ph, graph=False)):
            print(line)


if __name__ == "__main__":
    main(sys.argv[1:])

"""The engine's lock on the GPU: N > B requests through B
slots of the emitted tiny program (RuntimeBackend: slot resets, prefill chunks with idle slots,
decode steps with idle slots) give every request the tokens it gets alone, greedy and sampled,
at B = 2 and 3 (N = 7 ≥ 2B + 1), with the KV cache NaN-filled before the batched run (slot
resets leave KV alone: what lies past a slot's position must never be read). Runtime makes its
own context, as in test_trace.py."""

from __future__ import annotations

import numpy as np
import pytest

from qwen38gen.build import build
from qwen38gen.config import PRESETS
from qwen38gen.lanes import Lanes
from qwen38gen.runtime import Runtime
from qwen38gen.sampling import SamplingParams
from qwen38gen.serve.backends import RuntimeBackend
from qwen38gen.serve.engine import Engine
from qwen38gen.weights import default_tensors

from tests._helpers import request_mix

PT = 8
LENGTHS = (1, 9, 3, 17, 8, 20, 2)
MAX_TOKENS = (4, 1, 6, 3, 5, 2, 7)


def requests(mode):
    return request_mix(mode, LENGTHS, MAX_TOKENS, seed=5)


@pytest.mark.parametrize("mode", ["greedy", "sampled"])
@pytest.mark.parametrize("B", [2, 3])
def test_engine_lock_on_the_gpu(B, mode):
    """Alone = the request by itself in the same B-slot program (the other slots idle), so the
    comparison isolates the scheduling from kernel paths that differ between batch sizes."""
    cfg = PRESETS["tiny"]
    reqs = requests(mode)
    assert len(reqs) >= 2 * B + 1
    cubin, man = build(cfg, Lanes.make(B, pt=PT))
    with Runtime(cubin, man, cfg, default_tensors(cfg), 64) as rt:
        alone = {}
        for r in reqs:
            (res,) = Engine(RuntimeBackend(rt)).run([r])
            alone[r.id] = res.token_ids
        for name in ("kc", "vc"):   # KV past a slot's position must never be read: NaN it
            g, shape, _ = rt.bufs[name]
            rt.drv.memset_d16(g, 0xFFFF, int(np.prod(shape)))
        eng = Engine(RuntimeBackend(rt))
        got = {r.id: r.token_ids for r in eng.run(reqs)}
    assert got == alone
    assert eng.stats.output_tokens == sum(MAX_TOKENS)


def test_sample_phase_is_the_twin():
    """The program's sample phase (RuntimeBackend.choose) picks what sampling.sample picks on the
    program's own bf16 logits, at the slot's position, after a prefill chunk and a decode step."""
    from qwen38gen.sampling import sample

    cfg, B = PRESETS["tiny"], 3
    cubin, man = build(cfg, Lanes.make(B, pt=PT))
    params = [SamplingParams(temperature=0.8, seed=5), SamplingParams(),
              SamplingParams(temperature=1.3, top_k=20, top_p=0.9, min_p=0.01, seed=9)]
    with Runtime(cubin, man, cfg, default_tensors(cfg), 64) as rt:
        be = RuntimeBackend(rt)
        for b, p in enumerate(params):
            be.reset_slot(b)
            be.set_sampling(b, p)
        be.prefill([[1, 2, 3], [4], [5, 6, 7, 8, 9]])
        for step in range(2):
            pos = [int(x) for x in rt.get("pos")]
            got = be.choose({b: pos[b] for b in range(B)})
            lg = rt.get("logits")[:B].astype(np.float32)
            assert got == {b: sample(lg[b], params[b], pos[b]) for b in range(B)}, step
            be.decode([got[b] for b in range(B)])


@pytest.mark.parametrize("multi_tile", [0, None])
def test_a_row_is_the_same_in_a_chunk_and_in_a_decode_step(multi_tile):
    """What lets decoding slots ride in prefill chunks (serve/engine.py): one sequence of 12
    tokens fed (a) as prefill chunks of 8 and 4, (b) one token per decode step, other slots
    idle, and (c) one token per prefill chunk beside another slot's 8-token prompt chunks gives
    bitwise the same logits row after every token ((b) and (c)), the same final row ((a)) and the
    same recurrent state and conv ring. multi_tile None (the table's 32): the chunks' GEMVs run
    in 32-row tiles, the decode steps' in the lane's (Tuning.multi_tile: the tile must not change
    a bit); 0: every launch in the lane's tile."""
    from qwen38gen.tuning import Tuning

    cfg, B = PRESETS["tiny"], 3
    rng = np.random.default_rng(11)
    seq = [int(t) for t in rng.integers(0, cfg.vocab_size, 12)]
    other = [int(t) for t in rng.integers(0, cfg.vocab_size, 8 * 12)]
    cubin, man = build(cfg, Lanes.make(B, pt=PT, tuning=Tuning(multi_tile=multi_tile)))
    bits = lambda a: np.ascontiguousarray(a).view(np.uint8)

    def state(rt, b):
        return [bits(rt.get(n)[:, b]) for n in ("rec", "conv")]

    with Runtime(cubin, man, cfg, default_tensors(cfg), 128) as rt:
        be = RuntimeBackend(rt)
        be.prefill([seq[:8], [], []])
        be.prefill([seq[8:], [], []])
        chunked = bits(rt.get("logits")[0])
        st_a = state(rt, 0)
        decoded = []
        for t in seq:
            be.decode([None, t, None])
            decoded.append(bits(rt.get("logits")[1]))
        st_b = state(rt, 1)
        be.reset_slot(0)
        ridden = []
        for i, t in enumerate(seq):
            be.prefill([other[8 * i:8 * i + 8], [], [t]])
            ridden.append(bits(rt.get("logits")[2]))
        st_c = state(rt, 2)
        assert np.all(np.isfinite(rt.get("logits")[[0, 2]].astype(np.float32)))
    for i in range(len(seq)):
        assert np.array_equal(decoded[i], ridden[i]), f"token {i}: decode row != chunk row"
    assert np.array_equal(chunked, decoded[-1]), "a 12-token prompt's last row != decoded"
    for name, a, b, c in zip(("rec", "conv"), st_a, st_b, st_c):
        assert np.array_equal(a, b) and np.array_equal(b, c), f"{name} differs"


def test_ttft_pass_gives_the_first_tokens_of_generate():
    """bench --prefill's timed pass (prefill_bench.ttft_once: the B prompts in chunks, no decode)
    reads the first token Runtime.generate gives each prompt, prompts of different lengths
    included, so what it times is the work that makes the first token."""
    from qwen38gen.perf.prefill_bench import ttft_once

    cfg = PRESETS["tiny"]
    rng = np.random.default_rng(11)
    prompts = [rng.integers(0, cfg.vocab_size, n).tolist() for n in (21, 5, 16)]
    cubin, man = build(cfg, Lanes.make(3, pt=PT))
    with Runtime(cubin, man, cfg, default_tensors(cfg), 64) as rt:
        want = [r["tokens"][0] for r in rt.generate(prompts, 1, topk=False)]
        rt.put("next", np.full(3, -1, np.int32))       # poisoned before the timed pass
        seconds, got = ttft_once(rt, prompts)
    assert seconds > 0 and got == want

"""The continuous-batching engine (qwen38gen/serve/engine.py).

* Scheduling and stopping on a fake backend whose next token is a function of everything its slot
  was fed (a missed slot reset, a chunk fed twice or to the wrong slot changes the tokens): step
  counts and occupancy of a hand-worked run; stop ids, eos, ignore_eos, max_tokens, context.
* The lock: N > B requests (prompts of 1 to 3 chunks, different max_tokens) through B slots of
  the numpy reference give every request exactly the tokens it gets alone (B = 1), greedy and
  sampled, at B = 1, 2, 3 with N = 7 ≥ 2B + 1.
"""

from __future__ import annotations

import numpy as np
import pytest

from qwen38gen.config import PRESETS
from qwen38gen.errors import UserError
from qwen38gen.reference import Reference
from qwen38gen.serve.backends import ReferenceBackend
from qwen38gen.serve.engine import Engine
from qwen38gen.serve.requests import Request
from qwen38gen.weights import synthetic_weights

from tests._blas_threads import single_threaded  # noqa: F401  (autouse: 1 BLAS thread)
from tests._helpers import request_mix


class FakeBackend:
    """Slot state = the tokens fed since its reset; logits one-hot at a hash of them."""

    def __init__(self, slots, chunk, vocab=97, ctx=1000):
        self.slots, self.chunk, self.vocab, self.ctx = slots, chunk, vocab, ctx
        self.fed = [[-1] for _ in range(slots)]   # garbage until the first reset
        self.calls = []

    def reset_slot(self, b):
        self.fed[b] = []

    def _row(self, b):
        h = 0
        for t in self.fed[b]:
            h = (h * 31 + t + 7) % 1000003
        row = np.zeros(self.vocab, np.float32)
        row[h % self.vocab] = 1.0
        return row

    def prefill(self, chunks):
        self.calls.append(("prefill", [len(c) for c in chunks]))
        assert all(len(c) <= self.chunk for c in chunks)
        for b, c in enumerate(chunks):
            self.fed[b] += list(c)
        return [self._row(b) if c else None for b, c in enumerate(chunks)]

    def decode(self, tokens):
        self.calls.append(("decode", [0 if t is None else 1 for t in tokens]))
        for b, t in enumerate(tokens):
            if t is not None:
                self.fed[b].append(t)
        return np.stack([self._row(b) for b in range(self.slots)])


def req(rid, n, max_tokens, **kw):
    prompt = tuple((7 * rid + 3 * i) % 97 for i in range(n))
    return Request(rid, prompt, max_tokens, **kw)


def test_hand_worked_schedule():
    """B = 2, chunk 4: A (5 tokens, 3 out), B (2, 1 out), C (1, 2 out)."""
    be = FakeBackend(2, 4)
    eng = Engine(be)
    reqs = [req(0, 5, 3), req(1, 2, 1), req(2, 1, 2)]
    order = [r.id for r in eng.run(reqs)]
    assert be.calls == [("prefill", [4, 2]),     # B's prompt ends: its one token, done
                        ("prefill", [1, 1]),     # C takes slot 1 while A finishes its prompt
                        ("decode", [1, 1]),      # C done
                        ("decode", [1, 0])]      # A done; slot 1 idles
    assert order == [1, 2, 0]
    s = eng.stats
    assert (s.prefill_steps, s.decode_steps, s.steps) == (2, 2, 4)
    assert s.occupancy == 7 / 8 and s.decode_occupancy == 3 / 4
    assert s.lockstep_steps == (2 + 2) + (1 + 1)
    assert (s.requests, s.output_tokens) == (3, 6)


def alone(backend_of, r):
    (res,) = Engine(backend_of(1)).run([r])
    return res.token_ids, res.finish_reason


def test_stop_eos_length_and_context():
    be = lambda B: FakeBackend(B, 4)  # noqa: E731
    toks, why = alone(be, req(3, 6, 8))
    assert (len(toks), why) == (8, "length")
    (res,) = Engine(be(1)).run([req(3, 6, 8, stop_ids=frozenset({toks[2]}))])
    assert res.token_ids == toks[:toks.index(toks[2]) + 1] and res.finish_reason == "stop"
    (res,) = Engine(be(1), eos_ids=(toks[1],)).run([req(3, 6, 8)])
    assert res.token_ids == toks[:toks.index(toks[1]) + 1] and res.finish_reason == "stop"
    (res,) = Engine(be(1), eos_ids=(toks[1],)).run([req(3, 6, 8, ignore_eos=True)])
    assert res.token_ids == toks and res.finish_reason == "length"
    # a context of 9 positions: the 6-token prompt then 4 tokens (the last is never fed)
    (res,) = Engine(FakeBackend(1, 4, ctx=9)).run([req(3, 6, 8)])
    assert res.token_ids == toks[:4] and res.finish_reason == "length"


def test_bad_requests():
    with pytest.raises(UserError, match=r"^request 5: max_tokens 0 must be ≥ 1$"):
        req(5, 3, 0)
    with pytest.raises(UserError, match=r"^request 5: the prompt is empty; give at least one token$"):
        Request(5, (), 3)
    with pytest.raises(UserError, match=r"^request 4: the prompt has 6 tokens, more than the "
                                        r"context of 5; pass a larger --ctx$"):
        Engine(FakeBackend(1, 4, ctx=5)).add(req(4, 6, 1))


def test_decoders_ride_in_prefill_chunks():
    """B = 2, chunk 4: A (1 token, 4 out) decodes while B (9 tokens, 1 out) is prefilled: A feeds
    its last token in B's chunks (one row each) instead of waiting, so the run takes 4 steps, not
    the 6 of a schedule whose decoders wait (ride = False), and gives the same tokens."""
    class Waiting(Engine):
        ride = False

    runs = {}
    for cls in (Engine, Waiting):
        be = FakeBackend(2, 4)
        eng = cls(be)
        runs[cls] = {r.id: r.token_ids for r in eng.run([req(0, 1, 4), req(1, 9, 1)])}
        if cls is Engine:
            assert be.calls == [("prefill", [1, 4]),   # A's prompt ends: its first token
                                ("prefill", [1, 4]),   # A rides along: its second
                                ("prefill", [1, 1]),   # B done; A's third
                                ("decode", [1, 0])]    # A's fourth
            s = eng.stats
            assert (s.prefill_steps, s.decode_steps, s.prompt_rows) == (3, 1, 10)
            assert (s.busy_prefill, s.busy_decode, s.decode_carriers) == (4, 3, 3)
            assert s.occupancy == 7 / 8 and s.decode_occupancy == 3 / 4   # rooms 1, 1, 2
        else:
            assert be.calls == [("prefill", [1, 4]), ("prefill", [0, 4]), ("prefill", [0, 1]),
                                ("decode", [1, 0]), ("decode", [1, 0]), ("decode", [1, 0])]
    assert runs[Engine] == runs[Waiting]


def test_fake_backend_lock():
    """Many requests through 1-4 slots of the fake backend: each gets its tokens alone."""
    reqs = [req(i, 1 + (5 * i) % 11, 1 + (3 * i) % 7) for i in range(13)]
    want = {r.id: alone(lambda B: FakeBackend(B, 4), r) for r in reqs}
    for B in (1, 2, 3, 4):
        got = {r.id: (r.token_ids, r.finish_reason) for r in Engine(FakeBackend(B, 4)).run(reqs)}
        assert got == want, B


# ----------------------------------------------------------------------------- the lock
CHUNK = 8
LENGTHS = (1, 9, 3, 17, 8, 20, 2)          # 1 to 3 chunks of 8
MAX_TOKENS = (4, 1, 6, 3, 5, 2, 7)
_REF: dict = {}


def ref_backend(B):
    if "ref" not in _REF:
        cfg = PRESETS["tiny"]
        _REF["ref"] = Reference(cfg, synthetic_weights(cfg, 3, mtp=False))
    return ReferenceBackend(_REF["ref"], B, CHUNK, ctx=64)


def lock_requests(mode: str) -> list[Request]:
    return request_mix(mode, LENGTHS, MAX_TOKENS, seed=5)


_ALONE: dict = {}


@pytest.mark.parametrize("mode", ["greedy", "sampled"])
@pytest.mark.parametrize("B", [1, 2, 3])
def test_lock_reference_backend(B, mode):
    reqs = lock_requests(mode)
    assert len(reqs) >= 2 * B + 1
    if mode not in _ALONE:
        _ALONE[mode] = {r.id: alone(ref_backend, r) for r in reqs}
    eng = Engine(ref_backend(B))
    got = {r.id: (r.token_ids, r.finish_reason) for r in eng.run(reqs)}
    assert got == _ALONE[mode]
    assert all(len(got[r.id][0]) == r.max_tokens for r in reqs)
    if mode == "sampled":   # sampling changed something: not the greedy tokens
        greedy = _ALONE.get("greedy") or {r.id: alone(ref_backend, r) for r in lock_requests("greedy")}
        assert sum(got[r.id][0] != greedy[r.id][0] for r in reqs) >= 3
    s = eng.stats
    assert s.steps == s.prefill_steps + s.decode_steps and s.output_tokens == sum(MAX_TOKENS)
    assert 0 < s.occupancy <= 1

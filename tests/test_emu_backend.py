"""The engine on the emitted program's schedule executed in numpy (qwen38gen/emu/backend.py).

* The lock (on CPU): N = 7 ≥ 2B + 1 requests (prompts of 1 to 3 chunks of 4,
  different max_tokens) through B slots of the emulated program give every request exactly the
  tokens it gets alone (B = 1), greedy and sampled, at B = 1, 2, 3.
* Tokens are chosen by the program (the step's argmax, or its sample phase: kernels/sampling.cuh
  executed by its numpy twin on the parameters the host packed into its buffers): each request
  gets the tokens the engine's host sampling gives on the same logits, and the sample phase runs
  only in steps where some choosing slot samples.
* A slot's reset zeroes its state and position and poisons its K/V with NaN: a schedule that
  read K/V past the new request's positions would put NaN in the logits, which is an error
  (``engine.NonFiniteLogits``, naming the slot and the first non-finite logit).
"""

from __future__ import annotations

import numpy as np
import pytest

from qwen38gen.config import PRESETS
from qwen38gen.emu.backend import EmuBackend
from qwen38gen.errors import UserError
from qwen38gen.lanes import Lanes
from qwen38gen.serve.engine import Engine, NonFiniteLogits
from qwen38gen.serve.requests import Request
from qwen38gen.weights import default_tensors

from tests._blas_threads import single_threaded  # noqa: F401  (autouse: 1 BLAS thread)
from tests._helpers import request_mix

PT = 4
CTX = 24
LENGTHS = (1, 9, 3, 12, 4, 6, 2)           # 1 to 3 chunks of 4
MAX_TOKENS = (4, 1, 5, 3, 2, 6, 3)
_T: dict = {}


def emu_backend(B: int, device_sampling: bool = True) -> EmuBackend:
    cfg = PRESETS["tiny"]
    if "t" not in _T:
        _T["t"] = default_tensors(cfg)
    return EmuBackend(cfg, Lanes.make(B, pt=PT), _T["t"], CTX, device_sampling=device_sampling)


def lock_requests(mode: str) -> list[Request]:
    return request_mix(mode, LENGTHS, MAX_TOKENS, seed=9)


_ALONE: dict = {}


def alone(mode: str) -> dict:
    """Each request run alone, on one slot (the slot's reset between them: what carries over
    is poisoned or zeroed)."""
    if mode not in _ALONE:
        out = {}
        be = _T.setdefault("alone", emu_backend(1))
        for r in lock_requests(mode):
            (res,) = Engine(be).run([r])
            out[r.id] = (res.token_ids, res.finish_reason)
        _ALONE[mode] = out
    return _ALONE[mode]


@pytest.mark.parametrize("mode", ["greedy", "sampled"])
@pytest.mark.parametrize("B", [1, 2, 3])
def test_lock_emu_backend(B, mode):
    reqs = lock_requests(mode)
    assert len(reqs) >= 2 * B + 1
    eng = Engine(emu_backend(B))
    got = {r.id: (r.token_ids, r.finish_reason) for r in eng.run(reqs)}
    assert got == alone(mode)
    assert [len(got[r.id][0]) for r in reqs] == list(MAX_TOKENS)
    if mode == "sampled":   # sampling changed something: not the greedy tokens
        greedy = alone("greedy")
        assert sum(got[r.id][0] != greedy[r.id][0] for r in reqs) >= 3
    s = eng.stats
    assert s.output_tokens == sum(MAX_TOKENS) and 0 < s.occupancy <= 1
    if B > 1:   # slots were reused: more requests than slots, fewer steps than one at a time
        assert s.steps < sum(-(-n // PT) + m - 1 for n, m in zip(LENGTHS, MAX_TOKENS))


class Counting(EmuBackend):
    """Counts the sample phases run."""

    def choose(self, positions):
        runs = []
        run = self.emu.run
        self.emu.run = lambda ph: (runs.append(ph), run(ph))
        try:
            return super().choose(positions)
        finally:
            self.emu.run = run
            self.sample_runs = getattr(self, "sample_runs", 0) + runs.count("sample")


@pytest.mark.parametrize("mode", ["greedy", "sampled"])
def test_the_programs_sampling_is_the_hosts(mode):
    """Device sampling (the lock above) against host sampling of the same logits, B = 3."""
    reqs = lock_requests(mode)
    host = {r.id: (r.token_ids, r.finish_reason)
            for r in Engine(emu_backend(3, device_sampling=False)).run(reqs)}
    assert host == alone(mode)
    cfg = PRESETS["tiny"]
    be = Counting(cfg, Lanes.make(3, pt=PT), _T["t"], CTX)
    eng = Engine(be)
    assert {r.id: (r.token_ids, r.finish_reason) for r in eng.run(reqs)} == host
    runs = getattr(be, "sample_runs", 0)
    if mode == "greedy":
        assert runs == 0
    else:   # one per step in which a sampling slot chose a token, at most one per step
        assert 0 < runs <= eng.stats.steps


def test_reset_zeroes_the_slot_and_poisons_its_kv():
    be = emu_backend(2)
    be.prefill([[5, 6, 7], [8]])
    emu = be.emu
    before = {n: emu.get(n) for n in ("conv", "rec", "kc", "pos")}
    be.reset_slot(1)
    after = {n: emu.get(n) for n in ("conv", "rec", "kc", "pos")}
    assert list(after["pos"]) == [3, 0]
    assert not after["conv"][:, 1].any() and not after["rec"][:, 1].any()
    assert np.isnan(after["kc"][:, 1]).all() and not np.isnan(after["kc"][:, 0]).any()
    for n in ("conv", "rec", "kc"):   # slot 0 untouched
        assert np.array_equal(after[n][:, 0], before[n][:, 0])


def test_reading_kv_past_the_position_is_caught():
    """A slot whose position was not reset reads the poisoned K/V: NaN logits, an error."""
    be = emu_backend(2, device_sampling=False)
    be.prefill([[5, 6, 7], [8, 9]])
    be.reset_slot(1)
    be.emu.buf["pos"][1] = 2          # as if the reset had kept the old position
    with pytest.raises(NonFiniteLogits, match=r"^non-finite slot 1 logits\[0\] = nan "
                                              r"\(1024 non-finite values\)$"):
        be.decode([None, 4])
    lg = be.decode([3, None])          # slot 0 is unaffected
    assert np.isfinite(lg[0]).all()


def test_the_sample_counter_is_the_position():
    be = emu_backend(2)
    be.prefill([[5, 6, 7], [8]])
    assert set(be.choose({0: 3, 1: 1})) == {0, 1}
    with pytest.raises(RuntimeError, match=r"^slot 1: the program's position 1 is not the "
                                           r"position 2 of the token being chosen$"):
        be.choose({1: 2})


def test_bad_use():
    cfg = PRESETS["tiny"]
    with pytest.raises(UserError, match=r"^this backend drives the plain decode program; an mtp "
                                        r"program \(run --mtp K\) runs on spec_engine's backends$"):
        EmuBackend(cfg, Lanes.make(1, pt=PT, mtp=1), {}, CTX)
    be = emu_backend(1)
    with pytest.raises(ValueError, match=r"^a prefill chunk is 1 lists of at most 4 tokens$"):
        be.prefill([[1, 2, 3, 4, 5]])
    be.prefill([[1, 2, 3, 4]])
    be.emu.buf["pos"][0] = CTX
    with pytest.raises(ValueError, match=rf"^slot 0: position {CTX} \+ 1 tokens passes the "
                                         rf"context {CTX}$"):
        be.decode([1])


def test_lock_holds_with_the_lane_choices_before_version_29():
    """The emulated schedule of a program with Tuning.multi_tile=0 (prefill chunks' GEMVs in the
    lane's tile: other grids and R per launch than the default 32) and sample_split=0 (the
    SPLIT = 0 sampler entry) gives every request the tokens it gets alone: the launches are wired
    as the defaults'."""
    from qwen38gen.tuning import Tuning

    cfg, B = PRESETS["tiny"], 3
    _T.setdefault("t", default_tensors(cfg))
    lanes = Lanes.make(B, pt=PT, tuning=Tuning(multi_tile=0, sample_split=False))
    sched = EmuBackend(cfg, lanes, _T["t"], CTX).emu.manifest["schedule"]
    assert {L["btg"] for L in sched["prefill"] if "weight" in L and L["weight"] != "lm_head"} == {lanes.btg}
    assert not sched["sample"][0]["k"].endswith("_s")
    reqs = lock_requests("sampled")
    got = {r.id: (r.token_ids, r.finish_reason)
           for r in Engine(EmuBackend(cfg, lanes, _T["t"], CTX)).run(reqs)}
    assert got == alone("sampled")


def test_lock_holds_with_wide_chunk_tiles():
    """Tuning.chunk_btg = 64: a chunk of 64 rows or more runs at the 64-row tile (other GEMV
    kernels, grids and tile orders than the lane's 8-row decode step), a smaller one at the
    lane's. Prompts of 27–61 tokens at pt 32 fill such chunks, decoders riding in them; every
    request gets the tokens it gets alone (at pt 4, in 8-row tiles)."""
    from qwen38gen.tuning import Tuning

    cfg, B = PRESETS["tiny"], 3
    _T.setdefault("t", default_tensors(cfg))
    lanes = Lanes.make(B, pt=32, tuning=Tuning(chunk_btg=64))
    be = EmuBackend(cfg, lanes, _T["t"], 96)
    sched = be.manifest["schedule"]
    assert sched["prefill_buckets"]["rows"] == [8, 16, 32, 64, 96]
    tiles = lambda ph: {L["btg"] for L in sched[ph] if "weight" in L}
    assert tiles("prefill") == tiles("prefill_r64") == {64} and tiles("prefill_r32") == {32, 8}
    assert tiles("decode") == {8}
    ran, run = [], be.emu.run
    be.emu.run = lambda phase, *a: (ran.append(phase), run(phase, *a))
    reqs = request_mix("sampled", (40, 33, 61, 27, 50), (3, 5, 2, 4, 3), seed=4)
    got = {r.id: (r.token_ids, r.finish_reason) for r in Engine(be).run(reqs)}
    one = EmuBackend(cfg, Lanes.make(1, pt=PT), _T["t"], 96)
    want = {}
    for r in reqs:
        (res,) = Engine(one).run([r])
        want[r.id] = (res.token_ids, res.finish_reason)
    assert got == want
    assert {"prefill", "prefill_r64"} & set(ran)

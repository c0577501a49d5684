"""`run --mtp K` on the CPU: the speculative engine (qwen38gen/serve/spec_engine.py) over B slots of the
emulated mtp program (emu/spec_backend.py: the program's prefill and verify schedules in numpy).

* The greedy lock: every request's tokens and finish reason equal the plain program's (the
  plain engine on EmuBackend), at B = 1, 2, 3 and K = 1, 2, with prompts of 1 to 3 chunks of 4
  and more requests than slots. The synthetic weights' MTP drafts are almost never the target's
  argmax, so the drafts are also forced right (the plain run's tokens): runs of K+1 tokens a step
  are kept, a stop id and max_tokens fall inside an accepted run, and the GDN state slot and the
  MTP rows over several kept tokens are used. Half-forced drafts mix accepted and rejected.
* Sampled requests (the host path: speculative sampling against sampling.py's rule): a request's
  tokens are the same at B = 1 and B = 3 (not dependent on its slot or its neighbours), its first
  token is the plain engine's, greedy neighbours still get the plain tokens.
* A refill poisons the slot's target and MTP K/V with NaN: a read past the new request's
  positions is an error.
* While prompts are fed, chunks and verify steps alternate (a decoding slot waits for at most one
  chunk); a slot mid-prompt idles in a verify step, its state and K/V untouched.
"""

from __future__ import annotations

import numpy as np
import pytest

from qwen38gen.weights import default_tensors
from qwen38gen.config import PRESETS
from qwen38gen.emu.backend import EmuBackend
from qwen38gen.emu.spec_backend import EmuSpecBackend
from qwen38gen.serve.engine import Engine
from qwen38gen.errors import UserError
from qwen38gen.lanes import Lanes
from qwen38gen.tuning import Tuning
from qwen38gen.serve.requests import Request, default_seed
from qwen38gen.sampling import SamplingParams
from qwen38gen.serve.spec_engine import MtpResult, SpecEngine

from tests._blas_threads import single_threaded  # noqa: F401  (autouse: 1 BLAS thread)

PT, CTX = 4, 20
LENGTHS = (1, 9, 3, 12, 4)          # 1 to 3 chunks of 4
MAX_TOKENS = (5, 1, 6, 4, 3)
_C: dict = {}


def tensors():
    if "t" not in _C:
        _C["t"] = default_tensors(PRESETS["tiny"], mtp=True)
    return _C["t"]


def requests(mode: str = "greedy", stop: dict | None = None) -> list[Request]:
    rng = np.random.default_rng(9)
    out = []
    for i, (n, m) in enumerate(zip(LENGTHS, MAX_TOKENS)):
        prompt = tuple(int(t) for t in rng.integers(0, 1024, n))
        sp = SamplingParams()
        if mode == "sampled" and i % 2 == 0:
            sp = SamplingParams(temperature=0.8, seed=default_seed(5, i), top_k=2)
        out.append(Request(f"r{i}", prompt, m, sampling=sp,
                           stop_ids=frozenset((stop or {}).get(f"r{i}", ()))))
    return out


def plain(reqs: list[Request], key: str) -> dict:
    """The plain program's results (the plain engine on the emulated plain program, B = 3)."""
    if key not in _C:
        be = EmuBackend(PRESETS["tiny"], Lanes.make(3, pt=PT), tensors(), CTX)
        _C[key] = {r.id: (r.token_ids, r.finish_reason) for r in Engine(be).run(reqs)}
    return _C[key]


def spec(B: int, K: int, reqs, hook=None, tuning=None) -> tuple[dict, SpecEngine]:
    lanes = Lanes.make(B, pt=PT, mtp=K, **({} if tuning is None else {"tuning": tuning}))
    be = EmuSpecBackend(PRESETS["tiny"], lanes, tensors(), CTX)
    eng = SpecEngine(be, draft_hook=hook)
    res = eng.run(reqs)
    assert all(isinstance(r, MtpResult) for r in res)
    return {r.id: r for r in res}, eng


def forced(want: dict, right=lambda position: True):
    """Drafts forced to the plain run's tokens (right), or off by one where ``right`` is False."""
    def hook(req, position, d):
        i = position - len(req.prompt)
        toks = want[req.id][0]
        if not 0 <= i < len(toks):
            return d
        return toks[i] if right(position) else (toks[i] + 1) % 1024
    return hook


def greedy_stop() -> tuple[dict, dict]:
    """Stop ids inside r0's and r3's plain outputs (their 3rd and 2nd tokens), so that with
    drafts forced right the stop falls inside a kept run; and the plain results with them: the
    unstopped plain tokens up to the first stop token (engine.py's stop rule)."""
    base = plain(requests(), "greedy")
    stop = {"r0": {base["r0"][0][2]}, "r3": {base["r3"][0][1]}}
    want = dict(base)
    for rid, ids in stop.items():
        toks = base[rid][0]
        i = next(i for i, t in enumerate(toks) if t in ids)
        want[rid] = (toks[:i + 1], "stop")
    return stop, want


@pytest.mark.parametrize("K,B,drafts", [
    (1, 2, "forced"),
    pytest.param(1, 1, "forced", marks=pytest.mark.slow),
    pytest.param(1, 3, "natural", marks=pytest.mark.slow),
    pytest.param(2, 1, "half", marks=pytest.mark.slow),
    pytest.param(2, 2, "natural", marks=pytest.mark.slow),
    pytest.param(2, 3, "forced", marks=pytest.mark.slow),
])
def test_greedy_lock(K, B, drafts):
    stop, want = greedy_stop()
    reqs = requests(stop=stop)
    assert len(want["r0"][0]) == 3 and len(want["r3"][0]) == 2     # cut by the stop ids
    hook = {"forced": forced(want), "natural": None,
            "half": forced(want, lambda p: p % 3 != 0)}[drafts]
    got, eng = spec(B, K, reqs, hook)
    assert {i: (r.token_ids, r.finish_reason) for i, r in got.items()} == want
    s = eng.stats
    assert s.output_tokens == sum(len(t) for t, _ in want.values())
    assert s.drafts_proposed == sum(r.drafts_proposed for r in got.values())
    assert all(r.drafts_proposed % K == 0 for r in got.values())
    assert s.drafts_accepted == sum(r.drafts_accepted for r in got.values())
    if drafts == "forced":
        # every verify step keeps all K+1 tokens except where a request's run is cut
        assert s.acceptance > 0.6 and s.as_dict()["tokens_per_verify"] > 1.5
        assert got["r2"].drafts_accepted == got["r2"].drafts_proposed   # max_tokens cut inside
    elif drafts == "half":
        assert 0 < s.drafts_accepted < s.drafts_proposed
    if B > 1:
        assert s.steps < sum(-(-n // PT) + m - 1 for n, m in zip(LENGTHS, MAX_TOKENS))


@pytest.mark.slow
def test_sampled_does_not_depend_on_the_batch():
    reqs = requests("sampled")
    base = plain(requests(), "greedy")
    hook = forced(base)     # drafts: the greedy stream, kept about half the time at top_k 2
    one, e1 = spec(1, 2, reqs, hook)
    three, e3 = spec(3, 2, reqs, hook)
    assert {i: r.token_ids for i, r in one.items()} == {i: r.token_ids for i, r in three.items()}
    for r in reqs:
        if r.sampling.greedy:
            assert three[r.id].token_ids == base[r.id][0]
    sampled = [r for r in reqs if not r.sampling.greedy]
    plain_sampled = plain(reqs, "sampled")
    for r in sampled:   # the first token: sampling.sample at the prompt's end, as the plain engine
        assert three[r.id].token_ids[0] == plain_sampled[r.id][0][0]
    acc = sum(three[r.id].drafts_accepted for r in sampled)
    prop = sum(three[r.id].drafts_proposed for r in sampled)
    assert 0 < acc < prop                  # both the accept and the residual path ran


@pytest.mark.parametrize("B,K", [(2, 1), pytest.param(3, 2, marks=pytest.mark.slow)])
def test_the_program_samples_as_the_host_does(B, K):
    """The program judges sampled slots' drafts (spec_sample's default: the emulated sampler with
    SPEC = 1 and spec_accept_sampled) and every request gets the host path's tokens (--tune
    spec_sample=0), greedy neighbours included; drafts forced to the greedy stream so that some
    are kept and some not."""

    reqs = requests("sampled")
    hook = forced(plain(requests(), "greedy"))
    host, heng = spec(B, K, reqs, hook, tuning=Tuning.parse(["spec_sample=0"]))
    dev, eng = spec(B, K, reqs, hook)
    assert eng.backend.device_spec and not heng.backend.device_spec
    assert {i: r.token_ids for i, r in dev.items()} == {i: r.token_ids for i, r in host.items()}
    sampled = [r.id for r in reqs if not r.sampling.greedy]
    acc = sum(dev[i].drafts_accepted for i in sampled)
    assert 0 < acc < sum(dev[i].drafts_proposed for i in sampled)


def test_sampled_host_path_b2():
    """A sampled and a greedy request share a step: the host path (schedule cut at the accept
    kernel) gives the greedy one the plain tokens."""
    reqs = requests("sampled")[:2]
    want = plain(requests(), "greedy")
    got, eng = spec(2, 1, reqs, forced(want))
    assert got["r1"].token_ids == want["r1"][0]
    assert len(got["r0"].token_ids) == MAX_TOKENS[0]
    assert got["r0"].token_ids != want["r0"][0]           # sampled: not the greedy stream
    assert got["r0"].drafts_proposed == MAX_TOKENS[0] - 1 - got["r0"].drafts_accepted


def test_refill_poisons_mtp_kv():
    be = EmuSpecBackend(PRESETS["tiny"], Lanes.make(2, pt=PT, mtp=1), tensors(), CTX)
    be.reset_slot(1)
    assert np.isnan(be.emu.get("mkc")[1]).all() and not np.isnan(be.emu.get("mkc")[0]).any()
    assert np.isnan(be.emu.get("kc")[:, 1]).all()
    be.emu.buf["slot"][1] = 1
    be.reset_slot(1)
    assert be.emu.get("slot")[1] == 0 and be.pos[1] == 0
    be.prefill([[], [1, 2, 3]], [None, None], {1: 3})
    with pytest.raises(RuntimeError, match=r"^slot 1: the program's position 3 is not the "
                                           r"position 4 of the token it feeds$"):
        be.verify({1: 5})
    # K/V the request did not write (poisoned as after a refill) read by the verify: an error
    kc = be.emu.buf["kc"].reshape(be.emu._shape("kc"))
    kc[:, 1, :, 1] = np.nan
    with pytest.raises(RuntimeError, match=r"^slot 1: NaN in the verify logits"):
        be.verify({1: 4})


def test_a_slot_mid_prompt_idles_in_a_verify_step():
    """A verify step over the decoding slots leaves a slot mid-prompt as it was: its recurrent
    state, conv ring, GDN state slot and position, and every K/V it wrote (the target's and the
    MTP's); its next chunk then continues the prompt (the greedy lock below shows the tokens)."""
    be = EmuSpecBackend(PRESETS["tiny"], Lanes.make(2, pt=PT, mtp=2), tensors(), CTX)
    for b in (0, 1):
        be.reset_slot(b)
    be.prefill([[5, 6, 7], [1, 2, 3, 4]], [None, 9], {0: 3})      # slot 0 decodes; 1 is mid-prompt
    be.emu.buf["slot"][1] = 2                                     # a state slot other than 0
    p = int(be.pos[1])

    def view(name):
        a = be.emu.buf[name].reshape(be.emu._shape(name))
        if name in ("pos", "slot"):                  # [B]
            return a[1].copy()
        if name in ("conv", "rec"):                  # [layers, B, …]
            return a[:, 1].copy()
        if name in ("kc", "vc"):                     # [layers, B, Hkv, T, D]: what it wrote
            return a[:, 1, :, :p].copy()
        return a[1, :, :p].copy()                    # mkc, mvc [B, Hkv, T, D]

    names = [n for n, spec in be.manifest["buffers"].items() if spec.get("state") or n == "pos"]
    assert {"pos", "slot", "conv", "rec", "kc", "vc", "mkc", "mvc"} <= set(names)
    before = {n: view(n) for n in names}
    kept = be.verify({0: 4}, idle=frozenset({1}))
    assert 1 <= len(kept[0]) <= 3 and set(kept) == {0}
    for n in names:
        assert np.array_equal(view(n), before[n], equal_nan=True), n
    assert be.pos[1] == p and be.emu.get("count")[1] == 0


def test_decoders_wait_for_at_most_one_chunk():
    """While prompts are fed, chunks and verify steps alternate: no two chunks in a row while a
    slot is decoding; the tokens are still the plain program's."""
    want = plain(requests(), "greedy")
    be = EmuSpecBackend(PRESETS["tiny"], Lanes.make(2, pt=PT, mtp=1), tensors(), CTX)
    eng = SpecEngine(be)
    log = []     # (kind, decoding slots at the step, slots mid-prompt)

    def wrap(kind, f):
        def g(*a, **k):
            run = eng.sched.running
            log.append((kind, {b for b, s in run.items() if not s.prefilling},
                        {b for b, s in run.items() if s.prefilling}))
            return f(*a, **k)
        return g

    be.prefill, be.verify = wrap("prefill", be.prefill), wrap("verify", be.verify)
    got = {r.id: (r.token_ids, r.finish_reason) for r in eng.run(requests())}
    assert got == want
    for (k0, d0, _), (k1, d1, _) in zip(log, log[1:]):
        assert not (k0 == k1 == "prefill" and d0 and d1), log
    # the case this is about happened: a verify step while a slot was mid-prompt
    assert any(k == "verify" and mid for k, _, mid in log)


def test_bad_use():
    cfg = PRESETS["tiny"]
    with pytest.raises(UserError, match=r"^EmuSpecBackend runs an mtp program; emit the lanes "
                                        r"with --mtp K$"):
        EmuSpecBackend(cfg, Lanes.make(1, pt=PT), {}, CTX)
    be = EmuSpecBackend(cfg, Lanes.make(1, pt=PT, mtp=1), tensors(), 4)
    with pytest.raises(ValueError, match=r"^a prefill chunk is 1 lists of at most 4 tokens$"):
        be.prefill([[1, 2, 3, 4, 5]], [None], {0: 5})
    be.pos[0] = 2
    with pytest.raises(ValueError, match=r"^slot 0: position 2 \+ 4 tokens passes the context 4$"):
        be.prefill([[1, 2, 3, 4]], [None], {0: 6})


class EmuRuntime:
    """The runtime's interface over the emulated schedule, recording how phases are run: a
    whole phase (``run_phase``: a CUDA graph replay on the GPU) or a list of launches."""

    def __init__(self, B, K, tuning=None):
        cfg = PRESETS["tiny"]
        lanes = Lanes.make(B, pt=PT, mtp=K, **({"tuning": tuning} if tuning else {}))
        self.inner = EmuSpecBackend(cfg, lanes, tensors(), CTX)
        self.emu, self.cfg, self.mtp = self.inner.emu, cfg, K
        self.manifest, self.tmax = self.inner.manifest, self.emu.tmax
        self.launches = {ph: [(ph, i) for i in range(len(s))]
                         for ph, s in self.manifest["schedule"].items() if isinstance(s, list)}
        self.log = []

    def reset(self):
        self.emu.reset()

    def reset_slot(self, b):
        self.inner._reset_state(b)

    def put(self, name, a):
        self.emu.put(name, a)

    def get(self, name):
        return self.emu.get(name)

    def run_phase(self, phase):
        self.log.append(("graph", phase))
        self.emu.run(phase)

    def launch_list(self, launches):
        self.log.append(("launches", launches[0][0], launches[0][1], len(launches)))
        for ph, i in launches:
            self.emu.run(ph, i, i + 1)


@pytest.mark.parametrize("host", [True, False])
def test_runtime_spec_backend_drives_the_program_as_the_emulator(host):
    """RuntimeSpecBackend (the GPU backend's host side) over a stand-in runtime that executes the
    schedule in numpy: the same tokens as EmuSpecBackend. With --tune spec_sample=0 (host)
    greedy-only steps replay a whole phase and a step with a sampled slot runs the two halves
    around the accept kernel; by default (the program judges sampled drafts) every verify step is
    one replay. A sampled prompt's first token is drawn on the host either way (the prefill cut
    before the MTP reads it)."""
    from qwen38gen.serve.spec_engine import RuntimeSpecBackend, spec_headroom

    s = requests("sampled")
    reqs = [s[3], s[0]]                       # greedy, then sampled (r0 and r2 sample)
    rt = EmuRuntime(1, 1, Tuning(spec_sample=False) if host else None)
    with pytest.raises(UserError, match=r"needs"):
        RuntimeSpecBackend(rt, rt.tmax)
    be = RuntimeSpecBackend(rt, rt.tmax - spec_headroom(1))
    assert be.device_spec == (not host)
    got = {r.id: r.token_ids for r in SpecEngine(be).run(reqs)}
    want, _ = spec(1, 1, reqs)
    assert got == {i: r.token_ids for i, r in want.items()}
    cut = be.cut["verify"]
    assert ("graph", "verify") in rt.log
    split = [("launches", "verify", 0, cut),
             ("launches", "verify", cut + 1, len(rt.launches["verify"]) - cut - 1)]
    assert all((e in rt.log) == host for e in split), rt.log
    assert ("launches", "prefill", 0, be.cut["prefill"]) in rt.log


@pytest.mark.slow
def test_context_cut_inside_a_kept_run():
    """A request that reaches the context (prompt 12 + 15 new tokens > CTX 20) stops where the
    plain engine stops ("length" at position CTX), with drafts forced right at K = 2."""
    rng = np.random.default_rng(3)
    reqs = [Request("long", tuple(int(t) for t in rng.integers(0, 1024, 12)), 15)]
    want = plain(reqs, "ctx")
    assert want["long"][1] == "length" and len(want["long"][0]) == CTX - 12 + 1
    got, eng = spec(1, 2, reqs, forced(want))
    assert (got["long"].token_ids, got["long"].finish_reason) == want["long"]
    assert eng.stats.drafts_accepted > 0


def test_chunks_are_packed_and_cost_what_they_carry():
    """An mtp program's prefill chunk is packed as a plain program's is (docs/KERNELS.md "Packed
    chunks"): it runs in the schedule emitted for the fewest rows that hold it (B = 3, pt = 4:
    8 rows, or all 12), the MTP rows over it included, and every request still gets the plain
    program's tokens."""
    lanes = Lanes.make(3, pt=PT, mtp=1)
    be = EmuSpecBackend(PRESETS["tiny"], lanes, tensors(), CTX)
    assert be.manifest["schedule"]["prefill_buckets"]["rows"] == [8, 12]
    ran, run = [], be._run
    be._run = lambda phase, a, b: (ran.append((phase, a)), run(phase, a, b))
    reqs = requests()
    got = {r.id: (r.token_ids, r.finish_reason) for r in SpecEngine(be).run(reqs)}
    assert got == plain(reqs, "greedy")
    chunks = [p for p, a in ran if p.startswith("prefill") and a == 0]
    # the first chunk carries 1 + 4 + 3 = 8 rows: the 8-row schedule, not B·pt = 12
    assert chunks[0] == "prefill_r8" and set(chunks) <= {"prefill_r8", "prefill"}

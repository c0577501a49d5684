"""`run --mtp K`: continuous batching over B slots of an mtp program (speculative decoding with
the MTP drafter, MODEL.md §8), on the emulated schedule or on the GPU.

The engine (``SpecEngine``) keeps engine.py's scheduler (admission into free slots, prefill
chunks, steps for the decoding slots) with one policy of its own: while prompts are being fed,
prefill chunks and verify steps alternate, so a decoding slot waits for at most one chunk (a
verify step's K+1 rows per slot do not ride in a chunk, as the plain engine's one row does; the
slots mid-prompt idle in it). Alternating gives the prompts and the decoders half the steps each
while both have work: a prompt's time to first token at most doubles, where the decoders used to
stand still for every chunk of every refill (at B = 64, most of the time). A chunk is packed, as
the plain engine's is (docs/KERNELS.md "Packed chunks"): it costs the prompt rows it carries,
not B·pt. A verify step runs the
program's ``verify`` schedule: each slot feeds [x, d_1 … d_K] (its last token and the MTP's
drafts, held on the device in ``vtok``) and advances by the 1 … K+1 tokens it keeps. The engine
appends them one at a time with engine.py's stop rule (stop ids, EOS, max_tokens, the context),
so a run that stops inside an accepted run cuts exactly where a plain run stops; the device
state past the cut is never used (the slot is free).

Token choice:

* Greedy requests: the program's accept kernel (n = drafts equal to the target's argmax); the
  tokens are the plain program's greedy tokens (tests/test_spec_engine.py locks them on the
  emulated schedule; on the device the same code runs with RuntimeSpecBackend).
* Sampled requests: the **host path**. The program's accept kernel is greedy only, so when some
  slot in the step samples, the backend runs the verify schedule up to the accept kernel, reads
  the K+1 rows of logits per slot, decides every slot on the host with numpy
  (spec_sampling.accept_row: speculative sampling against sampling.py's target law, keyed by
  (seed, position, purpose)), writes what the accept kernel would have written (the accepted
  tokens, the GDN state slot, the MTP row count, the next verify's first token) and runs the
  rest of the schedule (MTP rows over the kept tokens, the next drafts). The first token after
  the prompt is chosen the same way (the prefill schedule is cut before the MTP reads it):
  ``sampling.sample`` at that position, as the plain engine does. This reads B·(K+1)·V logits
  from the device per such step; it is correct, not fast, and runs only for programs built with
  ``--tune spec_sample=0``. By default (Tuning.spec_sample's table choice since version 31) the
  program decides instead: the sampler judges each verify row
  of a sampled slot by spec_sampling's integer rule (kernels/sampling.cuh, SPEC = 1) and
  spec_accept_sampled keeps the drafts, with the same tokens as the host path.

A refill resets the slot's target state (GDN recurrent state and conv ring, position, GDN state
slot) and its drafter state (the MTP KV cache: NaN-poisoned on the emulator, never read past what
the new request wrote). A slot that is not decoding idles in a verify step (ntok 0: the target's
and the MTP rows write nothing; spec_accept keeps its state slot and position). Only the K − 1
one-row draft steps run for every slot: their MTP cache writes land at or past the slot's
position, which the slot's own later rows write again before any row reads them.

Acceptance: per request, drafts proposed (K per verify step it took part in) and accepted (the
kept drafts of those steps, counted before a stop cuts the run); overall in ``MtpStats``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..compare import nonfinite_where
from ..errors import NonFiniteLogits, UserError
from ..inputs import put_chunk
from ..sampling import SamplingParams, pack_params, sample
from ..spec_sampling import accept_row
from .engine import Engine, Result, Sequence, Stats


@dataclass(frozen=True)
class MtpResult(Result):
    """A finished request with its drafts proposed and accepted."""

    drafts_proposed: int = 0
    drafts_accepted: int = 0

    @property
    def acceptance(self) -> float | None:
        return self.drafts_accepted / self.drafts_proposed if self.drafts_proposed else None


@dataclass
class MtpStats(Stats):
    """Stats of a speculative run: decode steps are verify steps."""

    mtp: int = 0
    drafts_proposed: int = 0
    drafts_accepted: int = 0
    busy_tokens: int = 0         # Σ over verify steps of the tokens the running slots kept

    @property
    def acceptance(self) -> float:
        return self.drafts_accepted / self.drafts_proposed if self.drafts_proposed else 0.0

    def as_dict(self) -> dict:
        d = super().as_dict()
        d.update(mtp=self.mtp, drafts_proposed=self.drafts_proposed,
                 drafts_accepted=self.drafts_accepted, acceptance=round(self.acceptance, 4),
                 tokens_per_verify=round(self.busy_tokens / max(1, self.busy_decode), 4))
        return d


class SpecEngine(Engine):
    """Engine over a speculative backend (``SpecProgramSlots``). Decoding sequences do not ride
    in prefill chunks (their step is a K+1-row verify); while prompts are fed, chunks and verify
    steps alternate (module docstring)."""

    ride = False
    chunk_waited = False     # the last step was a chunk while some slot was decoding

    def __init__(self, backend, eos_ids: tuple[int, ...] = (), draft_hook=None):
        """draft_hook(request, position, proposed) -> token: a test hook that replaces the MTP's
        draft for the token at ``position`` before a verify step (forcing drafts right or wrong
        exercises the accepted-run and the rejection paths; the kept tokens stay the target's)."""
        super().__init__(backend, eos_ids)
        self.draft_hook = draft_hook
        self.stats = MtpStats(slots=backend.slots, chunk=backend.chunk, mtp=backend.k)
        self.drafts: dict[int, list[int]] = {}     # slot -> [proposed, accepted]

    def _finish(self, seq: Sequence, done: list) -> None:
        p, a = self.drafts.pop(seq.slot)
        self.sched.finish(seq)
        done.append(MtpResult(seq.req.id, seq.req.prompt, seq.out, seq.finish_reason,
                              drafts_proposed=p, drafts_accepted=a))

    def step(self) -> list[MtpResult]:
        be = self.backend
        for seq in self.sched.admit():
            be.reset_slot(seq.slot)
            be.set_sampling(seq.slot, seq.req.sampling)
            self.drafts[seq.slot] = [0, 0]
        plan = self.sched.schedule()
        if plan is None:
            return []
        kind, feed = plan
        running, done = self.sched.running, []
        decoding = sorted(b for b, s in running.items() if not s.prefilling)
        if kind == "prefill" and decoding and self.chunk_waited:
            kind, feed = "decode", {b: [running[b].out[-1]] for b in decoding}
        self.chunk_waited = kind == "prefill" and bool(decoding)
        self._count_room()
        if kind == "prefill":
            chunks, nexts, ends = [[] for _ in range(be.slots)], [None] * be.slots, {}
            for b, toks in feed.items():
                seq = running[b]
                chunks[b] = toks
                end = seq.fed + len(toks)
                if end < len(seq.req.prompt):
                    nexts[b] = seq.req.prompt[end]
                else:
                    ends[b] = len(seq.req.prompt)
            chosen = be.prefill(chunks, nexts, ends)
            self.stats.prefill_steps += 1
            self.stats.busy_prefill += len(feed)
            self.stats.prompt_rows += sum(len(t) for t in feed.values())
            for b, toks in feed.items():
                seq = running[b]
                seq.fed += len(toks)
                if b in ends:
                    self._choose(seq, chosen[b])
                    if seq.finish_reason:
                        self._finish(seq, done)
            return done
        hook = None if self.draft_hook is None else (
            lambda b, position, d: self.draft_hook(running[b].req, position, d))
        kept = be.verify({b: running[b].position for b in feed}, hook,
                         idle=frozenset(running) - set(feed))
        self.stats.decode_steps += 1
        self.stats.busy_decode += len(feed)
        for b in feed:
            seq, toks = running[b], kept[b]
            self.drafts[b][0] += be.k
            self.drafts[b][1] += len(toks) - 1
            self.stats.drafts_proposed += be.k
            self.stats.drafts_accepted += len(toks) - 1
            self.stats.busy_tokens += len(toks)
            for t in toks:
                self._choose(seq, t)
                if seq.finish_reason:
                    self._finish(seq, done)
                    break
        return done


def cut_index(manifest: dict, phase: str, family: str) -> int:
    """Index of the first launch of ``family`` in a schedule (where the host path cuts it)."""
    for i, L in enumerate(manifest["schedule"][phase]):
        if manifest["kernels"][L["k"]]["family"] == family:
            return i
    raise ValueError(f"the {phase} schedule has no {family} launch; not an mtp program")


def spec_headroom(k: int) -> int:
    """Cache positions past the context that a verify step may write: the target's K+1 rows
    from the last position and the MTP draft rows after the kept tokens (at most 2K − 1)."""
    return 2 * k


class SpecProgramSlots:
    """B slots of an mtp program (what the emulated and the GPU backend share). A subclass says
    how to put and get a buffer, run a range of a schedule's launches, and reset a slot.

    ``ctx``: positions a request may use (as the plain backends' ctx); the program's cache holds
    ``ctx + spec_headroom(k)``. The host keeps every slot's position and puts it before a step.
    """

    slots: int
    chunk: int
    vocab: int
    ctx: int
    k: int
    manifest: dict
    check_logits = False     # read the logits of greedy-only steps too, for _check_rows

    def _put(self, name: str, a: np.ndarray) -> None:
        raise NotImplementedError

    def _get(self, name: str) -> np.ndarray:
        raise NotImplementedError

    def _run(self, phase: str, start: int, stop: int | None) -> None:
        raise NotImplementedError

    def _reset_state(self, slot: int) -> None:
        raise NotImplementedError

    def _check_rows(self, what: str, rows: dict[int, np.ndarray]) -> None:
        """The engine's NaN guard over the logits rows the host read (every backend; on the
        emulator a NaN also means a read of poisoned K/V past a slot's position)."""
        for b, r in rows.items():
            where = nonfinite_where(np.asarray(r, dtype=np.float32), "row")
            if where:
                raise NonFiniteLogits(f"slot {b}: NaN in the {what} logits or another "
                                      f"non-finite value: {where}")

    def _setup(self, manifest: dict, ctx: int) -> None:
        lanes, sched = manifest["lanes"], manifest["schedule"]
        self.k = int(lanes.get("mtp", 0))
        if not self.k or "verify" not in sched:
            raise UserError(f"program {manifest.get('lane_name')} is not an mtp program; emit it "
                            "with --mtp K")
        if ctx < 1:
            raise UserError(f"ctx {ctx} must be ≥ 1")
        self.manifest = manifest
        self.slots, self.chunk, self.ctx = lanes["batch"], sched["prefill_pt"], ctx
        # where the host path cuts each prefill schedule (packed chunks: one per row count) and
        # the verify schedule
        self.cut = {ph: cut_index(manifest, ph, "spec_tokens")
                    for ph in sched if ph == "prefill" or ph.startswith("prefill_r")}
        self.cut["verify"] = cut_index(manifest, "verify", "spec_accept")
        self.params = [SamplingParams()] * self.slots
        self.pos = np.zeros(self.slots, np.int64)
        # Tuning.spec_sample: the program judges sampled slots' drafts itself (sampling.cuh,
        # SPEC = 1) from per-slot parameters in samp_fpar / samp_upar
        self.device_spec = "sacc" in manifest["buffers"]
        self._fpar, self._upar, _ = pack_params(self.params, [0] * self.slots)
        self._stale = True

    def set_sampling(self, slot: int, params: SamplingParams) -> None:
        self.params[slot] = params
        if not self.device_spec:            # the host path reads self.params only
            return
        f, u, _ = pack_params([params], [0])
        self._fpar[slot], self._upar[slot] = f[0], u[0]
        self._stale = True

    def reset_slot(self, slot: int) -> None:
        if not 0 <= slot < self.slots:
            raise ValueError(f"slot {slot} is outside 0..{self.slots - 1}")
        self._reset_state(slot)
        self.pos[slot] = 0

    def _put_pos(self) -> None:
        self._put("pos", self.pos.astype(np.int32))

    def prefill(self, chunks: list[list[int]], nexts: list[int | None],
                ends: dict[int, int]) -> dict[int, int]:
        """Feed ``chunks[b]`` (empty: slot b waits); ``nexts[b]``: the prompt token after the
        chunk (None where the prompt ends in it); ``ends``: {slot: position of its first new
        token} for the prompts that end here. Returns {slot: first token} for those."""
        B, pt, KP = self.slots, self.chunk, self.k + 1
        if len(chunks) != B or any(len(c) > pt for c in chunks):
            raise ValueError(f"a prefill chunk is {B} lists of at most {pt} tokens")
        for b, c in enumerate(chunks):
            if self.pos[b] + len(c) > self.ctx:
                raise ValueError(f"slot {b}: position {self.pos[b]} + {len(c)} tokens passes the "
                                 f"context {self.ctx}")
        keep = self._get("vtok").reshape(B, KP).copy()  # waiting slots' next verify rows
        self._put_pos()
        # packed (pt > 1): the chunk's rows only; mnext: the token after each row, −1: the chosen one
        phase = put_chunk(self._put, self.manifest["schedule"], chunks, nexts)
        sampled = [b for b in ends if not self.params[b].greedy]
        if sampled:
            cut = self.cut[phase]
            self._run(phase, 0, cut)
            lg = self._get("logits").reshape(-1, self.vocab)
            self._check_rows("prefill", {b: lg[b] for b in ends})
            nxt = self._get("next").reshape(-1).copy()
            for b in sampled:
                nxt[b] = sample(lg[b], self.params[b], ends[b])
            self._put("next", nxt.astype(np.int32))
            self._run(phase, cut, None)
        else:
            self._run(phase, 0, None)
            if ends and self.check_logits:
                lg = self._get("logits").reshape(-1, self.vocab)
                self._check_rows("prefill", {b: lg[b] for b in ends})
        nxt = self._get("next").reshape(-1)
        v = self._get("vtok").reshape(B, KP)
        for b in range(B):
            if b not in ends:
                v[b] = keep[b]
        self._put("vtok", v.reshape(-1).astype(np.int32))
        self.pos += np.fromiter((len(c) for c in chunks), np.int64, B)
        return {b: int(nxt[b]) for b in ends}

    def verify(self, positions: dict[int, int], draft_hook=None,
               idle: frozenset[int] = frozenset()) -> dict[int, list[int]]:
        """One verify step of every slot in ``positions`` ({slot: position of the token being
        chosen}, = the slot's position + 1); returns {slot: the 1 … K+1 tokens it keeps}. The
        other slots idle (ntok 0: no row of theirs is real, no state is written, their position
        does not move); ``idle`` names those holding a request (a prompt being fed), the rest are
        free. draft_hook(slot, position, proposed) -> token replaces drafts first (a test hook)."""
        B, KP = self.slots, self.k + 1
        for b, p in positions.items():
            if p != self.pos[b] + 1:
                raise RuntimeError(f"slot {b}: the program's position {self.pos[b]} is not the "
                                   f"position {p - 1} of the token it feeds")
        for b in range(B):
            if b not in positions and b not in idle:
                self.pos[b] = 0     # a free slot: its one-row MTP draft steps stay in the cache
        if draft_hook is not None:
            vt = self._get("vtok").reshape(B, KP).copy()
            for b in positions:
                for j in range(1, KP):
                    vt[b, j] = draft_hook(b, int(self.pos[b]) + j, int(vt[b, j]))
            self._put("vtok", vt.reshape(-1).astype(np.int32))
        self._put_pos()
        self._put("ntok", np.array([KP if b in positions else 0 for b in range(B)], np.int32))
        sampled = [b for b in positions if not self.params[b].greedy]
        if self.device_spec:                  # the program decides sampled slots itself
            if self._stale:                   # (a greedy slot's row says so too: upload always)
                self._put("samp_fpar", self._fpar)
                self._put("samp_upar", self._upar.view(np.int32))
                self._stale = False
            sampled = []
        if not sampled:
            self._run("verify", 0, None)
            if self.check_logits:
                lg = self._get("logits").reshape(B, KP, self.vocab)
                self._check_rows("verify", {b: lg[b] for b in positions})
            em, cnt = self._get("emit").reshape(B, KP), self._get("count").reshape(-1)
            kept = {b: [int(t) for t in em[b, :int(cnt[b])]] for b in positions}
        else:
            cut = self.cut["verify"]
            self._run("verify", 0, cut)
            lg = self._get("logits").reshape(B, KP, self.vocab)
            self._check_rows("verify", {b: lg[b] for b in positions})
            am = self._get("vnext").reshape(B, KP)
            vt = self._get("vtok").reshape(B, KP)
            kept = {}
            # what the accept kernel writes; an idle slot keeps its state slot and vtok row
            vnext, slot = am.copy(), self._get("slot").reshape(-1).astype(np.int32)
            nm, count = np.zeros(B, np.int32), np.zeros(B, np.int32)
            emit = np.full((B, KP), -1, np.int32)
            for b in positions:
                toks = accept_row(lg[b], vt[b, 1:], self.params[b], positions[b], am[b])
                kept[b] = toks
                n = len(toks) - 1
                vnext[b, :n + 1] = toks
                slot[b], nm[b], count[b] = n, n + 1, n + 1
                emit[b, :n + 1] = toks
                vt[b, 0] = toks[-1]
            for name, a in (("vnext", vnext), ("slot", slot), ("ntok_m", nm), ("emit", emit),
                            ("count", count), ("vtok", vt)):
                self._put(name, np.asarray(a).reshape(-1).astype(np.int32))
            self._run("verify", cut + 1, None)
        for b, toks in kept.items():
            if not 1 <= len(toks) <= KP:
                raise RuntimeError(f"slot {b}: the verify step kept {len(toks)} tokens")
            self.pos[b] += len(toks)
        return kept


class RuntimeSpecBackend(SpecProgramSlots):
    """B slots of an mtp program on the GPU (``runtime.Runtime``, its cache ctx + 2K positions).
    Unverified on a GPU: it is written from the runtime's code; the greedy-only steps replay the
    phase's CUDA graph, a step with a sampled slot launches the two halves of the schedule
    without a graph (the host path)."""

    def __init__(self, rt, ctx: int):
        if rt.tmax < ctx + spec_headroom(rt.mtp):
            raise UserError(f"the runtime holds {rt.tmax} positions; ctx {ctx} with --mtp "
                            f"{rt.mtp} needs {ctx + spec_headroom(rt.mtp)}")
        self.rt = rt
        self._setup(rt.manifest, ctx)
        self.vocab = rt.cfg.vocab_size
        rt.reset()

    def _put(self, name, a):
        self.rt.put(name, a)

    def _get(self, name):
        return self.rt.get(name)

    def _run(self, phase, start, stop):
        if start == 0 and stop is None:
            self.rt.run_phase(phase)
        else:
            self.rt.launch_list(self.rt.launches[phase][start:stop])

    def _reset_state(self, slot):
        self.rt.reset_slot(slot)

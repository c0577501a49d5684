"""Continuous batching over B recurrent-state slots: a scheduler, an engine, a backend protocol.

Shape (after nano-vllm's engine: step = schedule → run → postprocess): requests wait in a
queue; B slots hold running sequences. A step is either a **prefill chunk** or a **decode step**:

* Admission: at the start of every step, each free slot takes the next waiting request (first
  come, first served, lowest free slot first); the backend resets that slot (recurrent state,
  conv ring and position to zero; the KV cache is left as it is: attention reads only positions
  below the slot's position, so the old request's K/V past the new one's length is never read).
* Prefill first: while any running sequence still has prompt tokens to feed, the step is a
  prefill chunk. Each such sequence feeds its next ``chunk`` tokens (prompt tokens c·pt … of its
  own prompt, so a prompt is cut the same way whatever the slot or the other requests), and every
  decoding sequence **rides along**: it feeds its last token as a one-token chunk and chooses its
  next token from that row, as a decode step would. A sequence whose prompt ends in the chunk
  chooses its first token from the logits of its last row.
* Otherwise a decode step: every decoding sequence feeds its last token and chooses the next.

A chunk costs what it carries: the program takes it packed (docs/KERNELS.md "Packed chunks"),
each slot's rows after the previous slot's, in the schedule emitted for the fewest rows that hold
them, so 63 riding decoders and one slot's 16 prompt tokens are 79 rows, not B·pt = 1 024. The
policy: every prefilling slot takes up to ``chunk`` prompt tokens a step (first come first
served, the smallest cut a prompt can have in the program's chunk width), every decoding slot
one; with packing, a step's rows are at most B·pt, and its cost rises with them only where the
GEMVs turn from weight-bound to arithmetic-bound (hundreds of rows on the 27B), so no token
budget below B·pt is imposed.

Riding is exact because a row's arithmetic does not depend on whether its step is a prefill
chunk or a decode step, on B or on its neighbours (docs/MODEL.md §7, "One arithmetic for every
row"): every GEMV kernel gives gemv_q4's bits at any row count, the GDN kernel runs a chunk token
by token with the decode step's recurrence, and attention's splits depend on the row's length
only. tests/gpu/test_engine.py checks it on the device (a request alone, decoded by decode steps,
against the same request riding in other requests' chunks); tests/test_engine.py on the CPU.
``ride=False`` (the speculative engine, whose verify step is not a one-row decode) keeps the
decoding sequences waiting (0 tokens in a chunk: their state does not move). ``Stats`` counts
the steps (prefill chunks, decode steps), the rows they carry, slot occupancy, and the steps
lockstep batching would have taken for the same outputs.

Where the backend chooses the tokens itself (``samples``: the program's argmax and its sample phase,
kernels/sampling.cuh), the engine hands it each slot's sampling parameters when the slot takes a
request (``set_sampling``) and asks for the chosen tokens after each step (``choose``) instead of
reading logits; the rule is the same (sampling.py is its numpy twin).

The engine's NaN guard: every row of logits a token is chosen from on the host is scanned whole,
and a non-finite value stops the run (``NonFiniteLogits``, naming the request, its slot and the
position). Where the backend chooses on the device, the rows are read back and scanned only with
``check_finite`` (the locks set it; serving leaves it off, since it costs a B x V copy a step).

A sequence stops after a token of its stop ids or (unless ignore_eos) of the end-of-sequence ids
("stop", the token kept), at max_tokens new tokens or when its slot's context is full
("length"). Tokens are chosen by ``sampling.sample`` keyed by (seed, position), so a request's
tokens do not depend on its slot, on B or on the other requests.
"""

from __future__ import annotations

import time

from collections import deque
from dataclasses import dataclass, field
from typing import Callable, Protocol

import numpy as np

from ..compare import nonfinite_where
from ..errors import NonFiniteLogits, UserError
from ..sampling import sample
from .requests import Request


class Backend(Protocol):
    """B slots of model state that the engine advances.

    ``slots`` (B), ``chunk`` (prefill tokens per slot per chunk), ``vocab`` and ``ctx`` (positions
    a slot holds: tokens fed at positions 0 … ctx−1).
    """

    slots: int
    chunk: int
    vocab: int
    ctx: int

    def reset_slot(self, slot: int) -> None:
        """A fresh, empty sequence in ``slot``."""

    def prefill(self, chunks: list[list[int]]) -> list[np.ndarray | None]:
        """Feed ``chunks[b]`` (0 … chunk tokens; empty: slot b idles) to each slot; return per slot
        the float logits [vocab] of its last fed row, None for an idle slot."""

    def decode(self, tokens: list[int | None]) -> np.ndarray:
        """Feed one token to each slot with a token (None: idles); return logits [slots, vocab]
        (rows of idle slots are unspecified)."""

    # A backend with ``samples = True`` chooses tokens on its side (its logits may be None):
    #   set_sampling(slot, params): the parameters of the request the slot took;
    #   choose({slot: position}) -> {slot: token}: after a step, the token each of these slots
    #   chooses at that position (the position of the token being chosen).


@dataclass(slots=True)
class Sequence:
    """A running request in a slot. (Read for every slot at every step: at B = 64 the host's
    share of a tiny step is mostly this bookkeeping, hence slots and the prompt's length kept.)"""

    req: Request
    slot: int
    fed: int = 0                                  # prompt tokens fed so far
    out: list[int] = field(default_factory=list)
    finish_reason: str | None = None
    n_prompt: int = field(init=False)

    def __post_init__(self) -> None:
        self.n_prompt = len(self.req.prompt)

    @property
    def prefilling(self) -> bool:
        return self.fed < self.n_prompt

    @property
    def position(self) -> int:
        """Position of the next token to choose (tokens before it: prompt + generated)."""
        return self.n_prompt + len(self.out)


@dataclass(frozen=True)
class Result:
    """A finished request."""

    id: object
    prompt: tuple[int, ...]
    token_ids: list[int]
    finish_reason: str
    text: str | None = None


@dataclass
class Stats:
    """What the run cost, in steps of the backend and the rows they carried."""

    slots: int = 0
    chunk: int = 0
    prefill_steps: int = 0       # steps that carry prompt rows (decode rows may ride in them)
    decode_steps: int = 0        # steps of decode rows only
    busy_prefill: int = 0        # Σ over steps of the slots that fed prompt tokens
    busy_decode: int = 0         # Σ over steps of the slots that fed a decode token
    decode_carriers: int = 0     # steps in which some sequence was decoding (fed or waited)
    decode_room: int = 0         # Σ over those steps of the slots not feeding prompt tokens
    prompt_rows: int = 0         # prompt tokens fed
    lockstep_steps: int = 0      # what B-at-a-time lockstep batches would take for these outputs
    requests: int = 0
    output_tokens: int = 0

    @property
    def steps(self) -> int:
        return self.prefill_steps + self.decode_steps

    @property
    def occupancy(self) -> float:
        """Mean share of the B slots that fed tokens in a step (a slot feeds prompt tokens or a
        decode token in a step, never both)."""
        return (self.busy_prefill + self.busy_decode) / max(1, self.steps * self.slots)

    @property
    def decode_occupancy(self) -> float:
        """Of the slots not feeding prompt tokens in the steps in which some sequence was
        decoding, the share that fed a decode token: 1 − the share that idled (a decoder waiting
        behind a prefill chunk, or an empty slot)."""
        return self.busy_decode / max(1, self.decode_room)

    def as_dict(self) -> dict:
        return {"slots": self.slots, "chunk": self.chunk, "requests": self.requests,
                "output_tokens": self.output_tokens, "steps": self.steps,
                "prefill_steps": self.prefill_steps, "decode_steps": self.decode_steps,
                "prompt_rows": self.prompt_rows, "decode_rows": self.busy_decode,
                "occupancy": round(self.occupancy, 4),
                "decode_occupancy": round(self.decode_occupancy, 4),
                "lockstep_steps": self.lockstep_steps}


def lockstep_steps(results: list[Result], slots: int, chunk: int) -> int:
    """Steps of today's lockstep loop for the same outputs: batches of B requests in order, each
    prefilling its longest prompt and decoding to its longest output."""
    n = 0
    for i in range(0, len(results), slots):
        batch = results[i:i + slots]
        n += max(-(-len(r.prompt) // chunk) for r in batch)
        n += max(len(r.token_ids) for r in batch) - 1
    return n


def check_request(req: Request, ctx: int, vocab: int) -> None:
    """A request a backend of ``ctx`` positions and ``vocab`` tokens can run, or UserError."""
    if len(req.prompt) > ctx:
        raise UserError(f"request {req.id!r}: the prompt has {len(req.prompt)} tokens, more "
                        f"than the context of {ctx}; pass a larger --ctx")
    bad = [t for t in req.prompt if not 0 <= t < vocab]
    if bad:
        raise UserError(f"request {req.id!r}: token id {bad[0]} is outside the vocabulary "
                        f"0..{vocab - 1}")


class Scheduler:
    """Waiting queue, B slots, and the choice of the next step (see the module docstring)."""

    def __init__(self, slots: int, chunk: int, ride: bool = True):
        self.slots, self.chunk, self.ride = slots, chunk, ride
        self.waiting: deque[Request] = deque()
        self.running: dict[int, Sequence] = {}

    def add(self, req: Request) -> None:
        self.waiting.append(req)

    def admit(self) -> list[Sequence]:
        """Fill free slots from the waiting queue; the new sequences (their slots need a reset)."""
        new = []
        for b in range(self.slots):
            if b not in self.running and self.waiting:
                self.running[b] = Sequence(self.waiting.popleft(), b)
                new.append(self.running[b])
        return new

    def schedule(self) -> tuple[str, dict[int, list[int]]] | None:
        """("prefill", {slot: tokens}) while a prompt is unfinished: the prefilling slots' next
        chunk and (``ride``) every decoding slot's last token; else ("decode", {slot: [last
        token]}); None when nothing runs."""
        run, c = self.running, self.chunk
        if any(s.fed < s.n_prompt for s in run.values()):
            feed = {}
            for b in sorted(run):
                s = run[b]
                if s.fed < s.n_prompt:
                    feed[b] = list(s.req.prompt[s.fed:s.fed + c])
                elif self.ride:
                    feed[b] = [s.out[-1]]
            return "prefill", feed
        if run:
            return "decode", {b: [run[b].out[-1]] for b in sorted(run)}
        return None

    def finish(self, seq: Sequence) -> None:
        del self.running[seq.slot]


class Engine:
    """Runs requests through a backend with continuous batching."""

    ride = True     # decoding sequences ride in prefill chunks (module docstring)

    def __init__(self, backend: Backend, eos_ids: tuple[int, ...] = (),
                 check_finite: bool = False):
        self.backend = backend
        self.eos = frozenset(eos_ids)
        self.check_finite = check_finite
        self.sched = Scheduler(backend.slots, backend.chunk, self.ride)
        self.stats = Stats(slots=backend.slots, chunk=backend.chunk)

    def add(self, req: Request) -> None:
        check_request(req, self.backend.ctx, self.backend.vocab)
        self.sched.add(req)
        self.stats.requests += 1

    def _choose(self, seq: Sequence, t: int) -> None:
        seq.out.append(t)
        self.stats.output_tokens += 1
        if t in seq.req.stop_ids or (t in self.eos and not seq.req.ignore_eos):
            seq.finish_reason = "stop"
        elif len(seq.out) >= seq.req.max_tokens or seq.position > self.backend.ctx:
            seq.finish_reason = "length"

    def _guard(self, seq: Sequence, row: np.ndarray) -> None:
        where = nonfinite_where(np.asarray(row, dtype=np.float32), "logits")
        if where:
            raise NonFiniteLogits(f"request {seq.req.id!r} (slot {seq.slot}, position "
                                  f"{seq.position}): non-finite {where}")

    def _count_room(self) -> None:
        """Stats.decode_occupancy's denominator, for the step about to run."""
        running = self.sched.running
        prefilling = sum(1 for s in running.values() if s.fed < s.n_prompt)
        if prefilling < len(running):
            self.stats.decode_carriers += 1
            self.stats.decode_room += self.backend.slots - prefilling

    def step(self) -> list[Result]:
        """Admit, run one prefill chunk or decode step, choose tokens; the requests it finished."""
        device = getattr(self.backend, "samples", False)
        for seq in self.sched.admit():
            self.backend.reset_slot(seq.slot)
            if device:
                self.backend.set_sampling(seq.slot, seq.req.sampling)
        plan = self.sched.schedule()
        if plan is None:
            return []
        kind, feed = plan
        B = self.backend.slots
        running = self.sched.running
        chose: list[tuple[Sequence, np.ndarray]] = []
        self._count_room()
        if kind == "prefill":
            rows = self.backend.prefill([feed.get(b, []) for b in range(B)])
            self.stats.prefill_steps += 1
            riders = 0
            for b, toks in feed.items():
                seq = running[b]
                if seq.fed < seq.n_prompt:
                    seq.fed += len(toks)
                    self.stats.busy_prefill += 1
                    self.stats.prompt_rows += len(toks)
                    if seq.fed >= seq.n_prompt:
                        chose.append((seq, rows[b]))
                else:                                  # a decoding sequence riding along
                    riders += 1
                    chose.append((seq, rows[b]))
            self.stats.busy_decode += riders
        else:
            logits = self.backend.decode([feed[b][0] if b in feed else None for b in range(B)])
            self.stats.decode_steps += 1
            self.stats.busy_decode += len(feed)
            chose = [(running[b], None if logits is None else logits[b]) for b in feed]
        if device and self.check_finite and chose:
            lg = self.backend.logits()
            chose = [(seq, lg[seq.slot]) for seq, _ in chose]
        for seq, row in chose:
            if row is not None:
                self._guard(seq, row)
        if device:
            picked = self.backend.choose({seq.slot: seq.n_prompt + len(seq.out) for seq, _ in chose})
            tokens = [picked[seq.slot] for seq, _ in chose]
        else:
            tokens = [sample(row, seq.req.sampling, seq.position) for seq, row in chose]
        done = []
        for (seq, _), t in zip(chose, tokens):
            self._choose(seq, t)
            if seq.finish_reason:
                self.sched.finish(seq)
                done.append(Result(seq.req.id, seq.req.prompt, seq.out, seq.finish_reason))
        return done

    def run(self, requests: list[Request],
            on_finish: Callable[[Result], None] | None = None,
            on_step: Callable[[list[Result]], None] | None = None,
            arrivals: list[float] | None = None, clock: Callable[[], float] = time.perf_counter,
            sleep: Callable[[float], None] = time.sleep) -> list[Result]:
        """Every request to completion; results in the order they finished (on_finish as each
        finishes; on_step after every step, with the requests it finished, while the running
        sequences are still in ``self.sched.running``). Stats are in ``self.stats``.

        ``arrivals[i]``: seconds after the start (``self.t0``, on ``clock``) at which request i
        joins the queue (default: all at once); with nothing to run the engine sleeps until the
        next arrival. Every request is checked before the first step either way."""
        for r in requests:
            check_request(r, self.backend.ctx, self.backend.vocab)
        if arrivals is None:
            arrivals = [0.0] * len(requests)
        if len(arrivals) != len(requests):
            raise ValueError(f"{len(arrivals)} arrival times for {len(requests)} requests")
        pending = deque(sorted(zip(arrivals, range(len(requests)))))
        results = []
        self.t0 = clock()
        while pending or self.sched.waiting or self.sched.running:
            now = clock() - self.t0
            while pending and pending[0][0] <= now:
                self.add(requests[pending.popleft()[1]])
            if not (self.sched.waiting or self.sched.running):
                sleep(pending[0][0] - now)
                continue
            done = self.step()
            if on_step is not None:
                on_step(done)
            for res in done:
                results.append(res)
                if on_finish is not None:
                    on_finish(res)
        by_id = {r.id: r for r in results}
        self.stats.lockstep_steps = lockstep_steps([by_id[r.id] for r in requests],
                                                   self.backend.slots, self.backend.chunk)
        return results

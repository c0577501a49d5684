"""`check --serve`: the continuous-batching lock on a backend of B slots.

N = 2B + 1 requests (prompts of 1 to 3 prefill chunks, different max_tokens, greedy and sampled
alternating) run each alone (the only request: slot 0, the other slots idle), then all together
through the B slots with continuous batching, on the same program; every request must get exactly
the tokens and finish reason it got alone. The batched run starts on the slots the alone runs
left behind, so a slot reset that misses any state shows.

On a GPU the backends are the emitted programs on the PyCUDA runtime (``RuntimeBackend``); without
one the same lock runs on the emulated schedule (``EmuBackend``: the program's schedule in numpy,
not the CUDA kernels), and the caller says so.

With --mtp K (``spec_serve_lock``) the batched run is the speculative engine on the mtp program
(spec_engine.py); a greedy request must get exactly the plain program's tokens (run alone on
it), a sampled one the tokens it gets alone on the mtp program (speculative sampling is exact in
distribution, not token for token: tests/test_spec_sampling.py) and the plain program's first
token (chosen by the same rule before any draft).
"""

from __future__ import annotations

from contextlib import contextmanager, nullcontext

import numpy as np

from ..config import ModelConfig
from ..sampling import SamplingParams
from ..serve.engine import Engine, NonFiniteLogits, Result, Stats
from ..serve.requests import Request, default_seed
from ..weights import default_tensors
from .check import Outcome

SEED = 2024


def lock_requests(slots: int, chunk: int, vocab: int) -> list[Request]:
    """2B + 1 requests: prompt lengths 1 … 3 chunks, max_tokens 1 … 8, every other one sampled
    (temperature 0.8, its own seed; top_p / top_k on some)."""
    rng = np.random.default_rng(SEED)
    out = []
    for i in range(2 * slots + 1):
        n = 1 + (7 * i) % (3 * chunk)
        m = 1 + (3 * i + 2) % 8
        sp = SamplingParams()
        if i % 2:
            sp = SamplingParams(temperature=0.8, seed=default_seed(SEED, i),
                                top_p=0.9 if i % 4 == 1 else 1.0, top_k=40 if i % 3 == 0 else -1)
        prompt = tuple(int(t) for t in rng.integers(0, vocab, n))
        out.append(Request(f"q{i}", prompt, m, ignore_eos=True, sampling=sp))
    return out


def run_alone(backend, requests: list[Request]) -> dict[object, Result]:
    """Each request alone on the backend (the only one running)."""
    out = {}
    for r in requests:
        (res,) = Engine(backend, check_finite=True).run([r])
        out[r.id] = res
    return out


def serve_lock(backend_of, slots: int, chunk: int, cfg: ModelConfig) -> tuple[Outcome, Stats]:
    """``backend_of(B)``: a context manager giving the backend of B slots. The outcome rows: id,
    prompt, max_tokens, mode, tokens, status."""
    reqs = lock_requests(slots, chunk, cfg.vocab_size)
    with backend_of(slots) as be:
        try:
            alone = run_alone(be, reqs)
            eng = Engine(be, check_finite=True)
            got = {r.id: r for r in eng.run(reqs)}
        except NonFiniteLogits as e:   # a broken program fails the lock, saying where
            out = Outcome(ok=False, notes=[f"FAIL: {e}"])
            return out, Stats(slots=slots, chunk=chunk)
    out = Outcome(ok=True)
    for r in reqs:
        a, g = alone[r.id], got[r.id]
        ok = (a.token_ids, a.finish_reason) == (g.token_ids, g.finish_reason)
        out.ok &= ok
        out.rows.append([str(r.id), str(len(r.prompt)), str(r.max_tokens),
                         "greedy" if r.sampling.greedy else "sampled", str(len(g.token_ids)),
                         "ok" if ok else "MISMATCH"])
    s = eng.stats
    out.notes.append(f"{len(reqs)} requests through {slots} slots: {s.steps} steps (prefill "
                     f"{s.prefill_steps}, decode {s.decode_steps}), slot occupancy "
                     f"{s.occupancy:.2f}; lockstep batches would take {s.lockstep_steps} steps")
    return out, s


def spec_serve_lock(plain_of, spec_of, slots: int, chunk: int,
                    cfg: ModelConfig) -> tuple[Outcome, Stats]:
    """The lock of ``run --mtp K`` (see the module docstring): ``plain_of(B)`` and ``spec_of(B)``
    give the plain and the mtp program's backends. Rows: id, prompt, max_tokens, mode, tokens,
    acceptance, status."""
    from ..serve.spec_engine import MtpStats, SpecEngine

    reqs = lock_requests(slots, chunk, cfg.vocab_size)
    with plain_of(slots) as be:
        plain = run_alone(be, reqs)
    with spec_of(slots) as be:
        be.check_logits = True    # every step's rows guarded, sampled on the device or not
        try:
            alone = {r.id: SpecEngine(be).run([r])[0] for r in reqs}
            eng = SpecEngine(be)
            got = {r.id: r for r in eng.run(reqs)}
        except NonFiniteLogits as e:   # a broken program fails the lock, saying where
            return Outcome(ok=False, notes=[f"FAIL: {e}"]), MtpStats(slots=slots, chunk=chunk)
    out = Outcome(ok=True)
    for r in reqs:
        p, a, g = plain[r.id], alone[r.id], got[r.id]
        same = (a.token_ids, a.finish_reason) == (g.token_ids, g.finish_reason)
        if r.sampling.greedy:
            ok = same and (p.token_ids, p.finish_reason) == (g.token_ids, g.finish_reason)
        else:
            ok = same and p.token_ids[0] == g.token_ids[0]
        out.ok &= ok
        acc = "-" if g.acceptance is None else f"{g.acceptance:.2f}"
        out.rows.append([str(r.id), str(len(r.prompt)), str(r.max_tokens),
                         "greedy" if r.sampling.greedy else "sampled", str(len(g.token_ids)),
                         acc, "ok" if ok else "MISMATCH"])
    s = eng.stats
    out.notes.append(f"{len(reqs)} requests through {slots} slots with --mtp {s.mtp}: {s.steps} "
                     f"steps (prefill {s.prefill_steps}, verify {s.decode_steps}), slot occupancy "
                     f"{s.occupancy:.2f}; acceptance {s.acceptance:.2f} ({s.drafts_accepted} of "
                     f"{s.drafts_proposed} drafts)")
    return out, s


def ctx_for(slots: int, chunk: int, vocab: int) -> int:
    return max(len(r.prompt) + r.max_tokens - 1 for r in lock_requests(slots, chunk, vocab))


def emu_backends(cfg: ModelConfig, lanes):
    """backend_of for the emulated schedule (CPU); the mtp program's with lanes.mtp."""
    from ..serve.run import emu_backend

    tensors = default_tensors(cfg, mtp=bool(lanes.mtp))
    ctx = ctx_for(lanes.batch, lanes.pt, cfg.vocab_size)
    return lambda B: nullcontext(emu_backend(cfg, lanes, tensors, ctx))


def gpu_backends(cfg: ModelConfig, lanes):
    """backend_of for the emitted programs on the GPU (built and gated, cached); the mtp
    program's with lanes.mtp."""
    from ..serve.run import gpu_backend

    tensors = default_tensors(cfg, mtp=bool(lanes.mtp))
    ctx = ctx_for(lanes.batch, lanes.pt, cfg.vocab_size)

    @contextmanager
    def backend_of(B):
        with gpu_backend(cfg, lanes, tensors, ctx) as be:
            yield be

    return backend_of

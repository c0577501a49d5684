"""`qwen38gen bench --serve WORKLOAD`: a seeded synthetic workload (serve/workload.py) through
`run`'s engine on the GPU program at each B: output tokens/s, the steps by kind and the rows they
carried, slot occupancy, and the steps lockstep batching would have taken for the same outputs.

Requests are queued all at once (default), or arrive as a Poisson process of ``rate`` requests
per second (workload.arrival_times). The clock runs from the first step to the last token, the
program built and the weights on the device before it. Time to first token counts from the
request's arrival (all queued at once: mostly waiting for a slot); time per output token is a
request's time from its first to its last token over the tokens after the first. Synthetic
weights as `run` makes them: on the host, or on the GPU above 1 GB of int4. ``ride=False`` is
the schedule in which decoding slots wait behind every prefill chunk (the engine before version
25), kept to measure against.

``mtp=K``: the speculative program through run --mtp K's engine (spec_engine.SpecEngine).
Synthetic weights accept almost no drafts, so besides the measured figures a row gives the
output tokens/s implied at acceptance α (``ALPHAS``): the verify steps' measured time scaled by
the measured tokens per slot-verify m over 1 + α + … + α^K, the other steps' time as measured.
"""

from __future__ import annotations

import time
from contextlib import contextmanager
from functools import partial
from dataclasses import asdict, dataclass, field

import numpy as np

from ..config import ModelConfig
from ..lanes import Lanes, capped_btg
from ..tuning import Tuning
from ..serve.run import default_ctx, make_engine
from ..serve.workload import Workload, arrival_times, requests

ALPHAS = (0.5, 0.7, 0.9)


@dataclass
class ServeRow:
    batch: int
    pt: int
    schedule: str            # "ride" or "wait"; "alternate" with mtp (spec_engine.py)
    requests: int
    output_tokens: int
    seconds: float
    tok_s: float
    steps: int
    prefill_steps: int
    decode_steps: int        # decode steps (verify steps with mtp)
    prompt_rows: int
    decode_rows: int
    occupancy: float
    decode_occupancy: float
    lockstep_steps: int
    ms_per_step: float
    ttft_p50_ms: float       # time to first token, from the request's arrival
    ttft_p99_ms: float
    tpot_p50_ms: float       # time per output token after the first, per request
    tpot_p99_ms: float
    rate: float = 0.0        # requests per second (0: all queued at once)
    mtp: int = 0
    acceptance: float | None = None          # mtp: drafts kept / drafts proposed
    tokens_per_verify: float | None = None   # mtp: tokens a slot-verify kept, on average
    implied_tok_s: dict = field(default_factory=dict)   # mtp: α -> output tok/s implied
    # where a step's time goes (plain program on the GPU): graph replays by phase during the run,
    # each phase's replay timed alone afterwards (ms), and their sum per step; the rest of
    # ms_per_step is the host's (scheduling, uploads, the read-back that ends a step)
    phase_runs: dict = field(default_factory=dict)
    phase_ms: dict = field(default_factory=dict)
    gpu_ms_per_step: float | None = None
    lane: str = ""           # the program's lane name (btg and tuning choices included)


def ms_percentiles(a: np.ndarray) -> tuple[float, float]:
    """(p50, p99) of seconds, in ms (nan where there are none)."""
    if not a.size:
        return float("nan"), float("nan")
    return round(float(np.percentile(a, 50)) * 1e3, 3), round(float(np.percentile(a, 99)) * 1e3, 3)


def implied_tok_s(tokens: int, other_s: float, verify_s: float, m: float, k: int,
                  alpha: float) -> float:
    """Output tokens/s if drafts were kept at rate α: the verify steps' time × m / E(α), where
    E(α) = 1 + α + … + α^k tokens a slot-verify keeps."""
    e = sum(alpha ** i for i in range(k + 1))
    return tokens / max(other_s + verify_s * m / e, 1e-9)


def gpu_weights(cfg: ModelConfig, mtp: bool = False):
    """Synthetic weights: made on the host (``default_tensors``, as `run` makes them) where they
    are small, made on the device (``DeviceFill``, as `bench` does) above 1 GB of int4, where the
    host would take minutes (Serving II item 3). The step's time does not depend on the values."""
    from ..serve.run import backend_tensors

    return backend_tensors(cfg, None, 0, mtp, "gpu")


@contextmanager
def gpu_slots(cfg: ModelConfig, B: int, pt: int, tensors: dict, ctx: int, mtp: int = 0,
              tuning=None, btg: int | None = None):
    """The emitted program's B slots on the GPU (RuntimeBackend, or run --mtp's spec backend)."""
    from ..serve.run import gpu_backend

    with gpu_backend(cfg, serve_lanes(cfg, B, pt, mtp, tuning, btg), tensors, ctx) as be:
        yield be
        if hasattr(be, "rt"):
            be.rt.stream.synchronize()


def serve_lanes(cfg: ModelConfig, B: int, pt: int, mtp: int, tuning=None,
                btg: int | None = None) -> Lanes:
    """The lanes of the program served at B (``bench --btg``: the GEMV tile, capped at B's;
    else the model's default)."""
    return Lanes.make(B, btg=capped_btg(B, btg), pt=pt, mtp=mtp, tuning=tuning or Tuning(),
                      model=cfg)


def typical_position(results) -> int:
    """A position to time the phases at: the mean of the requests' middle positions."""
    mids = [len(r.prompt) + len(r.token_ids) // 2 for r in results]
    return int(np.mean(mids)) if mids else 0


def phase_inputs(rt, phase: str) -> None:
    """Representative inputs of one phase: a packed chunk of exactly the bucket's rows (some slots
    with pt prompt tokens, the others riding with one row each, as a step of the ride schedule
    is), every slot decoding, or the sample phase as the run left it."""
    from ..inputs import put_chunk

    B, pt = rt.B, rt.pt
    if phase == "decode":
        rt.put("tokens", np.arange(B, dtype=np.int32) % rt.cfg.vocab_size)
        rt.put("ntok", np.ones(B, np.int32))
    elif phase.startswith("prefill"):
        rows = int(phase[len("prefill_r"):]) if phase.startswith("prefill_r") else B * pt
        lens = [1] * min(B, rows)                # every slot rides with one row ...
        extra = rows - len(lens)
        for b in range(len(lens)):                # ... and some take pt prompt tokens
            add = min(pt - 1, extra)
            lens[b] += add
            extra -= add
        chunks = [[1] * n for n in lens] + [[]] * (B - len(lens))
        got = put_chunk(rt.put, rt.manifest["schedule"], chunks)
        assert got == phase, (got, phase)


def time_phases(rt, runs: dict, position: int, reps: int = 20) -> dict:
    """Milliseconds per graph replay of each phase in ``runs``, timed alone from ``position``
    (the program's state is left as it is: the run has ended)."""
    from .timing import time_graph

    out = {}
    for ph in sorted(runs):
        phase_inputs(rt, ph)
        t = time_graph(rt, min(position, rt.tmax - rt.pt - 1), 3, reps, phase=ph)
        out[ph] = round(1e3 * float(np.median(t)), 4)
    return out


def serve_bench(cfg: ModelConfig, batches: list[int], w: Workload, pt: int, n: int | None = None,
                seed: int = 0, ride: bool = True, progress=lambda m: None,
                slots=None, rate: float = 0.0, mtp: int = 0, on_row=None,
                tuning=None, btg: int | None = None) -> list[ServeRow]:
    """The workload at each B; ``slots(cfg, B, pt, tensors, ctx, mtp)``: a context manager
    giving the backend (default ``gpu_slots``, with ``tuning``; the tests pass a CPU one);
    ``on_row(row)`` as each B is measured."""
    on_gpu = slots is None
    if on_gpu:
        from ..runtime import cuda_driver

        cuda_driver()
        slots = partial(gpu_slots, tuning=tuning, btg=btg)
    reqs = requests(w, cfg.vocab_size, seed, n)
    at = arrival_times(len(reqs), rate, seed)
    warm = requests(w, cfg.vocab_size, seed + 1, 8)
    ctx = max(default_ctx(reqs), default_ctx(warm))
    tensors = gpu_weights(cfg, bool(mtp)) if on_gpu else {}
    rows = []
    for B in batches:
        progress(f"serve {w.name} B={B}: build")
        with slots(cfg, B, pt, tensors, ctx, mtp) as be:
            # warm-up: the graphs of every phase captured and run once
            make_engine(be).run(warm[:min(2 * B, 8)])
            eng = make_engine(be)
            if not mtp:
                eng.sched.ride = ride
            progress(f"serve {w.name} B={B}: {len(reqs)} requests")
            first, last = {}, {}
            spent = {"verify": 0.0, "other": 0.0}
            mark = [time.perf_counter(), 0]

            def on_step(done):   # the step ended when its tokens were read back (choose)
                now = time.perf_counter()
                kind = "verify" if eng.stats.decode_steps > mark[1] else "other"
                spent[kind] += now - mark[0]
                mark[0], mark[1] = now, eng.stats.decode_steps
                for seq in eng.sched.running.values():
                    if seq.out and seq.req.id not in first:
                        first[seq.req.id] = now
                for res in done:
                    first.setdefault(res.id, now)
                    last[res.id] = now

            runs, phase_ms = getattr(be, "phase_runs", None), {}
            if runs is not None:
                runs.clear()
            results = eng.run(reqs, on_step=on_step, arrivals=at)
            sec = time.perf_counter() - eng.t0
            if runs and hasattr(be, "rt"):
                runs = dict(runs)
                phase_ms = time_phases(be.rt, runs, typical_position(results))
        arrive = {r.id: eng.t0 + t for r, t in zip(reqs, at)}
        ttft = np.array([first[r.id] - arrive[r.id] for r in results])
        tpot = np.array([(last[r.id] - first[r.id]) / (len(r.token_ids) - 1)
                         for r in results if len(r.token_ids) > 1])
        s = eng.stats
        row = ServeRow(B, pt, "alternate" if mtp else "ride" if ride else "wait", s.requests,
                       s.output_tokens, round(sec, 3), round(s.output_tokens / sec, 1), s.steps,
                       s.prefill_steps, s.decode_steps, s.prompt_rows, s.busy_decode,
                       round(s.occupancy, 3), round(s.decode_occupancy, 3),
                       s.lockstep_steps, round(1e3 * sec / max(1, s.steps), 3),
                       *ms_percentiles(ttft), *ms_percentiles(tpot), rate=rate, mtp=mtp,
                       lane=serve_lanes(cfg, B, pt, mtp, tuning, btg).name)
        if runs and phase_ms:
            row.phase_runs, row.phase_ms = runs, phase_ms
            gpu = sum(n * phase_ms[ph] for ph, n in runs.items())
            row.gpu_ms_per_step = round(gpu / max(1, s.steps), 3)
        if mtp:
            m = s.busy_tokens / max(1, s.busy_decode)
            row.acceptance = round(s.acceptance, 4)
            row.tokens_per_verify = round(m, 4)
            # the time outside steps (idle waits for arrivals) stays as measured
            other = sec - spent["verify"]
            row.implied_tok_s = {str(a): round(implied_tok_s(s.output_tokens, other,
                                                             spent["verify"], m, mtp, a), 1)
                                 for a in ALPHAS}
        rows.append(row)
        if on_row:
            on_row(row)
    return rows


def to_json(cfg: ModelConfig, w: Workload, rows: list[ServeRow], device: str) -> dict:
    # version 3: a row's phase_runs, phase_ms and gpu_ms_per_step (where a step goes);
    # version 4: a row's lane, and schedule "alternate" for --mtp
    return {"format": "qwen38gen-bench-serve", "version": 4, "model": cfg.name,
            "device": device, "workload": w.describe(), "rows": [asdict(r) for r in rows]}


def plot(path, cfg: ModelConfig, w: Workload, rows: list[ServeRow]):
    """PNG: output tokens/s against B per schedule (left), time to first token p50 / p99 and
    time per output token p50 (right)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from ..outputs import Target

    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 4))
    for sched in dict.fromkeys(r.schedule for r in rows):
        rs = sorted((r for r in rows if r.schedule == sched), key=lambda r: r.batch)
        label = sched + (f", mtp {rs[0].mtp}" if rs[0].mtp else "")
        a.plot([r.batch for r in rs], [r.tok_s for r in rs], "o-", label=label)
        b.plot([r.batch for r in rs], [r.ttft_p50_ms for r in rs], "o-", label=f"TTFT p50 ({label})")
        b.plot([r.batch for r in rs], [r.ttft_p99_ms for r in rs], "s--", label=f"TTFT p99 ({label})")
        b.plot([r.batch for r in rs], [r.tpot_p50_ms for r in rs], "^:", label=f"TPOT p50 ({label})")
    for ax in (a, b):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("batch B")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    a.set_ylabel("output tokens / s")
    b.set_ylabel("ms")
    b.set_yscale("log")
    rate = rows[0].rate if rows else 0.0
    fig.suptitle(f"{cfg.name}, {w.name} ({len(rows) and rows[0].requests} requests, "
                 + (f"{rate:g}/s" if rate else "all queued at once") + ")")
    fig.tight_layout()
    with Target(path, binary=True) as f:   # outputs.py: whole or not at all
        fig.savefig(f, dpi=120, format="png")

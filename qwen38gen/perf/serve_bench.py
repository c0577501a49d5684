"""`qwen38gen bench --serve WORKLOAD`: a seeded synthetic workload (serve/workload.py) through
`run`'s engine on the GPU program at each B: output tokens/s, the steps by kind and the rows they
carried, slot occupancy, and the steps lockstep batching would have taken for the same outputs.

All requests are queued at once; the clock runs from the first step to the last token, the
program built and the weights on the device before it. Time to first token counts from that
start (so at a large queue it is mostly waiting for a slot); time per output token is a request's
time from its first to its last token over the tokens after the first (synthetic weights as
`run` makes them: on the host, or on the GPU above 1 GB of int4). ``ride=False`` is the schedule in which decoding slots wait behind every prefill
chunk (the engine before version 25), kept to measure against.
"""

from __future__ import annotations

import time
from contextlib import contextmanager
from dataclasses import asdict, dataclass

import numpy as np

from ..config import ModelConfig
from ..lanes import Lanes
from ..serve.backends import RuntimeBackend
from ..serve.engine import Engine
from ..serve.run import default_ctx
from ..serve.workload import Workload, requests


@dataclass
class ServeRow:
    batch: int
    pt: int
    schedule: str            # "ride" or "wait"
    requests: int
    output_tokens: int
    seconds: float
    tok_s: float
    steps: int
    prefill_steps: int
    decode_steps: int
    prompt_rows: int
    decode_rows: int
    occupancy: float
    decode_occupancy: float
    lockstep_steps: int
    ms_per_step: float
    ttft_p50_ms: float       # time to first token, from the start (every request queued then)
    ttft_p99_ms: float
    tpot_p50_ms: float       # time per output token after the first, per request
    tpot_p99_ms: float


def ms_percentiles(a: np.ndarray) -> tuple[float, float]:
    """(p50, p99) of seconds, in ms (nan where there are none)."""
    if not a.size:
        return float("nan"), float("nan")
    return round(float(np.percentile(a, 50)) * 1e3, 3), round(float(np.percentile(a, 99)) * 1e3, 3)


def gpu_weights(cfg: ModelConfig):
    """Synthetic weights: made on the host (``default_tensors``, as `run` makes them) where they
    are small, made on the device (``DeviceFill``, as `bench` does) above 1 GB of int4, where the
    host would take minutes (Serving II item 3). The step's time does not depend on the values."""
    from ..serve.run import backend_tensors

    return backend_tensors(cfg, None, 0, False, "gpu")


@contextmanager
def gpu_slots(cfg: ModelConfig, B: int, pt: int, tensors: dict, ctx: int):
    """The emitted program's B slots on the GPU (RuntimeBackend), built and warmed up."""
    from ..build import build
    from ..runtime import Runtime

    cubin, man = build(cfg, Lanes.make(B, pt=pt))
    with Runtime(cubin, man, cfg, tensors, ctx) as rt:
        yield RuntimeBackend(rt)
        rt.stream.synchronize()


def serve_bench(cfg: ModelConfig, batches: list[int], w: Workload, pt: int, n: int | None = None,
                seed: int = 0, ride: bool = True, progress=lambda m: None,
                slots=None) -> list[ServeRow]:
    """The workload at each B; ``slots(cfg, B, pt, tensors, ctx)``: a context manager giving the
    backend (default ``gpu_slots``; the tests pass a CPU one)."""
    if slots is None:
        from ..runtime import cuda_driver

        cuda_driver()
        slots = gpu_slots
    reqs = requests(w, cfg.vocab_size, seed, n)
    warm = requests(w, cfg.vocab_size, seed + 1, 8)
    ctx = max(default_ctx(reqs), default_ctx(warm))
    tensors = gpu_weights(cfg) if slots is gpu_slots else {}
    rows = []
    for B in batches:
        progress(f"serve {w.name} B={B}: build")
        with slots(cfg, B, pt, tensors, ctx) as be:
            # warm-up: the graphs of every phase captured and run once
            Engine(be).run(warm[:min(2 * B, 8)])
            eng = Engine(be)
            eng.sched.ride = ride
            progress(f"serve {w.name} B={B}: {len(reqs)} requests")
            first, last = {}, {}

            def on_step(done):   # the step ended when its tokens were read back (choose)
                now = time.perf_counter()
                for seq in eng.sched.running.values():
                    if seq.out and seq.req.id not in first:
                        first[seq.req.id] = now
                for res in done:
                    first.setdefault(res.id, now)
                    last[res.id] = now

            t0 = time.perf_counter()
            results = eng.run(reqs, on_step=on_step)
            sec = time.perf_counter() - t0
        ttft = np.array([first[r.id] - t0 for r in results])
        tpot = np.array([(last[r.id] - first[r.id]) / (len(r.token_ids) - 1)
                         for r in results if len(r.token_ids) > 1])
        s = eng.stats
        rows.append(ServeRow(B, pt, "ride" if ride else "wait", s.requests, s.output_tokens,
                             round(sec, 3), round(s.output_tokens / sec, 1), s.steps,
                             s.prefill_steps, s.decode_steps, s.prompt_rows, s.busy_decode,
                             round(s.occupancy, 3), round(s.decode_occupancy, 3),
                             s.lockstep_steps, round(1e3 * sec / max(1, s.steps), 3),
                             *ms_percentiles(ttft), *ms_percentiles(tpot)))
    return rows


def to_json(cfg: ModelConfig, w: Workload, rows: list[ServeRow], device: str) -> dict:
    return {"format": "qwen38gen-bench-serve", "version": 1, "model": cfg.name,
            "device": device, "workload": w.describe(), "rows": [asdict(r) for r in rows]}

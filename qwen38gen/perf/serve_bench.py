"""`qwen38gen bench --serve WORKLOAD`: a seeded synthetic workload (serve/workload.py) through
`run`'s engine on the GPU program at each B: output tokens/s, the steps by kind and the rows they
carried, slot occupancy, and the steps lockstep batching would have taken for the same outputs.

All requests are queued at once; the clock runs from the first step to the last token, the
program built and the weights on the device before it (synthetic weights, made on the host as
`run` makes them). ``ride=False`` is the schedule in which decoding slots wait behind every prefill
chunk (the engine before version 25), kept to measure against.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass

from ..build import build
from ..config import ModelConfig
from ..lanes import Lanes
from ..runtime import Runtime, cuda_driver
from ..serve.backends import RuntimeBackend
from ..serve.engine import Engine
from ..serve.run import default_ctx
from ..serve.workload import Workload, requests
from ..weights import default_tensors


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


def serve_bench(cfg: ModelConfig, batches: list[int], w: Workload, pt: int, n: int | None = None,
                seed: int = 0, ride: bool = True, progress=lambda m: None) -> list[ServeRow]:
    cuda_driver()
    reqs = requests(w, cfg.vocab_size, seed, n)
    ctx = default_ctx(reqs)
    tensors = default_tensors(cfg)
    rows = []
    for B in batches:
        progress(f"serve {w.name} B={B}: build")
        cubin, man = build(cfg, Lanes.make(B, pt=pt))
        with Runtime(cubin, man, cfg, tensors, ctx) as rt:
            # warm-up: the graphs of every phase captured and run once
            Engine(RuntimeBackend(rt)).run(requests(w, cfg.vocab_size, seed + 1, min(2 * B, 8)))
            eng = Engine(RuntimeBackend(rt))
            eng.sched.ride = ride
            progress(f"serve {w.name} B={B}: {len(reqs)} requests")
            t0 = time.perf_counter()
            eng.run(reqs)
            rt.stream.synchronize()
            sec = time.perf_counter() - t0
        s = eng.stats
        rows.append(ServeRow(B, pt, "ride" if ride else "wait", s.requests, s.output_tokens,
                             round(sec, 3), round(s.output_tokens / sec, 1), s.steps,
                             s.prefill_steps, s.decode_steps, s.prompt_rows, s.busy_decode,
                             round(s.occupancy, 3), round(s.decode_occupancy, 3),
                             s.lockstep_steps, round(1e3 * sec / max(1, s.steps), 3)))
    return rows


def to_json(cfg: ModelConfig, w: Workload, rows: list[ServeRow], device: str) -> dict:
    return {"format": "qwen38gen-bench-serve", "version": 1, "model": cfg.name,
            "device": device, "workload": w.describe(), "rows": [asdict(r) for r in rows]}

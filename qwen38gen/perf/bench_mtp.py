"""`qwen38gen bench --mtp K`: the cost of one speculative step (verify K+1 rows + accept + MTP rows
+ K−1 draft steps, one CUDA graph) against one plain decode step (the pt = 1 program's graph),
at each batch size, with the same synthetic weights and state as `bench` (bench.py's helpers).

tok/s measured = B · (mean tokens emitted per step) / step time. With the synthetic weights the
drafts are almost never accepted, so that is ~B / step time; the tok/s implied at acceptance rate
α is B · (1 + α + … + α^K) / step time (the expected tokens of a greedy verify of K drafts when
each draft is accepted with probability α given the previous ones were).
"""

from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass, field

import numpy as np

from ..build import build
from ..config import ModelConfig
from ..lanes import Lanes, capped_btg
from ..runtime import DeviceFill, Runtime
from ..sampling import put_greedy_params
from ..tuning import Tuning
from .bench import fill_state, time_graph

ALPHAS = (0.5, 0.7, 0.9)


def tokens_per_step(alpha: float, k: int) -> float:
    return sum(alpha ** i for i in range(k + 1))


@dataclass
class MtpRow:
    batch: int
    k: int
    lane: str
    plain_ms: float
    spec_ms: float
    ratio: float                     # spec step / plain step
    emitted: float                   # mean tokens per sequence and step (measured)
    plain_tok_s: float
    spec_tok_s: float                # measured
    implied_tok_s: dict = field(default_factory=dict)   # alpha -> tok/s
    # --trace: one replay of each trace variant, trace.Timeline.to_json() + "variant_ms"
    trace: dict | None = None        # the speculative step (the verify phase)
    plain_trace: dict | None = None  # the plain decode step


def time_verify(rt: Runtime, ctx: int, warmup: int, reps: int) -> tuple[list[float], float]:
    """Replays of the verify graph from position ctx; (seconds per replay, mean count)."""
    counts: list[float] = []
    out = time_graph(rt, ctx, warmup, reps, "verify",
                     after=lambda: counts.append(float(rt.get("count").mean())))
    return out, statistics.mean(counts)


def spec_state(rt: Runtime, cfg: ModelConfig, B: int, k: int, ctx: int) -> None:
    """The mtp program's state before a verify replay: bench's state, a filled MTP cache, K+1
    verify rows a sequence from state slot 0."""
    fill_state(rt, ctx)
    for i, name in enumerate(("mkc", "mvc")):
        g, shape, _ = rt.bufs[name]
        rt.fill(g, int(np.prod(shape)), "bfloat16", 97 + i, -1.0, 1.0)
    rng = np.random.default_rng(B)
    rt.put("vtok", rng.integers(0, cfg.vocab_size, B * (k + 1)).astype(np.int32))
    rt.put("ntok", np.full(B, k + 1, np.int32))
    rt.put("slot", np.zeros(B, np.int32))
    put_greedy_params(rt.put, rt.manifest["buffers"], B)   # the greedy step (spec_sample's columns)
    rt.stream.synchronize()


def trace_spec_step(cfg: ModelConfig, lanes: Lanes, ctx: int) -> dict:
    """The timeline of one verify replay of the mtp lane's trace variant (trace.py)."""
    from . import trace as T

    cubin, man = build(cfg, lanes, trace=True)
    with Runtime(cubin, man, cfg, DeviceFill(seed=0), tmax=ctx + lanes.mtp + 2) as rt:
        spec_state(rt, cfg, lanes.batch, lanes.mtp, ctx)
        recs, t = T.record(rt, ctx, phase="verify")
    d = T.timeline(recs, man, cfg, phase="verify").to_json()
    d["variant_ms"] = t * 1e3
    return d


def bench_mtp(cfg: ModelConfig, batches: list[int], ctx: int, k: int = 1, warmup: int = 5,
              reps: int = 30, progress=None, tuning: Tuning = Tuning(),
              btg: int | None = None, trace: bool = False) -> list[MtpRow]:
    """trace: also replay each program's trace variant once (where the speculative step's time
    goes, by kind and by weight, beside the plain step's)."""
    rows = []
    for B in batches:
        say = progress or (lambda m: None)
        lanes = Lanes.make(B, btg=capped_btg(B, btg), pt=k + 1, mtp=k, tuning=tuning,
                           model=cfg)
        plain = lanes.plain(pt=1)
        say(f"B={B}: plain program, emit + nvcc")
        cubin, man = build(cfg, plain)
        with Runtime(cubin, man, cfg, DeviceFill(seed=0), tmax=ctx + 1) as rt:
            fill_state(rt, ctx)
            say(f"B={B}: timing {reps} plain decode replays")
            tp = statistics.median(time_graph(rt, ctx, warmup, reps))
        say(f"B={B}: mtp={k} program, emit + nvcc")
        cubin, man = build(cfg, lanes)
        with Runtime(cubin, man, cfg, DeviceFill(seed=0), tmax=ctx + k + 2) as rt:
            spec_state(rt, cfg, B, k, ctx)
            say(f"B={B}: timing {reps} verify + draft replays")
            ts, emitted = time_verify(rt, ctx, warmup, reps)
        tv = statistics.median(ts)
        rows.append(MtpRow(batch=B, k=k, lane=lanes.name, plain_ms=tp * 1e3, spec_ms=tv * 1e3,
                           ratio=tv / tp, emitted=emitted, plain_tok_s=B / tp,
                           spec_tok_s=B * emitted / tv,
                           implied_tok_s={a: B * tokens_per_step(a, k) / tv for a in ALPHAS}))
        if trace:
            from .bench import trace_step

            say(f"B={B}: the trace variants, one replay block by block")
            rows[-1].plain_trace = trace_step(cfg, plain, ctx)
            rows[-1].trace = trace_spec_step(cfg, lanes, ctx)
    return rows


def to_json(cfg: ModelConfig, ctx: int, rows: list[MtpRow], device: str) -> dict:
    return {"model": cfg.name, "ctx": ctx, "device": device, "mtp_rows": [asdict(r) for r in rows]}

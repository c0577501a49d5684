"""`qwen38gen bench`: time the decode step as a CUDA graph replay, next to the floor and the copy
bandwidth measured in the same run (docs/PERFORMANCE.md).

Per batch size B: emit and build the program, make the int4 weights on the GPU (DeviceFill), fill
the state and KV cache to `ctx` tokens, replay the decode graph (warm-up, then the median of
`reps` replays, each timed with CUDA events and started from position ctx), and time every launch
of one step on its own to split the step by kind of kernel.
"""

from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass, field

import numpy as np

from ..build import build
from ..config import ModelConfig
from ..lanes import Lanes, capped_btg
from ..runtime import DeviceFill, Runtime, cuda_driver
from ..tuning import Tuning
from .timing import KINDS, kind_of, time_graph

__all__ = ["BenchRow", "bench", "fill_state", "kind_of", "time_graph", "to_json", "plot"]


@dataclass
class BenchRow:
    batch: int
    lane: str
    step_ms: float
    step_ms_spread: tuple[float, float]      # (min, max) of the timed replays
    tok_s: float
    floor_ms: float
    floor_bytes: float
    gbs: float                               # floor bytes / step time
    ratio: float                             # step / floor
    share: dict = field(default_factory=dict)  # kind -> fraction of the per-kernel time sum
    kernel_ms: dict = field(default_factory=dict)    # kind -> ms, each launch timed alone
    graph_ms: dict = field(default_factory=dict)     # kind -> ms, the kind's launches as a graph
    kind_gbs: dict = field(default_factory=dict)     # kind -> its floor bytes / graph_ms
    trace: dict | None = None    # --trace: trace.Timeline.to_json() of one replay, + "variant_ms"


def copy_bandwidth(drv, nbytes: int = 2 << 30, reps: int = 10) -> float:
    """Device-to-device copy, bytes read + written per second (median of reps)."""
    a, b = drv.mem_alloc(nbytes), drv.mem_alloc(nbytes)
    drv.memset_d8(a, 1, nbytes)
    s = drv.Stream()
    times = []
    for i in range(reps + 2):
        e0, e1 = drv.Event(), drv.Event()
        e0.record(s)
        drv.memcpy_dtod_async(b, a, nbytes, s)
        e1.record(s)
        e1.synchronize()
        if i >= 2:
            times.append(e1.time_since(e0) / 1e3)
    a.free()
    b.free()
    return 2 * nbytes / statistics.median(times)


def copy_bandwidth_alone() -> float:
    """``copy_bandwidth`` in a context of its own, made and released before the runs' own."""
    drv = cuda_driver()
    ctx0 = drv.Device(0).make_context()
    try:
        return copy_bandwidth(drv)
    finally:
        ctx0.pop()


def fill_state(rt: Runtime, ctx: int, seed: int = 1):
    """pos = ctx for every sequence; random KV in the first ctx slots, random state and ring."""
    m = rt.manifest["buffers"]
    for i, name in enumerate(("kc", "vc", "rec", "conv")):
        g, shape, dt = rt.bufs[name]
        n = int(np.prod(shape))
        lo, hi = (-0.05, 0.05) if name == "rec" else (-1.0, 1.0)
        rt.fill(g, n, m[name]["dtype"], seed * 31 + i, lo, hi)
    rt.put("pos", np.full(rt.B, ctx, np.int32))
    rt.put("ntok", np.ones(rt.B, np.int32))
    rng = np.random.default_rng(seed)
    rt.put("tokens", rng.integers(0, rt.cfg.vocab_size, rt.B).astype(np.int32))
    rt.stream.synchronize()


def time_back_to_back(drv, stream, launch, reps: int, warmup: int = 3) -> float:
    """Seconds per call of launch(i) (i = 0, 1, …: pick a buffer) enqueued back to back on
    stream, after warmup calls; one pair of events around the timed ones."""
    for i in range(warmup):
        launch(i)
    e0, e1 = drv.Event(), drv.Event()
    e0.record(stream)
    for i in range(reps):
        launch(i)
    e1.record(stream)
    e1.synchronize()
    return e1.time_since(e0) / 1e3 / reps


def time_kernels(rt: Runtime, ctx: int, reps: int = 3) -> dict[str, float]:
    """Seconds per kind of kernel in one step, each launch timed on its own (median of reps)."""
    drv = rt.drv
    per: dict[str, float] = {}
    for r in range(reps):
        rt.put("pos", np.full(rt.B, ctx, np.int32))
        evs = []
        for L in rt.launches["decode"]:
            e0, e1 = drv.Event(), drv.Event()
            e0.record(rt.stream)
            rt.launch_one(L, pdl=False)
            e1.record(rt.stream)
            evs.append((L, e0, e1))
        evs[-1][2].synchronize()
        times: dict[str, float] = {}
        for (L, e0, e1), s in zip(evs, rt.manifest["schedule"]["decode"]):
            k = kind_of(rt.manifest, s)
            times[k] = times.get(k, 0.0) + e1.time_since(e0) / 1e3
        for k, v in times.items():
            per.setdefault(k, [])
            per[k].append(v)
    return {k: statistics.median(v) for k, v in per.items()}


def kind_bytes(cfg: ModelConfig, B: int, ctx: int) -> dict[str, float]:
    """Bytes each kind of kernel must move in one step (the floor model's terms)."""
    f = cfg.floor_parts(B, ctx)
    return {"gemv": f["weights"], "delta rule": f["state"], "attention": f["kv"]}


def time_kinds_in_graph(rt: Runtime, ctx: int, reps: int = 10) -> dict[str, float]:
    """Seconds per kind of kernel inside a graph: each kind's launches of one step, in step
    order, captured as a graph of their own and replayed (median of reps). Unlike the launches
    timed one by one, this keeps the back-to-back overlap (PDL) of the real step."""
    drv, sched = rt.drv, rt.manifest["schedule"]["decode"]
    out = {}
    for kind in KINDS:
        subset = [L for L, s in zip(rt.launches["decode"], sched)
                  if kind_of(rt.manifest, s) == kind]
        if not subset:
            continue
        exe = rt.graphs.capture(rt.stream, lambda: rt.launch_list(subset))
        times = []
        for i in range(reps + 2):
            rt.put("pos", np.full(rt.B, ctx, np.int32))
            e0, e1 = drv.Event(), drv.Event()
            e0.record(rt.stream)
            rt.graphs.launch(exe, rt.stream)
            e1.record(rt.stream)
            e1.synchronize()
            if i >= 2:
                times.append(e1.time_since(e0) / 1e3)
        rt.graphs.destroy(exe)
        out[kind] = statistics.median(times)
    return out


def trace_step(cfg: ModelConfig, lanes: Lanes, ctx: int) -> dict:
    """The timeline of one decode replay of the lane's trace variant (trace.py)."""
    from . import trace as T

    cubin, man = build(cfg, lanes, trace=True)
    with Runtime(cubin, man, cfg, DeviceFill(seed=0), tmax=ctx + 1) as rt:
        fill_state(rt, ctx)
        recs, t = T.record(rt, ctx)
    d = T.timeline(recs, man, cfg).to_json()
    d["variant_ms"] = t * 1e3
    return d


def bench(cfg: ModelConfig, batches: list[int], ctx: int, warmup: int = 5, reps: int = 30,
          progress=None, trace: bool = False, tuning: Tuning = Tuning(),
          btg: int | None = None) -> tuple[float, list[BenchRow]]:
    bw = copy_bandwidth_alone()
    rows = []
    for B in batches:
        lanes = Lanes.make(B, btg=capped_btg(B, btg), pt=1, tuning=tuning, model=cfg)
        if progress:
            progress(f"B={B}: emit + nvcc")
        cubin, man = build(cfg, lanes)
        if progress:
            progress(f"B={B}: weights on the GPU, state to T={ctx}")
        with Runtime(cubin, man, cfg, DeviceFill(seed=0), tmax=ctx + 1) as rt:
            fill_state(rt, ctx)
            if progress:
                progress(f"B={B}: timing {reps} graph replays")
            t = time_graph(rt, ctx, warmup, reps)
            kt = time_kernels(rt, ctx)
            kg = time_kinds_in_graph(rt, ctx)
        step = statistics.median(t)
        fb = cfg.floor_bytes(B, ctx)
        floor = fb / bw
        tot = sum(kt.values())
        rows.append(BenchRow(batch=B, lane=lanes.name, step_ms=step * 1e3,
                             step_ms_spread=(min(t) * 1e3, max(t) * 1e3), tok_s=B / step,
                             floor_ms=floor * 1e3, floor_bytes=fb, gbs=fb / step / 1e9,
                             ratio=step / floor, share={k: v / tot for k, v in kt.items()},
                             kernel_ms={k: v * 1e3 for k, v in kt.items()},
                             graph_ms={k: v * 1e3 for k, v in kg.items()},
                             kind_gbs={k: b / kg[k] / 1e9
                                       for k, b in kind_bytes(cfg, B, ctx).items() if k in kg}))
        if trace:
            if progress:
                progress(f"B={B}: the trace variant, one replay block by block")
            rows[-1].trace = trace_step(cfg, lanes, ctx)
    return bw, rows


def to_json(cfg: ModelConfig, ctx: int, bw: float, rows: list[BenchRow], device: str) -> dict:
    return {"model": cfg.name, "ctx": ctx, "copy_bandwidth": bw, "device": device,
            "rows": [asdict(r) for r in rows]}


def plot(path, cfg: ModelConfig, ctx: int, bw: float, rows: list[BenchRow]):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from qwen38gen.outputs import Target

    bs = [r.batch for r in rows]
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.plot(bs, [r.tok_s for r in rows], "o-", label="measured tok/s")
    ax.plot(bs, [b / cfg.floor_seconds(b, ctx, bw) for b in bs], "s--", label="floor tok/s")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("batch B")
    ax.set_ylabel("tokens / s")
    ax.set_title(f"{cfg.name} decode, T={ctx}, copy {bw / 1e12:.2f} TB/s")
    ax.legend()
    ax.grid(alpha=0.3)
    fig.tight_layout()
    with Target(path, binary=True) as f:   # outputs.py: whole or not at all
        fig.savefig(f, dpi=120, format="png")

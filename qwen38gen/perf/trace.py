"""`qwen38gen bench --trace`: a timeline of one decode step, block by block (with `--mtp K`: of
the speculative step, the verify phase, beside the plain step's).

The trace variant of a program (``emit_program(..., trace=True)``, kernels/trace.cuh) records,
for every block of every launch, %globaltimer when it entered, when it came out of
griddepcontrol.wait and when it was done. One graph replay of that variant, under the same
launches (PDL and all) as the timed program, gives per launch:

* ``start``: its first block entered; ``release``: its first block came out of the wait (the
  previous launch had completed and its writes were visible); ``end``: its last block was done;
  ``mid``: half of its blocks were done (``end - mid`` is the launch's tail).
* ``handover = release - previous end``: how long after the previous launch's last block the
  first block of this one could go on (the dependency's cost, with the launch's own latency).
* ``advance = end - previous end``: how far this launch moved the step; the advances sum to the
  step. ``run = advance - max(handover, 0)``.

The step's advances are split by kind of kernel (as the bench table) and by weight (the GEMVs:
gdn.in, attn.in, out, gate_up, down, lm_head, with the GB/s of their weight bytes over the
run). The trace variant's own step time is printed beside the program's: the records cost one
barrier and one atomic per block.
"""

from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass, field

import numpy as np

from .timing import kind_of, time_graph

REC = np.dtype([("grid", "<u8"), ("t0", "<u8"), ("tw", "<u8"), ("t1", "<u8"), ("kid", "<u4"),
                ("smid", "<u4")])   # kernels/trace.cuh TraceRec (40 bytes)
CTL = np.dtype([("buf", "<u8"), ("cap", "<u4"), ("n", "<u4")])   # TraceCtl


class TraceError(RuntimeError):
    """The records do not match the schedule (a launch missing, or more blocks than expected)."""


@dataclass
class LaunchSpan:
    i: int                   # position in the decode schedule
    kernel: str
    label: str               # kind, or the GEMV's weight (gdn.in, out, ...)
    kind: str
    blocks: int
    start: float             # µs from the step's first block entering
    release: float
    end: float
    mid: float
    handover: float = 0.0
    advance: float = 0.0
    run: float = 0.0
    weight_bytes: int = 0


@dataclass
class Timeline:
    launches: list[LaunchSpan]
    step_us: float                        # first block in -> last block done
    resolution_ns: float                  # smallest step of the timer seen in this replay
    by_label: dict = field(default_factory=dict)
    by_kind: dict = field(default_factory=dict)

    def to_json(self) -> dict:
        return {"step_us": self.step_us, "resolution_ns": self.resolution_ns,
                "by_kind": self.by_kind, "by_label": self.by_label,
                "launches": [asdict(s) for s in self.launches]}


def weight_label(cfg, launch: dict) -> tuple[str | None, str | None]:
    """(label, fused weight name) of a GEMV launch from its manifest fields "role" and
    "weight", else (None, None): the role, gdn.in / attn.in for a layer's in projection, mtp.ROLE
    for the MTP layer's weights."""
    name, role = launch.get("weight"), launch.get("role")
    if name is None:
        return None, None
    if name.startswith("M."):
        return f"mtp.{role}", name
    if role == "in":
        i = int(name[1:].partition(".")[0])            # "L3.in"
        return ("gdn.in" if i in cfg.linear_layers else "attn.in"), name
    return role, name


def group_launches(recs: np.ndarray, names: list[str], sched: list[dict]) -> list[np.ndarray]:
    """Records of each launch of the schedule, in schedule order. Launches are told apart by
    %gridid; their order is the grid ids' order, or else the order of their first blocks."""
    grids, inv = np.unique(recs["grid"], return_inverse=True)
    groups = [recs[inv == j] for j in range(len(grids))]
    want = [(s["k"], int(np.prod(s["grid"]))) for s in sched]

    def got(gs):
        return [(names[int(g["kid"][0])], len(g)) for g in gs]

    if len(groups) != len(want):
        raise TraceError(f"the replay recorded {len(groups)} launches, the schedule has "
                         f"{len(want)}")
    if got(groups) == want:
        return groups
    by_start = sorted(groups, key=lambda g: (int(g["t0"].min()), int(g["grid"][0])))
    if got(by_start) == want:
        return by_start
    bad = next(i for i, (a, b) in enumerate(zip(got(by_start), want)) if a != b)
    raise TraceError(f"launch {bad} of the schedule is {want[bad]}, the records have "
                     f"{got(by_start)[bad]} there")


def timeline(recs: np.ndarray, manifest: dict, cfg, weights: dict | None = None,
             phase: str = "decode") -> Timeline:
    """Per-launch spans of one replay of ``phase`` from its block records (see the module doc)."""
    sched = manifest["schedule"][phase]
    groups = group_launches(recs, manifest["trace"], sched)
    t00 = min(int(g["t0"].min()) for g in groups)
    ts = np.unique(np.concatenate([recs["t0"], recs["t1"]]))
    res = float(np.diff(ts).min()) if len(ts) > 1 else 0.0
    weights = weights if weights is not None else manifest.get("weights", {})
    spans, prev_end = [], 0.0
    for i, (s, g) in enumerate(zip(sched, groups)):
        us = lambda v: (float(v) - t00) / 1e3   # noqa: E731
        start, end = us(g["t0"].min()), us(g["t1"].max())
        waited = g["tw"][g["tw"] > 0]
        release = us(waited.min()) if len(waited) else start
        kind = kind_of(manifest, s)
        label, wname = weight_label(cfg, s) if kind == "gemv" else (None, None)
        wb = 0
        if wname in weights:
            w = weights[wname]
            wb = w["rows"] * w["k"] // 2 + w["rows"] * (w["k"] // 128) * 2
        sp = LaunchSpan(i=i, kernel=s["k"], label=label or kind, kind=kind, blocks=len(g),
                        start=start, release=release, end=end, mid=us(np.median(g["t1"])),
                        weight_bytes=wb)
        sp.handover = release - prev_end if i else 0.0
        sp.advance = end - prev_end
        sp.run = sp.advance - max(sp.handover, 0.0)
        prev_end = end
        spans.append(sp)
    tl = Timeline(spans, step_us=prev_end, resolution_ns=res)
    for key, attr in (("by_kind", "kind"), ("by_label", "label")):
        agg: dict = {}
        for sp in spans:
            a = agg.setdefault(getattr(sp, attr), {"n": 0, "advance": 0.0, "handover": 0.0,
                                                   "run": 0.0, "tail": 0.0, "bytes": 0})
            a["n"] += 1
            a["advance"] += sp.advance
            a["handover"] += max(sp.handover, 0.0)
            a["run"] += sp.run
            a["tail"] += sp.end - sp.mid
            a["bytes"] += sp.weight_bytes
        for a in agg.values():
            a["gbs_run"] = a["bytes"] / (a["run"] * 1e3) if a["bytes"] and a["run"] > 0 else None
        setattr(tl, key, agg)
    return tl


def record(rt, ctx: int, warmup: int = 5, phase: str = "decode") -> tuple[np.ndarray, float]:
    """One replay of ``phase`` (the decode step; ``verify`` for an mtp program's speculative
    step) of a trace-variant program (Runtime rt, state filled): its block records, and the
    median time of the warm-up replays (s)."""
    drv = rt.drv
    cap = sum(int(np.prod(s["grid"])) for s in rt.manifest["schedule"][phase])
    buf = drv.mem_alloc(cap * REC.itemsize)
    try:
        ptr, size = rt.symbol("q38_trace_ctl")
        if size != CTL.itemsize:
            raise TraceError(f"q38_trace_ctl is {size} bytes, expected {CTL.itemsize}")
        ctl = np.zeros(1, CTL)
        ctl["buf"], ctl["cap"] = int(buf), cap
        drv.memcpy_htod(ptr, ctl)           # the warm-up replays record too (n runs past cap)
        t = time_graph(rt, ctx, 1, warmup, phase)
        ctl["n"] = 0
        drv.memcpy_htod(ptr, ctl)
        time_graph(rt, ctx, 0, 1, phase)
        drv.memcpy_dtoh(ctl, ptr)
        n = int(ctl["n"][0])
        if n != cap:
            raise TraceError(f"the replay recorded {n} blocks, its schedule launches {cap}")
        recs = np.empty(cap, REC)
        drv.memcpy_dtoh(recs, buf)
    finally:
        buf.free()
    return recs, statistics.median(t)

"""Timing a step on the GPU, shared by bench and trace: a phase's graph replayed and timed with
CUDA events, and the kinds a step's time is split into (by each kernel's family in the manifest).
"""

from __future__ import annotations

import numpy as np

from ..plan.families import KINDS, family

__all__ = ["KINDS", "kind_of", "time_graph"]


def kind_of(manifest: dict, launch: dict) -> str:
    """The kind (KINDS: gemv, delta rule, attention, rest) of a launch of the manifest's schedule,
    from its kernel's family's row in plan/families.py (an unknown family is an error)."""
    return family(manifest["kernels"][launch["k"]]["family"]).kind


def time_graph(rt, ctx: int, warmup: int, reps: int, phase: str = "decode",
               after=None) -> list[float]:
    """Seconds per replay of a phase's graph (Runtime rt), each from position ctx; `after()` runs
    after every timed replay."""
    drv = rt.drv
    out = []
    for i in range(warmup + reps):
        rt.put("pos", np.full(rt.B, ctx, np.int32))   # every replay sees T = ctx
        e0, e1 = drv.Event(), drv.Event()
        e0.record(rt.stream)
        rt.run_phase(phase)
        e1.record(rt.stream)
        e1.synchronize()
        if i >= warmup:
            out.append(e1.time_since(e0) / 1e3)
            if after:
                after()
    return out

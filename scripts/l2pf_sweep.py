"""Time the 27B decode step at several sizes of the L2 prefetch of each GEMV's weights
(common.cuh l2_prefetch_weights, issued by the kernel launched before the GEMV; ops.L2PF_TABLE).

  python3 scripts/l2pf_sweep.py [--batch 1,16,64] [--sizes 0,4M,8M,16M,32M] [--ctx 1024]
                                [--rounds 2] [--json OUT.json]

Per B one program, one set of synthetic weights and one state (as `qwen38gen bench` makes
them); for each round and size the launches are resolved again with that size
(Runtime.set_l2_prefetch), the decode graph captured anew and timed (median of 30 replays).
The rounds interleave the sizes, so the spread between rounds of one size is the noise to
compare against. The copy bandwidth of the same run is printed beside it. This chooses the
table; the step figures of record come from `qwen38gen bench`.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from qwen38gen.config import PRESETS  # noqa: E402
from qwen38gen.runtime import l2pf_size  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", default="1,16,64")
    ap.add_argument("--sizes", default="0,4M,8M,16M,32M")
    ap.add_argument("--ctx", type=int, default=1024)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--json")
    a = ap.parse_args()

    from qwen38gen.bench import copy_bandwidth, fill_state, time_graph
    from qwen38gen.check import build
    from qwen38gen.lanes import Lanes
    from qwen38gen.runtime import DeviceFill, Runtime, _drv

    cfg = PRESETS["qwen3.8-27b"]
    sizes = [l2pf_size(s) for s in a.sizes.split(",")]
    drv = _drv()
    c0 = drv.Device(0).make_context()
    try:
        bw = copy_bandwidth(drv)
    finally:
        c0.pop()
    print(f"copy bandwidth {bw / 1e12:.3f} TB/s", flush=True)
    rows = []
    for B in [int(b) for b in a.batch.split(",")]:
        cubin, man = build(cfg, Lanes.make(B, pt=1))
        floor = cfg.floor_bytes(B, a.ctx) / bw * 1e3
        with Runtime(cubin, man, cfg, DeviceFill(seed=0), tmax=a.ctx + 1) as rt:
            fill_state(rt, a.ctx)
            times: dict[int, list[float]] = {s: [] for s in sizes}
            for _ in range(a.rounds):
                for s in sizes:
                    rt.set_l2_prefetch(s)
                    t = time_graph(rt, a.ctx, 5, a.reps)
                    times[s].append(statistics.median(t) * 1e3)
                    print(f"B={B:3d} prefetch {s >> 20:3d} MiB: {times[s][-1]:.3f} ms", flush=True)
        for s in sizes:
            rows.append({"batch": B, "bytes": s, "step_ms": times[s], "floor_ms": floor})
    print(f"\n L2 prefetch sweep, qwen3.8-27b, T = {a.ctx}, copy {bw / 1e12:.3f} TB/s")
    print(f"{'B':>4} {'MiB':>5} {'step ms (rounds)':>28} {'% of floor':>11}")
    for r in rows:
        ts = " / ".join(f"{t:.3f}" for t in r["step_ms"])
        med = statistics.median(r["step_ms"])
        print(f"{r['batch']:4d} {r['bytes'] >> 20:5d} {ts:>28} {100 * r['floor_ms'] / med:10.1f}%")
    if a.json:
        Path(a.json).write_text(json.dumps({"copy_bandwidth": bw, "ctx": a.ctx, "rows": rows},
                                           indent=1) + "\n")


if __name__ == "__main__":
    main()

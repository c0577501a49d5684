"""How fast the B = 1 decode step's weights can stream without their arithmetic: the 257
matrices of the 27B step (sizes and order of plan.entries.fused_weights: in, out, gate_up, down per
layer, then the lm_head; int4 words and bf16 scales together), read

  flat        by one launch over all of them (no boundaries: the ceiling of this read pattern),
  launch      one launch per matrix, a CUDA graph of 257 with programmatic dependent launch
              (each block requests its first step before griddepcontrol.wait, as gemv_q4 does),
  launch-np   the same without PDL,
  launch cC dD  the same with a chain of C dependent FMAs per 8 KiB step and thread (a stand-in
              for a GEMV group's mma chain) and D steps in flight (gemv_q4's ST - 1),
  ws cC rR    one launch per matrix of persistent blocks (at most SMs x blocks per SM), each a
              producer warp copying its units' steps by cp.async into an R-stage ring and 8
              consumer warps running the C-FMA chain on them (the loads never wait for compute),
  persist     one persistent grid with a barrier of the whole grid between matrices,
  persist-pf  the same, each block requesting its next unit's first step before the barrier,
  wsp cC rR   one persistent grid of ws blocks whose producer streams every matrix's steps
              without waiting, only the consumers meeting at the barrier (version 22),

each unit (block) reading what a gemv_q4 block of the B = 1 step reads (kernels in
scripts/stream_bench.cuh). Blocks per SM are set by padding shared memory (SB_BLOCKS, 4 as
gemv_q4 at one row). Prints ms and TB/s of each next to the copy bandwidth of the same run.
It answers one design question (docs/PERFORMANCE.md, version 15): how much of the step's GEMV loss
is the launch boundaries themselves, and how much would a persistent step kernel's barriers
cost. Not a speed figure of the program: those come from `qwen38gen bench`.

  python3 scripts/stream_bench.py build OUT.cubin        # CPU machine
  python3 scripts/stream_bench.py run OUT.cubin          # GPU machine
"""

from __future__ import annotations

import os
import shutil
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from qwen38gen.config import PRESETS  # noqa: E402
from qwen38gen.gate import compile_kernels  # noqa: E402
from qwen38gen.plan.entries import fused_weights  # noqa: E402

S = 5                 # steps of 8 KiB per unit (sb_launch5 / sb_persist5)
UNIT = S * 8192
SMS = 132


def matrices() -> list[int]:
    """Bytes of each matrix of the B = 1 step, in launch order."""
    cfg = PRESETS["qwen3.8-27b"]
    w = fused_weights(cfg)
    order = [f"L{i}.{p}" for i in range(cfg.num_hidden_layers)
             for p in ("in", "out", "gate_up", "down")] + ["lm_head"]
    return [w[n]["rows"] * w[n]["k"] // 2 + w[n]["rows"] * (w[n]["k"] // 128) * 2 for n in order]


def build(cubin: str):
    src = (ROOT / "scripts" / "stream_bench.cuh").read_text()
    res = compile_kernels(src, "stream_bench.cu", arch="sm_90a")
    shutil.copyfile(res.cubin, cubin)
    print(f"{len(res.kernels)} kernels -> {cubin}: "
          + ", ".join(f"{k.name} {k.registers} registers" for k in res.kernels))
    return res


def run(cubin: str, reps: int = 10):
    import numpy as np
    import pycuda.autoinit  # noqa: F401
    import pycuda.driver as drv

    from qwen38gen.perf.bench import copy_bandwidth
    from qwen38gen.launch import PdlModule
    from qwen38gen.runtime import _Graphs

    blocks_per_sm = int(os.environ.get("SB_BLOCKS", "4"))
    smem = (228 * 1024) // blocks_per_sm - 2048   # pads the SM to blocks_per_sm blocks
    sizes = [(b + 15) // 16 * 16 for b in matrices()]
    offs = np.cumsum([0] + sizes[:-1])
    total = int(sum(sizes))
    w = drv.mem_alloc(total)
    drv.memset_d8(w, 0x5A, total)
    sink = drv.mem_alloc(4 * 65536)
    bar = drv.mem_alloc(4)
    off16 = drv.to_device(np.asarray(offs // 16, np.int64))
    n16 = drv.to_device(np.asarray([s // 16 for s in sizes], np.int64))
    cds = [(0, 2), (64, 1), (64, 2), (64, 4), (128, 1), (128, 2), (128, 4)]
    wss = [(0, 8), (64, 8), (128, 8), (128, 16)]
    wsps = [(0, 8), (0, 16), (64, 8), (128, 8), (128, 16), (0, 24), (64, 24), (128, 24)]
    names = ("sb_launch5", "sb_persist5", "sb_persist5_pf") + tuple(
        f"sb_launch5_c{c}_d{d}" for c, d in cds)
    ws_smem = {r: r * 8192 + 16 * r for _, r in wss + wsps}
    kernels = {n: {"smem": smem} for n in names}
    kernels.update({f"sb_ws5_c{c}_r{r}": {"smem": ws_smem[r]} for c, r in wss})
    kernels.update({f"sb_wsp5_c{c}_r{r}": {"smem": ws_smem[r]} for c, r in wsps})
    mod = PdlModule(Path(cubin).read_bytes(), kernels)
    s = drv.Stream()
    never = np.int32(0x13572468)

    def grid_of(nbytes: int) -> int:
        return -(-nbytes // UNIT)

    def per_launch(name: str = "sb_launch5"):
        return [mod.prepare(name, (grid_of(sz), 1, 1), (256, 1, 1), smem,
                            [np.uintp(int(w) + int(o)), np.uint64(sz // 16), never, np.uintp(int(sink))])
                for o, sz in zip(offs, sizes)]

    def timed(fn) -> float:
        times = []
        for i in range(reps + 2):
            drv.memset_d32_async(bar, 0, 1, s)
            e0, e1 = drv.Event(), drv.Event()
            e0.record(s)
            fn()
            e1.record(s)
            e1.synchronize()
            if i >= 2:
                times.append(e1.time_since(e0) / 1e3)
        return statistics.median(times)

    graphs = _Graphs()
    rows = []
    flat = mod.prepare("sb_launch5", (grid_of(total), 1, 1), (256, 1, 1), smem,
                       [np.uintp(int(w)), np.uint64(total // 16), never, np.uintp(int(sink))])
    rows.append(("flat", timed(lambda: mod.launch(flat, s.handle, pdl=False))))
    for label, pdl in (("launch", True), ("launch-np", False)):
        preps = per_launch()
        exe = graphs.capture(s, lambda: [mod.launch(p, s.handle, pdl=pdl) for p in preps])
        rows.append((label, timed(lambda: graphs.launch(exe, s))))
    for c, d in cds:   # a synthetic chain of c dependent FMAs per step, d steps in flight
        preps = per_launch(f"sb_launch5_c{c}_d{d}")
        exe = graphs.capture(s, lambda: [mod.launch(p, s.handle, pdl=True) for p in preps])
        rows.append((f"launch c{c} d{d}", timed(lambda: graphs.launch(exe, s))))
    for c, r in wss:   # a producer warp streaming an r-stage ring, 8 consumer warps (c FMAs)
        bps = min(7, (228 * 1024) // (ws_smem[r] + 1024))
        preps = [mod.prepare(f"sb_ws5_c{c}_r{r}", (min(grid_of(sz), SMS * bps), 1, 1), (288, 1, 1),
                             ws_smem[r], [np.uintp(int(w) + int(o)), np.uint64(sz // 16), never,
                                          np.uintp(int(sink))])
                 for o, sz in zip(offs, sizes)]
        exe = graphs.capture(s, lambda: [mod.launch(p, s.handle, pdl=True) for p in preps])
        rows.append((f"ws c{c} r{r} ({bps}/SM)", timed(lambda: graphs.launch(exe, s))))
    for c, r in wsps:  # persistent ws: the producer streams through the consumers' barriers
        bps = min(7, (228 * 1024) // (ws_smem[r] + 1024))
        p = mod.prepare(f"sb_wsp5_c{c}_r{r}", (SMS * bps, 1, 1), (288, 1, 1), ws_smem[r],
                        [np.uintp(int(w)), np.uintp(int(off16)), np.uintp(int(n16)),
                         np.int32(len(sizes)), never, np.uintp(int(sink)), np.uintp(int(bar))])
        rows.append((f"wsp c{c} r{r} ({bps}/SM)", timed(lambda: mod.launch(p, s.handle, pdl=False))))
    for label, name in (("persist", "sb_persist5"), ("persist-pf", "sb_persist5_pf")):
        p = mod.prepare(name, (SMS * blocks_per_sm, 1, 1), (256, 1, 1), smem,
                        [np.uintp(int(w)), np.uintp(int(off16)), np.uintp(int(n16)),
                         np.int32(len(sizes)), never, np.uintp(int(sink)), np.uintp(int(bar))])
        rows.append((label, timed(lambda: mod.launch(p, s.handle, pdl=False))))
    bw = copy_bandwidth(drv)
    print(f"{len(sizes)} matrices, {total / 1e9:.2f} GB, {blocks_per_sm} blocks per SM; copy "
          f"{bw / 1e12:.3f} TB/s in this run ({total / bw * 1e3:.3f} ms for these bytes)")
    for label, t in rows:
        print(f"  {label:18s} {t * 1e3:8.3f} ms  {total / t / 1e12:6.3f} TB/s  {100 * total / bw / t:5.1f} % of copy")
    return rows


if __name__ == "__main__":
    if sys.argv[1] == "build":
        build(sys.argv[2])
    else:
        run(sys.argv[2])

"""Time the 27B decode step's GDN launch alone (the program's own entry point, plan.gdn.gdn_entry) at
several B. Version 6 used it to compare a persistent variant (commit f3a5102, bench/NOTES.md);
version 17 the state loads issued after the conv (gdn_chunk GE) and, with GDN_STREAM=1, the
state traffic alone (scripts/gdn_stream.cuh).

  python3 scripts/gdn_bench.py build OUT.cubin          # CPU machine: nvcc the entry
  python3 scripts/gdn_bench.py run OUT.cubin [B ...]    # GPU machine: µs per launch
  python3 scripts/gdn_bench.py profile OUT.cubin B      # one launch, for ncu (scripts/ncu_stalls.sh)

Launches go back to back over a pool of state copies larger than L2 (as the graph's 48 layers
do), plain and with programmatic dependent launch. Speed figures of the step come from
`qwen38gen bench`; this only chooses and refutes schedules.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from qwen38gen.config import PRESETS  # noqa: E402
from qwen38gen.gate import compile_kernels  # noqa: E402
from qwen38gen.plan.arch import arch_facts  # noqa: E402
from qwen38gen.plan.entries import pad16  # noqa: E402
from qwen38gen.plan.gdn import gdn_entry, gdn_launch  # noqa: E402
from qwen38gen.tuning import Tuning  # noqa: E402

CFG = PRESETS["qwen3.8-27b"]


GE_ROWS = (0, 2, 4, 8, 16)


def entries():
    """The GDN decode instance with every state row requested first (the program's order until
    version 17) and with 12 of 16 rows in shared memory (SR = 12, three blocks per SM, the
    program's from B = 20 until version 17); then, version 17 (plan.gdn.gdn_state_rows_early), with
    the conv's copies requested first, then GE of a thread's 16 state rows and the others after
    the conv, for GE in GE_ROWS, and the program's B = 16 instance (GE 4, the first wave of 264
    blocks all rows early)."""
    arch, T = arch_facts("sm_90a"), Tuning.parse
    e = {"chunk": gdn_entry(CFG, 1, T(["gdn_ge=-1", "gdn_gw=0"]), arch, batch=64),
         "chunk_sr12": gdn_entry(CFG, 1, T(["gdn_sr=12", "gdn_gw=0"]), arch, batch=64)}
    for ge in GE_ROWS:
        e[f"chunk_ge{ge}"] = gdn_entry(CFG, 1, T([f"gdn_ge={ge}", "gdn_gw=0"]), arch, batch=64)
    e["chunk_b16"] = gdn_entry(CFG, 1, Tuning(), arch, batch=16)
    return e


# GDN_STREAM=1 (version 17): also the state traffic alone (scripts/gdn_stream.cuh), each kernel
# at 2 and 3 blocks per SM by shared-memory padding (76 registers: no more than 3): (kernel,
# blocks per SM) -> dynamic smem bytes.
STREAM = {(k, bps): {2: 100 << 10, 3: 70 << 10}[bps]
          for k in ("gs_c0_b0", "gs_c256_b0", "gs_c256_b6", "gs_c1024_b6") for bps in (2, 3)}


def build(cubin: str):
    src = '#include "gdn.cuh"\n' + "".join(e.render() for e in entries().values())
    src += (ROOT / "scripts" / "gdn_stream.cuh").read_text().replace("#pragma once", "")
    res = compile_kernels(src, "gdn_bench.cu", arch="sm_90a")
    shutil.copyfile(res.cubin, cubin)
    regs = {k.name: f"{k.registers} registers, {k.spill_stores} B spilled" for k in res.kernels}
    Path(cubin + ".json").write_text(json.dumps(
        {"regs": regs, "entries": {k: {"name": e.name, "threads": e.threads, "smem": e.smem}
                                   for k, e in entries().items()}}, indent=1))
    print(f"{len(regs)} kernels -> {cubin}: {regs}")


class Case:
    """Buffers of one GDN launch at batch B: shared activations and weights, NS state copies."""

    def __init__(self, drv, B: int, copies: int):
        import numpy as np

        c = CFG
        self.drv, self.B = drv, B
        self.C, self.Cv, self.hv = c.conv_dim, c.linear_value_dim, c.linear_num_value_heads
        self.ba_off = pad16(self.hv)
        self.ld = self.C + self.Cv + 2 * self.ba_off
        rng = np.random.default_rng(B)

        def bf(shape, scale):
            v = (rng.standard_normal(shape) * scale).astype(np.float32)
            return drv.to_device((v.view(np.uint32) >> 16).astype(np.uint16))

        self.mz = bf((B, self.ld), 1.0)
        self.conv_w = bf((self.C, c.linear_conv_kernel_dim), 0.5)
        self.A_log = drv.to_device(rng.uniform(-1, 1, self.hv).astype(np.float32))
        self.dt_bias = bf((self.hv,), 0.5)
        self.norm_w = drv.to_device(rng.uniform(0.5, 1.5, c.linear_value_head_dim).astype(np.float32))
        dkv = c.linear_key_head_dim * c.linear_value_head_dim
        n = B * self.hv * dkv
        state0 = (rng.standard_normal(n) * 0.5).astype(np.float32)
        self.states = [drv.to_device(state0) for _ in range(copies)]
        self.rings = [bf((B, c.linear_conv_kernel_dim - 1, self.C), 1.0) for _ in range(copies)]
        self.arr = drv.to_device(np.zeros(B * c.linear_num_key_heads, np.int32))
        self.pos = drv.to_device(rng.integers(3, 3000, B).astype(np.int32))
        self.ntok = drv.to_device(np.ones(B, np.int32))
        self.out = drv.mem_alloc(B * self.Cv * 2)

    def args(self, i: int):
        import numpy as np

        ptr = np.uintp
        k = i % len(self.states)
        a = [ptr(int(self.mz)), np.int32(self.ld), ptr(int(self.mz) + 2 * (self.C + self.Cv)),
             np.int32(self.ld), np.int32(self.ba_off), ptr(int(self.conv_w)), ptr(int(self.A_log)),
             ptr(int(self.dt_bias)), ptr(int(self.norm_w)), np.float32(1e-6), ptr(int(self.rings[k])),
             ptr(int(self.arr)), ptr(int(self.states[k])), ptr(int(self.pos)), ptr(int(self.ntok)),
             ptr(int(self.out))]
        return a

    def grid(self):
        return (self.B * gdn_launch(CFG, 1, Tuning())["blocks_per_seq"], 1, 1)


def run(cubin: str, batches: list[int], reps: int = 30):
    import numpy as np
    import pycuda.autoinit  # noqa: F401
    import pycuda.driver as drv

    from qwen38gen.bench import time_back_to_back
    from qwen38gen.launch import PdlModule
    from qwen38gen.runtime import allow_dynamic_smem

    meta = json.loads(Path(cubin + ".json").read_text())
    ents = meta["entries"]
    mod = drv.module_from_file(cubin)
    pdl = PdlModule(Path(cubin).read_bytes(), {e["name"]: {"smem": e["smem"]} for e in ents.values()})
    s = drv.Stream()
    rows = []
    for B in batches:
        state_bytes = B * CFG.linear_num_value_heads * CFG.linear_key_head_dim * CFG.linear_value_head_dim * 4
        case = Case(drv, B, max(2, (160 << 20) // state_bytes + 1))
        for kind, e in ents.items():
            fn = mod.get_function(e["name"])
            allow_dynamic_smem(fn, e["smem"])
            grid, block = case.grid(), (e["threads"], 1, 1)
            t = time_back_to_back(drv, s, lambda i: fn(*case.args(i), grid=grid, block=block,
                                                       shared=e["smem"], stream=s), reps)
            preps = [pdl.prepare(e["name"], grid, block, e["smem"], case.args(i))
                     for i in range(len(case.states))]
            tp = time_back_to_back(drv, s, lambda i: pdl.launch(preps[i % len(preps)], s.handle), reps)
            gbs = 2 * state_bytes / tp / 1e9
            rows.append({"B": B, "kernel": kind, "grid": grid[0], "us": t * 1e6, "us_pdl": tp * 1e6,
                         "state_gbs_pdl": gbs, "regs": meta["regs"].get(e["name"], "")})
        for (name, bps), smem in (STREAM.items() if os.environ.get("GDN_STREAM") else ()):
            fn = mod.get_function(name)
            allow_dynamic_smem(fn, smem)
            grid = (B * CFG.linear_num_value_heads, 1, 1)
            sargs = lambda i: [np.uintp(int(case.states[i % len(case.states)]))]  # noqa: E731
            t = time_back_to_back(drv, s, lambda i: fn(*sargs(i), grid=grid, block=(256, 1, 1),
                                                       shared=smem, stream=s), reps)
            spdl = PdlModule(Path(cubin).read_bytes(), {name: {"smem": smem}})
            preps = [spdl.prepare(name, grid, (256, 1, 1), smem, sargs(i)) for i in range(len(case.states))]
            tp = time_back_to_back(drv, s, lambda i: spdl.launch(preps[i % len(preps)], s.handle), reps)
            rows.append({"B": B, "kernel": f"{name}/{bps}", "grid": grid[0], "us": t * 1e6,
                         "us_pdl": tp * 1e6, "state_gbs_pdl": 2 * state_bytes / tp / 1e9,
                         "regs": meta["regs"].get(name, "")})
    print(f"{'B':>3s} {'kernel':18s} {'grid':>5s} {'us':>8s} {'us PDL':>8s} {'state GB/s':>10s}  regs")
    for r in rows:
        print(f"{r['B']:3d} {r['kernel']:18s} {r['grid']:5d} {r['us']:8.1f} {r['us_pdl']:8.1f} "
              f"{r['state_gbs_pdl']:10.0f}  {r['regs']}")
    return rows


def profile(cubin: str, B: int):
    import pycuda.autoinit  # noqa: F401
    import pycuda.driver as drv

    from qwen38gen.runtime import allow_dynamic_smem

    meta = json.loads(Path(cubin + ".json").read_text())
    mod = drv.module_from_file(cubin)
    import numpy as np

    case = Case(drv, B, 1)
    for kind, e in meta["entries"].items():
        fn = mod.get_function(e["name"])
        allow_dynamic_smem(fn, e["smem"])
        fn(*case.args(0), grid=case.grid(), block=(e["threads"], 1, 1), shared=e["smem"])
        drv.Context.synchronize()
    if os.environ.get("GDN_STREAM"):   # the state traffic alone, at two blocks per SM
        for (name, bps), smem in STREAM.items():
            if bps == 2:
                fn = mod.get_function(name)
                allow_dynamic_smem(fn, smem)
                fn(np.uintp(int(case.states[0])), grid=(B * CFG.linear_num_value_heads, 1, 1),
                   block=(256, 1, 1), shared=smem)
                drv.Context.synchronize()


if __name__ == "__main__":
    if sys.argv[1] == "build":
        build(sys.argv[2])
    elif sys.argv[1] == "profile":
        profile(sys.argv[2], int(sys.argv[3]))
    else:
        run(sys.argv[2], [int(b) for b in sys.argv[3:]] or [16, 64])

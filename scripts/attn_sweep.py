"""Sweep attn_tc's schedule knobs (kernels/attention_tc.cuh AttnTcLaunch: NW, ST, SP, MB) over the
27B decode geometry (D = 256, H = 24, HKV = 4, PT = 1).

  python3 scripts/attn_sweep.py build OUT.cubin          # CPU machine: nvcc the variants
  python3 scripts/attn_sweep.py run OUT.cubin [OUT.json]  # GPU machine: check, time (PyCUDA)
  (ATTN_CASES="64:1024,16:1024" and ATTN_ONLY="tc_nw2,..." (substrings of variant names) narrow
  the run; `profile` instead of `run` launches each chosen variant twice, for ncu.)

Arithmetic classes: NW (warps, 16 slots each per block step) and SP (slots per split) decide the
order of a row's fp32 arithmetic; ST (cp.async ring stages), MB (min blocks per SM) and grid.x
only reschedule it. Every variant of a class must give bitwise the
output of the class's first variant (checked); a variant of another class is compared with the
first variant of the sweep (the program's schedule) within a relative L2 tolerance instead
(reported as `relerr`).
Every row of a batch sees n = T slots. The K/V caches rotate over distinct per-layer buffers
(≥ 8 of them, ≥ 256 MiB in all), so no launch finds its cache in L2 (50 MB). The split scratch
(part) and the arrival counters are sized as qwen38gen/plan sizes attn_part / attn_arrivals; the counters
must be 0 again after every launch (checked at the end of each variant).
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from qwen38gen.gate import compile_kernels  # noqa: E402

D, H, HKV, PT = 256, 24, 4, 1
G = H // HKV
LD = 2 * H * D + 2 * HKV * D  # the fused q|gate|k|v projection row
MAX_SPLITS = 32
# (NW, ST, SP, MB). The first is the program's schedule (plan.attention, Tuning's attn_*): the bitwise
# reference of its class and the tolerance reference of every other class. Version 10's sweep
# (dd8da46:bench/2026-12-03-h200-v10-attn-sweep-3.txt) chose it; the CUDA-core kernel attn and
# attn_tc's two QK chains (QC 2) it was compared with there are no longer in kernels/.
VARIANTS = [
    (4, 2, 256, 0),
    (4, 3, 256, 0),
    (4, 2, 128, 0),
    (2, 2, 256, 0),
    (2, 3, 256, 0),
]
CASES = [(1, 1024), (1, 4096), (16, 1024), (64, 1024)]  # (B, T): every row sees n = T slots
POOL = 256 << 20   # bytes of distinct K/V per case (at least 8 layers)
TOL = 1e-2         # relative L2 error per row against the default schedule (other classes)


def name(v):
    return "sw_attn_tc_nw{}_st{}_sp{}_mb{}".format(*v)


def targs(v):
    return f"{D}, {H}, {HKV}, {PT}, " + ", ".join(str(x) for x in v)


def launch_struct(v):
    return f"q38::AttnTcLaunch<{targs(v)}>"


def sp_of(v):
    return v[2]


def mb_of(v):
    return v[3]


def arith_class(v):
    """Variants of one class must agree bitwise: (NW, SP)."""
    return (v[0], v[2])


def threads(v):
    return 32 * v[0]


def dyn_smem(v):
    from qwen38gen.config import PRESETS
    from qwen38gen.plan.attention import attn_tc_smem
    return attn_tc_smem(PRESETS["qwen3.8-27b"], nw=v[0], st=v[1])


def span(n, sp):
    return sp * -(-(-(-n // sp)) // MAX_SPLITS)


def splits(n, sp):
    return -(-n // span(n, sp))


def stride(tmax, sp):
    return min(MAX_SPLITS, -(-tmax // sp))


def part_floats():
    return G * D + -(-2 * G // 4) * 4


def grid_x(blocks):
    """The program's grid.x for this many (row, kv head) pairs."""
    from qwen38gen.plan.arch import arch_facts
    from qwen38gen.plan.attention import attn_blocks, attn_grid_x
    from qwen38gen.tuning import Tuning
    return attn_grid_x(blocks, attn_blocks(Tuning(), arch_facts("sm_90a")))


def source() -> str:
    out = ['#include "attention_tc.cuh"', "using q38::bf16;"]
    for v in VARIANTS:
        A = launch_struct(v)
        lb = f"{A}::threads, {A}::min_blocks" if mb_of(v) else f"{A}::threads"
        out.append(
            f'extern "C" __global__ void __launch_bounds__({lb}) {name(v)}('
            "const bf16* qbuf, const bf16* qkv, int ld, const bf16* kc, const bf16* vc, int tmax, "
            "const int* pos, const int* ntok, float* part, int* arrivals, bf16* o) { "
            f"static_assert({A}::threads == {threads(v)}, \"threads\"); "
            f"static_assert({A}::dyn_smem_bytes == {dyn_smem(v)}, \"smem\"); "
            f"static_assert({A}::part_floats == {part_floats()}, \"part\"); "
            f"q38::attn_tc<{targs(v)}>(qbuf, qkv, ld, kc, vc, tmax, pos, ntok, part, arrivals, o); }}")
    return "\n".join(out) + "\n"


def occupancy(v, regs, smem_static):
    """Theoretical blocks per SM on an H200 (sm_90: 64K registers in 256-register warp units,
    228 KiB shared memory per SM with 1 KiB reserved per block, 64 warps, 32 blocks)."""
    warps = threads(v) // 32
    per_warp = -(-regs * 32 // 256) * 256
    by_regs = 65536 // (per_warp * warps)
    by_smem = (228 * 1024) // (smem_static + dyn_smem(v) + 1024)
    return min(by_regs, by_smem, 64 // warps, 32)


def build(cubin: str):
    res = compile_kernels(source(), "attn_sweep.cu")
    shutil.copyfile(res.cubin, cubin)
    info = {k.name: {"regs": k.registers, "smem": k.smem,
                     "spill": (f"{k.spill_stores}/{k.spill_loads} B spilled, stack {k.stack} B"
                               if k.spill_stores or k.spill_loads or k.stack else "")}
            for k in res.kernels}
    print(f"{'variant':36s} {'thr':>4s} {'regs':>4s} {'smem':>6s} {'dyn':>6s} blk/SM warps/SM")
    for v in VARIANTS:
        i = info[name(v)]
        i["blocks_per_sm"] = occupancy(v, i["regs"], i["smem"])
        i["dyn_smem"] = dyn_smem(v)
        print(f"{name(v):36s} {threads(v):4d} {i['regs']:4d} {i['smem']:6d} {dyn_smem(v):6d} "
              f"{i['blocks_per_sm']:6d} {i['blocks_per_sm'] * threads(v) // 32:8d}"
              + (f"  SPILL {i['spill']}" if i["spill"] else ""))
    Path(cubin + ".regs.json").write_text(json.dumps(info, indent=1))
    print(f"{len(VARIANTS)} variants -> {cubin}")


def run(cubin: str, reps: int = 30):
    import numpy as np
    import pycuda.autoinit  # noqa: F401
    import pycuda.driver as drv

    from qwen38gen.perf.bench import time_back_to_back
    from qwen38gen.runtime import allow_dynamic_smem

    mod = drv.module_from_file(cubin)
    info = json.loads(Path(cubin + ".regs.json").read_text())
    rng = np.random.default_rng(0)
    s = drv.Stream()

    def bf16(a):
        return (np.ascontiguousarray(a, np.float32).view(np.uint32) >> 16).astype(np.uint16)

    import os
    cases = ([tuple(int(x) for x in c.split(":")) for c in os.environ["ATTN_CASES"].split(",")]
             if os.environ.get("ATTN_CASES") else CASES)
    only = [x for x in os.environ.get("ATTN_ONLY", "").split(",") if x]
    results = []
    for B, T in cases:
        layer = B * HKV * T * D * 2               # bytes of one of K, V for one layer
        nbuf = max(8, -(-POOL // (2 * layer)))
        kv = [drv.mem_alloc(2 * layer) for _ in range(nbuf)]
        # buffer 0 random (the comparisons read it), the others copies of it
        drv.memcpy_htod(kv[0], bf16(rng.standard_normal(2 * layer // 2, dtype=np.float32)))
        for a in kv[1:]:
            drv.memcpy_dtod(a, kv[0], 2 * layer)
        qbuf = drv.to_device(bf16(rng.standard_normal((B, H, D), dtype=np.float32)))
        qkv = drv.to_device(bf16(rng.standard_normal((B, LD), dtype=np.float32)))
        pos = drv.to_device(np.full(B, T - 1, np.int32))
        ntok = drv.to_device(np.ones(B, np.int32))
        # attn_part [rmax, Hkv, Tsplits, part_floats] at the largest stride any variant uses
        part = drv.mem_alloc(B * HKV * MAX_SPLITS * part_floats() * 4)
        drv.memset_d32(part, 0x7FC00000, B * HKV * MAX_SPLITS * part_floats())  # NaN
        arr = drv.to_device(np.zeros((B, HKV), np.int32))                     # attn_arrivals
        o = drv.mem_alloc(B * H * D * 2)
        kvbytes = B * HKV * T * D * 2 * 2
        ref = {}  # class (NW, SP) -> first output of the class; None key: the default's
        for v in VARIANTS:
            nm = name(v)
            if info.get(nm, {}).get("spill") or (only and not any(x in nm for x in only)):
                continue
            fn = mod.get_function(nm)
            sm = dyn_smem(v)
            allow_dynamic_smem(fn, sm)
            gx0 = grid_x(B * HKV * PT)
            for gx in sorted({max(1, gx0 // 2), gx0, min(MAX_SPLITS, 2 * gx0)}):
                grid, block = (gx, B * HKV, PT), (threads(v), 1, 1)

                def launch(i):
                    k = kv[i % nbuf]
                    fn(qbuf, qkv, np.int32(LD), k, np.intp(int(k) + layer), np.int32(T), pos,
                       ntok, part, arr, o, grid=grid, block=block, shared=sm, stream=s)
                drv.memset_d16(o, 0x7FC0, B * H * D)  # NaN
                try:
                    launch(0)
                    s.synchronize()
                except drv.Error as e:
                    print(f"B={B} T={T} {nm} gx={gx}: launch failed ({e})", flush=True)
                    break
                out = drv.from_device(o, (B, H * D), np.uint16)
                outf = (out.astype(np.uint32) << 16).view(np.float32)
                cls = arith_class(v)
                if None not in ref:
                    ref[None] = outf
                if cls not in ref:
                    ref[cls] = out
                same = bool(np.array_equal(out, ref[cls]))
                r0 = ref[None].astype(np.float64)
                err = float(max(np.linalg.norm(outf[b] - r0[b]) / np.linalg.norm(r0[b])
                                for b in range(B)))
                ok = same and np.all(np.isfinite(outf)) and err < TOL
                t = time_back_to_back(drv, s, launch, reps)
                counters = int(np.count_nonzero(drv.from_device(arr, (B, HKV), np.int32)))
                results.append({"B": B, "T": T, "variant": list(v), "name": nm, "gx": gx,
                                "us": t * 1e6, "gbs": kvbytes / t / 1e9, "bitwise_class": same,
                                "rel_err_vs_default": err, "ok": bool(ok and counters == 0),
                                "counters_nonzero": counters, "splits": splits(T, sp_of(v)),
                                "regs": info[nm]["regs"], "smem": info[nm]["smem"],
                                "dyn_smem": sm, "blocks_per_sm": info[nm]["blocks_per_sm"]})
        for a in kv + [qbuf, qkv, pos, ntok, part, arr, o]:
            a.free()
    return results


def report(results):
    print(f"{'B':>3s} {'T':>5s} {'NW ST SP MB':20s} {'gx':>3s} {'us':>8s} {'GB/s':>7s} "
          f"{'same':4s} {'relerr':>8s} regs blk/SM")
    for r in results:
        print(f"{r['B']:3d} {r['T']:5d} {' '.join(map(str, r['variant'])):20s} {r['gx']:3d} "
              f"{r['us']:8.2f} {r['gbs']:7.0f} {'yes' if r['bitwise_class'] else 'NO':4s} "
              f"{r['rel_err_vs_default']:8.1e} {r['regs']:4d} {r['blocks_per_sm']:3d}"
              f"{'' if r['ok'] else '  FAIL'}")
    print("\nbest per (B, T) (ok variants), against the default schedule at the plan's gx:")
    best, base = {}, {}
    for r in results:
        k = (r["B"], r["T"])
        if k not in base:
            base[k] = r
        if r["ok"] and (k not in best or r["us"] < best[k]["us"]):
            best[k] = r
    for k, r in best.items():
        print(f"  B={k[0]:2d} T={k[1]:4d}: {' '.join(map(str, r['variant']))} gx={r['gx']} "
              f"{r['us']:8.2f} us {r['gbs']:6.0f} GB/s  (default {base[k]['us']:.2f} us "
              f"{base[k]['gbs']:.0f} GB/s; x16 layers {16 * r['us'] / 1e3:.3f} ms)")
    print("\nper arithmetic class (NW/SP): the best time of each T = 1024 case")
    cls = {}
    for r in results:
        if r["ok"] and r["T"] == 1024:
            c = tuple(map(str, arith_class(r["variant"])))
            k = (c, r["B"])
            if k not in cls or r["us"] < cls[k]["us"]:
                cls[k] = r
    for c in sorted({c for c, _ in cls}):
        rows = [cls[(c, B)] for B in (1, 16, 64) if (c, B) in cls]
        print(f"  {'/'.join(c)}: " + ", ".join(
            f"B={r['B']} {r['us']:.1f} us ({' '.join(map(str, r['variant']))} gx={r['gx']})"
            for r in rows))


if __name__ == "__main__":
    if sys.argv[1] == "build":
        build(sys.argv[2])
    elif sys.argv[1] == "profile":
        run(sys.argv[2], reps=2)
    else:
        res = run(sys.argv[2])
        report(res)
        if len(sys.argv) > 3:
            Path(sys.argv[3]).write_text(json.dumps(res, indent=1))

"""The program plan: which kernel instantiations a model and lane choice need, their entry points,
the buffers, the fused weights, and the launch schedule of a decode step and a prefill chunk.

Each kernel header in kernels/ has one builder here that knows its template arguments, its C
signature and its launch rule; nothing else in the package knows a kernel's signature.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field

from .config import ModelConfig
from .errors import UserError
from .lanes import Lanes

# ------------------------------------------------------------------------------------ entries


@dataclass(frozen=True)
class Entry:
    """One extern "C" __global__ entry point wrapping a q38:: kernel body."""

    name: str
    call: str                               # e.g. "q38::gemv_q4<512, 1, 2, 4, 0>"
    params: tuple[tuple[str, str], ...]     # (C type, name), in argument order
    threads: int
    smem: int = 0                           # dynamic shared memory bytes
    cluster: int = 1                        # thread-block cluster size along x (1: none)
    min_blocks: int = 0                     # __launch_bounds__ minBlocksPerSM (0: not given)
    # Blocks per SM the schedule was measured at and its grid sized for, where that is more than
    # min_blocks promises: the gate fails a build whose registers or shared memory allow fewer
    # (0: not checked). Not rendered; the manifest carries it.
    resident: int = 0
    asserts: tuple[str, ...] = ()           # C++ constant expressions that must hold
    # Programmatic dependent launch: the entry point lets the next kernel launch, then waits for
    # the previous one before the body runs, unless the body calls q38::pdl_wait() itself (after
    # loading only data no kernel of the same graph writes).
    waits: bool = False

    def render(self, trace_kid: int | None = None) -> str:
        """The entry point's source; trace_kid: in the trace variant of a program (trace.cuh), the
        body runs inside a TraceScope that records this entry's index."""
        sig = ", ".join(f"{t} {n}" for t, n in self.params)
        args = ", ".join(n for _, n in self.params)
        pre = "q38::pdl_launch_dependents(); " + ("" if self.waits else "q38::pdl_wait(); ")
        if trace_kid is not None:
            pre = f"q38::TraceScope q38_trace_scope({trace_kid}); " + pre
        checks = "".join(f'static_assert({a}, "{self.name}: launch shape out of date");\n'
                         for a in self.asserts)
        cl = f" __cluster_dims__({self.cluster}, 1, 1)" if self.cluster > 1 else ""
        lb = f"{self.threads}, {self.min_blocks}" if self.min_blocks else f"{self.threads}"
        return (f"{checks}"
                f'extern "C" __global__ void __launch_bounds__({lb}){cl}\n'
                f"{self.name}({sig}) {{ {pre}{self.call}({args}); }}\n")

    def manifest(self) -> dict:
        m = {"block": [self.threads, 1, 1], "smem": self.smem, "cluster": self.cluster,
             "params": [list(p) for p in self.params], "call": self.call}
        if self.resident:
            m["resident"] = self.resident
        return m


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def pad16(n: int) -> int:
    return cdiv(n, 16) * 16


# ------------------------------------------------------------------------------------ GEMV
GEMV_KS = 8    # warps per block splitting K (fewer when K has fewer groups)
GEMV_PARAMS = (("const uint4*", "qweight"), ("const q38::bf16*", "scales"),
               ("const q38::bf16*", "x"), ("int", "ldx"), ("q38::bf16*", "y"), ("int", "ldy"),
               ("int", "N"), ("int", "R"))


GEMM_SMS = 132           # an H200's SMs: the grid the ZS split aims to fill
# Blocks of gemv_q4 (8 warps, <= 64 registers at MT = 1, NT = 1) that fit an H200 at once.
GEMV_WAVE = 4 * GEMM_SMS


# gemv_q4's ZS (kernels/gemv_q4.cuh): a row block's KS parts spread over a cluster of ZS blocks.
# QWEN38_GEMV_ZS=1 turns the rule below off and any other value forces that ZS on every weight it
# may serve at btg <= 16 (A/B runs; bench/NOTES.md, version 12).
GEMV_ZS = os.environ.get("QWEN38_GEMV_ZS")


def gemv_split(rows: int, k: int, mt: int, btg: int, R: int) -> int:
    """ZS of gemv_q4 for a weight of `rows` x `k` at mt m-tiles per warp over R rows in btg-row
    tiles: the blocks of a cluster that share a row block's KS parts (1: one block holds them).
    Where 16-row tiles of a one-wave weight (the out and down projections: 320 row blocks of
    77 registers, two or three per SM) run in a single tile, pairs of 4-warp blocks even out the
    SMs' shares: down 24.9 -> 22.5 us, out 10.5 -> 10.0 us under PDL, the B = 16 step 8.58 ->
    8.37 ms. At one row (80 against 72 registers), on the multi-wave weights and at 32-row
    tiles (the out projection of B = 32 and 64, bound by its warps' own chain: 20.0 us at ZS 1
    and 8) it did not win (bench/2026-12-03-h200-v12-gemv-sweep-zs*.txt)."""
    ks = min(GEMV_KS, k // 128)
    tiles = rows // 16
    if GEMV_ZS:
        if GEMV_ZS not in ("1", "2", "4", "8"):
            raise UserError(f"QWEN38_GEMV_ZS={GEMV_ZS!r}: use 1 (no cluster split), or 2, 4 or 8 "
                            "(that split on every one-wave weight at btg <= 16), or leave it unset")
        zs = int(GEMV_ZS)
        return zs if btg <= 16 and mt == 1 and tiles < GEMV_WAVE and ks % zs == 0 else 1
    if btg == 16 and R <= btg and mt == 1 and tiles < GEMV_WAVE and ks % 2 == 0:
        return 2
    return 1


def gemv_config(rows: int, k: int, btg: int) -> tuple[int, int, int, int]:
    """(MT, ST, XS, AS) for a weight of `rows` x `k` at batch tile btg: m-tiles per warp, pipeline
    stages, activations staged in registers, stages in shared memory via cp.async. None of them
    changes a row's result (only KS does, and KS depends on k alone; tests/gpu/test_gemv_q4.py
    checks the bits), so the choice may follow the shape and the batch tile. From the sweeps of
    scripts/gemv_sweep.py on an H200 (bench/NOTES.md, version 2): deeper register pipelines lose
    everywhere (registers cost occupancy); two m-tiles per warp halve the activation reads and win
    from btg = 16 on the wide shapes; the cp.async ring wins only on the lm_head (+7%). Version 6:
    where the row blocks fit the GPU in one wave (the down and out projections, 320 of them),
    occupancy is not the limit and each warp's activation loads are: staged with the weights one
    group ahead (XS = 1), the down projection at btg 8 took 15.9 against 20.5 us under PDL and out
    6.8 against 8.6 (bench/2026-12-02-h200-v6-gemv-sweep-persistent.txt)."""
    tiles = rows // 16
    if btg <= 8 and tiles < GEMV_WAVE:
        return 1, 2, 1, 0
    if tiles % 2:
        return 1, 2, 0, 0
    if rows >= 65536 and btg <= 16:
        return 2, 3, 0, 1
    if btg >= 32 or (btg >= 16 and rows >= 8192):
        return 2, 2, 0, 0
    return 1, 2, 0, 0


EPI_SWIGLU = 2  # gemv_q4.cuh GemvEpilogue
# SwiGLU in the epilogue of the gate_up GEMV wherever gemv_q4 serves it (QWEN38_SWIGLU_FUSE=0
# emits the separate swiglu kernel instead, for A/B runs): bench/NOTES.md, version 11.
SWIGLU_FUSE = os.environ.get("QWEN38_SWIGLU_FUSE", "1") != "0"


def swiglu_fuses(btg: int, R: int) -> bool:
    """Whether gate_up (on gemv_q4) takes SwiGLU into its epilogue at batch tile btg over R rows.
    It needs MT = 2 (a gate and an up tile per block). Measured in the step (bench/NOTES.md,
    version 11; fused against separate, same run): 16 rows, gate_up's own schedule, 8.732 ->
    8.599 ms at B = 16; 1 row with the cp.async ring, 5.141 -> 5.004 ms at B = 1; but at 4 and 8
    rows every MT = 2 schedule tried was slower than MT = 1 by more than the kernel saved (B = 8
    6.148 -> 6.349 ms), so B = 2 ... 8 keep the separate swiglu kernel, and so do tiles of 32
    rows and more where gemv_q4 serves gate_up (sm_90 lanes without wgmma: not measured)."""
    return btg == 16 or (btg == 8 and R == 1)


def gemv_swiglu_config(btg: int) -> tuple[int, int, int]:
    """(ST, XS, AS) of the fused gate_up + SwiGLU launch (MT = 2): at 16 rows gemv_config's
    gate_up schedule; at one row the cp.async ring (70 registers, 4 blocks per SM; in registers
    MT = 2 takes 80 and cost 4.6 us a launch)."""
    return (3, 0, 1) if btg <= 8 else (2, 0, 0)


def gemv_smem(k: int, mt: int, st: int, a: int, zs: int = 1) -> int:
    """Dynamic shared memory of a gemv_q4 instance (GemvLaunch::dyn_smem_bytes)."""
    return a * min(GEMV_KS, k // 128) // zs * st * mt * 66 * 16


def gemv_entry(k: int, btg: int, epi: int, mt: int = 1, st: int = 2, xs: int = 0,
               a: int = 0, ms: int = 0, zs: int = 1) -> Entry:
    """ms > 0 (with epi = EPI_SWIGLU, mt = 2): the block's m-tiles are gate tile t and up tile
    t + ms of a fused gate_up weight. zs > 1: a cluster of zs blocks of ks/zs warps per row
    block (grid.x = row blocks · zs)."""
    ks = min(GEMV_KS, k // 128)
    nt = btg // 8
    smem = gemv_smem(k, mt, st, a, zs)
    tmpl = (f"{k}, {mt}, {nt}, {ks}, {epi}, {st}, {xs}, {a}"
            + (f", 0, {ms}, {zs}" if zs > 1 else f", 0, {ms}" if ms else ""))
    return Entry(name=f"q38_gemv_k{k}_m{mt}_n{nt}_s{ks}_e{epi}_st{st}_x{xs}" + ("_a1" if a else "")
                 + (f"_ms{ms}" if ms else "") + (f"_z{zs}" if zs > 1 else ""),
                 call=f"q38::gemv_q4<{tmpl}>",
                 params=GEMV_PARAMS, threads=32 * ks // zs, smem=smem, waits=True, cluster=zs,
                 # minBlocks 1 lets ptxas use up to 255 registers: with the default it capped
                 # the 4-warp NT=4 instance at 128 and spilled.
                 min_blocks=1,
                 asserts=(f"q38::GemvLaunch<{mt}, {nt}, {ks}, {st}, {a}"
                          + (f", {zs}" if zs > 1 else "") + f">::dyn_smem_bytes == {smem}",))


# gemm_q4 (kernels/gemm_q4.cuh): gemv_q4's arithmetic with the activations shared by the warps
# of a block through a cp.async ring. ZS blocks split K's parts when the row blocks alone would
# not fill the GPU.
GEMM_PARAMS = GEMV_PARAMS + (("float*", "part"), ("int*", "arrivals"))


def gemm_config(rows: int, k: int, btg: int) -> tuple[int, int, int, int] | None:
    """(MT, WR, ST, MB) of gemm_q4 for a weight of `rows` x `k` at batch tile btg (m-tiles per
    warp, warps per block, ring stages, min blocks per SM), or None where gemv_q4 is faster.
    Scheduling only: a row's result is gemv_q4's. From scripts/gemv_sweep.py on an H200
    (bench/NOTES.md, version 3): at 64 rows gemm_q4 wins on the wide shapes (gate_up 137.5 ->
    126.8 us, gdn.in 67.5 -> 52.6 us, lm_head 964 -> 556 us against gemv_q4 in two 32-row tiles)
    and, split over 8 blocks, on the down projection (72.6 -> 70.7 us); the out projection stays
    with gemv_q4. At 32 rows gemm_q4 won alone too (gate_up 74.5 -> 66.5 us, lm_head 497 -> 308,
    down 49.6 -> 44.9) and took the step's GEMV time from 12.37 to 11.75 ms, but the B = 32 step
    itself measured 17.84 against 17.57 ms, so btg 32 stays with gemv_q4. At 16 rows and below
    gemv_q4 wins everywhere."""
    if btg < 64:
        return None
    if rows >= 8192:
        return 2, 4, 3, 1
    if k >= 2 * rows:     # few rows, long K (the down projection): split K over blocks
        return 1, 8, 3, 2
    return None


def gemv_tile(rows: int, k: int, btg: int) -> int:
    """The batch tile a launch of this weight runs with: the lane's btg, but gemv_q4 runs a
    64-row lane in 32-row tiles (its 64-row instance is slower: 33.7 against 30.4 us on the out
    projection)."""
    return 32 if btg >= 64 and gemm_config(rows, k, btg) is None else btg


def gemm_smem(k: int, mt: int, nt: int, wr: int, st: int, zs: int) -> int:
    """Dynamic shared memory of a gemm_q4 instance (GemmLaunch::dyn_smem_bytes)."""
    ks = min(GEMV_KS, k // 128)
    sums = wr * mt * nt * 4 * 32 * 4 if ks > 1 and zs == 1 else 0
    return st * (8 * nt * 17 + wr * mt * 66) * 16 + sums


def gemm_split(blocks: int, k: int, per_sm: int) -> int:
    """ZS: 1 when the row blocks nearly fill the GPU (three quarters of per_sm blocks per SM), else
    the fewest blocks per row block (a divisor of KS) that give about one wave of resident blocks
    (per_sm per SM). (gdn.in at 64 rows: 129 blocks at ZS = 1 measured 52.6 us; down: 40 row blocks,
    ZS = 8 70.7 us against 155.8 us at ZS = 1.)"""
    ks = min(GEMV_KS, k // 128)
    if blocks >= GEMM_SMS * per_sm * 3 // 4:
        return 1
    zs = 1
    while zs < ks and blocks * zs < GEMM_SMS * per_sm and ks % (2 * zs) == 0:
        zs *= 2
    return zs


def gemm_launch(rows: int, k: int, btg: int, R: int) -> tuple[int, int, int, int, int] | None:
    """(MT, WR, ST, ZS, MB) of the gemm_q4 launch of a weight over R activation rows, or None
    where gemv_q4 serves it: gemm_config's schedule, the split gemm_split gives its grid, and
    the register cap only where the split is (in-block part sums need more than 128)."""
    gc = gemm_config(rows, k, btg)
    if gc is None:
        return None
    mt, wr, st, mb = gc
    zs = gemm_split(cdiv(cdiv(rows, 16), mt * wr) * cdiv(R, btg), k, mb)
    return mt, wr, st, zs, (mb if zs > 1 else 1)


def gemm_entry(k: int, btg: int, epi: int, mt: int, wr: int, st: int, zs: int,
               mb: int = 1) -> Entry:
    ks = min(GEMV_KS, k // 128)
    nt = btg // 8
    smem = gemm_smem(k, mt, nt, wr, st, zs)
    targs = f"{k}, {mt}, {nt}, {ks}, {epi}, {wr}, {st}, {zs}"
    return Entry(name=f"q38_gemv_k{k}_g{mt}_n{nt}_w{wr}_s{ks}_e{epi}_st{st}_z{zs}_b{mb}",
                 call=f"q38::gemm_q4<{targs}>", params=GEMM_PARAMS, threads=32 * wr, smem=smem,
                 waits=True, min_blocks=mb,
                 asserts=(f"q38::GemmLaunch<{mt}, {nt}, {ks}, {wr}, {st}, {zs}>::dyn_smem_bytes "
                          f"== {smem}",))


def gemm_part_floats(k: int, mt: int, nt: int, wr: int) -> int:
    """fp32 partials per row block of a ZS > 1 launch (GemmLaunch::part_floats)."""
    return min(GEMV_KS, k // 128) * wr * mt * nt * 4 * 32


# wgmma_q4 (kernels/wgmma_q4.cuh, sm_90a): gemv_q4's arithmetic on warpgroup MMA, the four warps
# of a warpgroup owning 64 rows and the activation tile in shared memory as the B operand.
def wgmma_smem(k: int, nt: int, wg: int, mw: int, xs: int, zs: int, xt: int = 0) -> int:
    """Dynamic shared memory of a wgmma_q4 instance (WgmmaLaunch::dyn_smem_bytes): the weight
    ring, the activation tiles (XT = 1: one per ring stage, else two), the part sums."""
    ks = min(GEMV_KS, k // 128)
    sums = 128 * wg * mw * nt * 4 * 4 if ks > 1 and zs == 1 else 0
    slots = xs if xt else 2
    return xs * 4 * wg * mw * 66 * 16 + slots * 8 * nt * 256 + sums


def wgmma_part_floats(k: int, nt: int, wg: int, mw: int) -> int:
    """fp32 partials per row block of a ZS > 1 launch (WgmmaLaunch::part_floats)."""
    return min(GEMV_KS, k // 128) * 128 * wg * mw * nt * 4


def wgmma_config(rows: int, k: int, btg: int) -> tuple[int, int, int, int] | None:
    """(WG, MW, XS, MB) of wgmma_q4 for a weight of `rows` x `k` at batch tile btg (warpgroups
    per block, 64-row blocks per warpgroup, weight ring stages, min blocks per SM), or None where
    gemm_q4 / gemv_q4 are faster. Scheduling only: a row's result is gemv_q4's (the tensor cores
    add a wgmma k-step as they add mma.sync's: tests/gpu/test_gemv_q4.py). sm_90a lanes only."""
    return WGMMA_TABLE.get((btg, _shape_kind(rows, k)))


SHAPE_KINDS = ("lm_head", "gate_up", "in", "long", "narrow")   # what _shape_kind returns


def _shape_kind(rows: int, k: int) -> str:
    """The sweep's shape classes (the 27B's weights): the lm_head; the gate_up projection; the
    in projections; few rows over a long K (the down projection); the rest (the out projection)."""
    if rows >= 65536:
        return "lm_head"
    if rows >= 24576:
        return "gate_up"
    if rows >= 8192:
        return "in"
    return "long" if k >= 2 * rows else "narrow"


# From scripts/gemv_sweep.py on an H200 (bench/NOTES.md, version 4), us per launch against the
# kernel ops picks otherwise: btg 64 gate_up 116.8 against gemm_q4's 124.9, gdn.in / attn.in
# 51.5 / 50.6 against 52.2 / 52.2, down (split over blocks) 70.1-70.8 against 70.7; btg 32
# lm_head 377.6 against gemv_q4's 494.1. Everything else measured slower on wgmma_q4.
WGMMA_TABLE: dict[tuple[int, str], tuple[int, int, int, int]] = {
    (64, "gate_up"): (3, 1, 4, 1),
    (64, "in"): (2, 1, 4, 1),
    (64, "long"): (4, 1, 3, 1),
    (32, "lm_head"): (2, 2, 4, 1),
}
# XT = 1 (the activations already in tile order, written so by the norm or SwiGLU before the
# GEMV; each group's tile is one contiguous cp.async copy into the ring instead of loads,
# a register transpose and shared stores): (WG, MW, XS, MB, PP), from version 7's sweeps, us per
# launch under PDL. 64 rows (bench/2026-12-02-h200-v7-gemv-sweep-xt.txt): gdn.in 49.4 -> 31.4,
# attn.in 48.3 -> 30.9, gate_up 111.5 -> 90.3, down 67.1 -> 60.4. 32 rows, with PP = 1 (two
# register sets: a group's wgmmas run while the next is dequantized; -v7-gemv-sweep-pp.txt):
# gdn.in 26.0 and attn.in 25.6 against gemv_q4's ~35, gate_up 68.2 against ~74. At 64 rows PP
# measured within 2 % (gate_up 85.7 against 87.1 and 89.1 in two runs; the in projections 2 us
# slower), so only gate_up takes it there. The lm_head (decode steps of lanes without mtp, where
# the final norm feeds it directly): 441-443 us against gemm_q4's ~556 at 64 rows, 320 against
# 370 at 32. Version 8 (bench/2026-12-03-h200-v8-gemv-sweep-mb.txt): two ring stages and three
# blocks per SM (138 registers, 3 x 40 KiB of ring) take gate_up at 64 rows from 86.2 (PP) to
# 72.2 us and the lm_head from 442 to 403; the in projections (one wave at two blocks per SM)
# stay, 41.7 against 31.3 with two stages. The second sweep (-v8-gemv-sweep-mb2.txt): one
# warpgroup per block at three blocks per SM also for the split down projection (64 rows: 45.1
# against 60.5 us at WG 4; 32 rows, now in tile order: 30.6 against gemv_q4's 48.3), gate_up at
# 32 rows (54.0 against 68.3 with PP) and the 32-row lm_head (289.7 at four blocks per SM against
# ~320). At 16 rows gemv_q4 stays ahead on every shape but the lm_head (221 against 241 us, a
# single launch: not taken). Used where the caller's producer can write the order.
# 24 rows (version 16, m64n24k16; bench/2026-12-04-h200-v16-gemv-sweep-t24.txt, us under PDL):
# gate_up 55.6 at ZS 4 and four blocks per SM (62.9 with the 32-row schedule, 53.7 at 32 rows),
# the in projections 24.9 / 24.4 (PP), out 13.7 and down 26.5 (split as at 32 rows: 15.6 and
# 30.6 there), the lm_head 287.0; the step's GEMVs 8.00 ms against 8.34 in 32-row tiles and
# 10.39 in two 16-row tiles of gemv_q4 (whose 24-row instances lose: gate_up 63.6 us at one
# block per SM, 147 registers). In the step B = 24 took 11.58 against 11.96 ms in 32-row tiles.
WGMMA_XT_TABLE: dict[tuple[int, str], tuple[int, int, int, int, int]] = {
    (64, "gate_up"): (1, 1, 2, 3, 0),
    (64, "in"): (1, 1, 4, 2, 0),
    (64, "long"): (1, 1, 3, 3, 0),
    (64, "lm_head"): (1, 1, 2, 3, 0),
    (32, "gate_up"): (1, 1, 3, 3, 0),
    (32, "in"): (1, 1, 4, 2, 1),
    (32, "long"): (1, 1, 2, 3, 0),
    (32, "lm_head"): (1, 1, 2, 4, 0),
    (64, "narrow"): (1, 1, 2, 3, 0),
    (32, "narrow"): (1, 1, 2, 3, 0),
    (24, "gate_up"): (1, 1, 2, 4, 0),
    (24, "in"): (1, 1, 4, 2, 1),
    (24, "long"): (1, 1, 2, 3, 0),
    (24, "lm_head"): (1, 1, 3, 3, 0),
    (24, "narrow"): (1, 1, 2, 3, 0),
}
# The out projection ("narrow": 5120 rows over K = 6144) in tile order, version 13: its input
# comes from the GDN and the attention kernels, which write the tile order since this version
# (common.cuh act_at). Version 8's sweep (bench/2026-12-03-h200-v8-gemv-sweep-mb2.txt, us under
# PDL): 32 rows 15.8 at ZS 8 against gemv_q4's 20.2; 64 rows 25.3 at ZS 4 (27.0 at ZS 8, the
# split gemm_split gives) against 28.8 for gemv_q4 in two 32-row tiles. ZS where it is not
# gemm_split's:
WGMMA_XT_ZS: dict[tuple[int, str], int] = {(64, "narrow"): 4, (24, "gate_up"): 4}
# The split down and out projections at 24 and 32 rows (one warpgroup, 2 ring stages, ZS 8) say
# three blocks per SM (MB) but run five: 93-96 registers and 21-25 KB of shared memory allow
# it, and their 640 blocks (80 row blocks x 8) fill one wave of 660 slots only at five. Version
# 20 lost that by accident (a merge at 109 registers, four blocks per SM: 1.2 waves, B = 24
# +0.48 ms), and declaring five in __launch_bounds__ capped the registers at a cost of its own
# (B = 24 +0.07 ms). So the gate checks it instead (Entry.resident).
WGMMA_XT_RESIDENT: dict[tuple[int, str], int] = {(24, "long"): 5, (24, "narrow"): 5,
                                                 (32, "long"): 5, (32, "narrow"): 5}


def wgmma_resident(rows: int, k: int, btg: int, xt: int, zs: int) -> int:
    """Blocks per SM the tile-order wgmma_q4 launch of this weight was measured at beyond its MB
    (WGMMA_XT_RESIDENT, split launches only), or 0."""
    return WGMMA_XT_RESIDENT.get((btg, _shape_kind(rows, k)), 0) if xt and zs > 1 else 0


# QWEN38_WGMMA_ZS="long=4,narrow=2" (A/B runs, version 19): the split of the tile-order wgmma_q4
# launches of those shape kinds at every btg, instead of WGMMA_XT_ZS / gemm_split's.
WGMMA_ZS = os.environ.get("QWEN38_WGMMA_ZS", "")


def _wgmma_zs_knob(kind: str, ks: int) -> int:
    """QWEN38_WGMMA_ZS's split for this shape kind (0: not set), checked against KS."""
    kinds = SHAPE_KINDS
    want = f"use kind=ZS pairs separated by commas, kind one of {', '.join(kinds)}, ZS 1, 2, 4 or 8"
    out = {}
    for item in filter(None, (t.strip() for t in WGMMA_ZS.split(","))):
        name, _, val = item.partition("=")
        if name not in kinds or val not in ("1", "2", "4", "8"):
            raise UserError(f"QWEN38_WGMMA_ZS={WGMMA_ZS!r}: {want}")
        out[name] = int(val)
    zs = out.get(kind, 0)
    if zs and ks % zs:
        raise UserError(f"QWEN38_WGMMA_ZS={WGMMA_ZS!r}: {kind} has {ks} parts of K; ZS must divide it")
    return zs


# QWEN38_OUT_XT=0 keeps o in rows (the out projection on gemv_q4, as before version 13): A/B.
OUT_XT = os.environ.get("QWEN38_OUT_XT", "1") != "0"


def wgmma_launch(rows: int, k: int, btg: int, R: int,
                 xt: bool = False) -> tuple[int, int, int, int, int, int, int] | None:
    """(WG, MW, XS, ZS, MB, XT, PP) of the wgmma_q4 launch of a weight over R activation rows,
    or None: wgmma_config's schedule (WGMMA_XT_TABLE's where xt, the caller able to give the
    activations in tile order) and the split gemm_split gives its grid. The producer of the
    activations must write the tile order exactly when the result's XT is 1."""
    wx = WGMMA_XT_TABLE.get((btg, _shape_kind(rows, k))) if xt else None
    if wx is None:
        wc = wgmma_config(rows, k, btg)
        if wc is None:
            return None
    wg, mw, xs, mb, pp = wx or wc + (0,)
    zs = WGMMA_XT_ZS.get((btg, _shape_kind(rows, k)), 0) if wx else 0
    if wx and WGMMA_ZS:
        zs = _wgmma_zs_knob(_shape_kind(rows, k), min(GEMV_KS, k // 128)) or zs
    if not zs or min(GEMV_KS, k // 128) % zs:
        zs = gemm_split(cdiv(cdiv(rows, 16), 4 * wg * mw) * cdiv(R, btg), k, mb)
    if zs == 1 and _shape_kind(rows, k) == "long":
        return None   # measured split only; unsplit, its 4-warpgroup instance spills (128 registers)
    return wg, mw, xs, zs, mb, int(bool(wx)), pp


def wgmma_entry(k: int, btg: int, epi: int, wg: int, mw: int, xs: int, zs: int,
                mb: int = 1, xt: int = 0, pp: int = 0, resident: int = 0) -> Entry:
    ks = min(GEMV_KS, k // 128)
    nt = btg // 8
    smem = wgmma_smem(k, nt, wg, mw, xs, zs, xt)
    targs = f"{nt}, {ks}, {wg}, {mw}, {xs}, {zs}, {xt}, {pp}"
    return Entry(name=f"q38_gemv_k{k}_wg{wg}_mw{mw}_n{nt}_s{ks}_e{epi}_x{xs}_z{zs}_b{mb}"
                      + ("_p1" if pp else "") + ("_t1" if xt else ""),
                 call=f"q38::wgmma_q4<{k}, {nt}, {ks}, {epi}, {wg}, {mw}, {xs}, {zs}, {xt}, {pp}>",
                 params=GEMM_PARAMS, threads=128 * wg, smem=smem, waits=True, min_blocks=mb,
                 resident=resident,
                 asserts=(f"q38::WgmmaLaunch<{targs}>::dyn_smem_bytes == {smem}",))


# wgmma_sk_q4 (kernels/wgmma_sk_q4.cuh, version 18): a producer warp and CW consumer warpgroups
# sharing each activation tile (x in tile order), the (tile-block, part) units cut evenly over
# about one block per SM, the bits gemv_q4's. (btg, shape kind) -> (CW, XS, PP), from
# scripts/gemv_sweep.py (GEMV_SWEEP=sk, bench/2026-12-04-h200-v18-sk-sweep.txt, us under PDL
# against WGMMA_XT_TABLE's schedule): 64 rows gate_up 55.6 against 71.6, the lm_head 347 against
# 398, attn.in 28.3 against 30.7 (gdn.in 31.0 against 31.3); 32 rows gate_up 42.0 against 53.8,
# the lm_head 253 against 294; 24 rows (GEMV_SWEEP=sk16, -sk-sweep-16-24.txt) gate_up 40.1
# against 52.2, the lm_head 240 against 287. The 24- and 32-row in projections (25.5 against
# 24.6, 28 against 26), out and down (their few tile-blocks cut over many blocks: chains of
# published sums) stay on wgmma_q4, and 16 rows on gemv_q4 (gate_up 37.1 against 38.0, without
# the SwiGLU epilogue gemv_q4 fuses; the in projections 21-23 against 18).
# Where it serves gate_up, SwiGLU is its epilogue (EPI_SWIGLU, version 19, ops.plan_program's mlp;
# QWEN38_SWIGLU_FUSE=0 keeps the separate kernel): in the step (bench/NOTES.md, version 19, two
# rounds) B = 24 10.58 -> 10.41 ms, B = 32 12.05 -> 11.96, B = 64 18.20 -> 18.19.
# QWEN38_WGMMA_SK=0 turns it off (A/B runs); =all serves every launch that reads its input in
# tile order with (CW 2, XS 4) — out, down and the tiny model's weights too, which the table does
# not — so that `check` on the tiny model locks the kernel's bits in a whole program.
WGMMA_SK_TABLE: dict[tuple[int, str], tuple[int, int, int]] = {
    (64, "gate_up"): (3, 4, 0),
    (64, "lm_head"): (3, 4, 0),
    (64, "in"): (2, 4, 1),
    (32, "gate_up"): (4, 6, 0),
    (32, "lm_head"): (4, 6, 0),
    (24, "gate_up"): (4, 6, 0),
    (24, "lm_head"): (4, 6, 0),
}
WGMMA_SK = os.environ.get("QWEN38_WGMMA_SK", "1")
SK_SMS = GEMM_SMS       # the grid a wgmma_sk_q4 launch fills: one block per SM
# QWEN38_SK_CFG="gate_up=4:6:0,lm_head=3:4:0" (A/B runs in the step, version 21): (CW, XS, PP)
# of the wgmma_sk_q4 launches of those shape kinds wherever the table serves them, instead of
# its own (with QWEN38_WGMMA_SK=all: of every launch of those kinds, the tiny model's locks).
SK_CFG = os.environ.get("QWEN38_SK_CFG", "")
# QWEN38_SK16="gate_up=3:6:1,in=3:6:1" (A/B runs, version 22): the 16-row tiles of those shape
# kinds on wgmma_sk_q4 at (CW, XS, PP), their inputs in tile order (the norm writes it), instead
# of gemv_q4. gate_up then stores gu and the swiglu kernel runs (gemv_q4's fused SwiGLU is not
# there); sm_90a lanes only. Two partials in flight (PP 1), which ptxas serialized at four
# consumer warpgroups in version 18's 16-row sweep, are the reason to try it (bench/NOTES.md).
# QWEN38_SK8: the same for the 8-row tiles (B = 1 … 8): a producer warp streaming each block's
# weights ahead of its consumers, the design version 15's stand-in found 0.6 ms in at B = 1.
SK16 = os.environ.get("QWEN38_SK16", "")
SK8 = os.environ.get("QWEN38_SK8", "")


def _sk_items(knob: str, value: str) -> dict[str, tuple[int, int, int]]:
    """A knob's kind=CW:XS:PP items (QWEN38_SK_CFG, QWEN38_SK16, QWEN38_SK8), checked: kind ->
    (CW, XS, PP)."""
    out = {}
    for item in filter(None, (t.strip() for t in value.split(","))):
        k, _, v = item.partition("=")
        parts = v.split(":")
        ok = (k.strip() in SHAPE_KINDS and len(parts) == 3 and all(x.strip().isdigit() for x in parts))
        cw, xs, pp = (int(x) for x in parts) if ok else (0, 0, 0)
        if not (ok and 1 <= cw <= 4 and 2 <= xs <= 16 and pp in (0, 1)):
            raise UserError(f"{knob}={value!r}: {item!r} is not kind=CW:XS:PP; use items "
                            "like gate_up=3:4:0 separated by commas (kind gate_up, in, lm_head, "
                            "long or narrow; CW 1-4, XS 2-16, PP 0 or 1), or leave it unset")
        out[k.strip()] = (cw, xs, pp)
    return out


def _sk_cfg_knob(kind: str) -> tuple[int, int, int] | None:
    """QWEN38_SK_CFG's (CW, XS, PP) for this shape kind (None: not set), checked."""
    return _sk_items("QWEN38_SK_CFG", SK_CFG).get(kind)


def sk_small_launch(rows: int, k: int, btg: int) -> tuple[int, int, int] | None:
    """QWEN38_SK16's (CW, XS, PP) for this weight at 16-row tiles, QWEN38_SK8's at 8-row tiles,
    or None (other tiles, kinds the knob does not name, or QWEN38_WGMMA_SK=0)."""
    knob = {16: ("QWEN38_SK16", SK16), 8: ("QWEN38_SK8", SK8)}.get(btg)
    if knob is None or WGMMA_SK == "0":
        return None
    return _sk_items(*knob).get(_shape_kind(rows, k))


def sk_launch(rows: int, k: int, btg: int) -> tuple[int, int, int] | None:
    """(CW, XS, PP) of wgmma_sk_q4 for this weight at batch tile btg, or None. Its input must be
    in tile order: the caller asks only where wgmma_launch(..., xt=True) says XT = 1, as it does
    for every shape the table serves (or, at 16 and 8 rows, where QWEN38_SK16 / QWEN38_SK8 names
    the kind)."""
    if WGMMA_SK not in ("0", "1", "all"):
        raise UserError(f"QWEN38_WGMMA_SK={WGMMA_SK!r}: use 1 (the default: wgmma_sk_q4 where "
                        "measured faster), 0 (never) or all (every tile-order launch), or leave it "
                        "unset")
    small = sk_small_launch(rows, k, btg)
    if small:
        return small
    if WGMMA_SK == "all":
        return _sk_cfg_knob(_shape_kind(rows, k)) or (2, 4, 0)
    if WGMMA_SK == "0":
        return None
    table = WGMMA_SK_TABLE.get((btg, _shape_kind(rows, k)))
    return (_sk_cfg_knob(_shape_kind(rows, k)) or table) if table else None


def sk_grid(rows: int, k: int, cw: int) -> tuple[int, int]:
    """(G, TB): blocks per batch tile and tile-blocks (CW·64 rows) of a wgmma_sk_q4 launch; its
    scratch is TB · pub floats and TB arrival flags per batch tile."""
    tb = cdiv(cdiv(rows, 16), 4 * cw)
    return min(SK_SMS, tb * min(GEMV_KS, k // 128)), tb


def sk_pub_floats(btg: int, cw: int) -> int:
    """fp32 of one published running sum (WgmmaSkLaunch::pub_floats)."""
    return 128 * cw * (btg // 8) * 4


def sk_smem(btg: int, cw: int, xs: int, epi: int = 0) -> int:
    """WgmmaSkLaunch::dyn_smem_bytes: XS stages of an activation tile and 4·CW m-tiles of weights
    and scales, and the stages' two mbarriers; EPI_SWIGLU adds swiglu_bytes (every consumer's
    sums, staged for the SwiGLU store: 4·CW m-tiles)."""
    return (xs * (8 * (btg // 8) * 256 + 4 * cw * 66 * 16) + 16 * xs
            + (4 * cw * (btg // 8 * 128 + 4) * 4 if epi == EPI_SWIGLU else 0))


def sk_entry(k: int, btg: int, epi: int, cw: int, xs: int, pp: int) -> Entry:
    ks = min(GEMV_KS, k // 128)
    nt = btg // 8
    smem = sk_smem(btg, cw, xs, epi)
    targs = f"{nt}, {ks}, {cw}, {xs}"
    sw = f" + q38::WgmmaSkLaunch<{targs}>::swiglu_bytes" if epi == EPI_SWIGLU else ""
    return Entry(name=f"q38_gemv_k{k}_sk{cw}_n{nt}_s{ks}_e{epi}_x{xs}" + ("_p1" if pp else "") + "_t1",
                 call=f"q38::wgmma_sk_q4<{k}, {nt}, {ks}, {epi}, {cw}, {xs}, {pp}>",
                 params=GEMM_PARAMS, threads=128 * (cw + 1), smem=smem, waits=True, min_blocks=1,
                 asserts=(f"q38::WgmmaSkLaunch<{targs}>::dyn_smem_bytes{sw} == {smem}",
                          f"q38::WgmmaSkLaunch<{targs}>::threads == {128 * (cw + 1)}",
                          f"q38::WgmmaSkLaunch<{targs}>::pub_floats == {sk_pub_floats(btg, cw)}"))


# ------------------------------------------------------------------------------------ plan
@dataclass
class Plan:
    headers: list[str] = field(default_factory=list)
    constants: list[tuple[str, object]] = field(default_factory=list)
    entries: list[Entry] = field(default_factory=list)
    buffers: dict = field(default_factory=dict)
    weights: dict = field(default_factory=dict)
    tensors: dict = field(default_factory=dict)
    schedule: dict = field(default_factory=dict)

    def entry(self, e: Entry) -> Entry:
        """Add e unless an entry of its name is there; an instance launched where it must keep
        more blocks per SM resident keeps the larger requirement."""
        for i, x in enumerate(self.entries):
            if x.name == e.name:
                if e.resident > x.resident:
                    self.entries[i] = dataclasses.replace(x, resident=e.resident)
                return e
        self.entries.append(e)
        return e


def fused_weights(cfg: ModelConfig, mtp: bool = False) -> dict:
    """The int4 weights as the GEMVs read them: parts concatenated along rows, each part padded
    to a multiple of 16 rows. name -> {"k", "rows", "parts": [[hf name, row offset, rows]]}.
    mtp: also the MTP layer's (M.fc over [embedding | hidden], K = 2H; M.in, M.out, M.gate_up,
    M.down as a full-attention layer's)."""
    def fuse(parts: list[str]) -> dict:
        shapes = cfg.tensor_shapes()
        off, out = 0, []
        k = shapes[parts[0]][1]
        for p in parts:
            n, kk = shapes[p]
            assert kk == k, p
            out.append([p, off, n])
            off += pad16(n)
        return {"k": k, "rows": off, "parts": out}

    w = {}
    for i in range(cfg.num_hidden_layers):
        p = f"model.language_model.layers.{i}."
        if i in cfg.linear_layers:
            la = p + "linear_attn."
            w[f"L{i}.in"] = fuse([la + "in_proj_qkv.weight", la + "in_proj_z.weight",
                                  la + "in_proj_b.weight", la + "in_proj_a.weight"])
            w[f"L{i}.out"] = fuse([la + "out_proj.weight"])
        else:
            sa = p + "self_attn."
            w[f"L{i}.in"] = fuse([sa + "q_proj.weight", sa + "k_proj.weight", sa + "v_proj.weight"])
            w[f"L{i}.out"] = fuse([sa + "o_proj.weight"])
        w[f"L{i}.gate_up"] = fuse([p + "mlp.gate_proj.weight", p + "mlp.up_proj.weight"])
        w[f"L{i}.down"] = fuse([p + "mlp.down_proj.weight"])
    w["lm_head"] = fuse(["lm_head.weight"])
    if mtp:
        p = "mtp.layers.0."
        sa = p + "self_attn."
        w["M.fc"] = fuse(["mtp.fc.weight"])
        w["M.in"] = fuse([sa + "q_proj.weight", sa + "k_proj.weight", sa + "v_proj.weight"])
        w["M.out"] = fuse([sa + "o_proj.weight"])
        w["M.gate_up"] = fuse([p + "mlp.gate_proj.weight", p + "mlp.up_proj.weight"])
        w["M.down"] = fuse([p + "mlp.down_proj.weight"])
    return w


# ------------------------------------------------------------------------------------ other ops
# Each builder mirrors its header's Launch struct; the emitted entry point static_asserts the
# mirrored numbers against the C++ ones, so the gate fails if the two ever disagree.
BF = "const q38::bf16*"
I32 = "const int*"


def rmsnorm_entry(h: int, tnt: int = 0) -> Entry:
    """RMS1p; tnt > 0: the output in wgmma_q4's activation tile order for 8·tnt-row tiles."""
    nt = max(t for t in range(32, 1025, 32) if (h // 8) % t == 0)
    return Entry(f"q38_rmsnorm_h{h}" + (f"_t{tnt}" if tnt else ""),
                 f"q38::rmsnorm_1p<{h}, {nt}, {tnt}>",
                 ((BF, "x"), (BF, "w"), ("q38::bf16*", "y"), ("float", "eps")), nt,
                 waits=True,  # rmsnorm_1p requests w, then pdl_wait
                 asserts=(f"q38::RmsnormLaunch<{h}, {nt}>::threads == {nt}",))


def rmsnorm_ld_entry(h: int) -> Entry:
    """RMS1p with row strides (the mtp lane's [RMS1p(e) | RMS1p(h)] rows)."""
    nt = max(t for t in range(32, 1025, 32) if (h // 8) % t == 0)
    return Entry(f"q38_rmsnormld_h{h}", f"q38::rmsnorm_1p_ld<{h}, {nt}>",
                 ((BF, "x"), ("int", "ldx"), (BF, "w"), ("q38::bf16*", "y"), ("int", "ldy"),
                  ("float", "eps")), nt,
                 waits=True,  # rmsnorm_1p_ld requests w, then pdl_wait
                 asserts=(f"q38::RmsnormLaunch<{h}, {nt}>::threads == {nt}",))


# kernels/speculative.cuh (the mtp lane's bookkeeping), 128 threads each, grid ceil(n / 128).
SPEC_THREADS = 128


def spec_accept_entry(kp: int) -> Entry:
    return Entry(f"q38_spec_accept_k{kp - 1}", f"q38::spec_accept<{kp}>",
                 (("int*", "vtok"), (I32, "a"), ("int*", "emit"), ("int*", "count"),
                  ("int*", "slot"), ("int*", "ntok_m"), ("int", "B")), SPEC_THREADS,
                 asserts=(f"q38::SpecLaunch::threads == {SPEC_THREADS}",))


def spec_tokens_entry(pt: int) -> Entry:
    return Entry(f"q38_spec_tokens_pt{pt}", f"q38::spec_tokens<{pt}>",
                 ((I32, "mnext"), (I32, "next"), ("int*", "mtok"), ("int", "R")), SPEC_THREADS)


def spec_pos_entry() -> Entry:
    return Entry("q38_spec_pos", "q38::spec_pos",
                 ((I32, "pos"), ("int", "off"), ("int*", "mpos"), ("int*", "one"), ("int", "B")),
                 SPEC_THREADS)


def spec_put_entry() -> Entry:
    return Entry("q38_spec_put", "q38::spec_put",
                 (("int*", "dst"), (I32, "src"), ("int", "j"), ("int", "stride"), ("int", "B")),
                 SPEC_THREADS)


# Column slices per v-head. One for every batch: NS changes how the gated norm's sum is formed,
# and a fixed NS keeps a row's result bitwise the same at every B (the equivalence locks).
GDN_NS = 1


# kernels/gdn.cuh SR: state rows of a thread kept in shared memory. QWEN38_GDN_SR (A/B runs)
# sets that many rows in every decode step's GDN (0: none, the default since version 17).
GDN_SR = os.environ.get("QWEN38_GDN_SR")
# kernels/gdn.cuh GE: the decode step's GDN requests its conv's copies first, then GE of a
# thread's 16 state rows, and the rest after the conv. QWEN38_GDN_GE (A/B runs) sets GE in every
# decode step's GDN (-1: every state row first, as before version 17).
GDN_GE = os.environ.get("QWEN38_GDN_GE")
GDN_GE_MIN_BATCH = 12  # from here 4 rows early, below all 16
# ... except, up to 16-row tiles, in the first wave of blocks (GW: GEMM_SMS x 2 blocks per SM),
# which request every row early. In the step (bench/2026-12-04-h200-v17-step-gw.json, ms, two
# rounds): B = 16 8.25 -> 8.22 with it; but 24 11.23 -> 11.30, 32 12.85 -> 12.91, 64 19.46 ->
# 19.54. The likely reason, not measured: under PDL the GDN's first wave is resident while the
# gemv_q4 before it drains, whose blocks leave it room, so its early loads use that kernel's DRAM
# time; after a wgmma_q4 launch (24 rows and more) they do not fit before it ends, and the
# early loads only hold up the conv. QWEN38_GDN_GW=0 turns it off (A/B runs).
GDN_GW = os.environ.get("QWEN38_GDN_GW", "1") != "0"
GDN_GW_MAX_BATCH = 16


def gdn_state_rows_in_smem(cfg: ModelConfig, pt: int, rs: int | None = None, batch: int = 0) -> int:
    """SR of the GDN instance: state rows per thread kept in shared memory (0: all in
    registers), set by QWEN38_GDN_SR only. Versions 12 to 16 kept 12 of 16 there from B = 20 on
    (three items per SM instead of two; the step 13.53 -> 13.29 ms at B = 32 and 20.40 -> 20.17
    at B = 64 then). Version 17 requests the state rows after the conv's inputs instead (GE,
    gdn_state_rows_early), which took the 64-row GDN launch to 114.5 us against SR = 12's 127.5
    (bench/NOTES.md)."""
    if not (pt == 1 and rs is None and cfg.linear_key_head_dim == 128):
        return 0
    if GDN_SR:
        if not GDN_SR.isdigit() or int(GDN_SR) >= cfg.linear_key_head_dim // 8:
            raise UserError(f"QWEN38_GDN_SR={GDN_SR!r}: use 0 … {cfg.linear_key_head_dim // 8 - 1} "
                            "state rows in shared memory, or leave it unset")
        return int(GDN_SR)
    return 0


def gdn_state_rows_early(cfg: ModelConfig, pt: int, rs: int | None = None, batch: int = 0) -> int:
    """GE of the GDN instance (kernels/gdn.cuh): -1, every state row requested first (before the
    conv's copies, which then queue behind 64 KiB of state loads per block); else the conv's
    copies first, then GE of a thread's 16 state rows, the others once the conv is done. The
    plain program's decode step (state in registers) takes 16 below B = 12 and 4 from there:
    scripts/gdn_bench.py, us per launch under PDL against -1 (bench/2026-12-04-h200-v17-gdn-ge.txt):
    B = 1 6.4-6.9 against 7.3-9.6, B = 8 19.3 against 19.9; 4 rows at B = 16 31.8 against 35.2,
    24 47.0 against 52.1, 32 58.9 against 66.2, 64 114.5 against 126.1. Scheduling only: the
    same bits (tests/gpu/test_gdn_kernels.py)."""
    if not (pt == 1 and rs is None and cfg.linear_key_head_dim == 128):
        return -1
    if gdn_state_rows_in_smem(cfg, pt, rs, batch):
        return -1
    rows = cfg.linear_key_head_dim // 8
    if GDN_GE is not None:
        if not (GDN_GE == "-1" or GDN_GE.isdigit() and int(GDN_GE) <= rows):
            raise UserError(f"QWEN38_GDN_GE={GDN_GE!r}: use -1 (every state row first) or 0 … "
                            f"{rows} rows before the conv, or leave it unset")
        return int(GDN_GE)
    return rows if batch < GDN_GE_MIN_BATCH else 4


def gdn_launch(cfg: ModelConfig, pt: int, rs: int | None = None, batch: int = 0) -> dict:
    """Mirror of kernels/gdn.cuh GdnLaunch (the entry point static_asserts the two agree).
    rs: conv ring slots (None: K − 1, the non-mtp ring); batch: the lane's B (the SR rule)."""
    dk, dv, hv, k = (cfg.linear_key_head_dim, cfg.linear_value_head_dim,
                     cfg.linear_num_value_heads, cfg.linear_conv_kernel_dim)
    sr = gdn_state_rows_in_smem(cfg, pt, rs, batch)
    rs = k - 1 if rs is None else rs
    cols = dv // GDN_NS
    threads = cdiv((cols // 4) * 8, 32) * 32
    groups = 2 * dk // 8 + cols // 8
    floats = (4 * rs * groups + 4 * groups * (2 * k - 1) + pt * (2 * dk + 3 * cols) + cols
              + 4 * 8 * cols + 6 * pt)
    if sr:
        floats = cdiv(floats, 4) * 4 + 4 * sr * threads
    return {"threads": threads, "smem": 4 * floats, "cluster": GDN_NS, "sr": sr,
            "min_blocks": 1 if threads >= 512 else (768 if sr else 512) // threads,
            "blocks_per_seq": hv * GDN_NS}


def gdn_entry(cfg: ModelConfig, pt: int, rs: int | None = None, each: int = 0,
              slots: int = 1, batch: int = 0, tnt: int = 0) -> Entry:
    """rs=None: the plain program's instance (ring K − 1, one state, no slot argument). Else the
    mtp lane's: ring rs slots, `slots` states per sequence picked by a `slot` argument, and
    each=1 writing the state after every token into its own slot (the verify pass). tnt > 0:
    out in wgmma_q4's activation tile order for 8·tnt-row tiles (the out projection's XT)."""
    dk, dv, hk, hv, k = (cfg.linear_key_head_dim, cfg.linear_value_head_dim,
                         cfg.linear_num_key_heads, cfg.linear_num_value_heads,
                         cfg.linear_conv_kernel_dim)
    L = gdn_launch(cfg, pt, rs, batch)
    targs = f"{dk}, {dv}, {hk}, {hv}, {k}, {pt}, {GDN_NS}"
    params = ((BF, "mz"), ("int", "ld_mz"), (BF, "ba"), ("int", "ld_ba"), ("int", "ba_off"),
              (BF, "conv_w"), ("const float*", "A_log"), (BF, "dt_bias"),
              ("const float*", "norm_w"), ("float", "eps"), ("q38::bf16*", "ring"),
              ("int*", "ring_arrivals"), ("float*", "state"), (I32, "pos"), (I32, "ntok"),
              ("q38::bf16*", "out"))
    sr, ring = L["sr"], k - 1 if rs is None else rs
    ge = gdn_state_rows_early(cfg, pt, rs, batch)
    gw = (GEMM_SMS * L["min_blocks"]
          if 0 <= ge < dk // 8 and GDN_GW and batch <= GDN_GW_MAX_BATCH else 0)
    name = (f"q38_gdn_pt{pt}" + (f"_sr{sr}" if sr else "")
            + (f"_rs{rs}_s{slots}_e{each}" if rs is not None else "") + (f"_ge{ge}" if ge >= 0 else "")
            + (f"_w{gw}" if gw else "") + (f"_t{tnt}" if tnt else ""))
    call = f"q38::gdn_chunk<{targs}, {ring}, {each}, {slots}, {sr}, {tnt}, {ge}, {gw}>"
    ltargs = f"{targs}, {ring}, {sr}"
    if rs is not None:
        params += ((I32, "slot"),)
    return Entry(
        name, call, params,
        L["threads"], smem=L["smem"], cluster=L["cluster"], min_blocks=L["min_blocks"],
        waits=True,  # gdn_chunk loads state/pos/ntok/slot, then griddepcontrol.wait
        asserts=(f"q38::GdnLaunch<{ltargs}>::threads == {L['threads']}",
                 f"q38::GdnLaunch<{ltargs}>::smem_bytes == {L['smem']}",
                 f"q38::GdnLaunch<{ltargs}>::cluster == {L['cluster']}",
                 f"q38::GdnLaunch<{ltargs}>::min_blocks == {L['min_blocks']}"))


def attn_prep_entry(cfg: ModelConfig, pt: int) -> Entry:
    d, rd, h, hkv = cfg.head_dim, cfg.rotary_dim, cfg.num_attention_heads, cfg.num_key_value_heads
    targs = f"{d}, {rd}, {h}, {hkv}, {pt}"
    return Entry(
        f"q38_attn_prep_pt{pt}", f"q38::attn_prep<{targs}>",
        ((BF, "qkv"), ("int", "ld"), (BF, "q_norm"), (BF, "k_norm"), ("float", "eps"),
         ("float", "theta"), (I32, "pos"), (I32, "ntok"), ("q38::bf16*", "qbuf"),
         ("q38::bf16*", "kc"), ("q38::bf16*", "vc"), ("int", "tmax")),
        256, asserts=(f"q38::AttnPrepLaunch<{targs}>::threads == 256",
                      f"q38::AttnPrepLaunch<{targs}>::grid_y == {cdiv(h + 2 * hkv, 8)}"))


# Split-K attention (kernels/attention.cuh, AttnLaunch; attention_tc.cuh, AttnTcLaunch): a row
# with n cached slots is cut into attn_splits(n) splits of attn_span(n) slots; both depend on n
# only (never on B or the grid), so a row's output is bitwise the same at every batch size.
# Version 10: 256 instead of 64 slots per split (a warp merge and a 6 KiB partial per split were a
# quarter of attn_tc's work at 64; bench/2026-12-03-h200-v10-attn-sweep-2.txt). SP fixes the
# arithmetic: changing it needs new golden runs.
ATTN_SPLIT = 256        # slots per split while n <= ATTN_SPLIT * ATTN_MAX_SPLITS
ATTN_MAX_SPLITS = 32    # beyond that the span grows in steps of ATTN_SPLIT
ATTN_BLOCKS = 264       # grid.x target: about two blocks per SM of a 132-SM H200
# attn schedule (AttnLaunch's knobs, scripts/attn_sweep.py). NW (slot warps) and U (slots per warp
# step) fix the order of a row's arithmetic, like ATTN_SPLIT: one value for every B. HG (head
# groups), ST (cp.async ring stages, 0: registers) and MB (min blocks per SM) only reschedule it.
# Measured on an H200 (bench/2026-12-02-h200-attn-sweep.txt): 4 slot warps with a 4-stage K/V
# ring in shared memory take a layer from 64.7 to 50.1 us at B = 16 and from 204.8 to 153.0 us at
# B = 64; with few (row, kv head) pairs, 3 head groups per block do better (B = 1: 16.2 -> 13.4 us).
ATTN_NW, ATTN_U = 4, 4
ATTN_ST, ATTN_MB = 4, 0
# RX (version 8): a warp step's scores summed by one transposed butterfly instead of a warp_sum
# each; the same bits (scheduling only). bench/2026-12-03-h200-v8-attn-sweep.txt, us per layer:
# B = 16 49.9 -> 46.5, B = 64 153.0 -> 139.3, B = 1 (HG 3) 21.0 -> 21.2.
ATTN_RX = 1
ATTN_HG_FEW = 3         # head groups when a launch has at most ATTN_FEW_PAIRS (row, kv head) pairs
ATTN_FEW_PAIRS = 16


def attn_head_groups(cfg: ModelConfig, pairs: int) -> int:
    """HG for a launch over `pairs` (row, kv head) pairs: scheduling only (attention.cuh)."""
    g = cfg.num_attention_heads // cfg.num_key_value_heads
    return ATTN_HG_FEW if pairs <= ATTN_FEW_PAIRS and g % ATTN_HG_FEW == 0 else 1


def attn_span(n: int) -> int:
    return ATTN_SPLIT * cdiv(cdiv(n, ATTN_SPLIT), ATTN_MAX_SPLITS)


def attn_splits(n: int) -> int:
    return cdiv(n, attn_span(n))


def attn_stride(tmax: int) -> int:
    """Partials per (row, kv head) in attn_part: the most splits of any n <= tmax."""
    return min(ATTN_MAX_SPLITS, cdiv(tmax, ATTN_SPLIT))


def attn_part_floats(cfg: ModelConfig) -> int:
    """fp32 per partial: o[G][D], m[G], l[G], padded to 16 bytes."""
    g = cfg.num_attention_heads // cfg.num_key_value_heads
    return g * cfg.head_dim + cdiv(2 * g, 4) * 4


def attn_grid_x(blocks: int, target: int = ATTN_BLOCKS) -> int:
    """grid.x of attn / attn_tc for B*HKV*PT (row, kv head) pairs and a target number of blocks
    (about one wave: ATTN_BLOCKS for attn, ATTN_TC_BLOCKS for attn_tc): blocks loop over the
    splits of their row, so this only spreads the work (it changes no bit of the result)."""
    return max(1, min(ATTN_MAX_SPLITS, target // blocks))


def attn_blocks() -> int:
    """The grid target of the program's attention kernel (attn_grid_x)."""
    return ATTN_TC_BLOCKS if ATTN_TC else ATTN_BLOCKS


def resolve_shape(shape: list, tmax: int) -> list[int]:
    """A buffer shape with its run-time entries replaced: "Tmax" -> tmax, "Tsplits" ->
    attn_stride(tmax)."""
    return [tmax if d == "Tmax" else attn_stride(tmax) if d == "Tsplits" else d for d in shape]


def attn_smem(cfg: ModelConfig) -> int:
    """Dynamic shared memory of attn (AttnLaunch::dyn_smem_bytes): the ST-stage K/V ring."""
    return ATTN_ST * ATTN_NW * ATTN_U * 2 * cfg.head_dim * 2 if ATTN_ST >= 2 else 0


# attn_tc (kernels/attention_tc.cuh): QK and PV on the tensor cores (mma.sync m16n8k16, P rounded
# to bf16 as HF rounds the softmax), the same inputs, scratch, split rule and grid as attn. NW
# (warps, 16 slots each per block step) fixes a row's arithmetic like ATTN_SPLIT: one value at
# every B. ST (ring stages) and MB only reschedule it. The program runs attn_tc when ATTN_TC.
# scripts/attn_sweep.py on an H200 (bench/2026-12-03-h200-v10-attn-sweep-3.txt), us per layer at
# T = 1024, B = 1 / 16 / 64: NW 4 14.1 / 28.2 / 85.6 (attn: 12.9 / 46.5 / 138.9); NW 2 with two
# QK chains 17.6 / 31.1 / 81.3; a third ring stage no faster (28.9 at B = 16).
# ATTN_TC = False runs attention.cuh's attn instead (the CUDA-core kernel before version 10, kept
# as the sweeps' baseline). attn_tc serves at most 8 query heads per kv head (one n-tile of Pᵀ);
# lanes.check_model refuses more before anything is emitted.
ATTN_TC = True
ATTN_TC_NW, ATTN_TC_ST, ATTN_TC_MB = 4, 2, 0
ATTN_TC_BLOCKS = 132    # grid.x target: attn_tc's 157 KiB of shared memory fit one block per SM


def attn_tc_smem(cfg: ModelConfig, nw: int = 0, st: int = 0) -> int:
    """Dynamic shared memory of attn_tc (AttnTcLaunch::dyn_smem_bytes): the K/V ring of ST block
    steps (16·NW slots of K and V rows), the warp merge's o rows and Q."""
    nw, st, d = nw or ATTN_TC_NW, st or ATTN_TC_ST, cfg.head_dim
    g = cfg.num_attention_heads // cfg.num_key_value_heads
    return st * 16 * nw * 2 * d * 2 + nw * g * (d + 4) * 4 + 8 * (d + 8) * 2


ATTN_PARAMS = ((BF, "qbuf"), (BF, "qkv"), ("int", "ld"), (BF, "kc"), (BF, "vc"), ("int", "tmax"),
               (I32, "pos"), (I32, "ntok"), ("float*", "part"), ("int*", "arrivals"),
               ("q38::bf16*", "o"))


def attn_entry(cfg: ModelConfig, pt: int, hg: int = 1, tnt: int = 0) -> Entry:
    """The program's attention kernel for chunks of pt rows: attn_tc (ATTN_TC) or attn with hg
    head groups. tnt > 0 (attn_tc only): o in wgmma_q4's activation tile order for 8·tnt-row
    tiles (the out projection's XT)."""
    d, h, hkv = cfg.head_dim, cfg.num_attention_heads, cfg.num_key_value_heads
    assert ATTN_TC or not tnt, "attn writes its output in rows only"
    if ATTN_TC:
        targs = f"{d}, {h}, {hkv}, {pt}, {ATTN_TC_NW}, {ATTN_TC_ST}, {ATTN_SPLIT}, {ATTN_TC_MB}"
        A = f"q38::AttnTcLaunch<{targs}>"
        threads, smem = 32 * ATTN_TC_NW, attn_tc_smem(cfg)
        call = f"q38::attn_tc<{targs}" + (f", 1, {tnt}>" if tnt else ">")
        return Entry(
            f"q38_attn_tc_pt{pt}" + (f"_t{tnt}" if tnt else ""), call, ATTN_PARAMS, threads,
            smem=smem,
            min_blocks=ATTN_TC_MB,
            asserts=(f"{A}::threads == {threads}", f"{A}::split == {ATTN_SPLIT}",
                     f"{A}::max_splits == {ATTN_MAX_SPLITS}", f"{A}::dyn_smem_bytes == {smem}",
                     f"{A}::min_blocks == {ATTN_TC_MB}",
                     f"{A}::part_floats == {attn_part_floats(cfg)}"))
    targs = (f"{d}, {h}, {hkv}, {pt}, {ATTN_NW}, {ATTN_U}, {hg}, {ATTN_ST}, {ATTN_SPLIT}, "
             f"{ATTN_MB}, {ATTN_RX}")
    A = f"q38::AttnLaunch<{targs}>"
    threads, smem = 32 * ATTN_NW * hg, attn_smem(cfg)
    return Entry(
        f"q38_attn_pt{pt}" + (f"_hg{hg}" if hg > 1 else ""), f"q38::attn<{targs}>", ATTN_PARAMS,
        threads, smem=smem, min_blocks=ATTN_MB,
        asserts=(f"{A}::threads == {threads}", f"{A}::split == {ATTN_SPLIT}",
                 f"{A}::max_splits == {ATTN_MAX_SPLITS}", f"{A}::dyn_smem_bytes == {smem}",
                 f"{A}::min_blocks == {ATTN_MB}",
                 f"{A}::part_floats == {attn_part_floats(cfg)}"))


def embed_entry(h: int) -> Entry:
    return Entry(f"q38_embed_h{h}", f"q38::embed_gather<{h}>",
                 ((BF, "E"), (I32, "tok"), ("q38::bf16*", "x")), 128,
                 asserts=(f"q38::EmbedLaunch<{h}>::threads == 128",))


def swiglu_entry(f: int, tnt: int = 0) -> Entry:
    """SwiGLU; tnt > 0: the output in wgmma_q4's activation tile order for 8·tnt-row tiles."""
    return Entry(f"q38_swiglu_f{f}" + (f"_t{tnt}" if tnt else ""), f"q38::swiglu<{f}, {tnt}>",
                 ((BF, "gu"), ("q38::bf16*", "h"), ("int", "R")), 256,
                 asserts=(f"q38::SwigluLaunch<{f}, {tnt}>::threads == 256",
                          f"q38::SwigluLaunch<{f}, {tnt}>::grid_x == {swiglu_grid(f, 1, tnt)[0]}",
                          f"q38::SwigluLaunch<{f}, {tnt}>::rows == {16 if tnt else 1}"))


def swiglu_grid(f: int, r: int, tnt: int = 0) -> list[int]:
    """The grid of a swiglu launch over r rows (SwigluLaunch): 8 columns per thread and one row
    per block; in tile order 128 columns of 16 rows per block."""
    return [f // 128, cdiv(r, 16), 1] if tnt else [cdiv(f // 8, 256), r, 1]


def argmax_entry(v: int) -> Entry:
    return Entry(f"q38_argmax_v{v}", f"q38::argmax_rows<q38::bf16, {v}>",
                 ((BF, "logits"), ("int*", "idx"), ("float*", "val")), 1024,
                 asserts=(f"q38::ArgmaxLaunch<q38::bf16, {v}>::threads == 1024",))


TOPK = 8  # logits kept per sequence and step for `run` and the golden files


def topk_entry(v: int) -> Entry:
    return Entry(f"q38_topk_v{v}_k{TOPK}", f"q38::topk_rows<q38::bf16, {v}, {TOPK}>",
                 ((BF, "logits"), ("float*", "val"), ("int*", "idx")), 128,
                 asserts=(f"q38::TopkLaunch<q38::bf16, {v}, {TOPK}>::threads == 128",))


def gather_last_entry(h: int, pt: int) -> Entry:
    return Entry(f"q38_gather_last_h{h}_pt{pt}", f"q38::gather_last<{h}, {pt}>",
                 ((BF, "x"), (I32, "ntok"), ("q38::bf16*", "y")), 128)


def advance_entry() -> Entry:
    return Entry("q38_advance_pos", "q38::advance_pos",
                 (("int*", "pos"), (I32, "ntok"), ("int", "B")), 128)


# ------------------------------------------------------------------------------------ program
HEADERS = ["common.cuh", "gemv_q4.cuh", "gemm_q4.cuh", "rmsnorm.cuh", "gdn.cuh", "attention.cuh",
           "attention_tc.cuh", "elementwise.cuh", "rows.cuh"]
MTP_HEADERS = ["speculative.cuh"]

# Tensors uploaded as they are (not int4), with the dtype the kernels read them in.
RAW_DTYPES = {"A_log": "float32", "linear_attn.norm.weight": "float32"}


def raw_dtype(name: str) -> str:
    for suffix, dt in RAW_DTYPES.items():
        if name.endswith(suffix):
            return dt
    return "bfloat16"


def buf(name: str, off: int = 0, per_tmax: int = 0) -> list:
    return ["buf", name, off, per_tmax]


def plan_program(cfg: ModelConfig, lanes: Lanes) -> Plan:
    """Entries, buffers, weights and the decode / prefill schedules for cfg at these lanes
    (and, for lanes.mtp = K > 0, the mtp lane's prefill and verify schedules, see mtp below)."""
    B, btg = lanes.batch, lanes.btg
    K = lanes.mtp
    KP = K + 1                      # verify rows per sequence
    H, F, V = cfg.hidden_size, cfg.intermediate_size, cfg.vocab_size
    C, Cv, hv = cfg.conv_dim, cfg.linear_value_dim, cfg.linear_num_value_heads
    D, Hq, Hkv = cfg.head_dim, cfg.num_attention_heads, cfg.num_key_value_heads
    eps = cfg.rms_norm_eps
    wgmma = lanes.arch == "sm_90a"
    plan = Plan(headers=list(HEADERS) + (["wgmma_q4.cuh", "wgmma_sk_q4.cuh"] if wgmma else [])
                + (MTP_HEADERS if K else []))
    plan.weights = fused_weights(cfg, mtp=bool(K))
    n_in = max(w["rows"] for n, w in plan.weights.items() if n.endswith(".in"))
    pts = sorted({1, lanes.pt} | ({KP} if K else set()))
    rmax = B * max(pts)
    KC = cfg.linear_conv_kernel_dim - 1
    # mtp: conv ring by position with K extra slots, K + 1 recurrent-state slots (gdn.cuh)
    RS, SLOTS = (KC + K, KP) if K else (KC, 1)
    dkv = cfg.linear_key_head_dim * cfg.linear_value_head_dim
    plan.constants = [("Q38_BATCH", B), ("Q38_BTG", btg), ("Q38_PT", lanes.pt),
                      ("Q38_MTP", lanes.mtp)]
    ba_off = pad16(hv)
    lg = {i: n for n, i in enumerate(cfg.linear_layers)}
    la = {i: n for n, i in enumerate(cfg.full_layers)}
    kv_layer = B * Hkv * D  # elements per cached position of one layer

    plan.buffers = {
        "tokens": {"dtype": "int32", "shape": [rmax]},
        "pos": {"dtype": "int32", "shape": [B]},
        "ntok": {"dtype": "int32", "shape": [B]},
        "x": {"dtype": "bfloat16", "shape": [rmax, H]},
        # h and act may hold a GEMV input in tile order: whole batch tiles of rows.
        "h": {"dtype": "bfloat16", "shape": [cdiv(rmax, btg) * btg, H]},
        "proj": {"dtype": "bfloat16", "shape": [rmax, n_in]},
        "o": {"dtype": "bfloat16", "shape": [cdiv(rmax, btg) * btg, max(Cv, cfg.q_dim)]},
        "qbuf": {"dtype": "bfloat16", "shape": [rmax, cfg.q_dim]},
        "gu": {"dtype": "bfloat16", "shape": [rmax, 2 * F]},
        "act": {"dtype": "bfloat16", "shape": [cdiv(rmax, btg) * btg, F]},
        "hlast": {"dtype": "bfloat16", "shape": [B, H]},
        "logits": {"dtype": "bfloat16", "shape": [B, V]},
        "next": {"dtype": "int32", "shape": [B]},
        "topk_val": {"dtype": "float32", "shape": [B, TOPK]},
        "topk_idx": {"dtype": "int32", "shape": [B, TOPK]},
        "nextval": {"dtype": "float32", "shape": [B]},
        # Arrival counters of the GDN conv-ring write; every launch leaves them at zero.
        "ring_arrivals": {"dtype": "int32", "shape": [B, cfg.linear_num_key_heads]},
        # attn split-K scratch, shared by every attention layer: per (row, kv head) up to
        # "Tsplits" = attn_stride(Tmax) fp32 partials, and an arrival counter that every launch
        # leaves at zero (all buffers are allocated zeroed).
        "attn_part": {"dtype": "float32", "shape": [rmax, Hkv, "Tsplits", attn_part_floats(cfg)]},
        "attn_arrivals": {"dtype": "int32", "shape": [rmax, Hkv]},
        "conv": {"dtype": "bfloat16", "state": True,
                 "shape": [len(cfg.linear_layers), B, RS, C]},
        "rec": {"dtype": "float32", "state": True,
                "shape": [len(cfg.linear_layers), B] + ([SLOTS] if K else []) +
                         [hv, cfg.linear_key_head_dim, cfg.linear_value_head_dim]},
        # Tmax is chosen at run time: shape entry "Tmax" is replaced by it.
        "kc": {"dtype": "bfloat16", "state": True, "shape": [len(cfg.full_layers), B, Hkv, "Tmax", D]},
        "vc": {"dtype": "bfloat16", "state": True, "shape": [len(cfg.full_layers), B, Hkv, "Tmax", D]},
    }
    if K:
        plan.buffers["logits"]["shape"] = [B * KP, V]
        plan.buffers.update({
            "vtok": {"dtype": "int32", "shape": [B * KP]},      # verify rows [x, d1 … dK]
            "vnext": {"dtype": "int32", "shape": [B * KP]},     # a_j, argmax of verify row j
            "vnextval": {"dtype": "float32", "shape": [B * KP]},
            "emit": {"dtype": "int32", "shape": [B, KP]},       # a_0 … a_n, then −1
            "count": {"dtype": "int32", "shape": [B]},          # n + 1
            "slot": {"dtype": "int32", "state": True, "shape": [B]},
            "ntok_m": {"dtype": "int32", "shape": [B]},
            "mnext": {"dtype": "int32", "shape": [B * lanes.pt]},
            "mtok": {"dtype": "int32", "shape": [B * lanes.pt]},
            "mcat": {"dtype": "bfloat16", "shape": [rmax, 2 * H]},
            "mh": {"dtype": "bfloat16", "shape": [B, H]},
            "mlogits": {"dtype": "bfloat16", "shape": [B, V]},
            "dnext": {"dtype": "int32", "shape": [B]},
            "dval": {"dtype": "float32", "shape": [B]},
            "mpos": {"dtype": "int32", "shape": [B]},
            "one": {"dtype": "int32", "shape": [B]},
            "mkc": {"dtype": "bfloat16", "state": True, "shape": [B, Hkv, "Tmax", D]},
            "mvc": {"dtype": "bfloat16", "state": True, "shape": [B, Hkv, "Tmax", D]},
        })
    raw = [n for n, s in cfg.tensor_shapes(mtp=bool(K)).items() if not cfg.is_int4(n, s)]
    plan.tensors = {n: raw_dtype(n) for n in raw}

    scratch = {"part": 1, "arrivals": 1}   # gemm_q4's ZS > 1 scratch, the most any launch needs

    def tiled_input(wname: str, R: int) -> int:
        """The n-tiles of the activation tile order the GEMV of wname over R rows reads its
        input in (wgmma_q4 with XT = 1), or 0 for rows; its producer writes exactly that."""
        w = plan.weights[wname]
        wl = wgmma_launch(w["rows"], w["k"], btg, R, xt=True) if wgmma else None
        small = wgmma and sk_small_launch(w["rows"], w["k"], btg)
        return btg // 8 if (wl and wl[5]) or small else 0

    def tensor_launch(wname: str, R: int, xt: bool = False):
        """(wgmma_q4 config, gemm_q4 config) of this weight over R rows, at most one of them set;
        both None where gemv_q4 serves it."""
        w = plan.weights[wname]
        wl = wgmma_launch(w["rows"], w["k"], btg, R, xt=xt) if wgmma else None
        return wl, None if wl else gemm_launch(w["rows"], w["k"], btg, R)

    def sk_gemv(wname: str, sk: tuple[int, int, int], epi: int, args: list) -> dict:
        """The wgmma_sk_q4 launch (config sk = (CW, XS, PP)) of weight wname with gemv_q4's
        arguments args (its R rows last), the scratch it needs counted into gemm_part and
        gemm_arrivals."""
        w = plan.weights[wname]
        cw, xs, pp = sk
        e = plan.entry(sk_entry(w["k"], btg, epi, cw, xs, pp))
        G, TB = sk_grid(w["rows"], w["k"], cw)
        gy = cdiv(args[7][1], btg)
        scratch["part"] = max(scratch["part"], sk_pub_floats(btg, cw) * TB * gy)
        scratch["arrivals"] = max(scratch["arrivals"], TB * gy)
        return {"k": e.name, "grid": [G, gy, 1], "args": args + [buf("gemm_part"), buf("gemm_arrivals")]}

    def gemv(wname: str, x: str, y: str, ldy: int, R: int, epi: int, ldx: int | None = None,
             xt: bool = False) -> dict:
        """y[:R, :rows] (=, or += for EPI_ADD) W x[:R]; the grid's y tiles the rows by btg.
        xt: x may be given in tile order (the caller's producer writes it so when
        tiled_input(wname, R) says). (Bigger tiles for the multi-row passes were tried: a 32-row
        tile made the B = 16 mtp verify step 8 % slower on an H200, one block per SM at
        grid.y = 1; bench/NOTES.md.)"""
        w = plan.weights[wname]
        n_out, k = w["rows"], w["k"]
        args = [["w", wname, "qweight"], ["w", wname, "scales"], buf(x), ["i32", ldx or k],
                buf(y), ["i32", ldy], ["i32", n_out], ["i32", R]]
        sk = sk_launch(n_out, k, btg) if wgmma and xt else None
        if sk:
            return sk_gemv(wname, sk, epi, args)
        # wgmma_q4 (sm_90a) or gemm_q4: (entry, row tiles per block, part floats per row block)
        wl, gl = tensor_launch(wname, R, xt)
        if wl:
            wg, mw, xs, zs, mb, xt_, pp = wl
            res = wgmma_resident(n_out, k, btg, xt_, zs)
            e, tiles, pf = (wgmma_entry(k, btg, epi, wg, mw, xs, zs, mb, xt_, pp, res), 4 * wg * mw,
                            wgmma_part_floats(k, btg // 8, wg, mw))
        elif gl:
            mt, wr, st, zs, mb = gl
            e, tiles, pf = (gemm_entry(k, btg, epi, mt, wr, st, zs, mb), mt * wr,
                            gemm_part_floats(k, mt, btg // 8, wr))
        if wl or gl:
            gx, gy = cdiv(cdiv(n_out, 16), tiles), cdiv(R, btg)
            e = plan.entry(e)
            if zs > 1:
                scratch["part"] = max(scratch["part"], pf * gx * gy)
                scratch["arrivals"] = max(scratch["arrivals"], gx * gy)
            return {"k": e.name, "grid": [gx, gy, zs],
                    "args": args + [buf("gemm_part"), buf("gemm_arrivals")]}
        tile = gemv_tile(n_out, k, btg)
        mt, st, xs, a = gemv_config(n_out, k, tile)
        zs = gemv_split(n_out, k, mt, tile, R)
        e = plan.entry(gemv_entry(k, tile, epi, mt, st, xs, a, zs=zs))
        return {"k": e.name, "grid": [n_out // (16 * mt) * zs, cdiv(R, tile), 1], "args": args}

    def norm_to_h(wnorm: str, R: int, tnt: int = 0) -> dict:
        """h = RMS1p(x; wnorm), in tile order for 8·tnt-row tiles where tnt > 0."""
        norm = plan.entry(rmsnorm_entry(H, tnt))
        return {"k": norm.name, "grid": [R, 1, 1],
                "args": [buf("x"), ["t", wnorm], buf("h"), ["f32", eps]]}

    def normed_gemv(wnorm: str, wname: str, y: str, ldy: int, R: int) -> list[dict]:
        """h = RMS1p(x; wnorm) (in tile order where the GEMV reads it so), then y = W h."""
        tnt = tiled_input(wname, R)
        return [norm_to_h(wnorm, R, tnt), gemv(wname, "h", y, ldy, R, 0, xt=bool(tnt))]

    def mlp(wnorm: str, gu: str, down: str, R: int) -> list[dict]:
        """x += W_down SwiGLU(W_gate_up RMS1p(x)). Where gemv_q4 serves gate_up and the down
        GEMV reads its input in rows, SwiGLU is gate_up's epilogue (EPI_SWIGLU): one launch and
        the gu buffer's round trip fewer, the same bits."""
        w = plan.weights[gu]
        n_out, k = w["rows"], w["k"]
        (_, up_off, _) = w["parts"][1]
        # a fused launch's arguments: act = SwiGLU(W_gate_up h), F features
        args = [["w", gu, "qweight"], ["w", gu, "scales"], buf("h"), ["i32", k],
                buf("act"), ["i32", F], ["i32", F], ["i32", R]]
        sk = sk_launch(n_out, k, btg) if wgmma and tiled_input(gu, R) else None
        if SWIGLU_FUSE and sk and tiled_input(down, R) == btg // 8:
            # wgmma_sk_q4 with EPI_SWIGLU: act in the down GEMV's tile order (version 19)
            assert up_off % 16 == 0 and n_out == 2 * up_off and up_off == F, w
            return [norm_to_h(wnorm, R, btg // 8), sk_gemv(gu, sk, EPI_SWIGLU, args),
                    gemv(down, "act", "x", H, R, 1, xt=True)]
        if not (SWIGLU_FUSE and swiglu_fuses(btg, R) and tensor_launch(gu, R) == (None, None)
                and not tiled_input(gu, R) and not tiled_input(down, R)):
            return normed_gemv(wnorm, gu, "gu", 2 * F, R) + swiglu_down(down, R)
        assert up_off % 16 == 0 and n_out == 2 * up_off, w
        tile = gemv_tile(n_out, k, btg)
        st, xs, a = gemv_swiglu_config(tile)
        e = plan.entry(gemv_entry(k, tile, EPI_SWIGLU, 2, st, xs, a, ms=up_off // 16))
        return [norm_to_h(wnorm, R),
                {"k": e.name, "grid": [up_off // 16, cdiv(R, tile), 1], "args": args},
                gemv(down, "act", "x", H, R, 1)]

    def swiglu_down(wname: str, R: int) -> list[dict]:
        """act = SwiGLU(gu) (in tile order where the down GEMV reads it so), then x += W act."""
        tnt = tiled_input(wname, R)
        sw = plan.entry(swiglu_entry(F, tnt))
        return [{"k": sw.name, "grid": swiglu_grid(F, R, tnt),
                 "args": [buf("gu"), buf("act"), ["i32", R]]},
                gemv(wname, "act", "x", H, R, 1, xt=bool(tnt))]

    def out_tiles(wname: str, R: int) -> int:
        """The n-tiles of the tile order the GDN or attention kernel writes o in for the out
        projection wname over R rows (tiled_input), 0 for rows; only attn_tc writes tiles."""
        return tiled_input(wname, R) if ATTN_TC and OUT_XT else 0

    def attention(pt: int, R: int, sa: str, kc: list, vc: list, ntok: str = "ntok",
                  pos: str = "pos", tnt: int = 0) -> list[dict]:
        """attn_prep + attn of one gated-attention layer over proj (q|k|v), into o (in tile
        order for 8·tnt-row tiles where tnt > 0)."""
        ap = plan.entry(attn_prep_entry(cfg, pt))
        at = plan.entry(attn_entry(cfg, pt, attn_head_groups(cfg, R * Hkv), tnt))
        return [{"k": ap.name, "grid": [R, cdiv(Hq + 2 * Hkv, 8), 1],
                 "args": [buf("proj"), ["i32", n_in], ["t", sa + "q_norm.weight"],
                          ["t", sa + "k_norm.weight"], ["f32", eps],
                          ["f32", cfg.rope_theta], buf(pos), buf(ntok), buf("qbuf"),
                          kc, vc, ["tmax"]]},
                {"k": at.name, "grid": [attn_grid_x(B * Hkv * pt, attn_blocks()), B * Hkv, pt],
                 "args": [buf("qbuf"), buf("proj"), ["i32", n_in], kc, vc,
                          ["tmax"], buf(pos), buf(ntok), buf("attn_part"),
                          buf("attn_arrivals"), buf("o")]}]

    def step(pt: int, tokens: str = "tokens", verify: bool = False,
             advance: bool = True) -> list[dict]:
        """The target over pt rows per sequence. verify: lm_head and argmax over every row
        (into vnext), the GDN writing a state slot per row."""
        R = B * pt
        s: list[dict] = []
        e = plan.entry(embed_entry(H))
        s.append({"k": e.name, "grid": [R, 1, 1],
                  "args": [["t", "model.language_model.embed_tokens.weight"], buf(tokens),
                           buf("x")]})
        for i in range(cfg.num_hidden_layers):
            p = f"model.language_model.layers.{i}."
            s += normed_gemv(p + "input_layernorm.weight", f"L{i}.in", "proj", n_in, R)
            tnt = out_tiles(f"L{i}.out", R)
            if i in lg:
                la_ = p + "linear_attn."
                if K:
                    g = plan.entry(gdn_entry(cfg, pt, RS, int(verify), SLOTS, tnt=tnt))
                    L = gdn_launch(cfg, pt, RS)
                else:
                    g = plan.entry(gdn_entry(cfg, pt, batch=B, tnt=tnt))
                    L = gdn_launch(cfg, pt, batch=B)
                s.append({"k": g.name, "grid": [B * L["blocks_per_seq"], 1, 1],
                          "args": [buf("proj"), ["i32", n_in], buf("proj", C + Cv), ["i32", n_in],
                                   ["i32", ba_off], ["t", la_ + "conv1d.weight"],
                                   ["t", la_ + "A_log"], ["t", la_ + "dt_bias"],
                                   ["t", la_ + "norm.weight"], ["f32", eps],
                                   buf("conv", lg[i] * B * RS * C),
                                   buf("ring_arrivals"),
                                   buf("rec", lg[i] * B * SLOTS * hv * dkv),
                                   buf("pos"), buf("ntok"), buf("o")]
                          + ([buf("slot")] if K else [])})
            else:
                sa = p + "self_attn."
                s += attention(pt, R, sa, buf("kc", 0, la[i] * kv_layer),
                               buf("vc", 0, la[i] * kv_layer), tnt=tnt)
            # o is written densely by its producer: [R, Cv] after GDN, [R, H·D] after attention
            # (or in the tile order of the out GEMV, where it reads it so).
            s.append(gemv(f"L{i}.out", "o", "x", H, R, 1, ldx=Cv if i in lg else cfg.q_dim,
                          xt=bool(tnt)))
            s += mlp(p + "post_attention_layernorm.weight", f"L{i}.gate_up", f"L{i}.down", R)
        # A decode step of a lane without mtp feeds the final norm straight to the lm_head,
        # so it may write the tile order; elsewhere the gather or the mtp layer reads it in rows.
        tnt = tiled_input("lm_head", B) if pt == 1 and not verify and not K else 0
        fnorm = plan.entry(rmsnorm_entry(H, tnt))
        s.append({"k": fnorm.name, "grid": [R, 1, 1],
                  "args": [buf("x"), ["t", "model.language_model.norm.weight"], buf("h"),
                           ["f32", eps]]})
        am = plan.entry(argmax_entry(V))
        if verify:
            s.append(gemv("lm_head", "h", "logits", V, R, 0))
            s.append({"k": am.name, "grid": [R, 1, 1],
                      "args": [buf("logits"), buf("vnext"), buf("vnextval")]})
        else:
            src = "h"
            if pt > 1:
                gl = plan.entry(gather_last_entry(H, pt))
                s.append({"k": gl.name, "grid": [B, 1, 1],
                          "args": [buf("h"), buf("ntok"), buf("hlast")]})
                src = "hlast"
            s.append(gemv("lm_head", src, "logits", V, B, 0, xt=bool(tnt)))
            s.append({"k": am.name, "grid": [B, 1, 1],
                      "args": [buf("logits"), buf("next"), buf("nextval")]})
        if advance:
            s.append(advance_step("ntok"))
        return s

    def advance_step(ntok: str) -> dict:
        adv = plan.entry(advance_entry())
        return {"k": adv.name, "grid": [cdiv(B, 128), 1, 1],
                "args": [buf("pos"), buf(ntok), ["i32", B]]}

    # ---------------------------------------------------------------- mtp (MODEL.md §8)
    def mtp_layer(pt: int, R: int, ntok: str, pos: str, hid: str, out: str,
                  gather: bool) -> list[dict]:
        """MTP rows (§8.1) over R = B·pt rows: token embeddings in x, hiddens in `hid`;
        h' into `out` (gather: of row ntok[b] − 1 of each sequence, else every row), then the
        shared lm_head, argmax into dnext and the draft into its verify row (by the caller)."""
        mp = "mtp.layers.0."
        nld = plan.entry(rmsnorm_ld_entry(H))
        norm = plan.entry(rmsnorm_entry(H))
        s = [{"k": nld.name, "grid": [R, 1, 1],
              "args": [buf("x"), ["i32", H], ["t", "mtp.pre_fc_norm_embedding.weight"],
                       buf("mcat"), ["i32", 2 * H], ["f32", eps]]},
             {"k": nld.name, "grid": [R, 1, 1],
              "args": [buf(hid), ["i32", H], ["t", "mtp.pre_fc_norm_hidden.weight"],
                       buf("mcat", H), ["i32", 2 * H], ["f32", eps]]},
             gemv("M.fc", "mcat", "x", H, R, 0)]
        s += normed_gemv(mp + "input_layernorm.weight", "M.in", "proj", n_in, R)
        tnt = out_tiles("M.out", R)
        s += attention(pt, R, mp + "self_attn.", buf("mkc"), buf("mvc"), ntok=ntok, pos=pos,
                       tnt=tnt)
        s.append(gemv("M.out", "o", "x", H, R, 1, ldx=cfg.q_dim, xt=bool(tnt)))
        s += mlp(mp + "post_attention_layernorm.weight", "M.gate_up", "M.down", R)
        s.append({"k": norm.name, "grid": [R, 1, 1],
                  "args": [buf("x"), ["t", "mtp.norm.weight"], buf(out if not gather else "h"),
                           ["f32", eps]]})
        if gather:
            gl = plan.entry(gather_last_entry(H, pt))
            s.append({"k": gl.name, "grid": [B, 1, 1], "args": [buf("h"), buf(ntok), buf(out)]})
        am = plan.entry(argmax_entry(V))
        s.append(gemv("lm_head", out, "mlogits", V, B, 0))
        s.append({"k": am.name, "grid": [B, 1, 1],
                  "args": [buf("mlogits"), buf("dnext"), buf("dval")]})
        return s

    def put_row(src: str, j: int) -> dict:
        e = plan.entry(spec_put_entry())
        return {"k": e.name, "grid": [cdiv(B, SPEC_THREADS), 1, 1],
                "args": [buf("vtok"), buf(src), ["i32", j], ["i32", KP], ["i32", B]]}

    def mtp_pass(pt: int, tok: str, ntok: str) -> list[dict]:
        """§8.2 step 1: MTP rows over the pass just run (row t: token `tok`[t], the target's
        post-norm hidden of row t in h, position pos[b] + t, ntok[b] rows real) → d1; then
        pos += ntok and §8.2 step 2, the K − 1 one-row draft steps → d2 … dK, each written into
        its verify row."""
        R = B * pt
        e = plan.entry(embed_entry(H))
        s = [{"k": e.name, "grid": [R, 1, 1],
              "args": [["t", "model.language_model.embed_tokens.weight"], buf(tok), buf("x")]}]
        s += mtp_layer(pt, R, ntok, "pos", "h", "mh", gather=True)
        s.append(put_row("dnext", 1))
        s.append(advance_step(ntok))
        for j in range(2, K + 1):      # row (d_{j−1}, h' of the previous row, position t + j − 1)
            sp = plan.entry(spec_pos_entry())
            s.append({"k": sp.name, "grid": [cdiv(B, SPEC_THREADS), 1, 1],
                      "args": [buf("pos"), ["i32", j - 2], buf("mpos"), buf("one"),
                               ["i32", B]]})
            s.append({"k": e.name, "grid": [B, 1, 1],
                      "args": [["t", "model.language_model.embed_tokens.weight"], buf("dnext"),
                               buf("x")]})
            s += mtp_layer(1, B, "one", "mpos", "mh", "mh", gather=False)
            s.append(put_row("dnext", j))
        return s

    plan.schedule = {"decode": step(1)}
    plan.schedule["prefill"] = step(lanes.pt) if lanes.pt > 1 else plan.schedule["decode"]
    plan.schedule["prefill_pt"] = lanes.pt
    if K:
        # prefill chunk + MTP rows over it (fills the MTP cache; after a prompt's last chunk its
        # verify rows are [next, d1 … dK]); verify [x, d1 … dK] + accept + MTP rows over the
        # accepted rows + drafts for the next verify.
        tk_ = plan.entry(spec_tokens_entry(lanes.pt))
        plan.schedule["prefill"] = (
            step(lanes.pt, advance=False)
            + [{"k": tk_.name, "grid": [cdiv(B * lanes.pt, SPEC_THREADS), 1, 1],
                "args": [buf("mnext"), buf("next"), buf("mtok"), ["i32", B * lanes.pt]]},
               put_row("next", 0)]
            + mtp_pass(lanes.pt, "mtok", "ntok"))
        ac = plan.entry(spec_accept_entry(KP))
        plan.schedule["verify"] = (
            step(KP, tokens="vtok", verify=True, advance=False)
            + [{"k": ac.name, "grid": [cdiv(B, SPEC_THREADS), 1, 1],
                "args": [buf("vtok"), buf("vnext"), buf("emit"), buf("count"), buf("slot"),
                         buf("ntok_m"), ["i32", B]]}]
            + mtp_pass(KP, "vnext", "ntok_m"))
        plan.schedule["verify_rows"] = KP
    # gemm_q4 split-K scratch, shared by every launch with ZS > 1 (launches run one at a time):
    # fp32 partials, and arrival counters that every launch leaves at zero.
    plan.buffers["gemm_part"] = {"dtype": "float32", "shape": [scratch["part"]]}
    plan.buffers["gemm_arrivals"] = {"dtype": "int32", "shape": [scratch["arrivals"]]}
    tk = plan.entry(topk_entry(V))
    # Optional, after a step: the top-k logits of each sequence's sampled row.
    plan.schedule["topk"] = [{"k": tk.name, "grid": [B, 1, 1],
                              "args": [buf("logits"), buf("topk_val"), buf("topk_idx")]}]
    return plan

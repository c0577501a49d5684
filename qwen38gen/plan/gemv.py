"""The CUDA-core int4 GEMV families: gemv_q4 (kernels/gemv_q4.cuh) and gemm_q4 (gemm_q4.cuh),
their schedules from the table (plan/table.py) and their entry points. Each builder mirrors its
header's Launch struct; the entry point static_asserts the mirrored numbers against the C++ ones.
"""

from __future__ import annotations

from ..tuning import Tuning
from . import table
from .arch import ArchFacts
from .entries import Entry, cdiv

GEMV_KS = 8    # warps per block splitting K (fewer when K has fewer groups)
GEMV_PARAMS = (("const uint4*", "qweight"), ("const q38::bf16*", "scales"),
               ("const q38::bf16*", "x"), ("int", "ldx"), ("q38::bf16*", "y"), ("int", "ldy"),
               ("int", "N"), ("int", "R"))
# gemm_q4, wgmma_q4 and wgmma_sk_q4 add split-K scratch: fp32 partials and arrival counters.
GEMM_PARAMS = GEMV_PARAMS + (("float*", "part"), ("int*", "arrivals"))
EPI_STORE, EPI_ADD, EPI_SWIGLU = 0, 1, 2   # gemv_q4.cuh GemvEpilogue


def k_parts(k: int) -> int:
    """KS: the parts K is split into over a block's warps."""
    return min(GEMV_KS, k // 128)


def gemv_split(rows: int, k: int, mt: int, btg: int, R: int, tuning: Tuning,
               arch: ArchFacts) -> int:
    """ZS of gemv_q4 for a weight of `rows` x `k` at mt m-tiles per warp over R rows in btg-row
    tiles: the blocks of a cluster that share a row block's KS parts (1: one block holds them).
    Where 16-row tiles of a one-wave weight (the out and down projections: 320 row blocks of
    77 registers, two or three per SM) run in a single tile, pairs of 4-warp blocks even out the
    SMs' shares: down 24.9 -> 22.5 us, out 10.5 -> 10.0 us under PDL, the B = 16 step 8.58 ->
    8.37 ms. At one row (80 against 72 registers), on the multi-wave weights and at 32-row
    tiles (the out projection of B = 32 and 64, bound by its warps' own chain: 20.0 us at ZS 1
    and 8) it did not win (dd8da46:bench/2026-12-03-h200-v12-gemv-sweep-zs*.txt). Tuning.gemv_zs: 1
    never splits, 2, 4 or 8 split every one-wave weight at btg <= 16 that way."""
    ks = k_parts(k)
    one_wave = mt == 1 and rows // 16 < arch.gemv_wave
    if tuning.gemv_zs is not None:
        zs = tuning.gemv_zs
        return zs if btg <= 16 and one_wave and ks % zs == 0 else 1
    return 2 if btg == 16 and R <= btg and one_wave and ks % 2 == 0 else 1


def gemv_config(role: str, rows: int, btg: int, arch: ArchFacts) -> tuple[int, int, int, int]:
    """(MT, ST, XS, AS) of gemv_q4 for a weight of this role and `rows` at batch tile btg
    (plan/table.py GEMV_Q4). None of them changes a row's result (only KS does, and KS depends
    on k alone; tests/gpu/test_gemv_q4.py checks the bits)."""
    tiles = rows // 16
    if btg <= 8 and tiles < arch.gemv_wave:
        return table.GEMV_Q4_ONE_WAVE
    if tiles % 2:
        return table.GEMV_Q4_ODD_TILES
    return table.GEMV_Q4.get((btg, role), table.GEMV_Q4_DEFAULT)


def swiglu_fuses(btg: int, R: int) -> bool:
    """Whether gate_up (on gemv_q4) takes SwiGLU into its epilogue at batch tile btg over R rows.
    It needs MT = 2 (a gate and an up tile per block). Measured in the step (docs/PERFORMANCE.md,
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
    return a * k_parts(k) // zs * st * mt * 66 * 16


def gemv_cv_launch(nt: int, ks: int, st: int, wm: int, mi: int = 1) -> tuple[int, int]:
    """(threads, dynamic shared memory) of a gemv_cv instance (kernels/gemv_cv.cuh GemvCvLaunch:
    WM·KS consumer warps and a loader warp; ST chunks of 66 · 16 bytes per consumer warp, two
    rounds of part sums, a full and an empty mbarrier per stage; MI m-tiles per consumer warp
    multiply the stage and the part sums). docs/GEMV_MAINLOOP.md step 1; no program launches it
    yet."""
    c = wm * ks
    return 32 * (c + 1), c * st * mi * 66 * 16 + 2 * c * mi * 4 * nt * 32 * 4 + 2 * c * st * 8


def gemv_cv_xp(nt: int, ks: int, wm: int, xp: int = 1) -> int:
    """gemv_cv's XP where the instance allows it, else 0: the next group's x in flight costs a
    second set of 16 · NT registers, which at NT = 2 fits only blocks of at most 8 consumer warps
    (at 16, 544 threads, ptxas spills: version 31). GemvCvLaunch static_asserts the same rule."""
    return xp if nt == 1 or wm * ks <= 8 else 0


def gemv_entry(k: int, btg: int, epi: int, mt: int = 1, st: int = 2, xs: int = 0,
               a: int = 0, ms: int = 0, zs: int = 1) -> Entry:
    """ms > 0 (with epi = EPI_SWIGLU, mt = 2): the block's m-tiles are gate tile t and up tile
    t + ms of a fused gate_up weight. zs > 1: a cluster of zs blocks of ks/zs warps per row
    block (grid.x = row blocks · zs)."""
    ks = k_parts(k)
    nt = btg // 8
    smem = gemv_smem(k, mt, st, a, zs)
    tmpl = (f"{k}, {mt}, {nt}, {ks}, {epi}, {st}, {xs}, {a}"
            + (f", {ms}, {zs}" if zs > 1 else f", {ms}" if ms else ""))
    return Entry(name=f"q38_gemv_k{k}_m{mt}_n{nt}_s{ks}_e{epi}_st{st}_x{xs}" + ("_a1" if a else "")
                 + (f"_ms{ms}" if ms else "") + (f"_z{zs}" if zs > 1 else ""),
                 call=f"q38::gemv_q4<{tmpl}>",
                 params=GEMV_PARAMS, threads=32 * ks // zs, smem=smem, waits=True, cluster=zs,
                 # minBlocks 1 lets ptxas use up to 255 registers: with the default it capped
                 # the 4-warp NT=4 instance at 128 and spilled.
                 min_blocks=1,
                 asserts=(f"q38::GemvLaunch<{mt}, {nt}, {ks}, {st}, {a}"
                          + (f", {zs}" if zs > 1 else "") + f">::dyn_smem_bytes == {smem}",),
                 family="gemv_q4",
                 meta=(("xt", 0), ("config", {"mt": mt, "nt": nt, "ks": ks, "st": st, "xs": xs,
                                               "as": a, "ms": ms, "zs": zs})))


def gemm_config(role: str, btg: int) -> tuple[int, int, int, int] | None:
    """(MT, WR, ST, MB) of gemm_q4 for a weight of this role at batch tile btg, or None where
    gemv_q4 is faster (plan/table.py GEMM_Q4). Scheduling only: a row's result is gemv_q4's."""
    return table.GEMM_Q4.get((btg, role))


def gemv_tile(role: str, btg: int) -> int:
    """The batch tile a launch of this weight runs with: the lane's btg, but gemv_q4 runs a
    64-row lane in 32-row tiles (its 64-row instance is slower: 33.7 against 30.4 us on the out
    projection)."""
    return 32 if btg >= 64 and gemm_config(role, btg) is None else btg


def gemm_smem(k: int, mt: int, nt: int, wr: int, st: int, zs: int) -> int:
    """Dynamic shared memory of a gemm_q4 instance (GemmLaunch::dyn_smem_bytes)."""
    sums = wr * mt * nt * 4 * 32 * 4 if k_parts(k) > 1 and zs == 1 else 0
    return st * (8 * nt * 17 + wr * mt * 66) * 16 + sums


def gemm_split(blocks: int, k: int, per_sm: int, arch: ArchFacts) -> int:
    """ZS: 1 when the row blocks nearly fill the GPU (three quarters of per_sm blocks per SM), else
    the fewest blocks per row block (a divisor of KS) that give about one wave of resident blocks
    (per_sm per SM). (gdn.in at 64 rows: 129 blocks at ZS = 1 measured 52.6 us; down: 40 row blocks,
    ZS = 8 70.7 us against 155.8 us at ZS = 1.)"""
    ks = k_parts(k)
    if blocks >= arch.sms * per_sm * 3 // 4:
        return 1
    zs = 1
    while zs < ks and blocks * zs < arch.sms * per_sm and ks % (2 * zs) == 0:
        zs *= 2
    return zs


def gemm_launch(role: str, rows: int, k: int, btg: int, R: int,
                arch: ArchFacts) -> tuple[int, int, int, int, int] | None:
    """(MT, WR, ST, ZS, MB) of the gemm_q4 launch of a weight over R activation rows, or None
    where gemv_q4 serves it: gemm_config's schedule, the split gemm_split gives its grid, and
    the register cap only where the split is (in-block part sums need more than 128)."""
    gc = gemm_config(role, btg)
    if gc is None:
        return None
    mt, wr, st, mb = gc
    zs = gemm_split(cdiv(cdiv(rows, 16), mt * wr) * cdiv(R, btg), k, mb, arch)
    return mt, wr, st, zs, (mb if zs > 1 else 1)


def gemm_entry(k: int, btg: int, epi: int, mt: int, wr: int, st: int, zs: int,
               mb: int = 1) -> Entry:
    ks = k_parts(k)
    nt = btg // 8
    smem = gemm_smem(k, mt, nt, wr, st, zs)
    targs = f"{k}, {mt}, {nt}, {ks}, {epi}, {wr}, {st}, {zs}"
    return Entry(name=f"q38_gemv_k{k}_g{mt}_n{nt}_w{wr}_s{ks}_e{epi}_st{st}_z{zs}_b{mb}",
                 call=f"q38::gemm_q4<{targs}>", params=GEMM_PARAMS, threads=32 * wr, smem=smem,
                 waits=True, min_blocks=mb,
                 asserts=(f"q38::GemmLaunch<{mt}, {nt}, {ks}, {wr}, {st}, {zs}>::dyn_smem_bytes "
                          f"== {smem}",),
                 family="gemm_q4",
                 meta=(("xt", 0), ("config", {"mt": mt, "nt": nt, "ks": ks, "wr": wr, "st": st,
                                               "zs": zs, "mb": mb})))


def gemm_part_floats(k: int, mt: int, nt: int, wr: int) -> int:
    """fp32 partials per row block of a ZS > 1 launch (GemmLaunch::part_floats)."""
    return k_parts(k) * wr * mt * nt * 4 * 32

"""The schedule table: the plain program's launch choices as data, keyed by what a weight is (its
role: tuning.ROLES) and the batch tile. Every entry only reschedules a row's arithmetic (the bits
are gemv_q4's: tests/gpu/test_gemv_q4.py), so a choice may follow the role and the tile; each
is the fastest measured on an H200 (docs/PERFORMANCE.md, the version named beside it). A program can
override a choice through its lanes' Tuning (tuning.py), which then shows in its name.
"""

from __future__ import annotations

# ------------------------------------------------------------------------------------ gemv_q4
# (btg, role) -> (MT, ST, XS, AS): m-tiles per warp, pipeline stages, activations staged in
# registers, stages in shared memory via cp.async; absent: GEMV_Q4_DEFAULT. Two rules come first
# (plan/gemv.py gemv_config): at btg <= 8 a weight whose row blocks fit the GPU in one wave stages
# its activations (XS = 1), and a weight of an odd number of row tiles keeps MT = 1.
# From the sweeps of scripts/gemv_sweep.py (version 2): deeper register pipelines lose everywhere
# (registers cost occupancy); two m-tiles per warp halve the activation reads and win from
# btg = 16 on the wide roles; the cp.async ring wins only on the lm_head (+7%). Version 6: where
# the row blocks fit the GPU in one wave (the down and out projections, 320 of them), occupancy is
# not the limit and each warp's activation loads are: staged with the weights one group ahead
# (XS = 1), the down projection at btg 8 took 15.9 against 20.5 us under PDL and out 6.8 against
# 8.6 (dd8da46:bench/2026-12-02-h200-v6-gemv-sweep-persistent.txt).
GEMV_Q4_DEFAULT = (1, 2, 0, 0)
GEMV_Q4_ONE_WAVE = (1, 2, 1, 0)
GEMV_Q4_ODD_TILES = (1, 2, 0, 0)
GEMV_Q4: dict[tuple[int, str], tuple[int, int, int, int]] = {
    (8, "lm_head"): (2, 3, 0, 1),
    (16, "lm_head"): (2, 3, 0, 1),
    (16, "in"): (2, 2, 0, 0), (16, "gate_up"): (2, 2, 0, 0),
    (24, "in"): (2, 2, 0, 0), (24, "gate_up"): (2, 2, 0, 0), (24, "lm_head"): (2, 2, 0, 0),
    **{(t, r): (2, 2, 0, 0) for t in (32, 64)
       for r in ("in", "out", "gate_up", "down", "lm_head", "fc")},
}

# ------------------------------------------------------------------------------------ gemm_q4
# (btg, role) -> (MT, WR, ST, MB) of gemm_q4 (m-tiles per warp, warps per block, ring stages,
# min blocks per SM); absent: gemv_q4 serves (a 64-row lane in 32-row tiles of it). From
# scripts/gemv_sweep.py (version 3): at 64 rows gemm_q4 wins on the wide roles (gate_up 137.5 ->
# 126.8 us, gdn.in 67.5 -> 52.6 us, lm_head 964 -> 556 us against gemv_q4 in two 32-row tiles)
# and, split over 8 blocks, on the down projection (72.6 -> 70.7 us); the out projection stays
# with gemv_q4. At 32 rows gemm_q4 won alone too (gate_up 74.5 -> 66.5 us, lm_head 497 -> 308,
# down 49.6 -> 44.9) and took the step's GEMV time from 12.37 to 11.75 ms, but the B = 32 step
# itself measured 17.84 against 17.57 ms, so btg 32 stays with gemv_q4. At 16 rows and below
# gemv_q4 wins everywhere. The MTP layer's fc (few rows over K = 2H) is scheduled as down.
GEMM_Q4: dict[tuple[int, str], tuple[int, int, int, int]] = {
    (64, "in"): (2, 4, 3, 1), (64, "gate_up"): (2, 4, 3, 1), (64, "lm_head"): (2, 4, 3, 1),
    (64, "down"): (1, 8, 3, 2), (64, "fc"): (1, 8, 3, 2),
}

# ------------------------------------------------------------------------------------ wgmma_q4
# (btg, role) -> (WG, MW, XS, MB) of wgmma_q4 reading its input in rows (warpgroups per block,
# 64-row blocks per warpgroup, weight ring stages, min blocks per SM). Version 4, us per launch
# against the kernel picked otherwise: btg 64 gate_up 116.8 against gemm_q4's 124.9, gdn.in /
# attn.in 51.5 / 50.6 against 52.2 / 52.2, down (split over blocks) 70.1-70.8 against 70.7; btg
# 32 lm_head 377.6 against gemv_q4's 494.1. Everything else measured slower on wgmma_q4.
WGMMA_Q4: dict[tuple[int, str], tuple[int, int, int, int]] = {
    (64, "gate_up"): (3, 1, 4, 1),
    (64, "in"): (2, 1, 4, 1),
    (64, "down"): (4, 1, 3, 1),
    (64, "fc"): (4, 1, 3, 1),
    (32, "lm_head"): (2, 2, 4, 1),
}
# Roles measured split only: unsplit, their 4-warpgroup instance spills (128 registers), so
# wgmma_q4 does not serve them where the split would be 1.
WGMMA_SPLIT_ONLY = ("down", "fc")

# (btg, role) -> (WG, MW, XS, MB, PP) of wgmma_q4 with XT = 1: the activations already in tile
# order, written so by their producer (the norm, SwiGLU, GDN or attention), each group's tile one
# contiguous cp.async copy into the ring. Version 7's sweeps, us per launch under PDL. 64 rows
# (dd8da46:bench/2026-12-02-h200-v7-gemv-sweep-xt.txt): gdn.in 49.4 -> 31.4, attn.in 48.3 -> 30.9,
# gate_up 111.5 -> 90.3, down 67.1 -> 60.4. 32 rows, with PP = 1 (two register sets: a group's
# wgmmas run while the next is dequantized; -v7-gemv-sweep-pp.txt): gdn.in 26.0 and attn.in 25.6
# against gemv_q4's ~35, gate_up 68.2 against ~74. At 64 rows PP measured within 2 % (gate_up 85.7
# against 87.1 and 89.1 in two runs; the in projections 2 us slower), so only gate_up takes it
# there. The lm_head (decode steps of lanes without mtp, where the final norm feeds it
# directly): 441-443 us against gemm_q4's ~556 at 64 rows, 320 against 370 at 32. Version 8
# (dd8da46:bench/2026-12-03-h200-v8-gemv-sweep-mb.txt): two ring stages and three blocks per SM (138
# registers, 3 x 40 KiB of ring) take gate_up at 64 rows from 86.2 (PP) to 72.2 us and the lm_head
# from 442 to 403; the in projections (one wave at two blocks per SM) stay, 41.7 against 31.3
# with two stages. The second sweep (-v8-gemv-sweep-mb2.txt): one warpgroup per block at three
# blocks per SM also for the split down projection (64 rows: 45.1 against 60.5 us at WG 4; 32
# rows, now in tile order: 30.6 against gemv_q4's 48.3), gate_up at 32 rows (54.0 against 68.3
# with PP) and the 32-row lm_head (289.7 at four blocks per SM against ~320). At 16 rows gemv_q4
# stays ahead on every role but the lm_head (221 against 241 us, a single launch: not taken).
# 24 rows (version 16, m64n24k16; dd8da46:bench/2026-12-04-h200-v16-gemv-sweep-t24.txt, us under
# PDL): gate_up 55.6 at ZS 4 and four blocks per SM (62.9 with the 32-row schedule, 53.7 at 32
# rows), the in projections 24.9 / 24.4 (PP), out 13.7 and down 26.5 (split as at 32 rows: 15.6 and
# 30.6 there), the lm_head 287.0; the step's GEMVs 8.00 ms against 8.34 in 32-row tiles and
# 10.39 in two 16-row tiles of gemv_q4 (whose 24-row instances lose: gate_up 63.6 us at one
# block per SM, 147 registers). In the step B = 24 took 11.58 against 11.96 ms in 32-row tiles.
# The out projection in tile order (version 13: its input comes from the GDN and the attention
# kernels, which write the tile order since then), version 8's sweep (-v8-gemv-sweep-mb2.txt, us
# under PDL): 32 rows 15.8 at ZS 8 against gemv_q4's 20.2; 64 rows 25.3 at ZS 4 (27.0 at ZS 8,
# the split gemm_split gives) against 28.8 for gemv_q4 in two 32-row tiles. (fc reads its input
# in rows: no entry.)
WGMMA_Q4_XT: dict[tuple[int, str], tuple[int, int, int, int, int]] = {
    (64, "gate_up"): (1, 1, 2, 3, 0),
    (64, "in"): (1, 1, 4, 2, 0),
    (64, "down"): (1, 1, 3, 3, 0),
    (64, "lm_head"): (1, 1, 2, 3, 0),
    (32, "gate_up"): (1, 1, 3, 3, 0),
    (32, "in"): (1, 1, 4, 2, 1),
    (32, "down"): (1, 1, 2, 3, 0),
    (32, "lm_head"): (1, 1, 2, 4, 0),
    (64, "out"): (1, 1, 2, 3, 0),
    (32, "out"): (1, 1, 2, 3, 0),
    (24, "gate_up"): (1, 1, 2, 4, 0),
    (24, "in"): (1, 1, 4, 2, 1),
    (24, "down"): (1, 1, 2, 3, 0),
    (24, "lm_head"): (1, 1, 3, 3, 0),
    (24, "out"): (1, 1, 2, 3, 0),
}
# The split (ZS) of a tile-order wgmma_q4 launch where it is not gemm_split's:
WGMMA_Q4_XT_ZS: dict[tuple[int, str], int] = {(64, "out"): 4, (24, "gate_up"): 4}
# The split down and out projections at 24 and 32 rows (one warpgroup, 2 ring stages, ZS 8) say
# three blocks per SM (MB) but run five: 93-96 registers and 21-25 KB of shared memory allow
# it, and their 640 blocks (80 row blocks x 8) fill one wave of 660 slots only at five. Version
# 20 lost that by accident (a merge at 109 registers, four blocks per SM: 1.2 waves, B = 24
# +0.48 ms), and declaring five in __launch_bounds__ capped the registers at a cost of its own
# (B = 24 +0.07 ms). So the gate checks it instead (Entry.resident).
WGMMA_Q4_XT_RESIDENT: dict[tuple[int, str], int] = {(24, "down"): 5, (24, "out"): 5,
                                                    (32, "down"): 5, (32, "out"): 5}

# ------------------------------------------------------------------------------------ wgmma_sk_q4
# (btg, role) -> (CW, XS, PP) of wgmma_sk_q4 (version 18): a producer warp and CW consumer
# warpgroups sharing each activation tile (x in tile order), the (tile-block, part) units cut
# evenly over about one block per SM. scripts/gemv_sweep.py (GEMV_SWEEP=sk,
# dd8da46:bench/2026-12-04-h200-v18-sk-sweep.txt, us under PDL against WGMMA_Q4_XT's schedule): 64
# rows gate_up 55.6 against 71.6, the lm_head 347 against 398, attn.in 28.3 against 30.7 (gdn.in
# 31.0 against 31.3); 32 rows gate_up 42.0 against 53.8, the lm_head 253 against 294; 24 rows
# (GEMV_SWEEP=sk16, -sk-sweep-16-24.txt) gate_up 40.1 against 52.2, the lm_head 240 against 287.
# The 24- and 32-row in projections (25.5 against 24.6, 28 against 26), out and down (their few
# tile-blocks cut over many blocks: chains of published sums) stay on wgmma_q4, and 16 rows on
# gemv_q4 (gate_up 37.1 against 38.0, without the SwiGLU epilogue gemv_q4 fuses; the in
# projections 21-23 against 18). Where it serves gate_up, SwiGLU is its epilogue (version 19): in
# the step B = 24 10.58 -> 10.41 ms, B = 32 12.05 -> 11.96, B = 64 18.20 -> 18.19.
WGMMA_SK_Q4: dict[tuple[int, str], tuple[int, int, int]] = {
    (64, "gate_up"): (3, 4, 0),
    (64, "lm_head"): (3, 4, 0),
    (64, "in"): (2, 4, 1),
    (32, "gate_up"): (4, 6, 0),
    (32, "lm_head"): (4, 6, 0),
    (24, "gate_up"): (4, 6, 0),
    (24, "lm_head"): (4, 6, 0),
}
# Tuning.wgmma_sk = "all" puts every tile-order launch on wgmma_sk_q4 at this (CW, XS, PP) unless
# Tuning.sk_cfg names its role (how `check` locks the kernel's bits on the tiny model).
WGMMA_SK_ALL = (2, 4, 0)

# ------------------------------------------------------------------------------------ gdn
# GE (kernels/gdn.cuh) of the plain program's decode step: the conv's copies requested first,
# then GE of a thread's 16 state rows, the others once the conv is done; 16 below
# GDN_GE_MIN_BATCH and GDN_GE_MANY from there. scripts/gdn_bench.py (in dd8da46), us per launch
# under PDL against -1, every row first (dd8da46:bench/2026-12-04-h200-v17-gdn-ge.txt): B = 1
# 6.4-6.9 against 7.3-9.6, B = 8 19.3 against 19.9; 4 rows at B = 16 31.8 against 35.2, 24 47.0
# against 52.1, 32 58.9 against 66.2, 64 114.5 against 126.1.
GDN_GE_MIN_BATCH = 12
GDN_GE_MANY = 4
# GW: up to GDN_GW_MAX_BATCH rows, the first wave of blocks (sms x blocks per SM) requests every
# row early. In the step (dd8da46:bench/2026-12-04-h200-v17-step-gw.json, ms, two rounds): B = 16
# 8.25 -> 8.22 with it; but 24 11.23 -> 11.30, 32 12.85 -> 12.91, 64 19.46 -> 19.54 (under PDL the
# GDN's first wave is resident while the gemv_q4 before it drains; after a wgmma_q4 launch, at 24
# rows and more, its early loads only hold up the conv: the likely reason, not measured).
GDN_GW_MAX_BATCH = 16

# ------------------------------------------------------------------------------------ attention
# attn_tc's schedule (kernels/attention_tc.cuh): ST ring stages and MB min blocks per SM only
# reschedule a row's arithmetic (Tuning.attn_st, attn_mb); its 157 KiB of shared memory fit one
# block per SM, so grid.x aims at ATTN_BLOCKS_PER_SM x sms blocks (Tuning.attn_grid). Version 10
# (dd8da46:bench/2026-12-03-h200-v10-attn-sweep-3.txt): a third ring stage was no faster (28.9
# against 28.2 us at B = 16).
ATTN_BLOCKS_PER_SM = 1

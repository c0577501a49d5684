"""Sweep the schedule knobs of gemv_q4 (MT, ST, XS, AS), gemm_q4 (MT, WR, ST, ZS) and wgmma_q4
(WG, MW, XS, ZS) at each NT over the 27B decode shapes; GEMV_SWEEP=cv times gemv_cv (the scale
folded into a bf16 weight, docs/GEMV_MAINLOOP.md step 1) beside gemv_q4.

  python3 scripts/gemv_sweep.py build OUT.cubin   # CPU machine: nvcc the instances (gate cache)
  python3 scripts/gemv_sweep.py run OUT.cubin     # GPU machine: time them with PyCUDA

Every instance of one NT and one arithmetic (gemv_q4's, which gemm_q4 and the wgmma kernels
share, or gemv_cv's) must give bitwise the same y (the knobs only reschedule the same
arithmetic); `run` checks that before it prints the effective weight bandwidth of each config.
The weights rotate over a pool of distinct copies larger than L2, so no launch reads them from L2.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from qwen38gen.gate import compile_kernels  # noqa: E402
from qwen38gen.weights import tile_activations as _tile  # noqa: E402
from qwen38gen.plan.arch import arch_facts  # noqa: E402
from qwen38gen.plan.gemv import (gemm_part_floats, gemm_smem, gemv_cv_launch, gemv_cv_xp,  # noqa: E402
                                 gemv_smem)
from qwen38gen.plan.wgmma import sk_pub_floats, sk_smem, wgmma_part_floats, wgmma_smem  # noqa: E402
from qwen38gen.plan.wgmma import sk_grid as plan_sk_grid  # noqa: E402

# (name, N rows, K, launches per 27B decode step)
SHAPES = [("gdn.in", 16480, 5120, 48), ("attn.in", 14336, 5120, 16), ("out", 5120, 6144, 64),
          ("gate_up", 34816, 5120, 64), ("down", 5120, 17408, 64), ("lm_head", 248320, 5120, 1)]
# NT -> batch rows timed, configs: ("b", MT, ST, XS, AS) of gemv_q4, ("g", MT, WR, ST, ZS, MB)
# of gemm_q4 (kernels/gemm_q4.cuh; MB = min blocks per SM of its launch bounds) or ("w", WG, MW,
# XS, ZS, MB[, XT]) of wgmma_q4 (kernels/wgmma_q4.cuh; XT = 1 is given x in tile order, made on
# the host by weights.tile_activations); the first is the bitwise reference of its NT.
SWEEP = {
    2: (16, [("b", 2, 2, 0, 0), ("b", 1, 2, 0, 0), ("w", 1, 1, 2, 1, 4, 1), ("w", 1, 1, 2, 1, 6, 1),
             ("w", 1, 1, 3, 1, 4, 1), ("w", 1, 1, 4, 1, 4, 1, 1), ("w", 1, 1, 3, 1, 3, 1, 1),
             ("w", 1, 1, 2, 8, 4, 1)]),
    4: (32, [("b", 2, 2, 0, 0), ("w", 1, 1, 4, 1, 2, 1, 1), ("w", 1, 1, 2, 1, 3, 1),
             ("w", 1, 1, 2, 1, 4, 1), ("w", 1, 1, 3, 1, 3, 1), ("w", 1, 1, 2, 8, 3, 1)]),
    8: (64, [("w", 4, 1, 3, 8, 1, 1), ("w", 1, 1, 2, 8, 3, 1), ("w", 1, 1, 3, 8, 3, 1),
             ("w", 2, 1, 2, 8, 2, 1), ("w", 1, 1, 2, 4, 3, 1)]),
}
# Earlier sweeps (in dd8da46:bench/: 2026-12-02-h200-v3-gemm-sweep*.txt, -gemv-sweep.txt, wgmma_q4's
# -v4-wgmma-sweep-*.txt) covered NT = 1, 2, 4 (at 64 rows) and 8 with the configs listed there;
# version 6 swept 1 and 16 rows (activations staged with the weights, -v6-gemv-sweep-xs.txt).
# Version 7 swept wgmma_q4 with XT = 1 (the activations in tile order) at 8 to 64 rows
# (-v7-gemv-sweep-xt.txt), XT with PP (-v7-gemv-sweep-xt-pp.txt; -v7-gemv-sweep-pp.txt is PP
# alone, in code since changed) and, last, MW = 2 with XT at 64 rows: the table above
# (-v7-gemv-sweep-mw2.txt). Version 8: three and four blocks per SM (MB) at 64 rows with fewer
# ring stages (-v8-gemv-sweep-mb.txt: XS = 2, MB = 3 took gate_up and the lm_head), then the same
# at 16 and 32 rows and split-K at 64 (the table above, -v8-gemv-sweep-mb2.txt). The experiments
# of versions 5 and 6 (an L2 prefetch in gemv_q4, the warp-specialized wgmma_ws_q4,
# gemv_q4_persistent: commits 600c8c8, 3a78b55 and 4fd8ff4; docs/PERFORMANCE.md) added configs of
# code that is gone. Version 9: ablations, the wgmma_q4 and gemv_q4 schedules timed with parts of
# their work left out (-v9-gemv-ablate.txt; wrong results by design: their AB template parameter
# and this script's GEMV_SWEEP=ablate are in dd8da46, removed since; until then a "b" config had
# AB as its 6th field, before ZS and MB) and CL, CTAs of a cluster sharing each activation tile
# by multicast (commit ea5e035; bitwise right and 2-4x slower, -v9-gemv-cluster*.txt; removed).


def family(cfg) -> str:
    """The arithmetic of a config: "cv" (gemv_cv) or "q4" (gemv_q4's, shared by gemm_q4 and the
    wgmma kernels); configs of one family and NT must agree bit for bit."""
    return "cv" if cfg[0] == "c" and not cvcfg(cfg)[8] else "q4"


def tile_order(cfg) -> bool:
    """The config reads x in wgmma_q4's activation tile order (XT)."""
    return cfg[0] == "s" or (cfg[0] == "w" and bool(wcfg(cfg)[6]))


# GEMV_SWEEP=ring: the one-wave shapes (down, out) on the cp.async ring at 1 and 16 rows against
# the program's schedules (version 11).
RING = {
    1: (1, [("b", 1, 2, 1, 0), ("b", 1, 3, 0, 1), ("b", 1, 4, 0, 1), ("b", 1, 6, 0, 1),
            ("b", 1, 8, 0, 1)]),
    2: (16, [("b", 1, 2, 0, 0), ("b", 1, 3, 0, 1), ("b", 1, 4, 0, 1), ("b", 1, 6, 0, 1),
             ("b", 1, 8, 0, 1)]),
}
# GEMV_SWEEP=zs: gemv_q4's KS parts of a row block spread over a cluster of ZS blocks (version 12),
# against the program's schedules, at 1 and 16 rows.
ZSWEEP = {
    1: (1, [("b", 1, 2, 1, 0), ("b", 1, 2, 0, 0), ("b", 1, 2, 1, 0, 2), ("b", 1, 2, 1, 0, 4),
            ("b", 1, 2, 0, 0, 2), ("b", 1, 2, 0, 0, 4), ("b", 1, 3, 1, 0, 2)]),
    2: (16, [("b", 1, 2, 0, 0), ("b", 2, 2, 0, 0), ("b", 1, 2, 0, 0, 2), ("b", 1, 2, 0, 0, 4),
             ("b", 2, 2, 0, 0, 2), ("b", 2, 2, 0, 0, 4), ("b", 1, 3, 0, 0, 2)]),
}
# GEMV_SWEEP=zs32 / zs64: the same at 32-row tiles (the out projection of B = 32 and 64 runs on
# gemv_q4 with MT = 2: 160 row blocks of 179 registers, one per SM), over 32 or 64 rows.
# GEMV_SWEEP=g16 (version 13): the multi-wave weights at 16 rows (gate_up: 1088 blocks of 115
# registers on 264 slots) on deeper cp.async rings, four m-tiles per warp, and a register cap
# of three or four blocks per SM (MB, the 7th field of a "b" config; spills shown in the table).
G16 = {
    2: (16, [("b", 2, 2, 0, 0), ("b", 2, 2, 0, 0, 1, 3), ("b", 2, 3, 0, 1), ("b", 2, 4, 0, 1),
             ("b", 2, 6, 0, 1), ("b", 2, 3, 0, 1, 1, 3), ("b", 2, 4, 0, 1, 1, 3),
             ("b", 4, 2, 0, 1), ("b", 4, 3, 0, 1), ("b", 1, 2, 0, 0), ("b", 1, 4, 0, 1, 1, 4)]),
}
# GEMV_SWEEP=g64 (version 13): gate_up, out and down at 64 rows, the activation tile shared by
# more rows per block (WG = 2 or 4 warpgroups, or MW = 2) against the program's one-warpgroup
# blocks, and the split-K launches' ring depth and split (down: 640 blocks at ZS 8 on 396
# slots, 1.6 waves).
G64 = {
    8: (64, [("w", 1, 1, 2, 1, 3, 1), ("w", 2, 1, 2, 1, 2, 1), ("w", 2, 1, 3, 1, 2, 1),
             ("w", 2, 1, 2, 1, 1, 1), ("w", 4, 1, 2, 1, 1, 1), ("w", 4, 1, 3, 1, 1, 1),
             ("w", 1, 2, 2, 1, 2, 1), ("w", 1, 2, 3, 1, 1, 1), ("w", 1, 1, 3, 1, 3, 1),
             ("w", 1, 1, 2, 4, 3, 1), ("w", 1, 1, 3, 4, 3, 1), ("w", 1, 1, 4, 4, 2, 1),
             ("w", 2, 1, 2, 4, 2, 1), ("w", 1, 1, 2, 2, 3, 1), ("w", 1, 1, 3, 8, 3, 1),
             ("w", 1, 1, 2, 8, 3, 1), ("w", 1, 1, 4, 8, 2, 1)]),
}
# GEMV_SWEEP=g1 (version 15): the multi-wave weights at 1 row with more blocks per SM by a
# register cap (MB, the 7th field): gate_up (1088 blocks of 70 registers on 3 per SM, 2.75 waves)
# and the in projections (1030 / 896 blocks of 63 registers on 4 per SM).
G1 = {
    1: (1, [("b", 1, 2, 0, 0), ("b", 1, 2, 0, 0, 1, 5), ("b", 1, 2, 0, 0, 1, 6),
            ("b", 1, 3, 0, 0, 1, 5), ("b", 2, 3, 0, 1), ("b", 2, 2, 0, 1),
            ("b", 2, 2, 0, 1, 1, 4), ("b", 2, 2, 0, 0, 1, 4), ("b", 2, 3, 0, 0, 1, 4),
            ("b", 1, 2, 1, 0), ("b", 1, 2, 1, 0, 1, 5)]),
}
# GEMV_SWEEP=t24 (version 16): 24 activation rows (B = 17 ... 24), a 24-row tile (NT = 3) on
# gemv_q4 and on wgmma_q4 (m64n24k16) against what those batches ran before: the 32-row tile
# (NT = 4, the program's version-15 schedules) and two 16-row tiles (NT = 2, grid.y = 2).
T24 = {
    3: (24, [("b", 1, 2, 0, 0), ("b", 2, 2, 0, 0), ("b", 1, 2, 1, 0), ("b", 1, 2, 0, 0, 2),
             ("w", 1, 1, 2, 1, 3, 1), ("w", 1, 1, 3, 1, 3, 1), ("w", 1, 1, 2, 1, 4, 1),
             ("w", 1, 1, 4, 1, 2, 1, 1), ("w", 1, 1, 3, 1, 3, 1, 1), ("w", 1, 1, 2, 8, 3, 1),
             ("w", 1, 1, 2, 4, 4, 1)]),
    4: (24, [("w", 1, 1, 3, 1, 3, 1), ("w", 1, 1, 4, 1, 2, 1, 1), ("w", 1, 1, 2, 1, 3, 1),
             ("w", 1, 1, 2, 8, 3, 1), ("w", 1, 1, 2, 1, 4, 1)]),
    2: (24, [("b", 2, 2, 0, 0), ("b", 1, 2, 0, 0)]),
}
# GEMV_SWEEP=waves (version 16): is the 64-row gate_up (544 row blocks on 396 slots at three
# blocks per SM: 1.37 waves) paying for its partial second wave? The same weight shape cut to
# 396 row blocks (one full wave), 544 (the 27B) and 792 (two full waves), unsplit and split.
WAVES = {
    8: (64, [("w", 1, 1, 2, 1, 3, 1), ("w", 1, 1, 2, 2, 3, 1), ("w", 1, 1, 2, 4, 3, 1),
             ("w", 1, 1, 2, 1, 4, 1)]),
}
WAVE_SHAPES = [("gu396", 396 * 64, 5120, 64), ("gate_up", 34816, 5120, 64),
               ("gu792", 792 * 64, 5120, 64)]
# GEMV_SWEEP=merge (version 16): the program's split-K wgmma_q4 launches (grid.z = ZS > 1, the
# last block of a row block merging the parts: gemm_q4.cuh split_merge_store), built once from
# the tree before and once after a change to the merge, on the shapes that run them.
MERGE = {
    8: (64, [("w", 1, 1, 2, 4, 3, 1), ("w", 1, 1, 3, 8, 3, 1)]),
    4: (32, [("w", 1, 1, 2, 8, 3, 1)]),
    3: (24, [("w", 1, 1, 2, 8, 3, 1), ("w", 1, 1, 2, 4, 4, 1)]),
}
# GEMV_SWEEP=sk (version 18): wgmma_sk_q4 (kernels/wgmma_sk_q4.cuh: a producer warp, CW consumer
# warpgroups sharing each activation tile, stream-K units over about one block per SM), configs
# ("s", CW, XS, G[, PP]) with G = 0 for min(SMs, units), against the program's wgmma_q4 schedules
# at 32 and 64 rows (the split ones of out and down too). The first config of each NT is the
# bitwise reference.
SKSWEEP = {
    8: (64, [("w", 1, 1, 2, 1, 3, 1), ("w", 1, 1, 4, 1, 2, 1), ("w", 1, 1, 2, 4, 3, 1),
             ("w", 1, 1, 3, 8, 3, 1), ("s", 3, 4, 0), ("s", 3, 6, 0), ("s", 2, 4, 0, 1),
             ("s", 2, 8, 0, 1)]),
    4: (32, [("w", 1, 1, 3, 1, 3, 1), ("w", 1, 1, 4, 1, 2, 1, 1), ("w", 1, 1, 2, 8, 3, 1),
             ("s", 3, 8, 0), ("s", 3, 6, 0), ("s", 4, 6, 0), ("s", 4, 4, 0)]),
}
# GEMV_SWEEP=sk16: the same at 16 and 24 rows, against gemv_q4 (16 rows, the program's) and the
# 24-row wgmma_q4 schedules of gate_up and the in projections. CW 4 with PP 1 is serialized by
# ptxas here (C7512, too few registers: marked SERIALIZED); CW 3 with PP 1 is not (version 22).
SK16 = {
    2: (16, [("b", 2, 2, 0, 0), ("b", 1, 2, 0, 0), ("s", 2, 4, 0), ("s", 2, 8, 0), ("s", 4, 4, 0),
             ("s", 4, 8, 0), ("s", 2, 6, 0, 1), ("s", 4, 6, 0, 1), ("s", 3, 6, 0), ("s", 3, 6, 0, 1),
             ("s", 3, 4, 0, 1)]),
    3: (24, [("w", 1, 1, 2, 4, 4, 1), ("w", 1, 1, 4, 1, 2, 1, 1), ("w", 1, 1, 3, 1, 3, 1),
             ("s", 3, 6, 0), ("s", 4, 6, 0), ("s", 2, 6, 0, 1), ("s", 4, 4, 0, 1), ("s", 3, 6, 0, 1)]),
    4: (32, [("w", 1, 1, 3, 1, 3, 1), ("s", 4, 6, 0), ("s", 3, 6, 0), ("s", 3, 6, 0, 1)]),
}
SK_SHAPES = [("gate_up", 34816, 5120, 64), ("gdn.in", 16480, 5120, 48), ("attn.in", 14336, 5120, 16),
             ("out", 5120, 6144, 64), ("down", 5120, 17408, 64), ("lm_head", 248320, 5120, 1)]
# GEMV_SWEEP=cv (docs/GEMV_MAINLOOP.md step 1): gemv_cv (kernels/gemv_cv.cuh), configs ("c", ST,
# WM, WALK, GB) = ring stages per consumer warp, m-tiles per block, walk (0 contiguous ranges,
# 1 grid-stride) and GB blocks per SM in the grid (0: one round of WM m-tiles per block), beside
# the gemv_q4 schedules the program runs at 1 row (btg 8: (1, 2, 0, 0), the one-wave weights'
# (1, 2, 1, 0), the lm_head's (2, 3, 0, 1)) and 16 rows ((1, 2, 0, 0), (2, 2, 0, 0), the one-wave
# weights' cluster pair (1, 2, 0, 0, 2), the lm_head's (2, 3, 0, 1)). gemv_cv's bits are its own
# (Ŵ = bf16(q · s), one chain per part): its first config is its bitwise reference, and its
# distance from gemv_q4's reference is printed.
# A sixth field XP = 0 (version 31) is version 30's consumer, which waited for each group's x; a
# config without it runs XP = 1 (the next group's x in flight), measured slower at every shape
# (bench/2026-12-07-h100-v31-cv-xp-sweep.txt in 5f7c3ac, which also has WM = 2), so the kernel's
# own default is 0. A seventh field MI (1 where left out) is m-tiles per consumer warp: MI
# independent chains interleaved, the diagnosis of that sweep (docs/GEMV_MAINLOOP.md §6.1). An
# eighth field LB (0 where left out) is the loader: 1 = two bulk copies a chunk from one lane
# (version 32) instead of 32 lanes' cp.async. A ninth, AR (0 where left out), is the arithmetic:
# 1 = gemv_q4's (version 32), so the config is of the q4 family and must give gemv_q4's bits:
# the loader-and-consumers structure timed apart from the Ŵ contract.
_CV_CONFIGS = [("c", 4, 1, 0, 0, 0), ("c", 4, 1, 0, 2, 0), ("c", 4, 1, 0, 0, 0, 2),
               ("c", 4, 1, 0, 2, 0, 2), ("c", 2, 1, 0, 0, 0, 4), ("c", 2, 1, 0, 2, 0, 4),
               ("c", 4, 1, 0, 0, 0, 1, 1), ("c", 4, 1, 0, 2, 0, 1, 1), ("c", 8, 1, 0, 2, 0, 1, 1),
               ("c", 4, 1, 0, 2, 0, 2, 1),
               ("c", 4, 1, 0, 0, 0, 1, 0, 1), ("c", 4, 1, 0, 2, 0, 1, 0, 1),
               ("c", 4, 1, 0, 2, 0, 1, 1, 1), ("c", 8, 1, 0, 2, 0, 1, 1, 1),
               ("c", 4, 1, 0, 2, 0, 2, 1, 1)]


def cvcfg(cfg):
    """("c", ST, WM, WALK, GB, XP, MI, LB, AR) of a gemv_cv config; XP (x of the next group in
    flight, version 31) and MI (m-tiles per consumer warp) are 1 where the config leaves them
    out, LB (the bulk-copy loader) and AR (gemv_q4's arithmetic; version 32) 0."""
    return tuple(cfg) + (1, 1, 0, 0)[len(cfg) - 5:]


def cv_configs(nt: int, ks: int = 8) -> list:
    """_CV_CONFIGS at NT, XP = 0 where the instance cannot hold the next group's x at K's KS
    (plan.gemv.gemv_cv_xp; every shape of the sweep has KS = 8)."""
    out = []
    for c in _CV_CONFIGS:
        n = len(c)
        c = cvcfg(c)
        c = c[:5] + (gemv_cv_xp(nt, ks, c[2], c[5]),) + c[6:]
        out.append(c[:max(n, 5 if c[5] else 6)])
    return list(dict.fromkeys(out))


CV = {
    1: (1, [("b", 1, 2, 0, 0), ("b", 1, 2, 1, 0), ("b", 2, 3, 0, 1)] + cv_configs(1)),
    2: (16, [("b", 1, 2, 0, 0), ("b", 2, 2, 0, 0), ("b", 1, 2, 0, 0, 2), ("b", 2, 3, 0, 1)]
        + cv_configs(2)),
}
_ZS32 = [("b", 2, 2, 0, 0), ("b", 2, 2, 0, 0, 2), ("b", 2, 2, 0, 0, 4), ("b", 2, 2, 0, 0, 8),
         ("b", 1, 2, 0, 0, 2), ("b", 1, 2, 0, 0, 4), ("b", 1, 2, 0, 0, 8)]
# GEMV_SWEEP=<mode>: (the configs, the shapes, or None for SHAPES) of each mode; any other
# value runs SWEEP above.
MODES = {
    "ring": (RING, None), "zs": (ZSWEEP, None),
    "zs32": ({4: (32, _ZS32)}, None), "zs64": ({4: (64, _ZS32)}, None),
    "g16": (G16, None), "g64": (G64, None), "g1": (G1, None), "t24": (T24, None),
    "merge": (MERGE, [s for s in SHAPES if s[0] in ("out", "down", "gate_up")]),
    "waves": (WAVES, WAVE_SHAPES), "sk": (SKSWEEP, SK_SHAPES),
    "sk16": (SK16, SK_SHAPES), "cv": (CV, None),
}
if os.environ.get("GEMV_SWEEP") in MODES:
    SWEEP, _shapes = MODES[os.environ["GEMV_SWEEP"]]
    SHAPES = _shapes or SHAPES
if os.environ.get("GEMV_CFG"):   # only these configs (indices into each NT's list; 0 is kept)
    _keep = {int(i) for i in os.environ["GEMV_CFG"].split(",")} | {0}
    SWEEP = {nt: (r, [c for i, c in enumerate(cs) if i in _keep]) for nt, (r, cs) in SWEEP.items()}
if os.environ.get("GEMV_SHAPES"):
    SHAPES = [s for s in SHAPES if s[0] in os.environ["GEMV_SHAPES"].split(",")]
KS_MAX = 8
# GEMV_EPI=1 (version 19): every instance with EPI_ADD (y += W x, the down and out projections'
# residual add) instead of EPI_STORE, y starting at 1.0 for the bitwise comparison; the program's
# split merges add residuals one value a round trip, which EPI_STORE never shows.
if os.environ.get("GEMV_EPI", "0") not in ("0", "1"):
    sys.exit(f"GEMV_EPI={os.environ['GEMV_EPI']!r}: use 0 (EPI_STORE) or 1 (EPI_ADD)")
EPI = int(os.environ.get("GEMV_EPI", "0"))


def ks_of(k: int) -> int:
    return min(KS_MAX, k // 128)


def wcfg(cfg):
    """("w", WG, MW, XS, ZS, MB[, XT[, PP]]) with XT (activations read in tile order) and PP (two
    register sets, one group's wgmmas in flight while the next is dequantized) default 0."""
    return tuple(cfg) + (0,) * (8 - len(cfg))


def bcfg(cfg):
    """("b", MT, ST, XS, AS[, ZS[, MB]]) with ZS (blocks of a cluster sharing a row block's KS
    parts) and MB (min blocks per SM of the launch bounds) default 1."""
    return tuple(cfg) + (1,) * (7 - len(cfg))


def scfg(cfg):
    """("s", CW, XS, G[, PP]) with PP default 0."""
    return tuple(cfg) + (0,) * (5 - len(cfg))


def bf16_dist(out, ref) -> float:
    """max |out - ref| / max |ref| over bf16 bit patterns (uint16); inf where out is not finite."""
    import numpy as np
    reff = (ref.astype(np.uint32) << 16).view(np.float32)
    outf = (out.astype(np.uint32) << 16).view(np.float32)
    if not np.isfinite(outf).all():
        return float("inf")
    return float(np.nanmax(np.abs(outf - reff)) / max(np.abs(reff).max(), 1e-30))


def cv_grid(N, cfg) -> int:
    """Blocks per batch tile of a gemv_cv launch: GB per SM, at most one per round of WM
    m-tiles (GB = 0: exactly that)."""
    wm, gb, mi = cfg[2], cfg[4], cvcfg(cfg)[6]
    tiles = -(-N // 16)
    rounds = -(-tiles // (wm * mi))
    return rounds if gb == 0 else min(rounds, gb * arch_facts("sm_90a").sms)


def sk_grid(N, K, cfg):
    """(G, TB) of a wgmma_sk_q4 launch: blocks per batch tile (the config's G, else the
    program's), tile-blocks."""
    _, cw, _, g, _ = scfg(cfg)
    G, tb = plan_sk_grid(N, K, cw, arch_facts("sm_90a"))
    return g or G, tb


def name(k, nt, cfg):
    if cfg[0] == "c":   # GB is a launch choice, not the instance's
        _, st, wm, walk, _, xp, mi, lb, ar = cvcfg(cfg)
        return (f"sw_k{k}_cv_n{nt}_s{st}_w{wm}_k{walk}" + ("" if xp else "_x0")
                + (f"_m{mi}" if mi > 1 else "") + ("_lb" if lb else "") + ("_ar" if ar else ""))
    if cfg[0] == "s":
        _, cw, xs, g, pp = scfg(cfg)
        return f"sw_k{k}_sk{cw}_n{nt}_x{xs}" + (f"_p{pp}" if pp else "")
    if cfg[0] == "w":
        _, wg, mw, xs, zs, mb, xt, pp = wcfg(cfg)
        return (f"sw_k{k}_wg{wg}_mw{mw}_n{nt}_x{xs}_z{zs}_b{mb}" + (f"_t{xt}" if xt else "")
                + (f"_p{pp}" if pp else ""))
    if cfg[0] == "g":
        _, mt, wr, st, zs, mb = cfg
        return f"sw_k{k}_g{mt}_n{nt}_w{wr}_s{st}_z{zs}_b{mb}"
    _, mt, st, xs, a, zs, mb = bcfg(cfg)
    return (f"sw_k{k}_m{mt}_n{nt}_s{st}_x{xs}_a{a}" + (f"_z{zs}" if zs > 1 else "")
            + (f"_b{mb}" if mb > 1 else ""))


def smem_of(k, nt, cfg):
    """Dynamic shared memory: the cp.async ring (GemvLaunch / GemmLaunch::dyn_smem_bytes)."""
    if cfg[0] == "c":
        return gemv_cv_launch(nt, ks_of(k), cfg[1], cfg[2], cvcfg(cfg)[6])[1]
    if cfg[0] == "s":
        _, cw, xs, _, _ = scfg(cfg)
        return sk_smem(8 * nt, cw, xs)
    if cfg[0] == "w":
        _, wg, mw, xs, zs, _, xt, _ = wcfg(cfg)
        return wgmma_smem(k, nt, wg, mw, xs, zs, xt)
    if cfg[0] == "g":
        _, mt, wr, st, zs, _ = cfg
        return gemm_smem(k, mt, nt, wr, st, zs)
    _, mt, st, _, a, zs, _ = bcfg(cfg)
    return gemv_smem(k, mt, st, a) // zs


def shape_of(N, R, nt, k, cfg):
    """(grid, block, part floats) of one launch."""
    if cfg[0] == "c":
        threads = gemv_cv_launch(nt, ks_of(k), cfg[1], cfg[2], cvcfg(cfg)[6])[0]
        return (cv_grid(N, cfg), -(-R // (8 * nt)), 1), (threads, 1, 1), 1
    if cfg[0] == "s":
        g, tb = sk_grid(N, k, cfg)
        gy = -(-R // (8 * nt))
        return (g, gy, 1), (128 * (cfg[1] + 1), 1, 1), sk_pub_floats(8 * nt, cfg[1]) * tb * gy
    if cfg[0] == "w":
        _, wg, mw, xs, zs, _, _, _ = wcfg(cfg)
        gx, gy = -(-(N // 16) // (4 * wg * mw)), -(-R // (8 * nt))
        return (gx, gy, zs), (128 * wg, 1, 1), wgmma_part_floats(k, nt, wg, mw) * gx * gy
    if cfg[0] == "g":
        _, mt, wr, st, zs, _ = cfg
        gx, gy = -(-(N // 16) // (mt * wr)), -(-R // (8 * nt))
        return (gx, gy, zs), (32 * wr, 1, 1), gemm_part_floats(k, mt, nt, wr) * gx * gy
    mt, zs = cfg[1], bcfg(cfg)[5]
    return (N // (16 * mt) * zs, -(-R // (8 * nt)), 1), (32 * ks_of(k) // zs, 1, 1), 1


def instances():
    ks = sorted({k for _, _, k, _ in SHAPES})
    seen = set()
    for nt, (_, cfgs) in SWEEP.items():
        for k in ks:
            for cfg in cfgs:
                n = name(k, nt, cfg)
                if n not in seen:
                    seen.add(n)
                    yield k, nt, cfg


def source() -> str:
    """One entry point per instance, all with the gemm signature (the part scratch and the
    arrival counters, unused by gemv_q4 and gemv_cv)."""
    out = ['#include "gemm_q4.cuh"', '#include "wgmma_q4.cuh"', '#include "wgmma_sk_q4.cuh"']
    if any(c[0] == "c" for _, cs in SWEEP.values() for c in cs):
        out.append('#include "gemv_cv.cuh"')
    for k, nt, cfg in instances():
        ks = ks_of(k)
        if cfg[0] == "c":
            _, st, wm, walk, _, xp, mi, lb, ar = cvcfg(cfg)
            threads, mb = gemv_cv_launch(nt, ks, st, wm, mi)[0], 1
            call = f"gemv_cv<{k}, {nt}, {ks}, {EPI}, {st}, {wm}, {walk}, {xp}, {mi}, {lb}, {ar}>"
        elif cfg[0] == "s":
            _, cw, xs, _, pp = scfg(cfg)
            threads, mb = 128 * (cw + 1), 1
            call = f"wgmma_sk_q4<{k}, {nt}, {ks}, {EPI}, {cw}, {xs}, {pp}>"
        elif cfg[0] == "w":
            _, wg, mw, xs, zs, mb, xt, pp = wcfg(cfg)
            threads = 128 * wg
            call = f"wgmma_q4<{k}, {nt}, {ks}, {EPI}, {wg}, {mw}, {xs}, {zs}, {xt}, {pp}>"
        elif cfg[0] == "g":
            _, mt, wr, st, zs, mb = cfg
            threads, call = 32 * wr, f"gemm_q4<{k}, {mt}, {nt}, {ks}, {EPI}, {wr}, {st}, {zs}>"
        else:
            _, mt, st, xs, a, zs, mb = bcfg(cfg)
            threads = 32 * ks // zs
            call = f"gemv_q4<{k}, {mt}, {nt}, {ks}, {EPI}, {st}, {xs}, {a}" + (
                f", 0, {zs}>" if zs > 1 else ">")
        tail = ", part, arr" if cfg[0] in "wgs" else ""
        cl = f" __cluster_dims__({bcfg(cfg)[5]}, 1, 1)" if cfg[0] == "b" and bcfg(cfg)[5] > 1 else ""
        out.append(
            f'extern "C" __global__ void __launch_bounds__({threads}, {mb}){cl} {name(k, nt, cfg)}('
            "const uint4* qw, const q38::bf16* sc, const q38::bf16* x, int ldx, q38::bf16* y, "
            f"int ldy, int N, int R, float* part, int* arr) {{ q38::{call}(qw, sc, x, ldx, y, "
            f"ldy, N, R{tail}); }}")
    return "\n".join(out) + "\n"


def build(cubin: str):
    res = compile_kernels(source(), "gemv_sweep.cu", arch="sm_90a")
    shutil.copyfile(res.cubin, cubin)
    # SPILL and SERIALIZED (ptxas's C75xx: wgmmas waited one by one) mark a config whose time is
    # not the design's: version 18's 16- and 24-row CW 4, PP 1 figures were of serialized builds.
    regs = {k.name: f"Used {k.registers} registers, {k.smem} bytes smem"
            + (f" SPILL {k.spill_stores}/{k.spill_loads} B, stack {k.stack} B"
               if k.spill_stores or k.spill_loads or k.stack else "")
            + (f" SERIALIZED {k.serialized}" if k.serialized else "") for k in res.kernels}
    Path(cubin + ".regs.json").write_text(json.dumps(regs, indent=1))
    print(f"{len(list(instances()))} instances -> {cubin}")


def run(cubin: str, reps: int = 20):
    import numpy as np
    import pycuda.autoinit  # noqa: F401
    import pycuda.driver as drv

    from qwen38gen.perf.bench import time_back_to_back
    from qwen38gen.launch import PdlModule
    from qwen38gen.runtime import allow_dynamic_smem

    mod = drv.module_from_file(cubin)
    regs = json.loads(Path(cubin + ".regs.json").read_text())
    # The same functions launched with programmatic dependent launch, as the program's graph
    # runs them: each launch may start while the previous one drains. (Instances over an SM's
    # 227 KiB of shared memory are left out; their plain launch is skipped too.)
    pdl = PdlModule(Path(cubin).read_bytes(),
                    {name(k, nt, cfg): {"smem": smem_of(k, nt, cfg)}
                     for k, nt, cfg in instances() if smem_of(k, nt, cfg) <= 227 * 1024})
    pool_bytes = 256 << 20
    results = []
    scratch = []
    s = drv.Stream()
    for sname, N, K, count in SHAPES:
        wb = N * K // 2
        sb = N * (K // 128) * 2
        ncopy = max(2, pool_bytes // wb)
        W = [drv.mem_alloc(wb) for _ in range(ncopy)]
        S = [drv.mem_alloc(sb) for _ in range(ncopy)]
        rng = np.random.default_rng(0)
        for a in W[1:]:
            drv.memset_d32(a, 0x19E37C5B, wb // 4)
        for a in S[1:]:
            drv.memset_d16(a, 0x3C00, sb // 2)   # bf16 2^-7
        # Copy 0 (the one the bitwise comparison reads) is random: every row and group differs.
        drv.memcpy_htod(W[0], rng.integers(0, 2**32, wb // 4, dtype=np.uint32))
        sh = (rng.uniform(0.5, 1.5, sb // 2).astype(np.float32) * 2**-7).view(np.uint32) >> 16
        drv.memcpy_htod(S[0], sh.astype(np.uint16))
        for nt, (R, cfgs) in SWEEP.items():
            xh = (rng.standard_normal((R, K)) * 0.5).astype(np.float32)
            xb = (xh.view(np.uint32) >> 16).astype(np.uint16)
            x = drv.to_device(xb)
            xt_dev = drv.to_device(_tile(xb, nt)) if any(
                tile_order(c) for c in cfgs) else x
            y = drv.mem_alloc(R * N * 2)
            refs = {}   # family -> the bits of its first config
            for cfg in cfgs:
                fn = mod.get_function(name(K, nt, cfg))
                sm = smem_of(K, nt, cfg)
                if sm > 227 * 1024:
                    print(f"{sname} R={R} {cfg}: {sm} bytes of shared memory, over an SM's", flush=True)
                    continue
                allow_dynamic_smem(fn, sm)
                grid, block, pf = shape_of(N, R, nt, K, cfg)
                part = drv.mem_alloc(4 * pf)
                narr = grid[1] * (sk_grid(N, K, cfg)[1] if cfg[0] == "s" else grid[0])
                arr = drv.mem_alloc(4 * narr)
                drv.memset_d32(arr, 0, narr)
                scratch.extend([part, arr])

                xin = xt_dev if tile_order(cfg) else x

                def launch(i):
                    fn(W[i % ncopy], S[i % ncopy], xin, np.int32(K), y, np.int32(N), np.int32(N),
                       np.int32(R), part, arr, grid=grid, block=block, shared=sm, stream=s)
                drv.memset_d16(y, 0x3F80 if EPI else 0x7FC0, R * N)   # residual 1.0, or NaN
                try:
                    launch(0)
                    s.synchronize()
                except drv.Error as e:
                    print(f"{sname} R={R} {cfg}: launch failed ({e}), smem {sm}", flush=True)
                    continue
                left = drv.from_device(arr, (narr,), np.int32)
                if left.any():
                    print(f"{sname} R={R} {cfg}: arrival counters not reset", flush=True)
                    continue
                out = drv.from_device(y, (R, N), np.uint16)
                fam = family(cfg)
                same = bool(np.array_equal(out, refs.setdefault(fam, out)))
                err = bf16_dist(out, refs[fam])
                err_q4 = bf16_dist(out, refs["q4"]) if fam != "q4" and "q4" in refs else None
                t = time_back_to_back(drv, s, launch, reps)
                ptr = np.uintp
                preps = [pdl.prepare(name(K, nt, cfg), grid, block, sm,
                                     [ptr(int(W[i])), ptr(int(S[i])), ptr(int(xin)), np.int32(K),
                                      ptr(int(y)), np.int32(N), np.int32(N), np.int32(R),
                                      ptr(int(part)), ptr(int(arr))]) for i in range(ncopy)]
                tp = time_back_to_back(drv, s, lambda i: pdl.launch(preps[i % ncopy], s.handle), reps)
                print(f"  {sname} R={R} {cfg}: {tp * 1e6:.1f} us under PDL, same {same}", flush=True)
                results.append({"shape": sname, "N": N, "K": K, "R": R, "nt": nt,
                                "cfg": list(cfg), "us": t * 1e6, "gbs": (wb + sb) / t / 1e9,
                                "us_pdl": tp * 1e6, "gbs_pdl": (wb + sb) / tp / 1e9,
                                "bitwise_same": same, "err": err, "count": count,
                                "family": fam, "err_q4": err_q4,
                                "regs": regs.get(name(K, nt, cfg), "")})
            x.free()
            if xt_dev is not x:
                xt_dev.free()
            y.free()
            for a in scratch:
                a.free()
            scratch.clear()
        for a in W + S:
            a.free()
    return results


PROFILE = [("gate_up", 2, ("b", 2, 2, 0, 0))]
if os.environ.get("GEMV_PROFILE"):  # "shape:NT:kind,a,b,...;..." e.g. "gate_up:8:s,3,4,0"
    PROFILE = [(sh, int(nt), (c.split(",")[0],) + tuple(int(v) for v in c.split(",")[1:]))
               for sh, nt, c in (e.split(":") for e in os.environ["GEMV_PROFILE"].split(";"))]


def profile(cubin: str):
    """One launch of each PROFILE config (shape, NT, config), for ncu."""
    import numpy as np
    import pycuda.autoinit  # noqa: F401
    import pycuda.driver as drv

    from qwen38gen.runtime import allow_dynamic_smem

    mod = drv.module_from_file(cubin)
    shapes = {s[0]: s for s in SHAPES}
    for sname, nt, cfg in PROFILE:
        _, N, K, _ = shapes[sname]
        R = SWEEP[nt][0]
        W = drv.mem_alloc(N * K // 2)
        S = drv.mem_alloc(N * (K // 128) * 2)
        drv.memset_d32(W, 0x19E37C5B, N * K // 8)
        drv.memset_d16(S, 0x3C00, N * (K // 128))
        x = drv.to_device(np.full((R, K), 0x3F80, np.uint16))
        y = drv.mem_alloc(R * N * 2)
        fn = mod.get_function(name(K, nt, cfg))
        sm = smem_of(K, nt, cfg)
        allow_dynamic_smem(fn, sm)
        grid, block, pf = shape_of(N, R, nt, K, cfg)
        narr = grid[1] * (sk_grid(N, K, cfg)[1] if cfg[0] == "s" else grid[0])
        part, arr = drv.mem_alloc(4 * pf), drv.mem_alloc(4 * narr)
        drv.memset_d32(arr, 0, narr)
        fn(W, S, x, np.int32(K), y, np.int32(N), np.int32(N), np.int32(R), part, arr,
           grid=grid, block=block, shared=sm)
        drv.Context.synchronize()
        for a in (W, S, x, y, part, arr):
            a.free()


def report(results):
    print(f"{'shape':8s} {'R':>3s} {'NT':>2s} {'config':22s} {'us':>9s} {'GB/s':>7s} "
          f"{'us PDL':>9s} {'GB/s':>7s} same  regs")
    for r in results:
        print(f"{r['shape']:8s} {r['R']:3d} {r['nt']:2d} {str(tuple(r['cfg'])):22s} "
              f"{r['us']:9.1f} {r['gbs']:7.0f} {r.get('us_pdl', 0):9.1f} {r.get('gbs_pdl', 0):7.0f} "
              f"{'yes' if r['bitwise_same'] else 'NO':4s}  "
              f"{'' if r['bitwise_same'] else 'err %.1e ' % r.get('err', 0)}"
              f"{'' if r.get('err_q4') is None else 'vs q4 %.1e ' % r['err_q4']}"
              f"{r['regs'].split('Used')[-1][:16]}{' SPILL' if 'SPILL' in r['regs'] else ''}"
              f"{' SERIALIZED' if 'SERIALIZED' in r['regs'] else ''}")
    print("\nbest per (shape, NT) and the step-weighted GEMV time:")
    best = {}
    for r in results:
        k = (r["shape"], r["nt"], r.get("family", "q4"))
        t = r.get("us_pdl", r["us"])
        if r["bitwise_same"] and (k not in best or t < best[k].get("us_pdl", best[k]["us"])):
            best[k] = r
    tot = {}
    tag = {"q4": "", "cv": " gemv_cv"}
    for (sh, nt, fam), r in sorted(best.items(), key=lambda kv: (kv[0][1], kv[0][2], kv[0][0])):
        t = r.get("us_pdl", r["us"])
        tot[nt, fam] = tot.get((nt, fam), 0.0) + t * r["count"]
        print(f"  NT={nt}{tag[fam]} {sh:8s} {str(tuple(r['cfg'])):22s} {t:8.1f} us (PDL)")
    for (nt, fam), t in tot.items():
        print(f"  NT={nt}{tag[fam]}: step GEMV sum {t / 1e3:.3f} ms")


if __name__ == "__main__":
    if sys.argv[1] == "build":
        build(sys.argv[2])
    elif sys.argv[1] == "profile":
        profile(sys.argv[2])
    else:
        res = run(sys.argv[2])
        report(res)
        if len(sys.argv) > 3:
            Path(sys.argv[3]).write_text(json.dumps(res, indent=1))

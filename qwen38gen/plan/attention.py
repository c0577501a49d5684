"""The gated-attention family: attn_prep (kernels/attention.cuh: q/k norms, RoPE, the KV cache
write) and attn_tc (attention_tc.cuh: QK and PV on the tensor cores, mma.sync m16n8k16, P rounded
to bf16 as HF rounds the softmax), split-K over the cached slots.
"""

from __future__ import annotations

from ..config import ModelConfig
from ..errors import UserError
from ..tuning import Tuning
from . import table
from .arch import ArchFacts
from .entries import BF, I32, Entry, cdiv

# Split-K (AttnTcLaunch): a row with n cached slots is cut into attn_splits(n) splits of
# attn_span(n) slots; both depend on n only (never on B or the grid), so a row's output is
# bitwise the same at every batch size. Version 10: 256 instead of 64 slots per split (a warp
# merge and a 6 KiB partial per split were a quarter of the work at 64;
# dd8da46:bench/2026-12-03-h200-v10-attn-sweep-2.txt). SP fixes the arithmetic: changing it needs
# new golden runs.
ATTN_SPLIT = 256        # slots per split while n <= ATTN_SPLIT * ATTN_MAX_SPLITS
ATTN_MAX_SPLITS = 32    # beyond that the span grows in steps of ATTN_SPLIT
# NW (warps, 16 slots each per block step) fixes a row's arithmetic like ATTN_SPLIT: one value
# at every B. scripts/attn_sweep.py on an H200 (dd8da46:bench/2026-12-03-h200-v10-attn-sweep-3.txt),
# us per layer at T = 1024, B = 1 / 16 / 64: NW 4 14.1 / 28.2 / 85.6; NW 2 with two QK chains
# 17.6 / 31.1 / 81.3. ST (ring stages), MB and the grid only reschedule it: Tuning.attn_*.
# attn_tc serves at most 8 query heads per kv head (one n-tile of Pᵀ); lanes.check_model refuses
# more before anything is emitted.
ATTN_TC_NW = 4
ATTN_PARAMS = ((BF, "qbuf"), (BF, "qkv"), ("int", "ld"), (BF, "kc"), (BF, "vc"), ("int", "tmax"),
               (I32, "pos"), (I32, "ntok"), ("float*", "part"), ("int*", "arrivals"),
               ("q38::bf16*", "o"))


def attn_prep_entry(cfg: ModelConfig, pt: int, packed: bool = False) -> Entry:
    """packed: a packed chunk's instance (rowseq, row0: docs/KERNELS.md "Packed chunks")."""
    d, rd, h, hkv = cfg.head_dim, cfg.rotary_dim, cfg.num_attention_heads, cfg.num_key_value_heads
    targs = f"{d}, {rd}, {h}, {hkv}, {pt}"
    return Entry(
        f"q38_attn_prep_pt{pt}" + ("_pk" if packed else ""), f"q38::attn_prep<{targs}>",
        ((BF, "qkv"), ("int", "ld"), (BF, "q_norm"), (BF, "k_norm"), ("float", "eps"),
         ("float", "theta"), (I32, "pos"), (I32, "ntok"), ("q38::bf16*", "qbuf"),
         ("q38::bf16*", "kc"), ("q38::bf16*", "vc"), ("int", "tmax"))
        + (((I32, "rowseq"), (I32, "row0")) if packed else ()),
        256, asserts=(f"q38::AttnPrepLaunch<{targs}>::threads == 256",
                      f"q38::AttnPrepLaunch<{targs}>::grid_y == {cdiv(h + 2 * hkv, 8)}"),
        family="attn_prep", meta=(("pt", pt),) + ((("packed", 1),) if packed else ()))


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


def attn_blocks(tuning: Tuning, arch: ArchFacts) -> int:
    """The grid target of attn_tc: Tuning.attn_grid, else the table's blocks per SM x the SMs."""
    return tuning.attn_grid or table.ATTN_BLOCKS_PER_SM * arch.sms


def attn_grid_x(blocks: int, target: int) -> int:
    """grid.x of attn_tc for B*HKV*PT (row, kv head) pairs and a target number of blocks (about
    one wave, attn_blocks): blocks loop over the splits of their row, so this only spreads the
    work (it changes no bit of the result)."""
    return max(1, min(ATTN_MAX_SPLITS, target // blocks))


def attn_tc_smem(cfg: ModelConfig, nw: int = ATTN_TC_NW, st: int = 2) -> int:
    """Dynamic shared memory of attn_tc (AttnTcLaunch::dyn_smem_bytes): the K/V ring of ST block
    steps (16·NW slots of K and V rows), the warp merge's o rows and Q."""
    d = cfg.head_dim
    g = cfg.num_attention_heads // cfg.num_key_value_heads
    return st * 16 * nw * 2 * d * 2 + nw * g * (d + 4) * 4 + 8 * (d + 8) * 2


def attn_entry(cfg: ModelConfig, pt: int, tuning: Tuning, arch: ArchFacts, tnt: int = 0,
               packed: bool = False) -> Entry:
    """attn_tc for chunks of pt rows at Tuning's ST and MB. tnt > 0: o in wgmma_q4's activation
    tile order for 8·tnt-row tiles (the out projection's XT). packed: a packed chunk's instance
    (row0: docs/KERNELS.md "Packed chunks")."""
    d, h, hkv = cfg.head_dim, cfg.num_attention_heads, cfg.num_key_value_heads
    st, mb = tuning.attn_st, tuning.attn_mb
    threads, smem = 32 * ATTN_TC_NW, attn_tc_smem(cfg, ATTN_TC_NW, st)
    if smem > arch.smem_per_block:
        raise UserError(f"tuning attn_st={st}: attn_tc then needs {smem} bytes of shared memory "
                        f"for model {cfg.name!r}, more than the {arch.smem_per_block} a block of "
                        f"{arch.name} may have; use a smaller attn_st")
    targs = f"{d}, {h}, {hkv}, {pt}, {ATTN_TC_NW}, {st}, {ATTN_SPLIT}, {mb}"
    A = f"q38::AttnTcLaunch<{targs}>"
    call = f"q38::attn_tc<{targs}" + (f", {tnt}>" if tnt else ">")
    return Entry(
        f"q38_attn_tc_pt{pt}" + (f"_t{tnt}" if tnt else "") + ("_pk" if packed else ""), call,
        ATTN_PARAMS + (((I32, "row0"),) if packed else ()), threads,
        smem=smem, min_blocks=mb,
        asserts=(f"{A}::threads == {threads}", f"{A}::split == {ATTN_SPLIT}",
                 f"{A}::max_splits == {ATTN_MAX_SPLITS}", f"{A}::dyn_smem_bytes == {smem}",
                 f"{A}::min_blocks == {mb}",
                 f"{A}::part_floats == {attn_part_floats(cfg)}"),
        family="attn_tc", meta=(("tiles", tnt), ("pt", pt)) + ((("packed", 1),) if packed else ()))

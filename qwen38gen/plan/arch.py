"""The target device's facts the planner sizes grids and checks resources by.

Both lanes' targets are the H200 (sm_90a: with warpgroup MMA; sm_90: the portable build of the same
device). A grid aimed at "one wave" is a multiple of ``sms``.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import UserError


@dataclass(frozen=True)
class ArchFacts:
    name: str
    sms: int                   # streaming multiprocessors
    smem_per_block: int        # dynamic shared memory one block may opt in to (bytes)
    smem_per_sm: int           # shared memory of an SM (bytes)
    smem_reserved_per_block: int  # of it, kept by the system for each resident block (bytes)
    regs_per_sm: int           # 32-bit registers of an SM
    reg_unit: int              # a thread's registers are given out in multiples of this (per warp:
                               # units of 32 · reg_unit)
    threads_per_sm: int        # resident threads an SM holds at most
    max_blocks_per_sm: int     # resident blocks an SM holds at most
    wgmma: bool                # warpgroup MMA (wgmma_q4, wgmma_sk_q4) available
    # Blocks of gemv_q4 (8 warps, <= 64 registers at MT = 1, NT = 1) resident per SM: a weight of
    # fewer row tiles than sms * gemv_blocks_per_sm runs in one wave.
    gemv_blocks_per_sm: int = 4

    @property
    def gemv_wave(self) -> int:
        """Row blocks of gemv_q4 that fit the GPU at once."""
        return self.gemv_blocks_per_sm * self.sms


_H200 = dict(sms=132, smem_per_block=227 * 1024, smem_per_sm=228 * 1024,
             smem_reserved_per_block=1024, regs_per_sm=65536, reg_unit=8, threads_per_sm=2048,
             max_blocks_per_sm=32)
ARCHS = {
    "sm_90a": ArchFacts(name="sm_90a", wgmma=True, **_H200),
    "sm_90": ArchFacts(name="sm_90", wgmma=False, **_H200),
}


def arch_facts(arch: str) -> ArchFacts:
    if arch not in ARCHS:
        raise UserError(f"arch {arch!r} has no device facts; known: {', '.join(ARCHS)}")
    return ARCHS[arch]

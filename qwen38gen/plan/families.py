"""The kernel families: one row each, read by everything that treats a launch by its family.

A launch's kernel carries its family in the manifest ("family"); from this table:

* ``header``: the file of kernels/ that defines the family's kernel (the plan adds it to the
  program's headers);
* ``kind``: the part of a step's time it counts in (``KINDS``: bench's and trace's split, the
  timing model's floor terms);
* ``emu``: the method of the numpy schedule emulator that executes it (``emu.schedule.Emu``'s
  ``k_<emu>``);
* ``gemv``: for an int4 GEMV, the timing model's class of it (``gemv_q4``: mma.sync streaming,
  ``wgmma``: warpgroup MMA); None for the others.

A new family is one row here (tests/test_families.py fails on a family a plan emits without one).
"""

from __future__ import annotations

from dataclasses import dataclass

KINDS = ("gemv", "delta rule", "attention", "rest")


@dataclass(frozen=True)
class Family:
    name: str
    header: str
    kind: str
    emu: str
    gemv: str | None = None


FAMILIES = {f.name: f for f in (
    Family("gemv_q4", "gemv_q4.cuh", "gemv", "gemv", gemv="gemv_q4"),
    Family("gemm_q4", "gemm_q4.cuh", "gemv", "gemv", gemv="gemv_q4"),
    Family("wgmma_q4", "wgmma_q4.cuh", "gemv", "gemv", gemv="wgmma"),
    Family("wgmma_sk_q4", "wgmma_sk_q4.cuh", "gemv", "gemv", gemv="wgmma"),
    Family("gdn", "gdn.cuh", "delta rule", "gdn"),
    Family("attn_prep", "attention.cuh", "attention", "attn"),
    Family("attn_tc", "attention_tc.cuh", "attention", "attn"),
    Family("rmsnorm", "rmsnorm.cuh", "rest", "rmsnorm"),
    Family("rmsnorm_ld", "rmsnorm.cuh", "rest", "rmsnormld"),
    Family("swiglu", "elementwise.cuh", "rest", "swiglu"),
    Family("embed", "elementwise.cuh", "rest", "embed"),
    Family("argmax", "elementwise.cuh", "rest", "argmax"),
    Family("topk", "elementwise.cuh", "rest", "topk"),
    Family("advance", "elementwise.cuh", "rest", "advance"),
    Family("gather_last", "rows.cuh", "rest", "gather"),
    Family("sample", "sampling.cuh", "rest", "sample"),
    Family("spec_accept", "speculative.cuh", "rest", "spec"),
    Family("spec_tokens", "speculative.cuh", "rest", "spec"),
    Family("spec_pos", "speculative.cuh", "rest", "spec"),
    Family("spec_put", "speculative.cuh", "rest", "spec"),
)}


def family(name: str) -> Family:
    """The row of a family; a family without one is an error, never counted as "rest"."""
    try:
        return FAMILIES[name]
    except KeyError:
        raise ValueError(f"kernel family {name!r} is not in qwen38gen/plan/families.py's table "
                         f"(known: {', '.join(FAMILIES)})") from None

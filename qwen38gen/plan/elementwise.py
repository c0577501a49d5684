"""Norms and elementwise kernels (kernels/rmsnorm.cuh, elementwise.cuh, rows.cuh): RMS1p, SwiGLU,
the embedding gather, argmax and top-k over the logits, the last row of a chunk, the position
advance. Each builder mirrors its header's Launch struct.
"""

from __future__ import annotations

from .entries import BF, I32, Entry, cdiv


def rmsnorm_entry(h: int, tnt: int = 0) -> Entry:
    """RMS1p; tnt > 0: the output in wgmma_q4's activation tile order for 8·tnt-row tiles."""
    nt = max(t for t in range(32, 1025, 32) if (h // 8) % t == 0)
    return Entry(f"q38_rmsnorm_h{h}" + (f"_t{tnt}" if tnt else ""),
                 f"q38::rmsnorm_1p<{h}, {nt}, {tnt}>",
                 ((BF, "x"), (BF, "w"), ("q38::bf16*", "y"), ("float", "eps")), nt,
                 waits=True,  # rmsnorm_1p requests w, then pdl_wait
                 asserts=(f"q38::RmsnormLaunch<{h}, {nt}>::threads == {nt}",),
                 family="rmsnorm", meta=(("tiles", tnt),))


def rmsnorm_ld_entry(h: int) -> Entry:
    """RMS1p with row strides (the mtp lane's [RMS1p(e) | RMS1p(h)] rows)."""
    nt = max(t for t in range(32, 1025, 32) if (h // 8) % t == 0)
    return Entry(f"q38_rmsnormld_h{h}", f"q38::rmsnorm_1p_ld<{h}, {nt}>",
                 ((BF, "x"), ("int", "ldx"), (BF, "w"), ("q38::bf16*", "y"), ("int", "ldy"),
                  ("float", "eps")), nt,
                 waits=True,  # rmsnorm_1p_ld requests w, then pdl_wait
                 asserts=(f"q38::RmsnormLaunch<{h}, {nt}>::threads == {nt}",),
                 family="rmsnorm_ld", meta=(("tiles", 0),))


def embed_entry(h: int) -> Entry:
    return Entry(f"q38_embed_h{h}", f"q38::embed_gather<{h}>",
                 ((BF, "E"), (I32, "tok"), ("q38::bf16*", "x")), 128,
                 asserts=(f"q38::EmbedLaunch<{h}>::threads == 128",), family="embed")


def swiglu_entry(f: int, tnt: int = 0) -> Entry:
    """SwiGLU; tnt > 0: the output in wgmma_q4's activation tile order for 8·tnt-row tiles."""
    return Entry(f"q38_swiglu_f{f}" + (f"_t{tnt}" if tnt else ""), f"q38::swiglu<{f}, {tnt}>",
                 ((BF, "gu"), ("q38::bf16*", "h"), ("int", "R")), 256,
                 asserts=(f"q38::SwigluLaunch<{f}, {tnt}>::threads == 256",
                          f"q38::SwigluLaunch<{f}, {tnt}>::grid_x == {swiglu_grid(f, 1, tnt)[0]}",
                          f"q38::SwigluLaunch<{f}, {tnt}>::rows == {16 if tnt else 1}"),
                 family="swiglu", meta=(("tiles", tnt),))


def swiglu_grid(f: int, r: int, tnt: int = 0) -> list[int]:
    """The grid of a swiglu launch over r rows (SwigluLaunch): 8 columns per thread and one row
    per block; in tile order 128 columns of 16 rows per block."""
    return [f // 128, cdiv(r, 16), 1] if tnt else [cdiv(f // 8, 256), r, 1]


def argmax_entry(v: int) -> Entry:
    return Entry(f"q38_argmax_v{v}", f"q38::argmax_rows<q38::bf16, {v}>",
                 ((BF, "logits"), ("int*", "idx"), ("float*", "val")), 1024,
                 asserts=(f"q38::ArgmaxLaunch<q38::bf16, {v}>::threads == 1024",),
                 family="argmax")


TOPK = 8  # logits kept per sequence and step for `run` and the golden files


def topk_entry(v: int) -> Entry:
    return Entry(f"q38_topk_v{v}_k{TOPK}", f"q38::topk_rows<q38::bf16, {v}, {TOPK}>",
                 ((BF, "logits"), ("float*", "val"), ("int*", "idx")), 128,
                 asserts=(f"q38::TopkLaunch<q38::bf16, {v}, {TOPK}>::threads == 128",),
                 family="topk")


def gather_last_entry(h: int, pt: int, packed: bool = False) -> Entry:
    """packed: a packed chunk's instance (row0: docs/KERNELS.md "Packed chunks")."""
    return Entry(f"q38_gather_last_h{h}_pt{pt}" + ("_pk" if packed else ""),
                 f"q38::gather_last<{h}, {pt}>",
                 ((BF, "x"), (I32, "ntok"), ("q38::bf16*", "y"))
                 + (((I32, "row0"),) if packed else ()), 128, family="gather_last",
                 meta=(("pt", pt),) + ((("packed", 1),) if packed else ()))


def advance_entry() -> Entry:
    return Entry("q38_advance_pos", "q38::advance_pos",
                 (("int*", "pos"), (I32, "ntok"), ("int", "B")), 128, family="advance")


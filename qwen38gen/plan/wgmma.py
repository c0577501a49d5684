"""The warpgroup-MMA int4 GEMV families of the sm_90a lanes: wgmma_q4 (kernels/wgmma_q4.cuh:
gemv_q4's arithmetic on wgmma, the four warps of a warpgroup owning 64 rows, the activation tile
in shared memory as the B operand) and wgmma_sk_q4 (wgmma_sk_q4.cuh: a producer warp and CW
consumer warpgroups sharing each activation tile, the (tile-block, part) units cut evenly over
about one block per SM). Both give gemv_q4's bits (tests/gpu/test_gemv_q4.py).
"""

from __future__ import annotations

from ..errors import UserError
from ..tuning import Tuning
from . import table
from .arch import ArchFacts
from .entries import Entry, cdiv
from .gemv import EPI_SWIGLU, GEMM_PARAMS, gemm_split, k_parts


def wgmma_smem(k: int, nt: int, wg: int, mw: int, xs: int, zs: int, xt: int = 0) -> int:
    """Dynamic shared memory of a wgmma_q4 instance (WgmmaLaunch::dyn_smem_bytes): the weight
    ring, the activation tiles (XT = 1: one per ring stage, else two), the part sums."""
    sums = 128 * wg * mw * nt * 4 * 4 if k_parts(k) > 1 and zs == 1 else 0
    slots = xs if xt else 2
    return xs * 4 * wg * mw * 66 * 16 + slots * 8 * nt * 256 + sums


def wgmma_part_floats(k: int, nt: int, wg: int, mw: int) -> int:
    """fp32 partials per row block of a ZS > 1 launch (WgmmaLaunch::part_floats)."""
    return k_parts(k) * 128 * wg * mw * nt * 4


def wgmma_resident(role: str, btg: int, xt: int, zs: int) -> int:
    """Blocks per SM the tile-order wgmma_q4 launch of this role was measured at beyond its MB
    (table.WGMMA_Q4_XT_RESIDENT, split launches only), or 0."""
    return table.WGMMA_Q4_XT_RESIDENT.get((btg, role), 0) if xt and zs > 1 else 0


def wgmma_launch(role: str, rows: int, k: int, btg: int, R: int, tuning: Tuning,
                 arch: ArchFacts, xt: bool = False) -> tuple[int, int, int, int, int, int, int] | None:
    """(WG, MW, XS, ZS, MB, XT, PP) of the wgmma_q4 launch of a weight over R activation rows,
    or None: the table's schedule (WGMMA_Q4_XT where xt, the caller able to give the activations
    in tile order, else WGMMA_Q4) and the split gemm_split gives its grid (or the table's, or
    Tuning.wgmma_zs's for this role). The producer of the activations must write the tile order
    exactly when the result's XT is 1."""
    wx = table.WGMMA_Q4_XT.get((btg, role)) if xt else None
    if wx is None:
        wc = table.WGMMA_Q4.get((btg, role))
        if wc is None:
            return None
    wg, mw, xs, mb, pp = wx or wc + (0,)
    zs = table.WGMMA_Q4_XT_ZS.get((btg, role), 0) if wx else 0
    knob = tuning.of("wgmma_zs", role) if wx else None
    if knob:
        if k_parts(k) % knob:
            raise UserError(f"tuning {role}.wgmma_zs={knob}: the {role} weight has {k_parts(k)} "
                            "parts of K; ZS must divide it")
        zs = knob
    if not zs or k_parts(k) % zs:
        zs = gemm_split(cdiv(cdiv(rows, 16), 4 * wg * mw) * cdiv(R, btg), k, mb, arch)
    if zs == 1 and role in table.WGMMA_SPLIT_ONLY:
        return None
    return wg, mw, xs, zs, mb, int(bool(wx)), pp


def wgmma_entry(k: int, btg: int, epi: int, wg: int, mw: int, xs: int, zs: int,
                mb: int = 1, xt: int = 0, pp: int = 0, resident: int = 0) -> Entry:
    nt = btg // 8
    smem = wgmma_smem(k, nt, wg, mw, xs, zs, xt)
    ks = k_parts(k)
    targs = f"{nt}, {ks}, {wg}, {mw}, {xs}, {zs}, {xt}, {pp}"
    return Entry(name=f"q38_gemv_k{k}_wg{wg}_mw{mw}_n{nt}_s{ks}_e{epi}_x{xs}_z{zs}_b{mb}"
                      + ("_p1" if pp else "") + ("_t1" if xt else ""),
                 call=f"q38::wgmma_q4<{k}, {nt}, {ks}, {epi}, {wg}, {mw}, {xs}, {zs}, {xt}, {pp}>",
                 params=GEMM_PARAMS, threads=128 * wg, smem=smem, waits=True, min_blocks=mb,
                 resident=resident,
                 asserts=(f"q38::WgmmaLaunch<{targs}>::dyn_smem_bytes == {smem}",),
                 family="wgmma_q4",
                 meta=(("xt", xt), ("config", {"nt": nt, "ks": ks, "wg": wg, "mw": mw, "xs": xs,
                                                "zs": zs, "mb": mb, "pp": pp})))


def sk_small_launch(role: str, btg: int, tuning: Tuning) -> tuple[int, int, int] | None:
    """Tuning.sk16's (CW, XS, PP) for this role at 16-row tiles, sk8's at 8-row tiles, or None
    (other tiles, roles they do not name, or wgmma_sk off). 16-row tiles on wgmma_sk_q4 (version
    22): their inputs in tile order (the norm writes it) instead of gemv_q4; gate_up then stores
    gu and the swiglu kernel runs. 8-row tiles: a producer warp streaming each block's weights
    ahead of its consumers, the design version 15's stand-in found 0.6 ms in at B = 1."""
    field = {16: "sk16", 8: "sk8"}.get(btg)
    if field is None or tuning.wgmma_sk == "off":
        return None
    return tuning.of(field, role)


def sk_launch(role: str, btg: int, tuning: Tuning) -> tuple[int, int, int] | None:
    """(CW, XS, PP) of wgmma_sk_q4 for this role at batch tile btg, or None. Its input must be
    in tile order: the caller asks only where wgmma_launch(..., xt=True) says XT = 1, as it does
    for every role the table serves (or, at 16 and 8 rows, where Tuning.sk16 / sk8 names it)."""
    small = sk_small_launch(role, btg, tuning)
    if small:
        return small
    if tuning.wgmma_sk == "all":
        return tuning.of("sk_cfg", role) or table.WGMMA_SK_ALL
    if tuning.wgmma_sk == "off":
        return None
    t = table.WGMMA_SK_Q4.get((btg, role))
    return (tuning.of("sk_cfg", role) or t) if t else None


def sk_grid(rows: int, k: int, cw: int, arch: ArchFacts) -> tuple[int, int]:
    """(G, TB): blocks per batch tile (at most one per SM) and tile-blocks (CW·64 rows) of a
    wgmma_sk_q4 launch; its scratch is TB · pub floats and TB arrival flags per batch tile."""
    tb = cdiv(cdiv(rows, 16), 4 * cw)
    return min(arch.sms, tb * k_parts(k)), tb


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
    ks = k_parts(k)
    nt = btg // 8
    smem = sk_smem(btg, cw, xs, epi)
    targs = f"{nt}, {ks}, {cw}, {xs}"
    sw = f" + q38::WgmmaSkLaunch<{targs}>::swiglu_bytes" if epi == EPI_SWIGLU else ""
    return Entry(name=f"q38_gemv_k{k}_sk{cw}_n{nt}_s{ks}_e{epi}_x{xs}" + ("_p1" if pp else "") + "_t1",
                 call=f"q38::wgmma_sk_q4<{k}, {nt}, {ks}, {epi}, {cw}, {xs}, {pp}>",
                 params=GEMM_PARAMS, threads=128 * (cw + 1), smem=smem, waits=True, min_blocks=1,
                 asserts=(f"q38::WgmmaSkLaunch<{targs}>::dyn_smem_bytes{sw} == {smem}",
                          f"q38::WgmmaSkLaunch<{targs}>::threads == {128 * (cw + 1)}",
                          f"q38::WgmmaSkLaunch<{targs}>::pub_floats == {sk_pub_floats(btg, cw)}"),
                 family="wgmma_sk_q4",
                 meta=(("xt", 1), ("config", {"nt": nt, "ks": ks, "cw": cw, "xs": xs, "pp": pp})))

"""kernels/gdn.cuh against ref_ops.gdn_chunk (fp64, docs/MODEL.md §4.2 / §5), decode and prefill chunks.

Every case draws fresh inputs (seeded per case): random conv ring and recurrent state, random
positions (so ring slots wrap, and 0/1/2 so the window reaches before the sequence start),
uneven ntok in prefill with NaN in the padding rows of mz and ba (a kernel that reads them, or
lets them touch state or ring, shows NaN), NaN in the unused columns of mz and ba, and a
NaN-poisoned output. Checked: out, the new conv ring (exactly), the new state.

Run on the GPU machine: python3 -m pytest -s tests/gpu/test_gdn_kernels.py
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass

import numpy as np
import pytest

from qwen38gen.runtime import allow_dynamic_smem
from qwen38gen.weights import xtile_index
from tests.gpu import ref_ops
from tests.gpu.harness import BF16, build, poisoned, rel_err, to_gpu

pytestmark = pytest.mark.gpu

# Named tolerances (relative Frobenius error, harness.rel_err), each with its reason.
TOL = {
    # The reference rounds to bf16 at the same points as the kernel (conv sum, SiLU, delta-rule
    # output, normalised o, output), so only fp32-vs-fp64 sums remain; they flip a rare rounding
    # by one bf16 ulp. Seen ≤ 8e-5; 1e-3 stays below what one bf16 rounding of every element
    # gives (≈ 1.7e-3 RMS, bound 2^-8), so a missing or extra rounding point fails.
    "out_hf": 1e-3,
    # Against pure fp64: up to five bf16 roundings on the way (each ≈ 1.7e-3 RMS relative, bound
    # 2^-8 ≈ 3.9e-3); seen 3e-3 … 5.5e-3, so 1.5e-2.
    "out_fp64": 1.5e-2,
    # State is fp32 in both; with the same bf16 q/k/v only fp32 sums and e^g (~1e-7 relative,
    # seen ≤ 6e-7) and rare one-ulp flips of a conv output (each ~1e-5 of the state) differ.
    "state_hf": 1e-5,
    # Against pure fp64 the state sees the bf16 rounding of k and v in every token's update;
    # after a 64-token chunk the state is mostly such updates (seen 4e-3 there), so 1e-2.
    "state_fp64": 1e-2,
}

K = 4
EPS = 1e-6


@dataclass(frozen=True)
class Geom:
    name: str
    hk: int
    hv: int
    dk: int
    dv: int

    @property
    def C(self) -> int:
        return 2 * self.hk * self.dk + self.hv * self.dv

    @property
    def Cv(self) -> int:
        return self.hv * self.dv


GEOMS = {
    "tiny": Geom("tiny", 2, 6, 128, 128),
    "27b": Geom("27b", 16, 48, 128, 128),
    "toy": Geom("toy", 2, 6, 16, 24),       # dk ≠ dv, DV/NS not a multiple of 16 (idle lanes)
}


def launch_py(g: Geom, pt: int, ns: int) -> dict:
    """Python mirror of q38::GdnLaunch (checked against the module's constants)."""
    cols = g.dv // ns
    threads = -(-(8 * cols // 4) // 32) * 32          # 8 row groups × float4 column groups
    groups = (2 * g.dk + cols) // 8
    smem = 16 * (K - 1) * groups + 16 * (2 * K - 1) * groups + 4 * (pt * (2 * g.dk + 3 * cols + 6) + 33 * cols)
    return {"threads": threads, "cluster": ns, "smem": smem,
            "blocks_per_seq": g.hv * ns, "min_blocks": max(1, 512 // threads)}


PARAMS = ("const q38::bf16* mz, int ld_mz, const q38::bf16* ba, int ld_ba, int ba_off, "
          "const q38::bf16* conv_w, const float* A_log, const q38::bf16* dt_bias, "
          "const float* norm_w, float eps, q38::bf16* ring, int* ring_arrivals, float* state, "
          "const int* pos, const int* ntok, q38::bf16* out")
ARGS = ("mz, ld_mz, ba, ld_ba, ba_off, conv_w, A_log, dt_bias, norm_w, eps, ring, ring_arrivals, "
        "state, pos, ntok, out")

# (geometry, PT, NS) instantiated in the test module
VARIANTS = [("tiny", 1, 2), ("tiny", 1, 1), ("tiny", 1, 4), ("27b", 1, 2), ("27b", 1, 1),
            ("27b", 1, 4), ("toy", 1, 1), ("tiny", 4, 2), ("tiny", 16, 2), ("tiny", 64, 2),
            ("27b", 4, 2), ("27b", 16, 2), ("27b", 16, 1), ("27b", 16, 4), ("toy", 4, 1),
            ("27b", 4, 1)]


def entry_name(geom: str, pt: int, ns: int) -> str:
    return f"q38_gdn_{geom}_pt{pt}_ns{ns}"


def entry_src(geom: str, pt: int, ns: int) -> str:
    g = GEOMS[geom]
    t = f"{g.dk}, {g.dv}, {g.hk}, {g.hv}, {K}, {pt}, {ns}"
    L = f"q38::GdnLaunch<{t}>"
    n = entry_name(geom, pt, ns)
    return (f"__constant__ int {n}_launch[5] = {{{L}::threads, {L}::cluster, {L}::smem_bytes, "
            f"{L}::blocks_per_seq, {L}::min_blocks}};\n"
            f'extern "C" __global__ void __launch_bounds__({L}::threads, {L}::min_blocks) '
            f"__cluster_dims__({L}::cluster, 1, 1)\n"
            f"{n}({PARAMS}) {{ q38::gdn_chunk<{t}>({ARGS}); }}\n")


@pytest.fixture(scope="module")
def mod(cuda_ctx):
    src = '#include "gdn.cuh"\n' + "".join(entry_src(*v) for v in VARIANTS)
    return build(src)


def kernel(mod, geom: str, pt: int, ns: int):
    """The entry point and its launch shape, read from the module and checked against Python."""
    import pycuda.driver as drv

    n = entry_name(geom, pt, ns)
    ptr, _ = mod.get_global(f"{n}_launch")
    c = np.zeros(5, dtype=np.int32)
    drv.memcpy_dtoh(c, ptr)
    got = dict(zip(("threads", "cluster", "smem", "blocks_per_seq", "min_blocks"), map(int, c)))
    assert got == launch_py(GEOMS[geom], pt, ns)
    fn = mod.get_function(n)
    allow_dynamic_smem(fn, got["smem"])
    return fn, got


def make_inputs(g: Geom, B: int, pt: int, seed: int, ntok=None, pos=None):
    """Random layer weights, activations and per-sequence state for one launch."""
    rng = np.random.default_rng(seed)
    BF = ref_ops.bf16_round
    R, C, Cv = B * pt, g.C, g.Cv
    ba_off = -(-g.hv // 16) * 16                       # b part padded to 16 rows
    ld_mz, ld_ba = C + Cv + 8, 2 * ba_off              # ld_mz > width: the stride is honoured
    if pos is None:                                    # 0, 2 and 1: windows reaching before 0
        pos = rng.integers(3, 3000, size=B)
        if B >= 3:
            pos[:2] = [0, 2]
        if B >= 4:
            pos[3] = 1
    if ntok is None:
        if pt == 1:
            ntok = np.ones(B, dtype=np.int64)
        else:
            ntok = rng.integers(1, pt + 1, size=B)
            if B >= 3:
                ntok[:2] = [pt, 1]
            else:
                ntok[0] = max(1, pt - 1)
    mz = np.full((R, ld_mz), np.nan)
    ba = np.full((R, ld_ba), np.nan)
    for b in range(B):
        rows = slice(b * pt, b * pt + int(ntok[b]))   # real rows; padding rows stay NaN
        n = int(ntok[b])
        mz[rows, :C + Cv] = BF(rng.normal(0.0, 1.0, size=(n, C + Cv)))
        ba[rows, :g.hv] = BF(rng.normal(0.0, 1.5, size=(n, g.hv)))
        a = rng.normal(0.0, 1.5, size=(n, g.hv))
        a[rng.random(size=a.shape) < 0.02] = 25.0     # softplus past its threshold
        ba[rows, ba_off:ba_off + g.hv] = BF(a)
    return dict(
        mz=mz, ba=ba, ba_off=ba_off, ld_mz=ld_mz, ld_ba=ld_ba,
        conv_w=BF(rng.normal(0.0, 0.5, size=(C, K))),
        A_log=rng.uniform(-1.0, 1.0, size=g.hv).astype(np.float32).astype(np.float64),
        dt_bias=BF(rng.normal(0.0, 0.5, size=g.hv)),
        norm_w=rng.uniform(0.5, 1.5, size=g.dv).astype(np.float32).astype(np.float64),
        ring=BF(rng.normal(0.0, 1.0, size=(B, K - 1, C))),
        state=rng.normal(0.0, 0.5, size=(B, g.hv, g.dk, g.dv)).astype(np.float32).astype(np.float64),
        pos=np.asarray(pos, dtype=np.int64), ntok=np.asarray(ntok, dtype=np.int64))


def run_gpu(mod, geom: str, pt: int, ns: int, inp: dict, kern=None, tnt: int = 0):
    """One launch (of `kern` = (function, launch shape) when given); returns out, ring, state
    (host fp64). tnt > 0: the kernel writes out in wgmma_q4's tile order for 8·tnt-row tiles;
    it is read back into rows."""
    g = GEOMS[geom]
    B = len(inp["pos"])
    fn, L = kern or kernel(mod, geom, pt, ns)
    d_mz = to_gpu(inp["mz"].astype(BF16))
    d_ba = to_gpu(inp["ba"].astype(BF16))
    d_w = to_gpu(inp["conv_w"].astype(BF16))
    d_A = to_gpu(inp["A_log"].astype(np.float32))
    d_dt = to_gpu(inp["dt_bias"].astype(BF16))
    d_nw = to_gpu(inp["norm_w"].astype(np.float32))
    d_ring = to_gpu(inp["ring"].astype(BF16))
    d_arr = to_gpu(np.zeros(B * g.hk, dtype=np.int32))
    d_state = to_gpu(inp["state"].astype(np.float32))
    d_pos = to_gpu(inp["pos"].astype(np.int32))
    d_ntok = to_gpu(inp["ntok"].astype(np.int32))
    rows = -(-B * pt // (8 * tnt)) * 8 * tnt if tnt else B * pt
    d_out = poisoned((rows, g.Cv), BF16)
    fn(d_mz, np.int32(inp["ld_mz"]), d_ba, np.int32(inp["ld_ba"]), np.int32(inp["ba_off"]),
       d_w, d_A, d_dt, d_nw, np.float32(EPS), d_ring, d_arr, d_state, d_pos, d_ntok, d_out,
       block=(L["threads"], 1, 1), grid=(B * L["blocks_per_seq"], 1, 1), shared=L["smem"])
    assert not d_arr.get().any(), "ring_arrivals not left at 0"
    f = np.float64
    out = d_out.get()
    if tnt:
        out = out.reshape(-1)[xtile_index(B * pt, g.Cv, tnt)]
    return out.astype(f), d_ring.get().astype(f), d_state.get().astype(f)


def reference(geom: str, pt: int, inp: dict, hf_rounding: bool):
    g = GEOMS[geom]
    return ref_ops.gdn_chunk(
        inp["mz"], inp["ba"], inp["ba_off"], inp["conv_w"], inp["A_log"], inp["dt_bias"],
        inp["norm_w"], EPS, inp["ring"], inp["state"], inp["pos"], inp["ntok"],
        hk=g.hk, hv=g.hv, dk=g.dk, dv=g.dv, pt=pt, hf_rounding=hf_rounding)


def check(label: str, geom: str, pt: int, inp: dict, got) -> None:
    out, ring, state = got
    B = len(inp["pos"])
    assert np.all(np.isfinite(out)), f"{label}: non-finite output (poison or NaN padding read)"
    assert np.all(np.isfinite(state)), f"{label}: non-finite state (padding row reached it)"
    for b in range(B):
        pad = out[b * pt + int(inp["ntok"][b]):(b + 1) * pt]
        assert np.all(pad == 0.0), f"{label}: padding rows of sequence {b} not written as 0"
    o_hf, ring_ref, s_hf = reference(geom, pt, inp, hf_rounding=True)
    o_64, _, s_64 = reference(geom, pt, inp, hf_rounding=False)
    bad = np.argwhere(ring != ring_ref)
    assert bad.size == 0, f"{label}: conv ring differs at [b, slot, ch] = {bad[:5].tolist()}"
    e = {"out_hf": rel_err(out, o_hf), "out_fp64": rel_err(out, o_64),
         "state_hf": rel_err(state, s_hf), "state_fp64": rel_err(state, s_64)}
    print(f"\n[gdn] {label}: out rel {e['out_hf']:.2e} (bf16-point ref) {e['out_fp64']:.2e} "
          f"(fp64 ref); state rel {e['state_hf']:.2e} / {e['state_fp64']:.2e}; ring exact")
    for k, v in e.items():
        assert v <= TOL[k], f"{label}: {k} rel err {v:.3e} > {TOL[k]:.1e}"


def check_same_bits(label: str, geom: str, pt: int, inp: dict, got, plain, what: str) -> None:
    """A scheduling variant: out, ring and state bit for bit the plain instance's (`what` names
    it), and within the reference's tolerances."""
    for name, a, b in zip(("out", "ring", "state"), got, plain):
        assert np.array_equal(a.view(np.uint64), b.view(np.uint64)), f"{label}: {name} differs from {what}"
    check(label, geom, pt, inp, got)


def seed_of(*key) -> int:
    return zlib.crc32(repr(key).encode())


DECODE = [("tiny", B, 2) for B in (1, 2, 3, 17)] + [("27b", B, 2) for B in (1, 2, 3, 17)] + [
    (g, B, ns) for g in ("tiny", "27b") for B in (1, 3, 17) for ns in (1, 4)] + [("toy", 3, 1)]


@pytest.mark.parametrize("geom,B,ns", DECODE, ids=[f"{g}-B{b}-ns{n}" for g, b, n in DECODE])
def test_gdn_decode(mod, geom, B, ns):
    inp = make_inputs(GEOMS[geom], B, 1, seed_of("decode", geom, B, ns))
    check(f"decode {geom} B={B} NS={ns}", geom, 1, inp, run_gpu(mod, geom, 1, ns, inp))


PREFILL = [(g, B, pt, 2) for g in ("tiny", "27b") for B in (1, 3) for pt in (4, 16)] + [
    ("tiny", 2, 64, 2), ("27b", 3, 16, 1), ("27b", 3, 16, 4), ("toy", 3, 4, 1)]


@pytest.mark.parametrize("geom,B,pt,ns", PREFILL,
                         ids=[f"{g}-B{b}-PT{p}-ns{n}" for g, b, p, n in PREFILL])
def test_gdn_prefill(mod, geom, B, pt, ns):
    inp = make_inputs(GEOMS[geom], B, pt, seed_of("prefill", geom, B, pt, ns))
    check(f"prefill {geom} B={B} PT={pt} NS={ns} ntok={inp['ntok'].tolist()}", geom, pt, inp,
          run_gpu(mod, geom, pt, ns, inp))


def test_gdn_prefill_then_decode(mod):
    """A PT=16 chunk, then 5 decode steps, state and ring carried on the device's output each time
    (positions advanced by ntok, as the step's last kernel does), against the same chain in fp64."""
    geom, B = "tiny", 3
    g = GEOMS[geom]
    inp = make_inputs(g, B, 16, seed_of("chain", 0), ntok=[16, 2, 7], pos=[0, 1, 40])
    got = run_gpu(mod, geom, 16, 2, inp)
    check("chain: prefill tiny B=3 PT=16", geom, 16, inp, got)
    pos = inp["pos"] + inp["ntok"]
    for step in range(5):
        nxt = make_inputs(g, B, 1, seed_of("chain", step + 1), ntok=[1, 1, 1], pos=pos)
        # weights stay those of the layer; state and ring are what the device produced
        for k in ("conv_w", "A_log", "dt_bias", "norm_w"):
            nxt[k] = inp[k]
        nxt["ring"], nxt["state"] = got[1], got[2]
        got = run_gpu(mod, geom, 1, 2, nxt)
        check(f"chain: decode step {step + 1} pos={pos.tolist()}", geom, 1, nxt, got)
        pos = pos + 1


# TNT (version 13): out in wgmma_q4's activation tile order for 8·TNT-row tiles, which the out
# projection reads with XT = 1 at batch tiles of 32 and 64 rows. Only where the values go
# changes: out (read back into rows), ring and state bitwise as the row-order instance's.
TNT_VARIANTS = [("27b", 1, 4), ("27b", 1, 8), ("tiny", 1, 8), ("27b", 4, 8), ("27b", 1, 3)]


def tnt_entry_name(geom: str, pt: int, tnt: int) -> str:
    return f"q38_gdn_{geom}_pt{pt}_t{tnt}"


def variant_entry(name: str, geom: str, pt: int, tail: str) -> str:
    """An NS = 1 entry point of gdn_chunk<..., RS = K-1, EACH 0, SLOTS 1, `tail`>."""
    g = GEOMS[geom]
    t = f"{g.dk}, {g.dv}, {g.hk}, {g.hv}, {K}, {pt}, 1, {K - 1}"
    L = f"q38::GdnLaunch<{t}>"
    return (f'extern "C" __global__ void __launch_bounds__({L}::threads, {L}::min_blocks)\n'
            f"{name}({PARAMS}) {{ q38::gdn_chunk<{t}, 0, 1, {tail}>({ARGS}); }}\n")


@pytest.fixture(scope="module")
def mod_tnt(cuda_ctx):
    return build("\n".join(['#include "gdn.cuh"'] + [
        variant_entry(tnt_entry_name(geom, pt, tnt), geom, pt, f"{tnt}")
        for geom, pt, tnt in TNT_VARIANTS]))


@pytest.mark.parametrize("geom,pt,tnt", TNT_VARIANTS)
@pytest.mark.parametrize("B", [1, 3, 17])
def test_gdn_out_in_tile_order(mod, mod_tnt, geom, pt, tnt, B):
    g = GEOMS[geom]
    base = launch_py(g, pt, 1)
    fn = mod_tnt.get_function(tnt_entry_name(geom, pt, tnt))
    allow_dynamic_smem(fn, base["smem"])
    inp = make_inputs(g, B, pt, seed_of("tnt", geom, B, pt, tnt))
    plain = run_gpu(mod, geom, pt, 1, inp)
    got = run_gpu(mod_tnt, geom, pt, 1, inp, kern=(fn, base), tnt=tnt)
    check_same_bits(f"TNT={tnt} {geom} B={B} PT={pt}", geom, pt, inp, got, plain,
                    "the row-order instance")


# GE (plan.gdn.gdn_state_rows_early, version 17): the conv's copies are requested first, then GE of a
# thread's 16 state rows, the rest after the conv. Only when the loads are issued changes, so
# out, ring and state are the bits of the instance that requests every row first (the NS = 1
# instances of VARIANTS), with out in rows and, as the program's 24- to 64-row lanes use it, in
# tile order.
# GW: the first GW blocks request every row early (the program's first wave).
GE_VARIANTS = [("27b", 0, 0, 0), ("27b", 4, 0, 0), ("27b", 16, 0, 0), ("tiny", 4, 0, 0),
               ("27b", 4, 8, 264), ("tiny", 16, 3, 0), ("tiny", 4, 0, 50), ("27b", 4, 0, 100)]


def ge_entry_name(geom: str, ge: int, tnt: int, gw: int) -> str:
    return f"q38_gdn_{geom}_ge{ge}_t{tnt}_w{gw}"


@pytest.fixture(scope="module")
def mod_ge(cuda_ctx):
    return build("\n".join(['#include "gdn.cuh"'] + [
        variant_entry(ge_entry_name(geom, ge, tnt, gw), geom, 1, f"{tnt}, {ge}, {gw}")
        for geom, ge, tnt, gw in GE_VARIANTS]))


@pytest.mark.parametrize("geom,ge,tnt,gw", GE_VARIANTS)
@pytest.mark.parametrize("B", [1, 3, 17])
def test_gdn_state_rows_after_the_conv(mod, mod_ge, geom, ge, tnt, gw, B):
    g = GEOMS[geom]
    base = launch_py(g, 1, 1)
    fn = mod_ge.get_function(ge_entry_name(geom, ge, tnt, gw))
    allow_dynamic_smem(fn, base["smem"])
    inp = make_inputs(g, B, 1, seed_of("ge", geom, B, ge, tnt, gw))
    plain = run_gpu(mod, geom, 1, 1, inp)
    got = run_gpu(mod_ge, geom, 1, 1, inp, kern=(fn, base), tnt=tnt)
    check_same_bits(f"GE={ge} GW={gw} TNT={tnt} {geom} B={B}", geom, 1, inp, got, plain,
                    "every row first")

"""The mtp lane's kernels on the GPU against numpy: gdn_chunk with a ring of RS slots and state
slots (EACH = 0: read and write slot[b]; EACH = 1: the state after token t into slot t), and the
bookkeeping kernels of kernels/speculative.cuh (accept with planted cases, MTP token rows, draft
positions, draft rows).

Run on the GPU machine: python3 -m pytest -s tests/gpu/test_speculative.py
"""

from __future__ import annotations

import numpy as np
import pytest

from qwen38gen.runtime import allow_dynamic_smem
from tests.gpu import ref_ops
from tests.gpu.harness import BF16, build, poisoned, rel_err, to_gpu
from tests.gpu.test_gdn_kernels import ARGS, EPS, GEOMS, K, PARAMS, TOL, make_inputs, seed_of

pytestmark = pytest.mark.gpu

# (geometry, PT, NS, RS, EACH, SLOTS): the verify pass (PT = K+1 = SLOTS, RS = 3 + drafts), a
# prefill chunk and a decode step of an mtp program (EACH = 0, slot[b] read and written)
GDN = [("tiny", 2, 1, 4, 1, 2), ("tiny", 3, 1, 5, 1, 3), ("tiny", 5, 2, 7, 1, 5),
       ("27b", 2, 1, 4, 1, 2), ("27b", 3, 1, 5, 1, 3),
       ("tiny", 16, 1, 5, 0, 3), ("tiny", 1, 1, 5, 0, 3), ("27b", 16, 1, 4, 0, 2)]


def gname(v) -> str:
    g, pt, ns, rs, each, slots = v
    return f"q38_gdn_{g}_pt{pt}_ns{ns}_rs{rs}_e{each}_s{slots}"


def gdn_src(v) -> str:
    g, pt, ns, rs, each, slots = v
    G = GEOMS[g]
    lt = f"{G.dk}, {G.dv}, {G.hk}, {G.hv}, {K}, {pt}, {ns}, {rs}"
    L = f"q38::GdnLaunch<{lt}>"
    n = gname(v)
    return (f"__constant__ int {n}_launch[3] = {{{L}::threads, {L}::smem_bytes, {L}::blocks_per_seq}};\n"
            f'extern "C" __global__ void __launch_bounds__({L}::threads, {L}::min_blocks) '
            f"__cluster_dims__({L}::cluster, 1, 1)\n"
            f"{n}({PARAMS}, const int* slot) {{ q38::gdn_chunk<{lt}, {each}, {slots}>({ARGS}, slot); }}\n")


SPEC_SRC = """
#include "speculative.cuh"
extern "C" __global__ void __launch_bounds__(128) acc3(int* vtok, const int* a, const int* ntok,
    int* emit, int* count, int* slot, int* ntok_m, int B) {
  q38::spec_accept<3>(vtok, a, ntok, emit, count, slot, ntok_m, B); }
extern "C" __global__ void __launch_bounds__(128) acc2(int* vtok, const int* a, const int* ntok,
    int* emit, int* count, int* slot, int* ntok_m, int B) {
  q38::spec_accept<2>(vtok, a, ntok, emit, count, slot, ntok_m, B); }
extern "C" __global__ void __launch_bounds__(128) toks4(const int* mnext, const int* next, int* mtok,
    int R) { q38::spec_tokens<4>(mnext, next, mtok, R); }
extern "C" __global__ void __launch_bounds__(128) spos(const int* pos, int off, int* mpos, int* one,
    int B) { q38::spec_pos(pos, off, mpos, one, B); }
extern "C" __global__ void __launch_bounds__(128) sput(int* dst, const int* src, int j, int stride,
    int B) { q38::spec_put(dst, src, j, stride, B); }
"""


@pytest.fixture(scope="module")
def mod(cuda_ctx):
    return build('#include "gdn.cuh"\n' + "".join(gdn_src(v) for v in GDN) + SPEC_SRC)


@pytest.mark.parametrize("v", GDN, ids=[gname(v) for v in GDN])
def test_gdn_slots(mod, v):
    import pycuda.driver as drv

    geom, pt, ns, rs, each, slots = v
    g = GEOMS[geom]
    B = 3
    rng = np.random.default_rng(seed_of("slots", *v))
    # EACH = 1: the middle sequence idles in the verify pass (run --mtp: a slot mid-prompt)
    ntok = [pt, max(1, pt - 1), 1] if each == 0 else [pt, 0, pt]
    inp = make_inputs(g, B, pt, seed_of("slots-in", *v), ntok=ntok, pos=[0, 2, 1000 + rs])
    ring = ref_ops.bf16_round(rng.normal(0.0, 1.0, size=(B, rs, g.C)))
    state = rng.normal(0.0, 0.5, size=(B, slots, g.hv, g.dk, g.dv)).astype(np.float32).astype(np.float64)
    slot = rng.integers(0, slots, size=B)
    # numpy: start from slot[b]; the state after every token
    st_in = state[np.arange(B), slot]
    o_ref, ring_ref, s_ref, per = ref_ops.gdn_chunk(
        inp["mz"], inp["ba"], inp["ba_off"], inp["conv_w"], inp["A_log"], inp["dt_bias"],
        inp["norm_w"], EPS, ring, st_in, inp["pos"], inp["ntok"], hk=g.hk, hv=g.hv, dk=g.dk,
        dv=g.dv, pt=pt, hf_rounding=True, per_token=True)
    want = state.copy()
    for b in range(B):
        if each:
            want[b, :ntok[b]] = per[b, :ntok[b]]
        else:
            want[b, slot[b]] = s_ref[b]
    n = gname(v)
    ptr, _ = mod.get_global(f"{n}_launch")
    c = np.zeros(3, np.int32)
    drv.memcpy_dtoh(c, ptr)
    threads, smem, bps = map(int, c)
    fn = mod.get_function(n)
    allow_dynamic_smem(fn, smem)
    d_ring, d_state = to_gpu(ring.astype(BF16)), to_gpu(state.astype(np.float32))
    d_arr = to_gpu(np.zeros(B * g.hk, np.int32))
    d_out = poisoned((B * pt, g.Cv), BF16)
    fn(to_gpu(inp["mz"].astype(BF16)), np.int32(inp["ld_mz"]), to_gpu(inp["ba"].astype(BF16)),
       np.int32(inp["ld_ba"]), np.int32(inp["ba_off"]), to_gpu(inp["conv_w"].astype(BF16)),
       to_gpu(inp["A_log"].astype(np.float32)), to_gpu(inp["dt_bias"].astype(BF16)),
       to_gpu(inp["norm_w"].astype(np.float32)), np.float32(EPS), d_ring, d_arr, d_state,
       to_gpu(inp["pos"].astype(np.int32)), to_gpu(inp["ntok"].astype(np.int32)), d_out,
       to_gpu(slot.astype(np.int32)), block=(threads, 1, 1), grid=(B * bps, 1, 1), shared=smem)
    assert not d_arr.get().any(), "ring_arrivals not left at 0"
    out, ring_got, st_got = (d.get().astype(np.float64) for d in (d_out, d_ring, d_state))
    bad = np.argwhere(ring_got != ring_ref)
    assert bad.size == 0, f"ring differs at [b, slot, ch] = {bad[:5].tolist()}"
    real = np.concatenate([np.arange(b * pt, b * pt + ntok[b]) for b in range(B)])
    assert rel_err(out[real], o_ref[real]) <= TOL["out_hf"]
    for b in range(B):
        for s in range(slots):
            touched = (s < ntok[b]) if each else (s == slot[b])
            if not touched:
                assert np.array_equal(st_got[b, s], state[b, s].astype(np.float32)), (b, s)
            else:
                e = rel_err(st_got[b, s], want[b, s])
                assert e <= TOL["state_hf"], f"b={b} slot={s}: state rel err {e:.2e}"


def test_accept_planted(mod):
    """n = leading drafts equal to the target's argmax of the previous row; a sequence that
    idled in the pass (ntok 0) keeps its state slot and first verify token."""
    # rows [x, d1, d2] and argmax [a0, a1, a2]
    cases = [([5, 7, 9], [7, 9, 4], 2),    # both drafts right: emit a0 a1 a2 (bonus)
             ([5, 7, 9], [7, 8, 4], 1),    # d2 wrong
             ([5, 6, 9], [7, 9, 4], 0),    # d1 wrong (d2 would match a1: must not count)
             ([5, 7, 7], [7, 7, 1], 2),
             ([0, 0, 0], [0, 0, 0], 2),
             ([5, 7, 9], [7, 9, 4], None)]  # idle: all drafts would be accepted, none is
    B = len(cases) + 128                   # a second block, all-accept beyond the cases
    vt = np.zeros((B, 3), np.int32)
    am = np.zeros((B, 3), np.int32)
    ntok = np.full(B, 3, np.int32)
    for b, (v, a, n) in enumerate(cases):
        vt[b], am[b] = v, a
        ntok[b] = 0 if n is None else 3
    ntok[len(cases) + 77] = 0              # one idle sequence in the second block
    d_vt = to_gpu(vt)
    d_emit, d_cnt, d_slot, d_nm = (poisoned(s, np.int32) for s in ((B, 3), (B,), (B,), (B,)))
    slot0 = d_slot.get()
    mod.get_function("acc3")(d_vt, to_gpu(am), to_gpu(ntok), d_emit, d_cnt, d_slot, d_nm,
                             np.int32(B), block=(128, 1, 1), grid=(-(-B // 128), 1, 1))
    emit, cnt, slot, nm, vt2 = (d.get() for d in (d_emit, d_cnt, d_slot, d_nm, d_vt))
    for b in range(B):
        if ntok[b] == 0:
            assert cnt[b] == 0 and nm[b] == 0 and list(emit[b]) == [-1, -1, -1], b
            assert slot[b] == slot0[b] and list(vt2[b]) == list(vt[b]), b
            continue
        n = cases[b][2] if b < len(cases) else 2
        assert cnt[b] == n + 1 and slot[b] == n and nm[b] == n + 1, b
        assert list(emit[b]) == [am[b, j] if j <= n else -1 for j in range(3)], b
        assert vt2[b, 0] == am[b, n] and list(vt2[b, 1:]) == list(vt[b, 1:]), b
    # one draft
    vt1, am1 = np.array([[1, 2], [1, 3]], np.int32), np.array([[2, 8], [2, 8]], np.int32)
    d_vt1 = to_gpu(vt1)
    d_e, d_c, d_s, d_n = (poisoned(s, np.int32) for s in ((2, 2), (2,), (2,), (2,)))
    mod.get_function("acc2")(d_vt1, to_gpu(am1), to_gpu(np.array([2, 2], np.int32)), d_e, d_c,
                             d_s, d_n, np.int32(2), block=(128, 1, 1), grid=(1, 1, 1))
    assert d_c.get().tolist() == [2, 1] and d_e.get().tolist() == [[2, 8], [2, -1]]
    assert d_vt1.get()[:, 0].tolist() == [8, 2]


def test_mtp_token_rows_pos_put(mod):
    B, PT = 3, 4
    mnext = np.array([4, 5, 6, -1, 9, -1, 0, 0, 1, 2, 3, 4], np.int32)
    nxt = np.array([70, 71, 72], np.int32)
    d = poisoned((B * PT,), np.int32)
    mod.get_function("toks4")(to_gpu(mnext), to_gpu(nxt), d, np.int32(B * PT),
                              block=(128, 1, 1), grid=(1, 1, 1))
    assert d.get().tolist() == [4, 5, 6, 70, 9, 71, 0, 0, 1, 2, 3, 4]
    pos = np.array([3, 10, 0], np.int32)
    mp, one = poisoned((B,), np.int32), poisoned((B,), np.int32)
    mod.get_function("spos")(to_gpu(pos), np.int32(2), mp, one, np.int32(B),
                             block=(128, 1, 1), grid=(1, 1, 1))
    assert mp.get().tolist() == [5, 12, 2] and one.get().tolist() == [1, 1, 1]
    dst = to_gpu(np.zeros(B * 3, np.int32))
    mod.get_function("sput")(dst, to_gpu(nxt), np.int32(2), np.int32(3), np.int32(B),
                             block=(128, 1, 1), grid=(1, 1, 1))
    assert dst.get().tolist() == [0, 0, 70, 0, 0, 71, 0, 0, 72]

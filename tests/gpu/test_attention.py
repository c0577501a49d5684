"""attn_prep (kernels/attention.cuh) and attn_tc (kernels/attention_tc.cuh) on the GPU against
numpy references from docs/MODEL.md, attn_tc with the program's schedule (plan.attention, Tuning's attn_*).

Every case draws fresh inputs: qkv rows with a per-row scale, random (1 + w) norm weights, and a
KV cache whose valid slots (< pos[b]) hold random K/V while every other slot holds garbage (NaN,
±1e38) that poisons any arithmetic reading it; the q buffer and the output start NaN. Checked:

* the q buffer, every row (padding rows too: attn_prep computes them), against QK-norm + RoPE;
* the cache slots written (K to tolerance, V bitwise = the raw v columns) and every other slot
  bitwise untouched (also when a position lies past Tmax: nothing is written);
* the attention output of valid rows against a reference fed the kernel's own q buffer and cache
  (isolates attn_tc), and end to end against the independent fp64 chain from qkv;
* exact zeros in the output rows of padding tokens.

Split-K (attn_tc cuts a row of n slots into ns(n) splits, PA.attn_span / attn_splits): the split
scratch starts NaN and the arrival counters at 0; after every launch the counters must be all 0
again, and a second launch on the same buffers must give bitwise the same output. Covered: n = 1,
SPLIT − 1, SPLIT, SPLIT + 1, several splits, the most splits (32·SPLIT) and the first grown span
(32·SPLIT + 1), 100 000-slot contexts; B = 1, 3, 17; PT = 1, 4; grid.x from the plan's rule, 1
(one block runs every split of its row) and 3; and batch invariance: a sequence computed at B = 1
and inside B = 5 (another Tmax, another grid.x) gives bitwise the same output.

Geometries: tiny (H=6, HKV=2, G=3) and 27B (H=24, HKV=4, G=6), head_dim 256, rotary 64.
"""

from __future__ import annotations

import numpy as np
import pytest

from qwen38gen.plan import attention as PA
from qwen38gen.plan.arch import arch_facts
from qwen38gen.tuning import Tuning
from qwen38gen.runtime import allow_dynamic_smem
from qwen38gen.weights import xtile_index
from tests.gpu import ref_ops as ref
from tests.gpu.harness import BF16, build, poisoned, rel_err, to_gpu

D, RD = 256, 64
EPS, THETA = 1e-6, 1e7
GEOMS = {"tiny": (6, 2), "27b": (24, 4)}

# Tolerances, relative L2 error per row (the worst row is asserted):
# q buffer and written K: two bf16 roundings per element (the normed value, as HF stores it, then
# the rotated one), each ≤ 2^-8 relative; the reference forms the RoPE angle in fp32 as HF does
# (docs/MODEL.md §7) and the kernel's cos/sin on the reduced angle are within 2^-21.4.
TOL_QK = 1e-2
# attn_tc against a reference fed the kernel's own bf16 q and cache: fp32 scores, softmax and
# sums, then one bf16 rounding of the output; each softmax weight is rounded to bf16 before P·V
# (≤ 2^-9 relative each, independent errors that average out over the slots).
TOL_ATTN = 1e-2
# End to end against the fp64 chain from qkv: the bf16 storage of q and K shifts every score by
# ~2^-9·|s| on top (scores of std ~3 here).
TOL_E2E = 2e-2

_MODS: dict = {}
SPLIT = PA.ATTN_SPLIT
TC_ST, TC_MB = Tuning().attn_st, Tuning().attn_mb     # the program's attn_tc schedule
TC_BLOCKS = PA.attn_blocks(Tuning(), arch_facts("sm_90a"))


def _kernels(H: int, HKV: int, PT: int, tnt: int = 0):
    """(prep, attn_tc, launch, smem) for one geometry and chunk size: attn_tc with the program's
    schedule (plan.attention, Tuning's attn_*), its output in rows or (tnt > 0) in wgmma_q4's
    tile order. launch comes from the C++ structs: prep threads, prep grid_y, attn_tc threads, split, max_splits,
    part_floats."""
    key = (H, HKV, PT, tnt)
    if key not in _MODS:
        import pycuda.driver as drv

        tag = f"h{H}_kv{HKV}_pt{PT}_t{tnt}"
        P = f"q38::AttnPrepLaunch<{D}, {RD}, {H}, {HKV}, {PT}>"
        knobs = f"{PA.ATTN_TC_NW}, {TC_ST}, {PA.ATTN_SPLIT}, {TC_MB}"
        A = f"q38::AttnTcLaunch<{D}, {H}, {HKV}, {PT}, {knobs}>"
        smem = PA.attn_tc_smem(_Geom(H, HKV), PA.ATTN_TC_NW, TC_ST)
        src = f"""
#include "attention_tc.cuh"
using q38::bf16;
extern "C" __constant__ int launch_{tag}[6] = {{{P}::threads, {P}::grid_y, {A}::threads,
                                               {A}::split, {A}::max_splits, {A}::part_floats}};
extern "C" __global__ void __launch_bounds__({P}::threads)
prep_{tag}(const bf16* qkv, int ld, const bf16* qn, const bf16* kn, float eps, float theta,
           const int* pos, const int* ntok, bf16* qbuf, bf16* kc, bf16* vc, int tmax) {{
  q38::attn_prep<{D}, {RD}, {H}, {HKV}, {PT}>(qkv, ld, qn, kn, eps, theta, pos, ntok, qbuf, kc, vc,
                                             tmax);
}}
extern "C" __global__ void __launch_bounds__({A}::threads)
attn_{tag}(const bf16* qbuf, const bf16* qkv, int ld, const bf16* kc, const bf16* vc, int tmax,
           const int* pos, const int* ntok, float* part, int* arrivals, bf16* o) {{
  q38::attn_tc<{D}, {H}, {HKV}, {PT}, {knobs}{f", {tnt}" if tnt else ""}>(qbuf, qkv, ld, kc, vc,
                                            tmax, pos, ntok, part, arrivals, o);
}}
static_assert({A}::dyn_smem_bytes == {smem}, "the plan's shared memory size");
"""
        mod = build(src)
        ptr, _ = mod.get_global(f"launch_{tag}")
        launch = np.zeros(6, np.int32)
        drv.memcpy_dtoh(launch, ptr)
        launch = tuple(int(v) for v in launch)
        # the Python mirror (qwen38gen/plan/attention.py) sizes the scratch and picks the grid: it must agree
        assert launch[3:] == (PA.ATTN_SPLIT, PA.ATTN_MAX_SPLITS,
                              PA.attn_part_floats(_Geom(H, HKV))), launch
        attn = mod.get_function(f"attn_{tag}")
        allow_dynamic_smem(attn, smem)
        _MODS[key] = (mod.get_function(f"prep_{tag}"), attn, launch, smem)
    return _MODS[key]


class _Geom:
    """The ModelConfig fields PA.attn_part_floats reads."""

    def __init__(self, H, HKV):
        self.num_attention_heads, self.num_key_value_heads, self.head_dim = H, HKV, D


def _gpu_run(H, HKV, PT, B, qkv, qn, kn, pos, ntok, kc0, vc0, tmax, gx=None, tnt=0):
    """attn_prep then attn_tc on the device, as a step runs them, then attn_tc once more on the
    same buffers (the counters must have been left at 0). gx: attn_tc's grid.x, default the plan's
    rule. tnt > 0: the output in tile order for 8·tnt-row tiles, read back into rows.
    Returns qbuf, kc, vc, out (of the first attn_tc launch)."""
    prep, attn, (p_threads, p_grid_y, a_threads, *_), smem = _kernels(H, HKV, PT, tnt)
    R, ld = qkv.shape
    gx = PA.attn_grid_x(B * HKV * PT, TC_BLOCKS) if gx is None else gx
    qkv_d, qn_d, kn_d = to_gpu(qkv), to_gpu(qn), to_gpu(kn)
    pos_d, ntok_d = to_gpu(np.asarray(pos, np.int32)), to_gpu(np.asarray(ntok, np.int32))
    kc_d, vc_d = to_gpu(kc0), to_gpu(vc0)
    qbuf_d = poisoned((R, H, D), BF16)
    part_d = poisoned((R, HKV, PA.attn_stride(tmax), PA.attn_part_floats(_Geom(H, HKV))),
                      np.float32)
    arr_d = to_gpu(np.zeros((R, HKV), np.int32))
    prep(qkv_d.gpudata, np.int32(ld), qn_d.gpudata, kn_d.gpudata, np.float32(EPS),
         np.float32(THETA), pos_d.gpudata, ntok_d.gpudata, qbuf_d.gpudata, kc_d.gpudata,
         vc_d.gpudata, np.int32(tmax), block=(p_threads, 1, 1), grid=(R, p_grid_y))
    outs = []
    rows = -(-R // (8 * tnt)) * 8 * tnt if tnt else R
    for _ in range(2):
        out_d = poisoned((rows, H * D), BF16)
        attn(qbuf_d.gpudata, qkv_d.gpudata, np.int32(ld), kc_d.gpudata, vc_d.gpudata,
             np.int32(tmax), pos_d.gpudata, ntok_d.gpudata, part_d.gpudata, arr_d.gpudata,
             out_d.gpudata, block=(a_threads, 1, 1), grid=(gx, B * HKV, PT), shared=smem)
        out = out_d.get()
        outs.append(out.reshape(-1)[xtile_index(R, H * D, tnt)] if tnt else out)
        arr = arr_d.get()
        assert not arr.any(), f"arrival counters not reset: {np.count_nonzero(arr)} nonzero"
    assert np.array_equal(outs[0].view(np.uint16), outs[1].view(np.uint16)), \
        "a second attn_tc launch on the same buffers differs"
    return qbuf_d.get(), kc_d.get(), vc_d.get(), outs[0]


def _bf16(a) -> np.ndarray:
    return np.asarray(a, dtype=np.float32).astype(BF16)


def _garbage(n: int) -> np.ndarray:
    """n bf16 values that poison any sum they enter: NaN and ±1e38 (a tiled random pattern)."""
    block = np.random.default_rng(7).choice(np.array([np.nan, 1e38, -1e38, 3e37], np.float32), 4093)
    return np.resize(block, n).astype(BF16)


def _cache(rng, B, HKV, tmax, pos, scale):
    """[B, HKV, tmax, D] bf16: random below pos[b] (× scale), garbage from pos[b] on."""
    c = np.empty((B, HKV, tmax, D), BF16)
    for b in range(B):
        p = min(int(pos[b]), tmax)
        c[b, :, :p] = _bf16(rng.standard_normal((HKV, p, D), dtype=np.float32) * scale)
        c[b, :, p:] = _garbage(HKV * (tmax - p) * D).reshape(HKV, tmax - p, D)
    return c


def _inputs(rng, H, HKV, B, PT, pos, tmax, kscale=3.0):
    """qkv [B·PT, ld], q_norm, k_norm, K cache, V cache (valid below pos[b], garbage above)."""
    ld = 2 * H * D + 2 * HKV * D + 24  # a row stride wider than the fused width (ld % 8 == 0)
    qkv = _bf16(rng.standard_normal((B * PT, ld)) * rng.uniform(0.2, 4.0, (B * PT, 1)))
    qn = _bf16(rng.standard_normal(D) * 0.4)
    kn = _bf16(rng.standard_normal(D) * 0.4)
    kc0 = _cache(rng, B, HKV, tmax, pos, kscale)
    vc0 = _cache(rng, B, HKV, tmax, pos, 1.0)
    return qkv, qn, kn, kc0, vc0


def _run_case(geom, B, PT, pos, ntok, tmax, seed, kscale=3.0, e2e=True, gx=None):
    H, HKV = GEOMS[geom]
    R = B * PT
    pos, ntok = np.asarray(pos, np.int64), np.asarray(ntok, np.int64)
    rng = np.random.default_rng(seed)
    qkv, qn, kn, kc0, vc0 = _inputs(rng, H, HKV, B, PT, pos, tmax, kscale)

    qbuf, kc, vc, out = _gpu_run(H, HKV, PT, B, qkv, qn, kn, pos, ntok, kc0, vc0, tmax, gx)

    rb = np.repeat(np.arange(B), PT)            # row -> sequence
    rt = np.tile(np.arange(PT), B)              # row -> chunk token
    prow = pos[rb] + rt                         # row -> position
    valid = rt < ntok[rb]
    written = valid & (prow < tmax)
    q_ref, k_ref, v_ref, gate = ref.attn_prep(qkv, qn, kn, EPS, THETA, prow, H, HKV, D, RD,
                                              angle_dtype=np.float32)
    e_q = max(rel_err(qbuf[r], q_ref[r]) for r in range(R))

    ws, wb = prow[written], rb[written]
    e_k = max((rel_err(kc[wb[i], :, ws[i]], k_ref[written][i]) for i in range(len(ws))),
              default=0.0)
    v_bits = qkv[written][:, 2 * H * D + HKV * D:2 * H * D + 2 * HKV * D].reshape(-1, HKV, D)
    v_ok = np.array_equal(vc[wb, :, ws].view(np.uint16), v_bits.view(np.uint16))
    k_exp, v_exp = kc0.copy(), vc0.copy()       # the cache as it must be outside written slots
    k_exp[wb, :, ws] = kc[wb, :, ws]
    v_exp[wb, :, ws] = vc[wb, :, ws]
    untouched = (np.array_equal(kc.view(np.uint16), k_exp.view(np.uint16))
                 and np.array_equal(vc.view(np.uint16), v_exp.view(np.uint16)))

    e_a = e_e = 0.0
    for r in np.nonzero(valid)[0]:
        b, n = rb[r], min(int(prow[r]) + 1, tmax)
        got = out[r].astype(np.float64)
        e_a = max(e_a, rel_err(got, ref.gated_attention_row(qbuf[r], gate[r], kc[b, :, :n],
                                                            vc[b, :, :n])))
        if e2e:  # cached slots as given, then the chunk's own K/V from the reference chain
            mine = written & (rb == b) & (rt <= rt[r])
            p0 = min(int(pos[b]), tmax)
            K = np.concatenate([kc0[b, :, :p0].astype(np.float32),
                                k_ref[mine].transpose(1, 0, 2).astype(np.float32)], axis=1)
            V = np.concatenate([vc0[b, :, :p0].astype(np.float32),
                                v_ref[mine].transpose(1, 0, 2).astype(np.float32)], axis=1)
            e_e = max(e_e, rel_err(got, ref.gated_attention_row(q_ref[r], gate[r], K[:, :n],
                                                                V[:, :n])))
    pad_zero = bool(np.all(out[~valid].astype(np.float32) == 0.0))

    nmax = int(min(prow[valid].max() + 1, tmax))
    print(f"attn_tc {geom} B={B} PT={PT} pos={pos.tolist()[:4]} ntok={ntok.tolist()[:4]} "
          f"splits<={PA.attn_splits(nmax)} gx={gx}: "
          f"q {e_q:.2e} k {e_k:.2e} attn {e_a:.2e}" + (f" e2e {e_e:.2e}" if e2e else ""))
    assert e_q < TOL_QK, f"q buffer: worst row rel err {e_q:.2e}"
    assert e_k < TOL_QK, f"written K: worst slot rel err {e_k:.2e}"
    assert v_ok, "written V slots are not the raw v columns"
    assert untouched, "cache slots other than (b, pos[b]+t < Tmax, t < ntok[b]) changed"
    assert e_a < TOL_ATTN, f"attn_tc vs its own inputs: worst row rel err {e_a:.2e}"
    assert e_e < TOL_E2E, f"attn_tc end to end: worst row rel err {e_e:.2e}"
    assert pad_zero, "output rows of padding tokens are not zero"


# (B, PT): decode at 1, 2, 3, 17 sequences; prefill chunks of 4 and 16 rows.
CHUNKS = [(1, 1), (2, 1), (3, 1), (17, 1), (1, 4), (3, 4), (1, 16), (3, 16)]


@pytest.mark.parametrize("geom", list(GEOMS))
@pytest.mark.parametrize("B,PT", CHUNKS)
def test_attention(cuda_ctx, geom, B, PT):
    seed = [B, PT, list(GEOMS).index(geom)]
    rng = np.random.default_rng(seed + [1])
    pos = rng.integers(1, 1500, size=B)
    if B > 1:
        pos[0] = 0                   # a fresh sequence: the chunk attends to itself only
    if B > 2:
        pos[2] = 4097                # a longer one, not a multiple of any tile
    if PT == 1:
        ntok = np.ones(B, np.int64)
    else:
        ntok = rng.integers(1, PT + 1, size=B)
        ntok[0] = PT - 1             # uneven: one padding row
        if B > 2:
            ntok[1:3] = [1, PT]      # a single real row; a full chunk
    tmax = int(pos.max()) + PT + 37
    _run_case(geom, B, PT, pos, ntok, tmax, seed)


@pytest.mark.parametrize("geom", list(GEOMS))
@pytest.mark.parametrize("PT", [1, 4])
def test_attention_peaky_scores(cuda_ctx, geom, PT):
    """Scores with std ~36: the online softmax must rescale without overflow or lost mass."""
    B = 3
    _run_case(geom, B, PT, [700, 33, 2049], [1] * B if PT == 1 else [4, 2, 3], 2049 + PT + 5,
              [B, PT, 9], kscale=36.0, e2e=False)


@pytest.mark.parametrize("geom", list(GEOMS))
@pytest.mark.parametrize("PT", [1, 4])
def test_attention_long_context(cuda_ctx, geom, PT):
    """Position 100000: 100001+ slots per kv head, the most splits (32) of a grown span."""
    pos = [100000, 77] if geom == "tiny" else [100000]
    ntok = [1] * len(pos) if PT == 1 else [PT, 3][:len(pos)]
    _run_case(geom, len(pos), PT, pos, ntok, 100006, [len(pos), PT, 5])


@pytest.mark.parametrize("geom", list(GEOMS))
def test_attention_positions_past_tmax(cuda_ctx, geom):
    """RoPE at positions past sincosf's fast range (105615) up to 262143; Tmax = 64, so no
    slot may be written and attn_tc reads the clamped window of 64 slots."""
    _run_case(geom, 3, 4, [105613, 200003, 262140], [4, 2, 3], 64, [3, 4, 11])


# Context lengths n around the split boundaries: 1, SPLIT − 1, SPLIT, SPLIT + 1, several splits,
# the most splits at the base span (32·SPLIT), the first grown span (32·SPLIT + 1: 17 splits of
# 2·SPLIT), and a grown span with a short last split.
EDGES = [1, SPLIT - 1, SPLIT, SPLIT + 1, 5 * SPLIT + 3, 32 * SPLIT, 32 * SPLIT + 1, 70 * SPLIT + 9]


def test_split_rule():
    """The split rule as documented: n only, spans of whole SPLITs, at most 32 splits, every split
    non-empty, and attn_stride(tmax) bounds the splits of every n <= tmax."""
    for n in list(range(1, 5000)) + [100001, 262144]:
        span, ns = PA.attn_span(n), PA.attn_splits(n)
        assert span % SPLIT == 0 and 1 <= ns <= PA.ATTN_MAX_SPLITS and (ns - 1) * span < n <= ns * span
        assert (n > SPLIT) == (ns > 1)
    for tmax in list(range(1, 3000, 7)) + [100006]:
        assert max(PA.attn_splits(n) for n in range(1, tmax + 1)) == PA.attn_stride(tmax)
    assert [PA.attn_splits(n) for n in EDGES] == [1, 1, 1, 2, 6, 32, 17, 24]


@pytest.mark.parametrize("geom", list(GEOMS))
@pytest.mark.parametrize("PT", [1, 4])
@pytest.mark.parametrize("n", EDGES)
def test_attention_split_edges(cuda_ctx, geom, PT, n):
    """B = 1; the chunk's first row sees n slots (a PT = 4 chunk: n … n + 3, so the chunk
    straddles the boundary at n = SPLIT − 1 and SPLIT)."""
    _run_case(geom, 1, PT, [n - 1], [PT], n - 1 + PT + 5, [n, PT, 13])


@pytest.mark.parametrize("geom", list(GEOMS))
@pytest.mark.parametrize("B", [3, 17])
@pytest.mark.parametrize("PT", [1, 4])
@pytest.mark.parametrize("gx", [None, 1, 3])
def test_attention_split_batches(cuda_ctx, geom, B, PT, gx):
    """Every EDGES length in one batch (cyclically), PT = 4 with padding rows; grid.x from the
    plan, 1 (each block loops over all its row's splits) and 3."""
    pos = np.array([EDGES[b % len(EDGES)] - 1 for b in range(B)])
    ntok = np.ones(B, np.int64) if PT == 1 else np.array([(4, 1, 3, 2)[b % 4] for b in range(B)])
    _run_case(geom, B, PT, pos, ntok, int(pos.max()) + PT + 11, [B, PT, 17, gx or 0], gx=gx)


@pytest.mark.parametrize("geom", list(GEOMS))
@pytest.mark.parametrize("PT", [1, 4])
@pytest.mark.parametrize("p", [0, SPLIT - 1, SPLIT, 1000, 32 * SPLIT, 4097])
def test_attention_batch_invariance(cuda_ctx, geom, PT, p):
    """One sequence (position p, a full chunk) at B = 1 and as sequence 2 of B = 5 (other
    sequences around it, a larger Tmax, the plan's grid.x for each B, and grid.x = 1): the q
    buffer and the output rows must be bitwise the same."""
    H, HKV = GEOMS[geom]
    rng = np.random.default_rng([p, PT, 23])
    tmax1, tmax5 = p + PT + 3, max(5000, p + 1000) + PT
    qkv1, qn, kn, kc1, vc1 = _inputs(rng, H, HKV, 1, PT, [p], tmax1)
    pos5 = np.array([3000, 17, p, 4321, 64])
    ntok5 = np.array([PT, 1, PT, max(PT - 1, 1), PT])
    qkv5, _, _, kc5, vc5 = _inputs(rng, H, HKV, 5, PT, pos5, tmax5)
    qkv5[2 * PT:3 * PT] = qkv1
    kc5[2, :, :p], vc5[2, :, :p] = kc1[0, :, :p], vc1[0, :, :p]

    q1, kc, vc, o1 = _gpu_run(H, HKV, PT, 1, qkv1, qn, kn, [p], [PT], kc1, vc1, tmax1)
    runs = [_gpu_run(H, HKV, PT, 1, qkv1, qn, kn, [p], [PT], kc1, vc1, tmax1, gx=1)[::3],
            _gpu_run(H, HKV, PT, 5, qkv5, qn, kn, pos5, ntok5, kc5, vc5, tmax5)[::3],
            _gpu_run(H, HKV, PT, 5, qkv5, qn, kn, pos5, ntok5, kc5, vc5, tmax5, gx=1)[::3]]
    bits = lambda a: np.asarray(a).view(np.uint16)
    assert np.all(np.isfinite(o1.astype(np.float32)))
    for i, (q, o) in enumerate(runs):
        rows = slice(0, PT) if i == 0 else slice(2 * PT, 3 * PT)
        assert np.array_equal(bits(q[rows]), bits(q1)), f"run {i}: q buffer differs"
        assert np.array_equal(bits(o[rows]), bits(o1)), f"run {i}: output differs"
    # and the kernel's answer is right (the same check as everywhere else)
    gate = ref.attn_split_qkv(qkv1, H, HKV, D)[1]
    for t in range(PT):
        n = min(p + t + 1, tmax1)
        e = rel_err(o1[t], ref.gated_attention_row(q1[t], gate[t], kc[0, :, :n], vc[0, :, :n]))
        assert e < TOL_ATTN, f"row {t}: rel err {e:.2e}"


@pytest.mark.parametrize("geom", list(GEOMS))
@pytest.mark.parametrize("B,PT", [(3, 1), (17, 1), (3, 4), (17, 4)])
@pytest.mark.parametrize("tnt", [3, 4, 8])
def test_attention_output_in_tile_order(cuda_ctx, geom, B, PT, tnt):
    """attn_tc with TNT > 0 (version 13: the out projection reads o with XT = 1) writes the same
    values as with rows, each where weights.xtile_index puts it: one split and several (the
    EDGES lengths), merged by attn_merge_splits, and padding rows (PT = 4) as zeros; the tile
    buffer starts poisoned."""
    H, HKV = GEOMS[geom]
    pos = np.array([EDGES[b % len(EDGES)] - 1 for b in range(B)])
    ntok = np.ones(B, np.int64) if PT == 1 else np.array([(4, 1, 3, 2)[b % 4] for b in range(B)])
    tmax = int(pos.max()) + PT + 11
    rng = np.random.default_rng([B, PT, tnt, 29])
    qkv, qn, kn, kc0, vc0 = _inputs(rng, H, HKV, B, PT, pos, tmax)
    rows = _gpu_run(H, HKV, PT, B, qkv, qn, kn, pos, ntok, kc0.copy(), vc0.copy(), tmax)[3]
    tiles = _gpu_run(H, HKV, PT, B, qkv, qn, kn, pos, ntok, kc0.copy(), vc0.copy(), tmax,
                     tnt=tnt)[3]
    assert np.all(np.isfinite(tiles.astype(np.float32))), "a value of o was not written"
    assert np.array_equal(tiles.view(np.uint16), rows.view(np.uint16)), \
        f"{geom} B={B} PT={PT} TNT={tnt}: tile-order output differs from the row-order one"

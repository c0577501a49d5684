"""gemv_q4 on the GPU against the numpy product with the dequantized int4 weights.

Fresh random weights and activations per case, NaN-poisoned outputs, batch sizes that are and are
not multiples of the batch tile, both epilogues, and the batch-invariance the equivalence locks
rely on (a row's result is bitwise the same whatever batch it is computed in).
"""

from __future__ import annotations

import numpy as np
import pytest

from qwen38gen import weights as wq
from qwen38gen.plan.arch import arch_facts
from qwen38gen.plan.gemv import EPI_SWIGLU, gemm_launch, gemm_part_floats, gemm_smem, gemv_smem
from qwen38gen.plan.wgmma import (sk_grid, sk_launch, sk_pub_floats, sk_smem, wgmma_launch,
                                  wgmma_part_floats, wgmma_smem)
from qwen38gen.tuning import Tuning
from qwen38gen.runtime import allow_dynamic_smem
from tests.gpu.harness import BF16, build, poisoned, rel_err, to_gpu

H200 = arch_facts("sm_90a")


def _role(N: int, K: int) -> str:
    """The 27B weight a test shape stands for (by its size), whose table schedule it takes."""
    if N >= 65536:
        return "lm_head"
    if N >= 24576:
        return "gate_up"
    if N >= 8192:
        return "in"
    return "down" if K >= 2 * N else "out"


# (N, K): the tiny geometry's fused shapes, a 27B-like K, and N not a multiple of 16.
SHAPES = [(3072 + 512 + 512, 512), (512, 1024), (1280 + 768 + 32, 512), (96, 5120), (40, 1024),
          (5120, 17408)]
TILES = [(1, 1, 8), (1, 2, 8), (1, 3, 8), (1, 4, 8), (1, 8, 8), (2, 2, 4), (2, 3, 8)]  # (MT, NT, KS)
# Schedules (MT, NT, ST, XS, AS) that must give bitwise the rows of the plain (1, NT, 2, 0, 0):
# deeper register rings, staged activations, the cp.async shared-memory ring with more stages
# than a warp has groups (K = 512: one group per warp).
SCHEDULES = [(1, 1, 3, 1, 0), (2, 1, 2, 1, 0), (1, 1, 4, 0, 1), (1, 1, 8, 0, 1), (2, 1, 3, 0, 1),
             (2, 2, 3, 0, 1), (1, 4, 3, 0, 1), (2, 4, 2, 1, 0), (1, 1, 2, 1, 0)]
ROWS = [1, 2, 3, 8, 17, 64]

# bf16 output: each element is rounded once (relative 2^-9); the fp32 sums are far below that.
TOL = 4e-3

_MODS: dict = {}


def _kernel(K: int, mt: int, nt: int, ks: int, epi: int, st: int = 2, xs: int = 0, a: int = 0):
    key = (K, mt, nt, ks, epi, st, xs, a)
    if key not in _MODS:
        name = f"gemv_{K}_{mt}_{nt}_{ks}_{epi}_{st}_{xs}_{a}"
        src = f"""
#include "gemv_q4.cuh"
extern "C" __global__ void __launch_bounds__({32 * ks}, 1)
{name}(const uint4* q, const q38::bf16* s, const q38::bf16* x, int ldx, q38::bf16* y, int ldy,
       int N, int R) {{
  q38::gemv_q4<{K}, {mt}, {nt}, {ks}, {epi}, {st}, {xs}, {a}>(q, s, x, ldx, y, ldy, N, R);
}}
"""
        fn = build(src).get_function(name)
        smem = gemv_smem(K, mt, st, a)
        allow_dynamic_smem(fn, smem)
        _MODS[key] = (fn, smem)
    return _MODS[key]


def _run(k, qw, sc, x, y, N, R, mt, nt, ks):
    fn, smem = k
    np_rows = qw.shape[0] * 16
    grid = (np_rows // (16 * mt), -(-R // (8 * nt)))
    fn(qw.gpudata, sc.gpudata, x.gpudata, np.int32(x.shape[1]), y.gpudata, np.int32(y.shape[1]),
       np.int32(N), np.int32(R), block=(32 * ks, 1, 1), grid=grid, shared=smem)


def _weights(rng, N, K):
    w = (rng.standard_normal((N, K)) / np.sqrt(K)).astype(np.float32)
    codes, scales = wq.quantize_int4(w)
    qweight, sc_tiled = wq.pack_int4(codes, scales)
    return qweight, sc_tiled, wq.dequantize(qweight, sc_tiled, (N, K)).astype(np.float64)


def _against_gemv(rng, qw_d, sc_d, wdq, N, K, R, nt, ks, epi, launch, what, pad=0, tiled=False):
    """One launch of the kernel under test, launch(x, y, R) -> its counters or flags, over fresh
    x (rows of K + pad, the activation stride wider than K; or in tile order) against gemv_q4 on
    the same x in rows: NaN-poisoned (EPI_STORE) or random residual (EPI_ADD) outputs, the
    counters left at 0, the bits equal, and (store, wdq given) the result near the fp64 product."""
    xh = rng.standard_normal((R, K + pad)).astype(np.float32).astype(BF16)
    x = to_gpu(xh)
    xin = to_gpu(wq.tile_activations(xh, nt)) if tiled else x
    res = rng.standard_normal((R, N)).astype(np.float32).astype(BF16)
    want = to_gpu(res) if epi else poisoned((R, N), BF16)
    got = to_gpu(res) if epi else poisoned((R, N), BF16)
    _run(_kernel(K, 1, nt, ks, epi), qw_d, sc_d, x, want, N, R, 1, nt, ks)
    arr = launch(xin, got, R)
    assert not arr.any(), f"{what} R={R}: counters left {arr}"
    g = got.get()
    if not epi and wdq is not None:
        e = rel_err(g, xh[:, :K].astype(np.float64) @ wdq.T)
        assert e < TOL, f"{what} R={R}: rel err {e:.2e}"
    assert np.array_equal(g.view(np.uint16), want.get().view(np.uint16)), f"{what} epi={epi} R={R}: bits differ"


@pytest.mark.parametrize("N,K", SHAPES)
def test_gemv_store_matches_numpy(cuda_ctx, N, K):
    rng = np.random.default_rng([N, K, 1])
    qweight, sc, wdq = _weights(rng, N, K)
    qw_d, sc_d = to_gpu(qweight), to_gpu(sc)
    worst = 0.0
    for mt, nt, ks in TILES:
        if (qweight.shape[0]) % mt:
            continue
        fn = _kernel(K, mt, nt, ks, 0)
        for R in ROWS:
            x = rng.standard_normal((R, K)).astype(np.float32).astype(BF16)
            y = poisoned((R, N), BF16)
            _run(fn, qw_d, sc_d, to_gpu(x), y, N, R, mt, nt, ks)
            got = y.get().astype(np.float64)
            ref = x.astype(np.float64) @ wdq.T
            e = rel_err(got, ref)
            worst = max(worst, e)
            assert e < TOL, f"N={N} K={K} tile={mt, nt, ks} R={R}: rel err {e:.2e}"
    print(f"gemv_q4 store N={N} K={K}: worst rel err {worst:.2e} over tiles {TILES} R {ROWS}")


@pytest.mark.parametrize("N,K", [(512, 1024), (5120, 17408)])
def test_gemv_residual_add(cuda_ctx, N, K):
    rng = np.random.default_rng([N, K, 2])
    qweight, sc, wdq = _weights(rng, N, K)
    fn = _kernel(K, 1, 2, 8, 1)
    for R in (1, 3, 17):
        x = rng.standard_normal((R, K)).astype(np.float32).astype(BF16)
        res = rng.standard_normal((R, N)).astype(np.float32).astype(BF16)
        y = to_gpu(res)
        _run(fn, to_gpu(qweight), to_gpu(sc), to_gpu(x), y, N, R, 1, 2, 8)
        prod = (x.astype(np.float64) @ wdq.T).astype(np.float32).astype(BF16)
        ref = (res.astype(np.float32) + prod.astype(np.float32)).astype(BF16)
        e = rel_err(y.get(), ref)
        # Two bf16 roundings (the product, then the sum), as HF does.
        assert e < 2 * TOL, f"R={R}: rel err {e:.2e}"
        print(f"gemv_q4 add N={N} K={K} R={R}: rel err {e:.2e}")


def test_gemv_batch_invariant_bitwise(cuda_ctx):
    """Row r's output is bitwise identical whether the launch has 1 row or 64."""
    N, K = 1280 + 768 + 32, 512
    rng = np.random.default_rng(3)
    qweight, sc, _ = _weights(rng, N, K)
    qw_d, sc_d = to_gpu(qweight), to_gpu(sc)
    x = rng.standard_normal((64, K)).astype(np.float32).astype(BF16)
    for mt, nt, ks in TILES:
        fn = _kernel(K, mt, nt, ks, 0)
        full = poisoned((64, N), BF16)
        _run(fn, qw_d, sc_d, to_gpu(x), full, N, 64, mt, nt, ks)
        full = full.get()
        for r in (0, 5, 63):
            one = poisoned((1, N), BF16)
            _run(fn, qw_d, sc_d, to_gpu(x[r:r + 1]), one, N, 1, mt, nt, ks)
            assert np.array_equal(one.get().view(np.uint16), full[r:r + 1].view(np.uint16)), \
                f"tile {mt, nt, ks}: row {r} differs between R=1 and R=64"



@pytest.mark.parametrize("N,K", [(3072 + 512 + 512, 512), (96, 5120), (5120, 17408)])
def test_gemv_schedules_bitwise(cuda_ctx, N, K):
    """MT, ST, XS and AS only reschedule the same arithmetic: every schedule gives the bits of the
    plain one (both epilogues), which is what lets gemv_config pick them per shape and batch."""
    rng = np.random.default_rng([N, K, 5])
    qweight, sc, _ = _weights(rng, N, K)
    qw_d, sc_d = to_gpu(qweight), to_gpu(sc)
    ks = min(8, K // 128)
    for mt, nt, st, xs, a in SCHEDULES:
        if qweight.shape[0] % mt:
            continue
        for epi in (0, 1):
            ref_fn = _kernel(K, 1, nt, ks, epi)
            fn = _kernel(K, mt, nt, ks, epi, st, xs, a)
            for R in (1, 5, 8 * nt + 3):
                x = to_gpu(rng.standard_normal((R, K)).astype(np.float32).astype(BF16))
                res = rng.standard_normal((R, N)).astype(np.float32).astype(BF16)
                want = to_gpu(res) if epi else poisoned((R, N), BF16)
                got = to_gpu(res) if epi else poisoned((R, N), BF16)
                _run(ref_fn, qw_d, sc_d, x, want, N, R, 1, nt, ks)
                _run(fn, qw_d, sc_d, x, got, N, R, mt, nt, ks)
                assert np.array_equal(got.get().view(np.uint16), want.get().view(np.uint16)), \
                    f"N={N} K={K} schedule {mt, nt, st, xs, a} epi={epi} R={R}: bits differ"
    print(f"gemv_q4 N={N} K={K}: schedules {SCHEDULES} bitwise equal to the plain one")


# SwiGLU in gate_up's epilogue (EPI_SWIGLU, plan.builder mlp): the block takes gate tile t and up tile
# t + MS. Features F: the tiny model's, a 27B-like K, F = 40 (the gate part padded to 48 rows,
# so the up part starts at tile 3, not at row F), and K = 128 (KS = 1: no part sum).
SWIGLU_SHAPES = [(1024, 512), (96, 5120), (40, 1024), (48, 128)]
# Schedules (NT, ST, XS, AS) of MT = 2; the program's are (2, 2, 0, 0) and (1, 3, 0, 1).
SWIGLU_SCHEDULES = [(1, 2, 0, 0), (2, 2, 0, 0), (1, 3, 0, 1), (4, 2, 1, 0), (2, 3, 0, 0)]
_SWIGLU: dict = {}
# The swiglu kernel's own arithmetic (elementwise.cuh swiglu8) over the rows of a gu of
# [gate | ... | up at column off] (needs elementwise.cuh): the unfused path the fused
# epilogues must equal bit for bit.
SWIGLU_REF = """
extern "C" __global__ void swiglu_ref(const q38::bf16* gu, int ld, int off, q38::bf16* h, int F) {
  const int v = blockIdx.x * blockDim.x + threadIdx.x, r = blockIdx.y;
  if (8 * v < F)
    *reinterpret_cast<uint4*>(h + (size_t)r * F + 8 * v) =
        q38::swiglu8(gu + (size_t)r * ld + 8 * v, gu + (size_t)r * ld + off + 8 * v);
}
"""


def _swiglu_kernels(K: int, ks: int, ms: int) -> dict:
    """One module per shape: the fused launch of every SWIGLU_SCHEDULES entry, and the swiglu
    kernel's own arithmetic (elementwise.cuh swiglu8) over a gu of [gate | padding | up]
    columns: the unfused path the fusion must equal bit for bit."""
    key = (K, ks, ms)
    if key not in _SWIGLU:
        src = ['#include "gemv_q4.cuh"', '#include "elementwise.cuh"']
        names = {}
        threads = 32 * ks
        for nt, st, xs, a in SWIGLU_SCHEDULES:
            name = f"gemv_swiglu_{nt}_{st}_{xs}_{a}"
            names[(nt, st, xs, a)] = (name, threads)
            src.append(f"""
extern "C" __global__ void __launch_bounds__({threads}, 1)
{name}(const uint4* q, const q38::bf16* s, const q38::bf16* x, int ldx, q38::bf16* y, int ldy,
       int N, int R) {{
  q38::gemv_q4<{K}, 2, {nt}, {ks}, q38::EPI_SWIGLU, {st}, {xs}, {a}, {ms}>(q, s, x, ldx, y, ldy,
                                                                      N, R);
}}""")
        src.append(SWIGLU_REF)
        mod = build("\n".join(src))
        out = {"ref": mod.get_function("swiglu_ref")}
        for sched, (name, threads) in names.items():
            fn = mod.get_function(name)
            smem = gemv_smem(K, 2, sched[1], sched[3])
            allow_dynamic_smem(fn, smem)
            out[sched] = (fn, smem, threads)
        _SWIGLU[key] = out
    return _SWIGLU[key]


@pytest.mark.parametrize("F,K", SWIGLU_SHAPES)
def test_gemv_swiglu_epilogue_bitwise(cuda_ctx, F, K):
    """gate_up with SwiGLU in the epilogue gives bitwise what gemv_q4 (EPI_STORE) followed by
    the swiglu kernel's arithmetic gives, for every schedule and batch; and both are SwiGLU of
    the numpy product within two bf16 roundings."""
    rng = np.random.default_rng([F, K, 7])
    gq, gs, gd = _weights(rng, F, K)
    uq, us, ud = _weights(rng, F, K)
    ms = gq.shape[0]                       # the up part's first row tile (the gate padded to 16)
    qw_d, sc_d = to_gpu(np.concatenate([gq, uq])), to_gpu(np.concatenate([gs, us]))
    ks = min(8, K // 128)
    N2 = 2 * 16 * ms
    mod = _swiglu_kernels(K, ks, ms)
    ref_fn = mod["ref"]
    for nt, st, xs, a in SWIGLU_SCHEDULES:
        fused, smem, threads = mod[(nt, st, xs, a)]
        plain = _kernel(K, 1, nt, ks, 0)
        for R in (1, 5, 8 * nt + 3):
            xh = rng.standard_normal((R, K)).astype(np.float32).astype(BF16)
            x = to_gpu(xh)
            gu = poisoned((R, N2), BF16)
            _run(plain, qw_d, sc_d, x, gu, N2, R, 1, nt, ks)
            want = poisoned((R, F), BF16)
            ref_fn(gu.gpudata, np.int32(N2), np.int32(16 * ms), want.gpudata, np.int32(F),
                   block=(32, 1, 1), grid=(-(-F // 256), R))
            got = poisoned((R, F), BF16)
            fused(qw_d.gpudata, sc_d.gpudata, x.gpudata, np.int32(K), got.gpudata, np.int32(F),
                  np.int32(F), np.int32(R), block=(threads, 1, 1), grid=(ms, -(-R // (8 * nt))),
                  shared=smem)
            g_bits = got.get().view(np.uint16)
            assert np.array_equal(g_bits, want.get().view(np.uint16)), \
                f"F={F} K={K} schedule {nt, st, xs, a} R={R}: fused bits differ from the plain path"
            xf = xh.astype(np.float64)
            g, u = xf @ gd.T, xf @ ud.T
            e = rel_err(got.get().astype(np.float64), g / (1 + np.exp(-g)) * u)
            assert e < 3 * TOL, f"F={F} K={K} schedule {nt, st, xs, a} R={R}: rel err {e:.2e}"
    print(f"gemv_q4 EPI_SWIGLU F={F} K={K}: schedules {SWIGLU_SCHEDULES} bitwise equal to the "
          "plain GEMV + swiglu")


# ZS > 1 (plan.gemv.gemv_split): a row block's KS parts spread over a cluster of ZS blocks, summed in
# part order through distributed shared memory. Shapes: the 27B down projection, a 27B-like K
# with N not a multiple of 16, K = 512 (KS = 4) and K = 768 (KS = 6, the tiny model's down).
SPLIT_SHAPES = [(5120, 17408), (96, 5120), (3072 + 512 + 512, 512), (40, 768)]
# (MT, NT, ST, XS, AS, ZS); the program's is (1, 2, 2, 0, 0, 2).
SPLIT_SCHEDULES = [(1, 2, 2, 0, 0, 2), (1, 2, 2, 0, 0, 4), (1, 1, 2, 1, 0, 2), (2, 2, 2, 0, 0, 2),
                   (1, 1, 3, 0, 1, 2), (1, 2, 2, 0, 0, 8), (2, 4, 2, 0, 0, 4), (2, 4, 2, 0, 0, 8)]
_SPLIT: dict = {}


def _split_kernels(K: int, ks: int) -> dict:
    """One module per K: every SPLIT_SCHEDULES entry its ZS divides, both epilogues, and the
    same schedules at ZS = 1 (the reference bits)."""
    if K not in _SPLIT:
        src, names = ['#include "gemv_q4.cuh"'], {}
        for mt, nt, st, xs, a, zs in SPLIT_SCHEDULES:
            for z in ({zs, 1} if ks % zs == 0 else ()):
                for epi in (0, 1):
                    if (mt, nt, st, xs, a, z, epi) in names:
                        continue
                    name = f"gemv_split_{mt}_{nt}_{st}_{xs}_{a}_{z}_{epi}"
                    names[(mt, nt, st, xs, a, z, epi)] = name
                    src.append(f"""
extern "C" __global__ void __launch_bounds__({32 * ks // z}, 1) __cluster_dims__({z}, 1, 1)
{name}(const uint4* q, const q38::bf16* s, const q38::bf16* x, int ldx, q38::bf16* y, int ldy,
       int N, int R) {{
  q38::gemv_q4<{K}, {mt}, {nt}, {ks}, {epi}, {st}, {xs}, {a}, 0, {z}>(q, s, x, ldx, y, ldy, N, R);
}}""")
        mod = build("\n".join(src))
        out = {}
        for key, name in names.items():
            fn = mod.get_function(name)
            smem = gemv_smem(K, key[0], key[2], key[4], key[5])
            allow_dynamic_smem(fn, smem)
            out[key] = (fn, smem)
        _SPLIT[K] = out
    return _SPLIT[K]


@pytest.mark.parametrize("N,K", SPLIT_SHAPES)
def test_gemv_cluster_split_bitwise(cuda_ctx, N, K):
    """ZS blocks of a cluster sharing a row block's KS parts give bitwise the rows of ZS = 1 (both
    epilogues, batches within and past one tile), and the numpy product within a bf16 rounding."""
    rng = np.random.default_rng([N, K, 11])
    qweight, sc, wdq = _weights(rng, N, K)
    qw_d, sc_d = to_gpu(qweight), to_gpu(sc)
    ks = min(8, K // 128)
    mods = _split_kernels(K, ks)
    ran = 0
    for mt, nt, st, xs, a, zs in SPLIT_SCHEDULES:
        if ks % zs or qweight.shape[0] % mt:
            continue
        for epi in (0, 1):
            (ref_fn, ref_smem) = mods[(mt, nt, st, xs, a, 1, epi)]
            (fn, smem) = mods[(mt, nt, st, xs, a, zs, epi)]
            for R in (1, 5, 8 * nt, 8 * nt + 3):
                xh = rng.standard_normal((R, K)).astype(np.float32).astype(BF16)
                x = to_gpu(xh)
                res = rng.standard_normal((R, N)).astype(np.float32).astype(BF16)
                want = to_gpu(res) if epi else poisoned((R, N), BF16)
                got = to_gpu(res) if epi else poisoned((R, N), BF16)
                rows, gy = qweight.shape[0] // mt, -(-R // (8 * nt))
                for f, sm, z, out in ((ref_fn, ref_smem, 1, want), (fn, smem, zs, got)):
                    f(qw_d.gpudata, sc_d.gpudata, x.gpudata, np.int32(K), out.gpudata,
                      np.int32(N), np.int32(N), np.int32(R), block=(32 * ks // z, 1, 1),
                      grid=(rows * z, gy), shared=sm)
                assert np.array_equal(got.get().view(np.uint16), want.get().view(np.uint16)), \
                    f"N={N} K={K} schedule {mt, nt, st, xs, a} ZS={zs} epi={epi} R={R}: bits differ"
                if not epi:
                    e = rel_err(got.get().astype(np.float64), xh.astype(np.float64) @ wdq.T)
                    assert e < TOL, f"N={N} K={K} ZS={zs} R={R}: rel err {e:.2e}"
                ran += 1
    assert ran > 0
    print(f"gemv_q4 ZS N={N} K={K}: {ran} launches bitwise equal to ZS = 1")


# gemm_q4 (kernels/gemm_q4.cuh): the shared-activation schedule for larger batch tiles, with the
# parts of K optionally split over ZS blocks. Configs (MT, NT, WR, ST, ZS): one and two m-tiles
# per warp, 4 and 8 warps, 2-4 stages, ZS = 1 (in-block part sums), 2, 4, 8 (parts through
# global memory, merged by the last block), MB (below).
# MB: min blocks per SM in the launch bounds (2 caps the registers at 128, as the planner does for the
# split down projection). The program's configs: (2, 8, 4, 3, 1, 1) and (1, 8, 8, 3, 8, 2).
GEMM_CONFIGS = [(1, 2, 4, 2, 1, 1), (2, 2, 8, 4, 1, 1), (1, 8, 8, 3, 1, 1), (2, 8, 8, 3, 1, 1),
                (1, 2, 8, 4, 8, 1), (2, 8, 8, 3, 4, 1), (1, 8, 4, 3, 2, 1), (2, 4, 8, 4, 1, 1),
                (1, 1, 8, 4, 1, 1), (2, 8, 4, 3, 1, 1), (1, 8, 8, 3, 8, 2), (1, 8, 8, 3, 2, 2)]
_GEMM: dict = {}


def _gemm_kernel(K, mt, nt, ks, epi, wr, st, zs, mb=1):
    key = (K, mt, nt, ks, epi, wr, st, zs, mb)
    if key not in _GEMM:
        name = f"gemm_{K}_{mt}_{nt}_{ks}_{epi}_{wr}_{st}_{zs}_{mb}"
        src = f"""
#include "gemm_q4.cuh"
extern "C" __global__ void __launch_bounds__({32 * wr}, {mb})
{name}(const uint4* q, const q38::bf16* s, const q38::bf16* x, int ldx, q38::bf16* y, int ldy,
       int N, int R, float* part, int* arrivals) {{
  q38::gemm_q4<{K}, {mt}, {nt}, {ks}, {epi}, {wr}, {st}, {zs}>(q, s, x, ldx, y, ldy, N, R, part,
                                                              arrivals);
}}
static_assert(q38::GemmLaunch<{mt}, {nt}, {ks}, {wr}, {st}, {zs}>::threads == {32 * wr}, "");
static_assert(q38::GemmLaunch<{mt}, {nt}, {ks}, {wr}, {st}, {zs}>::dyn_smem_bytes ==
              {gemm_smem(K, mt, nt, wr, st, zs)}, "plan.gemm_smem");
"""
        fn = build(src).get_function(name)
        smem = gemm_smem(K, mt, nt, wr, st, zs)
        allow_dynamic_smem(fn, smem)
        _GEMM[key] = (fn, smem)
    return _GEMM[key]


def _run_gemm(k, qw, sc, x, y, N, R, mt, nt, ks, wr, zs):
    """Launch gemm_q4; returns the arrival counters (every launch must leave them at 0)."""
    import pycuda.gpuarray as ga

    fn, smem = k
    tiles = qw.shape[0]
    gx, gy = -(-tiles // (mt * wr)), -(-R // (8 * nt))
    part = ga.empty(gemm_part_floats(qw.shape[1] * 64, mt, nt, wr) * gx * gy, np.float32)
    part.fill(np.float32(np.nan))
    arrivals = ga.zeros(gx * gy, np.int32)
    fn(qw.gpudata, sc.gpudata, x.gpudata, np.int32(x.shape[1]), y.gpudata, np.int32(y.shape[1]),
       np.int32(N), np.int32(R), part.gpudata, arrivals.gpudata, block=(32 * wr, 1, 1),
       grid=(gx, gy, zs), shared=smem)
    return arrivals.get()


@pytest.mark.parametrize("N,K", [(3072 + 512 + 512, 512), (1280 + 768 + 32, 512), (96, 5120),
                                 (40, 1024), (5120, 6144), (5120, 17408)])
def test_gemm_bitwise_equals_gemv(cuda_ctx, N, K):
    """gemm_q4 gives gemv_q4's bits for every config, both epilogues, batches that are and are
    not multiples of the tile, an activation stride wider than K, and leaves its counters at 0;
    so the planner may pick either kernel per shape and batch without touching a row's result."""
    rng = np.random.default_rng([N, K, 6])
    qweight, sc, wdq = _weights(rng, N, K)
    qw_d, sc_d = to_gpu(qweight), to_gpu(sc)
    ks = min(8, K // 128)
    tried = 0
    for mt, nt, wr, st, zs, mb in GEMM_CONFIGS:
        if ks % zs:
            continue
        for epi in (0, 1):
            fn = _gemm_kernel(K, mt, nt, ks, epi, wr, st, zs, mb)
            for R in (1, 3, 8 * nt, 8 * nt + 5):
                _against_gemv(rng, qw_d, sc_d, wdq, N, K, R, nt, ks, epi,
                              lambda x, y, R: _run_gemm(fn, qw_d, sc_d, x, y, N, R, mt, nt, ks, wr, zs),
                              f"N={N} K={K} gemm {mt, nt, wr, st, zs}", pad=24)
                tried += 1
    assert tried
    print(f"gemm_q4 N={N} K={K}: {tried} launches bitwise equal to gemv_q4")


@pytest.mark.parametrize("N,K", [(8192 + 48, 1024), (512, 1536)])
def test_gemm_program_configs_bitwise(cuda_ctx, N, K):
    """The configs plan.gemv.gemm_config and gemm_split pick for the program at btg 64 (a wide
    weight, and a long-K one split over blocks), and the same configs at btg 32 (measured, not
    adopted), give gemv_q4's bits, both epilogues."""
    rng = np.random.default_rng([N, K, 7])
    qweight, sc, _ = _weights(rng, N, K)
    qw_d, sc_d = to_gpu(qweight), to_gpu(sc)
    ks = min(8, K // 128)
    seen = set()
    for btg in (32, 64):
        nt = btg // 8
        for R in (1, btg, btg + 5):
            # the program's launch at btg 64; at btg 32 the same schedule over 32-row tiles
            mt, wr, st, zs, mbz = gemm_launch(_role(N, K), N, K, 64, R * 64 // btg, H200)
            for epi in (0, 1):
                fn = _gemm_kernel(K, mt, nt, ks, epi, wr, st, zs, mbz)
                _against_gemv(rng, qw_d, sc_d, None, N, K, R, nt, ks, epi,
                              lambda x, y, R: _run_gemm(fn, qw_d, sc_d, x, y, N, R, mt, nt, ks, wr, zs),
                              f"N={N} K={K} btg={btg} gemm {mt, wr, st, zs, mbz}")
                seen.add((btg, zs))
    print(f"gemm_q4 N={N} K={K}: program configs (btg, ZS) {sorted(seen)} bitwise equal to gemv_q4")


# wgmma_q4 configs (NT, WG, MW, XS, ZS, MB): warpgroups per block, 64-row blocks per warpgroup,
# ring stages, blocks splitting K, min blocks per SM; 16- to 64-row tiles, one 8-row tile and
# 24-row tiles (m64n24k16, version 16).
WGMMA_CONFIGS = [(8, 1, 1, 4, 1, 1), (8, 2, 1, 3, 1, 1), (8, 1, 2, 3, 8, 1), (8, 2, 2, 2, 1, 1),
                 (4, 1, 2, 4, 1, 1), (4, 2, 1, 4, 2, 1), (2, 1, 1, 6, 1, 1), (2, 1, 2, 2, 4, 1),
                 (1, 2, 2, 8, 1, 1), (3, 1, 1, 3, 1, 3), (3, 2, 1, 2, 4, 1)]
_WGMMA: dict = {}


def _wgmma_kernel(K, nt, ks, epi, wg, mw, xs, zs, mb, xt=0, pp=0):
    key = (K, nt, ks, epi, wg, mw, xs, zs, mb, xt, pp)
    if key not in _WGMMA:
        name = f"wgmma_{K}_{nt}_{ks}_{epi}_{wg}_{mw}_{xs}_{zs}_{mb}_{xt}_{pp}"
        targs = f"{nt}, {ks}, {wg}, {mw}, {xs}, {zs}, {xt}, {pp}"
        src = f"""
#include "wgmma_q4.cuh"
extern "C" __global__ void __launch_bounds__({128 * wg}, {mb})
{name}(const uint4* q, const q38::bf16* s, const q38::bf16* x, int ldx, q38::bf16* y, int ldy,
       int N, int R, float* part, int* arrivals) {{
  q38::wgmma_q4<{K}, {nt}, {ks}, {epi}, {wg}, {mw}, {xs}, {zs}, {xt}, {pp}>(q, s, x, ldx, y, ldy,
                                                                           N, R, part, arrivals);
}}
static_assert(q38::WgmmaLaunch<{targs}>::threads == {128 * wg}, "");
static_assert(q38::WgmmaLaunch<{targs}>::dyn_smem_bytes ==
              {wgmma_smem(K, nt, wg, mw, xs, zs, xt)}, "plan.wgmma_smem");
static_assert(q38::WgmmaLaunch<{targs}>::part_floats == {wgmma_part_floats(K, nt, wg, mw)},
              "plan.wgmma_part_floats");
"""
        fn = build(src, arch="sm_90a").get_function(name)
        smem = wgmma_smem(K, nt, wg, mw, xs, zs, xt)
        allow_dynamic_smem(fn, smem)
        _WGMMA[key] = (fn, smem)
    return _WGMMA[key]


def _run_wgmma(k, qw, sc, x, y, N, R, nt, wg, mw, zs, ldx=None):
    """Launch wgmma_q4; returns the arrival counters (every launch must leave them at 0)."""
    import pycuda.gpuarray as ga

    fn, smem = k
    tiles = qw.shape[0]
    gx, gy = -(-tiles // (4 * wg * mw)), -(-R // (8 * nt))
    part = ga.empty(wgmma_part_floats(qw.shape[1] * 64, nt, wg, mw) * gx * gy, np.float32)
    part.fill(np.float32(np.nan))
    arrivals = ga.zeros(gx * gy, np.int32)
    fn(qw.gpudata, sc.gpudata, x.gpudata, np.int32(ldx or x.shape[1]), y.gpudata, np.int32(y.shape[1]),
       np.int32(N), np.int32(R), part.gpudata, arrivals.gpudata, block=(128 * wg, 1, 1),
       grid=(gx, gy, zs), shared=smem)
    return arrivals.get()


@pytest.mark.parametrize("N,K", [(3072 + 512 + 512, 512), (1280 + 768 + 32, 512), (96, 5120),
                                 (40, 1024), (5120, 6144), (5120, 17408)])
def test_wgmma_bitwise_equals_gemv(cuda_ctx, N, K):
    """wgmma_q4 gives gemv_q4's bits for every config, both epilogues, batches that are and are
    not multiples of the tile, an activation stride wider than K, weights whose rows do not fill
    the last warpgroup, and leaves its counters at 0; so the planner may pick it per shape and batch
    without touching a row's result."""
    rng = np.random.default_rng([N, K, 8])
    qweight, sc, wdq = _weights(rng, N, K)
    qw_d, sc_d = to_gpu(qweight), to_gpu(sc)
    ks = min(8, K // 128)
    tried = 0
    for nt, wg, mw, xs, zs, mb in WGMMA_CONFIGS:
        if ks % zs:
            continue
        for epi in (0, 1):
            fn = _wgmma_kernel(K, nt, ks, epi, wg, mw, xs, zs, mb)
            for R in (1, 3, 8 * nt, 8 * nt + 5):
                _against_gemv(rng, qw_d, sc_d, wdq, N, K, R, nt, ks, epi,
                              lambda x, y, R: _run_wgmma(fn, qw_d, sc_d, x, y, N, R, nt, wg, mw, zs),
                              f"N={N} K={K} wgmma {(nt, wg, mw, xs, zs, mb)}", pad=24)
                tried += 1
    assert tried
    print(f"wgmma_q4 N={N} K={K}: {tried} launches bitwise equal to gemv_q4")


# XT = 1 configs (NT, WG, MW, XS, ZS, MB, PP): the activations in tile order, one cp.async copy
# per group (ring stages 2 to 6, split K, 1 to 4 warpgroups, 8- to 64-row tiles, 24-row tiles),
# and PP = 1's
# two register sets (group counts even and odd, split K, 3 stages).
WGMMA_XT_CONFIGS = [(8, 1, 1, 4, 1, 2, 0), (8, 4, 1, 3, 8, 1, 0), (8, 2, 1, 2, 2, 1, 0),
                    (4, 2, 1, 4, 1, 1, 0), (2, 1, 2, 6, 1, 1, 0), (1, 2, 1, 3, 4, 1, 0),
                    (8, 1, 1, 4, 1, 2, 1), (4, 1, 1, 4, 1, 2, 1), (8, 2, 1, 3, 2, 1, 1),
                    (2, 2, 1, 4, 8, 1, 1), (3, 1, 1, 3, 1, 3, 0), (3, 1, 1, 4, 1, 2, 1),
                    (3, 1, 1, 2, 8, 3, 0)]


@pytest.mark.parametrize("N,K", [(3072 + 512 + 512, 512), (96, 5120), (5120, 17408),
                                 (640, 1024)])
def test_wgmma_xt_bitwise_equals_gemv(cuda_ctx, N, K):
    """wgmma_q4 with XT = 1 (and PP = 0 or 1), given x in tile order (weights.tile_activations,
    as the norm and SwiGLU write it), gives gemv_q4's bits on the same x in rows, for partial
    batch tiles, odd and even group counts per block and rows that do not fill the last
    warpgroup."""
    rng = np.random.default_rng([N, K, 10])
    qweight, sc, _ = _weights(rng, N, K)
    qw_d, sc_d = to_gpu(qweight), to_gpu(sc)
    ks = min(8, K // 128)
    tried = 0
    for nt, wg, mw, xs, zs, mb, pp in WGMMA_XT_CONFIGS:
        if ks % zs:
            continue
        for epi in (0, 1):
            fn = _wgmma_kernel(K, nt, ks, epi, wg, mw, xs, zs, mb, 1, pp)
            for R in (1, 8 * nt, 8 * nt + 5):
                _against_gemv(rng, qw_d, sc_d, None, N, K, R, nt, ks, epi,
                              lambda x, y, R: _run_wgmma(fn, qw_d, sc_d, x, y, N, R, nt, wg, mw, zs, ldx=K),
                              f"N={N} K={K} wgmma XT {(nt, wg, mw, xs, zs, mb, pp)}", tiled=True)
                tried += 1
    assert tried
    print(f"wgmma_q4 XT N={N} K={K}: {tried} launches bitwise equal to gemv_q4")


@pytest.mark.parametrize("N,K", [(8192 + 48, 1024), (512, 1536), (65536 + 16, 256),
                                 (24576 + 16, 256)])
def test_wgmma_program_configs_bitwise(cuda_ctx, N, K):
    """The configs plan.wgmma.wgmma_launch picks for the sm_90a program (in-projection-, long-K-,
    lm_head- and gate_up-sized weights) at btg 24, 32 and 64, with the activations in rows and,
    where the producer can write it, in tile order (XT = 1), give gemv_q4's bits, both
    epilogues."""
    rng = np.random.default_rng([N, K, 9])
    qweight, sc, _ = _weights(rng, N, K)
    qw_d, sc_d = to_gpu(qweight), to_gpu(sc)
    ks = min(8, K // 128)
    seen = set()
    for btg in (24, 32, 64):
        nt = btg // 8
        for R in (1, btg, btg + 5, 16 * btg):   # 16 * btg: a prefill chunk's rows
            for tiled in (False, True):   # the caller's producer can write the tile order
                wl = wgmma_launch(_role(N, K), N, K, btg, R, Tuning(), H200, xt=tiled)
                if wl is None:
                    continue
                wg, mw, xs, zs, mb, xt, pp = wl
                for epi in (0, 1):
                    fn = _wgmma_kernel(K, nt, ks, epi, wg, mw, xs, zs, mb, xt, pp)
                    _against_gemv(rng, qw_d, sc_d, None, N, K, R, nt, ks, epi,
                                  lambda x, y, R: _run_wgmma(fn, qw_d, sc_d, x, y, N, R, nt, wg, mw, zs, ldx=K),
                                  f"N={N} K={K} btg={btg} wgmma {wl}", tiled=bool(xt))
                    seen.add((btg, wl))
    if not seen:
        pytest.skip(f"the planner picks no wgmma_q4 launch for {N} x {K}")
    print(f"wgmma_q4 N={N} K={K}: program configs {sorted(seen)} bitwise equal to gemv_q4")


# wgmma_sk_q4 (kernels/wgmma_sk_q4.cuh): configs (NT, CW, XS, PP), each launched over grids of
# G blocks per batch tile that cut the (tile-block, part) units into whole tile-blocks, heads and
# tails (G <= TB), and middles too (G > TB: a tile-block over three or more blocks).
SK_CONFIGS = [(8, 3, 4, 0), (8, 2, 4, 1), (4, 4, 6, 0), (4, 2, 3, 1), (3, 2, 4, 0), (2, 2, 2, 1)]
_SK: dict = {}


def _sk_kernels(K: int, ks: int) -> dict:
    """The SK_CONFIGS instances of one K, both epilogues, in one module: (nt, cw, xs, pp, epi) ->
    (function, dynamic smem)."""
    if K not in _SK:
        src = ['#include "wgmma_sk_q4.cuh"']
        names = {}
        for nt, cw, xs, pp in SK_CONFIGS:
            for epi in (0, 1):
                name = f"sk_{K}_{nt}_{cw}_{xs}_{pp}_{epi}"
                targs = f"{nt}, {ks}, {cw}, {xs}"
                src.append(f"""
extern "C" __global__ void __launch_bounds__({128 * (cw + 1)}, 1)
{name}(const uint4* q, const q38::bf16* s, const q38::bf16* x, int ldx, q38::bf16* y, int ldy,
       int N, int R, float* part, int* arrivals) {{
  q38::wgmma_sk_q4<{K}, {nt}, {ks}, {epi}, {cw}, {xs}, {pp}>(q, s, x, ldx, y, ldy, N, R, part,
                                                            arrivals);
}}
static_assert(q38::WgmmaSkLaunch<{targs}>::dyn_smem_bytes == {sk_smem(8 * nt, cw, xs)},
              "plan.sk_smem");
static_assert(q38::WgmmaSkLaunch<{targs}>::pub_floats == {sk_pub_floats(8 * nt, cw)},
              "plan.sk_pub_floats");""")
                names[(nt, cw, xs, pp, epi)] = name
        mod = build("\n".join(src), arch="sm_90a")
        _SK[K] = {}
        for key, name in names.items():
            fn = mod.get_function(name)
            smem = sk_smem(8 * key[0], key[1], key[2])
            allow_dynamic_smem(fn, smem)
            _SK[K][key] = (fn, smem)
    return _SK[K]


def _run_sk(k, qw, sc, xt, y, N, R, nt, cw, G):
    """Launch wgmma_sk_q4 over G blocks per batch tile (x in tile order); returns the flags
    (every launch must leave them at 0)."""
    import pycuda.gpuarray as ga

    fn, smem = k
    tb = sk_grid(N, qw.shape[1] * 64, cw, H200)[1]
    gy = -(-R // (8 * nt))
    part = ga.empty(sk_pub_floats(8 * nt, cw) * tb * gy, np.float32)
    part.fill(np.float32(np.nan))
    arrivals = ga.zeros(tb * gy, np.int32)
    fn(qw.gpudata, sc.gpudata, xt.gpudata, np.int32(qw.shape[1] * 64), y.gpudata,
       np.int32(y.shape[1]), np.int32(N), np.int32(R), part.gpudata, arrivals.gpudata,
       block=(128 * (cw + 1), 1, 1), grid=(G, gy), shared=smem)
    return arrivals.get()


@pytest.mark.parametrize("N,K", [(24576 + 16, 256), (3072 + 512 + 512, 512), (96, 5120),
                                 (5120, 6144), (640, 1024)])
def test_wgmma_sk_bitwise_equals_gemv(cuda_ctx, N, K):
    """wgmma_sk_q4, given x in tile order, gives gemv_q4's bits on the same x in rows for every
    config and both epilogues, over grids that make heads, tails and middles (a tile-block's
    running sum handed over two or more times), partial batch tiles and several batch tiles, rows
    that do not fill the last tile-block, and leaves its flags at 0."""
    rng = np.random.default_rng([N, K, 18])
    qweight, sc, wdq = _weights(rng, N, K)
    qw_d, sc_d = to_gpu(qweight), to_gpu(sc)
    ks = min(8, K // 128)
    kern = _sk_kernels(K, ks)
    tried = 0
    for nt, cw, xs, pp in SK_CONFIGS:
        tb = -(-qweight.shape[0] // (4 * cw))
        grids = sorted({1, 3, min(tb, 7), min(132, tb * ks), tb * ks})
        for epi in (0, 1):
            for R, G in [(1, grids[-1]), (8 * nt, grids[0]), (8 * nt + 5, grids[1])] + \
                    [(3 * 8 * nt + 2, g) for g in grids[2:]]:
                k = kern[(nt, cw, xs, pp, epi)]
                _against_gemv(rng, qw_d, sc_d, wdq, N, K, R, nt, ks, epi,
                              lambda x, y, R: _run_sk(k, qw_d, sc_d, x, y, N, R, nt, cw, G),
                              f"N={N} K={K} wgmma_sk {(nt, cw, xs, pp, G)}", tiled=True)
                tried += 1
    assert tried
    print(f"wgmma_sk_q4 N={N} K={K}: {tried} launches bitwise equal to gemv_q4")


@pytest.mark.parametrize("N,K", [(8192 + 48, 1024), (65536 + 16, 256), (24576 + 16, 256)])
def test_wgmma_sk_program_configs_bitwise(cuda_ctx, N, K):
    """The configs and grids plan.wgmma.sk_launch / sk_grid give the sm_90a program (in-projection-,
    lm_head- and gate_up-sized weights) at btg 24, 32 and 64 give gemv_q4's bits, both epilogues."""
    rng = np.random.default_rng([N, K, 19])
    qweight, sc, _ = _weights(rng, N, K)
    qw_d, sc_d = to_gpu(qweight), to_gpu(sc)
    ks = min(8, K // 128)
    seen = set()
    for btg in (24, 32, 64):
        nt = btg // 8
        sk = sk_launch(_role(N, K), btg, Tuning())
        if sk is None:
            continue
        cw, xs, pp = sk
        G, _ = sk_grid(N, K, cw, H200)
        src = ['#include "wgmma_sk_q4.cuh"']
        for epi in (0, 1):
            src.append(f"""
extern "C" __global__ void __launch_bounds__({128 * (cw + 1)}, 1)
skp_{epi}(const uint4* q, const q38::bf16* s, const q38::bf16* x, int ldx, q38::bf16* y, int ldy,
          int N, int R, float* part, int* arrivals) {{
  q38::wgmma_sk_q4<{K}, {nt}, {ks}, {epi}, {cw}, {xs}, {pp}>(q, s, x, ldx, y, ldy, N, R, part,
                                                            arrivals);
}}""")
        mod = build("\n".join(src), arch="sm_90a")
        fns = {}
        for epi in (0, 1):
            fns[epi] = (mod.get_function(f"skp_{epi}"), sk_smem(btg, cw, xs))
            allow_dynamic_smem(fns[epi][0], fns[epi][1])
        for R in (1, btg, btg + 5, 16 * btg):   # 16 * btg: a prefill chunk's rows
            for epi in (0, 1):
                _against_gemv(rng, qw_d, sc_d, None, N, K, R, nt, ks, epi,
                              lambda x, y, R: _run_sk(fns[epi], qw_d, sc_d, x, y, N, R, nt, cw, G),
                              f"N={N} K={K} btg={btg} wgmma_sk {sk} G={G}", tiled=True)
                seen.add((btg, sk, G))
    if not seen:
        pytest.skip(f"the planner picks no wgmma_sk_q4 launch for {N} x {K}")
    print(f"wgmma_sk_q4 N={N} K={K}: program configs {sorted(seen)} bitwise equal to gemv_q4")


# wgmma_sk_q4 with EPI_SWIGLU (version 19): a tile-block of 2·CW gate and 2·CW up m-tiles, the
# SwiGLU written in the down projection's activation tile order. Features F (multiples of 128,
# as the tile order needs): the tiny model's, a 27B-like K, and K = 128 (KS = 1).
SK_SWIGLU_SHAPES = [(1024, 512), (384, 5120), (256, 128)]
SK_SWIGLU_CONFIGS = [(8, 3, 4, 0), (8, 2, 4, 1), (4, 4, 6, 0), (3, 4, 6, 0), (2, 2, 2, 1)]


@pytest.mark.parametrize("F,K", SK_SWIGLU_SHAPES)
def test_wgmma_sk_swiglu_bitwise(cuda_ctx, F, K):
    """wgmma_sk_q4's SwiGLU epilogue over a fused [gate; up] weight gives, in tile order, the
    bits of gemv_q4 (EPI_STORE) followed by the swiglu kernel's arithmetic, for every config over
    grids that make whole tile-blocks, heads, middles and tails, partial and several batch tiles;
    rows past R are not written and the flags are left at 0."""
    import pycuda.gpuarray as ga

    rng = np.random.default_rng([F, K, 19])
    gq, gs, _ = _weights(rng, F, K)
    uq, us, _ = _weights(rng, F, K)
    qw_d, sc_d = to_gpu(np.concatenate([gq, uq])), to_gpu(np.concatenate([gs, us]))
    ks = min(8, K // 128)
    src = ['#include "wgmma_sk_q4.cuh"']
    for nt, cw, xs, pp in SK_SWIGLU_CONFIGS:
        src.append(f"""
extern "C" __global__ void __launch_bounds__({128 * (cw + 1)}, 1)
sks_{nt}_{cw}_{xs}_{pp}(const uint4* q, const q38::bf16* s, const q38::bf16* x, int ldx,
                        q38::bf16* y, int ldy, int N, int R, float* part, int* arrivals) {{
  q38::wgmma_sk_q4<{K}, {nt}, {ks}, q38::EPI_SWIGLU, {cw}, {xs}, {pp}>(q, s, x, ldx, y, ldy, N, R,
                                                                      part, arrivals);
}}
static_assert(q38::WgmmaSkLaunch<{nt}, {ks}, {cw}, {xs}>::dyn_smem_bytes +
              q38::WgmmaSkLaunch<{nt}, {ks}, {cw}, {xs}>::swiglu_bytes ==
              {sk_smem(8 * nt, cw, xs, EPI_SWIGLU)}, "plan.sk_smem");""")
    src.append(SWIGLU_REF)
    mod = build("\n".join(['#include "elementwise.cuh"'] + src), arch="sm_90a")
    ref_fn = mod.get_function("swiglu_ref")
    tried = 0
    for nt, cw, xs, pp in SK_SWIGLU_CONFIGS:
        fn = mod.get_function(f"sks_{nt}_{cw}_{xs}_{pp}")
        smem = sk_smem(8 * nt, cw, xs, EPI_SWIGLU)
        allow_dynamic_smem(fn, smem)
        G_prog, tb = sk_grid(2 * F, K, cw, H200)
        grids = sorted({1, 3, min(tb, 7), G_prog, tb * ks})
        for R, G in [(1, G_prog), (8 * nt, grids[0]), (8 * nt + 5, grids[1])] + \
                [(3 * 8 * nt + 2, g) for g in grids[2:]]:
            xh = rng.standard_normal((R, K)).astype(np.float32).astype(BF16)
            x, xt = to_gpu(xh), to_gpu(wq.tile_activations(xh, nt))
            gu = poisoned((R, 2 * F), BF16)
            _run(_kernel(K, 1, nt, ks, 0), qw_d, sc_d, x, gu, 2 * F, R, 1, nt, ks)
            want = poisoned((R, F), BF16)
            ref_fn(gu.gpudata, np.int32(2 * F), np.int32(F), want.gpudata, np.int32(F),
                   block=(32, 1, 1), grid=(-(-F // 256), R))
            gy = -(-R // (8 * nt))
            got = poisoned((gy * 8 * nt * F,), BF16)
            part = ga.empty(sk_pub_floats(8 * nt, cw) * tb * gy, np.float32)
            part.fill(np.float32(np.nan))
            arrivals = ga.zeros(tb * gy, np.int32)
            fn(qw_d.gpudata, sc_d.gpudata, xt.gpudata, np.int32(K), got.gpudata, np.int32(F),
               np.int32(F), np.int32(R), part.gpudata, arrivals.gpudata,
               block=(128 * (cw + 1), 1, 1), grid=(G, gy), shared=smem)
            what = f"F={F} K={K} sk swiglu {(nt, cw, xs, pp)} G={G} R={R}"
            assert not arrivals.get().any(), f"{what}: flags left"
            flat = got.get().view(np.uint16)
            idx = wq.xtile_index(R, F, nt).ravel()
            rows = flat[idx].reshape(R, F)
            assert np.array_equal(rows, want.get().view(np.uint16)), f"{what}: bits differ"
            pad = np.ones(flat.size, bool)
            pad[idx] = False
            assert np.isnan(flat[pad].view(BF16).astype(np.float32)).all(), f"{what}: padding rows written"
            tried += 1
    print(f"wgmma_sk_q4 EPI_SWIGLU F={F} K={K}: {tried} launches bitwise equal to gemv_q4 + swiglu")

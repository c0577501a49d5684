"""The small ops of kernels/elementwise.cuh on the GPU against numpy (tests/gpu/ref_ops.py).

Widths of the tiny and the 27B geometry; rows 1, 3, 17; fresh random inputs; NaN- or
0x7f-poisoned outputs. Exact comparison wherever the math allows it: gathers, the residual add
(an fp32 sum of two bf16 rounded once, as numpy does it), argmax/top-k (comparisons of stored
values; rows with planted exact ties).
"""

from __future__ import annotations

import numpy as np
import pytest

from tests.gpu import ref_ops as ref
from tests.gpu.harness import BF16, build, poisoned, rel_err, to_gpu

# swiglu: one bf16 rounding of silu(g)·u (≤ 2^-8 relative per element, 2^-9 typical), plus the
# relative error of __expf (~2^-21) in fp32. Per element: |got − ref| ≤ SWIGLU_ELEM·|ref| + 1e-37
# (the absolute part covers results below fp32's normal range); in norm: SWIGLU_TOL.
SWIGLU_ELEM = 2.0 ** -8 + 1e-5
SWIGLU_TOL = 4e-3

ROWS = [1, 3, 17]
HD = [512, 5120]             # hidden: tiny, 27B
TILE_NT = [1, 3, 8]          # wgmma_q4's activation tile order (XT = 1): 8-, 24- and 64-row tiles
FF = [1024, 17408]           # intermediate: tiny, 27B
VOCAB = [1024, 248320]       # vocab: tiny, 27B
TOPK = [(1024, 1), (1024, 5), (1024, 16), (248320, 8), (248320, 16)]
DTYPES = {"bf16": ("q38::bf16", BF16), "f32": ("float", np.dtype(np.float32))}


def _entries():
    """(C name, launch struct, instantiation call, C signature) of every entry point."""
    e = []
    for hd in HD:
        e.append((f"embed_{hd}", f"q38::EmbedLaunch<{hd}>",
                  "(const bf16* E, const int* tok, bf16* x)", f"q38::embed_gather<{hd}>(E, tok, x)"))
        e.append((f"residual_{hd}", f"q38::ResidualLaunch<{hd}>",
                  "(bf16* x, const bf16* y, int R)", f"q38::residual_add<{hd}>(x, y, R)"))
    for f in FF:
        e.append((f"swiglu_{f}", f"q38::SwigluLaunch<{f}>", "(const bf16* gu, bf16* h, int R)",
                  f"q38::swiglu<{f}>(gu, h, R)"))
        for nt in TILE_NT:
            e.append((f"swiglu_{f}_t{nt}", f"q38::SwigluLaunch<{f}, {nt}>",
                      "(const bf16* gu, bf16* h, int R)", f"q38::swiglu<{f}, {nt}>(gu, h, R)"))
    for dn, (ct, _) in DTYPES.items():
        for v in VOCAB:
            e.append((f"argmax_{dn}_{v}", f"q38::ArgmaxLaunch<{ct}, {v}>",
                      f"(const {ct}* l, int* idx, float* val)",
                      f"q38::argmax_rows<{ct}, {v}>(l, idx, val)"))
        for v, k in TOPK:
            e.append((f"topk_{dn}_{v}_{k}", f"q38::TopkLaunch<{ct}, {v}, {k}>",
                      f"(const {ct}* l, float* val, int* idx)",
                      f"q38::topk_rows<{ct}, {v}, {k}>(l, val, idx)"))
    e.append(("advance_pos", "q38::AdvanceLaunch", "(int* pos, const int* ntok, int B)",
              "q38::advance_pos(pos, ntok, B)"))
    return e


_MOD: dict = {}


def _kernel(name: str):
    """(function, threads) of an entry point; threads is read from the C++ launch struct."""
    if not _MOD:
        import pycuda.driver as drv

        src = ['#include "elementwise.cuh"', "using q38::bf16;"]
        for n, launch, sig, call in _entries():
            src.append(f'extern "C" __constant__ int threads_{n} = {launch}::threads;')
            src.append(f'extern "C" __global__ void __launch_bounds__(({launch}::threads))\n'
                       f"{n}{sig} {{ {call}; }}")
        mod = build("\n".join(src) + "\n")
        for n, *_ in _entries():
            ptr, _ = mod.get_global(f"threads_{n}")
            t = np.zeros(1, np.int32)
            drv.memcpy_dtoh(t, ptr)
            _MOD[n] = (mod.get_function(n), int(t[0]))
    return _MOD[name]


def _bf16(a) -> np.ndarray:
    return np.asarray(a, dtype=np.float32).astype(BF16)


# --------------------------------------------------------------------------------------------------
# device runners (one per op): host arrays in, host arrays out

def _gpu_embed(E, tok):
    fn, nt = _kernel(f"embed_{E.shape[1]}")
    E_d, tok_d = to_gpu(E), to_gpu(tok.astype(np.int32))
    x = poisoned((len(tok), E.shape[1]), BF16)
    fn(E_d.gpudata, tok_d.gpudata, x.gpudata, block=(nt, 1, 1), grid=(len(tok), 1))
    return x.get()


def _gpu_swiglu(gu, F, tile_nt=0):
    """h [R, F], or (tile_nt > 0) the flat tile-order buffer of whole 8·tile_nt-row tiles."""
    fn, nt = _kernel(f"swiglu_{F}" + (f"_t{tile_nt}" if tile_nt else ""))
    R = gu.shape[0]
    gu_d = to_gpu(gu)
    h = poisoned((-(-R // (8 * tile_nt)) * 8 * tile_nt * F,) if tile_nt else (R, F), BF16)
    grid = (F // 128, -(-R // 16)) if tile_nt else (-(-(F // 8) // nt), R)   # SwigluLaunch
    fn(gu_d.gpudata, h.gpudata, np.int32(R), block=(nt, 1, 1), grid=grid)
    return h.get()


def _gpu_residual(x, y):
    R, W = x.shape
    fn, nt = _kernel(f"residual_{W}")
    x_d, y_d = to_gpu(x), to_gpu(y)
    fn(x_d.gpudata, y_d.gpudata, np.int32(R), block=(nt, 1, 1), grid=(-(-(R * W // 8) // nt), 1))
    return x_d.get()


def _gpu_argmax(logits, dn):
    R, V = logits.shape
    fn, nt = _kernel(f"argmax_{dn}_{V}")
    l_d = to_gpu(logits)
    idx, val = poisoned((R,), np.int32), poisoned((R,), np.float32)
    fn(l_d.gpudata, idx.gpudata, val.gpudata, block=(nt, 1, 1), grid=(R, 1))
    return idx.get(), val.get()


def _gpu_topk(logits, dn, k):
    R, V = logits.shape
    fn, nt = _kernel(f"topk_{dn}_{V}_{k}")
    l_d = to_gpu(logits)
    val, idx = poisoned((R, k), np.float32), poisoned((R, k), np.int32)
    fn(l_d.gpudata, val.gpudata, idx.gpudata, block=(nt, 1, 1), grid=(R, 1))
    return val.get(), idx.get()


def _gpu_advance(pos, ntok):
    fn, nt = _kernel("advance_pos")
    B = len(pos)
    pos_d, ntok_d = to_gpu(pos.astype(np.int32)), to_gpu(ntok.astype(np.int32))
    fn(pos_d.gpudata, ntok_d.gpudata, np.int32(B), block=(nt, 1, 1), grid=(-(-B // nt), 1))
    return pos_d.get()


# --------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("hd", HD)
def test_embed_gather(cuda_ctx, hd):
    rng = np.random.default_rng([hd, 1])
    V = 300
    E = _bf16(rng.standard_normal((V, hd)))
    for R in ROWS:
        tok = rng.integers(0, V, size=R)
        tok[0] = V - 1                      # the last row of the table
        if R > 2:
            tok[1:3] = [0, tok[0]]           # the first row; a repeated token
        x = _gpu_embed(E, tok)
        assert np.array_equal(x.view(np.uint16), E[tok].view(np.uint16)), f"R={R}: rows differ"
    print(f"embed_gather HD={hd}: exact for R {ROWS}")


@pytest.mark.parametrize("F", FF)
def test_swiglu(cuda_ctx, F):
    rng = np.random.default_rng([F, 2])
    worst = 0.0
    for R in ROWS:
        gu = rng.standard_normal((R, 2 * F)) * 2.0
        gu[0, :8] = [-100.0, -60.0, -20.0, -1.0, -0.0, 1.0, 20.0, 60.0]  # saturating sigmoid
        gu = _bf16(gu)
        h = _gpu_swiglu(gu, F).astype(np.float64)
        want = ref.swiglu(gu, F)
        bad = np.abs(h - want) > SWIGLU_ELEM * np.abs(want) + 1e-37
        e = rel_err(h, want)
        worst = max(worst, e)
        assert not bad.any(), f"R={R}: {bad.sum()} elements off by more than {SWIGLU_ELEM:.2e} rel"
        assert e < SWIGLU_TOL, f"R={R}: rel err {e:.2e}"
    print(f"swiglu F={F}: worst rel err {worst:.2e} over R {ROWS}")


@pytest.mark.parametrize("W", HD)
def test_residual_add(cuda_ctx, W):
    rng = np.random.default_rng([W, 3])
    for R in ROWS:
        x = _bf16(rng.standard_normal((R, W)) * 4.0)
        y = _bf16(rng.standard_normal((R, W)))
        got = _gpu_residual(x, y)
        want = (x.astype(np.float32) + y.astype(np.float32)).astype(BF16)
        assert np.array_equal(got.view(np.uint16), want.view(np.uint16)), f"R={R}: sums differ"
    print(f"residual_add W={W}: exact for R {ROWS}")


def _logits(rng, V: int, dt, with_inf_row: bool) -> np.ndarray:
    """17 rows with planted exact maxima: at 0, at V−1, ties across vectors, warps and threads,
    ties inside one vector, a constant row, (optionally) a row of −inf; then random ties."""
    R = 17
    x = rng.standard_normal((R, V)).astype(np.float32) * 3.0
    top = np.float32(100.0)                 # exact in bf16; far above N(0, 3) samples
    plants = [[], [0], [V - 1], [V - 1, 5], [V // 2 + 3, V // 5 + 1, V - 9], [17, 18]]
    for r, ids in enumerate(plants):
        x[r, ids] = top
    x[6] = 1.5                              # constant row: index 0, and 0..k−1 for top-k
    if with_inf_row:
        x[7] = -np.inf                      # documented: index 0
    for r in range(8, R):
        x[r, rng.choice(V, size=rng.integers(2, 5), replace=False)] = top
    return x.astype(dt)


@pytest.mark.parametrize("dn", list(DTYPES))
@pytest.mark.parametrize("V", VOCAB)
def test_argmax_rows(cuda_ctx, dn, V):
    rng = np.random.default_rng([V, 4, len(dn)])
    logits = _logits(rng, V, DTYPES[dn][1], with_inf_row=True)
    for R in ROWS:
        idx, val = _gpu_argmax(logits[:R], dn)
        want_i, want_v = ref.argmax_rows(logits[:R])
        assert np.array_equal(idx, want_i), f"R={R}: index {idx} != {want_i}"
        assert np.array_equal(val, want_v.astype(np.float32)), f"R={R}: value {val} != {want_v}"
    print(f"argmax_rows {dn} V={V}: exact for R {ROWS} (17 rows with planted ties)")


@pytest.mark.parametrize("dn", list(DTYPES))
@pytest.mark.parametrize("V,k", TOPK)
def test_topk_rows(cuda_ctx, dn, V, k):
    rng = np.random.default_rng([V, k, 5, len(dn)])
    logits = _logits(rng, V, DTYPES[dn][1], with_inf_row=False)
    for R in ROWS:
        val, idx = _gpu_topk(logits[:R], dn, k)
        want_v, want_i = ref.topk_rows(logits[:R], k)
        assert np.array_equal(idx, want_i), f"R={R}: indices {idx} != {want_i}"
        assert np.array_equal(val, want_v.astype(np.float32)), f"R={R}: values differ"
    print(f"topk_rows {dn} V={V} k={k}: exact for R {ROWS}")


@pytest.mark.parametrize("B", [1, 5, 300])
def test_advance_pos(cuda_ctx, B):
    rng = np.random.default_rng([B, 6])
    pos = rng.integers(0, 200000, size=B)
    ntok = rng.integers(1, 17, size=B)
    assert np.array_equal(_gpu_advance(pos, ntok), pos + ntok)
    print(f"advance_pos B={B}: exact")


@pytest.mark.parametrize("F", FF)
@pytest.mark.parametrize("tile_nt", TILE_NT)
def test_swiglu_tile_order(cuda_ctx, F, tile_nt):
    """swiglu<F, TNT> writes the same bits as swiglu<F>, each at its place in wgmma_q4's
    activation tile order (weights.xtile_index), and nothing in the padding rows."""
    from qwen38gen.weights import xtile_index

    rng = np.random.default_rng([F, tile_nt, 3])
    for R in (1, 8 * tile_nt - 1, 8 * tile_nt, 8 * tile_nt + 3):
        gu = _bf16(rng.standard_normal((R, 2 * F)) * 2.0)
        rows = _gpu_swiglu(gu, F).view(np.uint16)
        tiled = _gpu_swiglu(gu, F, tile_nt).view(np.uint16)
        idx = xtile_index(R, F, tile_nt)
        assert np.array_equal(tiled[idx], rows), f"R={R}: tile-order values differ"
        rest = np.ones(tiled.size, bool)
        rest[idx.ravel()] = False
        assert np.isnan(tiled[rest].view(BF16).astype(np.float32)).all(), \
            f"R={R}: padding rows written"
    print(f"swiglu F={F} TNT={tile_nt}: tile order exact")

"""gemv_cv (kernels/gemv_cv.cuh, docs/GEMV_MAINLOOP.md step 1) on the GPU against its numpy twin
(weights.gemv_cv_reference: Ŵ = bf16(q · s), fp64 parts added in order).

Fresh random weights and activations per case, NaN-poisoned outputs in buffers wider and longer
than the result (nothing outside it may be written), an activation stride wider than K; batch
sizes 1 ... 33 at both batch tiles (NT = 1, 2); every schedule (ring depth ST, m-tiles per block
WM, walk, grid, the next x in flight XP, m-tiles per warp MI, the bulk-copy loader LB) bitwise
equal to the plain one and every R and NT bitwise equal to R = 33; the
residual-add epilogue bitwise equal to its formula over the store's bits; and activations of ±1
on scales of one binade, where every fp32 sum is exact whatever its order, so the kernel's bits
must be numpy's bf16 of the exact Ŵ sum (which tells Ŵ from today's W~ = q · s).

Every kernel is one translation unit (`source()`), compiled by the project's gate; the CPU test
tests/test_gemv_cv.py compiles the same unit with nvcc and checks its ptxas report.
"""

from __future__ import annotations

import numpy as np
import pytest

from qwen38gen import weights as wq
from qwen38gen.plan.gemv import gemv_cv_launch, gemv_cv_xp
from tests.gpu.harness import BF16, rel_err, to_gpu

# (N, K): the tiny geometry's fused shapes, 27B-like K (5120, 17408), N not a multiple of 16
# (40, 200), and K = 2176 (17 groups: parts of 2 and one of 3, an uneven split).
SHAPES = [(3072 + 512 + 512, 512), (512, 1024), (1280 + 768 + 32, 512), (96, 5120), (40, 1024),
          (5120, 17408), (200, 2176)]
ROWS = [1, 2, 3, 8, 9, 16, 17, 33]
BASE = (4, 1, 0, 1, 1, 0)   # (ST, WM, WALK, XP, MI, LB) of the plain schedule
# Schedules whose bits must equal BASE's: ring depths 2 to 16 (more stages than a part has
# groups at K = 512 and 1024), two m-tiles per block, the grid-stride walk, x without the next
# group in flight (XP = 0, version 30's consumer), 2 to 4 m-tiles per consumer warp (MI, with
# rounds that end part-way through a warp's m-tiles), the bulk-copy loader (LB = 1, version 32;
# with MI, its slots of fewer than MI m-tiles copy only theirs).
SCHEDULES = [(2, 1, 1, 1, 1, 0), (8, 1, 0, 1, 1, 0), (3, 2, 1, 1, 1, 0), (5, 2, 0, 1, 1, 0),
             (16, 1, 1, 1, 1, 0), (4, 1, 0, 0, 1, 0), (3, 2, 1, 0, 1, 0), (4, 1, 0, 0, 2, 0),
             (2, 1, 1, 0, 4, 0), (3, 1, 0, 0, 3, 0),
             (4, 1, 0, 0, 1, 1), (8, 1, 0, 0, 1, 1), (3, 2, 1, 0, 1, 1), (2, 1, 1, 0, 3, 1)]
ADD_SCHEDULES = [BASE, (3, 2, 1, 1, 1, 0), (4, 1, 0, 0, 2, 0), (4, 1, 0, 0, 1, 1)]   # EPI_ADD too
# AR = 1 (gemv_q4's arithmetic in gemv_cv's structure, version 32): these schedules must give
# gemv_q4's bits (its instance <K, 1, NT, KS, EPI_STORE, 2, 0, 0> is in the unit).
Q4_SCHEDULES = [(4, 1, 0, 0, 1, 0), (4, 1, 0, 0, 1, 1), (8, 1, 0, 0, 1, 1), (3, 1, 1, 0, 2, 1),
                (2, 1, 1, 0, 1, 0)]

# bf16 output: each element is rounded once (relative < 2^-8); the fp32 sums are far below that.
TOL = 4e-3


def ks_of(k: int) -> int:
    return min(8, k // 128)


def name(k, nt, ks, epi, st, wm, walk, xp, mi, lb, ar) -> str:
    return f"cv_{k}_{nt}_{ks}_{epi}_{st}_{wm}_{walk}_{xp}_{mi}_{lb}_{ar}"


def q4_name(k, nt, ks) -> str:
    return f"q4_{k}_{nt}_{ks}"


def instances() -> list[tuple[int, ...]]:
    """(K, NT, KS, EPI, ST, WM, WALK, XP, MI, LB, AR) of every gemv_cv kernel the tests launch:
    KS(K) at every schedule and both epilogues, KS = 1 (GEMV_MAINLOOP.md §2's one-chain variant)
    at BASE, and Q4_SCHEDULES with AR = 1."""
    out = []
    for k in sorted({k for _, k in SHAPES}):
        for nt in (1, 2):
            for sched in [BASE] + SCHEDULES:
                out.append((k, nt, ks_of(k), 0) + fit(nt, ks_of(k), sched))
            for sched in ADD_SCHEDULES:
                out.append((k, nt, ks_of(k), 1) + fit(nt, ks_of(k), sched))
            out.append((k, nt, 1, 0) + fit(nt, 1, BASE))
            for sched in Q4_SCHEDULES:
                out.append((k, nt, ks_of(k), 0) + fit(nt, ks_of(k), sched, ar=1))
    return list(dict.fromkeys(out))


def fit(nt: int, ks: int, sched: tuple, ar: int = 0) -> tuple:
    """sched with XP = 0 where the instance cannot hold the next group's x (gemv_cv_xp), and
    the arithmetic AR."""
    st, wm, walk, xp, mi, lb = sched
    return st, wm, walk, gemv_cv_xp(nt, ks, wm, xp), mi, lb, ar


def source() -> str:
    """The translation unit of every instance, each with its launch figures pinned against
    plan.gemv.gemv_cv_launch."""
    src = ['#include "gemv_cv.cuh"']
    for inst in instances():
        k, nt, ks, epi, st, wm, walk, xp, mi, lb, ar = inst
        threads, smem = gemv_cv_launch(nt, ks, st, wm, mi)
        src.append(f"""
extern "C" __global__ void __launch_bounds__({threads}, 1)
{name(*inst)}(const uint4* q, const q38::bf16* s, const q38::bf16* x, int ldx, q38::bf16* y,
              int ldy, int N, int R) {{
  q38::gemv_cv<{k}, {nt}, {ks}, {epi}, {st}, {wm}, {walk}, {xp}, {mi}, {lb}, {ar}>(q, s, x, ldx, y, ldy, N, R);
}}
static_assert(q38::GemvCvLaunch<{nt}, {ks}, {st}, {wm}, {mi}>::threads == {threads} &&
              q38::GemvCvLaunch<{nt}, {ks}, {st}, {wm}, {mi}>::dyn_smem_bytes == {smem},
              "plan.gemv.gemv_cv_launch");""")
    for k, nt, ks in sorted({(i[0], i[1], i[2]) for i in instances() if i[10]}):
        src.append(f"""
extern "C" __global__ void __launch_bounds__({32 * ks}, 1)
{q4_name(k, nt, ks)}(const uint4* q, const q38::bf16* s, const q38::bf16* x, int ldx, q38::bf16* y,
              int ldy, int N, int R) {{
  q38::gemv_q4<{k}, 1, {nt}, {ks}, q38::EPI_STORE, 2, 0, 0>(q, s, x, ldx, y, ldy, N, R);
}}""")
    return "\n".join(src) + "\n"


_MOD: dict = {}


def _module():
    """The module of the gate's cubin of source(), loaded once."""
    if "mod" not in _MOD:
        import pycuda.driver as drv

        from qwen38gen.gate import compile_kernels

        _MOD["mod"] = drv.module_from_file(compile_kernels(source(), "gemv_cv_test.cu",
                                                           arch="sm_90a").cubin)
        _MOD["fns"] = {}
    return _MOD["mod"]


def _kernel(k, nt, ks, epi, st, wm, walk, xp, mi, lb, ar):
    """(function, threads, dynamic smem) of one instance, from the gate's cubin of source()."""
    mod = _module()
    key = (k, nt, ks, epi, st, wm, walk, xp, mi, lb, ar)
    if key not in _MOD["fns"]:
        from qwen38gen.runtime import allow_dynamic_smem

        fn = mod.get_function(name(*key))
        threads, smem = gemv_cv_launch(nt, ks, st, wm, mi)
        allow_dynamic_smem(fn, smem)
        _MOD["fns"][key] = (fn, threads, smem)
    return _MOD["fns"][key]


def _grids(tiles: int, per: int) -> list[int]:
    """Grids to walk (per: m-tiles a block covers a round, WM·MI): one round per block, a single
    block, 7 and 132 blocks (rounds over several m-tiles, ranges that differ by one), more blocks
    than m-tiles (idle blocks)."""
    return sorted({-(-tiles // per), 1, 7, 132, tiles + 5})


class Case:
    """One weight on the device, with its launches."""

    def __init__(self, codes, scales):
        self.N, self.K = codes.shape
        self.qweight, self.sc = wq.pack_int4(codes, scales)
        self.qw_d, self.sc_d = to_gpu(self.qweight), to_gpu(self.sc)
        self.tiles = self.qweight.shape[0]

    @classmethod
    def random(cls, rng, N, K):
        w = (rng.standard_normal((N, K)) / np.sqrt(K)).astype(np.float32)
        return cls(*wq.quantize_int4(w))

    def run(self, xh, nt, ks=None, epi=0, sched=BASE, G=None, res=None, ar=0):
        """y for x = xh (bf16 [R, K + pad], the stride wider than K) in a NaN-poisoned buffer 3
        rows and 8 columns larger (EPI_ADD: res there, the margin still NaN); checks the margin
        and returns y [R, N] (bf16)."""
        R = xh.shape[0]
        N, K = self.N, self.K
        ks = ks or ks_of(K)
        st, wm, walk, xp, mi, lb, ar = fit(nt, ks, sched, ar)
        fn, threads, smem = _kernel(K, nt, ks, epi, st, wm, walk, xp, mi, lb, ar)
        host = np.full((R + 3, N + 8), np.nan, np.float32).astype(BF16)
        if epi:
            host[:R, :N] = res
        y = to_gpu(host)
        G = G or -(-self.tiles // (wm * mi))
        fn(self.qw_d.gpudata, self.sc_d.gpudata, to_gpu(xh).gpudata, np.int32(xh.shape[1]),
           y.gpudata, np.int32(N + 8), np.int32(N), np.int32(R),
           block=(threads, 1, 1), grid=(G, -(-R // (8 * nt))), shared=smem)
        out = y.get()
        margin = np.concatenate([out[R:].ravel(), out[:R, N:].ravel()]).astype(np.float32)
        assert np.isnan(margin).all(), f"N={N} K={K} R={R} {sched} G={G}: wrote outside y"
        return out[:R, :N]

    def run_q4(self, xh, nt):
        """gemv_q4's y for x = xh (MT 1, ST 2, register stages: the program's one-row schedule)."""
        R = xh.shape[0]
        N, K = self.N, self.K
        ks = ks_of(K)
        fn = _module().get_function(q4_name(K, nt, ks))
        y = to_gpu(np.full((R, N), np.nan, np.float32).astype(BF16))
        fn(self.qw_d.gpudata, self.sc_d.gpudata, to_gpu(xh).gpudata, np.int32(xh.shape[1]),
           y.gpudata, np.int32(N), np.int32(N), np.int32(R),
           block=(32 * ks, 1, 1), grid=(self.tiles, -(-R // (8 * nt))))
        return y.get()

    def twin(self, x, ks=None):
        return wq.gemv_cv_reference(self.qweight, self.sc, (self.N, self.K), x, ks or ks_of(self.K))


def _x(rng, R, K, pad=24):
    return rng.standard_normal((R, K + pad)).astype(np.float32).astype(BF16)


def _bits(a):
    return np.ascontiguousarray(a).view(np.uint16)


def _add(res, y):
    """EPI_ADD's arithmetic over EPI_STORE's bits: bf16(f32(res) + f32(bf16(acc)))."""
    return (res.astype(np.float32) + y.astype(np.float32)).astype(BF16)


@pytest.mark.parametrize("N,K", SHAPES)
def test_gemv_cv_twin_and_every_R(cuda_ctx, N, K):
    """Within TOL of the twin at every R and NT (KS(K) and KS = 1), and row r's bits the same at
    every R and NT as in the 33-row launch."""
    rng = np.random.default_rng([N, K, 21])
    case = Case.random(rng, N, K)
    x = _x(rng, 33, K)
    worst = 0.0
    for ks in (ks_of(K), 1):
        full = case.run(x, 1, ks)
        ref = case.twin(x[:, :K], ks)
        for nt in (1, 2):
            for R in ROWS:
                got = case.run(x[:R], nt, ks)
                e = rel_err(got, ref[:R])
                worst = max(worst, e)
                assert e < TOL, f"N={N} K={K} KS={ks} NT={nt} R={R}: rel err {e:.2e}"
                assert np.array_equal(_bits(got), _bits(full[:R])), \
                    f"N={N} K={K} KS={ks} NT={nt} R={R}: rows differ from the 33-row launch"
    print(f"gemv_cv N={N} K={K}: worst rel err {worst:.2e} against the twin over R {ROWS}")


@pytest.mark.parametrize("N,K", SHAPES)
def test_gemv_cv_schedules_bitwise(cuda_ctx, N, K):
    """ST, WM, the walk, XP, MI, the loader (LB) and the grid only reschedule the same
    arithmetic: every schedule gives BASE's bits; EPI_ADD gives bitwise bf16(res + y_store)."""
    rng = np.random.default_rng([N, K, 22])
    case = Case.random(rng, N, K)
    tried = 0
    for R in (1, 9, 33):
        x = _x(rng, R, K)
        res = rng.standard_normal((R, N)).astype(np.float32).astype(BF16)
        want = case.run(x, 1)
        want_add = _add(res, want)
        for nt in (1, 2):
            for sched in [BASE] + SCHEDULES:
                for G in _grids(case.tiles, sched[1] * sched[4]):
                    got = case.run(x, nt, sched=sched, G=G)
                    assert np.array_equal(_bits(got), _bits(want)), \
                        f"N={N} K={K} R={R} NT={nt} {sched} G={G}: bits differ from BASE"
                    tried += 1
                    if sched in ADD_SCHEDULES:
                        got = case.run(x, nt, epi=1, sched=sched, G=G, res=res)
                        assert np.array_equal(_bits(got), _bits(want_add)), \
                            f"N={N} K={K} R={R} NT={nt} {sched} G={G}: EPI_ADD bits differ"
                        tried += 1
    print(f"gemv_cv N={N} K={K}: {tried} launches bitwise equal to BASE")


@pytest.mark.parametrize("N,K", SHAPES)
def test_gemv_cv_q4_arithmetic_is_gemv_q4s(cuda_ctx, N, K):
    """AR = 1: gemv_cv's loader and consumers with gemv_q4's arithmetic give gemv_q4's bits at
    every schedule of Q4_SCHEDULES (the bulk-copy loader, MI, the walk, the grid), NT and R, and
    are within TOL of gemv_q4's twin."""
    rng = np.random.default_rng([N, K, 24])
    case = Case.random(rng, N, K)
    tried = 0
    for R in (1, 9, 33):
        x = _x(rng, R, K)
        want = case.run_q4(x, 1)
        assert not np.isnan(want.astype(np.float32)).any()
        e = rel_err(want, wq.gemv_reference(case.qweight, case.sc, (N, K), x[:, :K]))
        assert e < TOL, f"N={N} K={K} R={R}: gemv_q4 rel err {e:.2e}"
        for nt in (1, 2):
            assert np.array_equal(_bits(case.run_q4(x, nt)), _bits(want))
            for sched in Q4_SCHEDULES:
                for G in _grids(case.tiles, sched[1] * sched[4]):
                    got = case.run(x, nt, sched=sched, G=G, ar=1)
                    assert np.array_equal(_bits(got), _bits(want)), \
                        f"N={N} K={K} R={R} NT={nt} {sched} G={G} AR=1: bits differ from gemv_q4"
                    tried += 1
    print(f"gemv_cv AR=1 N={N} K={K}: {tried} launches bitwise equal to gemv_q4")


@pytest.mark.parametrize("N,K", [(512, 1024), (5120, 17408), (40, 1024)])
def test_gemv_cv_residual_add(cuda_ctx, N, K):
    """EPI_ADD against the twin: y = bf16(res + bf16(acc)), two bf16 roundings as HF does."""
    rng = np.random.default_rng([N, K, 23])
    case = Case.random(rng, N, K)
    for nt in (1, 2):
        for R in (1, 3, 17):
            x = _x(rng, R, K)
            res = rng.standard_normal((R, N)).astype(np.float32).astype(BF16)
            got = case.run(x, nt, epi=1, res=res)
            want = _add(res, case.twin(x[:, :K]).astype(np.float32).astype(BF16))
            e = rel_err(got, want)
            assert e < 2 * TOL, f"N={N} K={K} NT={nt} R={R}: rel err {e:.2e}"


# Exact sums: codes over all of -8 ... 7, scales of one binade [2^e, 2^(e+1)) (or, e = None, bf16
# subnormals and the lowest normal binade: all multiples of 2^-133), activations in {-1, 0, 1}
# with at most 24 non-zeros a row. Every Ŵ is a multiple of 2^(e-7) below 2^(e+4), so every
# partial sum, in any order, is below 2^(e+9) and exact in fp32: the kernel's output is
# bf16(Σ Ŵ x) exactly, whatever the tensor core's order of adds.
EXACT = [((96, 5120), 0), ((40, 1024), -20), ((200, 2176), 60), ((512, 1024), None)]


def _binade_scales(rng, N, K, e):
    if e is None:   # mantissas 1 ... 255 of 2^-133: subnormal scales and the lowest normal ones
        m = rng.integers(1, 256, (N, K // 128))
        return (m.astype(np.float64) * 2.0 ** -133).astype(np.float32).astype(BF16)
    m = rng.integers(128, 256, (N, K // 128))
    return (m.astype(np.float64) * 2.0 ** (e - 7)).astype(np.float32).astype(BF16)


@pytest.mark.parametrize("shape,e", EXACT)
def test_gemv_cv_exact_sums_bitwise(cuda_ctx, shape, e):
    """Where every fp32 sum is exact the kernel gives numpy's bf16 of the exact Ŵ sum, bit for
    bit, at every R, NT and KS: the conversion (q4_pair, the scale pair of rows g and g + 8,
    fma.rn's rounding, ties to even, subnormal scales) is checked alone. The data is chosen so
    that today's W~ = q · s gives other bits in at least a tenth of the outputs."""
    N, K = shape
    rng = np.random.default_rng([N, K, 24])
    codes = rng.integers(-8, 8, (N, K)).astype(np.int8)
    case = Case(codes, _binade_scales(rng, N, K, e))
    R = 33
    x = np.zeros((R, K + 24), np.float32)
    for r in range(R):
        cols = rng.choice(K, size=rng.integers(1, 25), replace=False)
        x[r, cols] = rng.choice([-1.0, 1.0], size=len(cols))
    x = x.astype(BF16)
    xs = x[:, :K].astype(np.float64)
    w_hat = wq.dequantize_bf16(case.qweight, case.sc, (N, K)).astype(np.float64)
    w_til = wq.dequantize(case.qweight, case.sc, (N, K)).astype(np.float64)
    want = (xs @ w_hat.T).astype(np.float32).astype(BF16)   # exact sums, one rounding
    today = (xs @ w_til.T).astype(np.float32).astype(BF16)
    differ = float(np.mean(_bits(want) != _bits(today)))
    assert differ > 0.1, f"the data does not tell Ŵ from W~ ({differ:.2f} of the outputs differ)"
    for ks in (ks_of(K), 1):
        for nt in (1, 2):
            for R_ in (1, 9, 33):
                got = case.run(x[:R_], nt, ks)
                bad = _bits(got) != _bits(want[:R_])
                assert not bad.any(), (
                    f"N={N} K={K} e={e} KS={ks} NT={nt} R={R_}: {int(bad.sum())} outputs differ "
                    f"from bf16(Σ Ŵ x), e.g. {got[bad][:4]} against {want[:R_][bad][:4]}")
    print(f"gemv_cv exact N={N} K={K} e={e}: bitwise bf16(Σ Ŵ x); {differ:.2f} of the outputs "
          "differ under W~")

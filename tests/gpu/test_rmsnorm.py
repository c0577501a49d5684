"""kernels/rmsnorm.cuh against ref_ops.rms1p (fp64, docs/MODEL.md §3), tiny and 27B widths.

Fresh inputs per case (seeded per case): rows of very different scales, a non-trivial zero-centred
weight, NaN-poisoned output; also run in place (y aliasing x).

Run on the GPU machine: python3 -m pytest -s tests/gpu/test_rmsnorm.py
"""

from __future__ import annotations

import zlib

import numpy as np
import pytest

from tests.gpu import ref_ops
from tests.gpu.harness import BF16, build, poisoned, rel_err, to_gpu

pytestmark = pytest.mark.gpu

# bf16 keeps 8 significant bits: rounding the fp32 result once is off by at most 2^-8 relative
# (half an ulp at the bottom of a binade), plus the fp32 error (~1e-7) that can move a near-tie.
# Both bounds are hard: elementwise, and hence for the relative Frobenius error (seen 1.7e-3).
TOL_ELEM = 2.0 ** -8 + 1e-6
TOL_REL = 2.0 ** -8 + 1e-6
EPS = 1e-6


def rmsnorm_threads(H: int) -> int:
    """Python mirror of q38::rmsnorm_threads (checked against the module's constants)."""
    return max(nt for nt in range(32, 1025, 32) if (H // 8) % nt == 0)


VARIANTS = [(512, rmsnorm_threads(512)), (5120, rmsnorm_threads(5120)), (5120, 320)]


def name_of(H: int, nt: int) -> str:
    return f"q38_rmsnorm_h{H}_t{nt}"


@pytest.fixture(scope="module")
def mod(cuda_ctx):
    src = '#include "rmsnorm.cuh"\n'
    for H, nt in VARIANTS:
        n, L = name_of(H, nt), f"q38::RmsnormLaunch<{H}, {nt}>"
        src += (f"__constant__ int {n}_launch[2] = {{{L}::threads, {L}::chunks}};\n"
                f'extern "C" __global__ void __launch_bounds__({L}::threads)\n'
                f"{n}(const q38::bf16* x, const q38::bf16* w, q38::bf16* y, float eps) "
                f"{{ q38::rmsnorm_1p<{H}, {nt}>(x, w, y, eps); }}\n")
    return build(src)


def run(mod, H: int, nt: int, x: np.ndarray, w: np.ndarray, inplace: bool) -> np.ndarray:
    import pycuda.driver as drv

    n = name_of(H, nt)
    ptr, _ = mod.get_global(f"{n}_launch")
    c = np.zeros(2, dtype=np.int32)
    drv.memcpy_dtoh(c, ptr)
    assert c.tolist() == [nt, H // (8 * nt)]
    d_x = to_gpu(x.astype(BF16))
    d_w = to_gpu(w.astype(BF16))
    d_y = d_x if inplace else poisoned(x.shape, BF16)
    mod.get_function(n)(d_x, d_w, d_y, np.float32(EPS), block=(nt, 1, 1), grid=(x.shape[0], 1, 1))
    return d_y.get().astype(np.float64)


CASES = [(H, nt, R, False) for H, nt in VARIANTS for R in (1, 2, 3, 17, 256)] + [
    (512, 64, 5, True), (5120, 640, 3, True)]


@pytest.mark.parametrize("H,nt,R,inplace", CASES,
                         ids=[f"H{h}-t{t}-R{r}{'-inplace' if i else ''}" for h, t, r, i in CASES])
def test_rmsnorm(mod, H, nt, R, inplace):
    rng = np.random.default_rng(zlib.crc32(repr(("rmsnorm", H, nt, R, inplace)).encode()))
    scale = 10.0 ** rng.uniform(-2, 2, size=(R, 1))
    x = ref_ops.bf16_round(rng.normal(size=(R, H)) * scale)
    w = ref_ops.bf16_round(rng.normal(0.0, 0.5, size=H))
    y = run(mod, H, nt, x, w, inplace)
    ref = ref_ops.rms1p(x, w, EPS)
    assert np.all(np.isfinite(y)), "non-finite output (unwritten poison)"
    e = rel_err(y, ref)
    worst = float(np.max(np.abs(y - ref) / np.maximum(np.abs(ref), 1e-30)))
    print(f"\n[rmsnorm] H={H} NT={nt} R={R}{' in place' if inplace else ''}: rel {e:.2e}, "
          f"max elementwise rel {worst:.2e}")
    assert e <= TOL_REL, f"rel err {e:.3e} > {TOL_REL:.3e}"
    assert worst <= TOL_ELEM, f"elementwise rel err {worst:.3e} > {TOL_ELEM:.3e}"


@pytest.fixture(scope="module")
def tiled_mod(cuda_ctx):
    src = '#include "rmsnorm.cuh"\n'
    for H, tnt in TILED:
        nt = rmsnorm_threads(H)
        src += (f'extern "C" __global__ void __launch_bounds__({nt})\n'
                f"rms_h{H}_x{tnt}(const q38::bf16* x, const q38::bf16* w, q38::bf16* y, float eps)"
                f" {{ q38::rmsnorm_1p<{H}, {nt}, {tnt}>(x, w, y, eps); }}\n"
                f'extern "C" __global__ void __launch_bounds__({nt})\n'
                f"rms_h{H}_x0_{tnt}(const q38::bf16* x, const q38::bf16* w, q38::bf16* y, float eps)"
                f" {{ q38::rmsnorm_1p<{H}, {nt}>(x, w, y, eps); }}\n")
    return build(src)


TILED = [(512, 1), (5120, 8)]


@pytest.mark.parametrize("H,tnt", TILED)
def test_rmsnorm_tile_order(tiled_mod, H, tnt):
    """rmsnorm_1p<H, NT, TNT> writes rmsnorm_1p's bits, each at its place in wgmma_q4's
    activation tile order (weights.xtile_index), and nothing in the padding rows."""
    from qwen38gen.weights import xtile_index

    nt = rmsnorm_threads(H)
    rng = np.random.default_rng([H, tnt, 5])
    w = to_gpu(ref_ops.bf16_round(rng.normal(0.0, 0.5, size=H)).astype(BF16))
    for R in (1, 8 * tnt - 1, 8 * tnt + 3):
        x = to_gpu(ref_ops.bf16_round(rng.normal(size=(R, H)) * 3.0).astype(BF16))
        rows = poisoned((R, H), BF16)
        tiled = poisoned((-(-R // (8 * tnt)) * 8 * tnt * H,), BF16)
        for name, y in ((f"rms_h{H}_x0_{tnt}", rows), (f"rms_h{H}_x{tnt}", tiled)):
            tiled_mod.get_function(name)(x, w, y, np.float32(EPS), block=(nt, 1, 1), grid=(R, 1, 1))
        r, t = rows.get().view(np.uint16), tiled.get().view(np.uint16)
        idx = xtile_index(R, H, tnt)
        assert np.array_equal(t[idx], r), f"R={R}: tile-order values differ"
        rest = np.ones(t.size, bool)
        rest[idx.ravel()] = False
        assert np.isnan(t[rest].view(BF16).astype(np.float32)).all(), f"R={R}: padding written"
    print(f"rmsnorm H={H} TNT={tnt}: tile order exact")

"""Time the producers of wgmma_q4's tile-order activations alone, against their row-major forms.

  python3 scripts/tile_store_bench.py          # GPU machine (PyCUDA, nvcc)

SwiGLU at the 27B width over 32 and 64 rows: rows (swiglu<F>), tile order by 4-byte stores
(swiglu<F, TNT>) and by whole lines (swiglu_tiled<F, TNT>); the 27B RMSNorm in rows and in tile
order. Each launch is timed back to back (one kernel, plain launches), µs per launch, with the
outputs compared to the row-major kernel's through weights.xtile_index. It only chooses between
variants; step figures come from `qwen38gen bench`.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

F, H = 17408, 5120
NTH = 640   # rmsnorm_threads(5120)


def main(reps: int = 200) -> None:
    import pycuda.autoinit  # noqa: F401
    import pycuda.driver as drv

    from qwen38gen.bench import time_back_to_back
    from qwen38gen.weights import xtile_index
    from tests.gpu.harness import BF16, build, to_gpu

    src = ['#include "elementwise.cuh"', '#include "rmsnorm.cuh"', "using q38::bf16;",
           f'extern "C" __global__ void sw_rows(const bf16* g, bf16* h) {{ q38::swiglu<{F}>(g, h); }}']
    for nt in (4, 8):
        src += [f'extern "C" __global__ void sw_words_{nt}(const bf16* g, bf16* h) '
                f'{{ q38::swiglu<{F}, {nt}>(g, h); }}',
                f'extern "C" __global__ void sw_lines_{nt}(const bf16* g, bf16* h, int R) '
                f'{{ q38::swiglu_tiled<{F}, {nt}>(g, h, R); }}',
                f'extern "C" __global__ void __launch_bounds__({NTH}) rn_tile_{nt}(const bf16* x, '
                f'const bf16* w, bf16* y, float e) {{ q38::rmsnorm_1p<{H}, {NTH}, {nt}>(x, w, y, e); }}']
    src.append(f'extern "C" __global__ void __launch_bounds__({NTH}) rn_rows(const bf16* x, '
               f'const bf16* w, bf16* y, float e) {{ q38::rmsnorm_1p<{H}, {NTH}>(x, w, y, e); }}')
    mod = build("\n".join(src) + "\n")
    rng = np.random.default_rng(0)
    s = drv.Stream()
    print(f"{'kernel':>22} {'R':>3} {'us':>8}  same")
    for R in (32, 64):
        nt = R // 8
        gu = to_gpu((rng.standard_normal((R, 2 * F)) * 2).astype(np.float32).astype(BF16))
        x = to_gpu(rng.standard_normal((R, H)).astype(np.float32).astype(BF16))
        w = to_gpu((rng.standard_normal(H) * 0.5).astype(np.float32).astype(BF16))
        outs = {}
        runs = {
            "swiglu rows": (lambda o: mod.get_function("sw_rows")(
                gu, o, block=(256, 1, 1), grid=(-(-(F // 8) // 256), R), stream=s), R * F, None),
            "swiglu tile, words": (lambda o: mod.get_function(f"sw_words_{nt}")(
                gu, o, block=(256, 1, 1), grid=(-(-(F // 8) // 256), R), stream=s), R * F, F),
            "swiglu tile, lines": (lambda o: mod.get_function(f"sw_lines_{nt}")(
                gu, o, np.int32(R), block=(256, 1, 1), grid=(-(-(F // 64) // 8), -(-R // 4)),
                stream=s), R * F, F),
            "rmsnorm rows": (lambda o: mod.get_function("rn_rows")(
                x, w, o, np.float32(1e-6), block=(NTH, 1, 1), grid=(R, 1), stream=s), R * H, None),
            "rmsnorm tile": (lambda o: mod.get_function(f"rn_tile_{nt}")(
                x, w, o, np.float32(1e-6), block=(NTH, 1, 1), grid=(R, 1), stream=s), R * H, H),
        }
        for name, (fn, n, k) in runs.items():
            o = drv.mem_alloc(2 * n)
            t = time_back_to_back(drv, s, lambda i: fn(o), reps)
            got = np.empty(n, np.uint16)
            drv.memcpy_dtoh(got, o)
            if k is None:
                outs[name.split()[0]] = got.reshape(R, -1)
                same = "ref"
            else:
                same = bool(np.array_equal(got[xtile_index(R, k, nt)], outs[name.split()[0]]))
            print(f"{name:>22} {R:3d} {t * 1e6:8.2f}  {same}", flush=True)


if __name__ == "__main__":
    main()

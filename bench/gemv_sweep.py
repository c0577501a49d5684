"""Sweep gemv_q4 variants over the 27B linear shapes of one decode step, on the GPU.

    PYTHONPATH=/tmp/site:. python3 bench/gemv_sweep.py

For each variant (NT = btg/8, ST = pipeline depth) and batch R it times the whole set of 27B
linear layers of one step (64 layers + lm_head, weights in distinct buffers so L2 cannot help),
one launch per layer in a CUDA graph... kept simple: back-to-back launches timed with events,
median of 10, and prints achieved weight GB/s next to the device-to-device copy bandwidth.
"""

import statistics
import sys

import numpy as np
import pycuda.autoinit  # noqa: F401
import pycuda.driver as drv

sys.path.insert(0, ".")
from qwen38gen.bench import copy_bandwidth  # noqa: E402
from qwen38gen.config import PRESETS  # noqa: E402
from qwen38gen.ops import fused_weights  # noqa: E402
from tests.gpu.harness import build  # noqa: E402

cfg = PRESETS["qwen3.8-27b"]
W = fused_weights(cfg)
shapes = {}
for name, w in W.items():
    shapes.setdefault((w["rows"], w["k"]), 0)
    shapes[(w["rows"], w["k"])] += 1
VARIANTS = [(1, 2), (1, 3), (1, 4), (2, 2), (2, 3), (4, 3)]  # (NT, ST)
ROWS = [1, 16, 64]

src = ['#include "gemv_q4.cuh"']
for (n, k) in shapes:
    for nt, st in VARIANTS:
        ks = min(8, k // 128)
        src.append(f'extern "C" __global__ void __launch_bounds__({32 * ks}, 1) g_{k}_{nt}_{st}('
                   "const uint4* q, const q38::bf16* s, const q38::bf16* x, int ldx, q38::bf16* y,"
                   f" int ldy, int N, int R) {{ q38::gemv_q4<{k}, 1, {nt}, {ks}, 0, {st}>(q, s, x, ldx,"
                   " y, ldy, N, R); }")
mod = build("\n".join(sorted(set(src), key=src.index)))
bw = copy_bandwidth(drv)
bufs = []
total = 0
for (n, k), count in shapes.items():
    for _ in range(count):
        q = drv.mem_alloc(n // 16 * k // 64 * 512)
        s = drv.mem_alloc(n // 16 * k // 128 * 32)
        drv.memset_d32(q, 0x12345678, n // 16 * k // 64 * 128)
        drv.memset_d16(s, 0x3c00, n // 16 * k // 128 * 16)
        bufs.append((n, k, q, s))
        total += n // 16 * k // 64 * 512 + n // 16 * k // 128 * 32
x = drv.mem_alloc(64 * 17408 * 2)
drv.memset_d16(x, 0x3c00, 64 * 17408)
y = drv.mem_alloc(64 * 248320 * 2)
stream = drv.Stream()
print(f"weights {total / 1e9:.2f} GB, copy bandwidth {bw / 1e12:.3f} TB/s")
print(f"{'NT':>3} {'ST':>3} {'R':>4} {'ms':>8} {'GB/s':>8} {'% copy':>7}")
for nt, st in VARIANTS:
    fns = {k: mod.get_function(f"g_{k}_{nt}_{st}") for (_, k) in shapes}
    for R in ROWS:
        times = []
        for rep in range(12):
            e0, e1 = drv.Event(), drv.Event()
            e0.record(stream)
            for n, k, q, s in bufs:
                ks = min(8, k // 128)
                fns[k](q, s, x, np.int32(k), y, np.int32(n), np.int32(n), np.int32(R),
                       block=(32 * ks, 1, 1), grid=(n // 16, -(-R // (8 * nt))), stream=stream)
            e1.record(stream)
            e1.synchronize()
            if rep >= 2:
                times.append(e1.time_since(e0) / 1e3)
        t = statistics.median(times)
        print(f"{nt:>3} {st:>3} {R:>4} {t * 1e3:8.3f} {total / t / 1e9:8.0f} {100 * total / t / bw:6.0f}%")

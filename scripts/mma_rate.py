"""The tensor-core rate of mma.sync.m16n8k16 (bf16 in, fp32 accumulate) on this GPU: every warp
runs CH independent accumulator chains for ITER k-steps; prints TFLOP/s and cycles per mma per
SM sub-partition at several warps per SM. A ceiling for gemv_q4 / gemm_q4, which issue these.
Then wgmma.m64nNk16 with A in registers and B in shared memory (wgmma_q4's form): CH
independent accumulators per warpgroup, S k-steps each between a commit and wait_group 0, at
1-4 warpgroups per SM: cycles per wgmma per SM.

  python3 scripts/mma_rate.py          # GPU machine (PyCUDA)
"""

import numpy as np
import pycuda.autoinit  # noqa: F401
import pycuda.driver as drv
from pycuda.compiler import SourceModule

SRC = r"""
#include <stdint.h>
template <int CH>
__device__ void body(float* out, int iters) {
  float d[CH][4];
  for (int c = 0; c < CH; ++c) for (int e = 0; e < 4; ++e) d[c][e] = 0.f;
  uint32_t a0 = threadIdx.x * 0x00010001u, a1 = a0 ^ 0x3f803f80u, a2 = a0 + 7, a3 = a1 + 3;
  uint32_t b0 = a0 ^ 0x40004000u, b1 = a1 ^ 0x3c003c00u;
  for (int it = 0; it < iters; ++it) {
#pragma unroll
    for (int c = 0; c < CH; ++c)
      asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, "
                   "{%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
                   : "+f"(d[c][0]), "+f"(d[c][1]), "+f"(d[c][2]), "+f"(d[c][3])
                   : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
  }
  float s = 0.f;
  for (int c = 0; c < CH; ++c) for (int e = 0; e < 4; ++e) s += d[c][e];
  out[blockIdx.x * blockDim.x + threadIdx.x] = s;
}
extern "C" __global__ void mma4(float* o, int n) { body<4>(o, n); }
#include "wgmma_q4.cuh"
template <int NT, int CH, int S>
__device__ void wbody(float* out, int iters) {
  extern __shared__ __align__(128) uint4 bsm[];
  for (int i = threadIdx.x; i < NT * 16; i += blockDim.x) bsm[i] = make_uint4(0x3f803f80u, i, 0, 0x3c003c00u);
  q38::fence_proxy_async();
  __syncthreads();
  float d[CH][NT][4];
  for (int c = 0; c < CH; ++c) for (int j = 0; j < NT; ++j) for (int e = 0; e < 4; ++e) d[c][j][e] = 0.f;
  const uint32_t a[4] = {threadIdx.x * 0x00010001u, 0x3f803f80u, 0x3c003c00u, threadIdx.x};
  const unsigned sa = (unsigned)__cvta_generic_to_shared(bsm);
  const uint64_t desc = (uint64_t)((sa & 0x3FFFF) >> 4) | (uint64_t)8 << 16 | (uint64_t)16 << 32;
  for (int it = 0; it < iters; ++it) {
    q38::wgmma_fence();
#pragma unroll
    for (int k = 0; k < S; ++k)
#pragma unroll
      for (int c = 0; c < CH; ++c) q38::Wgmma<NT>::mma(d[c], a, desc, 1);
    q38::wgmma_commit();
    q38::wgmma_wait<0>();
  }
  float s = 0.f;
  for (int c = 0; c < CH; ++c) for (int j = 0; j < NT; ++j) for (int e = 0; e < 4; ++e) s += d[c][j][e];
  out[blockIdx.x * blockDim.x + threadIdx.x] = s;
}
#define WG(NT, CH, S) extern "C" __global__ void __launch_bounds__(128, 1) wg_##NT##_##CH##_##S(float* o, int n) { wbody<NT, CH, S>(o, n); }
WG(1, 1, 8) WG(1, 4, 8) WG(1, 1, 64) WG(2, 1, 8) WG(2, 4, 8) WG(8, 1, 8) WG(8, 2, 8) WG(8, 1, 64) WG(4, 1, 8) WG(4, 4, 8)
extern "C" __global__ void mma8(float* o, int n) { body<8>(o, n); }
extern "C" __global__ void mma16(float* o, int n) { body<16>(o, n); }
"""


def main():
    from pathlib import Path
    kdir = str(Path(__file__).resolve().parents[1] / "kernels")
    mod = SourceModule(SRC, no_extern_c=True, arch="sm_90a", options=["-O3", "-std=c++17"],
                       include_dirs=[kdir])
    dev = drv.Context.get_device()
    sms = dev.get_attribute(drv.device_attribute.MULTIPROCESSOR_COUNT)
    clk = dev.get_attribute(drv.device_attribute.CLOCK_RATE) * 1e3
    iters = 4096
    print(f"{sms} SMs, max clock {clk / 1e9:.2f} GHz")
    print(f"{'chains':>6s} {'warps/SM':>8s} {'TFLOP/s':>8s} {'cyc/mma/SMSP @max clk':>22s}")
    for ch in (4, 8, 16):
        fn = mod.get_function(f"mma{ch}")
        for wps in (4, 8, 16, 32):
            blocks, threads = sms * (wps // 4), 128
            out = drv.mem_alloc(blocks * threads * 4)
            fn(out, np.int32(16), block=(threads, 1, 1), grid=(blocks, 1))
            a, b = drv.Event(), drv.Event()
            a.record()
            fn(out, np.int32(iters), block=(threads, 1, 1), grid=(blocks, 1))
            b.record()
            b.synchronize()
            t = b.time_since(a) / 1e3
            mmas = blocks * 4 * ch * iters
            tflops = mmas * 2 * 16 * 8 * 16 / t / 1e12
            cyc = t * clk / (mmas / (sms * 4))
            print(f"{ch:6d} {wps:8d} {tflops:8.1f} {cyc:22.2f}")
            out.free()
    print(f"\n{'wgmma':>12s} {'chains':>6s} {'k-steps':>7s} {'WG/SM':>5s} {'TFLOP/s':>8s} "
          f"{'cyc/wgmma/SM':>13s}")
    for nt, ch, st in ((1, 1, 8), (1, 4, 8), (1, 1, 64), (2, 1, 8), (2, 4, 8), (8, 1, 8), (8, 2, 8),
                       (8, 1, 64), (4, 1, 8), (4, 4, 8)):
        fn = mod.get_function(f"wg_{nt}_{ch}_{st}")
        it = max(16, 8192 // (ch * st))
        for wgs in (1, 2, 4):
            blocks = sms * wgs
            out = drv.mem_alloc(blocks * 128 * 4)
            fn(out, np.int32(4), block=(128, 1, 1), grid=(blocks, 1), shared=nt * 256)
            a, b = drv.Event(), drv.Event()
            a.record()
            fn(out, np.int32(it), block=(128, 1, 1), grid=(blocks, 1), shared=nt * 256)
            b.record()
            b.synchronize()
            t = b.time_since(a) / 1e3
            n = blocks * ch * st * it
            tflops = n * 2 * 64 * 8 * nt * 16 / t / 1e12
            print(f"{'m64n%dk16' % (8 * nt):>12s} {ch:6d} {st:7d} {wgs:5d} {tflops:8.1f} "
                  f"{t * clk / (n / sms):13.1f}")
            out.free()


if __name__ == "__main__":
    main()

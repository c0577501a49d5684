"""The tensor-core rate of mma.sync.m16n8k16 (bf16 in, fp32 accumulate) on this GPU: every warp
runs CH independent accumulator chains for ITER k-steps; prints TFLOP/s and cycles per mma per
SM sub-partition at several warps per SM. A ceiling for gemv_q4 / gemm_q4, which issue these.

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
extern "C" __global__ void mma8(float* o, int n) { body<8>(o, n); }
extern "C" __global__ void mma16(float* o, int n) { body<16>(o, n); }
"""


def main():
    mod = SourceModule(SRC, no_extern_c=True, arch="sm_90", options=["-O3"])
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


if __name__ == "__main__":
    main()

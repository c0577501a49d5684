// gdn_stream.cuh: the GDN launch's state traffic without the GDN, for scripts/gdn_bench.py
// (GDN_STREAM=1): how fast the 27B decode step's recurrent state can be read and written back in
// place with gdn_chunk's access pattern, and what a chain of dependent work between the read
// and the write costs. Not part of the program.
//
// One block of 256 threads per 64 KiB state slice (a (sequence, v-head) item), as gdn_chunk at
// NS = 1: thread (cg = tid % 32, rg = tid / 32) holds the float4 of columns 4cg … 4cg+3 of rows
// rg + 8i, i < 16 (__ldcs), requested before griddepcontrol.wait; then C dependent FMAs that
// use every loaded value (the stand-in for the conv, the norms and the recurrence: C = 256 is
// ~1 000 cycles) and NB block barriers; then the rows are written back (__stcs). Blocks per SM
// are set by padding the dynamic shared memory (the launch's `smem`).
#pragma once
#include "common.cuh"

namespace gs {

template <int C, int NB>
__device__ __forceinline__ void rmw(float* __restrict__ state) {
  const int tid = threadIdx.x, cg = tid % 32, rg = tid / 32;
  float* const Sp = state + ((size_t)blockIdx.x * 128 + rg) * 128 + 4 * cg;
  float4 S[16];
  q38::pdl_launch_dependents();
#pragma unroll
  for (int i = 0; i < 16; ++i) S[i] = __ldcs(reinterpret_cast<const float4*>(Sp + (size_t)i * 8 * 128));
  q38::pdl_wait();
  float f = 0.f;
#pragma unroll
  for (int i = 0; i < 16; ++i) f += S[i].x + S[i].y + S[i].z + S[i].w;
#pragma unroll 4
  for (int c = 0; c < C; ++c) f = fmaf(f, 0.999f, 1e-3f);
#pragma unroll
  for (int b = 0; b < NB; ++b) __syncthreads();
  f *= 1e-30f;  // tiny: the state keeps its values (bounded over many launches)
#pragma unroll
  for (int i = 0; i < 16; ++i) {
    float4 v = S[i];
    v.x += f;
    __stcs(reinterpret_cast<float4*>(Sp + (size_t)i * 8 * 128), v);
  }
}

}  // namespace gs

#define GS_ENTRY(name, C, NB)                                                                     \
  extern "C" __global__ void __launch_bounds__(256, 2) name(float* state) { gs::rmw<C, NB>(state); }
GS_ENTRY(gs_c0_b0, 0, 0)
GS_ENTRY(gs_c256_b0, 256, 0)
GS_ENTRY(gs_c256_b6, 256, 6)
GS_ENTRY(gs_c1024_b6, 1024, 6)

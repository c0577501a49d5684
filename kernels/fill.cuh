// fill.cuh: seeded pseudo-random fills on the device, for the benchmark's synthetic weights and
// state (13 GB of int4 weights are made on the GPU in well under a second, no host copy).
//
//   fill_u32(p, n, seed):                 p[i] = hash(seed, i)             (random int4 codes)
//   fill_bf16(p, n, seed, lo, hi):        p[i] = bf16(lo + (hi - lo) · u)  u ~ U[0, 1)
//   fill_f32(p, n, seed, lo, hi):         p[i] = lo + (hi - lo) · u
// Launch: any grid-stride shape, e.g. grid 1024, block 256.
//
// Compiles alone:
//   nvcc -arch=sm_90 -std=c++17 -cubin -Xptxas -v -x cu kernels/fill.cuh -o /dev/null
#pragma once
#include "common.cuh"

namespace q38 {

// splitmix64 finaliser: a good 64-bit mix of (seed, index).
__device__ __forceinline__ uint64_t mix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

__device__ __forceinline__ float unit(uint64_t seed, size_t i) {
  return (float)(mix64(seed * 0x100000001b3ull + i) >> 40) * (1.0f / 16777216.0f);
}

__device__ __forceinline__ void fill_u32(uint32_t* p, size_t n, uint64_t seed) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
    p[i] = (uint32_t)mix64(seed * 0x100000001b3ull + i);
}

__device__ __forceinline__ void fill_bf16(bf16* p, size_t n, uint64_t seed, float lo, float hi) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
    p[i] = to_bf(lo + (hi - lo) * unit(seed, i));
}

__device__ __forceinline__ void fill_f32(float* p, size_t n, uint64_t seed, float lo, float hi) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
    p[i] = lo + (hi - lo) * unit(seed, i);
}

}  // namespace q38

// stream_bench.cuh: the weight stream of a decode step without its arithmetic, for
// scripts/stream_bench.py: how fast 257 matrices of the 27B step's sizes can be read in order,
// launch by launch (as the program does) or by one persistent grid with a barrier between them.
// Not part of the program. Every kernel reads 16-byte words with the GEMV's streaming load and
// folds them into one xor per thread (stored only if it equals `never`, so nothing is elided).
//
// A unit is what one gemv_q4 block of the B = 1 step reads: S steps of 256 threads x 2 uint4
// (8 KiB a step; S = 5 is gate_up's 40 KiB per m-tile). Steps are read with one step in flight
// while the previous one is folded (gemv_q4's two-stage register ring).
#pragma once
#include <stdint.h>

namespace sb {

constexpr int THREADS = 256;
constexpr int STEP_U4 = THREADS * 2;  // uint4 per step

__device__ __forceinline__ uint4 ld_stream(const uint4* p) {
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p));
  return v;
}
__device__ __forceinline__ uint32_t fold(uint4 v) { return v.x ^ v.y ^ v.z ^ v.w; }
__device__ __forceinline__ void pdl_launch() { asm volatile("griddepcontrol.launch_dependents;" ::: "memory"); }
__device__ __forceinline__ void pdl_wait() { asm volatile("griddepcontrol.wait;" ::: "memory"); }

// Unit u of a matrix of n16 uint4 (steps past the end are skipped): its first step is requested
// before `wait` runs (the GEMV's weights before its griddepcontrol.wait), the rest after.
template <int S, class Wait>
__device__ __forceinline__ uint32_t unit(const uint4* __restrict__ m, long n16, long u, Wait wait) {
  const long base = u * (long)S * STEP_U4 + threadIdx.x;
  uint4 a[2], b[2];
  uint32_t acc = 0;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const long i = base + h * THREADS;
    a[h] = i < n16 ? ld_stream(m + i) : uint4{0, 0, 0, 0};
  }
  wait();
#pragma unroll
  for (int s = 1; s <= S; ++s) {
    if (s < S) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const long i = base + (long)s * STEP_U4 + h * THREADS;
        b[h] = i < n16 ? ld_stream(m + i) : uint4{0, 0, 0, 0};
      }
    }
    acc ^= fold(a[0]) ^ fold(a[1]);
    a[0] = b[0], a[1] = b[1];
  }
  return acc;
}

}  // namespace sb

// One launch per matrix: one unit per block (the program's structure), under PDL when launched
// with the attribute.
template <int S>
__device__ __forceinline__ void sb_per_launch(const uint4* m, long n16, uint32_t never, uint32_t* sink) {
  sb::pdl_launch();
  const uint32_t acc = sb::unit<S>(m, n16, blockIdx.x, [] { sb::pdl_wait(); });
  if (acc == never) sink[blockIdx.x] = acc;
}

// Arrive at the grid barrier and wait until `count` blocks have arrived in all.
__device__ __forceinline__ void sb_barrier(unsigned* bar, unsigned count) {
  __syncthreads();
  if (threadIdx.x == 0) {
    __threadfence();
    atomicAdd(bar, 1u);
    while (*(volatile unsigned*)bar < count) {
    }
    __threadfence();
  }
  __syncthreads();
}

// One persistent grid over all matrices (offsets off[j], sizes n16[j] in uint4 of one buffer):
// each block takes units gridDim.x apart; between matrix j - 1 and j the whole grid meets at a
// barrier (as a persistent step kernel must: matrix j's input is matrix j - 1's output). PF = 1:
// a block with a unit of matrix j requests that unit's first step before it arrives (the
// weights stream through the barrier). Every block must be resident (grid = SMs x blocks per SM;
// *bar = 0 before the launch).
template <int S, int PF>
__device__ __forceinline__ void sb_persistent(const uint4* w, const long* off, const long* n16, int nm,
                                              uint32_t never, uint32_t* sink, unsigned* bar) {
  constexpr long UNIT = (long)S * sb::STEP_U4;
  uint32_t acc = 0;
  for (int j = 0; j < nm; ++j) {
    const long units = (n16[j] + UNIT - 1) / UNIT;
    const unsigned count = (unsigned)j * gridDim.x;  // arrivals that end matrix j - 1
    const bool early = PF && j > 0 && units > (long)blockIdx.x;
    if (j > 0 && !early) sb_barrier(bar, count);
    for (long u = blockIdx.x; u < units; u += gridDim.x) {
      const bool arrive = early && u == (long)blockIdx.x;
      acc ^= sb::unit<S>(w + off[j], n16[j], u, [&] {
        if (arrive) sb_barrier(bar, count);
      });
    }
  }
  if (acc == never) sink[blockIdx.x] = acc;
}

extern "C" __global__ void __launch_bounds__(256) sb_launch5(const uint4* m, long n16, uint32_t never, uint32_t* sink) {
  sb_per_launch<5>(m, n16, never, sink);
}
extern "C" __global__ void __launch_bounds__(256) sb_persist5(const uint4* w, const long* off, const long* n16, int nm,
                                                              uint32_t never, uint32_t* sink, unsigned* bar) {
  sb_persistent<5, 0>(w, off, n16, nm, never, sink, bar);
}
extern "C" __global__ void __launch_bounds__(256) sb_persist5_pf(const uint4* w, const long* off, const long* n16, int nm,
                                                                 uint32_t never, uint32_t* sink, unsigned* bar) {
  sb_persistent<5, 1>(w, off, n16, nm, never, sink, bar);
}

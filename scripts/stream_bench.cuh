// stream_bench.cuh: the weight stream of a decode step without its arithmetic, for
// scripts/stream_bench.py: how fast 257 matrices of the 27B step's sizes can be read in order,
// launch by launch (as the program does) or by one persistent grid with a barrier between them.
// Not part of the program. Every kernel reads 16-byte words with the GEMV's streaming load
// (q38::ld_stream16) and folds them into one xor per thread (stored only if it equals `never`,
// so nothing is elided); PDL through common.cuh's pdl_launch_dependents / pdl_wait.
//
// A unit is what one gemv_q4 block of the B = 1 step reads: S steps of 256 threads x 2 uint4
// (8 KiB a step; S = 5 is gate_up's 40 KiB per m-tile). Steps are read with one step in flight
// while the previous one is folded (gemv_q4's two-stage register ring).
#pragma once
#include <stdint.h>

#include "gemv_q4.cuh"

namespace sb {

constexpr int THREADS = 256;
constexpr int STEP_U4 = THREADS * 2;  // uint4 per step

__device__ __forceinline__ uint32_t fold(uint4 v) { return v.x ^ v.y ^ v.z ^ v.w; }
struct PdlWait {
  __device__ __forceinline__ void operator()() const { q38::pdl_wait(); }
};
// A step's folded words x through the stand-in arithmetic: C > 0, a chain of C dependent FMAs
// (C = 64: ~256 cycles); C = 0, nothing.
template <int C>
__device__ __forceinline__ uint32_t work(uint32_t x) {
  if constexpr (C > 0) {
    float f = __uint_as_float((x & 0x007fffffu) | 0x3f800000u);
#pragma unroll
    for (int c = 0; c < C; ++c) f = fmaf(f, 0.999f, 0.001f);
    return __float_as_uint(f);
  } else {
    return x;
  }
}

// Unit u of a matrix of n16 uint4 (steps past the end are skipped): its first D steps are
// requested before `wait` runs (the GEMV's first weights before its griddepcontrol.wait), then
// step s + D is requested before step s is used: D steps in flight (gemv_q4's ring of ST = D + 1
// stages). Each step's words then go through work<C>, the stand-in for a GEMV group's arithmetic.
template <int S, class Wait, int C = 0, int D = 1>
__device__ __forceinline__ uint32_t unit(const uint4* __restrict__ m, long n16, long u, Wait wait) {
  const long base = u * (long)S * STEP_U4 + threadIdx.x;
  uint4 r[D + 1][2];
  uint32_t acc = 0;
  auto request = [&](int s) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const long i = base + (long)s * STEP_U4 + h * THREADS;
      r[s % (D + 1)][h] = i < n16 ? q38::ld_stream16(m + i) : uint4{0, 0, 0, 0};
    }
  };
#pragma unroll
  for (int s = 0; s < D && s < S; ++s) request(s);
  wait();
#pragma unroll
  for (int s = 0; s < S; ++s) {
    if (s + D < S) request(s + D);
    acc ^= work<C>(fold(r[s % (D + 1)][0]) ^ fold(r[s % (D + 1)][1]));
  }
  return acc;
}

}  // namespace sb

// One launch per matrix: one unit per block (the program's structure), under PDL when launched
// with the attribute.
template <int S, int C = 0, int D = 1>
__device__ __forceinline__ void sb_per_launch(const uint4* m, long n16, uint32_t never, uint32_t* sink) {
  q38::pdl_launch_dependents();
  const uint32_t acc = sb::unit<S, sb::PdlWait, C, D>(m, n16, blockIdx.x, sb::PdlWait{});
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
// The per-launch unit with a synthetic compute chain per step (C FMAs) and D steps in flight.
#define SB_LAUNCH_CD(C, D)                                                                       \
  extern "C" __global__ void __launch_bounds__(256)                                             \
      sb_launch5_c##C##_d##D(const uint4* m, long n16, uint32_t never, uint32_t* sink) {        \
    sb_per_launch<5, C, D>(m, n16, never, sink);                                                \
  }
SB_LAUNCH_CD(64, 1)
SB_LAUNCH_CD(64, 2)
SB_LAUNCH_CD(64, 4)
SB_LAUNCH_CD(128, 1)
SB_LAUNCH_CD(128, 2)
SB_LAUNCH_CD(128, 4)
SB_LAUNCH_CD(0, 2)

// Warp-specialized, one launch per matrix: grid = min(units, SMs x blocks per SM) blocks of one
// producer warp and 8 consumer warps. The producer walks the block's units (blockIdx.x, + grid,
// ...) step by step, copying each 8 KiB step by cp.async into a ring of R stages of shared
// memory (full[s]: its 32 lanes' copies landed; empty[s]: the 8 consumer warps have read the
// stage), R steps ahead and across unit boundaries, the first R before griddepcontrol.wait. The
// consumers read a stage, release it, then run the C-FMA chain on what they read. So the loads
// never wait behind the compute of the same warps, as they do in sb_per_launch.
namespace sb {
__device__ __forceinline__ void cp16(uint32_t dst, const void* src, bool ok) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(dst), "l"(src), "r"(ok ? 16 : 0)
               : "memory");
}
// The ring's mbarriers (full[R]: the producer's 32 lanes; empty[R]: the 8 consumer warps).
__device__ __forceinline__ void ws_init(uint32_t bar_s, int R) {
  if (threadIdx.x == 0) {
    for (int i = 0; i < R; ++i) {
      q38::mbar_init(bar_s + 8 * i, 32);
      q38::mbar_init(bar_s + 8 * (R + i), 8);
    }
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncthreads();
}
// The producer: the step of n16 words at `base` of m into stage st (its copies counted on full).
__device__ __forceinline__ void ws_fill(uint32_t ring_s, uint32_t bar_s, int st, const uint4* m, long base,
                                        long n16, int lane) {
#pragma unroll
  for (int c = 0; c < STEP_U4 / 32; ++c) {
    const long i = base + c * 32 + lane;
    cp16(ring_s + (uint32_t)(st * STEP_U4 + c * 32 + lane) * 16, m + (i < n16 ? i : 0), i < n16);
  }
  q38::mbar_arrive_cp(bar_s + 8 * st);
}
// A consumer: wait for the ring's step k, read thread t's words t and t + 256, release the stage.
__device__ __forceinline__ uint32_t ws_take(const uint4* ring, uint32_t bar_s, long k, int R, int lane) {
  const int st = (int)(k % R);
  q38::mbar_wait(bar_s + 8 * st, (uint32_t)((k / R) & 1));
  const uint4 a = ring[st * STEP_U4 + threadIdx.x], b = ring[st * STEP_U4 + threadIdx.x + 256];
  __syncwarp();
  if (lane == 0) q38::mbar_arrive(bar_s + 8 * (R + st));
  return fold(a) ^ fold(b);
}
}  // namespace sb

template <int S, int C, int R>
__device__ __forceinline__ void sb_ws(const uint4* m, long n16, uint32_t never, uint32_t* sink) {
  extern __shared__ __align__(128) uint4 ring[];  // R x STEP_U4 uint4, then 2R mbarriers
  q38::pdl_launch_dependents();
  const long units = (n16 + (long)S * sb::STEP_U4 - 1) / ((long)S * sb::STEP_U4);
  const long mine = units > (long)blockIdx.x ? (units - 1 - blockIdx.x) / gridDim.x + 1 : 0;
  const long steps = mine * S;  // this block's steps, in order
  const uint32_t ring_s = (uint32_t)__cvta_generic_to_shared(ring);
  const uint32_t bar_s = ring_s + R * sb::STEP_U4 * 16;  // full[R] then empty[R]
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  sb::ws_init(bar_s, R);
  uint32_t acc = 0;
  if (warp == 8) {  // the producer
    for (long k = 0; k < steps; ++k) {
      const int st = (int)(k % R);
      if (k == R) q38::pdl_wait();
      if (k >= R) q38::mbar_wait(bar_s + 8 * (R + st), (uint32_t)((k / R - 1) & 1));
      const long u = blockIdx.x + (k / S) * gridDim.x;
      sb::ws_fill(ring_s, bar_s, st, m, (u * S + k % S) * sb::STEP_U4, n16, lane);
    }
    if (steps <= R) q38::pdl_wait();
  } else {  // the consumers: thread t uses uint4 t and t + 256 of every step
    q38::pdl_wait();
    for (long k = 0; k < steps; ++k) acc ^= sb::work<C>(sb::ws_take(ring, bar_s, k, R, lane));
  }
  if (acc == never) sink[blockIdx.x] = acc;
}

#define SB_WS(C, R)                                                                               \
  extern "C" __global__ void __launch_bounds__(288)                                               \
      sb_ws5_c##C##_r##R(const uint4* m, long n16, uint32_t never, uint32_t* sink) {              \
    sb_ws<5, C, R>(m, n16, never, sink);                                                          \
  }
SB_WS(0, 8)
SB_WS(128, 8)
SB_WS(128, 16)
SB_WS(64, 8)

// Warp-specialized and persistent (version 22): one grid over all matrices, every block
// resident (grid = SMs x blocks per SM; *bar = 0 before the launch), each block one producer
// warp and 8 consumer warps as sb_ws. The producer streams the block's steps of every matrix in
// turn (units blockIdx.x, + grid, ... of each) into its R-stage ring and never waits on the
// barrier: weights do not depend on data. Only the consumers meet the whole grid at a barrier
// before matrix j > 0 (matrix j's input is matrix j - 1's output), so the ring keeps filling
// while they wait. A block with no unit in a matrix still arrives. The question it answers: can
// a persistent step kernel hide its barriers under the weight stream, where sb_persistent (whose
// warps both load and wait) could not?
template <int S, int C, int R>
__device__ __forceinline__ void sb_ws_persistent(const uint4* w, const long* off, const long* n16, int nm,
                                                 uint32_t never, uint32_t* sink, unsigned* bar) {
  extern __shared__ __align__(128) uint4 ring[];  // R x STEP_U4 uint4, then 2R mbarriers
  constexpr long UNIT = (long)S * sb::STEP_U4;
  const uint32_t ring_s = (uint32_t)__cvta_generic_to_shared(ring);
  const uint32_t bar_s = ring_s + R * sb::STEP_U4 * 16;  // full[R] then empty[R]
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  sb::ws_init(bar_s, R);
  uint32_t acc = 0;
  long k = 0;  // the block's step count over all matrices: ring stage k % R, phase k / R
  for (int j = 0; j < nm; ++j) {
    const long units = (n16[j] + UNIT - 1) / UNIT;
    const long mine = units > (long)blockIdx.x ? (units - 1 - blockIdx.x) / gridDim.x + 1 : 0;
    const uint4* m = w + off[j];
    if (warp == 8) {  // the producer: this matrix's steps, straight on from the last one's
      for (long i = 0; i < mine * S; ++i, ++k) {
        const int st = (int)(k % R);
        if (k >= R) q38::mbar_wait(bar_s + 8 * (R + st), (uint32_t)((k / R - 1) & 1));
        const long u = blockIdx.x + (i / S) * gridDim.x;
        sb::ws_fill(ring_s, bar_s, st, m, (u * S + i % S) * sb::STEP_U4, n16[j], lane);
      }
    } else {  // the consumers: the grid barrier (named barrier 1 among the 256), then the steps
      if (j > 0) {
        asm volatile("bar.sync 1, 256;" ::: "memory");
        if (threadIdx.x == 0) {
          __threadfence();
          atomicAdd(bar, 1u);
          while (*(volatile unsigned*)bar < (unsigned)j * gridDim.x) {
          }
          __threadfence();
        }
        asm volatile("bar.sync 1, 256;" ::: "memory");
      }
      for (long i = 0; i < mine * S; ++i, ++k) acc ^= sb::work<C>(sb::ws_take(ring, bar_s, k, R, lane));
    }
  }
  if (acc == never) sink[blockIdx.x] = acc;
}

#define SB_WSP(C, R)                                                                              \
  extern "C" __global__ void __launch_bounds__(288)                                               \
      sb_wsp5_c##C##_r##R(const uint4* w, const long* off, const long* n16, int nm, uint32_t never, \
                          uint32_t* sink, unsigned* bar) {                                        \
    sb_ws_persistent<5, C, R>(w, off, n16, nm, never, sink, bar);                                 \
  }
SB_WSP(0, 8)
SB_WSP(0, 16)
SB_WSP(128, 8)
SB_WSP(128, 16)
SB_WSP(64, 8)
// One block per SM with a 192 KiB ring (24 stages of 8 KiB): docs/PERSISTENT.md's shape (its
// 12 pages of 16 KiB), the 8 consumer warps of these stand-ins instead of its 20.
SB_WSP(0, 24)
SB_WSP(64, 24)
SB_WSP(128, 24)

// elementwise.cuh: the small ops of a decode step, all bf16 storage and fp32 math.
//
//   embed_gather  x[r, :] = E[tok[r], :]                   E bf16 [V, HD], tok int32 [R] -> x bf16 [R, HD]
//                 (tok[r] must lie in [0, V); not checked)
//   swiglu        h[r, f] = bf16(silu(g) · u), g = gu[r, f], u = gu[r, F + f]
//                                                         gu bf16 [R, 2F] -> h bf16 [R, F]
//                 (or, TNT > 0, h in wgmma_q4's activation tile order: common.cuh, xtile_store)
//   residual_add  x[r, c] = bf16(x[r, c] + y[r, c])        x, y bf16 [R, W], x in place (HF adds in bf16)
//   argmax_rows   idx[r] = argmax_c l[r, c], val[r] = l[r, idx[r]]   l T [R, V] (T = bf16 or float)
//                 -> idx int32 [R], val fp32 [R]; ties go to the smallest index (numpy argmax).
//                 NaN never wins (rows are assumed NaN-free); a row of −inf gives index 0.
//   topk_rows     the K largest of each row, sorted descending, ties by smaller index
//                 -> val fp32 [R, K], idx int32 [R, K]; rows need at least K entries > −inf
//   advance_pos   pos[b] += ntok[b], b < B                 (the last kernel of a step)
//
// Launch shapes (no dynamic smem anywhere; every grid is given next to its Launch struct):
//   EmbedLaunch<HD>     grid R,                                   block threads
//   SwigluLaunch<F, T>  grid (grid_x, ceil(R / rows)),           block threads (T: 16 rows x 128 columns)
//   ResidualLaunch<W>   grid ceil(R·W/8 / threads),               block threads
//   ArgmaxLaunch<T, V>  grid R,                                   block threads
//   TopkLaunch<T, V, K> grid R,                                   block threads
//   AdvanceLaunch       grid ceil(B / threads),                   block threads
// Every row is moved as 16-byte vectors: HD, F, W must be multiples of 8, V of 16 / sizeof(T).
//
// Compiles alone:
//   nvcc -arch=sm_90 -std=c++17 -cubin -Xptxas -v -x cu kernels/elementwise.cuh -o /dev/null
#pragma once
#include "common.cuh"

namespace q38 {

template <int HD>
struct EmbedLaunch {
  static constexpr int threads = 128;  // grid = R
};

template <int HD>
__device__ __forceinline__ void embed_gather(const bf16* __restrict__ E, const int* __restrict__ tok,
                                             bf16* __restrict__ x) {
  static_assert(HD % 8 == 0, "embed_gather: HD must be a multiple of 8");
  const int r = blockIdx.x;
  const uint4* src = reinterpret_cast<const uint4*>(E + (size_t)tok[r] * HD);
  uint4* dst = reinterpret_cast<uint4*>(x + (size_t)r * HD);
  for (int i = threadIdx.x; i < HD / 8; i += EmbedLaunch<HD>::threads) dst[i] = __ldg(src + i);
}

template <int F, int TNT = 0>
struct SwigluLaunch {
  static constexpr int threads = 256;
  static constexpr int columns = 8;          // per thread, in rows (TNT = 0)
  static constexpr int rows = TNT ? 16 : 1;  // per block; in tile order one group of 128 columns
  static constexpr int grid_x = TNT ? F / 128 : (F / columns + threads - 1) / threads;  // grid = (grid_x, ceil(R / rows))
};

__device__ __forceinline__ uint4 swiglu8(const bf16* g_at, const bf16* u_at) {
  float g[8], u[8];
  unpack_bf16x8(ldg16(g_at), g);
  unpack_bf16x8(ldg16(u_at), u);
#pragma unroll
  for (int i = 0; i < 8; ++i) g[i] = siluf_(g[i]) * u[i];
  return pack_bf16x8(g);
}

// TNT > 0: h in wgmma_q4's activation tile order for batch tiles of 8·TNT rows (common.cuh
// xtile_store, docs/FORMAT.md). A block takes 16 rows of one group of 128 columns. Thread s first
// computes chunk s % 16 (8 columns) of row s / 16 from two 16-byte loads (a half-warp reads 256
// contiguous bytes of a row) into shared memory; then it stores one whole 16-byte core row of the
// tile: row n8 = s % 8 of n-block s / 128, k-step (s / 16) % 8, half (s / 8) % 2, whose four words
// come from four chunks. Consecutive threads store consecutive 16 bytes (256 bytes per 16
// threads), and the 32 lanes of a warp read 32 different banks (rows padded by 16 bytes).
// Rows >= R are neither read nor written.
template <int F, int TNT>
__device__ __forceinline__ void swiglu_tiled(const bf16* __restrict__ gu, bf16* __restrict__ h, int R) {
  constexpr int RW = 16 * 4 + 4;   // words per row of the block's tile in shared memory
  __shared__ uint32_t sh[16 * RW];
  const int s = threadIdx.x, gi = blockIdx.x, r0 = blockIdx.y * 16;
  {
    const int rl = s >> 4, c = s & 15, r = r0 + rl;
    if (r < R) {
      const bf16* row = gu + (size_t)r * 2 * F + 128 * gi + 8 * c;
      *reinterpret_cast<uint4*>(sh + rl * RW + 4 * c) = swiglu8(row, row + F);
    }
  }
  __syncthreads();
  const int n8 = s & 7, hf = (s >> 3) & 1, ks = (s >> 4) & 7, rl = 8 * (s >> 7) + n8, r = r0 + rl;
  if (r >= R) return;
  // k-step ks = 4·kt + 2·ih + t/2 and half hf = t % 2: word t of chunks 8·kt + 2j + ih, j = 0..3.
  const int kt = ks >> 2, ih = (ks >> 1) & 1, t = 2 * (ks & 1) + hf;
  const uint32_t* w = sh + rl * RW + 4 * (8 * kt + ih) + t;
  *reinterpret_cast<uint4*>(xtile_row<TNT>(h, F, r, gi, ks, hf)) = make_uint4(w[0], w[8], w[16], w[24]);
}

// R: rows of gu (only the tile order, TNT > 0, reads it: its blocks take 16 rows each).
template <int F, int TNT = 0>
__device__ __forceinline__ void swiglu(const bf16* __restrict__ gu, bf16* __restrict__ h, int R) {
  static_assert(F % 8 == 0 && (TNT == 0 || F % 128 == 0), "swiglu: F must be a multiple of 8 "
                "(of 128 in tile order)");
  using L = SwigluLaunch<F, TNT>;
  if constexpr (TNT > 0) {
    swiglu_tiled<F, TNT>(gu, h, R);
  } else {
    const int v = blockIdx.x * L::threads + threadIdx.x;  // L::columns columns per thread
    if (v >= F / L::columns) return;
    const bf16* row = gu + (size_t)blockIdx.y * 2 * F;
    *reinterpret_cast<uint4*>(h + (size_t)blockIdx.y * F + 8 * v) = swiglu8(row + 8 * v, row + F + 8 * v);
  }
}

template <int W>
struct ResidualLaunch {
  static constexpr int threads = 256;  // grid = ceil(R*W/8 / threads)
};

template <int W>
__device__ __forceinline__ void residual_add(bf16* __restrict__ x, const bf16* __restrict__ y,
                                             int R) {
  static_assert(W % 8 == 0, "residual_add: W must be a multiple of 8");
  const size_t v = (size_t)blockIdx.x * ResidualLaunch<W>::threads + threadIdx.x;
  if (v >= (size_t)R * (W / 8)) return;
  float a[8], c[8];
  unpack_bf16x8(reinterpret_cast<const uint4*>(x)[v], a);
  unpack_bf16x8(ldg16(y + 8 * v), c);
#pragma unroll
  for (int i = 0; i < 8; ++i) a[i] += c[i];
  reinterpret_cast<uint4*>(x)[v] = pack_bf16x8(a);
}

// One 16-byte vector of logits -> fp32: 8 bf16 or 4 floats.
template <typename T>
struct LogitVec;
template <>
struct LogitVec<bf16> {
  static constexpr int n = 8;
  static __device__ __forceinline__ void load(const bf16* p, float (&f)[8]) {
    unpack_bf16x8(ldg16(p), f);
  }
};
template <>
struct LogitVec<float> {
  static constexpr int n = 4;
  static __device__ __forceinline__ void load(const float* p, float (&f)[4]) {
    const uint4 v = ldg16(p);
    f[0] = __uint_as_float(v.x); f[1] = __uint_as_float(v.y);
    f[2] = __uint_as_float(v.z); f[3] = __uint_as_float(v.w);
  }
};

// (va, ia) ranks before (vb, ib): larger value, then smaller index.
__device__ __forceinline__ bool rank_before(float va, int ia, float vb, int ib) {
  return va > vb || (va == vb && ia < ib);
}

// Warp-wide arg-best of (v, i) under rank_before; every lane gets the result.
__device__ __forceinline__ void warp_argbest(float& v, int& i) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const float ov = __shfl_xor_sync(0xffffffffu, v, o);
    const int oi = __shfl_xor_sync(0xffffffffu, i, o);
    if (rank_before(ov, oi, v, i)) { v = ov; i = oi; }
  }
}

template <typename T, int V>
struct ArgmaxLaunch {
  static constexpr int threads = 1024;  // grid = R; 31 vectors per thread at V = 248320 (bf16)
};

template <typename T, int V>
__device__ __forceinline__ void argmax_rows(const T* __restrict__ logits, int* __restrict__ idx,
                                            float* __restrict__ val) {
  constexpr int EV = LogitVec<T>::n, NV = V / EV, NT = ArgmaxLaunch<T, V>::threads;
  static_assert(V % EV == 0, "argmax_rows: V must be a multiple of the 16-byte vector");
  __shared__ float sv[NT / 32];
  __shared__ int si[NT / 32];
  const T* row = logits + (size_t)blockIdx.x * V;
  float bv = -INFINITY;
  int bi = 0;
  // Each thread walks its indices in increasing order; strict > keeps the first of equal values.
#pragma unroll 4
  for (int v = threadIdx.x; v < NV; v += NT) {
    float f[EV];
    LogitVec<T>::load(row + (size_t)v * EV, f);
#pragma unroll
    for (int e = 0; e < EV; ++e)
      if (f[e] > bv) { bv = f[e]; bi = v * EV + e; }
  }
  warp_argbest(bv, bi);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  if (lane == 0) { sv[warp] = bv; si[warp] = bi; }
  __syncthreads();
  if (warp == 0) {
    bv = lane < NT / 32 ? sv[lane] : -INFINITY;
    bi = lane < NT / 32 ? si[lane] : 0x7fffffff;
    warp_argbest(bv, bi);
    if (lane == 0) { idx[blockIdx.x] = bi; val[blockIdx.x] = bv; }
  }
}

template <typename T, int V, int K>
struct TopkLaunch {
  // grid = R; each thread keeps its own top K in registers (2K of them): 128 threads leave
  // ptxas room (at 256 its occupancy heuristic caps at 64 registers and spills for K = 16)
  static constexpr int threads = 128;
};

template <typename T, int V, int K>
__device__ __forceinline__ void topk_rows(const T* __restrict__ logits, float* __restrict__ val,
                                          int* __restrict__ idx) {
  constexpr int EV = LogitVec<T>::n, NV = V / EV, NT = TopkLaunch<T, V, K>::threads, NW = NT / 32;
  static_assert(V % EV == 0, "topk_rows: V must be a multiple of the 16-byte vector");
  static_assert(K >= 1 && K <= 16 && K <= V, "topk_rows: 1 <= K <= 16");
  __shared__ float sv[2][NW];
  __shared__ int si[2][NW];
  const T* row = logits + (size_t)blockIdx.x * V;

  // Per-thread sorted list (fully unrolled: stays in registers). A thread sees its indices in
  // increasing order, so a new entry equal to a kept one ranks after it: strict > is the tie rule.
  float tv[K];
  int ti[K];
#pragma unroll
  for (int k = 0; k < K; ++k) { tv[k] = -INFINITY; ti[k] = 0x7fffffff; }
  for (int v = threadIdx.x; v < NV; v += NT) {
    float f[EV];
    LogitVec<T>::load(row + (size_t)v * EV, f);
#pragma unroll
    for (int e = 0; e < EV; ++e) {
      if (f[e] > tv[K - 1]) {
        tv[K - 1] = f[e];
        ti[K - 1] = v * EV + e;
#pragma unroll
        for (int k = K - 1; k > 0; --k) {
          if (tv[k] > tv[k - 1]) {
            const float a = tv[k]; tv[k] = tv[k - 1]; tv[k - 1] = a;
            const int c = ti[k]; ti[k] = ti[k - 1]; ti[k - 1] = c;
          }
        }
      }
    }
  }

  // K rounds: the block's best list head is output k; its owner pops it. Indices are unique, so
  // exactly one thread owns the winner. Round k uses buffer k & 1: one barrier per round suffices.
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
  for (int k = 0; k < K; ++k) {
    float bv = tv[0];
    int bi = ti[0];
    warp_argbest(bv, bi);
    if (lane == 0) { sv[k & 1][warp] = bv; si[k & 1][warp] = bi; }
    __syncthreads();
    bv = lane < NW ? sv[k & 1][lane] : -INFINITY;
    bi = lane < NW ? si[k & 1][lane] : 0x7fffffff;
    warp_argbest(bv, bi);
    if (threadIdx.x == 0) {
      val[(size_t)blockIdx.x * K + k] = bv;
      idx[(size_t)blockIdx.x * K + k] = bi;
    }
    if (ti[0] == bi) {
#pragma unroll
      for (int j = 0; j < K - 1; ++j) { tv[j] = tv[j + 1]; ti[j] = ti[j + 1]; }
      tv[K - 1] = -INFINITY;
      ti[K - 1] = 0x7fffffff;
    }
  }
}

struct AdvanceLaunch {
  static constexpr int threads = 128;  // grid = ceil(B / threads)
};

__device__ __forceinline__ void advance_pos(int* __restrict__ pos, const int* __restrict__ ntok,
                                            int B) {
  const int b = blockIdx.x * AdvanceLaunch::threads + threadIdx.x;
  if (b < B) pos[b] += ntok[b];
}

}  // namespace q38

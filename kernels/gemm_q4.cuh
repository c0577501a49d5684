// gemm_q4.cuh: the batched int4-g128 GEMV of gemv_q4.cuh for larger batch tiles, with the
// activations shared through shared memory.
//
//   y[r, n] = sum_k W~[n, k] * x[r, k]          same operands, layouts and epilogues as gemv_q4
//
// gemv_q4 gives every warp its own slice of K and its own activation reads (from L1/L2, at the
// moment a group is multiplied). At 16-64 activation rows that is 4-16 bytes of activations per
// weight byte per warp, and a warp waits on them. Here the WR warps of a block own different
// rows (MT m-tiles each) and walk the same groups of K together: each group's activation tile
// (8*NT rows x 128 bf16) is copied once per block into an ST-stage cp.async ring, beside every
// warp's weights and scales of that group, and read from there by all WR warps.
//
// The arithmetic is gemv_q4's, bit for bit: the K/128 groups are cut into the same KS parts;
// within a part, per group, 8 mma k-steps into an unscaled partial, then acc += scale * partial;
// the parts are summed in part order from 0.f (KS > 1) into a per-lane sum in shared memory. So a
// row's result depends on K and KS only, and either kernel may serve any launch
// (tests/gpu/test_gemv_q4.py checks the bits against gemv_q4).
//
// ZS > 1 (for weights with few rows, whose row blocks alone would not fill the GPU): grid.z = ZS
// blocks share a row block, block z owning parts [z*KS/ZS, (z+1)*KS/ZS). Each stores every part's
// fp32 sums in `part`, and the last of the ZS to arrive (an `arrivals` counter, which it resets to
// 0) adds all KS parts in part order from 0.f and stores y: the same bits again.
//
// Measured on an H200 (docs/PERFORMANCE.md, version 3): at 64 rows it beats gemv_q4's two 32-row
// passes by 8-42% on the wide weights (lm_head 964 -> 556 us); at 16 rows and at 1 it loses on
// every shape (its block barrier per group and its copies cost more than the L1 hits they
// replace). At 64 rows both kernels issue one mma per ~26 cycles per SM sub-partition, against
// 6.7 for mma.sync on this chip: they are bound by latency and issue, not by the tensor cores.
//
// Launch: grid = (ceil(ceil(N/16) / (MT*WR)), ceil(R / (8*NT)), ZS), block = GemmLaunch::threads
//   = 32*WR, dynamic smem GemmLaunch::dyn_smem_bytes (the caller raises
//   CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES above 48 KiB). ZS > 1: `part` holds
//   GemmLaunch::part_floats * grid.x * grid.y floats, `arrivals` grid.x * grid.y zeroed ints.
//   Entry point: extern "C" __global__ __launch_bounds__(32*WR, MB) calling gemm_q4 (it calls
//   pdl_wait itself, after requesting its first weights); MB = 2 caps a thread at 128 registers.
//
// Compiles alone:
//   nvcc -arch=sm_90 -std=c++17 -cubin -Xptxas -v -x cu kernels/gemm_q4.cuh -o /dev/null
#pragma once
#include "gemv_q4.cuh"

namespace q38 {

template <int MT, int NT, int KS, int WR, int ST, int ZS = 1>
struct GemmLaunch {
  static_assert(ST >= 2, "gemm_q4: ST >= 2 (one stage computes while the next lands)");
  static_assert(ZS >= 1 && KS % ZS == 0, "gemm_q4: ZS must divide KS");
  static constexpr int threads = 32 * WR;
  static constexpr int rows_per_block = 16 * MT * WR;
  static constexpr int btg = 8 * NT;
  // One activation row of a group: 128 bf16 + 8 pad (272 bytes = 17 uint4): the 8 lanes of a
  // quarter warp then read 16-byte words from all 32 banks.
  static constexpr int x_row_uint4 = 17;
  static constexpr int x_stage_uint4 = 8 * NT * x_row_uint4;
  static constexpr int w_stage_uint4 = WR * MT * 66;  // per warp and m-tile: 64 weights + 2 scales
  static constexpr int stage_uint4 = x_stage_uint4 + w_stage_uint4;
  static constexpr int values = MT * NT * 4;           // accumulators per lane
  static constexpr int sum_bytes = KS > 1 && ZS == 1 ? WR * values * 32 * 4 : 0;
  static constexpr int part_floats = KS * WR * values * 32;  // per row block (ZS > 1)
  static constexpr int dyn_smem_bytes = ST * stage_uint4 * 16 + sum_bytes;
};

// K split over ZS blocks (gemm_q4, wgmma_q4): each block has stored its parts' sums; true in the
// last of them to arrive at its row block's counter, which it resets to 0 for the next launch.
// That block then adds the KS parts in part order from 0.f and stores y.
template <int ZS>
__device__ __forceinline__ bool split_last_arrival(int* arrivals, size_t blk) {
  __shared__ int last;
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) {
    last = atomicAdd(arrivals + blk, 1) == ZS - 1;
    if (last) arrivals[blk] = 0;  // every launch leaves the counters at 0
  }
  __syncthreads();
  return last;
}

// ... and merges: its value v (of V per thread) is the sum of the KS parts' partials, part p's
// at slot(p) + v * stride, added in part order from 0.f, then stored where index(v, n, r) says.
// gemm_q4 and wgmma_q4 share it, so a split row's bits do not depend on which kernel split it.
// U > 1: the partials and (EPI_ADD) the residuals of U values are loaded before any of them is
// summed or stored, U * KS + U loads in flight at once: one L2 round trip per U values (same
// bits). Version 16 batched only the partials; with EPI_ADD each residual's load then waited
// for the store before it, U + 1 round trips (docs/PERFORMANCE.md, version 20).
template <int KS, int EPI, int U = 1, class Slot, class Index>
__device__ __forceinline__ void split_merge_store(int V, int stride, Slot slot, Index index, bf16* y, int ldy,
                                                  int N, int R) {
  __threadfence();
  int v = 0;
  if constexpr (U > 1) {
#pragma unroll 1
    for (; v + U <= V; v += U) {
      float p[U][KS];
#pragma unroll
      for (int u = 0; u < U; ++u)
#pragma unroll
        for (int q = 0; q < KS; ++q) p[u][q] = __ldcg(slot(q) + (v + u) * stride);
      gemv_store_all<EPI, U>(
          y, ldy, N, R, [&](int u, int& n, int& r) { index(v + u, n, r); },
          [&](int u) {
            float s = 0.f;
#pragma unroll
            for (int q = 0; q < KS; ++q) s += p[u][q];
            return s;
          });
    }
  }
#pragma unroll 1
  for (; v < V; ++v) {
    float s = 0.f;
#pragma unroll
    for (int p = 0; p < KS; ++p) s += __ldcg(slot(p) + v * stride);
    int n, r;
    index(v, n, r);
    gemv_store<EPI>(y, ldy, n, r, N, R, s);
  }
}

// MT: m-tiles (16 output rows) per warp; NT: n-tiles (8 activation rows), BTG = 8*NT; KS: the
// parts of K (as gemv_q4: min(8, K/128)); EPI: GemvEpilogue; WR: warps per block, on different
// rows; ST: ring stages (ST-1 groups in flight while one is multiplied); ZS: blocks splitting
// the parts of K (grid.z).
template <int K, int MT, int NT, int KS, int EPI, int WR, int ST, int ZS = 1>
__device__ __forceinline__ void gemm_q4(const uint4* __restrict__ qweight, const bf16* __restrict__ scales,
                                        const bf16* __restrict__ x, int ldx, bf16* y, int ldy, int N, int R,
                                        float* part_buf = nullptr, int* arrivals = nullptr) {
  static_assert(K % 128 == 0, "K must be a multiple of 128");
  using L = GemmLaunch<MT, NT, KS, WR, ST, ZS>;
  constexpr int KT = K / 64, NG = K / 128, V = L::values, XR = 8 * NT;
  constexpr int XU = L::x_row_uint4, SU = L::stage_uint4;
  extern __shared__ uint4 gemm_smem[];  // [ST][x tile | weights of every warp], then the sums
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, c = lane & 3;
  const int tiles = (N + 15) >> 4;
  const int rt0 = (blockIdx.x * WR + warp) * MT;  // this warp's first m-tile
  const int r0 = blockIdx.y * XR;
  const bool active = rt0 < tiles;
  const unsigned short* sc16 = reinterpret_cast<const unsigned short*>(scales);

  // The copies of a group are the same at every group but for an offset, so each thread keeps
  // its source pointers and shared-memory offsets and adds the group's offset.
  const unsigned smem0 = (unsigned)__cvta_generic_to_shared(gemm_smem);
  // This warp's weights and scales: m-tile rt0+m, 2 x 512 bytes (+ 32 bytes of scales) a group,
  // at compile-time offsets from one pointer.
  const uint4* wsrc = qweight + (size_t)rt0 * KT * 32 + lane;
  const unsigned short* ssrc = sc16 + (size_t)rt0 * NG * 16 + 8 * (lane & 1);
  const unsigned wdst = (L::x_stage_uint4 + warp * MT * 66 + lane) * 16;
  auto load_w = [&](int s, int gi) {  // group gi into stage s (constant data: safe before pdl_wait)
    const unsigned d = smem0 + s * SU * 16 + wdst;
#pragma unroll
    for (int m = 0; m < MT; ++m) {
      if (rt0 + m < tiles) {
        const uint4* w = wsrc + m * KT * 32 + gi * 64;
        cp_async16_s(d + m * 66 * 16, w);
        cp_async16_s(d + (m * 66 + 32) * 16, w + 32);
        if (lane < 2) cp_async16_s(d + (m * 66 + 64) * 16, ssrc + m * NG * 16 + gi * 16);  // slots 64, 65
      }
    }
  };
  // The block's activation tile: rows r0.. (those < R) x 16 uint4 a group. Thread t copies
  // column t % 16 of rows t / 16 + 2*WR*i.
  constexpr int XC = (XR * 16 + 32 * WR - 1) / (32 * WR), XSTEP = 2 * WR;
  const int xr0 = threadIdx.x >> 4, rows = min(XR, R - r0);
  const bf16* xsrc = x + (size_t)(r0 + min(xr0, rows - 1)) * ldx + (threadIdx.x & 15) * 8;
  const int xstep = XSTEP * ldx;
  const unsigned xdst = (xr0 * XU + (threadIdx.x & 15)) * 16;
  auto load_x = [&](int s, int gi) {
    const unsigned d = smem0 + s * SU * 16 + xdst;
#pragma unroll
    for (int i = 0; i < XC; ++i)
      if (xr0 + XSTEP * i < rows) cp_async16_s(d + XSTEP * i * XU * 16, xsrc + (i * xstep + gi * 128));
  };

  // This block's parts [pa, pb) and their groups [gb, ge).
  const int pa = (int)blockIdx.z * (KS / ZS), pb = pa + KS / ZS;
  const int gb = (pa * NG) / KS, ge = (pb * NG) / KS;
  pdl_launch_dependents();
#pragma unroll
  for (int s = 0; s < ST - 1; ++s)
    if (gb + s < ge) load_w(s, gb + s);
  pdl_wait();  // x comes from the previous kernel
#pragma unroll
  for (int s = 0; s < ST - 1; ++s) {
    if (gb + s < ge) load_x(s, gb + s);
    cp_async_commit();  // ST-1 commit groups, even with fewer groups
  }

  float acc[MT][NT][4];
  q4_zero<MT, NT>(acc);
  float* sums = reinterpret_cast<float*>(gemm_smem + ST * SU) + warp * V * 32 + lane;
  int part = pa, part_end = ((pa + 1) * NG) / KS;
  // ZS > 1: this warp's lane slot of part p's sums of this row block.
  const size_t blk = (size_t)blockIdx.y * gridDim.x + blockIdx.x;
  auto pslot = [&](int p) {
    return part_buf + ((size_t)p * gridDim.x * gridDim.y + blk) * (WR * V * 32) + warp * V * 32 + lane;
  };

  int s_use = 0, s_fill = ST - 1;  // the stage multiplied / refilled this iteration
#pragma unroll 1
  for (int gi = gb; gi < ge; ++gi) {
    cp_async_wait<ST - 2>();  // group gi's copies (this thread's) have landed
    __syncthreads();          // ... everyone's, and stage (gi-1) % ST is free again
    {
      const int nx = gi + ST - 1;
      if (nx < ge) {
        load_w(s_fill, nx);
        load_x(s_fill, nx);
      }
      cp_async_commit();
      s_fill = s_fill == ST - 1 ? 0 : s_fill + 1;
    }
    const int su = s_use;
    s_use = s_use == ST - 1 ? 0 : s_use + 1;
    if (active) {
      const uint4* xs = gemm_smem + su * SU;
      const uint4* ws = xs + L::x_stage_uint4 + warp * MT * 66;
      float pt[MT][NT][4];
      q4_zero<MT, NT>(pt);
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        uint4 wv[MT];
#pragma unroll
        for (int m = 0; m < MT; ++m) wv[m] = ws[m * 66 + 32 * h + lane];
#pragma unroll
        for (int q = 0; q < 2; ++q) {
          // This lane's activations 16c + 8q .. +7 of k-tile h, for every n-tile (row 8j + g).
          uint4 xv[NT];
#pragma unroll
          for (int j = 0; j < NT; ++j) xv[j] = xs[(8 * j + g) * XU + 8 * h + 2 * c + q];
#pragma unroll
          for (int ii = 0; ii < 2; ++ii) {  // k-step i = 2q + ii of k-tile h
            const int i = 2 * q + ii;
            uint32_t b0[NT], b1[NT];
#pragma unroll
            for (int j = 0; j < NT; ++j) b0[j] = ii ? xv[j].z : xv[j].x, b1[j] = ii ? xv[j].w : xv[j].y;
#pragma unroll
            for (int m = 0; m < MT; ++m)
              q4_kstep<NT>(pt[m], i == 0 ? wv[m].x : i == 1 ? wv[m].y : i == 2 ? wv[m].z : wv[m].w, b0, b1);
          }
        }
      }
#pragma unroll
      for (int m = 0; m < MT; ++m) {
        const unsigned short* sp = reinterpret_cast<const unsigned short*>(ws + m * 66 + 64);
        q4_scale_add<NT>(acc[m], pt[m], (uint32_t)sp[g] | ((uint32_t)sp[g + 8] << 16));
      }
      if (KS > 1 && gi + 1 == part_end) {
        // Part `part` is done. ZS = 1: sum += its acc, in part order from 0.f (gemv_q4's
        // reduction); ZS > 1: its acc goes to part_buf for the merging block.
        float* pv = ZS > 1 ? pslot(part) : sums;
#pragma unroll
        for (int m = 0; m < MT; ++m)
#pragma unroll
          for (int j = 0; j < NT; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
              float* sv = pv + ((m * NT + j) * 4 + e) * 32;
              if constexpr (ZS > 1) __stcg(sv, acc[m][j][e]);
              else *sv = (part == 0 ? 0.f : *sv) + acc[m][j][e];
              acc[m][j][e] = 0.f;
            }
        ++part;
        part_end = ((part + 1) * NG) / KS;
      }
    }
  }
  cp_async_wait<0>();  // no copy may still target shared memory when the block exits
  if constexpr (ZS > 1) {
    // The last of the ZS blocks of this row block sums the KS parts in order and stores y.
    if (!split_last_arrival<ZS>(arrivals, blk) || !active) return;
    split_merge_store<KS, EPI>(
        V, 32, pslot, [&](int v, int& n, int& r) { gemv_out_index(v, NT, lane, rt0, r0, n, r); }, y, ldy, N, R);
    return;
  }
  if (!active) return;
  gemv_store_all<EPI, V>(
      y, ldy, N, R, [&](int v, int& n, int& r) { gemv_out_index(v, NT, lane, rt0, r0, n, r); },
      [&](int v) { return KS > 1 ? sums[v * 32] : acc[v / (NT * 4)][(v / 4) % NT][v % 4]; });
}

}  // namespace q38

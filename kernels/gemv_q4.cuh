// gemv_q4.cuh: batched int4-g128 GEMV / small GEMM on the tensor cores.
//
//   y[r, n] = sum_k W~[n, k] * x[r, k]          W~ = int4 code * bf16 scale (docs/FORMAT.md)
//
//   x  bf16 [R, K]  (row stride ldx)   R = activation rows (B for decode, B*PT for prefill)
//   W  uint32 qweight [Np/16, K/64, 32, 4], bf16 scales [Np/16, K/128, 16]
//   y  bf16 [R, N]  (row stride ldy); epilogue EPI_STORE writes bf16(acc),
//      EPI_ADD writes bf16(y + bf16(acc)) in place (the residual add, as HF rounds it)
//
// Each weight is read from memory once per launch and reused for the BTG = 8*NT activation rows
// of a batch tile: A = weights (16 output rows per m-tile), B = activations (batch along n),
// mma.sync.m16n8k16 bf16 -> fp32. Codes become bf16 with one lop3 and one sub per register;
// each group of 128 is accumulated unscaled and added into the output with its fp32 scale, so
// the only roundings are fp32 sums and the final bf16 store.
//
// Launch: grid = (Np / (16*MT), ceil(R / (8*NT))), block = GemvLaunch::threads = 32*KS,
//   no dynamic smem. Entry point: extern "C" __global__ __launch_bounds__(32*KS) calling gemv_q4.
//   KS warps of a block own the same MT m-tiles and split the K/128 groups between them; their
//   partial sums meet in shared memory and are added in a fixed order (deterministic, and the
//   same at every R: a row's result does not depend on the batch it is computed in).
//
// Compiles alone:
//   nvcc -arch=sm_90 -std=c++17 -cubin -Xptxas -v -x cu kernels/gemv_q4.cuh -o /dev/null
#pragma once
#include <cooperative_groups.h>

#include "common.cuh"

namespace q38 {

enum GemvEpilogue { EPI_STORE = 0, EPI_ADD = 1 };

template <int MT, int NT, int KS>
struct GemvLaunch {
  static constexpr int threads = 32 * KS;
  static constexpr int rows_per_block = 16 * MT;   // output features per block (grid.x)
  static constexpr int btg = 8 * NT;               // activation rows per block (grid.y)
  static constexpr int smem_bytes = (KS > 1 ? KS : 0) * MT * NT * 4 * 32 * 4;  // static
};

// Two int4 codes at bits [4j, 4j+4) and [16+4j, 20+4j) of w -> bf16x2 {code-8, code-8}.
__device__ __forceinline__ uint32_t q4_pair(uint32_t w, int j) {
  uint32_t v;
  const uint32_t s = w >> (4 * j);
  // v = (s & 0x000f000f) | 0x43004300: bf16 128 + code in each half.
  asm("lop3.b32 %0, %1, %2, %3, 0xea;" : "=r"(v) : "r"(s), "r"(0x000f000fu), "r"(0x43004300u));
  uint32_t r;
  // (128 + code) - 136 = code - 8, exact in bf16.
  asm("sub.bf16x2 %0, %1, %2;" : "=r"(r) : "r"(v), "r"(0x43084308u));
  return r;
}

__device__ __forceinline__ void mma_bf16_16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                               uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
      "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Weights are streamed once: keep them out of L1.
__device__ __forceinline__ uint4 ld_stream16(const uint4* p) {
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p));
  return v;
}

// The work of one warp on one batch tile: MT m-tiles (16 output rows each) x NT n-tiles (8
// activation rows each), over any run of groups of 128 inputs, with an ST-stage register ring of
// weights and scales (XS: activations staged with them, else loaded when used). Its arithmetic is
// fixed: per group, 8 mma k-steps into an unscaled partial, then acc += scale * partial in fp32.
// Both kernels below drive it; MT, NT, ST, XS and the driver change only the schedule, so a row's
// result depends only on K and KS (the split of the groups into KS parts, summed in part order).
template <int K, int MT, int NT, int ST, int XS>
struct GemvWarp {
  static_assert(K % 128 == 0, "K must be a multiple of 128");
  static_assert(ST >= 1 && ST <= 8, "gemv: 1 <= ST <= 8");
  static constexpr int KT = K / 64;    // k-tiles per row tile
  static constexpr int NG = K / 128;   // groups per row tile
  static constexpr int XW = XS ? ST : 1;
  static constexpr int V = MT * NT * 4;  // accumulator values per lane

  const uint4* __restrict__ qweight;
  const unsigned short* __restrict__ sc16;
  const bf16* xrow[NT];
  int lane, g;
  uint4 w[ST][MT][2];
  uint32_t sw[ST][MT];  // bf16 scales of rows g and g+8 of each m-tile, packed
  uint4 xv[XW][NT][2][2];
  float acc[MT][NT][4];

  __device__ __forceinline__ GemvWarp(const uint4* qw, const bf16* scales, const bf16* x, int ldx,
                                      int r0, int R) {
    qweight = qw;
    sc16 = reinterpret_cast<const unsigned short*>(scales);
    lane = threadIdx.x & 31;
    g = lane >> 2;
    const int c = lane & 3;
    // Activation row of each n-tile for this lane (n = g), clamped; rows >= R read row R-1 and
    // are never stored.
#pragma unroll
    for (int j = 0; j < NT; ++j) {
      const int r = r0 + 8 * j + g;
      xrow[j] = x + (size_t)(r < R ? r : R - 1) * ldx + 16 * c;
    }
    zero();
  }

  __device__ __forceinline__ void zero() {
#pragma unroll
    for (int m = 0; m < MT; ++m)
#pragma unroll
      for (int j = 0; j < NT; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[m][j][e] = 0.f;
  }

  // Weights and scales of group gi of m-tiles rt..rt+MT-1 into stage s: constant data, safe
  // before pdl_wait.
  __device__ __forceinline__ void load_w(int s, int rt, int gi) {
#pragma unroll
    for (int m = 0; m < MT; ++m) {
#pragma unroll
      for (int h = 0; h < 2; ++h)
        w[s][m][h] = ld_stream16(qweight + ((size_t)(rt + m) * KT + 2 * gi + h) * 32 + lane);
      const unsigned short* sp = sc16 + ((size_t)(rt + m) * NG + gi) * 16;
      sw[s][m] = (uint32_t)__ldg(sp + g) | ((uint32_t)__ldg(sp + g + 8) << 16);
    }
  }

  // Activations: 16 contiguous bf16 per k-tile per n-tile (FORMAT.md's column permutation).
  __device__ __forceinline__ void load_x(int s, int gi) {
#pragma unroll
    for (int j = 0; j < NT; ++j)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const uint4* p = reinterpret_cast<const uint4*>(xrow[j] + (2 * gi + h) * 64);
        xv[s][j][h][0] = __ldg(p);
        xv[s][j][h][1] = __ldg(p + 1);
      }
  }

  __device__ __forceinline__ void load(int s, int rt, int gi) {
    load_w(s, rt, gi);
    if constexpr (XS) load_x(s, gi);
  }

  // Multiply the group in stage s (group index gi, for the activations when XS = 0).
  __device__ __forceinline__ void group(int s, int gi) {
    if constexpr (!XS) load_x(0, gi);
    const uint4 (&xs)[NT][2][2] = xv[XS ? s : 0];
    float part[MT][NT][4];
#pragma unroll
    for (int m = 0; m < MT; ++m)
#pragma unroll
      for (int j = 0; j < NT; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) part[m][j][e] = 0.f;
#pragma unroll
    for (int h = 0; h < 2; ++h)
#pragma unroll
      for (int i = 0; i < 4; ++i) {  // k-step i of k-tile h
#pragma unroll
        for (int m = 0; m < MT; ++m) {
          const uint4& wv = w[s][m][h];
          const uint32_t wi = i == 0 ? wv.x : i == 1 ? wv.y : i == 2 ? wv.z : wv.w;
          const uint32_t a[4] = {q4_pair(wi, 0), q4_pair(wi, 1), q4_pair(wi, 2), q4_pair(wi, 3)};
#pragma unroll
          for (int j = 0; j < NT; ++j) {
            // x words 2i, 2i+1 of this lane's 16 activations of k-tile h.
            const uint4& v = xs[j][h][i >> 1];
            const uint32_t b0 = (i & 1) ? v.z : v.x, b1 = (i & 1) ? v.w : v.y;
            mma_bf16_16816(part[m][j], a, b0, b1);
          }
        }
      }
#pragma unroll
    for (int m = 0; m < MT; ++m) {
      const float s0 = __uint_as_float(sw[s][m] << 16), s1 = __uint_as_float(sw[s][m] & 0xffff0000u);
#pragma unroll
      for (int j = 0; j < NT; ++j) {
        acc[m][j][0] += s0 * part[m][j][0];
        acc[m][j][1] += s0 * part[m][j][1];
        acc[m][j][2] += s1 * part[m][j][2];
        acc[m][j][3] += s1 * part[m][j][3];
      }
    }
  }

  // Groups [gb, ge) of m-tiles rt.., ST-1 stages ahead. With pdl: the first weights are requested,
  // then pdl_wait (the activations come from the previous kernel).
  __device__ __forceinline__ void run(int rt, int gb, int ge, bool pdl) {
#pragma unroll
    for (int s = 0; s < ST - 1; ++s)
      if (gb + s < ge) load_w(s, rt, gb + s);
    if (pdl) pdl_wait();
    if constexpr (XS) {
#pragma unroll
      for (int s = 0; s < ST - 1; ++s)
        if (gb + s < ge) load_x(s, gb + s);
    }
#pragma unroll 1
    for (int gi = gb; gi < ge; gi += ST) {
#pragma unroll
      for (int s = 0; s < ST; ++s) {
        if (gi + s < ge) {
          if (gi + s + ST - 1 < ge) load((s + ST - 1) % ST, rt, gi + s + ST - 1);
          group(s, gi + s);
        }
      }
    }
  }

  // Value v of this lane's accumulators (v = (m*NT + j)*4 + e) and where it goes.
  __device__ __forceinline__ float value(int v) const {
    float out = 0.f;
#pragma unroll
    for (int m = 0; m < MT; ++m)
#pragma unroll
      for (int j = 0; j < NT; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e)
          if ((m * NT + j) * 4 + e == v) out = acc[m][j][e];
    return out;
  }
};

// Output feature n and activation row r of accumulator value v of `lane` for m-tile base rt0 and
// batch base r0 (the mma C-fragment layout).
__device__ __forceinline__ void gemv_out_index(int v, int NT, int lane, int rt0, int r0, int& n, int& r) {
  const int m = v / (NT * 4), j = (v / 4) % NT, e = v % 4;
  n = (rt0 + m) * 16 + (lane >> 2) + (e >= 2 ? 8 : 0);
  r = r0 + 8 * j + 2 * (lane & 3) + (e & 1);
}

template <int EPI>
__device__ __forceinline__ void gemv_store(bf16* y, int ldy, int n, int r, int N, int R, float s) {
  if (n < N && r < R) {
    bf16* o = y + (size_t)r * ldy + n;
    if (EPI == EPI_ADD) *o = to_bf(to_f(*o) + round_bf(s));
    else *o = to_bf(s);
  }
}

// MT: m-tiles (16 output rows) per warp; NT: n-tiles (8 activation rows) per warp, BTG = 8*NT;
// KS: warps per block splitting K; K: input width (a multiple of 128); EPI: GemvEpilogue;
// ST: pipeline stages, the groups of weights (and their scales) a warp has in flight, ST-1 of
// them ahead of the one it multiplies; XS: 1 = the activations of a group are loaded with its
// stage (ahead), 0 = when the group is multiplied (they mostly hit L1/L2).
// MT, NT, ST and XS change neither the arithmetic nor its order, only how it is scheduled: a
// row's result is bitwise the same for every choice of them (KS does change the sum order).
template <int K, int MT, int NT, int KS, int EPI, int ST = 2, int XS = 0>
__device__ __forceinline__ void gemv_q4(const uint4* __restrict__ qweight, const bf16* __restrict__ scales,
        const bf16* __restrict__ x, int ldx, bf16* y, int ldy, int N, int R) {
  using Wp = GemvWarp<K, MT, NT, ST, XS>;
  constexpr int NG = Wp::NG, V = Wp::V;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int rt0 = blockIdx.x * MT;  // first row tile of this block
  const int r0 = blockIdx.y * (8 * NT);
  Wp wp(qweight, scales, x, ldx, r0, R);
  // This warp's share of the groups: [gb, ge). The first ST-1 groups of weights are requested
  // before waiting on the kernel that writes x, so under programmatic dependent launch they
  // stream while that kernel finishes.
  pdl_launch_dependents();
  wp.run(rt0, (warp * NG) / KS, ((warp + 1) * NG) / KS, true);

  // Reduce the KS partial sums in a fixed order, then store.
  if constexpr (KS > 1) {
    __shared__ float red[KS][V][32];
#pragma unroll
    for (int v = 0; v < V; ++v) red[warp][v][lane] = wp.value(v);
    __syncthreads();
    // Thread t finalises value slots v = warp, warp+KS, ... for its lane.
#pragma unroll 1
    for (int v = warp; v < V; v += KS) {
      float s = 0.f;
#pragma unroll
      for (int w = 0; w < KS; ++w) s += red[w][v][lane];
      int n, r;
      gemv_out_index(v, NT, lane, rt0, r0, n, r);
      gemv_store<EPI>(y, ldy, n, r, N, R, s);
    }
  } else {
#pragma unroll
    for (int v = 0; v < V; ++v) {
      int n, r;
      gemv_out_index(v, NT, lane, rt0, r0, n, r);
      gemv_store<EPI>(y, ldy, n, r, N, R, wp.value(v));
    }
  }
}

// ------------------------------------------------------------------------------ split-K cluster
// The same product with the KS parts of K spread over the KS blocks of a thread-block cluster
// instead of the KS warps of a block, for batch tiles whose activations do not fit one SM's L1:
// block (rank p of its cluster) only ever reads part p of x, NT*8 rows x K/KS inputs, and walks a
// band of row tiles with it, so every SM keeps its slice of x in L1 and x is read from L2 about
// once per cluster instead of once per 16*MT output rows.
//
//   grid = (KS * bands, ceil(R / (8*NT))), cluster (KS, 1, 1), block 32*W threads (W warps),
//   dynamic smem GemvClusterLaunch::smem_bytes. Band b covers row tiles [b*tpb, (b+1)*tpb),
//   tpb = ceil(ceil(Np/16) / bands) rounded up to a multiple of MT (Np/16 must be one); each round, warp w of every block of the cluster computes the
//   same MT row tiles over its block's part; the partials meet in distributed shared memory after
//   one cluster barrier and block p sums its share of the round's outputs over the parts in part
//   order 0..KS-1, from 0 — the same sums in the same order as gemv_q4, so the two kernels give
//   bitwise the same rows. Partials are double-buffered: one barrier per round.
template <int MT, int NT, int KS, int W>
struct GemvClusterLaunch {
  static constexpr int threads = 32 * W;
  static constexpr int V = MT * NT * 4;
  static constexpr int smem_bytes = 2 * W * V * 32 * 4;
};

template <int K, int MT, int NT, int KS, int EPI, int W, int ST = 2, int XS = 0>
__device__ __forceinline__ void gemv_q4_cluster(const uint4* __restrict__ qweight,
        const bf16* __restrict__ scales, const bf16* __restrict__ x, int ldx, bf16* y, int ldy,
        int N, int R, int bands) {
  using Wp = GemvWarp<K, MT, NT, ST, XS>;
  constexpr int NG = Wp::NG, V = Wp::V;
  namespace cg = cooperative_groups;
  cg::cluster_group cluster = cg::this_cluster();
  extern __shared__ float gemv_red[];  // [2][W][V][32]
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int p = (int)cluster.block_rank();
  const int band = blockIdx.x / KS;
  const int tiles = (N + 15) / 16;
  const int tpb = ((tiles + bands - 1) / bands + MT - 1) / MT * MT;  // tiles % MT == 0 (caller)
  const int t0 = band * tpb, t1 = min(t0 + tpb, tiles);
  const int rounds = (tpb + W * MT - 1) / (W * MT);
  const int r0 = blockIdx.y * (8 * NT);
  const int gb = (p * NG) / KS, ge = ((p + 1) * NG) / KS;
  Wp wp(qweight, scales, x, ldx, r0, R);
  pdl_launch_dependents();
#pragma unroll 1
  for (int rd = 0; rd < rounds; ++rd) {
    const int rt = t0 + (rd * W + warp) * MT;
    float* mine = gemv_red + ((rd & 1) * W + warp) * V * 32;
    if (rt < t1) {  // warp-uniform; rt + MT <= t1 since tiles and tpb are multiples of MT
      wp.zero();
      wp.run(rt, gb, ge, rd == 0);
#pragma unroll
      for (int v = 0; v < V; ++v) mine[v * 32 + lane] = wp.value(v);
    } else if (rd == 0) {
      pdl_wait();
    }
    cluster.sync();  // the round's partials of all KS parts are visible cluster-wide
    // Block p finalises flat slots f = (w*V + v)*32 + l with f % (KS*32*W) in its share.
    const int base = (rd & 1) * W * V * 32;
#pragma unroll 1
    for (int f = (p * W + warp) * 32 + lane; f < W * V * 32; f += KS * W * 32) {
      const int wv = f / 32, l = f % 32, w = wv / V, v = wv % V;
      const int rtw = t0 + (rd * W + w) * MT;
      if (rtw >= t1) continue;
      float s = 0.f;
#pragma unroll
      for (int q = 0; q < KS; ++q) s += cluster.map_shared_rank(gemv_red, q)[base + f];
      int n, r;
      gemv_out_index(v, NT, l, rtw, r0, n, r);
      gemv_store<EPI>(y, ldy, n, r, N, R, s);
    }
  }
  cluster.sync();  // no block leaves while another still reads its shared memory
}

}  // namespace q38

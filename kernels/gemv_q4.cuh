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
  static_assert(K % 128 == 0, "K must be a multiple of 128");
  static_assert(ST >= 1 && ST <= 8, "gemv: 1 <= ST <= 8");
  constexpr int KT = K / 64;    // k-tiles per row tile
  constexpr int NG = K / 128;   // groups per row tile
  constexpr int XW = XS ? ST : 1;  // activation stages
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int g = lane >> 2, c = lane & 3;
  const int rt0 = blockIdx.x * MT;  // first row tile of this block
  const int r0 = blockIdx.y * (8 * NT);

  // This warp's share of the groups: [gb, ge).
  const int gb = (warp * NG) / KS, ge = ((warp + 1) * NG) / KS;

  // Activation row of each n-tile for this lane (n = g), clamped; rows >= R read row R-1
  // and are never stored.
  const bf16* xrow[NT];
#pragma unroll
  for (int j = 0; j < NT; ++j) {
    int r = r0 + 8 * j + g;
    xrow[j] = x + (size_t)(r < R ? r : R - 1) * ldx + 16 * c;
  }

  float acc[MT][NT][4];
#pragma unroll
  for (int m = 0; m < MT; ++m)
#pragma unroll
    for (int j = 0; j < NT; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[m][j][e] = 0.f;

  // Software pipeline over a ring of ST register stages. The ring index of every access is a
  // compile-time constant (the loop over a round of ST groups is unrolled), so it stays in
  // registers.
  uint4 w[ST][MT][2];
  uint32_t sw[ST][MT];           // bf16 scales of rows g and g+8 of each m-tile, packed
  uint4 xv[XW][NT][2][2];
  const unsigned short* sc16 = reinterpret_cast<const unsigned short*>(scales);
  auto load_x = [&](uint4 (&xs)[NT][2][2], int gi) {
    // Activations: 16 contiguous bf16 per k-tile per n-tile (FORMAT.md's column permutation).
#pragma unroll
    for (int j = 0; j < NT; ++j)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const uint4* p = reinterpret_cast<const uint4*>(xrow[j] + (2 * gi + h) * 64);
        xs[j][h][0] = __ldg(p);
        xs[j][h][1] = __ldg(p + 1);
      }
  };
  auto load_w = [&](int s, int gi) {  // weights and scales: constant, safe before pdl_wait
#pragma unroll
    for (int m = 0; m < MT; ++m) {
#pragma unroll
      for (int h = 0; h < 2; ++h)
        w[s][m][h] = ld_stream16(qweight + ((size_t)(rt0 + m) * KT + 2 * gi + h) * 32 + lane);
      const unsigned short* sp = sc16 + ((size_t)(rt0 + m) * NG + gi) * 16;
      sw[s][m] = (uint32_t)__ldg(sp + g) | ((uint32_t)__ldg(sp + g + 8) << 16);
    }
  };
  auto load = [&](int s, int gi) {
    load_w(s, gi);
    if constexpr (XS) load_x(xv[s], gi);
  };
  auto group = [&](int s, int gi) {
    if constexpr (!XS) load_x(xv[0], gi);
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
  };

  // The first ST-1 groups of weights are requested before waiting on the kernel that writes x,
  // so under programmatic dependent launch they stream while that kernel finishes.
  pdl_launch_dependents();
#pragma unroll
  for (int s = 0; s < ST - 1; ++s)
    if (gb + s < ge) load_w(s, gb + s);
  pdl_wait();
  if constexpr (XS) {
#pragma unroll
    for (int s = 0; s < ST - 1; ++s)
      if (gb + s < ge) load_x(xv[s], gb + s);
  }
#pragma unroll 1
  for (int gi = gb; gi < ge; gi += ST) {
#pragma unroll
    for (int s = 0; s < ST; ++s) {
      if (gi + s < ge) {
        if (gi + s + ST - 1 < ge) load((s + ST - 1) % ST, gi + s + ST - 1);
        group(s, gi + s);
      }
    }
  }

  // Reduce the KS partial sums in a fixed order, then store.
  constexpr int V = MT * NT * 4;  // values per lane
  if constexpr (KS > 1) {
    __shared__ float red[KS][V][32];
#pragma unroll
    for (int m = 0; m < MT; ++m)
#pragma unroll
      for (int j = 0; j < NT; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) red[warp][(m * NT + j) * 4 + e][lane] = acc[m][j][e];
    __syncthreads();
    // Thread t finalises value slots v = warp, warp+KS, ... for its lane.
#pragma unroll 1
    for (int v = warp; v < V; v += KS) {
      float s = 0.f;
#pragma unroll
      for (int w = 0; w < KS; ++w) s += red[w][v][lane];
      const int m = v / (NT * 4), j = (v / 4) % NT, e = v % 4;
      const int n = (rt0 + m) * 16 + g + (e >= 2 ? 8 : 0);
      const int r = r0 + 8 * j + 2 * c + (e & 1);
      if (n < N && r < R) {
        bf16* o = y + (size_t)r * ldy + n;
        if (EPI == EPI_ADD) *o = to_bf(to_f(*o) + round_bf(s));
        else *o = to_bf(s);
      }
    }
  } else {
#pragma unroll
    for (int m = 0; m < MT; ++m)
#pragma unroll
      for (int j = 0; j < NT; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int n = (rt0 + m) * 16 + g + (e >= 2 ? 8 : 0);
          const int r = r0 + 8 * j + 2 * c + (e & 1);
          if (n < N && r < R) {
            bf16* o = y + (size_t)r * ldy + n;
            if (EPI == EPI_ADD) *o = to_bf(to_f(*o) + round_bf(acc[m][j][e]));
            else *o = to_bf(acc[m][j][e]);
          }
        }
  }
}

}  // namespace q38

// rmsnorm.cuh: zero-centred RMSNorm (docs/MODEL.md §3, RMS1p), one block per row:
//   y[r, :] = bf16( x[r, :] / sqrt(mean(x[r, :]²) + eps) · (1 + w) )
// fp32 statistics and products, one rounding to bf16 at the end (as HF: (x̂ · (1 + w.float()))
// then cast).
//
// In:  x bf16 [R, H] (rows contiguous), w bf16 [H] (zero-centred weight), eps (runtime float).
// Out: y bf16 [R, H]; y may alias x (each thread writes only the 16-byte chunks it read).
//      With TNT > 0, y is in wgmma_q4's activation tile order instead (common.cuh, xtile_store).
// Base pointers 16-byte aligned.
//
// Launch (RmsnormLaunch holds the same numbers): grid = R, block = NT threads, no dynamic smem.
// Entry point: extern "C" __global__ void __launch_bounds__(q38::RmsnormLaunch<H, NT>::threads)
//              NAME(const bf16* x, const bf16* w, bf16* y, float eps) { q38::rmsnorm_1p<H, NT>(...); }
// The body calls pdl_wait() itself, after requesting w (the entry point must not wait first).
// Each thread loads H / (8·NT) chunks of 8 bf16 (16-byte loads). rmsnorm_threads(H) is the default
// NT: the largest multiple of 32 up to 1024 that divides H/8 (H = 512: 64; H = 5120: 640, one
// chunk per thread, so a decode row is one round trip).
//
// Compiles alone (syntax only):
//   nvcc -arch=sm_90 -std=c++17 -cubin -Xptxas -v -x cu kernels/rmsnorm.cuh -o /dev/null
// With tiny and 27B instances, for the resource report:
//   nvcc -arch=sm_90 -std=c++17 -cubin -Xptxas -v -DQ38_RMSNORM_SELFCHECK -x cu kernels/rmsnorm.cuh -o /dev/null
#pragma once
#include "common.cuh"

namespace q38 {

// Default block size for width H: the largest NT = 32·m <= 1024 with (H/8) % NT == 0.
__host__ __device__ constexpr int rmsnorm_threads(int H) {
  int best = 0;
  for (int nt = 32; nt <= 1024; nt += 32)
    if ((H / 8) % nt == 0) best = nt;
  return best;
}

// H: row width (hidden size); NT: threads per block.
template <int H, int NT>
struct RmsnormLaunch {
  static_assert(H % 8 == 0, "rmsnorm: H must be a multiple of 8 (16-byte chunks)");
  static_assert(NT % 32 == 0 && NT <= 1024, "rmsnorm: NT must be a multiple of 32, at most 1024");
  static_assert((H / 8) % NT == 0, "rmsnorm: NT must divide H/8");
  static constexpr int threads = NT;
  static constexpr int chunks = H / (8 * NT);  // 16-byte chunks per thread
  static constexpr int smem_bytes = 0;
};

// rmsnorm_1p_ld: the same with row strides (elements, multiples of 8): row r is read at
// x + r·ldx and written at y + r·ldy (the mtp lane writes RMS1p(e) and RMS1p(h) into the two
// halves of one [R, 2H] row for the fc GEMV). rmsnorm_1p is rmsnorm_1p_ld with ldx = ldy = H.
// The normed row in shared memory (TNT > 0): chunk i <- v for i >= 0; returns the row.
template <int H, int TNT>
__device__ __forceinline__ const uint4* srow_store(int i, uint4 v) {
  __shared__ uint4 srow[H / 8];
  if (i >= 0) srow[i] = v;
  return srow;
}

// TNT > 0: y is written in wgmma_q4's activation tile order for batch tiles of 8·TNT rows
// (xtile_store, K = ldy, through shared memory; the next GEMV reads it with XT = 1); y must
// not alias x then.
template <int H, int NT, int TNT = 0>
__device__ __forceinline__ void rmsnorm_1p_ld(const bf16* x, int ldx, const bf16* __restrict__ w,
                                              bf16* y, int ldy, float eps) {
  constexpr int V = RmsnormLaunch<H, NT>::chunks;
  __shared__ float scratch[NT / 32];
  const size_t row = blockIdx.x;
  const uint4* xr = reinterpret_cast<const uint4*>(x + row * ldx);
  // The weight is constant: requested before the wait, so that under PDL only x's L2 round trip
  // separates the previous kernel's end from the sum (bench --trace; docs/PERFORMANCE.md,
  // version 14).
  uint4 wv[V];
#pragma unroll
  for (int c = 0; c < V; ++c) wv[c] = ldg16(w + 8 * (threadIdx.x + c * NT));
  pdl_wait();
  uint4 xv[V];
  float ss = 0.f;
#pragma unroll
  for (int c = 0; c < V; ++c) {
    xv[c] = xr[threadIdx.x + c * NT];  // plain load: y may alias x
    const bf162* p = reinterpret_cast<const bf162*>(&xv[c]);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const float2 f = __bfloat1622float2(p[i]);
      ss = fmaf(f.x, f.x, fmaf(f.y, f.y, ss));
    }
  }
  ss = block_sum<NT>(ss, scratch);
  const float r = rsqrtf(ss / (float)H + eps);
  uint4* yr = reinterpret_cast<uint4*>(y + row * ldy);
#pragma unroll
  for (int c = 0; c < V; ++c) {
    const bf162* px = reinterpret_cast<const bf162*>(&xv[c]);
    const bf162* pw = reinterpret_cast<const bf162*>(&wv[c]);
    uint4 out;
    bf162* po = reinterpret_cast<bf162*>(&out);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const float2 f = __bfloat1622float2(px[i]);
      const float2 g = __bfloat1622float2(pw[i]);
      po[i] = __floats2bfloat162_rn((f.x * r) * (1.f + g.x), (f.y * r) * (1.f + g.y));
    }
    if constexpr (TNT > 0) srow_store<H, TNT>(threadIdx.x + c * NT, out);
    else yr[threadIdx.x + c * NT] = out;
  }
  if constexpr (TNT > 0) {
    // The row through shared memory, so that each thread stores whole 16-byte core rows: unit u
    // (group u / 4, k-tile u / 2 % 2, half u % 2) is the chunks 16g + 8kt + 2j + ih, j = 0..3.
    __syncthreads();
    const uint4* srow = srow_store<H, TNT>(-1, uint4{});
    for (int u = threadIdx.x; u < H / 32; u += NT) {
      const int gi = u >> 2, kt = (u >> 1) & 1, ih = u & 1;
      const uint4 v[4] = {srow[16 * gi + 8 * kt + ih], srow[16 * gi + 8 * kt + 2 + ih],
                          srow[16 * gi + 8 * kt + 4 + ih], srow[16 * gi + 8 * kt + 6 + ih]};
      xtile_store<TNT>(y, ldy, (int)row, gi, kt, ih, v);
    }
  }
}

template <int H, int NT, int TNT = 0>
__device__ __forceinline__ void rmsnorm_1p(const bf16* x, const bf16* __restrict__ w, bf16* y,
                                           float eps) {
  rmsnorm_1p_ld<H, NT, TNT>(x, H, w, y, H, eps);
}

}  // namespace q38

#ifdef Q38_RMSNORM_SELFCHECK
#define Q38_RMSNORM_SELFCHECK_ENTRY(name, H, NT)                                                \
  extern "C" __global__ void __launch_bounds__(q38::RmsnormLaunch<H, NT>::threads)              \
      name(const q38::bf16* x, const q38::bf16* w, q38::bf16* y, float eps) {                  \
    q38::rmsnorm_1p<H, NT>(x, w, y, eps);                                                     \
  }
Q38_RMSNORM_SELFCHECK_ENTRY(rmsnorm_tiny, 512, q38::rmsnorm_threads(512))
Q38_RMSNORM_SELFCHECK_ENTRY(rmsnorm_27b, 5120, q38::rmsnorm_threads(5120))
Q38_RMSNORM_SELFCHECK_ENTRY(rmsnorm_27b_nt320, 5120, 320)
extern "C" __global__ void __launch_bounds__(640)
    rmsnorm_ld_27b(const q38::bf16* x, int ldx, const q38::bf16* w, q38::bf16* y, int ldy, float eps) {
  q38::rmsnorm_1p_ld<5120, 640>(x, ldx, w, y, ldy, eps);
}
#endif

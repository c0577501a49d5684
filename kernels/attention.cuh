// attention.cuh: gated full attention (MODEL.md §4.1, §5) for one decode step (PT = 1) or one
// prefill chunk (PT > 1) of B sequences, in two kernels.
//
// Rows r = b*PT + t (R = B*PT); row r is token t of sequence b, at position p = pos[b] + t; rows
// t >= ntok[b] are padding (docs/KERNELS.md). G = H / HKV query heads share kv head m = j / G.
//
// attn_prep — QK-norm, partial NeoX RoPE, cache append:
//   in   qkv     bf16 [R, ld]   fused q|k|v projection, ld % 8 == 0: columns [2Dj, 2Dj+D) are the
//                               query of head j and [2Dj+D, 2D(j+1)) its gate (j < H); then k head m
//                               at 2HD + Dm, v head m at 2HD + HKV·D + Dm
//        q_norm, k_norm bf16 [D] (zero-centred, used as 1 + w), eps, theta, pos/ntok int32 [B]
//   out  qbuf    bf16 [R, H, D]  RoPE_p(RMS1p(q_j; q_norm)) for every row (padding rows too)
//        kc, vc  bf16 [B, HKV, Tmax, D] (this layer's slice): slot p of (b, m) <- RoPE_p(RMS1p(k_m;
//                k_norm)) and v_m (raw), only for rows t < ntok[b] with p < Tmax; no other slot
//                is touched. The gate stays in qkv; attn reads it there.
//   Launch AttnPrepLaunch: grid (R, grid_y), block `threads`, no dynamic smem. One warp per
//   (row, head) over the H q, HKV k and HKV v heads of the row; a lane owns 8 dims (16 bytes).
//   Numerics (MODEL.md §7): RMS statistic in fp32, normed value rounded to bf16 (as HF stores it),
//   rotation in fp32 from it, rounded to bf16. Angle p·ω_i in fp32 like HF (ω_i = 1/θ^(2i/RD) as a
//   correctly rounded fp32), reduced mod 2π in fp64 (exact for that fp32 angle, p ≤ 2^24), then
//   __sincosf on [−π, π] (absolute error ≤ 2^-21.4 there). sincosf itself would be as accurate
//   but its large-argument path (|φ| > 105615, i.e. positions past ~1e5) needs a local-memory stack.
//
// attn — causal softmax over the cache, output gate:
//   in   qbuf (above), qkv (for the gates), kc, vc, Tmax, pos, ntok
//   out  o bf16 [R, H*D] (head-major, ready for o_proj):
//          o[r, jD + d] = bf16( σ(gate_j[d]) · Σ_s softmax_s(q_j·K_m[s] / √D) · V_m[s][d] ),
//          s = 0 .. min(p, Tmax−1); padding rows get exact zeros.
//   Launch AttnLaunch: grid (B*HKV, PT), block `threads`, static smem (warps·D + 2·warps·G)·4 bytes
//   (8.4 KiB at G = 6), no dynamic smem.
//   One block per (sequence, kv head, chunk token) serves that token's G query heads, so each K/V
//   vector loaded is used G times. Its warps take U consecutive slots each in turn (16-byte loads,
//   a lane owns 8 dims) and keep their own online softmax (running max, sum and o for G heads) in
//   registers, in the log2 domain; at the end the warp states are merged in shared memory in a
//   fixed order, so the result is deterministic. fp32 throughout, one bf16 rounding at the end.
//   Performance note: this is the simple single pass. It streams K/V once per (b, m, t), with only
//   B·HKV·PT blocks; for B·HKV well below the 132 SMs and long contexts the lever is split-K
//   ("flash decoding"): a grid.z that splits the slots, each split writing its (max, sum, o)
//   partials, and a second kernel that merges them exactly as the end of attn does. A prefill
//   chunk re-reads the K/V of (b, m) once per token (from L2); a tensor-core tile over the chunk's
//   tokens is the lever there.
//
// Template parameters: D head_dim (256: a warp covers one head with one 16-byte vector per lane),
// RD rotary dims (MODEL.md's R = 64), H / HKV query / kv heads, PT rows per sequence.
//
// Entry points (docs/KERNELS.md), e.g. for the tiny geometry's decode:
//   extern "C" __global__ void __launch_bounds__(q38::AttnPrepLaunch<256, 64, 6, 2, 1>::threads)
//   q38_attn_prep_tiny(ARGS) { q38::attn_prep<256, 64, 6, 2, 1>(ARGS); }
//   extern "C" __global__ void __launch_bounds__(q38::AttnLaunch<256, 6, 2, 1>::threads)
//   q38_attn_tiny(ARGS) { q38::attn<256, 6, 2, 1>(ARGS); }
//
// Compiles alone:
//   nvcc -arch=sm_90 -std=c++17 -cubin -Xptxas -v -x cu kernels/attention.cuh -o /dev/null
#pragma once
#include "common.cuh"

namespace q38 {

template <int D, int RD, int H, int HKV, int PT>
struct AttnPrepLaunch {
  static constexpr int warps = 8;
  static constexpr int threads = 32 * warps;
  static constexpr int heads = H + 2 * HKV;                   // warps of work per row
  static constexpr int grid_y = (heads + warps - 1) / warps;  // grid = (B*PT, grid_y)
};

template <int D, int H, int HKV, int PT>
struct AttnLaunch {
  static constexpr int G = H / HKV;
  static constexpr int warps = 8;
  static constexpr int threads = 32 * warps;
  // Slots per warp and step: 8 loads of 16 bytes in flight per lane. At G = 6 this is ~208
  // registers, still one 256-thread block per SM like U = 2 (~176), so the deeper prefetch is free.
  static constexpr int unroll = 4;
  // grid = (B*HKV, PT); static smem = (warps*D + 2*warps*G) * 4 bytes
};

// cos/sin of the RoPE angle p·ω_f, ω_f = 1/θ^(2f/RD), as described above.
__device__ __forceinline__ void rope_cos_sin(int p, float theta, int f, int rd, float& c,
                                             float& s) {
  const float inv_freq = (float)(1.0 / pow((double)theta, (double)(2 * f) / (double)rd));
  const float ang = (float)p * inv_freq;                           // fp32, as HF
  const double k = rint((double)ang * 0.15915494309189535);        // ang / 2π
  const double red = fma(-k, 6.283185307179586, (double)ang) - k * 2.4492935982947064e-16;
  __sincosf((float)red, &s, &c);
}

template <int D, int RD, int H, int HKV, int PT>
__device__ __forceinline__ void attn_prep(const bf16* __restrict__ qkv, int ld,
                                          const bf16* __restrict__ q_norm,
                                          const bf16* __restrict__ k_norm, float eps, float theta,
                                          const int* __restrict__ pos, const int* __restrict__ ntok,
                                          bf16* __restrict__ qbuf, bf16* __restrict__ kc,
                                          bf16* __restrict__ vc, int tmax) {
  static_assert(D == 256, "attn_prep: a warp owns one head of 256 dims, 8 per lane");
  static_assert(RD % 16 == 0 && RD <= D, "attn_prep: rotary halves must be whole lanes");
  static_assert(H % HKV == 0, "attn_prep: H must be a multiple of HKV");
  using L = AttnPrepLaunch<D, RD, H, HKV, PT>;
  constexpr int HALF = RD / 2;
  __shared__ float cs[2][HALF];  // cos, sin of this row's angles

  const int lane = threadIdx.x & 31;
  const int r = blockIdx.x, b = r / PT, t = r - b * PT;
  const int p = pos[b] + t;
  if (threadIdx.x < HALF)
    rope_cos_sin(p, theta, threadIdx.x, RD, cs[0][threadIdx.x], cs[1][threadIdx.x]);
  __syncthreads();

  const int w = blockIdx.y * L::warps + (threadIdx.x >> 5);
  if (w >= L::heads) return;
  const bool store_kv = t < ntok[b] && p < tmax;
  const bf16* row = qkv + (size_t)r * ld;

  if (w >= H + HKV) {  // v head: raw copy into the cache
    if (!store_kv) return;
    const int m = w - H - HKV;
    const uint4 v = ldg16(row + 2 * H * D + HKV * D + m * D + lane * 8);
    *reinterpret_cast<uint4*>(vc + (((size_t)b * HKV + m) * tmax + p) * D + lane * 8) = v;
    return;
  }
  const bool is_q = w < H;
  if (!is_q && !store_kv) return;

  float x[8], nw[8];
  unpack_bf16x8(ldg16(row + (is_q ? 2 * D * w : 2 * H * D + (w - H) * D) + lane * 8), x);
  unpack_bf16x8(ldg16((is_q ? q_norm : k_norm) + lane * 8), nw);
  float ss = 0.f;
#pragma unroll
  for (int i = 0; i < 8; ++i) ss = fmaf(x[i], x[i], ss);
  const float inv = rsqrtf(warp_sum(ss) * (1.f / D) + eps);
#pragma unroll
  for (int i = 0; i < 8; ++i) x[i] = round_bf(x[i] * inv * (1.f + nw[i]));  // RMS1p, stored bf16

  // Rotate-half: dim i < RD/2 pairs with i + RD/2, which sits HL lanes further on.
  constexpr int HL = RD / 16, RL = RD / 8;  // lanes per rotary half, lanes holding rotary dims
  const int src = lane < HL ? lane + HL : (lane < RL ? lane - HL : lane);
  float y[8];
#pragma unroll
  for (int i = 0; i < 8; ++i) y[i] = __shfl_sync(0xffffffffu, x[i], src);
  if (lane < RL) {
    // u_i' = u_i c − u_{i+RD/2} s (first half);  u_{i+RD/2}' = u_{i+RD/2} c + u_i s (second)
    const bool first = lane < HL;
    const int f0 = (first ? lane : lane - HL) * 8;
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const float c = cs[0][f0 + i], s = cs[1][f0 + i];
      x[i] = first ? fmaf(x[i], c, -y[i] * s) : fmaf(x[i], c, y[i] * s);
    }
  }
  const uint4 out = pack_bf16x8(x);
  if (is_q) {
    *reinterpret_cast<uint4*>(qbuf + ((size_t)r * H + w) * D + lane * 8) = out;
  } else {
    const int m = w - H;
    *reinterpret_cast<uint4*>(kc + (((size_t)b * HKV + m) * tmax + p) * D + lane * 8) = out;
  }
}

template <int D, int H, int HKV, int PT>
__device__ __forceinline__ void attn(const bf16* __restrict__ qbuf, const bf16* __restrict__ qkv,
                                     int ld, const bf16* __restrict__ kc,
                                     const bf16* __restrict__ vc, int tmax,
                                     const int* __restrict__ pos, const int* __restrict__ ntok,
                                     bf16* __restrict__ o) {
  static_assert(D == 256, "attn: a warp owns one head of 256 dims, 8 per lane");
  static_assert(H % HKV == 0, "attn: H must be a multiple of HKV");
  using L = AttnLaunch<D, H, HKV, PT>;
  constexpr int G = L::G, NW = L::warps, U = L::unroll;
  __shared__ float sm_ml[2][NW][G];            // per warp: running max, running sum
  __shared__ __align__(16) float sm_o[NW][D];  // per warp: o of one head, during the merge

  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int b = blockIdx.x / HKV, m = blockIdx.x - b * HKV, t = blockIdx.y;
  const int r = b * PT + t;
  bf16* orow = o + (size_t)r * (H * D) + m * G * D;  // this block's G heads, contiguous
  if (t >= ntok[b]) {  // padding row: zeros (uniform over the block, before any barrier)
    for (int i = threadIdx.x; i < G * D / 8; i += L::threads)
      reinterpret_cast<uint4*>(orow)[i] = make_uint4(0u, 0u, 0u, 0u);
    return;
  }
  const int n = min(pos[b] + t + 1, tmax);  // causal: slots 0 .. p

  // q pre-scaled by log2(e)/√D: scores come out in the log2 domain.
  const float qscale = 1.4426950408889634f * rsqrtf((float)D);
  float q[G][8];
#pragma unroll
  for (int g = 0; g < G; ++g) {
    unpack_bf16x8(ldg16(qbuf + ((size_t)r * H + m * G + g) * D + lane * 8), q[g]);
#pragma unroll
    for (int i = 0; i < 8; ++i) q[g][i] *= qscale;
  }
  float mx[G], sum[G], acc[G][8];
#pragma unroll
  for (int g = 0; g < G; ++g) {
    mx[g] = -INFINITY;
    sum[g] = 0.f;
#pragma unroll
    for (int i = 0; i < 8; ++i) acc[g][i] = 0.f;
  }

  const size_t base = ((size_t)b * HKV + m) * tmax * D + lane * 8;
  const bf16* kp = kc + base;
  const bf16* vp = vc + base;
  for (int s0 = warp * U; s0 < n; s0 += NW * U) {  // slot s0 < n always: mx becomes finite
    uint4 kr[U], vr[U];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      kr[u] = vr[u] = make_uint4(0u, 0u, 0u, 0u);  // slots >= n are never read
      if (s0 + u < n) {
        kr[u] = ldg16(kp + (size_t)(s0 + u) * D);
        vr[u] = ldg16(vp + (size_t)(s0 + u) * D);
      }
    }
    float sc[G][U];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      float k[8];
      unpack_bf16x8(kr[u], k);
#pragma unroll
      for (int g = 0; g < G; ++g) {
        float d = 0.f;
#pragma unroll
        for (int i = 0; i < 8; ++i) d = fmaf(q[g][i], k[i], d);
        sc[g][u] = warp_sum(d);
      }
    }
#pragma unroll
    for (int u = 0; u < U; ++u)
      if (s0 + u >= n)
#pragma unroll
        for (int g = 0; g < G; ++g) sc[g][u] = -INFINITY;
    // Online softmax: m' = max(m, s_u); o ← o·2^(m−m') + Σ_u 2^(s_u−m') V_u; l likewise.
#pragma unroll
    for (int g = 0; g < G; ++g) {
      float mn = mx[g];
#pragma unroll
      for (int u = 0; u < U; ++u) mn = fmaxf(mn, sc[g][u]);
      const float corr = exp2f(mx[g] - mn);
      mx[g] = mn;
      sum[g] *= corr;
#pragma unroll
      for (int i = 0; i < 8; ++i) acc[g][i] *= corr;
#pragma unroll
      for (int u = 0; u < U; ++u) {
        sc[g][u] = exp2f(sc[g][u] - mn);
        sum[g] += sc[g][u];
      }
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      float v[8];
      unpack_bf16x8(vr[u], v);
#pragma unroll
      for (int g = 0; g < G; ++g)
#pragma unroll
        for (int i = 0; i < 8; ++i) acc[g][i] = fmaf(sc[g][u], v[i], acc[g][i]);
    }
  }

  // Merge the warps: M = max_w m_w, L = Σ_w l_w 2^(m_w − M), o = Σ_w o_w 2^(m_w − M) / L.
  // A warp that got no slot has m_w = −inf, l_w = 0, o_w = 0 and weighs 0; warp 0 always has
  // slot 0, so M is finite.
  if (lane == 0) {
#pragma unroll
    for (int g = 0; g < G; ++g) {
      sm_ml[0][warp][g] = mx[g];
      sm_ml[1][warp][g] = sum[g];
    }
  }
  __syncthreads();
#pragma unroll
  for (int g = 0; g < G; ++g) {
    float M = -INFINITY, Ls = 0.f;
#pragma unroll
    for (int w = 0; w < NW; ++w) M = fmaxf(M, sm_ml[0][w][g]);
#pragma unroll
    for (int w = 0; w < NW; ++w) Ls += sm_ml[1][w][g] * exp2f(sm_ml[0][w][g] - M);
    const float f = exp2f(mx[g] - M) / Ls;
#pragma unroll
    for (int i = 0; i < 8; ++i) acc[g][i] *= f;
  }
  const bf16* gate = qkv + (size_t)r * ld + D;  // gate of head j at gate + 2Dj
#pragma unroll
  for (int g = 0; g < G; ++g) {
    float4* dst = reinterpret_cast<float4*>(&sm_o[warp][lane * 8]);
    dst[0] = make_float4(acc[g][0], acc[g][1], acc[g][2], acc[g][3]);
    dst[1] = make_float4(acc[g][4], acc[g][5], acc[g][6], acc[g][7]);
    __syncthreads();
    const int j = m * G + g;
    for (int d = threadIdx.x; d < D; d += L::threads) {
      float s = 0.f;
#pragma unroll
      for (int w = 0; w < NW; ++w) s += sm_o[w][d];
      orow[g * D + d] = to_bf(s * sigmoidf_(to_f(gate[2 * D * j + d])));
    }
    __syncthreads();  // sm_o is rewritten for the next head
  }
}

}  // namespace q38

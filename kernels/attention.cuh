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
// attn — causal softmax over the cache, output gate, split-K ("flash decoding"):
//   in   qbuf (above), qkv (for the gates), kc, vc, Tmax, pos, ntok
//   out  o bf16 [R, H*D] (head-major, ready for o_proj):
//          o[r, jD + d] = bf16( σ(gate_j[d]) · Σ_s softmax_s(q_j·K_m[s] / √D) · V_m[s][d] ),
//          s = 0 .. n−1, n = min(p + 1, Tmax); padding rows get exact zeros.
//   scratch  part fp32 [R, HKV, stride(Tmax), part_floats]: one partial per split, o[G][D]
//              (unnormalised), then m[G], l[G], padded to 16 bytes; any content on entry.
//            arrivals int32 [R, HKV]: all 0 before the first launch; every launch leaves it 0,
//              so one pair of buffers serves every attention layer launched on a stream.
//   Split: a row's n slots are cut into ns(n) = ⌈n / span(n)⌉ splits of span(n) slots,
//   span(n) = split · ⌈⌈n / split⌉ / max_splits⌉ (split = 64, max_splits = 32: 64-slot splits up
//   to n = 2048, then at most 32 splits of a whole number of 64-slot tiles). It depends on n only,
//   never on B or the grid, so a row's bits are the same at every batch size.
//   Launch AttnLaunch: grid (gx, B*HKV, PT), block `threads`, static smem (2·warps·G +
//   warps·merge_heads·D + 2·max_splits·G + 1)·4 bytes (25.9 KiB at G = 6), no dynamic smem.
//   gx ≥ 1 is free (ops.attn_grid_x: ~264 blocks in all, at most max_splits): block x computes
//   splits x, x + gx, … of its row, one after the other (blocks with x ≥ ns exit at once). The
//   splits run fastest in the grid, so a row's partials are merged while still in L2. Which
//   block computes a split changes no bit of it.
//   Within a split: one block per (sequence, kv head, chunk token, split) serves that token's G
//   query heads, so each K/V vector loaded is used G times. Its warps take U consecutive slots
//   each in turn (16-byte loads, a lane owns 8 dims) and keep their own online softmax (running
//   max, sum and o for G heads) in registers, in the log2 domain; at the end the warp states are
//   merged in shared memory in a fixed order (M = max m_w, L = Σ_w l_w 2^(m_w−M), o = Σ_w o_w
//   2^(m_w−M), w = 0, 1, … in order). One split (n ≤ 64): o/L is gated and written as bf16 right
//   there (no scratch, no counter; the arithmetic of the single-pass kernel before split-K).
//   Several: (M, L, o) go to the split's partial; the block then __threadfence()s and adds its
//   count of splits to arrivals[r, m]; the block that brings it to ns resets it to 0 and merges
//   the ns partials read through L2 (__ldcg), in split order z = 0, 1, …, exactly like the warp
//   merge: M = max m_z, L = Σ_z l_z 2^(m_z−M), o = Σ_z o_z · (2^(m_z−M)/L), then the gate and the
//   one bf16 rounding. fp32 throughout. Deterministic: no float atomics, fixed merge orders.
//   Performance note: at B = 1, n = 1024 that is 16 splits × HKV blocks instead of HKV; at large
//   B·HKV (gx = 1) a block streams its row like the single pass did, plus one warp merge and one
//   partial (6 KiB at G = 6) per 64 slots and the final merge. A prefill chunk re-reads the K/V of
//   (b, m) once per token (from L2); a tensor-core tile over the chunk's tokens is the lever there.
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
  // Split-K: a row of n slots is cut into ns(n) splits of span(n) slots (a multiple of `split`),
  // at most max_splits of them; both depend on n only, never on B or the grid.
  static constexpr int split = 64;
  static constexpr int max_splits = 32;
  // Heads per round of the in-block warp merge (shared memory sm_o[warps][merge_heads][D]).
  static constexpr int merge_heads = G % 3 == 0 ? 3 : (G % 2 == 0 ? 2 : 1);
  // One split's partial in the scratch: o[G][D] (unnormalised), then m[G], l[G], padded to 16 B.
  static constexpr int part_floats = G * D + (2 * G + 3) / 4 * 4;
  __host__ __device__ static constexpr int span(int n) {
    return split * (((n + split - 1) / split + max_splits - 1) / max_splits);
  }
  __host__ __device__ static constexpr int splits(int n) { return (n + span(n) - 1) / span(n); }
  // Partials per (row, kv head) in the scratch: the most splits any n <= tmax has.
  __host__ __device__ static constexpr int stride(int tmax) {
    return (tmax + split - 1) / split < max_splits ? (tmax + split - 1) / split : max_splits;
  }
  // grid = (gx, B*HKV, PT), gx >= 1 free (ops.attn_grid_x); static smem =
  // (2*warps*G + warps*merge_heads*D + 2*max_splits*G + 1) * 4 bytes
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
                                     float* __restrict__ part, int* __restrict__ arrivals,
                                     bf16* __restrict__ o) {
  static_assert(D == 256, "attn: a warp owns one head of 256 dims, 8 per lane");
  static_assert(H % HKV == 0, "attn: H must be a multiple of HKV");
  using L = AttnLaunch<D, H, HKV, PT>;
  constexpr int G = L::G, NW = L::warps, U = L::unroll, GR = L::merge_heads, PF = L::part_floats;
  static_assert(G % GR == 0 && (GR * D) % L::threads == 0, "attn: merge rounds must tile G");
  static_assert(L::split % (NW * U) == 0, "attn: a split is whole block steps");
  __shared__ float sm_ml[2][NW][G];                // per warp: running max, running sum
  __shared__ __align__(16) float sm_o[NW][GR][D];  // per warp: o of GR heads, during the merge
  __shared__ float sm_w[2][L::max_splits][G];      // split merge: m, l, then the weights
  __shared__ int s_last;

  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int b = blockIdx.y / HKV, m = blockIdx.y - b * HKV, t = blockIdx.z;
  const int r = b * PT + t;
  bf16* orow = o + (size_t)r * (H * D) + m * G * D;  // this block's G heads, contiguous
  const int nt = ntok[b], p = pos[b] + t;
  if (t >= nt) {  // padding row: zeros from block x = 0 (uniform over the block, no barrier yet)
    if (blockIdx.x == 0)
      for (int i = threadIdx.x; i < G * D / 8; i += L::threads)
        reinterpret_cast<uint4*>(orow)[i] = make_uint4(0u, 0u, 0u, 0u);
    return;
  }
  const int n = min(p + 1, tmax);  // causal: slots 0 .. p
  const int len = L::span(n), ns = L::splits(n);
  if ((int)blockIdx.x >= ns) return;  // no split for this block
  float* prow = part + ((size_t)r * HKV + m) * L::stride(tmax) * PF;
  const bf16* gate = qkv + (size_t)r * ld + D;  // gate of head j at gate + 2Dj

  // q pre-scaled by log2(e)/√D: scores come out in the log2 domain.
  const float qscale = 1.4426950408889634f * rsqrtf((float)D);
  float q[G][8];
#pragma unroll
  for (int g = 0; g < G; ++g) {
    unpack_bf16x8(ldg16(qbuf + ((size_t)r * H + m * G + g) * D + lane * 8), q[g]);
#pragma unroll
    for (int i = 0; i < 8; ++i) q[g][i] *= qscale;
  }

  const size_t base = ((size_t)b * HKV + m) * tmax * D + lane * 8;
  const bf16* kp = kc + base;
  const bf16* vp = vc + base;
  int mine = 0;  // splits this block computed
  for (int z = blockIdx.x; z < ns; z += gridDim.x, ++mine) {
    const int s_end = min(n, (z + 1) * len);
    float mx[G], sum[G], acc[G][8];
#pragma unroll
    for (int g = 0; g < G; ++g) {
      mx[g] = -INFINITY;
      sum[g] = 0.f;
#pragma unroll
      for (int i = 0; i < 8; ++i) acc[g][i] = 0.f;
    }
    // slot s0 < s_end always: mx becomes finite
    for (int s0 = z * len + warp * U; s0 < s_end; s0 += NW * U) {
      uint4 kr[U], vr[U];
#pragma unroll
      for (int u = 0; u < U; ++u) {
        kr[u] = vr[u] = make_uint4(0u, 0u, 0u, 0u);  // slots >= s_end are never read
        if (s0 + u < s_end) {
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
        if (s0 + u >= s_end)
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

    // Merge the warps: M = max_w m_w, L = Σ_w l_w 2^(m_w − M), o = Σ_w o_w 2^(m_w − M) [/ L].
    // A warp that got no slot has m_w = −inf, l_w = 0, o_w = 0 and weighs 0; warp 0 always has
    // the split's first slot, so M is finite. One split (ns = 1): o is final, normalised, gated
    // and written as bf16. Several: (M, L, unnormalised o) go to this split's partial.
    float* pz = prow + (size_t)z * PF;
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
      const float e = exp2f(mx[g] - M);
      const float f = ns == 1 ? e / Ls : e;
#pragma unroll
      for (int i = 0; i < 8; ++i) acc[g][i] *= f;
      if (ns > 1 && threadIdx.x == 0) {
        pz[G * D + g] = M;
        pz[G * D + G + g] = Ls;
      }
    }
#pragma unroll
    for (int g0 = 0; g0 < G; g0 += GR) {
#pragma unroll
      for (int gg = 0; gg < GR; ++gg) {
        float4* dst = reinterpret_cast<float4*>(&sm_o[warp][gg][lane * 8]);
        dst[0] = make_float4(acc[g0 + gg][0], acc[g0 + gg][1], acc[g0 + gg][2], acc[g0 + gg][3]);
        dst[1] = make_float4(acc[g0 + gg][4], acc[g0 + gg][5], acc[g0 + gg][6], acc[g0 + gg][7]);
      }
      __syncthreads();
#pragma unroll
      for (int k = 0; k < GR * D / L::threads; ++k) {
        const int idx = threadIdx.x + k * L::threads, gg = idx / D, d = idx - gg * D;
        const int g = g0 + gg;
        float s = 0.f;
#pragma unroll
        for (int w = 0; w < NW; ++w) s += sm_o[w][gg][d];
        if (ns == 1)
          orow[g * D + d] = to_bf(s * sigmoidf_(to_f(gate[2 * D * (m * G + g) + d])));
        else
          pz[g * D + d] = s;
      }
      __syncthreads();  // sm_o (and sm_ml) are rewritten next
    }
  }
  if (ns == 1) return;

  // Several splits: this block's partials are out; count them in arrivals[r, m]. The block that
  // brings the count to ns merges all ns partials (in split order) and resets the counter, so
  // every launch finds it at 0.
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) {
    int* cnt = arrivals + (size_t)r * HKV + m;
    const int last = atomicAdd(cnt, mine) + mine == ns;
    if (last) *cnt = 0;  // every split has arrived: nothing else touches it in this launch
    __threadfence();
    s_last = last;
  }
  __syncthreads();
  if (!s_last) return;

  // M = max_z m_z, L = Σ_z l_z 2^(m_z − M), o = Σ_z o_z · (2^(m_z − M) / L), z = 0, 1, … in
  // order; the partials are read through L2 (__ldcg: other SMs wrote them in this launch).
  for (int i = threadIdx.x; i < ns * G; i += L::threads) {
    const int z = i / G, g = i - z * G;
    sm_w[0][z][g] = __ldcg(prow + (size_t)z * PF + G * D + g);
    sm_w[1][z][g] = __ldcg(prow + (size_t)z * PF + G * D + G + g);
  }
  __syncthreads();
  if (threadIdx.x < G) {
    const int g = threadIdx.x;
    float M = -INFINITY, Ls = 0.f;
    for (int z = 0; z < ns; ++z) M = fmaxf(M, sm_w[0][z][g]);
    for (int z = 0; z < ns; ++z) Ls += sm_w[1][z][g] * exp2f(sm_w[0][z][g] - M);
    for (int z = 0; z < ns; ++z) sm_w[1][z][g] = exp2f(sm_w[0][z][g] - M) / Ls;
  }
  __syncthreads();
  for (int i = threadIdx.x; i < G * D / 4; i += L::threads) {
    const int g = i / (D / 4), d = (i - g * (D / 4)) * 4;
    float a[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll 4
    for (int z = 0; z < ns; ++z) {
      const float w = sm_w[1][z][g];
      const float4 v = __ldcg(reinterpret_cast<const float4*>(prow + (size_t)z * PF + g * D + d));
      a[0] = fmaf(w, v.x, a[0]);
      a[1] = fmaf(w, v.y, a[1]);
      a[2] = fmaf(w, v.z, a[2]);
      a[3] = fmaf(w, v.w, a[3]);
    }
    const bf16* gp = gate + 2 * D * (m * G + g) + d;
    bf162* dst = reinterpret_cast<bf162*>(orow + g * D + d);
    dst[0] = __floats2bfloat162_rn(a[0] * sigmoidf_(to_f(gp[0])), a[1] * sigmoidf_(to_f(gp[1])));
    dst[1] = __floats2bfloat162_rn(a[2] * sigmoidf_(to_f(gp[2])), a[3] * sigmoidf_(to_f(gp[3])));
  }
}

}  // namespace q38

// gdn.cuh: the Gated DeltaNet core of one linear-attention layer (MODEL.md §4.2 steps 2-7, §5)
// for a decode step (PT = 1) or a prefill chunk (PT > 1 rows per sequence, run token by token:
// the exact recurrence, not the chunked WY form), with the per-sequence conv ring and fp32
// recurrent state updated in place.
//
// In (R = B·PT rows; row r is token t = r % PT of sequence b = r / PT, position pos[b] + t):
//   mz      bf16 [R, ld_mz]   cols [0, C): m = in_proj_qkv·h  (Q all k-heads | K | V all v-heads)
//                             cols [C, C+Cv): z = in_proj_z·h (head-major [HV, DV])
//   ba      bf16 [R, ld_ba]   cols [0, HV): b;  cols [ba_off, ba_off+HV): a
//   conv_w  bf16 [C, K]       conv1d.weight [C,1,K]; tap K-1 multiplies the current token
//   A_log   fp32 [HV],  dt_bias bf16 [HV],  norm_w fp32 [DV] (gated RMSNorm, plain w),  eps
//   pos, ntok  int32 [B]      rows t >= ntok[b] are padding
// In/out:
//   ring    bf16 [B, KC, C]   KC = K-1; slot j holds raw m of the token whose position % KC == j
//   state   fp32 [B, HV, DK, DV]   S[i, j], row i = key dim, column j = value dim
// Out:
//   out     bf16 [R, Cv]      RMSg(o_h; norm_w, z_h) per v-head, ready for out_proj; padding rows
//                             are written as 0 (so out_proj of them is 0)
// with C = 2·HK·DK + HV·DV, Cv = HV·DV. ld_mz and ld_ba are in elements; ld_mz % 8 == 0 and all
// base pointers 16-byte aligned (16-byte vector loads of m, z and the ring).
//
// Per token, for v-head h and its key head κ = h / (HV/HK) (MODEL.md §4.2):
//   c = Σ_j w_conv[ch, j] · [X₀ X₁ X₂ m][ch, j];  y = silu(c)    X = raw m of the 3 previous
//        positions; a position < 0 contributes 0 whatever the ring holds (= a fresh sequence)
//   q = l2n(y_q[κ]) / √DK,  k = l2n(y_k[κ]),  v = y_v[h]         l2n(x) = x / √(Σx² + 1e-6)
//   g = −exp(A_log_h) · softplus(a_h + dt_bias_h),  β = σ(b_h)
//   S ← e^g S;  u = Sᵀk;  δ = β (v − u);  S ← S + k δᵀ;  o = Sᵀq   (o read with the updated S)
//   out_h = bf16( bf16(o / √(mean(o²) + eps)) · w · silu(z_h) )
// Numerics (MODEL.md §7, HF's rounding points): conv sum in fp32 rounded to bf16, SiLU in fp32
// rounded to bf16 (q, k, v are these bf16 values); l2 norm, gates, e^g, state in fp32; the
// delta-rule output o rounded to bf16 before the gated norm; norm statistics fp32; output bf16.
//
// Work split: one block per (sequence b, v-head h, column slice s of NS), DV/NS columns per
// block. Each column j of S_h is owned by two threads of one warp (lanes l and l^16), each
// holding DK/2 rows in registers, so u_j and o_j are a register sum plus one shuffle; the state
// is read once and written once per launch, a warp touching 16 columns × 2 row halves (two 64-byte
// segments) per row. (One thread per whole column needs DK = 128 state registers and ptxas then
// spills.) The HV/HK v-heads of one key head and their NS slices form one thread-block cluster:
//   * the conv ring is read by every block of the cluster (all need κ's q and k window) and
//     written once per channel after a cluster barrier (q/k channels split over the cluster's
//     ranks, v channels by the block that owns them), so no block reads a slot already advanced;
//   * the gated norm's Σo² over the head's DV columns is summed across its NS blocks through
//     distributed shared memory.
// Each block recomputes κ's conv and l2 norms (2·DK channels: cheap next to its DK·DV/NS·8 bytes
// of state traffic).
//
// Launch (GdnLaunch below holds the same numbers as constexpr):
//   grid  = B · HV · NS blocks (1-D), cluster = (HV/HK) · NS blocks along x (compile-time
//           __cluster_dims__, so a plain cuLaunchKernel works), cluster <= 8 (portable size)
//   block = threads = 32 · ceil(DV/NS / 16)   (16 columns per warp)
//   dynamic smem = smem_bytes = 16·(K−1)·groups + 4·PT·(2·DK + 3·cpad + 5 + warps) bytes,
//           cpad = threads/2, groups = (2·DK + DV/NS)/8; above 48 KiB the caller sets
//           CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES first.
//           (DK = DV = 128, NS = 2: 1920 + 1828·PT bytes; PT = 16: 31 KB, PT = 64: 119 KB)
// 27B decode, NS = 2: 96·B blocks of 128 threads (B = 1: 96 of the 132 SMs busy).
//
// Compiles alone (syntax only):
//   nvcc -arch=sm_90 -std=c++17 -cubin -Xptxas -v -x cu kernels/gdn.cuh -o /dev/null
// With tiny and 27B instances, for the resource report:
//   nvcc -arch=sm_90 -std=c++17 -cubin -Xptxas -v -DQ38_GDN_SELFCHECK -x cu kernels/gdn.cuh -o /dev/null
#pragma once
#include <cooperative_groups.h>

#include "common.cuh"

namespace q38 {

// DK, DV: key / value head dims; HK, HV: key / value heads; K: conv width;
// PT: rows per sequence (1 = decode); NS: column slices per v-head (parallelism at small B).
template <int DK, int DV, int HK, int HV, int K, int PT, int NS>
struct GdnLaunch {
  static_assert(HV % HK == 0, "gdn: HV must be a multiple of HK");
  static_assert(K >= 2, "gdn: conv width K must be at least 2");
  static_assert(DK % 8 == 0, "gdn: DK must be a multiple of 8 (16-byte groups, float4 halves)");
  static_assert(DV % NS == 0 && (DV / NS) % 8 == 0, "gdn: DV/NS must be a multiple of 8");
  static_assert(PT >= 1, "gdn: PT >= 1");
  static constexpr int ratio = HV / HK;                 // v-heads per key head
  static constexpr int cols = DV / NS;                  // state columns per block
  static constexpr int warps = (cols + 15) / 16;          // a warp: 16 columns × 2 row halves
  static constexpr int threads = 32 * warps;
  static constexpr int cpad = 16 * warps;               // columns incl. idle padding ones
  static constexpr int cluster = ratio * NS;
  static_assert(cluster <= 8, "gdn: (HV/HK)*NS must be <= 8 (portable cluster size)");
  static constexpr int C = 2 * HK * DK + HV * DV;       // conv channels
  static constexpr int Cv = HV * DV;                    // output width
  static constexpr int KC = K - 1;                      // ring slots
  static constexpr int groups = 2 * DK / 8 + cols / 8;  // 8-channel conv groups per block
  // dynamic shared memory, in floats
  static constexpr int off_m = 0;                       // uint4 [KC][groups] raw m of the last KC tokens
  static constexpr int off_q = off_m + 4 * KC * groups; // [PT][DK]  silu(conv) of κ's q
  static constexpr int off_k = off_q + PT * DK;         // [PT][DK]  ... of κ's k
  static constexpr int off_v = off_k + PT * DK;         // [PT][cpad] v_j (bf16-exact)
  static constexpr int off_o = off_v + PT * cpad;       // [PT][cpad] o_j (bf16-exact)
  static constexpr int off_z = off_o + PT * cpad;       // [PT][cpad] z_j
  static constexpr int off_dec = off_z + PT * cpad;     // [PT] e^g
  static constexpr int off_beta = off_dec + PT;         // [PT] β
  static constexpr int off_iq = off_beta + PT;          // [PT] 1/(‖q‖·√DK)
  static constexpr int off_ik = off_iq + PT;            // [PT] 1/‖k‖
  static constexpr int off_rstd = off_ik + PT;          // [PT] 1/√(mean(o²)+eps)
  static constexpr int off_ssq = off_rstd + PT;         // [PT][warps] per-warp Σo² (read by the cluster)
  static constexpr int smem_floats = off_ssq + PT * warps;
  static constexpr int smem_bytes = 4 * smem_floats;
  static constexpr int blocks_per_seq = HV * NS;
};

namespace gdn_detail {

// Causal conv + SiLU of 8 channels [ch, ch+8) for token t of the sequence (position p0 + t):
// y -> dst[0..8). Each tap is its own 16-byte load (a row of this launch, a ring slot, or 0 for a
// position < 0), so all of a block's (channel group, token) tasks have their loads in flight at once.
// Returns the raw m of the current token (for the ring).
template <int K, int C>
__device__ __forceinline__ uint4 conv8(const bf16* __restrict__ mz, int ld_mz, size_t row0,
                                       const bf16* __restrict__ conv_w, const bf16* ring_b, int p0,
                                       int t, int ch, float* dst) {
  constexpr int KC = K - 1;
  float w[K][8];  // flat index c·K + j = channel ch+c, tap j (the 8 channels' taps are contiguous)
#pragma unroll
  for (int i = 0; i < K; ++i) unpack_bf16x8(ldg16(conv_w + (size_t)ch * K + 8 * i), w[i]);
  const uint4 cur = ldg16(mz + (row0 + t) * (size_t)ld_mz + ch);
  float x[K][8];  // x[j] = raw m of position p0 + t − KC + j; x[KC] is the current token
  unpack_bf16x8(cur, x[KC]);
#pragma unroll
  for (int j = 0; j < KC; ++j) {
    const int tt = t - KC + j, P = p0 + tt;
    if (tt >= 0) {
      unpack_bf16x8(ldg16(mz + (row0 + tt) * (size_t)ld_mz + ch), x[j]);
    } else if (P >= 0) {
      // plain load, not ld.global.nc: the ring is written later in this kernel
      unpack_bf16x8(*reinterpret_cast<const uint4*>(ring_b + (size_t)(P % KC) * C + ch), x[j]);
    } else {
#pragma unroll
      for (int c = 0; c < 8; ++c) x[j][c] = 0.f;
    }
  }
  float y[8];
#pragma unroll
  for (int c = 0; c < 8; ++c) {
    float acc = 0.f;
#pragma unroll
    for (int j = 0; j < K; ++j) acc = fmaf(w[(c * K + j) / 8][(c * K + j) % 8], x[j][c], acc);
    y[c] = round_bf(siluf_(round_bf(acc)));  // conv output bf16, SiLU output bf16 (HF)
  }
  float4* d = reinterpret_cast<float4*>(dst);
  d[0] = make_float4(y[0], y[1], y[2], y[3]);
  d[1] = make_float4(y[4], y[5], y[6], y[7]);
  return cur;
}

}  // namespace gdn_detail

// The kernel body. Entry point (the emitter's / a test's; the cluster attribute is required):
//   extern "C" __global__ void __launch_bounds__(q38::GdnLaunch<...>::threads)
//   __cluster_dims__(q38::GdnLaunch<...>::cluster, 1, 1) NAME(ARGS) { q38::gdn_chunk<...>(ARGS); }
template <int DK, int DV, int HK, int HV, int K, int PT, int NS>
__device__ __forceinline__ void gdn_chunk(const bf16* __restrict__ mz, int ld_mz,
                                          const bf16* __restrict__ ba, int ld_ba, int ba_off,
                                          const bf16* __restrict__ conv_w,
                                          const float* __restrict__ A_log,
                                          const bf16* __restrict__ dt_bias,
                                          const float* __restrict__ norm_w, float eps,
                                          bf16* __restrict__ ring, float* __restrict__ state,
                                          const int* __restrict__ pos,
                                          const int* __restrict__ ntok, bf16* __restrict__ out) {
  using L = GdnLaunch<DK, DV, HK, HV, K, PT, NS>;
  constexpr int R = L::ratio, COLS = L::cols, NT = L::threads, NW = L::warps, CL = L::cluster;
  constexpr int CP = L::cpad, DH = DK / 2;
  constexpr int KC = L::KC, C = L::C, CV = L::Cv;
  constexpr int GQ = DK / 8, GV = COLS / 8;  // 8-channel groups: per q (or k) head, per v slice
  constexpr int NG = L::groups;              // = 2·GQ + GV

  extern __shared__ float4 smem4[];
  float* const sm = reinterpret_cast<float*>(smem4);
  uint4* const sm_m = reinterpret_cast<uint4*>(sm + L::off_m);
  float* const sq = sm + L::off_q;
  float* const sk = sm + L::off_k;
  float* const sv = sm + L::off_v;
  float* const so = sm + L::off_o;
  float* const sz = sm + L::off_z;
  float* const sdec = sm + L::off_dec;
  float* const sbeta = sm + L::off_beta;
  float* const siq = sm + L::off_iq;
  float* const sik = sm + L::off_ik;
  float* const srstd = sm + L::off_rstd;
  float* const sssq = sm + L::off_ssq;

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int s = blockIdx.x % NS;
  const int h = (blockIdx.x / NS) % HV;
  const int b = blockIdx.x / (NS * HV);
  const int kh = h / R;
  const int rank = (h % R) * NS + s;  // == cluster block rank (blocks of a cluster are consecutive)
  const int nt = min(max(ntok[b], 0), PT);
  const int p0 = pos[b];
  const size_t row0 = (size_t)b * PT;
  const int c0 = s * COLS;  // this block's first column inside the head
  const bf16* ring_b = ring + (size_t)b * KC * C;

  // 0. Issue this thread's state loads first: the state does not depend on the kernels before
  // this one in the step, so its latency overlaps the conv below (and, when the launch uses
  // programmatic dependent launch, the tail of the previous kernel).
  // Lanes l and l^16 of warp w own column cl = 16w + (l & 15) of this block (j = c0 + cl in the
  // head), rows [half·DK/2, (half+1)·DK/2).
  const int cl = 16 * warp + (lane & 15), half = lane >> 4;
  const bool act = cl < COLS;
  const int j = c0 + (act ? cl : 0);
  float* const Sp = state + ((size_t)(b * HV + h) * DK + half * DH) * DV + j;
  float S[DH];
#pragma unroll
  for (int i = 0; i < DH; ++i) S[i] = __ldcs(Sp + (size_t)i * DV);
  // Wait for the producer of mz / ba (no-op unless launched with programmatic serialization).
  asm volatile("griddepcontrol.wait;" ::: "memory");

  // 1. conv + SiLU of κ's q and k channels and this block's v channels (reads the ring), one
  // task per (8-channel group, token), groups fastest (coalesced rows); the raw m of the last KC
  // tokens is kept for the ring write; z of this block's columns is fetched alongside.
  for (int idx = tid; idx < (NG + GV) * nt; idx += NT) {
    const int g = idx % (NG + GV), t = idx / (NG + GV);
    if (g >= NG) {  // z_j, 8 columns
      const int c = 8 * (g - NG);
      float z[8];
      unpack_bf16x8(ldg16(mz + (row0 + t) * (size_t)ld_mz + C + h * DV + c0 + c), z);
      float4* d = reinterpret_cast<float4*>(sz + t * CP + c);
      d[0] = make_float4(z[0], z[1], z[2], z[3]);
      d[1] = make_float4(z[4], z[5], z[6], z[7]);
      continue;
    }
    int ch;
    float* dst;
    if (g < GQ) {
      ch = kh * DK + 8 * g, dst = sq + t * DK + 8 * g;
    } else if (g < 2 * GQ) {
      ch = HK * DK + kh * DK + 8 * (g - GQ), dst = sk + t * DK + 8 * (g - GQ);
    } else {
      ch = 2 * HK * DK + h * DV + c0 + 8 * (g - 2 * GQ), dst = sv + t * CP + 8 * (g - 2 * GQ);
    }
    const uint4 m = gdn_detail::conv8<K, C>(mz, ld_mz, row0, conv_w, ring_b, p0, t, ch, dst);
    if (t >= nt - KC) sm_m[(t - nt + KC) * NG + g] = m;
  }
  // Gates, fp32: g = −exp(A_log)·softplus(a + dt_bias), kept as the decay e^g; β = σ(b).
  for (int t = tid; t < nt; t += NT) {
    const bf16* bar = ba + (row0 + t) * (size_t)ld_ba;
    const float x = to_f(bar[ba_off + h]) + to_f(dt_bias[h]);
    const float sp = x > 20.f ? x : log1pf(expf(x));
    sdec[t] = expf(-expf(A_log[h]) * sp);
    sbeta[t] = 1.f / (1.f + expf(-to_f(bar[h])));
  }
  __syncthreads();
  // l2 norms of q and k per token, one warp per vector: kept as factors, applied in the recurrence.
  for (int p = warp; p < 2 * nt; p += NW) {
    const float* v = (p & 1 ? sk : sq) + (p >> 1) * DK;
    float ss = 0.f;
    for (int i = lane; i < DK; i += 32) ss = fmaf(v[i], v[i], ss);
    ss = warp_sum(ss);
    if (lane == 0) {
      const float inv = 1.f / sqrtf(ss + 1e-6f);
      if (p & 1)
        sik[p >> 1] = inv;
      else
        siq[p >> 1] = inv * (1.f / sqrtf((float)DK));
    }
  }
  __syncthreads();

  // 2. The delta rule over the chunk, token by token, S in registers.
#pragma unroll 1
  for (int t = 0; t < nt; ++t) {
    const float dec = sdec[t], beta = sbeta[t], ik = sik[t], iq = siq[t];
    const float vj = sv[t * CP + cl];
    const float4* k4 = reinterpret_cast<const float4*>(sk + t * DK + half * DH);
    const float4* q4 = reinterpret_cast<const float4*>(sq + t * DK + half * DH);
    // u = (e^g S)ᵀ k̂ = e^g ‖k‖⁻¹ Σ_i S[i,j] k_i
    float u0 = 0.f, u1 = 0.f, u2 = 0.f, u3 = 0.f;
#pragma unroll
    for (int i = 0; i < DH / 4; ++i) {
      const float4 kk = k4[i];
      u0 = fmaf(S[4 * i], kk.x, u0);
      u1 = fmaf(S[4 * i + 1], kk.y, u1);
      u2 = fmaf(S[4 * i + 2], kk.z, u2);
      u3 = fmaf(S[4 * i + 3], kk.w, u3);
    }
    float u = (u0 + u1) + (u2 + u3);
    u = (u + __shfl_xor_sync(0xffffffffu, u, 16)) * ik * dec;
    const float dl = beta * (vj - u) * ik;  // δ_j / ‖k‖, so that S += k̂ δᵀ reads S += k_raw·dl
    // Re-read k from shared memory below instead of keeping it live in registers.
    asm volatile("" ::: "memory");
    // S ← e^g S + k̂ δᵀ;  o_j = Σ_i S[i,j] q̂_i with the updated S
    float o0 = 0.f, o1 = 0.f, o2 = 0.f, o3 = 0.f;
#pragma unroll
    for (int i = 0; i < DH / 4; ++i) {
      const float4 kk = k4[i];
      const float4 qq = q4[i];
      S[4 * i] = fmaf(dec, S[4 * i], kk.x * dl);
      S[4 * i + 1] = fmaf(dec, S[4 * i + 1], kk.y * dl);
      S[4 * i + 2] = fmaf(dec, S[4 * i + 2], kk.z * dl);
      S[4 * i + 3] = fmaf(dec, S[4 * i + 3], kk.w * dl);
      o0 = fmaf(S[4 * i], qq.x, o0);
      o1 = fmaf(S[4 * i + 1], qq.y, o1);
      o2 = fmaf(S[4 * i + 2], qq.z, o2);
      o3 = fmaf(S[4 * i + 3], qq.w, o3);
    }
    float o = (o0 + o1) + (o2 + o3);
    o = round_bf((o + __shfl_xor_sync(0xffffffffu, o, 16)) * iq);  // HF casts it to bf16
    if (half == 0) so[t * CP + cl] = o;
    const float ss = warp_sum(half == 0 && act ? o * o : 0.f);
    if (lane == 0) sssq[t * NW + warp] = ss;
  }
  if (act) {
#pragma unroll
    for (int i = 0; i < DH; ++i) __stcs(Sp + (size_t)i * DV, S[i]);
  }

  // 3. Cluster barrier: every block of the cluster has read the ring (step 1) and published Σo².
  namespace cg = cooperative_groups;
  if constexpr (CL > 1)
    cg::this_cluster().sync();
  else
    __syncthreads();

  // Ring: the last min(nt, KC) tokens' raw m land in slot position % KC; q/k channels of κ are
  // split over the cluster's ranks, the v channels are this block's own.
  for (int idx = tid; idx < NG * KC; idx += NT) {
    const int g = idx % NG, t = nt - KC + idx / NG;
    if (t < 0 || (g < 2 * GQ && g % CL != rank)) continue;
    const int ch = g < GQ       ? kh * DK + 8 * g
                   : g < 2 * GQ ? HK * DK + kh * DK + 8 * (g - GQ)
                                : 2 * HK * DK + h * DV + c0 + 8 * (g - 2 * GQ);
    *reinterpret_cast<uint4*>(ring + ((size_t)b * KC + (p0 + t) % KC) * C + ch) =
        sm_m[(t - nt + KC) * NG + g];
  }

  // Gated norm statistics: Σo² over the head's DV columns = the NS blocks of this v-head.
  for (int t = tid; t < nt; t += NT) {
    float tot = 0.f;
    if constexpr (NS > 1) {
      cg::cluster_group cl = cg::this_cluster();
      const int base = (h % R) * NS;
#pragma unroll
      for (int r2 = 0; r2 < NS; ++r2) {
        const float* rs = cl.map_shared_rank(sssq, base + r2);
#pragma unroll
        for (int w = 0; w < NW; ++w) tot += rs[t * NW + w];
      }
    } else {
#pragma unroll
      for (int w = 0; w < NW; ++w) tot += sssq[t * NW + w];
    }
    srstd[t] = 1.f / sqrtf(tot / (float)DV + eps);
  }
  __syncthreads();
  // No block may exit while a sibling still reads its Σo² (distributed shared memory).
  if constexpr (NS > 1) cg::this_cluster().barrier_arrive();

  // 4. out = bf16( bf16(o·rstd) · w · silu(z) ); padding rows get 0.
  for (int idx = tid; idx < PT * COLS; idx += NT) {
    const int t = idx / COLS, c = idx % COLS;
    const int col = h * DV + c0 + c;
    float y = 0.f;
    if (t < nt) y = round_bf(so[t * CP + c] * srstd[t]) * norm_w[c0 + c] * siluf_(sz[t * CP + c]);
    out[(row0 + t) * (size_t)CV + col] = to_bf(y);
  }
  if constexpr (NS > 1) cg::this_cluster().barrier_wait();
}

}  // namespace q38

#ifdef Q38_GDN_SELFCHECK
#define Q38_GDN_SELFCHECK_ENTRY(name, DK, DV, HK, HV, K, PT, NS)                                  \
  extern "C" __global__ void __launch_bounds__(q38::GdnLaunch<DK, DV, HK, HV, K, PT, NS>::threads) \
      __cluster_dims__(q38::GdnLaunch<DK, DV, HK, HV, K, PT, NS>::cluster, 1, 1)                 \
          name(const q38::bf16* mz, int ld_mz, const q38::bf16* ba, int ld_ba, int ba_off,     \
               const q38::bf16* conv_w, const float* A_log, const q38::bf16* dt_bias,         \
               const float* norm_w, float eps, q38::bf16* ring, float* state, const int* pos, \
               const int* ntok, q38::bf16* out) {                                             \
    q38::gdn_chunk<DK, DV, HK, HV, K, PT, NS>(mz, ld_mz, ba, ld_ba, ba_off, conv_w, A_log,      \
                                              dt_bias, norm_w, eps, ring, state, pos, ntok, out); \
  }
Q38_GDN_SELFCHECK_ENTRY(gdn_tiny_pt1_ns2, 128, 128, 2, 6, 4, 1, 2)
Q38_GDN_SELFCHECK_ENTRY(gdn_tiny_pt16_ns2, 128, 128, 2, 6, 4, 16, 2)
Q38_GDN_SELFCHECK_ENTRY(gdn_27b_pt1_ns1, 128, 128, 16, 48, 4, 1, 1)
Q38_GDN_SELFCHECK_ENTRY(gdn_27b_pt1_ns2, 128, 128, 16, 48, 4, 1, 2)
Q38_GDN_SELFCHECK_ENTRY(gdn_27b_pt16_ns2, 128, 128, 16, 48, 4, 16, 2)
Q38_GDN_SELFCHECK_ENTRY(gdn_27b_pt64_ns2, 128, 128, 16, 48, 4, 64, 2)
Q38_GDN_SELFCHECK_ENTRY(gdn_toy_pt4_ns1, 16, 24, 2, 6, 4, 4, 1)
#endif

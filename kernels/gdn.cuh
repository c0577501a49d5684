// gdn.cuh: the Gated DeltaNet core of one linear-attention layer (docs/MODEL.md §4.2 steps 2-7, §5)
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
//   ring    bf16 [B, RS, C]   RS >= K-1 ring slots (default K-1); slot j holds raw m of the token
//                             whose position % RS == j. The last min(ntok, RS) rows are written.
//   state   fp32 [B, SLOTS, HV, DK, DV]   S[i, j], row i = key dim, column j = value dim;
//                             SLOTS = 1 (default): one state per sequence
//   slot    int32 [B] or null  the slot holding sequence b's current state (null: slot 0)
//   rows    int32 [B] or null  a packed chunk (docs/KERNELS.md "Packed chunks"): sequence b's
//                             rows are rows[b] … rows[b] + ntok[b] − 1 (no padding rows between
//                             sequences; rows past every sequence's are neither read nor written)
// Speculative decoding (the mtp lane, docs/MODEL.md §8.3 rollback): RS = K-1+drafts keeps the raw m
// of every position a rollback may resume from (a verify of drafts+1 tokens at p0 … p0+drafts
// writes drafts+1 slots and keeps p0-2, p0-1; resuming at p0+n+1 reads p0+n-2 … p0+n, all of
// which survive). EACH = 0: read slot[b], write the final state back into slot[b]. EACH = 1 (the
// verify pass): read slot[b], write the state after token t into slot t for every t < ntok[b]
// (SLOTS >= PT), so the next step starts from slot n (n drafts accepted). Each thread reads all
// of its state elements into registers before it writes any, and writes exactly those elements
// (in whichever slot), so writing into the slot it read is safe.
//   ring_arrivals  int32 [B, HK]   scratch, all 0 before the first launch; every launch leaves it
//                             0 again, so one buffer serves every GDN layer launched on a stream
// Out:
//   out     bf16 [R, Cv]      RMSg(o_h; norm_w, z_h) per v-head, ready for out_proj; padding rows
//                             are written as 0 (so out_proj of them is 0). TNT > 0: in
//                             wgmma_q4's activation tile order for 8·TNT-row tiles instead
//                             (common.cuh, act_at), which the out projection reads with XT = 1
// with C = 2·HK·DK + HV·DV, Cv = HV·DV. ld_mz and ld_ba are in elements; ld_mz % 8 == 0 and all
// base pointers 16-byte aligned (16-byte vector loads of m, z and the ring).
//
// Per token, for v-head h and its key head κ = h / (HV/HK) (docs/MODEL.md §4.2):
//   c = Σ_j w_conv[ch, j] · [X₀ X₁ X₂ m][ch, j];  y = silu(c)    X = raw m of the 3 previous
//        positions; a position < 0 contributes 0 whatever the ring holds (= a fresh sequence)
//   q = l2n(y_q[κ]) / √DK,  k = l2n(y_k[κ]),  v = y_v[h]         l2n(x) = x / √(Σx² + 1e-6)
//   g = −exp(A_log_h) · softplus(a_h + dt_bias_h),  β = σ(b_h)
//   S ← e^g S;  u = Sᵀk;  δ = β (v − u);  S ← S + k δᵀ;  o = Sᵀq   (o read with the updated S)
//   out_h = bf16( bf16(o / √(mean(o²) + eps)) · w · silu(z_h) )
// Numerics (docs/MODEL.md §7, HF's rounding points): conv sum in fp32 rounded to bf16, SiLU in fp32
// rounded to bf16 (q, k, v are these bf16 values); l2 norm, gates, e^g, state in fp32; the
// delta-rule output o rounded to bf16 before the gated norm; norm statistics fp32; output bf16.
//
// Work split: one block per (sequence b, v-head h, column slice s of NS), DV/NS columns per
// block. Thread (cg, rg) holds a float4 of columns (4cg … 4cg+3) for rows rg + 8·i (DK/8 rows) in
// registers, so the state is read once and written once per launch with 16-byte accesses, a warp
// covering whole 256/512-byte row segments; column sums u_j, o_j over the 8 row groups go
// through shared memory, one barrier per token. (One thread per whole column, no reduction at
// all, needs DK = 128 state registers and spills; scalar column loads reached ~80% of copy
// bandwidth against ~95% for these row segments, measured on an H200.)
// Conv ring: each v channel is read and written by the one block owning it (write after a
// barrier). κ's q/k channels are read by all HV/HK·NS blocks of (b, κ); each counts itself in
// ring_arrivals[b, κ] once it has read the ring, and the last one to arrive writes them (from
// the raw m it kept) and resets the counter, so no block reads a slot already advanced.
// (A thread-block cluster of those blocks would order it too, but a cluster of 3 cost 14% of
// the bandwidth at B = 64, NS = 1 on an H200.) The NS slices of one v-head form a cluster of NS blocks:
// the gated norm's Σo² over the head's DV columns is summed through distributed shared memory.
// Each block recomputes κ's conv and l2 norms (2·DK channels: cheap next to its DK·DV/NS·8 bytes
// of state traffic). Everything that no earlier kernel of the step writes is requested before
// `griddepcontrol.wait` (a no-op unless the launch uses programmatic dependent launch): the
// state into registers; pos and ntok; then by cp.async into shared memory the conv weights, the
// ring slots of the K-1 positions before this token and norm_w; the gate constants. After the
// wait only mz and ba remain to be read, so under PDL one L2 round trip separates the previous
// kernel's end from the conv (the conv and gates' chain of loads was the block's critical path:
// ncu, docs/PERFORMANCE.md, version 6). GE >= 0 (the decode step since version 17) changes when the
// state is asked for: after the conv's copies, and only GE of a thread's rows before the conv
// (its small requests and its shared-memory traffic otherwise wait behind 64 KiB of state loads
// per block in the SM's memory-instruction queue).
//
// Launch (GdnLaunch below holds the same numbers as constexpr):
//   grid  = B · HV · NS blocks (1-D), cluster = NS blocks along x (compile-time
//           __cluster_dims__, so a plain cuLaunchKernel works), NS <= 8 (portable size)
//   block = threads = round_up(8 · DV/NS / 4, 32)  (DV = 128: NS = 1, 2, 4 → 256, 128, 64);
//           entry __launch_bounds__(threads, min_blocks), min_blocks = 512 / threads
//   dynamic smem = smem_bytes = 16·(RS + 2K − 1)·groups + 4·(PT·(2·DK + 3·DV/NS + 6) + 33·DV/NS)
//           bytes, groups = (2·DK + DV/NS)/8; above 48 KiB the caller sets
//           CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES first.
//           (DK = DV = 128, K = 4, NS = 1: 24576 + 2584·PT bytes; PT = 1: 27 KB, 16: 66 KB)
// 27B decode on an H200 (graph of 48 launches, state read + write vs 4.28 TB/s copy):
//   NS = 1 (48·B blocks of 256 threads): B = 16 36.3 µs (65%), B = 64 131.8 µs (71%);
//   B = 1 is latency-bound, 6.9–7.3 µs for NS = 1, 2, 4 alike (NS = 2 best by 0.4 µs).
//   Version 17 (scripts/gdn_bench.py, in dd8da46; µs under PDL): GE = 4 (below) 31.8 at B = 16,
//   114.5 at B = 64 against 35.2 and 126.1 with every state row first; the state traffic alone,
//   in the same blocks, 26.0 and 101.9 (scripts/gdn_stream.cuh, in dd8da46).
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
template <int DK, int DV, int HK, int HV, int K, int PT, int NS, int RS = K - 1>
struct GdnLaunch {
  static_assert(HV % HK == 0, "gdn: HV must be a multiple of HK");
  static_assert(K >= 2, "gdn: conv width K must be at least 2");
  static_assert(DK % 8 == 0, "gdn: DK must be a multiple of 8 (16-byte groups, 8 row groups)");
  static_assert(DV % NS == 0 && (DV / NS) % 8 == 0, "gdn: DV/NS must be a multiple of 8");
  static_assert(PT >= 1, "gdn: PT >= 1");
  static_assert(RS >= K - 1, "gdn: the ring needs at least K-1 slots");
  static constexpr int ratio = HV / HK;                 // v-heads per key head
  static constexpr int cols = DV / NS;                  // state columns per block
  static constexpr int cgroups = cols / 4;              // float4 column groups
  static constexpr int rgroups = 8;                     // a thread holds rows rg + 8·i
  static constexpr int rows = DK / rgroups;             // state rows per thread (float4 each)
  static constexpr int threads = (cgroups * rgroups + 31) / 32 * 32;
  static constexpr int warps = threads / 32;
  // Blocks per SM for the entry's __launch_bounds__(threads, min_blocks): caps a thread at 128
  // registers (what it needs; without the cap ptxas takes ~130 and fits one block fewer per SM).
  static constexpr int min_blocks = threads >= 512 ? 1 : 512 / threads;
  static constexpr int cluster = NS;                    // the NS slices of one v-head
  static_assert(cluster <= 8, "gdn: NS must be <= 8 (portable cluster size)");
  static constexpr int readers = ratio * NS;            // blocks that read one key head's q/k ring
  static constexpr int C = 2 * HK * DK + HV * DV;       // conv channels
  static constexpr int Cv = HV * DV;                    // output width
  static constexpr int KC = K - 1;                      // conv window (previous positions read)
  static constexpr int RSL = RS;                        // ring slots (position % RS)
  static constexpr int groups = 2 * DK / 8 + cols / 8;  // 8-channel conv groups per block
  // dynamic shared memory, in floats (every array a multiple of 4 floats: float4 access)
  static constexpr int off_m = 0;                       // uint4 [RS][groups] raw m of the last RS tokens
  static constexpr int off_w = off_m + 4 * RS * groups; // uint4 [groups][K] conv weights (8 channels × K taps)
  static constexpr int off_rt = off_w + 4 * groups * K; // uint4 [groups][K-1] ring taps: positions p0-K+1 … p0-1
  static constexpr int off_q = off_rt + 4 * groups * KC;  // [PT][DK]  silu(conv) of κ's q
  static constexpr int off_k = off_q + PT * DK;         // [PT][DK]  ... of κ's k
  static constexpr int off_v = off_k + PT * DK;         // [PT][cols] v_j (bf16-exact)
  static constexpr int off_o = off_v + PT * cols;       // [PT][cols] o_j (bf16-exact)
  static constexpr int off_z = off_o + PT * cols;       // [PT][cols] z_j
  static constexpr int off_nw = off_z + PT * cols;      // [cols] norm_w of this block's columns
  static constexpr int off_red = off_nw + cols;         // [2 parity][u | o][rgroups][cols] partial sums
  static constexpr int off_dec = off_red + 4 * rgroups * cols;  // [PT] e^g
  static constexpr int off_beta = off_dec + PT;         // [PT] β
  static constexpr int off_iq = off_beta + PT;          // [PT] 1/(‖q‖·√DK)
  static constexpr int off_ik = off_iq + PT;            // [PT] 1/‖k‖
  static constexpr int off_rstd = off_ik + PT;          // [PT] 1/√(mean(o²)+eps)
  static constexpr int off_ssq = off_rstd + PT;         // [PT] this block's Σo² (read by the cluster)
  static constexpr int smem_floats = off_ssq + PT;
  static constexpr int smem_bytes = 4 * smem_floats;
  static constexpr int blocks_per_seq = HV * NS;
};

namespace gdn_detail {

// Causal conv + SiLU of 8 channels [ch, ch+8) for token t of the sequence (position p0 + t):
// y -> dst[0..8). The taps of positions before p0 come from rt (shared memory: the ring slots of
// positions p0-K+1 … p0-1, copied before the wait), 0 for a position < 0; the others are rows of
// this launch, each its own 16-byte load, so all of a block's (channel group, token) tasks have
// their loads in flight at once. w: the K uint4 of the 8 channels' conv weights (shared memory).
// Returns the raw m of the current token (for the ring).
template <int K>
__device__ __forceinline__ uint4 conv8(const bf16* __restrict__ mz, int ld_mz, size_t row0,
                                       const uint4* w8, const uint4* rt, int p0, int t, int ch,
                                       float* dst) {
  constexpr int KC = K - 1;
  float w[K][8];  // flat index c·K + j = channel ch+c, tap j (the 8 channels' taps are contiguous)
#pragma unroll
  for (int i = 0; i < K; ++i) unpack_bf16x8(w8[i], w[i]);
  const uint4 cur = ldg16(mz + (row0 + t) * (size_t)ld_mz + ch);
  float x[K][8];  // x[j] = raw m of position p0 + t − KC + j; x[KC] is the current token
  unpack_bf16x8(cur, x[KC]);
#pragma unroll
  for (int j = 0; j < KC; ++j) {
    const int tt = t - KC + j, P = p0 + tt;
    if (tt >= 0) {
      unpack_bf16x8(ldg16(mz + (row0 + tt) * (size_t)ld_mz + ch), x[j]);
    } else if (P >= 0) {
      unpack_bf16x8(rt[t + j], x[j]);  // position p0 - KC + (t + j)
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
//   extern "C" __global__ void __launch_bounds__(q38::GdnLaunch<...>::threads,
//                                                 q38::GdnLaunch<...>::min_blocks)
//   __cluster_dims__(q38::GdnLaunch<...>::cluster, 1, 1) NAME(ARGS) { q38::gdn_chunk<...>(ARGS); }
template <int DK, int DV, int HK, int HV, int K, int PT, int NS, int RS = K - 1, int EACH = 0,
          int SLOTS = 1, int TNT = 0, int GE = -1, int GW = 0>
__device__ __forceinline__ void gdn_chunk(const bf16* __restrict__ mz, int ld_mz,
                                          const bf16* __restrict__ ba, int ld_ba, int ba_off,
                                          const bf16* __restrict__ conv_w,
                                          const float* __restrict__ A_log,
                                          const bf16* __restrict__ dt_bias,
                                          const float* __restrict__ norm_w, float eps,
                                          bf16* __restrict__ ring, int* __restrict__ ring_arrivals,
                                          float* __restrict__ state, const int* __restrict__ pos,
                                          const int* __restrict__ ntok, bf16* __restrict__ out,
                                          const int* __restrict__ slot = nullptr,
                                          const int* __restrict__ rows = nullptr) {
  static_assert(EACH == 0 || EACH == 1, "gdn: EACH is 0 or 1");
  static_assert(SLOTS >= 1 && (EACH == 0 || SLOTS >= PT), "gdn: EACH = 1 needs a slot per row");
  using L = GdnLaunch<DK, DV, HK, HV, K, PT, NS, RS>;
  constexpr int R = L::ratio, COLS = L::cols, NT = L::threads, NW = L::warps;
  constexpr int CGR = L::cgroups, RGR = L::rgroups, RW = L::rows;
  constexpr int C = L::C, CV = L::Cv, KC = L::KC;
  constexpr int GQ = DK / 8, GV = COLS / 8;  // 8-channel groups: per q (or k) head, per v slice
  constexpr int NG = L::groups;              // = 2·GQ + GV

  extern __shared__ float4 smem4[];
  float* const sm = reinterpret_cast<float*>(smem4);
  uint4* const sm_m = reinterpret_cast<uint4*>(sm + L::off_m);
  uint4* const sw8 = reinterpret_cast<uint4*>(sm + L::off_w);
  uint4* const srt = reinterpret_cast<uint4*>(sm + L::off_rt);
  float* const sq = sm + L::off_q;
  float* const sk = sm + L::off_k;
  float* const sv = sm + L::off_v;
  float* const so = sm + L::off_o;
  float* const sz = sm + L::off_z;
  float* const snw = sm + L::off_nw;
  float* const sred = sm + L::off_red;
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
  // rows is written by the host before the step, like pos and ntok: readable before the wait.
  const size_t row0 = rows != nullptr ? (size_t)rows[b] : (size_t)b * PT;
  const int c0 = s * COLS;  // this block's first column inside the head
  const bf16* ring_b = ring + (size_t)b * RS * C;

  // 0. The state loads (first unless GE >= 0, below): the state depends on no kernel of this step
  // before this one, so its latency overlaps the conv below (and, when the launch uses programmatic
  // dependent launch, the tail of the previous kernel: correct as long as that kernel, like this
  // one, waits for its own predecessor before it ends, so this layer's previous step is done).
  // Thread (cg, rg) owns columns j = c0 + 4cg … +3 (one float4) of rows rg + 8·i, i < DK/8:
  // a warp reads 2 (DV/NS = 64) or 1 (DV/NS = 128) fully used 256/512-byte row segments per load.
  const int cg = tid % CGR, rg = tid / CGR;
  const bool act = rg < RGR;  // threads past cgroups·rgroups idle (small toy shapes only)
  // State slot read (SLOTS = 1: the sequence's one state; else slot[b], a null slot meaning 0).
  const int sb = SLOTS == 1 ? b : b * SLOTS + (slot != nullptr ? slot[b] : 0);
  float* const Sp = state + ((size_t)(sb * HV + h) * DK + (act ? rg : 0)) * DV + c0 + 4 * cg;
  // EACH = 1: slot t of this sequence receives the state after token t, at Sp + (t − slot)·HV·DK·DV
  // (same thread, same elements as the ones it read, so overwriting the slot it read is safe).
  const int sl = sb - b * SLOTS;
  float4 S[RW];
  // When the state loads are issued (the same bits whichever): GE = -1, every row first. GE >= 0:
  // the conv's copies below first (queued behind 64 KiB of state loads per block they held up
  // the conv: docs/PERFORMANCE.md, version 17), then rows [0, GE), the others once the conv is
  // done; but the first GW blocks (the first wave, which may be resident while the kernel before
  // this one still runs, so that the early loads use its DRAM time) take every row early.
  static_assert(GE >= -1 && GE <= RW && GW >= 0, "gdn: -1 <= GE <= DK/8, GW >= 0");
  const bool all_early = GE < 0 || (GW > 0 && blockIdx.x < (unsigned)GW);
  auto load_state = [&](bool late) {  // (a constant at each call: the loop folds)
#pragma unroll
    for (int i = 0; i < RW; ++i)
      if (late ? i >= GE && !all_early : i < GE || all_early)
        S[i] = __ldcs(reinterpret_cast<const float4*>(Sp + (size_t)i * RGR * DV));
  };
  if constexpr (GE < 0) load_state(false);
  // pos and ntok were last written at the end of the previous step: read under the same rule.
  const int nt = min(max(ntok[b], 0), PT);
  const int p0 = pos[b];
  // Conv channel of 8-channel group g: κ's q (g < GQ), κ's k, then this block's v channels.
  auto chan = [&](int g) {
    return g < GQ       ? kh * DK + 8 * g
           : g < 2 * GQ ? HK * DK + kh * DK + 8 * (g - GQ)
                        : 2 * HK * DK + h * DV + c0 + 8 * (g - 2 * GQ);
  };
  // Everything else that no earlier kernel of the step writes goes to shared memory by cp.async
  // before the wait too, so that after it only mz and ba (the previous kernel's output) are
  // read: each group's conv weights, the ring slots of the KC positions before p0 (written by
  // this layer's launch of the previous step, read before anyone of this launch writes them:
  // the ring_arrivals rule below), norm_w of this block's columns. The gates' constants go to
  // the gate threads' registers.
  for (int idx = tid; idx < NG * (K + KC); idx += NT) {
    const int g = idx % NG, j = idx / NG;  // j < K: weight vector j of group g; else ring tap j-K
    const int ch = chan(g);
    if (j < K) {
      cp_async16(sw8 + g * K + j, conv_w + (size_t)ch * K + 8 * j);
    } else if (p0 - KC + (j - K) >= 0) {
      cp_async16(srt + g * KC + (j - K), ring_b + (size_t)((p0 - KC + (j - K)) % RS) * C + ch);
    }
  }
  for (int i = tid; i < COLS / 4; i += NT) cp_async16(snw + 4 * i, norm_w + c0 + 4 * i);
  cp_async_commit();
  if constexpr (GE >= 0) load_state(false);
  // Gates: thread NT-1-t computes token t's (threads without conv work at PT = 1).
  const bool gate = NT - 1 - tid < nt;
  const float alog = gate ? A_log[h] : 0.f, dtb = gate ? to_f(dt_bias[h]) : 0.f;
  // Wait for the producers of mz and ba (no-op unless launched with programmatic stream
  // serialization), then for the copies above.
  pdl_wait();
  cp_async_wait<0>();  // the conv's copies
  __syncthreads();

  // 1. conv + SiLU of κ's q and k channels and this block's v channels, one task per (8-channel
  // group, token), groups fastest (coalesced rows); the raw m of the last KC tokens (RS of them)
  // is kept for the ring write; z of this block's columns is fetched alongside.
  // Gates, fp32: g = −exp(A_log)·softplus(a + dt_bias), kept as the decay e^g; β = σ(b).
  for (int t = NT - 1 - tid; t < nt; t += NT) {
    const bf16* bar = ba + (row0 + t) * (size_t)ld_ba;
    const float x = to_f(bar[ba_off + h]) + dtb;
    const float sp = x > 20.f ? x : log1pf(expf(x));
    sdec[t] = expf(-expf(alog) * sp);
    sbeta[t] = 1.f / (1.f + expf(-to_f(bar[h])));
  }
  for (int idx = tid; idx < (NG + GV) * nt; idx += NT) {
    const int g = idx % (NG + GV), t = idx / (NG + GV);
    if (g >= NG) {  // z_j, 8 columns
      const int c = 8 * (g - NG);
      float z[8];
      unpack_bf16x8(ldg16(mz + (row0 + t) * (size_t)ld_mz + C + h * DV + c0 + c), z);
      float4* d = reinterpret_cast<float4*>(sz + t * COLS + c);
      d[0] = make_float4(z[0], z[1], z[2], z[3]);
      d[1] = make_float4(z[4], z[5], z[6], z[7]);
      continue;
    }
    float* const dst = g < GQ       ? sq + t * DK + 8 * g
                       : g < 2 * GQ ? sk + t * DK + 8 * (g - GQ)
                                    : sv + t * COLS + 8 * (g - 2 * GQ);
    const uint4 m = gdn_detail::conv8<K>(mz, ld_mz, row0, sw8 + g * K, srt + g * KC, p0, t, chan(g), dst);
    if (t >= nt - RS) sm_m[(t - nt + RS) * NG + g] = m;
  }
  __syncthreads();
  if constexpr (GE >= 0) load_state(true);
  // This block has read the ring. The last of the HV/HK·NS blocks of (b, κ) to get here writes
  // κ's q/k ring channels (step 3); it resets the counter, so every launch finds it at 0.
  // (The atomic's answer is first needed after the recurrence, so its round trip overlaps it.)
  __shared__ int s_last;
  int arrived = 0;
  if (tid == 0) {
    __threadfence();
    arrived = atomicAdd(ring_arrivals + b * HK + kh, 1);
  }
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

  // 2. The delta rule over the chunk, token by token, S in registers. Column sums over the 8 row
  // groups go through shared memory: token t's u partials and token t−1's o partials share one
  // barrier (buffers alternate by token parity, so one __syncthreads per token).
  auto finish_o = [&](int tt) {  // o of token tt for this thread's 4 columns (row group 0 only)
    const float* ro = sred + (tt & 1) * 2 * RGR * COLS + RGR * COLS + 4 * cg;
    float4 o = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
    for (int r = 0; r < RGR; ++r) {
      const float4 p = *reinterpret_cast<const float4*>(ro + r * COLS);
      o.x += p.x, o.y += p.y, o.z += p.z, o.w += p.w;
    }
    const float iq = siq[tt];  // HF casts the delta-rule output to bf16
    *reinterpret_cast<float4*>(so + tt * COLS + 4 * cg) =
        make_float4(round_bf(o.x * iq), round_bf(o.y * iq), round_bf(o.z * iq), round_bf(o.w * iq));
  };
#pragma unroll 1
  for (int t = 0; t < nt; ++t) {
    const float dec = sdec[t], beta = sbeta[t], ik = sik[t];
    const float* kt = sk + t * DK + rg;  // k_i of this thread's rows: kt[8·i]
    const float* qt = sq + t * DK + rg;
    float* const red = sred + (t & 1) * 2 * RGR * COLS;
    // partial u_j = Σ_{own rows} S[i,j] k_i
    float4 up = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
    for (int i = 0; i < RW; ++i) {
      const float kk = kt[RGR * i];
      const float4 si = S[i];
      up.x = fmaf(si.x, kk, up.x);
      up.y = fmaf(si.y, kk, up.y);
      up.z = fmaf(si.z, kk, up.z);
      up.w = fmaf(si.w, kk, up.w);
    }
    if (act) *reinterpret_cast<float4*>(red + rg * COLS + 4 * cg) = up;
    __syncthreads();
    if (t > 0 && act && rg == 0) finish_o(t - 1);
    // u = (e^g S)ᵀ k̂ = e^g ‖k‖⁻¹ Σ_i S[i,j] k_i;  δ = β (v − u), kept divided by ‖k‖
    float4 u = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
    for (int r = 0; r < RGR; ++r) {
      const float4 p = *reinterpret_cast<const float4*>(red + r * COLS + 4 * cg);
      u.x += p.x, u.y += p.y, u.z += p.z, u.w += p.w;
    }
    const float4 v = *reinterpret_cast<const float4*>(sv + t * COLS + 4 * cg);
    const float f = dec * ik, bk = beta * ik;
    const float4 d = make_float4(bk * (v.x - u.x * f), bk * (v.y - u.y * f), bk * (v.z - u.z * f),
                                 bk * (v.w - u.w * f));
    // Re-read k from shared memory below instead of keeping it live in registers.
    asm volatile("" ::: "memory");
    // S ← e^g S + k̂ δᵀ (= k_raw · δ/‖k‖);  partial o_j = Σ_{own rows} S[i,j] q_i, updated S
    float4 op = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
    for (int i = 0; i < RW; ++i) {
      const float kk = kt[RGR * i], qq = qt[RGR * i];
      float4 si = S[i];
      si.x = fmaf(dec, si.x, kk * d.x);
      si.y = fmaf(dec, si.y, kk * d.y);
      si.z = fmaf(dec, si.z, kk * d.z);
      si.w = fmaf(dec, si.w, kk * d.w);
      S[i] = si;
      op.x = fmaf(si.x, qq, op.x);
      op.y = fmaf(si.y, qq, op.y);
      op.z = fmaf(si.z, qq, op.z);
      op.w = fmaf(si.w, qq, op.w);
    }
    if (act) *reinterpret_cast<float4*>(red + RGR * COLS + rg * COLS + 4 * cg) = op;
    if constexpr (EACH == 1) {
      if (act) {
        float* const St = Sp + (ptrdiff_t)(t - sl) * (HV * DK * DV);
#pragma unroll
        for (int i = 0; i < RW; ++i) __stcs(reinterpret_cast<float4*>(St + (size_t)i * RGR * DV), S[i]);
      }
    }
  }
  if (EACH == 0 && act) {
#pragma unroll
    for (int i = 0; i < RW; ++i) __stcs(reinterpret_cast<float4*>(Sp + (size_t)i * RGR * DV), S[i]);
  }
  if (tid == 0) s_last = arrived == L::readers - 1;
  __syncthreads();
  if (nt > 0 && act && rg == 0) finish_o(nt - 1);
  __syncthreads();
  // This block's Σo² per token (over its COLS columns), one warp per token.
  for (int t = warp; t < nt; t += NW) {
    float ss = 0.f;
    for (int c = lane; c < COLS; c += 32) ss = fmaf(so[t * COLS + c], so[t * COLS + c], ss);
    ss = warp_sum(ss);
    if (lane == 0) sssq[t] = ss;
  }

  // 3. Cluster barrier: every block of the cluster has published its Σo².
  namespace coop = cooperative_groups;
  if constexpr (NS > 1)
    coop::this_cluster().sync();
  else
    __syncthreads();

  // Ring: the last min(nt, RS) tokens' raw m land in slot position % RS; the v channels are this
  // block's own, κ's q/k channels are written by the last of their readers (after all reads).
  const bool last = s_last;
  if (last && tid == 0) {
    __threadfence();
    ring_arrivals[b * HK + kh] = 0;
  }
  for (int idx = tid; idx < NG * RS; idx += NT) {
    const int g = idx % NG, t = nt - RS + idx / NG;
    if (t < 0 || (g < 2 * GQ && !last)) continue;
    *reinterpret_cast<uint4*>(ring + ((size_t)b * RS + (p0 + t) % RS) * C + chan(g)) =
        sm_m[(t - nt + RS) * NG + g];
  }

  // Gated norm statistics: Σo² over the head's DV columns = the NS blocks of this v-head.
  for (int t = tid; t < nt; t += NT) {
    float tot = 0.f;
    if constexpr (NS > 1) {
      coop::cluster_group cl = coop::this_cluster();
#pragma unroll
      for (int r2 = 0; r2 < NS; ++r2) tot += cl.map_shared_rank(sssq, r2)[t];
    } else {
      tot = sssq[t];
    }
    srstd[t] = 1.f / sqrtf(tot / (float)DV + eps);
  }
  __syncthreads();
  // No block may exit while a sibling still reads its Σo² (distributed shared memory).
  if constexpr (NS > 1) coop::this_cluster().barrier_arrive();

  // 4. out = bf16( bf16(o·rstd) · w · silu(z) ); padding rows get 0 (a packed chunk has none:
  // the rows after this sequence's are the next one's).
  for (int idx = tid; idx < (rows != nullptr ? nt : PT) * COLS; idx += NT) {
    const int t = idx / COLS, c = idx % COLS;
    const int col = h * DV + c0 + c;
    float y = 0.f;
    if (t < nt) y = round_bf(so[t * COLS + c] * srstd[t]) * snw[c] * siluf_(sz[t * COLS + c]);
    if constexpr (TNT > 0) *act_at<TNT>(out, CV, (int)row0 + t, col) = to_bf(y);
    else out[(row0 + t) * (size_t)CV + col] = to_bf(y);
  }
  if constexpr (NS > 1) coop::this_cluster().barrier_wait();
}

}  // namespace q38

#ifdef Q38_GDN_SELFCHECK
#define Q38_GDN_SELFCHECK_ENTRY(name, DK, DV, HK, HV, K, PT, NS)                                  \
  extern "C" __global__ void __launch_bounds__(q38::GdnLaunch<DK, DV, HK, HV, K, PT, NS>::threads,    \
                                               q38::GdnLaunch<DK, DV, HK, HV, K, PT, NS>::min_blocks) \
      __cluster_dims__(q38::GdnLaunch<DK, DV, HK, HV, K, PT, NS>::cluster, 1, 1)                 \
          name(const q38::bf16* mz, int ld_mz, const q38::bf16* ba, int ld_ba, int ba_off,     \
               const q38::bf16* conv_w, const float* A_log, const q38::bf16* dt_bias,         \
               const float* norm_w, float eps, q38::bf16* ring, int* ring_arrivals,          \
               float* state, const int* pos, const int* ntok, q38::bf16* out) {               \
    q38::gdn_chunk<DK, DV, HK, HV, K, PT, NS>(mz, ld_mz, ba, ld_ba, ba_off, conv_w, A_log,      \
                                              dt_bias, norm_w, eps, ring, ring_arrivals, state, \
                                              pos, ntok, out);                                  \
  }
Q38_GDN_SELFCHECK_ENTRY(gdn_tiny_pt1_ns2, 128, 128, 2, 6, 4, 1, 2)
Q38_GDN_SELFCHECK_ENTRY(gdn_tiny_pt16_ns2, 128, 128, 2, 6, 4, 16, 2)
Q38_GDN_SELFCHECK_ENTRY(gdn_27b_pt1_ns1, 128, 128, 16, 48, 4, 1, 1)
Q38_GDN_SELFCHECK_ENTRY(gdn_27b_pt1_ns2, 128, 128, 16, 48, 4, 1, 2)
Q38_GDN_SELFCHECK_ENTRY(gdn_27b_pt1_ns4, 128, 128, 16, 48, 4, 1, 4)
Q38_GDN_SELFCHECK_ENTRY(gdn_27b_pt16_ns2, 128, 128, 16, 48, 4, 16, 2)
Q38_GDN_SELFCHECK_ENTRY(gdn_27b_pt64_ns2, 128, 128, 16, 48, 4, 64, 2)
Q38_GDN_SELFCHECK_ENTRY(gdn_toy_pt4_ns1, 16, 24, 2, 6, 4, 4, 1)
// mtp lane instances (RS = 3 + drafts, slot per verified token)
#define Q38_GDN_SELFCHECK_MTP(name, DK, DV, HK, HV, K, PT, NS, RS, EACH, SLOTS)                   \
  extern "C" __global__ void __launch_bounds__(q38::GdnLaunch<DK, DV, HK, HV, K, PT, NS, RS>::threads, \
                                               q38::GdnLaunch<DK, DV, HK, HV, K, PT, NS, RS>::min_blocks) \
      __cluster_dims__(q38::GdnLaunch<DK, DV, HK, HV, K, PT, NS, RS>::cluster, 1, 1)             \
          name(const q38::bf16* mz, int ld_mz, const q38::bf16* ba, int ld_ba, int ba_off,     \
               const q38::bf16* conv_w, const float* A_log, const q38::bf16* dt_bias,         \
               const float* norm_w, float eps, q38::bf16* ring, int* ring_arrivals,          \
               float* state, const int* pos, const int* ntok, q38::bf16* out, const int* slot) { \
    q38::gdn_chunk<DK, DV, HK, HV, K, PT, NS, RS, EACH, SLOTS>(                                \
        mz, ld_mz, ba, ld_ba, ba_off, conv_w, A_log, dt_bias, norm_w, eps, ring, ring_arrivals,  \
        state, pos, ntok, out, slot);                                                          \
  }
Q38_GDN_SELFCHECK_MTP(gdn_27b_verify_k1, 128, 128, 16, 48, 4, 2, 1, 4, 1, 2)
Q38_GDN_SELFCHECK_MTP(gdn_27b_verify_k4, 128, 128, 16, 48, 4, 5, 1, 7, 1, 5)
Q38_GDN_SELFCHECK_MTP(gdn_27b_pt16_mtp2, 128, 128, 16, 48, 4, 16, 1, 5, 0, 3)
#endif

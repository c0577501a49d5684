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
//   span(n) = split · ⌈⌈n / split⌉ / max_splits⌉ (split = SP, max_splits = 32; the program's SP,
//   ops.ATTN_SPLIT, is 256: 256-slot splits up to n = 8192, then at most 32 splits of a whole
//   number of 256-slot tiles). It depends on n only, never on B or the grid, so a row's bits are
//   the same at every batch size (AttnSplitRule). attention_tc.cuh's attn_tc, the program's
//   kernel, uses the same split, scratch and merge.
//   Launch AttnLaunch: grid (gx, B*HKV, PT), block `threads` (32·NW·HG), static smem
//   static_smem_bytes (25.9 KiB at G = 6 with the default knobs), dynamic smem dyn_smem_bytes
//   (0 unless ST >= 2: the K/V ring). The schedule knobs NW, U, HG, ST, SP, MB are described at
//   AttnLaunch; the defaults are the schedule before them.
//   gx ≥ 1 is free (ops.attn_grid_x: ~264 blocks in all, at most max_splits): block x computes
//   splits x, x + gx, … of its row, one after the other (blocks with x ≥ ns exit at once). The
//   splits run fastest in the grid, so a row's partials are merged while still in L2. Which
//   block computes a split changes no bit of it.
//   Within a split: one block per (sequence, kv head, chunk token, split) serves that token's G
//   query heads, so each K/V vector loaded is used G times. Its warps take U consecutive slots
//   each in turn (16-byte loads, a lane owns 8 dims) and keep their own online softmax (running
//   max, sum and o for G heads) in registers, in the log2 domain; at the end the warp states are
//   merged in shared memory in a fixed order (M = max m_w, L = Σ_w l_w 2^(m_w−M), o = Σ_w o_w
//   2^(m_w−M), w = 0, 1, … in order). One split (n ≤ SP): o/L is gated and written as bf16 right
//   there (no scratch, no counter; the arithmetic of the single-pass kernel before split-K).
//   Several: (M, L, o) go to the split's partial; the block then __threadfence()s and adds its
//   count of splits to arrivals[r, m]; the block that brings it to ns resets it to 0 and merges
//   the ns partials read through L2 (__ldcg), in split order z = 0, 1, …, exactly like the warp
//   merge: M = max m_z, L = Σ_z l_z 2^(m_z−M), o = Σ_z o_z · (2^(m_z−M)/L), then the gate and the
//   one bf16 rounding. fp32 throughout. Deterministic: no float atomics, fixed merge orders.
//   Performance note: at B = 1, n = 1024 that is n/SP splits × HKV blocks instead of HKV; at large
//   B·HKV (gx = 1) a block streams its row like the single pass did, plus one warp merge and one
//   partial (6 KiB at G = 6) per SP slots and the final merge. A prefill chunk re-reads the K/V of
//   (b, m) once per token (from L2); a tensor-core tile over the chunk's tokens is the lever there.
//
// Template parameters: D head_dim (256: a warp covers one head with one 16-byte vector per lane),
// RD rotary dims (MODEL.md's R = 64), H / HKV query / kv heads, PT rows per sequence.
// attn also takes the schedule knobs NW, U, HG, ST, SP, MB (AttnLaunch).
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

// Schedule knobs (template parameters; the defaults are the schedule before they existed):
//   NW  warps along the slots: warp ws takes slots ws·U … ws·U + U − 1 of every block step of
//       NW·U slots. Changes the arithmetic (which slots a warp's online softmax sees, and the
//       warp merge over ws = 0 … NW − 1), so it must be one value at every B (batch invariance
//       across programs), like U and SP.
//   U   slots per warp and step (the online softmax takes the max over U scores at once).
//   HG  head groups: the block has NW·HG warps; warp (ws, hg) = ws + NW·hg serves heads
//       hg·G/HG … of the slots of ws. Scheduling only: a head's arithmetic, and its merge over
//       ws in order, are those of HG = 1 (fewer registers: q and o of G/HG heads per warp).
//   ST  0: each warp loads its own K/V into registers, then computes (HG > 1: each head group
//       loads them again, from L1/L2). ≥ 2: a ring of ST block steps in dynamic shared memory,
//       filled by cp.async ST − 1 steps ahead, across split boundaries and the merges (no
//       registers hold loads in flight). Scheduling only (zero-filled slots past the split).
//   SP  slots per split (the split rule's `split`). Changes the arithmetic: one value at every B.
//   MB  minimum blocks per SM for __launch_bounds__ (0: not given). Scheduling only.
//   RX  1: the GH·U scores of a warp step are summed over the warp by one transposed butterfly
//       (xsum_transposed: each level exchanges half of the values still held) and then read from
//       their owner lanes, ~50 shuffles a step instead of 5 per score (120 at GH·U = 24). The
//       same pairs are added at every level, so the sums are warp_sum's bits. Scheduling only.
// The split rule and the partials' size, shared by attn's AttnLaunch and attn_tc's AttnTcLaunch:
// a row of n slots is cut into ns(n) splits of span(n) slots (a multiple of `split` = SP), at
// most max_splits of them; both depend on n only, never on B or the grid.
template <int D, int G, int SP>
struct AttnSplitRule {
  static constexpr int split = SP;
  static constexpr int max_splits = 32;
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
};

template <int D, int H, int HKV, int PT, int NW = 8, int U = 4, int HG = 1, int ST = 0,
          int SP = 64, int MB = 0, int RX = 0>
struct AttnLaunch : AttnSplitRule<D, H / HKV, SP> {
  static constexpr int G = H / HKV;
  static constexpr int GH = G / HG;  // heads per warp
  static constexpr int slot_warps = NW;
  static constexpr int head_groups = HG;
  static constexpr int warps = NW * HG;
  static constexpr int threads = 32 * warps;
  // Slots per warp and step: at U = 4, 8 loads of 16 bytes in flight per lane (ST = 0).
  static constexpr int unroll = U;
  static constexpr int stages = ST;
  static constexpr int min_blocks = MB;
  static constexpr int step = NW * U;  // slots per block step
  using AttnSplitRule<D, H / HKV, SP>::max_splits;
  // Local heads per round of the in-block warp merge (shared memory sm_o[warps][merge_heads][D]).
  static constexpr int merge_heads = GH % 3 == 0 ? 3 : (GH % 2 == 0 ? 2 : 1);
  // ST >= 2: the cp.async ring, ST stages of `step` slots of K then V (bf16 [2][D] per slot).
  static constexpr int dyn_smem_bytes = ST >= 2 ? ST * step * 2 * D * 2 : 0;
  static constexpr int static_smem_bytes =
      (2 * NW * G + warps * merge_heads * D + 2 * max_splits * G + 1) * 4;
  // grid = (gx, B*HKV, PT), gx >= 1 free (ops.attn_grid_x); static smem = static_smem_bytes,
  // dynamic smem = dyn_smem_bytes
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

// cp.async for the K/V ring (named apart from gemv_q4.cuh's helpers: one program includes both).
// 16 bytes global -> shared through L2 only; !valid: 16 zero bytes (src-size 0, nothing read).
__device__ __forceinline__ void kv_cp_async16(void* smem, const void* gmem, bool valid) {
  const unsigned s = (unsigned)__cvta_generic_to_shared(smem);
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(s), "l"(gmem),
               "r"(valid ? 16 : 0)
               : "memory");
}
__device__ __forceinline__ void kv_cp_async_commit() {
  asm volatile("cp.async.commit_group;" ::: "memory");
}
// The next block step of a block's walk over its splits (pz: the split, pj: the step in it):
// past the split's last step (s_lim) the walk goes on at the block's next split, gridDim.x on.
__device__ __forceinline__ void kv_walk_next(int& pz, int& pj, int s_beg, int step, int s_lim) {
  if (s_beg + step >= s_lim) {
    pz += gridDim.x;
    pj = 0;
  } else {
    ++pj;
  }
}
template <int N>
__device__ __forceinline__ void kv_cp_async_wait() {
  asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
}

// Warp sums of N values at once: level O (16, 8, 4, 2, 1, as warp_sum) adds each value to the
// one of lane ^ O, and while the count held is even, a lane keeps only half of them (the upper
// half where lane & O is set) and sends its partner the other half. Every sum is formed by the
// same pairs in the same order as warp_sum's, so it has warp_sum's bits. Afterwards value j is
// held in slot XOwner<N>::slot(j) of lane XOwner<N>::lane(j) (and of the lanes that differ from
// it only in the bits of the full levels).
template <int N, int O, int V>
__device__ __forceinline__ void xsum_transposed(float (&v)[V], int lane) {
  if constexpr (O > 0) {
    if constexpr (N % 2 == 0) {
      const bool hi = lane & O;
#pragma unroll
      for (int k = 0; k < N / 2; ++k) {
        const float send = hi ? v[k] : v[N / 2 + k];
        const float keep = hi ? v[N / 2 + k] : v[k];
        v[k] = keep + __shfl_xor_sync(0xffffffffu, send, O);
      }
      xsum_transposed<N / 2, O / 2>(v, lane);
    } else {
#pragma unroll
      for (int k = 0; k < N; ++k) v[k] += __shfl_xor_sync(0xffffffffu, v[k], O);
      xsum_transposed<N, O / 2>(v, lane);
    }
  }
}
template <int N>
struct XOwner {
  __host__ __device__ static constexpr int lane(int j) {
    int n = N, l = 0;
    for (int o = 16; o > 0 && n % 2 == 0; o >>= 1, n /= 2)
      if (j >= n / 2) l |= o, j -= n / 2;
    return l;
  }
  __host__ __device__ static constexpr int slot(int j) {
    int n = N;
    for (int o = 16; o > 0 && n % 2 == 0; o >>= 1, n /= 2)
      if (j >= n / 2) j -= n / 2;
    return j;
  }
};

// Where a block's attention output goes in o: a pointer to its first column (row order), or
// an OutTiles, the same walk in wgmma_q4's activation tile order (common.cuh act_at), which
// the out projection reads with XT = 1. Both take "+ columns", and out_ptr gives the address;
// columns 2i, 2i + 1 are neighbours in both orders (bf16x2 stores).
template <int NT>
struct OutTiles {
  bf16* o;
  int K, r, c;  // o's columns (H·D), the row, the column
  __device__ __forceinline__ OutTiles operator+(int n) const { return {o, K, r, c + n}; }
};
__device__ __forceinline__ bf16* out_ptr(bf16* p) { return p; }
template <int NT>
__device__ __forceinline__ bf16* out_ptr(const OutTiles<NT>& t) { return act_at<NT>(t.o, t.K, t.r, t.c); }
template <class T>
struct IsOutTiles {
  static constexpr bool value = false;
};
template <int NT>
struct IsOutTiles<OutTiles<NT>> {
  static constexpr bool value = true;
};
// A block's heads from column c0 of row r: orow (row order, at that column) or an OutTiles.
template <int NT>
__device__ __forceinline__ auto out_heads(bf16* orow, bf16* o, int K, int r, int c0) {
  if constexpr (NT > 0) return OutTiles<NT>{o, K, r, c0};
  else return orow;
}

// Several splits (attn, attn_tc): this block's `mine` partials of row (r, kv head m) are out in
// prow (part_floats PF each: o[G][D] unnormalised, then m[G], l[G]); count them in
// arrivals[pair], pair = r·HKV + m. The block that brings the count to ns merges all ns partials
// (in split order), gates them (gate: the row's gates, query head j's at gate + 2Dj) into orow,
// and resets the counter, so every launch finds it at 0:
//   M = max_z m_z, L = Σ_z l_z 2^(m_z − M), o = Σ_z o_z · (2^(m_z − M) / L), z = 0, 1, … in order;
// the partials are read through L2 (__ldcg: other SMs wrote them in this launch). (Pointers are
// formed where they are used: passing ready-made ones made attn spill 4 bytes at HG 3.)
template <int D, int G, int NT, int MAXS, class Out>
__device__ __forceinline__ void attn_merge_splits(const float* prow, int PF, int ns, int mine,
                                                  int* arrivals, int pair, const bf16* gate,
                                                  int m, Out orow) {
  __shared__ float sm_w[2][MAXS][G];  // m, l, then the weights of the splits
  __shared__ int s_last;
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) {
    int* cnt = arrivals + pair;
    const int last = atomicAdd(cnt, mine) + mine == ns;
    if (last) *cnt = 0;  // every split has arrived: nothing else touches it in this launch
    __threadfence();
    s_last = last;
  }
  __syncthreads();
  if (!s_last) return;
  for (int i = threadIdx.x; i < ns * G; i += NT) {
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
  for (int i = threadIdx.x; i < G * D / 4; i += NT) {
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
    // Columns d, d+1 and d+2, d+3: neighbours in row order (the address formed as before
    // OutTiles, which keeps attn's SASS), two words of different core rows in tile order.
    bf162 *dst0, *dst1;
    if constexpr (IsOutTiles<Out>::value) {
      dst0 = reinterpret_cast<bf162*>(out_ptr(orow + g * D + d));
      dst1 = reinterpret_cast<bf162*>(out_ptr(orow + g * D + d + 2));
    } else {
      dst0 = reinterpret_cast<bf162*>(orow + g * D + d);
      dst1 = dst0 + 1;
    }
    *dst0 = __floats2bfloat162_rn(a[0] * sigmoidf_(to_f(gp[0])), a[1] * sigmoidf_(to_f(gp[1])));
    *dst1 = __floats2bfloat162_rn(a[2] * sigmoidf_(to_f(gp[2])), a[3] * sigmoidf_(to_f(gp[3])));
  }
}

template <int D, int H, int HKV, int PT, int NW = 8, int U = 4, int HG = 1, int ST = 0,
          int SP = 64, int MB = 0, int RX = 0>
__device__ __forceinline__ void attn(const bf16* __restrict__ qbuf, const bf16* __restrict__ qkv,
                                     int ld, const bf16* __restrict__ kc,
                                     const bf16* __restrict__ vc, int tmax,
                                     const int* __restrict__ pos, const int* __restrict__ ntok,
                                     float* __restrict__ part, int* __restrict__ arrivals,
                                     bf16* __restrict__ o) {
  static_assert(D == 256, "attn: a warp owns one head of 256 dims, 8 per lane");
  static_assert(H % HKV == 0, "attn: H must be a multiple of HKV");
  using L = AttnLaunch<D, H, HKV, PT, NW, U, HG, ST, SP, MB, RX>;
  constexpr int G = L::G, GH = L::GH, GR = L::merge_heads, PF = L::part_floats;
  constexpr int NT = L::threads, STEP = L::step;
  static_assert(G % HG == 0, "attn: head groups must tile G");
  static_assert(GH % GR == 0 && (HG * GR * D) % NT == 0, "attn: merge rounds must tile G");
  static_assert(L::split % STEP == 0, "attn: a split is whole block steps");
  static_assert(ST == 0 || ST >= 2, "attn: ST is 0 (registers) or a ring of >= 2 stages");
  constexpr int CPS = 2 * D / 8;  // 16-byte chunks per slot in the ring (K, then V)
  __shared__ float sm_ml[2][NW][G];                     // per slot warp: running max, sum
  __shared__ __align__(16) float sm_o[NW * HG][GR][D];  // per warp: o of GR heads, in the merge
  extern __shared__ uint4 kv_ring[];                    // ST >= 2: [ST][STEP][CPS]

  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int ws = warp % NW, hg = warp / NW;  // slot warp, head group (heads hg*GH ...)
  const int b = blockIdx.y / HKV, m = blockIdx.y - b * HKV, t = blockIdx.z;
  const int r = b * PT + t;
  bf16* orow = o + (size_t)r * (H * D) + m * G * D;  // this block's G heads, contiguous
  const int nt = ntok[b], p = pos[b] + t;
  if (t >= nt) {  // padding row: zeros from block x = 0 (uniform over the block, no barrier yet)
    if (blockIdx.x == 0)
      for (int i = threadIdx.x; i < G * D / 8; i += NT)
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
  float q[GH][8];
#pragma unroll
  for (int gl = 0; gl < GH; ++gl) {
    unpack_bf16x8(ldg16(qbuf + ((size_t)r * H + m * G + hg * GH + gl) * D + lane * 8), q[gl]);
#pragma unroll
    for (int i = 0; i < 8; ++i) q[gl][i] *= qscale;
  }

  const size_t base = ((size_t)b * HKV + m) * tmax * D;
  const bf16* kp = kc + base + lane * 8;
  const bf16* vp = vc + base + lane * 8;

  // ST >= 2: the producer walks the block's steps (split pz, step pj) ST − 1 steps ahead of the
  // consumer, through every split of the block; past the last one it commits empty groups.
  int pz = blockIdx.x, pj = 0, stage = 0;
  auto issue = [&](int st) {
    if (ST >= 2 && pz < ns) {
      const int s_beg = pz * len + pj * STEP, s_lim = min(n, (pz + 1) * len);
      uint4* dst = kv_ring + st * (STEP * CPS);
#pragma unroll
      for (int k = 0; k < (STEP * CPS + NT - 1) / NT; ++k) {
        const int c = threadIdx.x + k * NT, sl = c / CPS, h = c - sl * CPS;
        if ((STEP * CPS) % NT != 0 && c >= STEP * CPS) break;
        const int s = s_beg + sl;
        const bool ok = s < s_lim;
        const bf16* src = (h < D / 8 ? kc : vc) + base + (size_t)(ok ? s : 0) * D +
                          (h & (D / 8 - 1)) * 8;
        kv_cp_async16(dst + c, src, ok);
      }
      kv_walk_next(pz, pj, s_beg, STEP, s_lim);
    }
    kv_cp_async_commit();
  };
  if constexpr (ST >= 2) {
#pragma unroll
    for (int i = 0; i < ST - 1; ++i) issue(i);
  }

  int mine = 0;  // splits this block computed
  for (int z = blockIdx.x; z < ns; z += gridDim.x, ++mine) {
    const int s_end = min(n, (z + 1) * len);
    float mx[GH], sum[GH], acc[GH][8];
#pragma unroll
    for (int g = 0; g < GH; ++g) {
      mx[g] = -INFINITY;
      sum[g] = 0.f;
#pragma unroll
      for (int i = 0; i < 8; ++i) acc[g][i] = 0.f;
    }
    // One step of warp ws: slots s0 … s0 + U − 1 (s0 < s_end), K/V in kr, vr (zero past s_end).
    auto step_math = [&](const uint4 (&kr)[U], const uint4 (&vr)[U], int s0) {
      float sc[GH][U], d[GH * U];
#pragma unroll
      for (int u = 0; u < U; ++u) {
        float k[8];
        unpack_bf16x8(kr[u], k);
#pragma unroll
        for (int g = 0; g < GH; ++g) {
          float a = 0.f;
#pragma unroll
          for (int i = 0; i < 8; ++i) a = fmaf(q[g][i], k[i], a);
          d[g * U + u] = a;
        }
      }
      if constexpr (RX) {
        xsum_transposed<GH * U, 16>(d, lane);
        using X = XOwner<GH * U>;
#pragma unroll
        for (int g = 0; g < GH; ++g)
#pragma unroll
          for (int u = 0; u < U; ++u)
            sc[g][u] = __shfl_sync(0xffffffffu, d[X::slot(g * U + u)], X::lane(g * U + u));
      } else {
#pragma unroll
        for (int g = 0; g < GH; ++g)
#pragma unroll
          for (int u = 0; u < U; ++u) sc[g][u] = warp_sum(d[g * U + u]);
      }
#pragma unroll
      for (int u = 0; u < U; ++u)
        if (s0 + u >= s_end)
#pragma unroll
          for (int g = 0; g < GH; ++g) sc[g][u] = -INFINITY;
      // Online softmax: m' = max(m, s_u); o ← o·2^(m−m') + Σ_u 2^(s_u−m') V_u; l likewise.
#pragma unroll
      for (int g = 0; g < GH; ++g) {
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
        for (int g = 0; g < GH; ++g)
#pragma unroll
          for (int i = 0; i < 8; ++i) acc[g][i] = fmaf(sc[g][u], v[i], acc[g][i]);
      }
    };
    if constexpr (ST >= 2) {
      // Every warp walks all `steps` of the split (the ring's barriers are block-wide); a warp
      // whose s0 >= s_end skips the math, like the register path's loop bound.
      const int steps = (s_end - z * len + STEP - 1) / STEP;
      for (int j = 0; j < steps; ++j) {
        const int s0 = z * len + j * STEP + ws * U;
        kv_cp_async_wait<ST - 2>();
        __syncthreads();  // step j's stage is in; the stage refilled next was read by everyone
        issue(stage == 0 ? ST - 1 : stage - 1);
        const uint4* src = kv_ring + stage * (STEP * CPS) + ws * U * CPS + lane;
        stage = stage + 1 == ST ? 0 : stage + 1;
        if (s0 >= s_end) continue;  // warp-uniform
        uint4 kr[U], vr[U];
#pragma unroll
        for (int u = 0; u < U; ++u) {  // zero-filled past s_end, like the register path
          kr[u] = src[u * CPS];
          vr[u] = src[u * CPS + D / 8];
        }
        step_math(kr, vr, s0);
      }
    } else {
      // slot z*len < s_end always: warp 0's mx becomes finite
      for (int s0 = z * len + ws * U; s0 < s_end; s0 += STEP) {
        uint4 kr[U], vr[U];
#pragma unroll
        for (int u = 0; u < U; ++u) {
          kr[u] = vr[u] = make_uint4(0u, 0u, 0u, 0u);  // slots >= s_end are never read
          if (s0 + u < s_end) {
            kr[u] = ldg16(kp + (size_t)(s0 + u) * D);
            vr[u] = ldg16(vp + (size_t)(s0 + u) * D);
          }
        }
        step_math(kr, vr, s0);
      }
    }

    // Merge the slot warps, per head: M = max_ws m_ws, L = Σ_ws l_ws 2^(m_ws − M),
    // o = Σ_ws o_ws 2^(m_ws − M) [/ L], ws = 0, 1, … in order. A warp that got no slot has
    // m = −inf, l = 0, o = 0 and weighs 0; warp 0 always has the split's first slot, so M is
    // finite. One split (ns = 1): o is final, normalised, gated and written as bf16. Several:
    // (M, L, unnormalised o) go to this split's partial.
    float* pzp = prow + (size_t)z * PF;
    if (lane == 0) {
#pragma unroll
      for (int g = 0; g < GH; ++g) {
        sm_ml[0][ws][hg * GH + g] = mx[g];
        sm_ml[1][ws][hg * GH + g] = sum[g];
      }
    }
    __syncthreads();
#pragma unroll
    for (int gl = 0; gl < GH; ++gl) {
      const int g = hg * GH + gl;
      float M = -INFINITY, Ls = 0.f;
#pragma unroll
      for (int w = 0; w < NW; ++w) M = fmaxf(M, sm_ml[0][w][g]);
#pragma unroll
      for (int w = 0; w < NW; ++w) Ls += sm_ml[1][w][g] * exp2f(sm_ml[0][w][g] - M);
      const float e = exp2f(mx[gl] - M);
      const float f = ns == 1 ? e / Ls : e;
#pragma unroll
      for (int i = 0; i < 8; ++i) acc[gl][i] *= f;
      if (ns > 1 && ws == 0 && lane == 0) {
        pzp[G * D + g] = M;
        pzp[G * D + G + g] = Ls;
      }
    }
#pragma unroll
    for (int g0 = 0; g0 < GH; g0 += GR) {
#pragma unroll
      for (int gg = 0; gg < GR; ++gg) {
        float4* dst = reinterpret_cast<float4*>(&sm_o[warp][gg][lane * 8]);
        dst[0] = make_float4(acc[g0 + gg][0], acc[g0 + gg][1], acc[g0 + gg][2], acc[g0 + gg][3]);
        dst[1] = make_float4(acc[g0 + gg][4], acc[g0 + gg][5], acc[g0 + gg][6], acc[g0 + gg][7]);
      }
      __syncthreads();
#pragma unroll
      for (int k = 0; k < HG * GR * D / NT; ++k) {
        const int idx = threadIdx.x + k * NT, hh = idx / (GR * D), rem = idx - hh * (GR * D);
        const int gg = rem / D, d = rem - gg * D;
        const int g = hh * GH + g0 + gg;
        float s = 0.f;
#pragma unroll
        for (int w = 0; w < NW; ++w) s += sm_o[hh * NW + w][gg][d];
        if (ns == 1)
          orow[g * D + d] = to_bf(s * sigmoidf_(to_f(gate[2 * D * (m * G + g) + d])));
        else
          pzp[g * D + d] = s;
      }
      __syncthreads();  // sm_o (and sm_ml) are rewritten next
    }
  }
  if (ns == 1) return;
  attn_merge_splits<D, G, L::threads, L::max_splits>(prow, PF, ns, mine, arrivals, r * HKV + m,
                                                      gate, m, orow);
}

}  // namespace q38

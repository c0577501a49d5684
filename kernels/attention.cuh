// attention.cuh: gated full attention (docs/MODEL.md §4.1, §5): attn_prep, and what the attention
// kernel, attention_tc.cuh's attn_tc, builds on: the split rule, the K/V ring's walk, the output
// order and the merge of a row's splits.
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
//                is touched. The gate stays in qkv; attn_tc reads it there.
//   Packed chunk (docs/KERNELS.md "Packed chunks"): rowseq int32 [R] (the sequence of row r, −1
//        past every sequence's rows) and row0 int32 [B] (its first row) replace r = b*PT + t.
//   Launch AttnPrepLaunch: grid (R, grid_y), block `threads`, no dynamic smem. One warp per
//   (row, head) over the H q, HKV k and HKV v heads of the row; a lane owns 8 dims (16 bytes).
//   Numerics (docs/MODEL.md §7): RMS statistic in fp32, normed value rounded to bf16 (as HF stores it),
//   rotation in fp32 from it, rounded to bf16. Angle p·ω_i in fp32 like HF (ω_i = 1/θ^(2i/RD) as a
//   correctly rounded fp32), reduced mod 2π in fp64 (exact for that fp32 angle, p ≤ 2^24), then
//   __sincosf on [−π, π] (absolute error ≤ 2^-21.4 there). sincosf itself would be as accurate
//   but its large-argument path (|φ| > 105615, i.e. positions past ~1e5) needs a local-memory stack.
//
// The attention (attn_tc) — causal softmax over the cache, output gate, split-K:
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
//   plan.attention.ATTN_SPLIT, is 256: 256-slot splits up to n = 8192, then at most 32 splits
//   of a whole number of 256-slot tiles). It depends on n only, never on B or the grid, so a
//   row's bits are the same at every batch size (AttnSplitRule).
//   Grid (gx, B*HKV, PT), gx ≥ 1 free (plan.attention.attn_grid_x): block x computes splits x,
//   x + gx, … of its row, one after the other (blocks with x ≥ ns exit at once). Which block
//   computes a split changes no bit of it. One split (n ≤ SP): the block gates and writes o as
//   bf16 itself (no scratch, no counter). Several: each block writes its splits' partials (M, L, o) and counts
//   them in arrivals; the last to arrive merges all of them in split order (attn_merge_splits).
//   fp32 throughout. Deterministic: no float atomics, fixed merge orders.
//
// Template parameters: D head_dim (256: a warp covers one head with one 16-byte vector per lane),
// RD rotary dims (docs/MODEL.md's R = 64), H / HKV query / kv heads, PT rows per sequence.
//
// Entry point (docs/KERNELS.md), e.g. for the tiny geometry's decode:
//   extern "C" __global__ void __launch_bounds__(q38::AttnPrepLaunch<256, 64, 6, 2, 1>::threads)
//   q38_attn_prep_tiny(ARGS) { q38::attn_prep<256, 64, 6, 2, 1>(ARGS); }
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

// The split rule and the partials' size of attn_tc's AttnTcLaunch: a row of n slots is cut into
// ns(n) splits of span(n) slots (a multiple of `split` = SP), at most max_splits of them; both
// depend on n only, never on B or the grid.
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
                                          bf16* __restrict__ vc, int tmax,
                                          const int* __restrict__ rowseq = nullptr,
                                          const int* __restrict__ row0 = nullptr) {
  static_assert(D == 256, "attn_prep: a warp owns one head of 256 dims, 8 per lane");
  static_assert(RD % 16 == 0 && RD <= D, "attn_prep: rotary halves must be whole lanes");
  static_assert(H % HKV == 0, "attn_prep: H must be a multiple of HKV");
  using L = AttnPrepLaunch<D, RD, H, HKV, PT>;
  constexpr int HALF = RD / 2;
  __shared__ float cs[2][HALF];  // cos, sin of this row's angles

  const int lane = threadIdx.x & 31;
  const int r = blockIdx.x;
  int b, t;
  bool real = true;               // a row of some sequence (not a packed chunk's tail)
  if (rowseq != nullptr) {
    const int s = rowseq[r];
    real = s >= 0;
    b = real ? s : 0;
    t = real ? r - row0[b] : 0;
  } else {
    b = r / PT;
    t = r - b * PT;
  }
  const int p = pos[b] + t;
  if (threadIdx.x < HALF)
    rope_cos_sin(p, theta, threadIdx.x, RD, cs[0][threadIdx.x], cs[1][threadIdx.x]);
  __syncthreads();

  const int w = blockIdx.y * L::warps + (threadIdx.x >> 5);
  if (w >= L::heads) return;
  const bool store_kv = real && t < ntok[b] && p < tmax;
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

// attn_tc's K/V ring: cp.async groups, and a block's walk over the steps of its splits.
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

// Several splits (attn_tc): this block's `mine` partials of row (r, kv head m) are out in
// prow (part_floats PF each: o[G][D] unnormalised, then m[G], l[G]); count them in
// arrivals[pair], pair = r·HKV + m. The block that brings the count to ns merges all ns partials
// (in split order), gates them (gate: the row's gates, query head j's at gate + 2Dj) into orow,
// and resets the counter, so every launch finds it at 0:
//   M = max_z m_z, L = Σ_z l_z 2^(m_z − M), o = Σ_z o_z · (2^(m_z − M) / L), z = 0, 1, … in order;
// the partials are read through L2 (__ldcg: other SMs wrote them in this launch). (Pointers are
// formed where they are used: passing ready-made ones made a caller spill.)
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
    // OutTiles, which keeps the row-order SASS), two words of different core rows in tile order.
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

}  // namespace q38

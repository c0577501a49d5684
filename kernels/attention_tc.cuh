// attention_tc.cuh: attn_tc, the decode / prefill attention on the tensor cores (mma.sync
// m16n8k16, bf16 in, fp32 accumulate). Its inputs, output, scratch, split rule and launch grid are
// described in attention.cuh's header (which holds attn_prep and the pieces shared with it); the
// arithmetic of a split:
//
//   Sᵀ = Q · Kᵀ   M = the G query heads of the kv head (rows G … 15 are zero), N = 8 slots,
//                 K = the 256 head dims: 16 k-steps per 8 slots. Scores in fp32 (the mma's sums),
//                 then × log2(e)/√D: the log2 domain (exp2f below).
//   online softmax per head over the warp's 16 slots of a step (running max m, per-lane sums l),
//   P = bf16(2^(s − m))   rounded once, as HF rounds the softmax to bf16 before P·V
//   Oᵀ += Vᵀ · Pᵀ  M = 16 head dims per m-tile (16 m-tiles), N = 8 heads, K = the 16 slots.
//
// The C fragment of Sᵀ (lane: head g = lane/4, slots 2c, 2c+1, c = lane%4) is already the B
// fragment of Pᵀ, so P never leaves the registers (FlashAttention-2's layout). Kᵀ comes from the
// K rows by ldmatrix, Vᵀ from the V rows by ldmatrix.trans, both out of a cp.async ring of
// whole block steps in shared memory, each slot row's 16-byte chunks XOR-swizzled by slot % 8 so
// that the eight rows of every 8x8 matrix fall in eight different bank groups.
//
// Work split: NW warps per block; a block step is 16·NW consecutive slots and warp ws takes
// slots 16·ws … 16·ws + 15 of it (NW and SP fix a row's arithmetic: one value for every B). At
// the end of a split the warps' (m, l, o) are merged in shared memory in warp order, and the
// split's partial (or, with one split, the gated bf16 output) is written; the splits of a row are
// merged by attention.cuh's attn_merge_splits. Deterministic: fixed sum orders everywhere, no
// float atomics.
//
// Template parameters: D = 256, H, HKV (G = H/HKV ≤ 8), PT; knobs NW (warps, a power of two ≥ 2),
// ST (ring stages, ≥ 2, ST − 1 block steps in flight), SP (slots per split, a multiple of 16·NW),
// MB (min blocks per SM for __launch_bounds__, 0: not given), TNT (0: o in rows; > 0: o in
// wgmma_q4's activation tile order for 8·TNT-row tiles, which the out projection reads with
// XT = 1; the same values, only where they go changes). The QK product of an 8-slot score tile
// is one chain of 16 mmas (version 10's two chains of 8, QC = 2, lost; the parameter is in
// dd8da46).
// Launch: grid (gx, B·HKV, PT) (attention.cuh), block AttnTcLaunch::threads, dynamic smem
// AttnTcLaunch::dyn_smem_bytes (the caller raises the function's limit above 48 KiB), static
// smem a few hundred bytes. The program's schedule (qwen38gen/plan/attention.py, Tuning's
// attn_st and attn_mb): NW 4, ST 2, SP 256, 157 KiB of shared memory, one block per SM.
//
// Compiles alone:
//   nvcc -arch=sm_90 -std=c++17 -cubin -Xptxas -v -x cu kernels/attention_tc.cuh -o /dev/null
#pragma once
#include "attention.cuh"

namespace q38 {

template <int D, int H, int HKV, int PT, int NW = 4, int ST = 2, int SP = 64, int MB = 0>
struct AttnTcLaunch : AttnSplitRule<D, H / HKV, SP> {
  static constexpr int G = H / HKV;
  static constexpr int warps = NW;
  static constexpr int threads = 32 * NW;
  static constexpr int step = 16 * NW;           // slots per block step
  static constexpr int stages = ST;
  static constexpr int min_blocks = MB;
  static constexpr int slot_bytes = 2 * D * 2;   // K row then V row, bf16
  static constexpr int ring_bytes = ST * step * slot_bytes;
  static constexpr int o_stride = D + 4;         // fp32 per head row of the warp merge (banks)
  static constexpr int o_bytes = NW * G * o_stride * 4;
  static constexpr int q_stride = D + 8;         // bf16 per head row of Q (banks)
  static constexpr int q_bytes = 8 * q_stride * 2;
  static constexpr int dyn_smem_bytes = ring_bytes + o_bytes + q_bytes;
};

__device__ __forceinline__ void ldsm_x4(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr)
               : "memory");
}
__device__ __forceinline__ void ldsm_x4_trans(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr)
               : "memory");
}
// d += a · b, m16n8k16, bf16 in, fp32 accumulate (named apart from gemv_q4's: one program
// includes both headers).
__device__ __forceinline__ void attn_mma(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2,
                                         uint32_t a3, uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
      "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}
__device__ __forceinline__ uint32_t pack_bf16x2(float lo, float hi) {
  const bf162 h = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&h);
}

template <int D, int H, int HKV, int PT, int NW = 4, int ST = 2, int SP = 64, int MB = 0,
          int TNT = 0>
__device__ __forceinline__ void attn_tc(const bf16* __restrict__ qbuf, const bf16* __restrict__ qkv,
                                        int ld, const bf16* __restrict__ kc,
                                        const bf16* __restrict__ vc, int tmax,
                                        const int* __restrict__ pos, const int* __restrict__ ntok,
                                        float* __restrict__ part, int* __restrict__ arrivals,
                                        bf16* __restrict__ o,
                                        const int* __restrict__ row0 = nullptr) {
  static_assert(D == 256, "attn_tc: 16 k-steps of QK and 16 m-tiles of PV per head");
  static_assert(H % HKV == 0 && H / HKV <= 8, "attn_tc: at most 8 query heads per kv head");
  static_assert(ST >= 2, "attn_tc: a ring of >= 2 stages");
  using L = AttnTcLaunch<D, H, HKV, PT, NW, ST, SP, MB>;
  constexpr int G = L::G, PF = L::part_floats, NT = L::threads, STEP = L::step;
  constexpr int CPS = 2 * D / 8;  // 16-byte chunks per slot row: K 0 … 31, V 32 … 63
  static_assert(L::split % STEP == 0, "attn_tc: a split is whole block steps");
  static_assert(NW >= 2 && (NW & (NW - 1)) == 0, "attn_tc: NW a power of two, at least 2");
  extern __shared__ __align__(128) uint4 tc_smem[];  // ring | sm_o | sm_q
  float* sm_o = reinterpret_cast<float*>(reinterpret_cast<char*>(tc_smem) + L::ring_bytes);
  bf16* sm_q = reinterpret_cast<bf16*>(reinterpret_cast<char*>(tc_smem) + L::ring_bytes +
                                       L::o_bytes);
  __shared__ float sm_ml[2][NW][G];  // per warp: running max, sum

  const int lane = threadIdx.x & 31, ws = threadIdx.x >> 5;
  const int g = lane >> 2, c = lane & 3;
  const int b = blockIdx.y / HKV, m = blockIdx.y - b * HKV, t = blockIdx.z;
  const int nt = ntok[b], p = pos[b] + t;
  // A packed chunk (row0, docs/KERNELS.md "Packed chunks"): sequence b's rows start at row0[b],
  // and its rows t >= ntok[b] do not exist (the next sequence's are there): nothing to write.
  if (row0 != nullptr && t >= nt) return;
  const int r = row0 != nullptr ? row0[b] + t : b * PT + t;
  // This block's G heads: contiguous in row order, or in tile order (TNT > 0: OutTiles).
  bf16* const orow_rows = o + (size_t)r * (H * D) + m * G * D;
  const auto orow = out_heads<TNT>(orow_rows, o, H * D, r, m * G * D);
  if (t >= nt) {  // padding row: zeros from block x = 0
    if (blockIdx.x == 0) {
      if constexpr (TNT > 0) {
        for (int i = threadIdx.x; i < G * D / 2; i += NT)
          *reinterpret_cast<uint32_t*>(out_ptr(orow + 2 * i)) = 0u;
      } else {
        for (int i = threadIdx.x; i < G * D / 8; i += NT)
          reinterpret_cast<uint4*>(orow)[i] = make_uint4(0u, 0u, 0u, 0u);
      }
    }
    return;
  }
  const int n = min(p + 1, tmax);  // causal: slots 0 .. p
  const int len = L::span(n), ns = L::splits(n);
  if ((int)blockIdx.x >= ns) return;
  float* prow = part + ((size_t)r * HKV + m) * L::stride(tmax) * PF;
  const bf16* gate = qkv + (size_t)r * ld + D;  // gate of head j at gate + 2Dj
  const size_t base = ((size_t)b * HKV + m) * tmax * D;
  const uint32_t ring_s = (uint32_t)__cvta_generic_to_shared(tc_smem);

  // The producer walks the block's steps (split pz, step pj) ST − 1 steps ahead of the consumer,
  // through every split of the block; past the last one it commits empty groups. Chunk h of slot
  // row sl goes to chunk (h & 32) | ((h & 31) ^ (sl & 7)) of the row (zeros past the split).
  // Thread t copies chunk h = t % 64 of slot rows sl0 + k·RPI (sl0 = t / 64 < RPI, k < STEP / RPI):
  // RPI is a power of two, so sl & 7 = sl0 | ((k·RPI) & 7) and everything but the bound check
  // and one xor is fixed per thread.
  constexpr int RPI = NT / CPS;  // slot rows per pass of the block's threads
  const int h = threadIdx.x & (CPS - 1), sl0 = threadIdx.x / CPS;
  const bf16* src_t = (h < D / 8 ? kc : vc) + base + (h & 31) * 8;  // slot 0 (always valid)
  const uint32_t dst_t = (uint32_t)(sl0 * CPS + (h & 32)) * 16, hx0 = (h & 31) ^ sl0;
  int pz = blockIdx.x, pj = 0, stage = 0;
  auto issue = [&](int st) {
    if (pz < ns) {
      const int s_beg = pz * len + pj * STEP, s_lim = min(n, (pz + 1) * len);
      const bf16* src = src_t + (size_t)(s_beg + sl0) * D;
      const int lim = s_lim - s_beg - sl0;  // row sl0 + k·RPI is in the split iff k·RPI < lim
      const uint32_t dst = ring_s + st * (STEP * CPS * 16) + dst_t;
      if (lim >= STEP) {  // a whole step: no bound checks
#pragma unroll
        for (int k = 0; k < STEP / RPI; ++k)
          cp_async16_s(dst + (uint32_t)(k * RPI * CPS * 16) + ((hx0 ^ ((k * RPI) & 7)) << 4),
                       src + k * RPI * D);
      } else {  // the split's last step: zeros past its end (nothing read there)
#pragma unroll
        for (int k = 0; k < STEP / RPI; ++k) {
          const bool ok = k * RPI < lim;
          asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(
                           dst + (uint32_t)(k * RPI * CPS * 16) + ((hx0 ^ ((k * RPI) & 7)) << 4)),
                       "l"(ok ? src + (size_t)k * RPI * D : src_t), "r"(ok ? 16 : 0)
                       : "memory");
        }
      }
      kv_walk_next(pz, pj, s_beg, STEP, s_lim);
    }
    kv_cp_async_commit();
  };
#pragma unroll
  for (int i = 0; i < ST - 1; ++i) issue(i);

  // Q of the G heads (rows G … 7 zero) into shared memory, then this lane's A fragments:
  // qf[kk][0] = Q[g][16kk + 2c, +1], qf[kk][1] = Q[g][16kk + 8 + 2c, +1] (rows 8 … 15 are zero).
  for (int i = threadIdx.x; i < 8 * D / 8; i += NT) {
    const int hh = i / (D / 8), ch = i - hh * (D / 8);
    const uint4 v = hh < G ? ldg16(qbuf + ((size_t)r * H + m * G + hh) * D + ch * 8)
                           : make_uint4(0u, 0u, 0u, 0u);
    *reinterpret_cast<uint4*>(sm_q + hh * L::q_stride + ch * 8) = v;
  }
  __syncthreads();
  uint32_t qf[16][2];
  {
    const uint32_t qs = (uint32_t)__cvta_generic_to_shared(sm_q);
#pragma unroll
    for (int kk = 0; kk < 16; kk += 2) {
      // matrices: (heads 0-7, dims 16kk..+7), (…, +8..+15), (16kk+16..), (16kk+24..)
      uint32_t f[4];
      ldsm_x4(f, qs + ((lane & 7) * L::q_stride + 16 * kk + 8 * (lane >> 3)) * 2);
      qf[kk][0] = f[0];
      qf[kk][1] = f[1];
      qf[kk + 1][0] = f[2];
      qf[kk + 1][1] = f[3];
    }
  }
  const float qscale = 1.4426950408889634f * rsqrtf((float)D);  // log2(e)/√D

  int mine = 0;  // splits this block computed
  for (int z = blockIdx.x; z < ns; z += gridDim.x, ++mine) {
    const int s_end = min(n, (z + 1) * len);
    // This lane's state: m, l of head g (l: the sum of its own slots' p), o of heads 2c, 2c+1
    // at dims 16mt + g and 16mt + g + 8 (the C fragment of Oᵀ).
    float mx = -INFINITY, lsum = 0.f;
    float oacc[16][4];
#pragma unroll
    for (int mt = 0; mt < 16; ++mt)
#pragma unroll
      for (int e = 0; e < 4; ++e) oacc[mt][e] = 0.f;

    const int steps = (s_end - z * len + STEP - 1) / STEP;
    for (int j = 0; j < steps; ++j) {
      const int s0 = z * len + j * STEP + 16 * ws;
      kv_cp_async_wait<ST - 2>();
      __syncthreads();  // step j's stage is in; the stage refilled next was read by everyone
      issue(stage == 0 ? ST - 1 : stage - 1);
      const uint32_t tile = ring_s + (stage * STEP + 16 * ws) * (CPS * 16);
      stage = stage + 1 == ST ? 0 : stage + 1;
      if (s0 >= s_end) continue;  // warp-uniform: no slot of this warp in the split

      // Sᵀ for slots 0-7 (sacc[0]) and 8-15 (sacc[1]) of the warp's 16.
      float sacc[2][4];
#pragma unroll
      for (int h8 = 0; h8 < 2; ++h8)
#pragma unroll
        for (int e = 0; e < 4; ++e) sacc[h8][e] = 0.f;
#pragma unroll
      for (int kk = 0; kk < 16; kk += 2) {
#pragma unroll
        for (int h8 = 0; h8 < 2; ++h8) {
          // matrices: slots 8h8 … +7 × dim chunks 2kk, 2kk+1, 2kk+2, 2kk+3
          const int sl = 8 * h8 + (lane & 7), ch = 2 * kk + (lane >> 3);
          uint32_t kb[4];
          ldsm_x4(kb, tile + (sl * CPS + (ch ^ (sl & 7))) * 16);
          float (&acc)[4] = sacc[h8];
          attn_mma(acc, qf[kk][0], 0u, qf[kk][1], 0u, kb[0], kb[1]);
          attn_mma(acc, qf[kk + 1][0], 0u, qf[kk + 1][1], 0u, kb[2], kb[3]);
        }
      }
      // Scores of head g, slots 8h8 + 2c + e; masked past the split's end.
      float sc[4];
#pragma unroll
      for (int h8 = 0; h8 < 2; ++h8)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const float d = sacc[h8][e];
          sc[2 * h8 + e] = s0 + 8 * h8 + 2 * c + e < s_end ? d * qscale : -INFINITY;
        }
      float mn = fmaxf(fmaxf(sc[0], sc[1]), fmaxf(sc[2], sc[3]));
      mn = fmaxf(mn, __shfl_xor_sync(0xffffffffu, mn, 1));
      mn = fmaxf(mn, __shfl_xor_sync(0xffffffffu, mn, 2));
      mn = fmaxf(mx, mn);  // finite: slot s0 is in the split
      const float corr = exp2f(mx - mn);
      mx = mn;
      float pr[4];
#pragma unroll
      for (int i = 0; i < 4; ++i) pr[i] = exp2f(sc[i] - mn);
      lsum = lsum * corr + ((pr[0] + pr[1]) + (pr[2] + pr[3]));
      // Oᵀ's columns are heads 2c, 2c+1: their corrections live in lanes 8c and 8c + 4.
      const float c0 = __shfl_sync(0xffffffffu, corr, 8 * c);
      const float c1 = __shfl_sync(0xffffffffu, corr, 8 * c + 4);
      const uint32_t pb0 = pack_bf16x2(pr[0], pr[1]), pb1 = pack_bf16x2(pr[2], pr[3]);
#pragma unroll
      for (int mt = 0; mt < 16; ++mt) {
        // matrices: (slots 0-7, dims 16mt..+7), (0-7, +8..), (8-15, 16mt..), (8-15, +8..)
        const int sl = (lane & 7) + 8 * (lane >> 4), ch = 2 * mt + ((lane >> 3) & 1);
        uint32_t va[4];
        ldsm_x4_trans(va, tile + (sl * CPS + 32 + (ch ^ (sl & 7))) * 16);
        oacc[mt][0] *= c0;
        oacc[mt][1] *= c1;
        oacc[mt][2] *= c0;
        oacc[mt][3] *= c1;
        attn_mma(oacc[mt], va[0], va[1], va[2], va[3], pb0, pb1);
      }
    }

    // Merge the warps, per head: M = max_w m_w,
    // L = Σ_w l_w 2^(m_w − M), o = Σ_w o_w 2^(m_w − M) [/ L], w = 0, 1, … in order.
    lsum += __shfl_xor_sync(0xffffffffu, lsum, 1);
    lsum += __shfl_xor_sync(0xffffffffu, lsum, 2);
    if (c == 0 && g < G) {
      sm_ml[0][ws][g] = mx;
      sm_ml[1][ws][g] = lsum;
    }
    __syncthreads();
    float* pzp = prow + (size_t)z * PF;
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      const int hh = 2 * c + e;
      if (hh < G) {
        float M = -INFINITY, Ls = 0.f;
#pragma unroll
        for (int w = 0; w < NW; ++w) M = fmaxf(M, sm_ml[0][w][hh]);
#pragma unroll
        for (int w = 0; w < NW; ++w) Ls += sm_ml[1][w][hh] * exp2f(sm_ml[0][w][hh] - M);
        const float ew = exp2f(sm_ml[0][ws][hh] - M);
        const float f = ns == 1 ? ew / Ls : ew;
        float* dst = sm_o + (ws * G + hh) * L::o_stride;
#pragma unroll
        for (int mt = 0; mt < 16; ++mt) {
          dst[16 * mt + g] = oacc[mt][e] * f;
          dst[16 * mt + g + 8] = oacc[mt][2 + e] * f;
        }
        if (ns > 1 && ws == 0 && g == 0) {
          pzp[G * D + hh] = M;
          pzp[G * D + G + hh] = Ls;
        }
      }
    }
    __syncthreads();
    for (int i = threadIdx.x; i < G * D; i += NT) {
      const int hh = i / D, d = i - hh * D;
      float s = 0.f;
#pragma unroll
      for (int w = 0; w < NW; ++w) s += sm_o[(w * G + hh) * L::o_stride + d];
      if (ns == 1)
        *out_ptr(orow + (hh * D + d)) = to_bf(s * sigmoidf_(to_f(gate[2 * D * (m * G + hh) + d])));
      else
        pzp[hh * D + d] = s;
    }
    __syncthreads();  // sm_o and sm_ml are rewritten by the next split
  }
  if (ns == 1) return;
  attn_merge_splits<D, G, NT, L::max_splits>(prow, PF, ns, mine, arrivals, r * HKV + m, gate, m,
                                              orow);
}

}  // namespace q38

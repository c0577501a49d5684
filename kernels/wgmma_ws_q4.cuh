// wgmma_ws_q4.cuh: wgmma_q4's GEMV with its work split by role (warp specialization, sm_90a).
//
//   y[r, n] = sum_k W~[n, k] * x[r, k]          same operands, layouts and epilogues as gemv_q4
//
// wgmma_q4 runs each group's steps one after another in every warp (wait for the weights, a
// block barrier, store the next activation tile, dequantize, 8 wgmmas, wait, scale), and with one
// block per SM nothing overlaps them (bench/NOTES.md, version 4). Here a block has two roles:
//
//   - one producer warpgroup fills an XS-stage ring in shared memory. Per group, bulk copies
//     (cp.async.bulk, counted by mbarrier transaction bytes) bring the weights and scales of the
//     block's m-tiles and the activation rows (256 bytes of each, as they lie in x) XS-1 groups
//     ahead; then the producer's threads transpose the group's rows into wgmma's B layout
//     (wgmma_q4's core-matrix layout, below) inside shared memory. (Loading the activations
//     into registers one group ahead, as wgmma_q4 does, left both kernels waiting ~1.2 us per
//     group on those loads: bench/NOTES.md, version 5.)
//   - CW consumer warpgroups, each owning 64 output rows (one m-tile per warp), wait for a stage,
//     dequantize their A fragments, run the group's 8 wgmmas, release the stage and scale.
//
// Stages are handed over by mbarriers (full: the producer's 128 arrivals plus the weight bytes;
// empty: one arrival per consumer warp), never by a block barrier, so the consumer warpgroups
// drift apart and one dequantizes while another's wgmmas run, and the producer runs up to XS
// groups ahead of the slowest.
//
// The arithmetic is wgmma_q4's and so gemv_q4's (the same KS parts, the same per-group k-steps
// from zero and fp32 scale-add, the parts summed in part order): a row's bits do not depend on
// CW, XS or ZS (tests/gpu/test_gemv_q4.py checks them against gemv_q4 on the device).
//
// Launch: grid = (ceil(ceil(N/16) / (4*CW)), ceil(R / (8*NT)), ZS), block = 128*CW + 128,
//   dynamic smem WsLaunch::dyn_smem_bytes (the caller raises the 48 KiB limit). ZS > 1: `part`
//   holds WsLaunch::part_floats * grid.x * grid.y floats, `arrivals` grid.x * grid.y zeroed ints,
//   as wgmma_q4. With CW = 3 both roles fit 128 registers (one 512-thread block per SM).
//
// Compiles alone:
//   nvcc -arch=sm_90a -std=c++17 -cubin -Xptxas -v -x cu kernels/wgmma_ws_q4.cuh -o /dev/null
#pragma once
#include "wgmma_q4.cuh"

namespace q38 {

template <int NT, int KS, int CW, int XS, int ZS = 1>
struct WsLaunch {
  static_assert(CW >= 1 && CW <= 3, "wgmma_ws_q4: 1 to 3 consumer warpgroups");
  static_assert(XS >= 2 && XS <= 8, "wgmma_ws_q4: 2 <= XS <= 8 ring stages");
  static_assert(8 * NT <= 64, "wgmma_ws_q4: at most 64 activation rows (two per producer lane)");
  static_assert(ZS >= 1 && KS % ZS == 0, "wgmma_ws_q4: ZS must divide KS");
  static constexpr int consumers = 128 * CW;
  static constexpr int threads = consumers + 128;  // + the producer warpgroup
  static constexpr int rows_per_block = 64 * CW;
  static constexpr int btg = 8 * NT;
  static constexpr int x_bytes = 8 * NT * 256;      // a group's B operand: 8 k-steps x NT x 256 B
  static constexpr int raw_row = 256 + 16;          // a copied activation row, padded: no bank conflicts
  static constexpr int raw_bytes = 8 * NT * raw_row;
  static constexpr int w_bytes = 4 * CW * 66 * 16;  // per consumer warp: 64 uint4 weights, 2 scales
  static constexpr int stage_bytes = x_bytes + raw_bytes + w_bytes;  // [B tile | raw rows | weights]
  static constexpr int w_copy_bytes = 4 * CW * (1024 + 32);  // one stage's weight bulk copies
  static constexpr int x_units = 32 * NT;                    // (row, k-tile, half) of a group
  static constexpr int x_per_thread = (x_units + 127) / 128;
  static constexpr int values = NT * 4;  // accumulators per consumer thread
  static constexpr int sum_bytes = KS > 1 && ZS == 1 ? consumers * values * 4 : 0;
  static constexpr int part_floats = KS * consumers * values;  // per row block (ZS > 1)
  static constexpr int dyn_smem_bytes = XS * stage_bytes + sum_bytes + 24 * XS;  // + mbarriers
};

// mbarrier and bulk-copy primitives (shared-memory addresses as __cvta_generic_to_shared gives).
__device__ __forceinline__ void mbar_init(unsigned bar, unsigned count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(bar), "r"(count) : "memory");
}
__device__ __forceinline__ void mbar_arrive(unsigned bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(bar) : "memory");
}
// One arrival that also expects `bytes` more transaction bytes before the phase completes.
__device__ __forceinline__ void mbar_arrive_tx(unsigned bar, unsigned bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(bytes) : "memory");
}
// Until the phase of parity `parity` has completed.
__device__ __forceinline__ void mbar_wait(unsigned bar, unsigned parity) {
  asm volatile(
      "{\n.reg .pred p;\nWS_WAIT:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n"
      "@!p bra WS_WAIT;\n}\n" ::"r"(bar),
      "r"(parity)
      : "memory");
}
// `bytes` (a multiple of 16) global -> shared, completing on mbarrier `bar` (the tensor memory
// accelerator's bulk copy, no tensor map).
__device__ __forceinline__ void bulk_copy(unsigned dst, const void* src, unsigned bytes, unsigned bar) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
               ::"r"(dst), "l"(src), "r"(bytes), "r"(bar)
               : "memory");
}

// NT: n-tiles (8 activation rows), BTG = 8*NT; KS: the parts of K (min(8, K/128)); EPI:
// GemvEpilogue; CW: consumer warpgroups (64 rows each); XS: ring stages; ZS: blocks splitting
// the parts of K (grid.z).
template <int K, int NT, int KS, int EPI, int CW, int XS, int ZS = 1>
__device__ __forceinline__ void wgmma_ws_q4(const uint4* __restrict__ qweight, const bf16* __restrict__ scales,
                                            const bf16* __restrict__ x, int ldx, bf16* y, int ldy, int N, int R,
                                            float* part_buf = nullptr, int* arrivals = nullptr) {
  static_assert(K % 128 == 0, "K must be a multiple of 128");
  using L = WsLaunch<NT, KS, CW, XS, ZS>;
  constexpr int KT = K / 64, NG = K / 128, V = L::values, TC = L::consumers;
  constexpr int SB = L::stage_bytes, XB = L::x_bytes;
  extern __shared__ __align__(128) uint4 ws_smem[];  // [XS][x tile | weights], sums, mbarriers
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int tiles = (N + 15) >> 4;
  const int r0 = blockIdx.y * (8 * NT);
  const unsigned smem0 = (unsigned)__cvta_generic_to_shared(ws_smem);
  // mbarriers: full[s] (the B tile and weights of stage s are ready), empty[s] (every consumer
  // warp is done with stage s), raw[s] (its activation rows have landed, for the producer).
  const unsigned bar0 = smem0 + XS * SB + L::sum_bytes;
  auto full = [&](int s) { return bar0 + 8 * s; };
  auto empty = [&](int s) { return bar0 + 8 * (XS + s); };
  auto raw = [&](int s) { return bar0 + 8 * (2 * XS + s); };

  // This block's parts [pa, pb) and their groups [gb, ge).
  const int pa = (int)blockIdx.z * (KS / ZS), pb = pa + KS / ZS;
  const int gb = (pa * NG) / KS, ge = (pb * NG) / KS;
  const size_t blk = (size_t)blockIdx.y * gridDim.x + blockIdx.x;

  if (tid == 0) {
    for (int s = 0; s < XS; ++s) {
      mbar_init(full(s), 128 + 1);  // the producer's threads + the weight bytes' arrival
      mbar_init(empty(s), 4 * CW);  // one per consumer warp
      mbar_init(raw(s), 1);         // the activation bytes' arrival
    }
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncthreads();
  pdl_launch_dependents();

  if (tid >= TC) {
    // ------------------------------------------------------------------ producer warpgroup
    const int pt = tid - TC;
    const int ng = ge - gb;
    // Bulk copies of group gb + m into stage m % XS, by the producer's first warp: lane l < 4*CW
    // copies m-tile l's 1 KiB of weights and 32 bytes of scales (rows past N read the last
    // tile), lanes copy activation rows (rows past R read row R-1), after lane 0 announced the
    // bytes on the stage's barrier.
    auto issue_w = [&](int m) {
      if (pt < 32) {
        const int s = m % XS, gi = gb + m;
        if (pt == 0) mbar_arrive_tx(full(s), L::w_copy_bytes);
        __syncwarp();
        if (pt < 4 * CW) {
          const int t = min((int)(blockIdx.x * CW) * 4 + pt, tiles - 1);
          const unsigned d = smem0 + s * SB + XB + L::raw_bytes + pt * 66 * 16;
          bulk_copy(d, qweight + ((size_t)t * KT + 2 * gi) * 32, 1024, full(s));
          bulk_copy(d + 64 * 16, reinterpret_cast<const unsigned short*>(scales) + ((size_t)t * NG + gi) * 16,
                    32, full(s));
        }
      }
    };
    auto issue_x = [&](int m) {
      if (pt < 32) {
        const int s = m % XS, gi = gb + m;
        if (pt == 0) mbar_arrive_tx(raw(s), 8 * NT * 256);
        __syncwarp();
        for (int r = pt; r < 8 * NT; r += 32)
          bulk_copy(smem0 + s * SB + XB + r * L::raw_row, x + (size_t)min(r0 + r, R - 1) * ldx + gi * 128,
                    256, raw(s));
      }
    };
    const int P = min(XS - 1, ng);
    for (int m = 0; m < P; ++m) issue_w(m);  // constant data: before pdl_wait
    pdl_wait();                               // x comes from the previous kernel
    for (int m = 0; m < P; ++m) issue_x(m);

    // The transpose (wgmma_q4's units and core-matrix layout): unit u = pt + 128 i is activation
    // row 8 nb + n8, k-tile h, half ih: its 16 bytes at 32 j + 16 ih of the row's 128-byte
    // k-tile (j = 0..3) become 4 core-matrix rows, row t holding word t of each.
    constexpr int XP = L::x_per_thread;
    int xsrc[XP];
    unsigned xdst[XP];
#pragma unroll
    for (int i = 0; i < XP; ++i) {
      const int u = pt + i * 128, n8 = u & 7, ih = (u >> 3) & 1, nb = (u >> 4) % NT, h = u / (16 * NT);
      xsrc[i] = u < L::x_units ? (8 * nb + n8) * L::raw_row + h * 128 + ih * 16 : -1;
      xdst[i] = ((4 * h + 2 * ih) * NT + nb) * 256 + n8 * 16;
    }
#pragma unroll 1
    for (int j = 0; j < ng; ++j) {
      const int s = j % XS;
      mbar_wait(raw(s), (j / XS) & 1);
      char* st = reinterpret_cast<char*>(ws_smem) + s * SB;
#pragma unroll
      for (int i = 0; i < XP; ++i)
        if (xsrc[i] >= 0) {
          const uint4* q = reinterpret_cast<const uint4*>(st + XB + xsrc[i]);
          const uint4 v0 = q[0], v1 = q[2], v2 = q[4], v3 = q[6];  // 32 bytes apart
          uint4* d = reinterpret_cast<uint4*>(st + xdst[i]);
          d[0] = make_uint4(v0.x, v1.x, v2.x, v3.x);
          d[8] = make_uint4(v0.y, v1.y, v2.y, v3.y);
          d[NT * 16] = make_uint4(v0.z, v1.z, v2.z, v3.z);
          d[NT * 16 + 8] = make_uint4(v0.w, v1.w, v2.w, v3.w);
        }
      fence_proxy_async();  // the stores visible to the tensor cores
      mbar_arrive(full(s));
      // Refill the stage of group j - 1 with group j + XS - 1 once every consumer is done with it.
      const int m = j + XS - 1;
      if (m < ng) {
        if (m >= XS) mbar_wait(empty(m % XS), ((m / XS) - 1) & 1);
        issue_w(m);
        issue_x(m);
      }
    }
    return;  // the consumers' last barriers (ZS > 1) are named ones among themselves
  }

  // -------------------------------------------------------------------- consumer warpgroups
  pdl_wait();  // y (EPI_ADD) and the split scratch belong to earlier kernels too
  const int g = lane >> 2, c = lane & 3;
  const int mt0 = (blockIdx.x * CW + (warp >> 2)) * 4 + (warp & 3);  // this warp's m-tile
  float acc[1][NT][4], pt[1][NT][4];
  q4_zero<1, NT>(acc);
  q4_zero<1, NT>(pt);
  float* sums = reinterpret_cast<float*>(reinterpret_cast<char*>(ws_smem) + XS * SB) + tid;
  int part = pa, part_end = ((pa + 1) * NG) / KS;
  auto pslot = [&](int p) { return part_buf + ((size_t)p * gridDim.x * gridDim.y + blk) * (TC * V) + tid; };
  const uint64_t desc0 = (uint64_t)((smem0 & 0x3FFFF) >> 4) | (uint64_t)(128 >> 4) << 16 |
                         (uint64_t)(256 >> 4) << 32;

#pragma unroll 1
  for (int j = 0; gb + j < ge; ++j) {
    const int gi = gb + j, s = j % XS;
    mbar_wait(full(s), (j / XS) & 1);
    const uint4* ws = reinterpret_cast<const uint4*>(reinterpret_cast<const char*>(ws_smem) + s * SB + XB +
                                                     L::raw_bytes) + warp * 66;
    uint32_t a[8][4];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const uint4 wv = ws[32 * h + lane];
      const uint32_t wi[4] = {wv.x, wv.y, wv.z, wv.w};
#pragma unroll
      for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int q = 0; q < 4; ++q) a[4 * h + i][q] = q4_pair(wi[i], q);
    }
    const unsigned short* sp = reinterpret_cast<const unsigned short*>(ws + 64);
    const uint32_t sw = (uint32_t)sp[g] | ((uint32_t)sp[g + 8] << 16);
    uint64_t desc[8];
#pragma unroll
    for (int k = 0; k < 8; ++k) {
      desc[k] = desc0 + (uint64_t)((s * SB + k * NT * 256) >> 4);
      asm volatile("" : "+l"(desc[k]));  // every input of the wgmmas is defined before they start
#pragma unroll
      for (int q = 0; q < 4; ++q) asm volatile("" : "+r"(a[k][q]));
    }
    wgmma_fence();
#pragma unroll
    for (int k = 0; k < 8; ++k) Wgmma<NT>::mma(pt[0], a[k], desc[k], k);
    wgmma_commit();
    wgmma_wait<0>();
    __syncwarp();
    if (lane == 0) mbar_arrive(empty(s));  // this warp is done with stage s
    wgmma_fence_regs<NT>(pt[0]);
    q4_scale_add<NT>(acc[0], pt[0], sw);
    if (KS > 1 && gi + 1 == part_end) {
      // Part `part` is done: ZS = 1, sums += its acc in part order from 0.f; ZS > 1, to part_buf.
      float* pv = ZS > 1 ? pslot(part) : sums;
#pragma unroll
      for (int jj = 0; jj < NT; ++jj)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          float* sv = pv + (jj * 4 + e) * TC;
          if constexpr (ZS > 1) __stcg(sv, acc[0][jj][e]);
          else *sv = (part == 0 ? 0.f : *sv) + acc[0][jj][e];
          acc[0][jj][e] = 0.f;
        }
      ++part;
      part_end = ((part + 1) * NG) / KS;
    }
  }

  // Value v = j*4 + e of this thread: output feature n, activation row r.
  auto out_index = [&](int v, int& n, int& r) {
    const int jj = v / 4, e = v % 4;
    n = mt0 * 16 + g + (e >= 2 ? 8 : 0);
    r = r0 + 8 * jj + 2 * c + (e & 1);
  };
  if constexpr (ZS > 1) {
    if (!split_last_arrival<ZS, TC>(arrivals, blk)) return;
    __threadfence();
#pragma unroll 1
    for (int v = 0; v < V; ++v) {
      float sum = 0.f;
#pragma unroll
      for (int p = 0; p < KS; ++p) sum += __ldcg(pslot(p) + v * TC);
      int n, r;
      out_index(v, n, r);
      gemv_store<EPI>(y, ldy, n, r, N, R, sum);
    }
  } else {
#pragma unroll
    for (int jj = 0; jj < NT; ++jj)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int v = jj * 4 + e;
        int n, r;
        out_index(v, n, r);
        gemv_store<EPI>(y, ldy, n, r, N, R, KS > 1 ? sums[v * TC] : acc[0][jj][e]);
      }
  }
}

}  // namespace q38

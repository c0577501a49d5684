// wgmma_ws_q4.cuh: wgmma_q4's GEMV with its work split by role (warp specialization, sm_90a).
//
//   y[r, n] = sum_k W~[n, k] * x[r, k]          same operands, layouts and epilogues as gemv_q4
//
// wgmma_q4 runs each group's steps one after another in every warp (wait for the weights, a
// block barrier, store the next activation tile, dequantize, 8 wgmmas, wait, scale), and with one
// block per SM nothing overlaps them (bench/NOTES.md, version 4). Here a block has three roles:
//
//   - a weight warp streams the weights and scales of the block's m-tiles into an XS-stage ring
//     by bulk copies (cp.async.bulk, counted by each stage mbarrier's transaction bytes), as far
//     ahead as the ring allows. Weights are constant, so it never waits for the previous kernel;
//   - four activation warps load each group's activation tile into registers LA groups ahead
//     and store it transposed into wgmma's B layout (wgmma_q4's core-matrix layout) in an
//     XX-stage ring;
//   - CW consumer warpgroups, each owning 64 output rows (one m-tile per warp), wait for both
//     stages of a group, dequantize their A fragments, run the group's 8 wgmmas, release the
//     stages and scale.
//
// Stages are handed over by mbarriers, never by a block barrier: the consumer warpgroups drift
// apart (one dequantizes while another's wgmmas run) and the weights run XS groups ahead of the
// slowest consumer, independently of the activations.
//
// The arithmetic is wgmma_q4's and so gemv_q4's (the same KS parts, the same per-group k-steps
// from zero and fp32 scale-add, the parts summed in part order): a row's bits do not depend on
// CW, XS, XX, LA or ZS (tests/gpu/test_gemv_q4.py checks them against gemv_q4 on the device).
// AB (timing experiments only, wrong results): bit 0 skips the activation loads, bit 1 the
// dequantization, bit 2 the wgmmas.
//
// Launch: grid = (ceil(ceil(N/16) / (4*CW)), ceil(R / (8*NT)), ZS), block = 128*CW + 160,
//   dynamic smem WsLaunch::dyn_smem_bytes (the caller raises the 48 KiB limit). ZS > 1: `part`
//   holds WsLaunch::part_floats * grid.x * grid.y floats, `arrivals` grid.x * grid.y zeroed ints,
//   as wgmma_q4.
//
// Compiles alone:
//   nvcc -arch=sm_90a -std=c++17 -cubin -Xptxas -v -x cu kernels/wgmma_ws_q4.cuh -o /dev/null
#pragma once
#include "wgmma_q4.cuh"

namespace q38 {

template <int NT, int KS, int CW, int XS, int ZS = 1, int XX = 2, int GW = 1>
struct WsLaunch {
  static_assert(CW >= 1 && CW <= 3, "wgmma_ws_q4: 1 to 3 consumer warpgroups");
  static_assert(XS >= 2 && XS <= 16, "wgmma_ws_q4: 2 <= XS <= 16 weight stages");
  static_assert(XX >= 1 && XX <= 4, "wgmma_ws_q4: 1 <= XX <= 4 activation stages");
  static_assert(ZS >= 1 && KS % ZS == 0, "wgmma_ws_q4: ZS must divide KS");
  static_assert(GW >= 1 && GW <= 8, "wgmma_ws_q4: 1 <= GW <= 8 groups per weight stage");
  static constexpr int consumers = 128 * CW;
  static constexpr int threads = consumers + 160;  // + the weight warp + four activation warps
  static constexpr int rows_per_block = 64 * CW;
  static constexpr int btg = 8 * NT;
  static constexpr int x_bytes = 8 * NT * 256;      // a group's B operand: 8 k-steps x NT x 256 B
  // A weight stage: GW groups, [4*CW m-tiles][GW][64 uint4 weights], then [4*CW][GW][32 bytes
  // of scales]: one bulk copy of each per m-tile (copies cost the copy engine ~60 cycles each).
  static constexpr int w_bytes = 4 * CW * GW * 66 * 16;
  static constexpr int w_scale_offset = 4 * CW * GW * 1024;
  static constexpr int group_copy_bytes = 4 * CW * (1024 + 32);  // one group's weights and scales
  static constexpr int x_units = 32 * NT;                    // (row, k-tile, half) of a group
  static constexpr int x_per_thread = (x_units + 127) / 128;
  static constexpr int values = NT * 4;  // accumulators per consumer thread
  static constexpr int sum_bytes = KS > 1 && ZS == 1 ? consumers * values * 4 : 0;
  static constexpr int part_floats = KS * consumers * values;  // per row block (ZS > 1)
  // [XX activation tiles][XS weight stages][sums][mbarriers: 2 per stage of each ring]
  static constexpr int w_offset = XX * x_bytes;
  static constexpr int sum_offset = w_offset + XS * w_bytes;
  static constexpr int dyn_smem_bytes = sum_offset + sum_bytes + 16 * (XS + XX);
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
// GemvEpilogue; CW: consumer warpgroups (64 rows each); XS: weight stages; ZS: blocks splitting
// the parts of K (grid.z); XX: activation stages; GW: groups per weight stage; LA: groups of
// activations loaded ahead of the one stored; AB: above.
template <int K, int NT, int KS, int EPI, int CW, int XS, int ZS = 1, int XX = 2, int GW = 1, int LA = 1,
          int AB = 0>
__device__ __forceinline__ void wgmma_ws_q4(const uint4* __restrict__ qweight, const bf16* __restrict__ scales,
                                            const bf16* __restrict__ x, int ldx, bf16* y, int ldy, int N, int R,
                                            float* part_buf = nullptr, int* arrivals = nullptr) {
  static_assert(K % 128 == 0, "K must be a multiple of 128");
  using L = WsLaunch<NT, KS, CW, XS, ZS, XX, GW>;
  constexpr int KT = K / 64, NG = K / 128, V = L::values, TC = L::consumers;
  constexpr int XB = L::x_bytes, WB = L::w_bytes;
  extern __shared__ __align__(128) uint4 ws_smem[];
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int tiles = (N + 15) >> 4;
  const int r0 = blockIdx.y * (8 * NT);
  const unsigned smem0 = (unsigned)__cvta_generic_to_shared(ws_smem);
  // mbarriers: wfull[s] (weight stage s has landed), wempty[s] (every consumer warp is done with
  // it), xfull[s] / xempty[s] the same for activation stage s.
  const unsigned bar0 = smem0 + L::sum_offset + L::sum_bytes;
  auto wfull = [&](int s) { return bar0 + 8 * s; };
  auto wempty = [&](int s) { return bar0 + 8 * (XS + s); };
  auto xfull = [&](int s) { return bar0 + 8 * (2 * XS + s); };
  auto xempty = [&](int s) { return bar0 + 8 * (2 * XS + XX + s); };

  // This block's parts [pa, pb) and their groups [gb, ge).
  const int pa = (int)blockIdx.z * (KS / ZS), pb = pa + KS / ZS;
  const int gb = (pa * NG) / KS, ge = (pb * NG) / KS, ng = ge - gb;
  const size_t blk = (size_t)blockIdx.y * gridDim.x + blockIdx.x;

  if (tid == 0) {
    for (int s = 0; s < XS; ++s) {
      mbar_init(wfull(s), 1);        // the weight warp's arrival with the bytes
      mbar_init(wempty(s), 4 * CW);  // one per consumer warp
    }
    for (int s = 0; s < XX; ++s) {
      mbar_init(xfull(s), 128);      // the activation warps' threads
      mbar_init(xempty(s), 4 * CW);
    }
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncthreads();
  pdl_launch_dependents();

  if (warp == 4 * CW) {
    // ------------------------------------------------------------------------- weight warp
    // Weight stage m (groups gb + GW m ..) into ring slot m % XS: lane l < 4*CW copies m-tile
    // l's weights and scales of those groups (rows past N read the last tile), after lane 0
    // announced the bytes. Constant data: no pdl_wait.
    const int t = min((int)(blockIdx.x * CW) * 4 + lane, tiles - 1);
    const uint4* wsrc = qweight + (size_t)t * KT * 32;
    const unsigned short* ssrc = reinterpret_cast<const unsigned short*>(scales) + (size_t)t * NG * 16;
#pragma unroll 1
    for (int m = 0; m * GW < ng; ++m) {
      const int s = m % XS, gi = gb + m * GW, cnt = min(GW, ng - m * GW);
      if (m >= XS) mbar_wait(wempty(s), ((m / XS) - 1) & 1);
      if (lane == 0) mbar_arrive_tx(wfull(s), L::group_copy_bytes * cnt);
      __syncwarp();
      if (lane < 4 * CW) {
        const unsigned d = smem0 + L::w_offset + s * WB;
        bulk_copy(d + lane * GW * 1024, wsrc + gi * 64, 1024 * cnt, wfull(s));
        bulk_copy(d + L::w_scale_offset + lane * GW * 32, ssrc + gi * 16, 32 * cnt, wfull(s));
      }
    }
    return;  // the consumers' last barriers (ZS > 1) are named ones among themselves
  }
  if (warp > 4 * CW) {
    // --------------------------------------------------------------------- activation warps
    // The activation tile (wgmma_q4's units and core-matrix layout): unit u = pt + 128 i is
    // activation row 8 nb + n8, k-tile h, half ih; its four 16-byte loads, 32 bytes apart,
    // become 4 core-matrix rows, row t holding word t of each. Loaded LA groups ahead into a
    // rotation of LA + 1 register buffers.
    const int pt = tid - TC - 32;
    pdl_wait();  // x comes from the previous kernel
    constexpr int XP = L::x_per_thread, NB = LA + 1;
    int xoff[XP];
    unsigned xdst[XP];
#pragma unroll
    for (int i = 0; i < XP; ++i) {
      const int u = pt + i * 128, n8 = u & 7, ih = (u >> 3) & 1, nb = (u >> 4) % NT, h = u / (16 * NT);
      const int row = min(r0 + 8 * nb + n8, R - 1);
      xoff[i] = u < L::x_units ? row * ldx * 2 + h * 128 + ih * 16 : -1;
      xdst[i] = ((4 * h + 2 * ih) * NT + nb) * 256 + n8 * 16;
    }
    uint4 xr[NB][XP][4];
    auto load_x = [&](uint4 (&v)[XP][4], int m) {
      const char* src = reinterpret_cast<const char*>(x) + (gb + m) * 256;
#pragma unroll
      for (int i = 0; i < XP; ++i)
        if (xoff[i] >= 0)
#pragma unroll
          for (int j = 0; j < 4; ++j)
            v[i][j] = AB & 1 ? make_uint4(0, 0, 0, 0) : ld_after_wait16(src + xoff[i] + 32 * j);
    };
#pragma unroll
    for (int b = 0; b < LA; ++b)
      if (b < ng) load_x(xr[b], b);
#pragma unroll 1
    for (int j0 = 0; j0 < ng; j0 += NB) {
#pragma unroll
      for (int b = 0; b < NB; ++b) {  // unrolled: the buffer indices are constants
        const int j = j0 + b, s = j % XX;
        if (j < ng) {
          if (j + LA < ng) load_x(xr[(b + LA) % NB], j + LA);
          if (j >= XX) mbar_wait(xempty(s), ((j / XX) - 1) & 1);
          char* st = reinterpret_cast<char*>(ws_smem) + s * XB;
#pragma unroll
          for (int i = 0; i < XP; ++i)
            if (xoff[i] >= 0) {
              const uint4(&v)[4] = xr[b][i];
              uint4* d = reinterpret_cast<uint4*>(st + xdst[i]);
              d[0] = make_uint4(v[0].x, v[1].x, v[2].x, v[3].x);
              d[8] = make_uint4(v[0].y, v[1].y, v[2].y, v[3].y);
              d[NT * 16] = make_uint4(v[0].z, v[1].z, v[2].z, v[3].z);
              d[NT * 16 + 8] = make_uint4(v[0].w, v[1].w, v[2].w, v[3].w);
            }
          fence_proxy_async();  // the stores visible to the tensor cores
          mbar_arrive(xfull(s));
        }
      }
    }
    return;
  }

  // -------------------------------------------------------------------- consumer warpgroups
  pdl_wait();  // y (EPI_ADD) and the split scratch belong to earlier kernels too
  const int g = lane >> 2, c = lane & 3;
  const int mt0 = (blockIdx.x * CW + (warp >> 2)) * 4 + (warp & 3);  // this warp's m-tile
  float acc[1][NT][4], pt[1][NT][4];
  q4_zero<1, NT>(acc);
  q4_zero<1, NT>(pt);
  float* sums = reinterpret_cast<float*>(reinterpret_cast<char*>(ws_smem) + L::sum_offset) + tid;
  int part = pa, part_end = ((pa + 1) * NG) / KS;
  auto pslot = [&](int p) { return part_buf + ((size_t)p * gridDim.x * gridDim.y + blk) * (TC * V) + tid; };
  const uint64_t desc0 = (uint64_t)((smem0 & 0x3FFFF) >> 4) | (uint64_t)(128 >> 4) << 16 |
                         (uint64_t)(256 >> 4) << 32;

#pragma unroll 1
  for (int j = 0; j < ng; ++j) {
    const int gi = gb + j, ws_i = j / GW, s = ws_i % XS, sx = j % XX, slot = warp * GW + j % GW;
    mbar_wait(wfull(s), (ws_i / XS) & 1);
    const char* wstage = reinterpret_cast<const char*>(ws_smem) + L::w_offset + s * WB;
    const uint4* ws = reinterpret_cast<const uint4*>(wstage) + slot * 64;
    uint32_t a[8][4];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const uint4 wv = ws[32 * h + lane];
      const uint32_t wi[4] = {wv.x, wv.y, wv.z, wv.w};
#pragma unroll
      for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int q = 0; q < 4; ++q) a[4 * h + i][q] = AB & 2 ? wi[i] ^ q : q4_pair(wi[i], q);
    }
    const unsigned short* sp = reinterpret_cast<const unsigned short*>(wstage + L::w_scale_offset + slot * 32);
    const uint32_t sw = (uint32_t)sp[g] | ((uint32_t)sp[g + 8] << 16);
    mbar_wait(xfull(sx), (j / XX) & 1);
    uint64_t desc[8];
#pragma unroll
    for (int k = 0; k < 8; ++k) {
      desc[k] = desc0 + (uint64_t)((sx * XB + k * NT * 256) >> 4);
      asm volatile("" : "+l"(desc[k]));  // every input of the wgmmas is defined before they start
#pragma unroll
      for (int q = 0; q < 4; ++q) asm volatile("" : "+r"(a[k][q]));
    }
    wgmma_fence();
    if constexpr (AB & 4) {
#pragma unroll
      for (int k = 0; k < 8; ++k) pt[0][k % NT][0] += __uint_as_float(a[k][0] ^ (uint32_t)desc[k]);
    } else {
#pragma unroll
      for (int k = 0; k < 8; ++k) Wgmma<NT>::mma(pt[0], a[k], desc[k], k);
    }
    wgmma_commit();
    wgmma_wait<0>();
    __syncwarp();
    if (lane == 0) {  // this warp is done with group gi's activation stage (and weight stage)
      if (j % GW == GW - 1 || j == ng - 1) mbar_arrive(wempty(s));
      mbar_arrive(xempty(sx));
    }
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

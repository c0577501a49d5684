// wgmma_sk_q4.cuh: the batched int4-g128 GEMV of wgmma_q4.cuh, warp-specialized, with its work
// cut stream-K style over a grid of about one block per SM.
//
//   y[r, n] = sum_k W~[n, k] * x[r, k]          same operands, layouts and bits as gemv_q4
//
// Why (docs/PERFORMANCE.md, version 18): at 64 activation rows wgmma_q4's one-warpgroup blocks copy
// a 16 KiB activation tile per 4 KiB of weights, so the L2 -> SM traffic sets gate_up's time
// (copies alone 68.9 of 72.1 us, version 9), and its 544 row blocks on 396 slots run 1.72
// waves' time for 1.37 waves of work (version 16). Sharing the tile between warpgroups lost
// while a block barrier per group coupled them (version 13), and splitting row blocks' K over
// more blocks lost to the partials' traffic (versions 9, 17).
//
// Here a block has CW consumer warpgroups on CW·64 rows (a tile-block) that share each group's
// activation tile, and one producer warp (of a warpgroup that gives its registers to the
// consumers by setmaxnreg) that fills an XS-stage ring in shared memory ahead of
// them, across tile-blocks, handing stages over by mbarriers (full: the stage's copies have
// landed; empty: every consumer warp is done with it), never by a block barrier:
//   - weights and scales of the tile-block's 4·CW m-tiles by cp.async (16 bytes a lane, in
//     wgmma_q4's per-warp slot layout), counted on `full` by cp.async.mbarrier.arrive.noinc;
//   - the activation tile (x in tile order, XT: one contiguous 2048·NT-byte block per group) by
//     one bulk copy, counted on `full` by its transaction bytes.
// The weights of the first XS units are requested before griddepcontrol.wait, the activations
// after it.
//
// The work of batch tile blockIdx.y is U = TB·KS units (tile-block, part of K); block i of
// G = gridDim.x takes units [i·U/G, (i+1)·U/G), so every block has the same work within one unit.
// A tile-block cut between blocks is summed in part order as everywhere else: the block with
// its first parts (a "head") computes them first and publishes their running sum (`part_buf`,
// and the tile-block's flag in `arrivals` set to the next part); a block with only middle parts
// (where U / G < KS) waits for that, goes on and publishes in turn; the block with the last parts
// (a "tail") computes them last, starting from the published sum, stores y and resets the flag.
// So a block waits only where its predecessor's first units are late, and the bits are
// gemv_q4's: per group 8 k-steps into an unscaled partial from zero, acc += scale · partial in
// fp32, the KS parts summed in part order from 0.f. Each thread reads and writes only its own
// slots of a published sum.
//
// Launch: grid = (G, ceil(R / (8·NT))), block = WgmmaSkLaunch::threads (consumer warpgroups
//   first, the producer's last), dynamic smem WgmmaSkLaunch::dyn_smem_bytes; `part_buf` holds
//   WgmmaSkLaunch::pub_floats · TB · grid.y floats and `arrivals` TB · grid.y zeroed ints (left
//   zeroed). Entry point: extern "C" __global__ __launch_bounds__(threads, 1) calling wgmma_sk_q4.
//
// Compiles alone:
//   nvcc -arch=sm_90a -std=c++17 -cubin -Xptxas -v -x cu kernels/wgmma_sk_q4.cuh -o /dev/null
#pragma once
#include "wgmma_q4.cuh"

namespace q38 {

template <int NT, int KS, int CW, int XS>
struct WgmmaSkLaunch {
  // At most 4: the producer's 32 lanes copy the 2·MT = 8·CW 16-byte scale chunks of a stage,
  // one each (a run with CW 5 and 6 left the last m-tiles without scales: docs/PERFORMANCE.md,
  // version 18).
  static_assert(CW >= 1 && CW <= 4, "wgmma_sk_q4: 1 to 4 consumer warpgroups");
  static_assert(XS >= 2 && XS <= 16, "wgmma_sk_q4: 2 <= XS <= 16 ring stages");
  static constexpr int consumers = 128 * CW;
  // + the producer warpgroup: ptxas gives a wgmma kernel's registers by warpgroups anyway, and
  // setmaxnreg (per warpgroup) moves them from the producer to the consumers.
  static constexpr int threads = consumers + 128;
  // Registers: a block is launched with launch_regs each (ptxas's figure for one block per SM);
  // setmaxnreg.inc waits until the producer warpgroup's setmaxnreg.dec has freed what it asks
  // for, so the consumers may take no more than that (or the block hangs).
  static constexpr int producer_regs = 40;
  static constexpr int launch_regs = 65536 / threads / 8 * 8;
  static constexpr int consumer_regs_ = (launch_regs + (launch_regs - producer_regs) * 128 / consumers) / 8 * 8;
  static constexpr int consumer_regs = consumer_regs_ > 256 ? 256 : consumer_regs_;
  static constexpr int mtiles = 4 * CW;                  // m-tiles of a tile-block
  static constexpr int rows_per_block = 16 * mtiles;
  static constexpr int btg = 8 * NT;
  static constexpr int x_stage_bytes = 8 * NT * 256;     // the group's activation tile (XT order)
  static constexpr int w_stage_bytes = mtiles * 66 * 16; // per m-tile 64 uint4 of codes, 2 of scales
  static constexpr int values = NT * 4;                  // accumulators per consumer thread
  static constexpr int pub_floats = consumers * values;  // one published running sum
  static constexpr int dyn_smem_bytes = XS * (x_stage_bytes + w_stage_bytes) + 16 * XS;
  // EPI_SWIGLU: every consumer's sums, staged for the store of a tile-block's SwiGLU,
  // swiglu_stride floats per m-tile (4 of padding: fewer bank conflicts). (Two buffers taken in
  // turn, one barrier fewer per store but 49 KB more at 64 rows, made the B = 64 step 0.45 ms
  // slower: docs/PERFORMANCE.md, version 19.)
  static constexpr int swiglu_stride = values * 32 + 4;
  static constexpr int swiglu_bytes = mtiles * swiglu_stride * 4;
};

namespace sk {
// The consumer warpgroups only (named barrier 1; the producer warp never takes part).
template <int N>
__device__ __forceinline__ void consumers_sync() {
  asm volatile("bar.sync 1, %0;" ::"n"(N) : "memory");
}

// A block's units in the order it runs them: three segments (tile-blocks [t0, t1), parts
// [pa, pb) of each), any of them empty: the head (a tile-block's first parts, published) first,
// then whole tile-blocks, then the tail (a tile-block's last parts, continued from the published
// sum). Scalar fields, selected by index, so that nothing lands in local memory.
struct Seg {
  int t0, t1, pa, pb;
};
struct Plan {
  Seg h{0, 0, 0, 0}, f{0, 0, 0, 0}, t{0, 0, 0, 0};
  __device__ __forceinline__ Seg seg(int i) const { return i == 0 ? h : i == 1 ? f : t; }
};
template <int KS>
__device__ __forceinline__ Plan plan(long long u0, long long u1) {
  Plan p;
  if (u0 >= u1) return p;
  const int tf = (int)(u0 / KS), pf = (int)(u0 % KS), tl = (int)((u1 - 1) / KS), pl = (int)((u1 - 1) % KS) + 1;
  if (tf == tl) {
    p.f = Seg{tf, tf + 1, pf, pl};  // a whole tile-block, a head, a tail, or a middle
    return p;
  }
  if (pl < KS) p.h = Seg{tl, tl + 1, 0, pl};
  p.f = Seg{pf ? tf + 1 : tf, pl == KS ? tl + 1 : tl, 0, KS};
  if (pf) p.t = Seg{tf, tf + 1, pf, KS};
  return p;
}

// A position in a block's units: segment i, tile-block tb, part p, group gi (i = 3: past the end).
template <int NG, int KS>
struct Cursor {
  const Plan* pl;
  int i, tb, p, gi;
  Seg sg;
  static __device__ __forceinline__ int gs(int p) { return (p * NG) / KS; }  // part p's first group
  __device__ __forceinline__ void enter(int j) {
    for (i = j; i < 3; ++i) {
      sg = pl->seg(i);
      if (sg.t1 > sg.t0 && sg.pb > sg.pa) break;
    }
    tb = sg.t0, p = sg.pa, gi = gs(p);
  }
  __device__ __forceinline__ explicit Cursor(const Plan& plan) : pl(&plan) { enter(0); }
  __device__ __forceinline__ bool valid() const { return i < 3; }
  __device__ __forceinline__ bool part_end() const { return gi + 1 == gs(p + 1); }
  __device__ __forceinline__ bool tb_end() const { return part_end() && p + 1 == sg.pb; }
  __device__ __forceinline__ void next() {
    if (++gi < gs(p + 1)) return;
    if (++p < sg.pb) return;
    if (++tb < sg.t1) {
      p = sg.pa, gi = gs(p);
      return;
    }
    enter(i + 1);
  }
};
}  // namespace sk

// NT: n-tiles (8 activation rows), BTG = 8·NT; KS: the parts of K (as gemv_q4: min(8, K/128));
// EPI: EPI_STORE, EPI_ADD or EPI_SWIGLU (version 19; N = the F features of a fused gate_up
// weight of 2F rows: a tile-block is 2·CW gate m-tiles and the 2·CW up m-tiles F/16 tiles
// after them, each warpgroup two of each on the same features; at the store a warpgroup stages
// its sums in shared memory and stores y = bf16(silu(bf16(g)) · bf16(u)), gemv_store_swiglu's
// arithmetic, two features at a time into y in the activation tile order for 8·NT-row tiles of
// an [R, F] matrix (common.cuh act_at), the down projection's input; dynamic smem
// dyn_smem_bytes + swiglu_bytes); CW: consumer warpgroups (64 rows each) sharing each activation
// tile; XS: ring stages; PP: 1 = two register sets, so a unit's wgmmas are waited for only after
// the next unit's are issued (its dequant overlaps them), as wgmma_q4's PP. x is in tile order
// (wgmma_q4's XT = 1).
template <int K, int NT, int KS, int EPI, int CW, int XS, int PP = 0>
__device__ __forceinline__ void wgmma_sk_q4(const uint4* __restrict__ qweight, const bf16* __restrict__ scales,
                                            const bf16* __restrict__ x, int ldx, bf16* y, int ldy, int N, int R,
                                            float* part_buf, int* arrivals) {
  static_assert(K % 128 == 0, "K must be a multiple of 128");
  static_assert(EPI == EPI_STORE || EPI == EPI_ADD || EPI == EPI_SWIGLU,
                "wgmma_sk_q4: store, residual-add or SwiGLU epilogue");
  static_assert(PP == 0 || PP == 1, "wgmma_sk_q4: PP is 0 or 1");
  using L = WgmmaSkLaunch<NT, KS, CW, XS>;
  using Cur = sk::Cursor<K / 128, KS>;
  constexpr int KT = K / 64, NG = K / 128, MT = L::mtiles, C = L::consumers;
  constexpr int XB = L::x_stage_bytes, WB = L::w_stage_bytes;
  extern __shared__ __align__(128) uint4 sk_smem[];  // [XS][x tile], [XS][weights], full[XS], empty[XS]
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const unsigned smem0 = (unsigned)__cvta_generic_to_shared(sk_smem);
  const unsigned wbase = smem0 + XS * XB, full0 = wbase + XS * WB, empty0 = full0 + 8 * XS;
  // EPI_SWIGLU: ms gate m-tiles, as many up m-tiles after them; in tile-block tb warpgroup q's
  // warps 4q, 4q + 1 take gate tiles tb·MT/2 + 2q, + 1, and its warps 4q + 2, 4q + 3 the up
  // tiles ms after them, so a feature's gate and up sums meet within one warpgroup.
  constexpr int HM = MT / 2;
  const int ms = (N + 15) >> 4, tiles = EPI == EPI_SWIGLU ? 2 * ms : ms, TB = (tiles + MT - 1) / MT;
  auto tile_of = [&](int tb, int m) {  // rows past the end read the last tile
    if constexpr (EPI == EPI_SWIGLU)
      return ((m & 2) ? ms : 0) + min(tb * HM + 2 * (m >> 2) + (m & 1), ms - 1);
    else return min(tb * MT + m, tiles - 1);
  };
  const long long U = (long long)TB * KS;
  const sk::Plan pl = sk::plan<KS>(U * blockIdx.x / gridDim.x, U * (blockIdx.x + 1) / gridDim.x);

  if (tid == 0) {
    for (int s = 0; s < XS; ++s) {
      mbar_init(full0 + 8 * s, 33);        // 32 lanes' cp.async + the bulk copy's expect_tx
      mbar_init(empty0 + 8 * s, 4 * CW);   // every consumer warp
    }
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncthreads();
  pdl_launch_dependents();

  if (warp >= 4 * CW) {
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;" ::"n"(L::producer_regs));
    if (warp > 4 * CW) return;
    // ---- the producer warp: units in the plan's order, up to XS ahead of the consumers.
    const char* xsrc = reinterpret_cast<const char*>(x) + (size_t)blockIdx.y * NG * XB;
    auto load_w = [&](int s, const Cur& c) {
      const unsigned d = wbase + s * WB;
#pragma unroll
      for (int m = 0; m < MT; ++m) {
        const int t = tile_of(c.tb, m);
        const uint4* src = qweight + ((size_t)t * KT + 2 * c.gi) * 32 + lane;
        cp_async16_s(d + (m * 66 + lane) * 16, src);
        cp_async16_s(d + (m * 66 + 32 + lane) * 16, src + 32);
      }
      if (lane < 2 * MT) {
        const int m = lane >> 1, t = tile_of(c.tb, m);
        cp_async16_s(d + (m * 66 + 64 + (lane & 1)) * 16,
                     reinterpret_cast<const uint4*>(scales + ((size_t)t * NG + c.gi) * 16) + (lane & 1));
      }
      mbar_arrive_cp(full0 + 8 * s);
    };
    auto load_x = [&](int s, const Cur& c) {
      if (lane == 0) {
        mbar_arrive_tx(full0 + 8 * s, XB);
        bulk_copy_g2s(smem0 + s * XB, xsrc + (size_t)c.gi * XB, XB, full0 + 8 * s);
      }
    };
    Cur cw(pl), cx(pl);
    int k = 0;
    for (; k < XS && cw.valid(); ++k, cw.next()) load_w(k, cw);  // weights: constant, before the wait
    pdl_wait();                                                  // x comes from the previous kernel
    for (int j = 0; j < k; ++j, cx.next()) load_x(j, cx);
    for (; cw.valid(); ++k, cw.next()) {
      const int s = k % XS;
      mbar_wait(empty0 + 8 * s, ((k / XS) - 1) & 1);
      load_w(s, cw);
      load_x(s, cw);
    }
    return;
  }

  // ---- the consumer warpgroups: warp w owns m-tile w of the tile-block.
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;" ::"n"(L::consumer_regs));
  const int g = lane >> 2, c = lane & 3;
  const int r0 = blockIdx.y * (8 * NT);
  const uint64_t desc0 = (uint64_t)((smem0 & 0x3FFFF) >> 4) | (uint64_t)(128 >> 4) << 16 |
                         (uint64_t)(256 >> 4) << 32;
  constexpr int NB = PP ? 2 : 1;
  float acc[NT][4], pt[NB][NT][4], sum[NT][4];
  uint32_t a[NB][8][4], sw[NB];
#pragma unroll
  for (int j = 0; j < NT; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) acc[j][e] = 0.f;
  pdl_wait();  // y (EPI_ADD reads it) and the published sums belong to this launch

  // Unit k: wait for its stage, dequantize into set P, issue its 8 wgmmas.
  auto issue = [&](auto P, int k) {
    constexpr int q = decltype(P)::value;
    const int s = k % XS;
    mbar_wait(full0 + 8 * s, (k / XS) & 1);
    wgmma_slot_a(reinterpret_cast<const uint4*>(reinterpret_cast<const char*>(sk_smem) + XS * XB + s * WB) +
                     warp * 66,
                 lane, a[q], sw[q]);
    uint64_t desc[8];
    wgmma_group_descs<NT, 1>(desc0, s * XB, reinterpret_cast<uint32_t(&)[1][8][4]>(a[q]), desc);
    wgmma_fence();
#pragma unroll
    for (int i = 0; i < 8; ++i) Wgmma<NT>::mma(pt[q], a[q][i], desc[i], i);
    wgmma_commit();
  };
  // Unit k's wgmmas are done: free its stage, scale into acc, close its part and tile-block.
  auto finish = [&](auto P, int k, const Cur& cu) {
    constexpr int q = decltype(P)::value;
    __syncwarp();
    if (lane == 0) mbar_arrive(empty0 + 8 * (k % XS));  // this warp is done with the stage
    wgmma_fence_regs<NT>(pt[q]);
    q4_scale_add<NT>(acc, pt[q], sw[q]);
    if (!cu.part_end()) return;
    float* pub = part_buf + ((size_t)blockIdx.y * TB + cu.tb) * L::pub_floats + tid;
    int* flag = arrivals + (size_t)blockIdx.y * TB + cu.tb;
    if (cu.p == cu.sg.pa && cu.sg.pa > 0) {
      // A tail (or middle): the parts before pa were summed by the previous block, which
      // published them with flag = pa (its head, run first; or its middle, all it had).
      if (tid == 0) {
        int f;
        do {
          asm volatile("ld.acquire.gpu.global.b32 %0, [%1];" : "=r"(f) : "l"(flag) : "memory");
        } while (f != cu.sg.pa);
        if (cu.sg.pb == KS) *flag = 0;  // every launch leaves the flags at 0
      }
      sk::consumers_sync<C>();
#pragma unroll
      for (int j = 0; j < NT; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) sum[j][e] = __ldcg(pub + (j * 4 + e) * C);
    }
    // Part p is done: sum += its acc, in part order from 0.f (gemv_q4's reduction).
#pragma unroll
    for (int j = 0; j < NT; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        sum[j][e] = (cu.p == 0 ? 0.f : sum[j][e]) + acc[j][e];
        acc[j][e] = 0.f;
      }
    if (!cu.tb_end()) return;
    if (cu.sg.pb < KS) {
      // A head: publish the running sum for the block with the rest of this tile-block.
#pragma unroll
      for (int j = 0; j < NT; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) __stcg(pub + (j * 4 + e) * C, sum[j][e]);
      __threadfence();
      sk::consumers_sync<C>();
      if (tid == 0) asm volatile("st.release.gpu.global.b32 [%0], %1;" ::"l"(flag), "r"(cu.sg.pb) : "memory");
    } else if constexpr (EPI == EPI_SWIGLU) {
      // Each warpgroup on its own (named barrier 2 + q): its four warps' sums to shared memory,
      // then its 128 threads store
      // its two gate tiles' features two at a time, consecutive threads on the two m-tiles and
      // then rows (the words of one 16-byte core row of the tile order; eight rows' core rows are
      // contiguous). Value (f, r) of a warp sits at lane 4·(f % 8) + (r % 8) / 2 of
      // v = 4·(r / 8) + 2·(f / 8 % 2) + r % 2.
      constexpr int WS = L::swiglu_stride;
      const int q = warp >> 2;
      float* xv = reinterpret_cast<float*>(reinterpret_cast<char*>(sk_smem) + XS * (XB + WB) + 16 * XS) +
                  4 * q * WS;
#pragma unroll
      for (int v = 0; v < NT * 4; ++v) xv[(warp & 3) * WS + v * 32 + lane] = sum[v >> 2][v & 3];
      asm volatile("bar.sync %0, 128;" ::"r"(2 + q) : "memory");
#pragma unroll 1
      for (int i = tid & 127; i < 2 * 64 * NT; i += 128) {
        const int w = i & 1, fp = (i >> 4) & 7, rr = 8 * (i >> 7) + ((i >> 1) & 7);
        const int f = (cu.tb * HM + 2 * q + w) * 16 + 2 * fp, r = r0 + rr;
        if (f >= N || r >= R) continue;
        const float* g0 = xv + w * WS + (4 * (rr >> 3) + 2 * (fp >> 2) + (rr & 1)) * 32 +
                          4 * ((2 * fp) & 7) + ((rr & 7) >> 1);
        const float* u0 = g0 + 2 * WS;
        *reinterpret_cast<bf162*>(act_at<NT>(y, N, r, f)) =
            __floats2bfloat162_rn(siluf_(round_bf(g0[0])) * round_bf(u0[0]),
                                  siluf_(round_bf(g0[4])) * round_bf(u0[4]));
      }
      asm volatile("bar.sync %0, 128;" ::"r"(2 + q) : "memory");  // xv is written again next store
    } else {
      const int mt = cu.tb * MT + warp;
      gemv_store_all<EPI, NT * 4>(
          y, ldy, N, R,
          [&](int v, int& n, int& r) {
            n = mt * 16 + g + (v % 4 >= 2 ? 8 : 0);
            r = r0 + 8 * (v / 4) + 2 * c + (v & 1);
          },
          [&](int v) { return sum[v / 4][v % 4]; });
    }
  };

  using P0 = Parity<0>;
  using P1 = Parity<PP>;
  Cur ci(pl), cf(pl);  // the unit issued next, the unit finished next
  int k = 0;
  if constexpr (PP == 0) {
    for (; ci.valid(); ++k, ci.next()) {
      issue(P0{}, k);
      wgmma_wait<0>();
      finish(P0{}, k, ci);
    }
  } else {
    // Steady state: issue k+1, wait for k (k+1's wgmmas left in flight), finish k.
    if (!ci.valid()) return;
    issue(P0{}, k);
    ci.next();
    while (ci.valid()) {
      issue(P1{}, k + 1);
      ci.next();
      wgmma_wait<1>();
      finish(P0{}, k, cf);
      cf.next();
      ++k;
      if (!ci.valid()) {
        wgmma_wait<0>();
        finish(P1{}, k, cf);
        return;
      }
      issue(P0{}, k + 1);
      ci.next();
      wgmma_wait<1>();
      finish(P1{}, k, cf);
      cf.next();
      ++k;
    }
    wgmma_wait<0>();
    finish(P0{}, k, cf);
  }
}

}  // namespace q38

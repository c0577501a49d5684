// gemv_cv.cuh: the int4-g128 GEMV of batch tiles of 8 or 16 rows with the scale folded into the
// weight before the MMA (docs/GEMV_MAINLOOP.md §2 "New", step 1 of §5), a loader warp ahead of
// the consumer warps.
//
//   y[r, n] = sum_k Ŵ[n, k] * x[r, k]     Ŵ = bf16_rn(q * s), q = code - 8 (docs/FORMAT.md)
//
//   x  bf16 [R, K]  (row stride ldx; rows, not the tile order)
//   W  uint32 qweight [Np/16, K/64, 32, 4], bf16 scales [Np/16, K/128, 16]
//   y  bf16 [R, N]  (row stride ldy); EPI_STORE writes bf16(acc), EPI_ADD bf16(y + bf16(acc)),
//      gemv_q4's epilogues (y must not alias x)
//
// Arithmetic (the contract; qwen38gen.weights.gemv_cv_reference is its fp64 twin):
//   - per weight Ŵ = fma.rn.bf16x2(q, {s, s}, -0): q exact from q4_pair, one rounding of the exact
//     product q·s to nearest even (adding -0 keeps the sign of a zero product, as numpy's q·s);
//   - the K/128 groups are cut into KS parts as gemv_q4 cuts them (part p = groups
//     [p·NG/KS, (p+1)·NG/KS)); per part one fp32 chain of mma.sync m16n8k16 from 0 over all its
//     k-steps in order, no per-group partial;
//   - y = ((0 + a_0) + a_1) + ... + a_{KS-1} in fp32, in part order; then the epilogue.
// A row's bits depend on K and KS only: not on R, NT, ST, WM, WALK, XP, MI, LB or the grid.
// (AR = 1, below, runs gemv_q4's arithmetic instead: gemv_q4's bits.)
//
// Which scale an A register takes: q4_pair(w, j) packs nibbles j and j+4 of a word, FORMAT.md's
// A elements {a0, a1}, {a2, a3}, {a4, a5}, {a6, a7} for j = 0..3. In the m16n8k16 A fragment
// (PTX ISA, "Matrix fragments for mma.m16n8k16", .bf16) a0, a1, a4, a5 are row groupID and
// a2, a3, a6, a7 row groupID + 8; so registers j = 0, 2 take the scale of row g = lane / 4 and
// j = 1, 3 that of row g + 8 (the two halves of FORMAT.md's scale word for lane t).
//
// Block: WM·KS consumer warps, then one loader warp (warp WM·KS). Consumer warp w = m·KS + p owns
// part p of the block's m-tile slot m (MI > 1: a slot is MI consecutive entries, their chunks of
// a group in one stage). The block walks its m-tiles WM at a time ("rounds"):
//   WALK = 0: block b of G = gridDim.x takes the contiguous m-tiles [b·T/G, (b+1)·T/G);
//   WALK = 1: block b takes m-tiles b, b + G, b + 2G, ...   (T = ceil(N/16) m-tiles)
// Ring: each consumer warp has ST stages of one chunk, a chunk being one (m-tile, group): 1 KiB
// of codes (lane l's 16 B of the group's two k-tiles at [l] and [32 + l]) and the 32 B of the
// group's 16 scales at [64], [65] (66 uint4). The loader fills them by cp.async, 16 B a lane,
// in the consumers' order (round, step s, slot m, part p), across rounds, and signals each stage
// on its `full` mbarrier (cp.async.mbarrier.arrive.noinc, 32 lanes); it waits only on `empty`
// mbarriers, which a consumer warp arrives on (lane 0, after __syncwarp) as soon as it has read
// the stage into registers. The loader never waits for arithmetic; it starts before pdl_wait
// (the weights are constant), the consumers read x (16 contiguous bf16 per lane and k-tile,
// FORMAT.md's column permutation, coherent loads: ld_after_wait16) and y only after it.
// A round ends with one named barrier among the consumers (never the loader): each warp's part
// sums go to shared memory (two buffers, taken in turn by rounds, so one barrier a round
// suffices), then the warps split the round's value slots and add the KS parts in order.
// Deadlock-free: the loader issues every chunk of round i before any of round i + 1, and a
// consumer warp needs nothing from round i + 1 to pass round i's barrier.
//
// Launch: grid = (G, ceil(R / (8·NT))) for any G >= 1, block = GemvCvLaunch::threads, dynamic
//   smem GemvCvLaunch::dyn_smem_bytes (above 48 KiB the caller raises
//   CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES). Entry point: extern "C" __global__
//   __launch_bounds__(GemvCvLaunch::threads) calling gemv_cv. Needs sm_90 (mbarrier
//   try_wait, griddepcontrol). Not in the emitted program yet.
//
// Compiles alone:
//   nvcc -arch=sm_90a -std=c++17 -cubin -Xptxas -v -x cu kernels/gemv_cv.cuh -o /dev/null
#pragma once
#include "gemv_q4.cuh"

namespace q38 {

// NT: n-tiles (8 activation rows) per batch tile; KS: parts of K; ST: ring stages per consumer
// warp; WM: m-tiles a block works on at once (consumer warps = WM·KS).
template <int NT, int KS, int ST, int WM, int MI = 1>
struct GemvCvLaunch {
  static_assert(NT == 1 || NT == 2, "gemv_cv: NT is 1 or 2 (8- or 16-row batch tiles)");
  static_assert(KS >= 1 && KS <= 8, "gemv_cv: 1 <= KS <= 8");
  static_assert(ST >= 2 && ST <= 16, "gemv_cv: 2 <= ST <= 16 ring stages");
  static_assert(WM >= 1, "gemv_cv: WM >= 1");
  static_assert(MI >= 1 && MI <= 4, "gemv_cv: 1 <= MI <= 4 m-tiles per consumer warp");
  static constexpr int consumers = WM * KS;            // consumer warps
  static constexpr int threads = 32 * (consumers + 1);  // + the loader warp
  static_assert(threads <= 1024, "gemv_cv: at most 1024 threads (WM·KS <= 31)");
  static constexpr int values = 4 * NT;                // accumulators per consumer lane
  static constexpr int chunk_bytes = 66 * 16;          // codes of one (m-tile, group) + scales
  static constexpr int stage_bytes = MI * chunk_bytes;  // a stage: the group of MI m-tiles
  static constexpr int ring_bytes = consumers * ST * stage_bytes;
  static constexpr int red_bytes = 2 * consumers * MI * values * 32 * 4;  // part sums, two rounds
  static constexpr int bar_bytes = 2 * consumers * ST * 8;           // full, empty
  static constexpr int dyn_smem_bytes = ring_bytes + red_bytes + bar_bytes;
};

// Two codes of w (nibbles j and j+4) -> bf16x2 {Ŵ, Ŵ}: q4_pair's exact q times the scale pair
// s2, rounded once to nearest even; the -0 addend leaves every product, zeros included, as is.
__device__ __forceinline__ uint32_t cv_pair(uint32_t w, int j, uint32_t s2) {
  const uint32_t q = q4_pair(w, j);
  uint32_t r;
  asm("fma.rn.bf16x2 %0, %1, %2, %3;" : "=r"(r) : "r"(q), "r"(s2), "r"(0x80008000u));
  return r;
}

namespace cv {
// The consumer warps only (named barrier 1; the loader warp never takes part).
template <int THREADS>
__device__ __forceinline__ void consumers_sync() {
  asm volatile("bar.sync 1, %0;" ::"n"(THREADS) : "memory");
}
__device__ __forceinline__ void cp_async_wait_all() { asm volatile("cp.async.wait_all;" ::: "memory"); }
}  // namespace cv

// K: input width (a multiple of 128); NT, KS, ST, WM: GemvCvLaunch; EPI: EPI_STORE or EPI_ADD;
// WALK: 0 = contiguous m-tile ranges per block, 1 = grid-stride; XP: 0 = each group's x issued
// just before its stage wait, 1 = the next group's x loaded while this one multiplies (a second
// register set; version 31 on the H100: slower at every shape, 56 -> 78 registers at NT = 1 and
// 77 -> 128 at NT = 2 cost more residency than the hidden L2 round trip gave; kept as a schedule).
// NT, ST, WM, WALK, XP and the grid change only the schedule: a row's result is bitwise the same
// for every choice of them (KS changes the sum order). MI: m-tiles per consumer warp (version 31):
// the warp runs MI independent chains (one per m-tile, each still one chain per part), their
// MMAs interleaved, and shares each group's x among them; a block covers WM·MI m-tiles a round.
// LB: 0 = the loader's 32 lanes copy a chunk by cp.async, 16 B each (3 instructions and their
// addresses per lane and chunk, then one arrival each on `full`); 1 = lane 0 alone, by the
// bulk-copy engine: a chunk's 1 KiB of codes and 32 B of scales are contiguous in global memory
// (FORMAT.md), so it is two cp.async.bulk counted on `full` as transaction bytes (version 32).
// Schedule only, like the others.
// AR: the arithmetic. 0 = the contract above (Ŵ, one chain per part); 1 = gemv_q4's (per group
// an unscaled partial from zero by q4_kstep, then acc += scale · partial by q4_scale_add; parts
// cut and added as gemv_q4 adds them), so that y is bitwise gemv_q4's at the same K and KS: the
// loader-and-consumers structure measured apart from the contract (version 32).
template <int K, int NT, int KS, int EPI, int ST = 4, int WM = 1, int WALK = 0, int XP = 0,
          int MI = 1, int LB = 0, int AR = 0>
__device__ __forceinline__ void gemv_cv(const uint4* __restrict__ qweight, const bf16* __restrict__ scales,
                                        const bf16* __restrict__ x, int ldx, bf16* y, int ldy, int N, int R) {
  static_assert(K % 128 == 0, "K must be a multiple of 128");
  static_assert(KS <= K / 128, "gemv_cv: KS <= K/128 (every part has a group)");
  static_assert(EPI == EPI_STORE || EPI == EPI_ADD, "gemv_cv: store or residual-add epilogue");
  static_assert(WALK == 0 || WALK == 1, "gemv_cv: WALK is 0 (ranges) or 1 (grid-stride)");
  static_assert(XP == 0 || XP == 1, "gemv_cv: XP is 0 or 1 (x of the next group in flight)");
  static_assert(LB == 0 || LB == 1, "gemv_cv: LB is 0 (cp.async by 32 lanes) or 1 (bulk copies)");
  static_assert(AR == 0 || AR == 1, "gemv_cv: AR is 0 (the Ŵ contract) or 1 (gemv_q4's arithmetic)");
  static_assert(XP == 0 || NT == 1 || WM * KS <= 8,
                "gemv_cv: XP = 1 at NT = 2 needs at most 8 consumer warps (plan.gemv.gemv_cv_xp)");
  using L = GemvCvLaunch<NT, KS, ST, WM, MI>;
  constexpr int KT = K / 64, NG = K / 128, C = L::consumers, V = L::values;
  constexpr int CB = L::chunk_bytes, SB = L::stage_bytes;
  constexpr int PL = (NG + KS - 1) / KS;  // groups of the longest part
  extern __shared__ __align__(16) uint4 cv_smem[];  // [C][ST] chunks, red[2][C][V][32], full, empty
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const unsigned ring0 = (unsigned)__cvta_generic_to_shared(cv_smem);
  const unsigned full0 = ring0 + L::ring_bytes + L::red_bytes, empty0 = full0 + 8 * C * ST;
  float* red = reinterpret_cast<float*>(reinterpret_cast<char*>(cv_smem) + L::ring_bytes);

  // This block's m-tiles: entry e < count is m-tile first + e·stride.
  const int T = (N + 15) >> 4, G = gridDim.x, b = blockIdx.x;
  int first, count, stride;
  if constexpr (WALK == 0) {
    first = (int)((long long)b * T / G);
    count = (int)((long long)(b + 1) * T / G) - first;
    stride = 1;
  } else {
    first = b;
    count = b < T ? (T - 1 - b) / G + 1 : 0;
    stride = G;
  }
  const int rounds = (count + WM * MI - 1) / (WM * MI);

  if (tid == 0) {
    for (int i = 0; i < C * ST; ++i) {
      // LB = 0: the loader's 32 lanes, each when its copies have landed; LB = 1: lane 0's
      // expect_tx (the bytes complete the phase)
      mbar_init(full0 + 8 * i, LB ? 1 : 32);
      mbar_init(empty0 + 8 * i, 1);  // lane 0 of the stage's consumer warp
    }
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncthreads();
  pdl_launch_dependents();

  if (warp == C) {
    // ---- the loader: chunk k of consumer warp w (k counted per warp) goes to stage k % ST,
    // phase k / ST. Weights and scales only, constant: no pdl_wait.
    if (LB && lane != 0) return;
#pragma unroll 1
    for (int i = 0; i < rounds; ++i) {
#pragma unroll 1
      for (int s = 0; s < PL; ++s) {
#pragma unroll
        for (int m = 0; m < WM; ++m) {
          const int e0 = (i * WM + m) * MI;   // the slot's first entry; its MI m-tiles follow
          if (e0 >= count) break;
#pragma unroll
          for (int p = 0; p < KS; ++p) {
            const int gb = (p * NG) / KS, len = ((p + 1) * NG) / KS - gb;
            if (s < len) {
              const int w = m * KS + p, k = i * len + s, st = k % ST;
              const unsigned stage = ring0 + (w * ST + st) * SB, bar = w * ST + st;
              if (k >= ST) mbar_wait(empty0 + 8 * bar, ((k / ST) - 1) & 1);
              if constexpr (LB) {
                const int nm = count - e0 < MI ? count - e0 : MI;   // the slot's m-tiles
                mbar_arrive_tx(full0 + 8 * bar, nm * (1024 + 32));
#pragma unroll
                for (int j = 0; j < MI; ++j) {
                  if (j >= nm) break;
                  const int t = first + (e0 + j) * stride;
                  const unsigned slot = stage + j * CB;
                  bulk_copy_g2s(slot, qweight + ((size_t)t * KT + 2 * (gb + s)) * 32, 1024, full0 + 8 * bar);
                  bulk_copy_g2s(slot + 64 * 16, scales + ((size_t)t * NG + gb + s) * 16, 32, full0 + 8 * bar);
                }
                continue;
              }
#pragma unroll
              for (int j = 0; j < MI; ++j) {
                if (e0 + j >= count) break;
                const int t = first + (e0 + j) * stride;
                const unsigned slot = stage + j * CB;
                const uint4* src = qweight + ((size_t)t * KT + 2 * (gb + s)) * 32 + lane;
                cp_async16_s(slot + lane * 16, src);
                cp_async16_s(slot + (32 + lane) * 16, src + 32);
                if (lane < 2)
                  cp_async16_s(slot + (64 + lane) * 16,
                               reinterpret_cast<const uint4*>(scales + ((size_t)t * NG + gb + s) * 16) + lane);
              }
              mbar_arrive_cp(full0 + 8 * bar);
            }
          }
        }
      }
    }
    // no copy outlives its thread (LB = 1: the consumers wait for every byte on `full`)
    if constexpr (!LB) cv::cp_async_wait_all();
    return;
  }

  // ---- the consumers: warp w = m·KS + p, part p = groups [gb, gb + len) of slot m's m-tile.
  const int m = warp / KS, p = warp % KS;
  const int gb = (p * NG) / KS, len = ((p + 1) * NG) / KS - gb;
  const int g = lane >> 2, c = lane & 3;
  const int r0 = blockIdx.y * (8 * NT);
  // Activation row of each n-tile for this lane (n = g), clamped: rows >= R read row R - 1 and
  // are never stored.
  const bf16* xrow[NT];
#pragma unroll
  for (int j = 0; j < NT; ++j) {
    const int r = r0 + 8 * j + g;
    xrow[j] = x + (size_t)(r < R ? r : R - 1) * ldx + 16 * c;
  }
  // Group gi's activations of this lane: 16 contiguous bf16 per n-tile and k-tile.
  auto load_x = [&](int gi, uint4 (&xv)[NT][2][2]) {
#pragma unroll
    for (int j = 0; j < NT; ++j)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const uint4* px = reinterpret_cast<const uint4*>(xrow[j] + (2 * gi + h) * 64);
        xv[j][h][0] = ld_after_wait16(px);
        xv[j][h][1] = ld_after_wait16(px + 1);
      }
  };
  pdl_wait();  // x (and y, EPI_ADD) come from the previous kernel

#pragma unroll 1
  for (int i = 0; i < rounds; ++i) {
    float* rb = red + (size_t)(i & 1) * C * MI * V * 32;
    if ((i * WM + m) * MI < count) {
      // acc[u]: m-tile u of the slot (an entry past count computes on a stale stage, unstored)
      float acc[MI][NT][4];
#pragma unroll
      for (int u = 0; u < MI; ++u)
#pragma unroll
        for (int j = 0; j < NT; ++j)
#pragma unroll
          for (int e = 0; e < 4; ++e) acc[u][j][e] = 0.f;
      uint4 xv[NT][2][2], xn[NT][2][2];
      if constexpr (XP) load_x(gb, xn);
#pragma unroll 1
      for (int s = 0; s < len; ++s) {
        const int k = i * len + s, st = k % ST, gi = gb + s;
        if constexpr (XP) {   // this group's x arrived during the last one; the next one's starts
#pragma unroll
          for (int j = 0; j < NT; ++j)
#pragma unroll
            for (int h = 0; h < 2; ++h) xv[j][h][0] = xn[j][h][0], xv[j][h][1] = xn[j][h][1];
          if (s + 1 < len) load_x(gi + 1, xn);
        } else {
          load_x(gi, xv);     // issued before the stage's wait, so it loads while that waits
        }
        const int bar = warp * ST + st;
        mbar_wait(full0 + 8 * bar, (k / ST) & 1);
        uint4 w0[MI], w1[MI];
        uint32_t s_lo[MI], s_hi[MI], sws[MI];
#pragma unroll
        for (int u = 0; u < MI; ++u) {
          const uint4* slot = cv_smem + ((size_t)bar * SB + u * CB) / 16;
          w0[u] = slot[lane];
          w1[u] = slot[32 + lane];
          const unsigned short* sp = reinterpret_cast<const unsigned short*>(slot + 64);
          const uint32_t sw = (uint32_t)sp[g] | ((uint32_t)sp[g + 8] << 16);
          sws[u] = sw;
          // Scale pairs {s_g, s_g} (registers 0, 2) and {s_g+8, s_g+8} (registers 1, 3).
          s_lo[u] = __byte_perm(sw, 0, 0x1010);
          s_hi[u] = __byte_perm(sw, 0, 0x3232);
        }
        __syncwarp();
        if (lane == 0) mbar_arrive(empty0 + 8 * bar);  // the stage is in registers: the loader may refill it
        if constexpr (AR) {   // gemv_q4's group: a partial from zero, then acc += scale · partial
          float part[MI][NT][4];
#pragma unroll
          for (int u = 0; u < MI; ++u)
#pragma unroll
            for (int j = 0; j < NT; ++j)
#pragma unroll
              for (int e = 0; e < 4; ++e) part[u][j][e] = 0.f;
#pragma unroll
          for (int h = 0; h < 2; ++h)
#pragma unroll
            for (int kk = 0; kk < 4; ++kk) {
              uint32_t b0[NT], b1[NT];
#pragma unroll
              for (int j = 0; j < NT; ++j) {
                const uint4& v = xv[j][h][kk >> 1];
                b0[j] = (kk & 1) ? v.z : v.x, b1[j] = (kk & 1) ? v.w : v.y;
              }
#pragma unroll
              for (int u = 0; u < MI; ++u) {
                const uint4& wv = h ? w1[u] : w0[u];
                q4_kstep<NT>(part[u], kk == 0 ? wv.x : kk == 1 ? wv.y : kk == 2 ? wv.z : wv.w, b0, b1);
              }
            }
#pragma unroll
          for (int u = 0; u < MI; ++u) q4_scale_add<NT>(acc[u], part[u], sws[u]);
        } else {
#pragma unroll
          for (int h = 0; h < 2; ++h)
#pragma unroll
            for (int kk = 0; kk < 4; ++kk)    // k-step kk of k-tile h, each m-tile's chain in turn
#pragma unroll
              for (int u = 0; u < MI; ++u) {
                const uint4& wv = h ? w1[u] : w0[u];
                const uint32_t wi = kk == 0 ? wv.x : kk == 1 ? wv.y : kk == 2 ? wv.z : wv.w;
                const uint32_t a[4] = {cv_pair(wi, 0, s_lo[u]), cv_pair(wi, 1, s_hi[u]),
                                       cv_pair(wi, 2, s_lo[u]), cv_pair(wi, 3, s_hi[u])};
#pragma unroll
                for (int j = 0; j < NT; ++j) {
                  const uint4& v = xv[j][h][kk >> 1];
                  mma_bf16_16816(acc[u][j], a, (kk & 1) ? v.z : v.x, (kk & 1) ? v.w : v.y);
                }
              }
        }
      }
#pragma unroll
      for (int u = 0; u < MI; ++u)
#pragma unroll
        for (int j = 0; j < NT; ++j)
#pragma unroll
          for (int e = 0; e < 4; ++e)
            rb[((warp * MI + u) * V + 4 * j + e) * 32 + lane] = acc[u][j][e];
    }
    cv::consumers_sync<32 * C>();
    // The round's value slots (m', v), WM·MI·V of them, over the C warps; each lane adds its KS
    // parts in order from 0.f and stores (gemv_store: gemv_q4's epilogue arithmetic).
#pragma unroll 1
    for (int idx = warp; idx < WM * MI * V; idx += C) {
      const int mm = idx / V, v = idx % V, e = i * WM * MI + mm;
      if (e >= count) continue;
      const int ms = mm / MI, u = mm % MI;   // slot ms's m-tile u
      float sum = 0.f;
#pragma unroll
      for (int q = 0; q < KS; ++q) sum += rb[(((ms * KS + q) * MI + u) * V + v) * 32 + lane];
      int n, r;
      gemv_out_index(v, NT, lane, first + e * stride, r0, n, r);
      gemv_store<EPI>(y, ldy, n, r, N, R, sum);
    }
  }
}

}  // namespace q38

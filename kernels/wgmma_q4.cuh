// wgmma_q4.cuh: the batched int4-g128 GEMV of gemv_q4.cuh on Hopper's warpgroup MMA (sm_90a).
//
//   y[r, n] = sum_k W~[n, k] * x[r, k]          same operands, layouts and epilogues as gemv_q4
//
// gemv_q4 and gemm_q4 feed mma.sync.m16n8k16 one warp and one 8-row n-tile at a time: at 32-64
// activation rows that is 4-8 mma per dequantized A fragment, ~26 cycles per mma per SM
// sub-partition (docs/PERFORMANCE.md, version 3). Here the four warps of a warpgroup own 64 output
// rows (one m-tile each) and one wgmma.m64nNk16 instruction multiplies their A fragments, in
// registers, by the whole activation tile (N = 8*NT rows), read by the tensor cores from shared
// memory (NT = 1, 2, 3, 4 or 8: the 8- to 64-row tiles, 24 rows since version 16). WG warpgroups
// of a block own different rows and share that tile.
//
// The arithmetic is gemv_q4's: the K/128 groups cut into the same KS parts; within a part, per
// group, 8 k-steps into an unscaled partial that starts at zero (scale-d = 0 on the first),
// then acc += scale * partial in fp32; the parts summed in part order from 0.f. Each k-step
// pairs the same 16 weights with the same 16 activations as gemv_q4's mma (FORMAT.md's column
// permutation), so the rows are gemv_q4's bits as long as the tensor cores add a k-step the same
// way for wgmma as for mma.sync (tests/gpu/test_gemv_q4.py checks it on the device).
//
// The activation tile of a group in shared memory: the B operand of 8 k-steps, each NT core-
// matrix blocks (8 activation rows) x 2 halves (k 0-7, 8-15 of the step) x 128 bytes (8 rows x
// 16 bytes), no swizzle, K-major: leading byte offset (the next 8 k) 128, stride byte offset (the
// next 8 rows) 256. Word c of a core-matrix row holds activations 16c + 4i + {0,1} (half 0) or
// {2,3} (half 1) of k-tile h for k-step 4h + i: four 16-byte loads of a row, 32 bytes apart,
// transpose in registers into four 16-byte core-matrix rows. The tile is double-buffered: group
// g+1's is stored (from registers loaded a group earlier) while group g's is multiplied.
// Each group's weights and scales go to an XS-stage ring (cp.async 16, as gemm_q4), and
// the A fragments are dequantized from there into registers; a group's wgmmas are waited for
// before the next group is dequantized (writing a later wgmma's registers while one is in flight
// makes ptxas serialize them, C7513). MW = 2 gives each warpgroup two independent accumulator
// chains over one activation tile; other blocks on the SM fill the tensor pipe too.
//
// XT = 1: x is given in tile order (docs/FORMAT.md "Activation tiles", written so by the norm or
// SwiGLU that produces it: xtile_store in common.cuh): tile (blockIdx.y, g) is the group's
// x_stage_bytes, contiguous, and is copied by cp.async into the weight ring's stage with the
// group's weights, XS - 1 groups ahead, with no registers, transpose or shared stores. On the
// H200 that took the 64-row in projections from 49 to 31 us (docs/PERFORMANCE.md, version 7).
//
// PP = 1 (with XT = 1): two register sets (A fragments, scales, partials) used by alternate
// groups, so group g's wgmmas are waited for (wait_group 1) only after group g+1's are issued;
// the ring then copies XS - 2 groups ahead, since group g-1's wgmmas may still read their stage.
// Written as a steady-state loop over two compile-time sets, ptxas keeps the wgmmas async (no
// C751x serialization). It wins for the 32-row in projections (docs/PERFORMANCE.md, version 7).
// Where a launch has many blocks (gate_up, the lm_head, split-K down projections), one warpgroup
// per block with two or three ring stages at three or four blocks per SM (MB) does better: more
// independent per-group chains per SM (version 8).
//
// ZS > 1: grid.z = ZS blocks share a row block and split the KS parts, as gemm_q4 (the `part`
// scratch and the `arrivals` counters, merged in part order by the last block to arrive).
//
// Launch: grid = (ceil(ceil(N/16) / (4*WG*MW)), ceil(R / (8*NT)), ZS), block = 128*WG, dynamic
//   smem WgmmaLaunch::dyn_smem_bytes (above 48 KiB the caller raises the limit). ZS > 1: `part`
//   holds WgmmaLaunch::part_floats * grid.x * grid.y floats, `arrivals` grid.x * grid.y zeroed
//   ints. Entry point: extern "C" __global__ __launch_bounds__(128*WG, MB) calling wgmma_q4.
//
// Compiles alone:
//   nvcc -arch=sm_90a -std=c++17 -cubin -Xptxas -v -x cu kernels/wgmma_q4.cuh -o /dev/null
#pragma once
#include "gemm_q4.cuh"

namespace q38 {

template <int NT, int KS, int WG, int MW, int XS, int ZS = 1, int XT = 0, int PP = 0>
struct WgmmaLaunch {
  static_assert(WG >= 1 && WG <= 4, "wgmma_q4: 1 to 4 warpgroups per block");
  static_assert(MW >= 1 && MW <= 2, "wgmma_q4: 1 or 2 row blocks per warpgroup");
  static_assert(XS >= 2 && XS <= 8, "wgmma_q4: 2 <= XS <= 8 ring stages");
  static_assert(ZS >= 1 && KS % ZS == 0, "wgmma_q4: ZS must divide KS");
  static_assert(XT == 0 || XT == 1, "wgmma_q4: XT is 0 or 1");
  static_assert(PP == 0 || (PP == 1 && XT == 1 && XS >= 3), "wgmma_q4: PP = 1 needs XT = 1, XS >= 3");
  static constexpr int x_slots = XT ? XS : 2;                   // activation tiles in smem
  static constexpr int threads = 128 * WG;
  static constexpr int rows_per_block = 64 * WG * MW;
  static constexpr int btg = 8 * NT;
  static constexpr int w_stage_bytes = 4 * WG * MW * 66 * 16;   // per warp and block: 64 uint4, 2 of scales
  static constexpr int x_stage_bytes = 8 * NT * 256;            // 8 k-steps x NT blocks x 2 x 128 B
  static constexpr int x_units = 32 * NT;                       // (row, k-tile, half) of a group
  static constexpr int x_per_thread = (x_units + threads - 1) / threads;
  static constexpr int values = MW * NT * 4;                    // accumulators per thread
  static constexpr int sum_bytes = KS > 1 && ZS == 1 ? threads * values * 4 : 0;
  static constexpr int part_floats = KS * threads * values;     // per row block (ZS > 1)
  static constexpr int dyn_smem_bytes = XS * w_stage_bytes + x_slots * x_stage_bytes + sum_bytes;
};

// One wgmma.m64nNk16 (N = 8*NT), bf16 x bf16 -> fp32, A from registers (this warp's m16k16
// fragment, mma.sync's layout), B from shared memory (desc); acc = 0: d = A*B, else d += A*B.
// d[j][e] is the mma.sync C fragment of n-tile j.
template <int NT>
struct Wgmma;
template <>
struct Wgmma<1> {
  static __device__ __forceinline__ void mma(float (&d)[1][4], const uint32_t (&a)[4], uint64_t desc, int acc) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %9, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n8k16.f32.bf16.bf16 {%0,%1,%2,%3}, {%4,%5,%6,%7}, %8, p, 1, 1, 0;\n}\n"
        : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "r"(acc));
  }
};
template <>
struct Wgmma<2> {
  static __device__ __forceinline__ void mma(float (&d)[2][4], const uint32_t (&a)[4], uint64_t desc, int acc) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %13, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n16k16.f32.bf16.bf16 {%0,%1,%2,%3,%4,%5,%6,%7}, {%8,%9,%10,%11}, %12, p, 1, 1, 0;\n}\n"
        : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]), "+f"(d[1][3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "r"(acc));
  }
};
template <>
struct Wgmma<3> {
  static __device__ __forceinline__ void mma(float (&d)[3][4], const uint32_t (&a)[4], uint64_t desc, int acc) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %17, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n24k16.f32.bf16.bf16 {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11}, {%12,%13,%14,%15}, %16, p, 1, 1, 0;\n}\n"
        : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]), "+f"(d[1][3]), "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "r"(acc));
  }
};
template <>
struct Wgmma<4> {
  static __device__ __forceinline__ void mma(float (&d)[4][4], const uint32_t (&a)[4], uint64_t desc, int acc) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %21, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15}, {%16,%17,%18,%19}, %20, p, 1, 1, 0;\n}\n"
        : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]), "+f"(d[1][3]), "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]), "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "r"(acc));
  }
};
template <>
struct Wgmma<8> {
  static __device__ __forceinline__ void mma(float (&d)[8][4], const uint32_t (&a)[4], uint64_t desc, int acc) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31}, {%32,%33,%34,%35}, %36, p, 1, 1, 0;\n}\n"
        : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]), "+f"(d[1][3]), "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]), "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]), "+f"(d[4][0]), "+f"(d[4][1]), "+f"(d[4][2]), "+f"(d[4][3]), "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]), "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]), "+f"(d[7][0]), "+f"(d[7][1]), "+f"(d[7][2]), "+f"(d[7][3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "r"(acc));
  }
};

// A register set chosen at compile time (PP = 1 alternates two).
template <int P>
struct Parity {
  static constexpr int value = P;
};

__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory"); }
template <int N>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(N) : "memory");
}
// The accumulators are written asynchronously: after wgmma_wait, this keeps the compiler from
// moving their reads above it.
template <int NT>
__device__ __forceinline__ void wgmma_fence_regs(float (&d)[NT][4]) {
#pragma unroll
  for (int j = 0; j < NT; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) asm volatile("" : "+f"(d[j][e])::"memory");
}
// One warp's A fragments of its m-tile for one group (wgmma_q4, wgmma_sk_q4), dequantized from
// its ring slot: 64 uint4 of codes (lane l's 16 bytes of k-tile h at [32h + l]) then 2 uint4 of
// the m-tile's 16 bf16 scales. wgmma_slot_codes unpacks the codes (scripts/wgmma_rate.cuh
// measures it alone); wgmma_slot_a also gives sw the scales of rows g and g+8, packed.
__device__ __forceinline__ void wgmma_slot_codes(const uint4* slot, int lane, uint32_t (&a)[8][4]) {
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const uint4 wv = slot[32 * h + lane];
    const uint32_t wi[4] = {wv.x, wv.y, wv.z, wv.w};
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
      for (int j = 0; j < 4; ++j) a[4 * h + i][j] = q4_pair(wi[i], j);
  }
}
__device__ __forceinline__ void wgmma_slot_a(const uint4* slot, int lane, uint32_t (&a)[8][4], uint32_t& sw) {
  wgmma_slot_codes(slot, lane, a);
  const unsigned short* sp = reinterpret_cast<const unsigned short*>(slot + 64);
  const int g = lane >> 2;
  sw = (uint32_t)sp[g] | ((uint32_t)sp[g + 8] << 16);
}
// The 8 k-step descriptors of a group's activation tile, `off` bytes into the shared window
// desc0 describes, and a pin that has every input of the group's wgmmas (the descriptors, the MW
// sets of A fragments) defined before they start (wgmma_q4, wgmma_sk_q4).
template <int NT, int MW>
__device__ __forceinline__ void wgmma_group_descs(uint64_t desc0, int off, uint32_t (&a)[MW][8][4],
                                                  uint64_t (&desc)[8]) {
#pragma unroll
  for (int k = 0; k < 8; ++k) {
    desc[k] = desc0 + (uint64_t)((off + k * NT * 256) >> 4);
    asm volatile("" : "+l"(desc[k]));
#pragma unroll
    for (int b = 0; b < MW; ++b)
#pragma unroll
      for (int j = 0; j < 4; ++j) asm volatile("" : "+r"(a[b][k][j]));
  }
}
// Writes to shared memory by the generic proxy (cp.async) made visible to the tensor cores.
__device__ __forceinline__ void fence_proxy_async() { asm volatile("fence.proxy.async.shared::cta;" ::: "memory"); }
// NT: n-tiles (8 activation rows), BTG = 8*NT; KS: the parts of K (as gemv_q4: min(8, K/128));
// EPI: GemvEpilogue; WG: warpgroups per block, on different rows; MW: 64-row blocks per
// warpgroup (independent accumulator chains, one activation tile); XS: ring stages (XS-1 groups
// copied ahead of the one multiplied); ZS: blocks splitting the parts of K (grid.z); XT: x in
// tile order; PP: two register sets in flight.
template <int K, int NT, int KS, int EPI, int WG, int MW, int XS, int ZS = 1, int XT = 0, int PP = 0>
__device__ __forceinline__ void wgmma_q4(const uint4* __restrict__ qweight, const bf16* __restrict__ scales,
                                         const bf16* __restrict__ x, int ldx, bf16* y, int ldy, int N, int R,
                                         float* part_buf = nullptr, int* arrivals = nullptr) {
  static_assert(K % 128 == 0, "K must be a multiple of 128");
  using L = WgmmaLaunch<NT, KS, WG, MW, XS, ZS, XT, PP>;
  constexpr int KT = K / 64, NG = K / 128, V = L::values, T = L::threads;
  // D: groups copied ahead. PP = 1 keeps one more stage untouched: group g-1's wgmmas may still
  // read its activation tile while group g+1 is issued.
  constexpr int SB = L::w_stage_bytes, XB = L::x_stage_bytes, D = XS - 1 - PP;
  constexpr int XO = XS * SB;  // the activation tiles (x_slots) follow the weight ring
  extern __shared__ __align__(128) uint4 wgmma_smem[];  // [XS][weights], [x_slots][x tile], sums
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, c = lane & 3;
  const int tiles = (N + 15) >> 4;
  // This warp's m-tiles: tile q = warp % 4 of each of its warpgroup's MW 64-row blocks.
  const int mt0 = ((blockIdx.x * WG + (warp >> 2)) * MW) * 4 + (warp & 3);
  const int r0 = blockIdx.y * (8 * NT);
  const unsigned smem0 = (unsigned)__cvta_generic_to_shared(wgmma_smem);

  // This warp's weights and scales of group gi into stage s (constant data: safe before
  // pdl_wait). Rows past N read the last tile: every warp of a warpgroup takes part in its wgmma.
  const uint4* wsrc[MW];
  const unsigned short* ssrc[MW];
#pragma unroll
  for (int b = 0; b < MW; ++b) {
    const int t = min(mt0 + 4 * b, tiles - 1);
    wsrc[b] = qweight + (size_t)t * KT * 32 + lane;
    ssrc[b] = reinterpret_cast<const unsigned short*>(scales) + (size_t)t * NG * 16 + 8 * (lane & 1);
  }
  const unsigned wdst = (warp * MW * 66 + lane) * 16;
  auto load_w = [&](int s, int gi) {
    const unsigned d = smem0 + s * SB + wdst;
#pragma unroll
    for (int b = 0; b < MW; ++b) {
      cp_async16_s(d + b * 66 * 16, wsrc[b] + gi * 64);
      cp_async16_s(d + (b * 66 + 32) * 16, wsrc[b] + gi * 64 + 32);
      if (lane < 2) cp_async16_s(d + (b * 66 + 64) * 16, ssrc[b] + gi * 16);  // slots 64, 65: scales
    }
  };
  // XT = 1: x is already in tile order (weights.tile_activations: tile (blockIdx.y, gi) is XB
  // contiguous bytes), and a group's tile is copied into its ring stage with its weights.
  auto load_xt = [&](int s, int gi) {
    const char* src = reinterpret_cast<const char*>(x) + ((size_t)blockIdx.y * NG + gi) * XB;
    const unsigned d = smem0 + XO + s * XB;
#pragma unroll
    for (int i = tid; i < XB / 16; i += T) cp_async16_s(d + 16 * i, src + 16 * i);
  };
  // The activation tile of a group, in two steps a group apart: load_x reads this thread's units
  // (row n, k-tile h, half ih: the 16 bytes at 32j + 16ih of the row's 128-byte k-tile, j = 0..3)
  // into registers; store_x writes them as 4 core-matrix rows, row t (t = 0..3) holding word t
  // of each of the 4 loads: k-step 4h + 2ih + t/2, half t%2. Unit u of a group: n8 = u % 8,
  // ih = u / 8 % 2, nb = u / 16 % NT, h = u / (16 NT); 8 lanes store the 8 rows of one core
  // matrix, so the 16-byte stores meet no bank conflict.
  constexpr int XP = L::x_per_thread;
  int xoff[XP];       // byte offset of unit i in the row block of x, -1 past the units
  unsigned xdst[XP];  // its first core row in a tile
#pragma unroll
  for (int i = 0; i < XP; ++i) {
    const int u = tid + i * T, n8 = u & 7, ih = (u >> 3) & 1, nb = (u >> 4) % NT, h = u / (16 * NT);
    const int row = min(r0 + 8 * nb + n8, R - 1);
    xoff[i] = u < L::x_units ? row * ldx * 2 + h * 128 + ih * 16 : -1;
    xdst[i] = ((4 * h + 2 * ih) * NT + nb) * 256 + n8 * 16;
  }
  uint4 xr[XP][4];
  auto load_x = [&](int gi) {
    const char* src = reinterpret_cast<const char*>(x) + gi * 256;
#pragma unroll
    for (int i = 0; i < XP; ++i)
      if (xoff[i] >= 0)
#pragma unroll
        for (int j = 0; j < 4; ++j) xr[i][j] = ld_after_wait16(src + xoff[i] + 32 * j);
  };
  auto store_x = [&](int slot) {
    char* t = reinterpret_cast<char*>(wgmma_smem) + XO + slot * XB;
#pragma unroll
    for (int i = 0; i < XP; ++i)
      if (xoff[i] >= 0) {
        uint4* d = reinterpret_cast<uint4*>(t + xdst[i]);
        d[0] = make_uint4(xr[i][0].x, xr[i][1].x, xr[i][2].x, xr[i][3].x);                 // t = 0
        d[8] = make_uint4(xr[i][0].y, xr[i][1].y, xr[i][2].y, xr[i][3].y);                 // t = 1 (+128 B)
        d[NT * 16] = make_uint4(xr[i][0].z, xr[i][1].z, xr[i][2].z, xr[i][3].z);           // t = 2
        d[NT * 16 + 8] = make_uint4(xr[i][0].w, xr[i][1].w, xr[i][2].w, xr[i][3].w);       // t = 3
      }
  };

  // This block's parts [pa, pb) and their groups [gb, ge).
  const int pa = (int)blockIdx.z * (KS / ZS), pb = pa + KS / ZS;
  const int gb = (pa * NG) / KS, ge = (pb * NG) / KS;
  pdl_launch_dependents();
#pragma unroll
  for (int s = 0; s < D; ++s)
    if (gb + s < ge) load_w(s, gb + s);
  if constexpr (XT) {
    pdl_wait();  // x comes from the previous kernel
#pragma unroll
    for (int s = 0; s < D; ++s) {
      if (gb + s < ge) load_xt(s, gb + s);
      cp_async_commit();  // D commit groups, even with fewer groups
    }
  } else {
#pragma unroll
    for (int s = 0; s < D; ++s) cp_async_commit();  // D commit groups, even with fewer groups
    pdl_wait();  // x comes from the previous kernel
    load_x(gb);
    store_x(0);
    if (gb + 1 < ge) load_x(gb + 1);
  }

  // PP = 1: two register sets of A fragments, scales and partials, used by alternate groups, so
  // group g's wgmmas are waited for only after group g+1's are issued: the barrier and the
  // dequant of g+1 overlap g's wgmmas, g's scaling overlaps g+1's. The sets only rename.
  constexpr int NX = L::x_slots, NB = PP ? 2 : 1;
  float acc[MW][NT][4], pt[NB][MW][NT][4];
  uint32_t a[NB][MW][8][4], sw[NB][MW];
  q4_zero<MW, NT>(acc);
#pragma unroll
  for (int p = 0; p < NB; ++p) q4_zero<MW, NT>(pt[p]);
  float* sums = reinterpret_cast<float*>(reinterpret_cast<char*>(wgmma_smem) + XO + NX * XB) + tid;
  int part = pa, part_end = ((pa + 1) * NG) / KS;
  const size_t blk = (size_t)blockIdx.y * gridDim.x + blockIdx.x;
  auto pslot = [&](int p) { return part_buf + ((size_t)p * gridDim.x * gridDim.y + blk) * (T * V) + tid; };
  const uint64_t desc0 = (uint64_t)(((smem0 + XO) & 0x3FFFF) >> 4) | (uint64_t)(128 >> 4) << 16 |
                         (uint64_t)(256 >> 4) << 32;

  int s_use = 0, s_fill = D;  // the stage multiplied / refilled
  // Group gi: wait for its weights and activation tile, refill the ring, stage the next tile
  // (XT = 0), dequantize, issue its 8 wgmmas.
  auto issue = [&](auto P, int gi) {
    constexpr int p = decltype(P)::value;
    cp_async_wait<D - 1>();  // group gi's weights (this thread's copies) have landed
    fence_proxy_async();     // this thread's activation stores visible to the tensor cores
    __syncthreads();         // ... everyone's, and group gi's activation tile; the weight stage of
                             // group gi+D-XS (gi-1, or gi-2 with PP = 1) is free, and so is
                             // its activation tile (its wgmmas were waited for before this
                             // barrier)
    if (gi + D < ge) {
      load_w(s_fill, gi + D);
      if constexpr (XT) load_xt(s_fill, gi + D);
    }
    cp_async_commit();
    s_fill = s_fill == XS - 1 ? 0 : s_fill + 1;
    const int xs = XT ? s_use : (gi - gb) % NX;  // group gi's activation tile
    if (!XT && gi + 1 < ge) {
      store_x((gi + 1 - gb) % NX);
      if (gi + 2 < ge) load_x(gi + 2);
    }
    // Dequantize group gi: this warp's A fragments of the MW blocks, and their scales.
    const uint4* ws = reinterpret_cast<const uint4*>(reinterpret_cast<const char*>(wgmma_smem) + s_use * SB) +
                      warp * MW * 66;
#pragma unroll
    for (int b = 0; b < MW; ++b) wgmma_slot_a(ws + b * 66, lane, a[p][b], sw[p][b]);
    uint64_t desc[8];
    wgmma_group_descs<NT, MW>(desc0, xs * XB, a[p], desc);
    s_use = s_use == XS - 1 ? 0 : s_use + 1;
    wgmma_fence();
#pragma unroll
    for (int k = 0; k < 8; ++k)
#pragma unroll
      for (int b = 0; b < MW; ++b)
        Wgmma<NT>::mma(pt[p][b], a[p][b][k], desc[k], k);
    wgmma_commit();
  };
  // Group gd's wgmmas are done: scale its partials into acc, close its part.
  auto finish = [&](auto P, int gd) {
    constexpr int p = decltype(P)::value;
#pragma unroll
    for (int b = 0; b < MW; ++b) {
      wgmma_fence_regs<NT>(pt[p][b]);
      q4_scale_add<NT>(acc[b], pt[p][b], sw[p][b]);
    }
    if (KS > 1 && gd + 1 == part_end) {
      // Part `part` is done. ZS = 1: sum += its acc, in part order from 0.f (gemv_q4's
      // reduction); ZS > 1: its acc goes to part_buf for the merging block.
      float* pv = ZS > 1 ? pslot(part) : sums;
#pragma unroll
      for (int b = 0; b < MW; ++b)
#pragma unroll
        for (int j = 0; j < NT; ++j)
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            float* sv = pv + ((b * NT + j) * 4 + e) * T;
            if constexpr (ZS > 1) __stcg(sv, acc[b][j][e]);
            else *sv = (part == 0 ? 0.f : *sv) + acc[b][j][e];
            acc[b][j][e] = 0.f;
          }
      ++part;
      part_end = ((part + 1) * NG) / KS;
    }
  };
  using P0 = Parity<0>;
  using P1 = Parity<PP>;
  if constexpr (PP == 0) {
#pragma unroll 1
    for (int gi = gb; gi < ge; ++gi) {
      issue(P0{}, gi);
      wgmma_wait<0>();
      finish(P0{}, gi);
    }
  } else {
    // Steady state: issue g+1, wait for g (g+1's wgmmas left in flight), scale g.
    issue(P0{}, gb);
    int gi = gb + 1;
#pragma unroll 1
    for (; gi + 1 < ge; gi += 2) {
      issue(P1{}, gi);
      wgmma_wait<1>();
      finish(P0{}, gi - 1);
      issue(P0{}, gi + 1);
      wgmma_wait<1>();
      finish(P1{}, gi);
    }
    if (gi < ge) {
      issue(P1{}, gi);
      wgmma_wait<1>();
      finish(P0{}, gi - 1);
      wgmma_wait<0>();
      finish(P1{}, gi);
    } else {
      wgmma_wait<0>();
      finish(P0{}, gi - 1);
    }
  }
  cp_async_wait<0>();  // no copy may still target shared memory when the block exits

  // Value v = (b*NT + j)*4 + e of this thread: output feature n, activation row r.
  auto out_index = [&](int v, int& n, int& r) {
    const int b = v / (NT * 4), j = (v / 4) % NT, e = v % 4;
    n = (mt0 + 4 * b) * 16 + g + (e >= 2 ? 8 : 0);
    r = r0 + 8 * j + 2 * c + (e & 1);
  };
  if constexpr (ZS > 1) {
    // The last of the ZS blocks of this row block sums the KS parts in order and stores y.
    if (!split_last_arrival<ZS>(arrivals, blk)) return;
    // U values a round trip, their residuals loaded with their partials (version 20; step ms,
    // same run, old against new): 64 rows U = 8, B = 64 18.13 -> 17.37; 32 rows U = 4, B = 32
    // 11.92 -> 11.60. 24 rows U = 2 (B = 24 10.39 -> 10.35): at U = 8 the 24-row instance took
    // 109 registers, four blocks per SM instead of five, and its 640 blocks no longer fit one
    // wave (B = 24 +0.48 ms); U = 8 at 32 rows spills (docs/PERFORMANCE.md, version 20).
    split_merge_store<KS, EPI, NT == 8 ? 8 : NT == 4 ? 4 : 2>(V, T, pslot, out_index, y, ldy, N, R);
  } else {
    gemv_store_all<EPI, V>(y, ldy, N, R, out_index,
                           [&](int v) { return KS > 1 ? sums[v * T] : acc[v / (NT * 4)][(v / 4) % NT][v % 4]; });
  }
}

}  // namespace q38

// wgmma_q4.cuh: the batched int4-g128 GEMV of gemv_q4.cuh on Hopper's warpgroup MMA (sm_90a).
//
//   y[r, n] = sum_k W~[n, k] * x[r, k]          same operands, layouts and epilogues as gemv_q4
//
// gemv_q4 and gemm_q4 feed mma.sync.m16n8k16 one warp and one 8-row n-tile at a time: at 32-64
// activation rows that is 4-8 mma per dequantized A fragment, ~26 cycles per mma per SM
// sub-partition (bench/NOTES.md, version 3). Here the four warps of a warpgroup own 64 output
// rows (one m-tile each) and one wgmma.m64nNk16 instruction multiplies their A fragments, in
// registers, by the whole activation tile (N = 8*NT rows), read by the tensor cores from shared
// memory. WG warpgroups of a block own different rows and share that tile.
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
// {2,3} (half 1) of k-tile h for k-step 4h + i, so the copy scatters 4-byte words (cp.async 4).
// Each group's weights and scales go to the same ring stage (cp.async 16, as gemm_q4), and
// the A fragments are dequantized from there into registers. PIPE = 0: a group's 8 wgmmas are
// waited for before the next group is dequantized (the overlap comes from the other blocks on
// the SM). PIPE = 1: two groups deep, group g's wgmmas run while group g+1 is dequantized and
// group g-1 is scaled; ptxas then serializes the wgmmas (C7513: registers of a later wgmma are
// written while one is in flight), so both are measured.
//
// ZS > 1: grid.z = ZS blocks share a row block and split the KS parts, as gemm_q4 (the `part`
// scratch and the `arrivals` counters, merged in part order by the last block to arrive).
//
// Launch: grid = (ceil(ceil(N/16) / (4*WG)), ceil(R / (8*NT)), ZS), block = 128*WG, dynamic
//   smem WgmmaLaunch::dyn_smem_bytes (above 48 KiB the caller raises the limit). ZS > 1: `part`
//   holds WgmmaLaunch::part_floats * grid.x * grid.y floats, `arrivals` grid.x * grid.y zeroed
//   ints. Entry point: extern "C" __global__ __launch_bounds__(128*WG, MB) calling wgmma_q4.
//
// Compiles alone:
//   nvcc -arch=sm_90a -std=c++17 -cubin -Xptxas -v -x cu kernels/wgmma_q4.cuh -o /dev/null
#pragma once
#include <type_traits>

#include "gemv_q4.cuh"

namespace q38 {

template <int NT, int KS, int WG, int XS, int ZS = 1, int PIPE = 0>
struct WgmmaLaunch {
  static_assert(WG == 1 || WG == 2, "wgmma_q4: 1 or 2 warpgroups per block");
  static_assert(XS >= 2 + PIPE && XS <= 8, "wgmma_q4: 2 + PIPE <= XS <= 8 ring stages");
  static constexpr int ahead = XS - 1 - PIPE;                // groups copied ahead
  static_assert(ZS >= 1 && KS % ZS == 0, "wgmma_q4: ZS must divide KS");
  static constexpr int threads = 128 * WG;
  static constexpr int rows_per_block = 64 * WG;
  static constexpr int btg = 8 * NT;
  static constexpr int x_stage_bytes = 8 * NT * 256;       // 8 k-steps x NT blocks x 2 x 128 B
  static constexpr int w_stage_bytes = 4 * WG * 66 * 16;   // per warp 64 uint4 weights, 2 scales
  static constexpr int stage_bytes = x_stage_bytes + w_stage_bytes;
  static constexpr int values = NT * 4;                    // accumulators per thread
  static constexpr int sum_bytes = KS > 1 && ZS == 1 ? threads * values * 4 : 0;
  static constexpr int part_floats = KS * threads * values;  // per row block (ZS > 1)
  static constexpr int dyn_smem_bytes = XS * stage_bytes + sum_bytes;
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
// Writes to shared memory by the generic proxy (cp.async) made visible to the tensor cores.
__device__ __forceinline__ void fence_proxy_async() { asm volatile("fence.proxy.async.shared::cta;" ::: "memory"); }
__device__ __forceinline__ void cp_async4_s(unsigned smem, const void* gmem) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4;" ::"r"(smem), "l"(gmem) : "memory");
}

// NT: n-tiles (8 activation rows), BTG = 8*NT; KS: the parts of K (as gemv_q4: min(8, K/128));
// EPI: GemvEpilogue; WG: warpgroups per block, on different rows; XS: ring stages (XS-1-PIPE
// groups copied ahead of the one multiplied); ZS: blocks splitting the parts of K (grid.z);
// PIPE: 0 or 1, above.
template <int K, int NT, int KS, int EPI, int WG, int XS, int ZS = 1, int PIPE = 0>
__device__ __forceinline__ void wgmma_q4(const uint4* __restrict__ qweight, const bf16* __restrict__ scales,
                                         const bf16* __restrict__ x, int ldx, bf16* y, int ldy, int N, int R,
                                         float* part_buf = nullptr, int* arrivals = nullptr) {
  static_assert(K % 128 == 0, "K must be a multiple of 128");
  using L = WgmmaLaunch<NT, KS, WG, XS, ZS, PIPE>;
  constexpr int KT = K / 64, NG = K / 128, V = L::values, T = L::threads, W = 4 * WG;
  constexpr int SB = L::stage_bytes, XB = L::x_stage_bytes, D = L::ahead;
  extern __shared__ __align__(128) uint4 wgmma_smem[];  // [XS][x tile | weights], then the sums
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, c = lane & 3;
  const int tiles = (N + 15) >> 4;
  const int rt = blockIdx.x * W + warp;  // this warp's m-tile
  const bool active = rt < tiles;
  const int rtc = active ? rt : tiles - 1;  // every warp of a warpgroup takes part in its wgmma
  const int r0 = blockIdx.y * (8 * NT);
  const unsigned smem0 = (unsigned)__cvta_generic_to_shared(wgmma_smem);

  // This warp's weights and scales of group gi into stage s (constant data: safe before pdl_wait).
  const uint4* wsrc = qweight + (size_t)rtc * KT * 32 + lane;
  const unsigned short* ssrc =
      reinterpret_cast<const unsigned short*>(scales) + (size_t)rtc * NG * 16 + 8 * (lane & 1);
  const unsigned wdst = XB + (warp * 66 + lane) * 16;
  auto load_w = [&](int s, int gi) {
    const unsigned d = smem0 + s * SB + wdst;
    cp_async16_s(d, wsrc + gi * 64);
    cp_async16_s(d + 32 * 16, wsrc + gi * 64 + 32);
    if (lane < 2) cp_async16_s(d + 64 * 16, ssrc + gi * 16);  // slots 64, 65: the 16 scales
  };
  // The activation tile of group gi into stage s, scattered into the B layout. Lane (n8, c)
  // copies word u of chunk c of k-tile h of row 8*nb + n8; the 16*NT (nb, h, u) are spread over
  // the W warps: warp w takes (h, u) = divmod(w + m, 8) for m = 0, W, 2W, .. < 16.
  const int n8 = lane >> 2;
  int xoff[NT];  // byte offset of this lane's row of each core block (rows >= R read row R-1)
#pragma unroll
  for (int nb = 0; nb < NT; ++nb) xoff[nb] = min(r0 + 8 * nb + n8, R - 1) * ldx * 2;
  const char* xsrc = reinterpret_cast<const char*>(x) + 4 * (warp + 8 * c);
  const unsigned xdst = ((warp >> 1) * NT * 256) + (warp & 1) * 128 + n8 * 16 + c * 4;
  auto load_x = [&](int s, int gi) {
    const unsigned d = smem0 + s * SB + xdst;
    const char* src = xsrc + gi * 256;
#pragma unroll
    for (int nb = 0; nb < NT; ++nb)
#pragma unroll
      for (int m = 0; m < 16; m += W)
        cp_async4_s(d + ((m >> 1) * NT + nb) * 256, src + xoff[nb] + 4 * ((m >> 3) * 32 + (m & 7)));
  };

  // This block's parts [pa, pb) and their groups [gb, ge).
  const int pa = (int)blockIdx.z * (KS / ZS), pb = pa + KS / ZS;
  const int gb = (pa * NG) / KS, ge = (pb * NG) / KS;
  pdl_launch_dependents();
#pragma unroll
  for (int s = 0; s < D; ++s)
    if (gb + s < ge) load_w(s, gb + s);
  pdl_wait();  // x comes from the previous kernel
#pragma unroll
  for (int s = 0; s < D; ++s) {
    if (gb + s < ge) load_x(s, gb + s);
    cp_async_commit();  // D commit groups, even with fewer groups
  }

  float acc[NT][4], pt[2][NT][4];
  q4_zero<1, NT>(*reinterpret_cast<float(*)[1][NT][4]>(&acc));
  q4_zero<2, NT>(pt);
  uint32_t a[2][8][4], sw[2];
  float* sums = reinterpret_cast<float*>(reinterpret_cast<char*>(wgmma_smem) + XS * SB) + tid;
  int part = pa, part_end = ((pa + 1) * NG) / KS;
  const size_t blk = (size_t)blockIdx.y * gridDim.x + blockIdx.x;
  auto pslot = [&](int p) { return part_buf + ((size_t)p * gridDim.x * gridDim.y + blk) * (T * V) + tid; };
  const uint64_t desc0 = (uint64_t)((smem0 & 0x3FFFF) >> 4) | (uint64_t)(128 >> 4) << 16 |
                         (uint64_t)(256 >> 4) << 32;

  // Group gj's partial (parity P) is complete: scale it into acc; at the end of a part, the sums.
  auto finish = [&](float (&p)[NT][4], uint32_t s, int gj) {
    q4_scale_add<NT>(acc, p, s);
    if (KS > 1 && gj + 1 == part_end) {
      float* pv = ZS > 1 ? pslot(part) : sums;
#pragma unroll
      for (int j = 0; j < NT; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          float* sv = pv + (j * 4 + e) * T;
          if constexpr (ZS > 1) __stcg(sv, acc[j][e]);
          else *sv = (part == 0 ? 0.f : *sv) + acc[j][e];
          acc[j][e] = 0.f;
        }
      ++part;
      part_end = ((part + 1) * NG) / KS;
    }
  };

  int s_use = 0, s_fill = D;  // the stage multiplied / refilled
  auto step = [&](auto parity, int gi) {
    constexpr int P = decltype(parity)::value;
    cp_async_wait<D - 1>();  // group gi's copies (this thread's) have landed
    fence_proxy_async();     // ... visible to the tensor cores
    __syncthreads();         // ... everyone's; and the stage refilled next is free (its wgmmas are done)
    if (gi + D < ge) {
      load_w(s_fill, gi + D);
      load_x(s_fill, gi + D);
    }
    cp_async_commit();
    s_fill = s_fill == XS - 1 ? 0 : s_fill + 1;
    // Dequantize group gi into A buffer P (free: the wgmmas that read it are done).
    const uint4* ws = reinterpret_cast<const uint4*>(reinterpret_cast<const char*>(wgmma_smem) + s_use * SB + XB) + warp * 66;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const uint4 wv = ws[32 * h + lane];
      const uint32_t wi[4] = {wv.x, wv.y, wv.z, wv.w};
#pragma unroll
      for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j) a[P][4 * h + i][j] = q4_pair(wi[i], j);
    }
    {
      const unsigned short* sp = reinterpret_cast<const unsigned short*>(ws + 64);
      sw[P] = (uint32_t)sp[g] | ((uint32_t)sp[g + 8] << 16);
    }
    uint64_t desc[8];
#pragma unroll
    for (int k = 0; k < 8; ++k) {
      desc[k] = desc0 + (uint64_t)((s_use * SB + k * NT * 256) >> 4);
      asm volatile("" : "+l"(desc[k]));  // every input of the wgmmas is defined before they start
#pragma unroll
      for (int j = 0; j < 4; ++j) asm volatile("" : "+r"(a[P][k][j]));
    }
    s_use = s_use == XS - 1 ? 0 : s_use + 1;
    wgmma_fence();
#pragma unroll
    for (int k = 0; k < 8; ++k) Wgmma<NT>::mma(pt[P], a[P][k], desc[k], k);
    wgmma_commit();
    if constexpr (PIPE) {
      wgmma_wait<1>();  // group gi-1's wgmmas are done
      wgmma_fence_regs<NT>(pt[1 - P]);
      if (gi > gb) finish(pt[1 - P], sw[1 - P], gi - 1);
    } else {
      wgmma_wait<0>();
      wgmma_fence_regs<NT>(pt[P]);
      finish(pt[P], sw[P], gi);
    }
  };
#pragma unroll 1
  for (int gi = gb; gi < ge; gi += 2) {
    step(std::integral_constant<int, 0>{}, gi);
    if (gi + 1 < ge) step(std::integral_constant<int, PIPE>{}, gi + 1);
  }
  if constexpr (PIPE) {
    wgmma_wait<0>();
    if ((ge - gb) & 1) {
      wgmma_fence_regs<NT>(pt[0]);
      finish(pt[0], sw[0], ge - 1);
    } else {
      wgmma_fence_regs<NT>(pt[1]);
      finish(pt[1], sw[1], ge - 1);
    }
  }
  cp_async_wait<0>();  // no copy may still target shared memory when the block exits
  if constexpr (ZS > 1) {
    // The last of the ZS blocks of this row block sums the KS parts in order and stores y.
    __shared__ int last;
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) {
      last = atomicAdd(arrivals + blk, 1) == ZS - 1;
      if (last) arrivals[blk] = 0;  // every launch leaves the counters at 0
    }
    __syncthreads();
    if (!last || !active) return;
    __threadfence();
#pragma unroll 1
    for (int v = 0; v < V; ++v) {
      float s = 0.f;
#pragma unroll
      for (int p = 0; p < KS; ++p) s += __ldcg(pslot(p) + v * T);
      int n, r;
      gemv_out_index(v, NT, lane, rt, r0, n, r);
      gemv_store<EPI>(y, ldy, n, r, N, R, s);
    }
    return;
  }
  if (!active) return;
  if constexpr (KS > 1) __syncwarp();
#pragma unroll
  for (int j = 0; j < NT; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int v = j * 4 + e;
      int n, r;
      gemv_out_index(v, NT, lane, rt, r0, n, r);
      gemv_store<EPI>(y, ldy, n, r, N, R, KS > 1 ? sums[v * T] : acc[j][e]);
    }
}

}  // namespace q38

// gemv_q4.cuh: batched int4-g128 GEMV / small GEMM on the tensor cores.
//
//   y[r, n] = sum_k W~[n, k] * x[r, k]          W~ = int4 code * bf16 scale (docs/FORMAT.md)
//
//   x  bf16 [R, K]  (row stride ldx)   R = activation rows (B for decode, B*PT for prefill)
//   W  uint32 qweight [Np/16, K/64, 32, 4], bf16 scales [Np/16, K/128, 16]
//   y  bf16 [R, N]  (row stride ldy); epilogue EPI_STORE writes bf16(acc),
//      EPI_ADD writes bf16(y + bf16(acc)) in place (the residual add, as HF rounds it)
//
// Each weight is read from memory once per launch and reused for the BTG = 8*NT activation rows
// of a batch tile: A = weights (16 output rows per m-tile), B = activations (batch along n),
// mma.sync.m16n8k16 bf16 -> fp32. Codes become bf16 with one lop3 and one sub per register;
// each group of 128 is accumulated unscaled and added into the output with its fp32 scale, so
// the only roundings are fp32 sums and the final bf16 store.
//
// Launch: grid = (Np / (16*MT), ceil(R / (8*NT))), block = GemvLaunch::threads = 32*KS,
//   dynamic smem GemvLaunch::dyn_smem_bytes (0 unless AS = 1; above 48 KiB the caller raises
//   CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES). Entry point: extern "C" __global__ __launch_bounds__(32*KS) calling gemv_q4.
//   KS warps of a block own the same MT m-tiles and split the K/128 groups between them; their
//   partial sums meet in shared memory and are added in a fixed order (deterministic, and the
//   same at every R: a row's result does not depend on the batch it is computed in).
//   ZS > 1: the KS warps of a row block are spread over a cluster of ZS blocks of KS/ZS warps
//   (grid.x = row blocks * ZS, __cluster_dims__(ZS, 1, 1)); block z's warp w takes part
//   z*KS/ZS + w, and the parts are added in the same order through distributed shared memory,
//   so the bits do not change. For weights whose row blocks fill the GPU in about one wave (the
//   out and down projections: 320 blocks on 132 SMs, two or three per SM) smaller blocks even
//   out the SMs' shares (docs/PERFORMANCE.md, version 12).
//
// Compiles alone:
//   nvcc -arch=sm_90 -std=c++17 -cubin -Xptxas -v -x cu kernels/gemv_q4.cuh -o /dev/null
#pragma once
#include <cooperative_groups.h>

#include "common.cuh"

namespace q38 {

// EPI_SWIGLU: the block's two m-tiles are gate tile t and up tile t + MS of a fused gate_up
// weight; y[r, f] = bf16(silu(bf16(gate)) · bf16(up)), as the swiglu kernel computes it from the
// EPI_STORE output (elementwise.cuh), so fusing it changes no bit.
enum GemvEpilogue { EPI_STORE = 0, EPI_ADD = 1, EPI_SWIGLU = 2 };

template <int MT, int NT, int KS, int ST = 2, int AS = 0, int ZS = 1>
struct GemvLaunch {
  static_assert(ZS >= 1 && KS % ZS == 0 && ZS <= 8, "gemv: ZS divides KS, at most 8 (a cluster)");
  static constexpr int warps = KS / ZS;            // warps per block
  static constexpr int threads = 32 * warps;
  static constexpr int rows_per_block = 16 * MT;   // output features per block (grid.x / ZS)
  static constexpr int btg = 8 * NT;               // activation rows per block (grid.y)
  static constexpr int smem_bytes = (KS > 1 ? warps : 0) * MT * NT * 4 * 32 * 4;  // static
  static constexpr int dyn_smem_bytes = AS ? warps * ST * MT * 66 * 16 : 0;       // the cp.async ring
};

// Two int4 codes at bits [4j, 4j+4) and [16+4j, 20+4j) of w -> bf16x2 {code-8, code-8}.
__device__ __forceinline__ uint32_t q4_pair(uint32_t w, int j) {
  uint32_t v;
  const uint32_t s = w >> (4 * j);
  // v = (s & 0x000f000f) | 0x43004300: bf16 128 + code in each half.
  asm("lop3.b32 %0, %1, %2, %3, 0xea;" : "=r"(v) : "r"(s), "r"(0x000f000fu), "r"(0x43004300u));
  uint32_t r;
  // (128 + code) - 136 = code - 8, exact in bf16.
  asm("sub.bf16x2 %0, %1, %2;" : "=r"(r) : "r"(v), "r"(0x43084308u));
  return r;
}

__device__ __forceinline__ void mma_bf16_16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                               uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
      "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Accumulators of MT m-tiles x NT n-tiles (the mma C fragments of one lane) to 0.
template <int MT, int NT>
__device__ __forceinline__ void q4_zero(float (&v)[MT][NT][4]) {
#pragma unroll
  for (int m = 0; m < MT; ++m)
#pragma unroll
    for (int j = 0; j < NT; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) v[m][j][e] = 0.f;
}

// The arithmetic of a group, shared by gemv_q4 and gemm_q4 (their bits must agree): one k-step
// for one m-tile, the 8 int4 codes of weight word wi (this lane's share of the A fragment) times
// the B fragments {b0[j], b1[j]} of NT n-tiles into the unscaled partials part[j] ...
template <int NT>
__device__ __forceinline__ void q4_kstep(float (&part)[NT][4], uint32_t wi, const uint32_t (&b0)[NT],
                                         const uint32_t (&b1)[NT]) {
  uint32_t a[4] = {q4_pair(wi, 0), q4_pair(wi, 1), q4_pair(wi, 2), q4_pair(wi, 3)};
#pragma unroll
  for (int j = 0; j < NT; ++j) mma_bf16_16816(part[j], a, b0[j], b1[j]);
}

// ... and, after the group's 8 k-steps, acc += scale * part in fp32 (sw: the bf16 scales of rows
// g and g+8 of the m-tile, packed low | high).
template <int NT>
__device__ __forceinline__ void q4_scale_add(float (&acc)[NT][4], const float (&part)[NT][4], uint32_t sw) {
  const float s0 = __uint_as_float(sw << 16), s1 = __uint_as_float(sw & 0xffff0000u);
#pragma unroll
  for (int j = 0; j < NT; ++j) {
    acc[j][0] += s0 * part[j][0];
    acc[j][1] += s0 * part[j][1];
    acc[j][2] += s1 * part[j][2];
    acc[j][3] += s1 * part[j][3];
  }
}

// Weights are streamed once: keep them out of L1.
__device__ __forceinline__ uint4 ld_stream16(const uint4* p) {
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p));
  return v;
}

// The work of one warp on one batch tile: MT m-tiles (16 output rows each) x NT n-tiles (8
// activation rows each), over any run of groups of 128 inputs, with an ST-stage ring of weights
// and scales (XS: activations staged in registers with them, else loaded when used). The ring is
// in registers (AS = 0) or in this warp's slice of shared memory, filled by cp.async (AS = 1:
// ST-1 groups in flight cost no registers, so more warps fit an SM). Its arithmetic is fixed: per
// group, 8 mma k-steps into an unscaled partial, then acc += scale * partial in fp32. MT, NT, ST,
// XS and AS change only the schedule, so a row's result depends only on K and KS (the split of
// the groups into KS parts, summed in part order).
template <int K, int MT, int NT, int ST, int XS, int AS = 0, int MS = 0>
struct GemvWarp {
  static_assert(K % 128 == 0, "K must be a multiple of 128");
  static_assert(ST >= 1 && ST <= 8, "gemv: 1 <= ST <= 8");
  static constexpr int KT = K / 64;    // k-tiles per row tile
  static constexpr int NG = K / 128;   // groups per row tile
  static constexpr int XW = XS ? ST : 1;
  static constexpr int V = MT * NT * 4;  // accumulator values per lane
  static constexpr int WS = AS ? 1 : ST;  // register stages
  // Shared ring per warp (AS = 1): per (stage, m-tile) 64 uint4 of weights (lane l's 16 bytes of
  // k-tile h at [32h + l]) then 2 uint4 = the group's 16 bf16 scales.
  static constexpr int RING_SLOT = 66;
  static constexpr int ring_uint4 = AS ? ST * MT * RING_SLOT : 0;
  // Row tile of m-tile m: rt + m (MS = 0), or rt + m·MS (the m-tiles MS tiles apart).
  static __device__ __forceinline__ int tile(int rt, int m) { return rt + (MS ? m * MS : m); }

  const uint4* __restrict__ qweight;
  const unsigned short* __restrict__ sc16;
  const bf16* xrow[NT];
  int lane, g;
  uint4* ring = nullptr;  // AS = 1: this warp's ring_uint4 uint4 of shared memory
  uint4 w[WS][MT][2];
  uint32_t sw[WS][MT];  // bf16 scales of rows g and g+8 of each m-tile, packed
  uint4 xv[XW][NT][2][2];
  float acc[MT][NT][4];

  __device__ __forceinline__ GemvWarp(const uint4* qw, const bf16* scales, const bf16* x, int ldx,
                                      int r0, int R) {
    qweight = qw;
    sc16 = reinterpret_cast<const unsigned short*>(scales);
    lane = threadIdx.x & 31;
    g = lane >> 2;
    const int c = lane & 3;
    // Activation row of each n-tile for this lane (n = g), clamped; rows >= R read row R-1 and
    // are never stored.
#pragma unroll
    for (int j = 0; j < NT; ++j) {
      const int r = r0 + 8 * j + g;
      xrow[j] = x + (size_t)(r < R ? r : R - 1) * ldx + 16 * c;
    }
    q4_zero<MT, NT>(acc);
  }

  // Weights and scales of group gi of m-tiles rt..rt+MT-1 into stage s: constant data, safe
  // before pdl_wait.
  __device__ __forceinline__ void load_w(int s, int rt, int gi) {
    if constexpr (AS) {
#pragma unroll
      for (int m = 0; m < MT; ++m) {
        uint4* slot = ring + (s * MT + m) * RING_SLOT;
#pragma unroll
        for (int h = 0; h < 2; ++h)
          cp_async16(slot + 32 * h + lane, qweight + ((size_t)tile(rt, m) * KT + 2 * gi + h) * 32 + lane);
      }
      if (lane < 2 * MT) {
        const int m = lane >> 1, half = lane & 1;
        cp_async16(ring + (s * MT + m) * RING_SLOT + 64 + half,
                   reinterpret_cast<const uint4*>(sc16 + ((size_t)tile(rt, m) * NG + gi) * 16) + half);
      }
      cp_async_commit();
    } else {
#pragma unroll
      for (int m = 0; m < MT; ++m) {
#pragma unroll
        for (int h = 0; h < 2; ++h)
          w[s][m][h] = ld_stream16(qweight + ((size_t)tile(rt, m) * KT + 2 * gi + h) * 32 + lane);
        const unsigned short* sp = sc16 + ((size_t)tile(rt, m) * NG + gi) * 16;
        sw[s][m] = (uint32_t)__ldg(sp + g) | ((uint32_t)__ldg(sp + g + 8) << 16);
      }
    }
  }

  // Activations: 16 contiguous bf16 per k-tile per n-tile (FORMAT.md's column permutation),
  // written by the previous kernel: coherent loads kept after pdl_wait (ld_after_wait16).
  __device__ __forceinline__ void load_x(int s, int gi) {
#pragma unroll
    for (int j = 0; j < NT; ++j)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const uint4* p = reinterpret_cast<const uint4*>(xrow[j] + (2 * gi + h) * 64);
        xv[s][j][h][0] = ld_after_wait16(p);
        xv[s][j][h][1] = ld_after_wait16(p + 1);
      }
  }

  __device__ __forceinline__ void load(int s, int rt, int gi) {
    load_w(s, rt, gi);
    if constexpr (XS) load_x(s, gi);
  }

  // Multiply the group in stage s (group index gi, for the activations when XS = 0).
  __device__ __forceinline__ void group(int s, int gi) {
    if constexpr (AS) {
      // This stage's copies (and the older ones) are done; the ST-1 younger may be in flight.
      cp_async_wait<ST - 1>();
      __syncwarp();  // the scales were copied by other lanes
#pragma unroll
      for (int m = 0; m < MT; ++m) {
        const uint4* slot = ring + (s * MT + m) * RING_SLOT;
        w[0][m][0] = slot[lane];
        w[0][m][1] = slot[32 + lane];
        const unsigned short* sp = reinterpret_cast<const unsigned short*>(slot + 64);
        sw[0][m] = (uint32_t)sp[g] | ((uint32_t)sp[g + 8] << 16);
      }
      __syncwarp();  // every lane has read the stage before any refills it
    }
    compute(AS ? 0 : s, s, gi);
  }

  // Multiply the group held in register stage rs (its activations: stage s, group gi).
  __device__ __forceinline__ void compute(int rs, int s, int gi) {
    if constexpr (!XS) load_x(0, gi);
    const uint4 (&xs)[NT][2][2] = xv[XS ? s : 0];
    float part[MT][NT][4];
    q4_zero<MT, NT>(part);
#pragma unroll
    for (int h = 0; h < 2; ++h)
#pragma unroll
      for (int i = 0; i < 4; ++i) {  // k-step i of k-tile h
        // x words 2i, 2i+1 of this lane's 16 activations of k-tile h, per n-tile.
        uint32_t b0[NT], b1[NT];
#pragma unroll
        for (int j = 0; j < NT; ++j) {
          const uint4& v = xs[j][h][i >> 1];
          b0[j] = (i & 1) ? v.z : v.x, b1[j] = (i & 1) ? v.w : v.y;
        }
#pragma unroll
        for (int m = 0; m < MT; ++m) {
          const uint4& wv = w[rs][m][h];
          q4_kstep<NT>(part[m], i == 0 ? wv.x : i == 1 ? wv.y : i == 2 ? wv.z : wv.w, b0, b1);
        }
      }
#pragma unroll
    for (int m = 0; m < MT; ++m) q4_scale_add<NT>(acc[m], part[m], sw[rs][m]);
  }

  // Groups [gb, ge) of m-tiles rt.., ST-1 stages ahead. With pdl: the first weights are requested,
  // then pdl_wait (the activations come from the previous kernel).
  __device__ __forceinline__ void run(int rt, int gb, int ge, bool pdl) {
#pragma unroll
    for (int s = 0; s < ST - 1; ++s) {
      if (gb + s < ge) load_w(s, rt, gb + s);
      else if constexpr (AS) cp_async_commit();  // ST-1 commit groups, even with fewer groups
    }
    if (pdl) pdl_wait();
    if constexpr (XS) {
#pragma unroll
      for (int s = 0; s < ST - 1; ++s)
        if (gb + s < ge) load_x(s, gb + s);
    }
#pragma unroll 1
    for (int gi = gb; gi < ge; gi += ST) {
#pragma unroll
      for (int s = 0; s < ST; ++s) {
        if (gi + s < ge) {
          if (gi + s + ST - 1 < ge) load((s + ST - 1) % ST, rt, gi + s + ST - 1);
          else if constexpr (AS) cp_async_commit();  // keep one commit group per group
          group(s, gi + s);
        }
      }
    }
  }

  // Value v of this lane's accumulators (v = (m*NT + j)*4 + e) and where it goes.
  __device__ __forceinline__ float value(int v) const {
    float out = 0.f;
#pragma unroll
    for (int m = 0; m < MT; ++m)
#pragma unroll
      for (int j = 0; j < NT; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e)
          if ((m * NT + j) * 4 + e == v) out = acc[m][j][e];
    return out;
  }
};

// Output feature n and activation row r of accumulator value v of `lane` for m-tile base rt0 and
// batch base r0 (the mma C-fragment layout).
__device__ __forceinline__ void gemv_out_index(int v, int NT, int lane, int rt0, int r0, int& n, int& r) {
  const int m = v / (NT * 4), j = (v / 4) % NT, e = v % 4;
  n = (rt0 + m) * 16 + (lane >> 2) + (e >= 2 ? 8 : 0);
  r = r0 + 8 * j + 2 * (lane & 3) + (e & 1);
}

template <int EPI>
__device__ __forceinline__ void gemv_store(bf16* y, int ldy, int n, int r, int N, int R, float s) {
  if (n < N && r < R) {
    bf16* o = y + (size_t)r * ldy + n;
    if (EPI == EPI_ADD) *o = to_bf(to_f(*o) + round_bf(s));
    else *o = to_bf(s);
  }
}

// V values of a thread, value(v) to where index(v, n, r) says, with gemv_store's arithmetic.
// EPI_ADD: every residual is loaded before any value is stored. Stored one by one, each residual's
// load waits for the store before it (y may alias): a dependent L2 round trip per value, at the
// end of the launch (docs/PERFORMANCE.md, version 20; same bits).
template <int EPI, int V, class Index, class Value>
__device__ __forceinline__ void gemv_store_all(bf16* y, int ldy, int N, int R, Index index, Value value) {
  float old[V];
#pragma unroll
  for (int v = 0; v < V; ++v) {
    int n, r;
    index(v, n, r);
    old[v] = EPI == EPI_ADD && n < N && r < R ? to_f(y[(size_t)r * ldy + n]) : 0.f;
  }
#pragma unroll
  for (int v = 0; v < V; ++v) {
    int n, r;
    index(v, n, r);
    if (n < N && r < R) {
      const float s = value(v);
      y[(size_t)r * ldy + n] = EPI == EPI_ADD ? to_bf(old[v] + round_bf(s)) : to_bf(s);
    }
  }
}

// SwiGLU of a gate sum g and an up sum u of feature n, row r (swiglu8's arithmetic).
__device__ __forceinline__ void gemv_store_swiglu(bf16* y, int ldy, int n, int r, int N, int R, float g,
                                                  float u) {
  if (n < N && r < R) y[(size_t)r * ldy + n] = to_bf(siluf_(round_bf(g)) * round_bf(u));
}

// MT: m-tiles (16 output rows) per warp; NT: n-tiles (8 activation rows) per warp, BTG = 8*NT;
// KS: warps per block splitting K; K: input width (a multiple of 128); EPI: GemvEpilogue
// (EPI_SWIGLU: grid.x = the gate's row tiles, N = the features, y = the SwiGLU output);
// ST: pipeline stages, the groups of weights (and their scales) a warp has in flight, ST-1 of
// them ahead of the one it multiplies; XS: 1 = the activations of a group are loaded with its
// stage (ahead), 0 = when the group is multiplied (they mostly hit L1/L2); AS: 1 = the stages
// live in shared memory, filled by cp.async (GemvWarp), 0 = in registers.
// MT, NT, ST, XS and AS change neither the arithmetic nor its order, only how it is scheduled: a
// row's result is bitwise the same for every choice of them (KS does change the sum order).
// MS: 0, or the tile distance of the two m-tiles of EPI_SWIGLU (the up part's first tile).
template <int K, int MT, int NT, int KS, int EPI, int ST = 2, int XS = 0, int AS = 0, int MS = 0,
          int ZS = 1>
__device__ __forceinline__ void gemv_q4(const uint4* __restrict__ qweight, const bf16* __restrict__ scales,
        const bf16* __restrict__ x, int ldx, bf16* y, int ldy, int N, int R) {
  static_assert((EPI == EPI_SWIGLU) == (MS > 0) && (EPI != EPI_SWIGLU || MT == 2),
                "gemv: EPI_SWIGLU takes m-tile pairs (gate, up) MS tiles apart, MT = 2");
  using Wp = GemvWarp<K, MT, NT, ST, XS, AS, MS>;
  constexpr int NG = Wp::NG, V = Wp::V;
  // EPI_SWIGLU: value v < VS of a lane is a gate sum, v + VS the up sum of the same (f, r)
  constexpr int VS = EPI == EPI_SWIGLU ? V / 2 : V;
  static_assert(ZS == 1 || KS > 1, "gemv: ZS > 1 splits the KS parts");
  constexpr int KW = KS / ZS;  // warps per block
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int z = ZS > 1 ? blockIdx.x % ZS : 0;  // this block's rank in its cluster
  const int rt0 = (blockIdx.x / ZS) * (MS ? 1 : MT);  // first row tile of this block
  const int r0 = blockIdx.y * (8 * NT);
  Wp wp(qweight, scales, x, ldx, r0, R);
  if constexpr (AS) {
    static_assert(GemvLaunch<MT, NT, KS, ST, AS, ZS>::dyn_smem_bytes == KW * Wp::ring_uint4 * 16, "ring");
    extern __shared__ uint4 gemv_ring[];  // dynamic: GemvLaunch::dyn_smem_bytes
    wp.ring = gemv_ring + warp * Wp::ring_uint4;
  }
  // This warp's share of the groups: [gb, ge) of part p. The first ST-1 groups of weights are
  // requested before waiting on the kernel that writes x, so under programmatic dependent launch
  // they stream while that kernel finishes.
  const int p = z * KW + warp;
  pdl_launch_dependents();
  wp.run(rt0, (p * NG) / KS, ((p + 1) * NG) / KS, true);

  if constexpr (KS > 1) {
    // The KS partial sums in part order (part q: block q / KW, warp q % KW), through this
    // block's shared memory (ZS = 1) or the cluster's distributed shared memory (ZS > 1); warp
    // p of the row block finalises value slots v = p, p + KS, ... for its lane.
    namespace coop = cooperative_groups;
    __shared__ float red[KW][V][32];
#pragma unroll
    for (int v = 0; v < V; ++v) red[warp][v][lane] = wp.value(v);
    const float* rk[ZS];  // ZS > 1: each block's red, mapped into this one
    if constexpr (ZS > 1) {
      coop::cluster_group cl = coop::this_cluster();
      cl.sync();
#pragma unroll
      for (int q = 0; q < ZS; ++q) rk[q] = cl.map_shared_rank(&red[0][0][0], q);
    } else {
      __syncthreads();
    }
    // Part q's value slot v of this lane (ZS = 1: indexed in red itself, as ptxas schedules best).
    auto part = [&](int q, int v) {
      if constexpr (ZS > 1) return rk[q / KW][((q % KW) * V + v) * 32 + lane];
      else return red[q][v][lane];
    };
#pragma unroll 1
    for (int v = p; v < VS; v += KS) {
      float s = 0.f;
#pragma unroll
      for (int q = 0; q < KS; ++q) s += part(q, v);
      int n, r;
      gemv_out_index(v, NT, lane, rt0, r0, n, r);
      if constexpr (EPI == EPI_SWIGLU) {
        float u = 0.f;
#pragma unroll
        for (int q = 0; q < KS; ++q) u += part(q, v + VS);
        gemv_store_swiglu(y, ldy, n, r, N, R, s, u);
      } else {
        gemv_store<EPI>(y, ldy, n, r, N, R, s);
      }
    }
    if constexpr (ZS > 1) coop::this_cluster().sync();  // no block exits while another reads
  } else {
#pragma unroll
    for (int v = 0; v < VS; ++v) {
      int n, r;
      gemv_out_index(v, NT, lane, rt0, r0, n, r);
      if constexpr (EPI == EPI_SWIGLU)
        gemv_store_swiglu(y, ldy, n, r, N, R, wp.value(v), wp.value(v + VS));
      else
        gemv_store<EPI>(y, ldy, n, r, N, R, wp.value(v));
    }
  }
}

}  // namespace q38

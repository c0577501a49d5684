// common.cuh: helpers shared by every kernel header (bf16 conversion, warp reductions,
// activations, vector loads). No kernels here.
// Compiles alone: nvcc -arch=sm_90 -std=c++17 -cubin -x cu kernels/common.cuh -o /dev/null
#pragma once
#include <cuda_bf16.h>
#include <stdint.h>

namespace q38 {

typedef __nv_bfloat16 bf16;
typedef __nv_bfloat162 bf162;

__device__ __forceinline__ float to_f(bf16 v) { return __bfloat162float(v); }
__device__ __forceinline__ bf16 to_bf(float v) { return __float2bfloat16_rn(v); }
// Round an fp32 value to the nearest bf16 and back: where docs/MODEL.md §7 says HF stores bf16.
__device__ __forceinline__ float round_bf(float v) { return __bfloat162float(__float2bfloat16_rn(v)); }

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// Sum over a block of NT threads (NT a multiple of 32, at most 1024); every thread gets the sum.
// `scratch` holds at least NT/32 floats; the call contains the barriers it needs.
template <int NT>
__device__ __forceinline__ float block_sum(float v, float* scratch) {
  static_assert(NT % 32 == 0 && NT <= 1024, "block_sum: NT must be a multiple of 32");
  v = warp_sum(v);
  const int w = threadIdx.x >> 5, l = threadIdx.x & 31;
  __syncthreads();  // scratch may still be read by a previous call
  if (l == 0) scratch[w] = v;
  __syncthreads();
  float s = 0.f;
#pragma unroll
  for (int i = 0; i < NT / 32; ++i) s += scratch[i];
  return s;
}

__device__ __forceinline__ float sigmoidf_(float x) { return 1.f / (1.f + __expf(-x)); }
__device__ __forceinline__ float siluf_(float x) { return x / (1.f + __expf(-x)); }
// softplus with PyTorch's threshold: x for x > 20.
__device__ __forceinline__ float softplusf_(float x) { return x > 20.f ? x : log1pf(__expf(x)); }

// Programmatic dependent launch (docs/KERNELS.md). Every kernel of a step calls
// pdl_launch_dependents() first, so the next kernel's blocks may become resident while this one
// runs, and pdl_wait() before it reads anything an earlier kernel wrote or writes anything at all;
// only data no kernel of the same graph writes (weights; a layer's own state and conv ring from
// the previous replay) may be read before it (docs/KERNELS.md). Without the launch attribute both are no-ops.
__device__ __forceinline__ void pdl_launch_dependents() {
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
}
#ifdef Q38_TRACE
// The trace variant of a program (trace.cuh, `qwen38gen bench --trace`) notes when thread 0 of a
// block came out of the wait. No program that runs for results or is gated defines Q38_TRACE.
__device__ __forceinline__ unsigned long long globaltimer_ns() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}
__device__ __forceinline__ unsigned long long& trace_wait_ns() {
  __shared__ unsigned long long t;
  return t;
}
#endif
__device__ __forceinline__ void pdl_wait() {
  asm volatile("griddepcontrol.wait;" ::: "memory");
#ifdef Q38_TRACE
  if (threadIdx.x == 0 && threadIdx.y == 0 && threadIdx.z == 0) trace_wait_ns() = globaltimer_ns();
#endif
}

// 16 bytes written by an earlier kernel of the step (activations), a coherent load that stays
// after pdl_wait: under programmatic dependent launch that kernel may still be running when this
// one starts, and an __ldg (ld.global.nc, an invariant load to the compiler) may be hoisted above
// griddepcontrol.wait. That happened in wgmma_q4: the 64-row program failed `check` with PDL on
// and passed with QWEN38_PDL=0 (docs/PERFORMANCE.md, version 4).
__device__ __forceinline__ uint4 ld_after_wait16(const void* p) {
  uint4 v;
  asm volatile("ld.global.v4.u32 {%0,%1,%2,%3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p)
               : "memory");
  return v;
}

// 16-byte global load through the read-only path, in an asm volatile with a memory clobber so
// that the compiler keeps it after pdl_wait (the data may come from the previous kernel; see
// ld_after_wait16).
__device__ __forceinline__ uint4 ldg16(const void* p) {
  uint4 v;
  asm volatile("ld.global.nc.v4.u32 {%0,%1,%2,%3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p)
               : "memory");
  return v;
}

// cp.async: 16 bytes global -> shared, bypassing L1 (the weights, streamed once, and
// data read once per launch).
__device__ __forceinline__ void cp_async16(void* smem, const void* gmem) {
  const unsigned s = (unsigned)__cvta_generic_to_shared(smem);
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(s), "l"(gmem) : "memory");
}
// The same with a shared-memory address (as __cvta_generic_to_shared gives it).
__device__ __forceinline__ void cp_async16_s(unsigned smem, const void* gmem) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(smem), "l"(gmem) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
template <int N>
__device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory"); }

// mbarriers in shared memory (addresses as __cvta_generic_to_shared gives them): a ring's stages
// handed between a producer and consumers without block barriers (wgmma_sk_q4).
__device__ __forceinline__ void mbar_init(unsigned a, int count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(a), "r"(count) : "memory");
}
__device__ __forceinline__ void mbar_arrive(unsigned a) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(a) : "memory");
}
// Arrives and expects `bytes` more of transactions (bulk copies counted on this barrier).
__device__ __forceinline__ void mbar_arrive_tx(unsigned a, unsigned bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(a), "r"(bytes) : "memory");
}
// Arrives once this thread's earlier cp.async copies have landed (counted in the init count).
__device__ __forceinline__ void mbar_arrive_cp(unsigned a) {
  asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];" ::"r"(a) : "memory");
}
// Waits until the phase of parity `parity` has completed.
__device__ __forceinline__ void mbar_wait(unsigned a, unsigned parity) {
  asm volatile(
      "{\n.reg .pred p;\nW: mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n@!p bra W;\n}" ::"r"(a),
      "r"(parity)
      : "memory");
}
// `bytes` (a multiple of 16, both ends 16-byte aligned) global -> shared by the bulk-copy
// engine, counted on barrier `bar` as transaction bytes.
__device__ __forceinline__ void bulk_copy_g2s(unsigned dst, const void* src, unsigned bytes, unsigned bar) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
               ::"r"(dst), "l"(src), "r"(bytes), "r"(bar) : "memory");
}

}  // namespace q38

namespace q38 {

// wgmma_q4's activation tile order (XT = 1; docs/FORMAT.md, "Activation tiles"): an [R, K] bf16
// matrix cut into blocks of 8·NT rows and groups of 128 columns; tile (rb, g) is 2048·NT
// contiguous bytes, the group's B operand exactly as wgmma_q4 reads it from shared memory.
// Word t (columns 2t, 2t+1) of the 16-byte chunk at column 128·gi + 64·h + 16·j + 8·ih of row
// r goes to k-step 4h + 2ih + t/2, half t%2, core row n8 of n-block nb, word j. So the four
// chunks j = 0..3 of one (gi, h, ih) fill four whole 16-byte core rows, one per t: this stores
// them (chunk j in v[j]).
// The 16-byte core row of row r in group gi, k-step ks (0..7), half hf (0, 1) of that order.
template <int NT>
__device__ __forceinline__ char* xtile_row(bf16* base, int K, int r, int gi, int ks, int hf) {
  constexpr int btg = 8 * NT;
  const int rb = r / btg, n = r % btg;
  return reinterpret_cast<char*>(base) + ((size_t)rb * (K >> 7) + gi) * (2048 * NT) +
         (ks * NT + (n >> 3)) * 256 + hf * 128 + (n & 7) * 16;
}
template <int NT>
__device__ __forceinline__ void xtile_store(bf16* base, int K, int r, int gi, int h, int ih,
                                            const uint4 (&v)[4]) {
  char* t = xtile_row<NT>(base, K, r, gi, 4 * h + 2 * ih, 0);
  *reinterpret_cast<uint4*>(t) = make_uint4(v[0].x, v[1].x, v[2].x, v[3].x);                 // t = 0
  *reinterpret_cast<uint4*>(t + 128) = make_uint4(v[0].y, v[1].y, v[2].y, v[3].y);           // t = 1
  *reinterpret_cast<uint4*>(t + NT * 256) = make_uint4(v[0].z, v[1].z, v[2].z, v[3].z);      // t = 2
  *reinterpret_cast<uint4*>(t + NT * 256 + 128) = make_uint4(v[0].w, v[1].w, v[2].w, v[3].w);
}

// Element c of row r of an [R, K] activation matrix: row-major at stride K (NT = 0), or in the
// tile order above (column c = 128·gi + 64·h + 16·j + 8·ih + 2·t + e: k-step 4h + 2ih + t/2,
// half t%2, word j, bf16 e of the word). Columns 2i and 2i + 1 are neighbours in both orders,
// so a bf16x2 store at an even c is right in either. For the producers of a GEMV's input that
// write element by element (the GDN's and attention's outputs feeding the out projection).
template <int NT>
__device__ __forceinline__ bf16* act_at(bf16* base, int K, int r, int c) {
  if constexpr (NT == 0) {
    return base + (size_t)r * K + c;
  } else {
    const int e = c & 63;
    return reinterpret_cast<bf16*>(xtile_row<NT>(base, K, r, c >> 7, 4 * ((c >> 6) & 1) + (e >> 2 & 3),
                                                 e >> 1 & 1) + 4 * (e >> 4)) + (e & 1);
  }
}

// Eight bf16 (one 16-byte vector, element 0 in the low half of .x) -> fp32, exactly.
__device__ __forceinline__ void unpack_bf16x8(const uint4& v, float (&f)[8]) {
  const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    f[2 * i] = __uint_as_float(w[i] << 16);
    f[2 * i + 1] = __uint_as_float(w[i] & 0xffff0000u);
  }
}

// Eight fp32 -> eight bf16 (round to nearest even) in one 16-byte vector, element 0 lowest.
__device__ __forceinline__ uint4 pack_bf16x8(const float (&f)[8]) {
  uint32_t w[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const bf162 h = __floats2bfloat162_rn(f[2 * i], f[2 * i + 1]);  // .x = low half
    w[i] = *reinterpret_cast<const uint32_t*>(&h);
  }
  return make_uint4(w[0], w[1], w[2], w[3]);
}

}  // namespace q38

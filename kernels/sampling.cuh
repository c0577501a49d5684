// sampling.cuh: one token per row of logits, greedy or sampled, by the rule that
// qwen38gen/sampling.py states and computes (the numpy twin is the spec; on bf16 logits the two
// agree bit for bit: float32 steps rounded to nearest without FMA, then integer arithmetic).
//
//   sample_rows  tok[r] = sampling.sample(l[r], params of row r, ctr[r])
//                l     bf16 [R, V]   logits (finite)
//                fpar  fp32 [R, 2]   temperature, min_p
//                upar  u32  [R, 4]   top_k as int32 (-1 or 0: off), top_p in units of 2^-24
//                                    (SamplingParams.top_p_q24; 2^24: off), seed mod 2^32, seed >> 32
//                ctr   int32 [R]     position of the token being chosen (the Philox counter)
//                -> tok int32 [R]
//                A greedy row (temperature < 1e-5) gets argmax l[r] with ties to the smaller
//                index, as argmax_rows (elementwise.cuh) gives it.
//   sample_rows<V, SPLIT, 1>  speculative sampling on the device (qwen38gen/spec_sampling.py,
//                one-hot drafts): the rows of a verify pass, r = b·KP + j, the parameters those
//                of slot b (fpar/upar row b), the position of row j's token ctr[b] + 1 + j (ctr
//                = the slot's pos before the pass). Row j < KP−1 judges draft d = vtok[r + 1]:
//                acc[r] = 1 iff floor(U(…, ACCEPT) · W' / 2^64) < w_d (p(d) = w_d / W'), and if
//                not, tok[r] = the draw from the weights with w_d set to 0, by U(…, RESIDUAL);
//                row KP−1 draws as sample_rows does (the bonus token). Greedy slots' rows are
//                left alone (spec_accept_sampled takes their argmax).
//
// One block per row, no sorting: passes over the row (0.5 MB at V = 248320: it stays in L2).
//   1  max and argmax; a greedy row stops here.
//   2  top_k: tau_k by a radix select over bf16's order-preserving 16-bit keys (high byte, then
//      low byte of the candidates in that bin; 256 shared counters).
//   3  weights w = floor(e · 2^32) of the candidates summed per high byte (exact integer sums by
//      shared atomics, 64-bit or, SPLIT = 1, two 32-bit ones with a carry, so the order of the
//      adds does not matter): W, and with top_p the same select
//      over weight sums finds the nucleus edge (a 4th pass for the low byte).
//   4  the draw, r = floor(U · W' / 2^64): each warp sums its contiguous slice of the row, and
//      the warp whose slice holds r scans it 32 vectors at a time to the token.
// Launch: SampleLaunch<V>: grid R, block 1024, static shared memory only. V % 8 == 0.
//
// Compiles alone:
//   nvcc -arch=sm_90 -std=c++17 -cubin -Xptxas -v -x cu kernels/sampling.cuh -o /dev/null
#pragma once
#include "common.cuh"

namespace q38 {

template <int V>
struct SampleLaunch {
  static constexpr int threads = 1024;  // grid = R
};

// Philox4x32-10 (Salmon et al., SC 2011; Random123's round and key schedule).
__device__ __forceinline__ uint4 philox4x32_10(uint4 c, uint32_t k0, uint32_t k1) {
#pragma unroll
  for (int i = 0; i < 10; ++i) {
    if (i) { k0 += 0x9E3779B9u; k1 += 0xBB67AE85u; }
    const uint32_t hi0 = __umulhi(0xD2511F53u, c.x), lo0 = 0xD2511F53u * c.x;
    const uint32_t hi1 = __umulhi(0xCD9E8D57u, c.z), lo1 = 0xCD9E8D57u * c.z;
    c = make_uint4(hi1 ^ c.y ^ k0, lo1, hi0 ^ c.w ^ k1, lo0);
  }
  return c;
}

// 2^t for t <= 0 by the twin's recipe (sampling.exp2q): Horner over c0..c7 = ln2^j / j!, each
// product and sum rounded on its own (the _rn intrinsics keep nvcc from fusing them).
__device__ __forceinline__ float exp2q(float t) {
  if (!(t >= -32.f)) return 0.f;
  const float k = floorf(t);
  const float f = __fsub_rn(t, k);
  float q = 0x1.ffcbfcp-17f;
  q = __fadd_rn(__fmul_rn(q, f), 0x1.430912p-13f);
  q = __fadd_rn(__fmul_rn(q, f), 0x1.5d87fep-10f);
  q = __fadd_rn(__fmul_rn(q, f), 0x1.3b2ab6p-7f);
  q = __fadd_rn(__fmul_rn(q, f), 0x1.c6b08ep-5f);
  q = __fadd_rn(__fmul_rn(q, f), 0x1.ebfbep-3f);
  q = __fadd_rn(__fmul_rn(q, f), 0x1.62e43p-1f);
  q = __fadd_rn(__fmul_rn(q, f), 0x1p+0f);
  return __fmul_rn(q, __int_as_float((127 + (int)k) << 23));  // · 2^k, exact for k >= -32
}

// bf16 bits -> a key whose unsigned order is the values' order; -0 and +0 share one key.
__device__ __forceinline__ uint32_t bf16_key(uint32_t b) {
  b = b == 0x8000u ? 0u : b;
  return b & 0x8000u ? (~b & 0xffffu) : (b | 0x8000u);
}

// The rule's per-token quantities for one row (sampling.weights, sampling.survivors).
struct SampleRow {
  float m, t, min_p;   // max logit, temperature, min_p
  uint32_t kk, kp;     // keys of tau_k and of the nucleus edge (0: no bound)
  // w if the token is still in (a candidate with key >= kp), else 0; key out.
  __device__ __forceinline__ unsigned long long weight(uint32_t bits, uint32_t& key) const {
    key = bf16_key(bits);
    const float x = __uint_as_float(bits << 16);
    const float d = __fdiv_rn(__fsub_rn(x, m), t);
    const float e = exp2q(__fmul_rn(d, 0x1.715476p+0f));
    if (!(e >= min_p) || key < kk || key < kp) return 0ull;
    return __float2ull_rz(__fmul_rn(e, 4294967296.f));  // floor(e · 2^32), exact product
  }
};

// 16-byte vector v of a row: the 8 bf16 bit patterns, element 0 first.
__device__ __forceinline__ void bf16_bits8(const uint4& v, uint32_t (&b)[8]) {
  const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) { b[2 * i] = w[i] & 0xffffu; b[2 * i + 1] = w[i] >> 16; }
}

// Warp 0 over hist[256] (lane l sums bins 8l..8l+7): the largest bin b with
// sum_{b' >= b} hist[b'] >= need, and that sum less hist[b] (what lies above b). Every caller
// guarantees the total reaches need. Result in out[0] (bin) and out[1] (above).
__device__ __forceinline__ void suffix_select(const unsigned long long* hist,
                                              unsigned long long need,
                                              unsigned long long* out) {
  const int lane = threadIdx.x & 31;
  unsigned long long s = 0;
#pragma unroll
  for (int j = 0; j < 8; ++j) s += hist[8 * lane + j];
  unsigned long long tail = s;  // sum over lanes >= lane
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const unsigned long long u = __shfl_down_sync(0xffffffffu, tail, o);
    if (lane + o < 32) tail += u;
  }
  const unsigned mask = __ballot_sync(0xffffffffu, tail >= need);
  const int L = mask ? 31 - __clz(mask) : 0;
  if (lane == L) {
    unsigned long long acc = tail - s;
    int b = 8 * L + 7;
    for (; b > 8 * L; --b) {
      if (acc + hist[b] >= need) break;
      acc += hist[b];
    }
    out[0] = (unsigned long long)b;
    out[1] = acc;
  }
}

// a into the 64-bit sum hi:lo by 32-bit shared atomics (native; a 64-bit shared atomicAdd is a
// compare-and-swap loop, which a row's few hot bins may turn into milliseconds: version 27). a <=
// 2^32: its low word is added to lo, and the thread whose add wrapped lo carries one into hi,
// so hi·2^32 + lo is the exact sum in any order. Used where SPLIT = 1 (Tuning.sample_split).
__device__ __forceinline__ void add_u64_split(uint32_t* lo, uint32_t* hi, unsigned long long a) {
  const uint32_t al = (uint32_t)a;
  uint32_t c = (uint32_t)(a >> 32);
  if (al) {
    const uint32_t old = atomicAdd(lo, al);
    c += old + al < old ? 1u : 0u;
  }
  if (c) atomicAdd(hi, c);
}

// hist[256] over a row: amount(bits, key) of each element (its key out) added at the key's high
// byte (level 0), or, among the keys whose high byte is hi, at its low byte (level 1); zero
// amounts are skipped. Integer sums, so the order of the adds does not matter: 64-bit shared
// atomics into hist (SPLIT = 0), or add_u64_split into the 32-bit halves part[0..511], then
// joined into hist (SPLIT = 1); the same integers either way. The top_k count (amount 1) and
// the candidate weights (SampleRow::weight) both build theirs here.
template <int NT, int NV, int SPLIT, typename Amount>
__device__ __forceinline__ void key_histogram(const uint4* __restrict__ row,
                                              unsigned long long* hist, uint32_t* part, int level,
                                              uint32_t hi, Amount amount) {
  if constexpr (SPLIT) {
    for (int i = threadIdx.x; i < 512; i += NT) part[i] = 0u;
  } else {
    for (int i = threadIdx.x; i < 256; i += NT) hist[i] = 0ull;
  }
  __syncthreads();
  for (int v = threadIdx.x; v < NV; v += NT) {
    uint32_t b[8];
    bf16_bits8(ldg16(row + v), b);
#pragma unroll
    for (int e = 0; e < 8; ++e) {
      uint32_t k;
      const unsigned long long a = amount(b[e], k);
      if (a == 0ull) continue;
      if constexpr (SPLIT) {
        if (level == 0) add_u64_split(part + (k >> 8), part + 256 + (k >> 8), a);
        else if ((k >> 8) == hi) add_u64_split(part + (k & 255u), part + 256 + (k & 255u), a);
      } else {
        if (level == 0) atomicAdd(&hist[k >> 8], a);
        else if ((k >> 8) == hi) atomicAdd(&hist[k & 255u], a);
      }
    }
  }
  __syncthreads();
  if constexpr (SPLIT) {
    for (int i = threadIdx.x; i < 256; i += NT)
      hist[i] = ((unsigned long long)part[256 + i] << 32) | part[i];
    __syncthreads();
  }
}

template <int V, int SPLIT = 0, int SPEC = 0>
__device__ __forceinline__ void sample_rows(const bf16* __restrict__ logits,
                                            const float* __restrict__ fpar,
                                            const uint32_t* __restrict__ upar,
                                            const int* __restrict__ ctr, int* __restrict__ tok,
                                            const int* __restrict__ vtok = nullptr, int kp = 1,
                                            int* __restrict__ acc = nullptr) {
  constexpr int NT = SampleLaunch<V>::threads, NW = NT / 32, NV = V / 8;
  constexpr int NVW = (NV + NW - 1) / NW;  // vectors per warp slice in the draw
  static_assert(V % 8 == 0, "sample_rows: V must be a multiple of 8");
  __shared__ unsigned long long hist[256];
  __shared__ uint32_t part[SPLIT ? 512 : 1];  // key_histogram's 32-bit halves (SPLIT)
  __shared__ unsigned long long sel[2];
  __shared__ unsigned long long wsum[NW];
  __shared__ float sv[NW];
  __shared__ int si[NW];
  const int r = blockIdx.x, lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const uint4* row = reinterpret_cast<const uint4*>(logits + (size_t)r * V);
  // SPEC: the parameters' row (the slot's), the row's position and draft (none: -1).
  const int pr = SPEC ? r / kp : r;
  int pos_r = 0, draft = -1;
  if constexpr (SPEC) {
    if (!(fpar[2 * pr] >= 1e-5f)) return;  // a greedy slot: spec_accept_sampled takes argmax
    pos_r = ctr[pr] + 1 + r % kp;
    if (r % kp < kp - 1) draft = vtok[r + 1];
  }

  // 1. max and argmax: each thread walks its indices upward, strict > keeps the first maximum.
  float bv = -INFINITY;
  int bi = 0;
  for (int v = threadIdx.x; v < NV; v += NT) {
    uint32_t b[8];
    bf16_bits8(ldg16(row + v), b);
#pragma unroll
    for (int e = 0; e < 8; ++e) {
      const float x = __uint_as_float(b[e] << 16);
      if (x > bv) { bv = x; bi = 8 * v + e; }
    }
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const float ov = __shfl_xor_sync(0xffffffffu, bv, o);
    const int oi = __shfl_xor_sync(0xffffffffu, bi, o);
    if (ov > bv || (ov == bv && oi < bi)) { bv = ov; bi = oi; }
  }
  if (lane == 0) { sv[warp] = bv; si[warp] = bi; }
  __syncthreads();
  bv = sv[0];
  bi = si[0];
  for (int w = 1; w < NW; ++w)
    if (sv[w] > bv || (sv[w] == bv && si[w] < bi)) { bv = sv[w]; bi = si[w]; }
  SampleRow R{bv, fpar[2 * pr], fpar[2 * pr + 1], 0u, 0u};
  if (!(R.t >= 1e-5f)) {
    if (threadIdx.x == 0) tok[r] = bi;
    return;
  }
  const int top_k = (int)upar[4 * pr];
  const uint32_t q24 = upar[4 * pr + 1];

  // 2. top_k: the key of the k-th largest logit, high byte then low byte.
  if (top_k >= 1 && top_k < V) {
    unsigned long long need = (unsigned long long)top_k;
    for (int level = 0; level < 2; ++level) {
      const uint32_t hi = level ? (uint32_t)sel[0] : 0u;
      key_histogram<NT, NV, SPLIT>(row, hist, part, level, hi, [](uint32_t bits, uint32_t& k) {
        k = bf16_key(bits);
        return 1ull;
      });
      if (warp == 0) suffix_select(hist, need, sel);
      __syncthreads();
      if (level == 0) need -= sel[1];
      else R.kk = (hi << 8) | (uint32_t)sel[0];
      __syncthreads();
    }
  }

  // 3. candidate weights per high byte: W; with top_p the nucleus edge's key.
  unsigned long long total = 0;  // W' (valid in every thread after the loop)
  const bool nucleus = q24 < (1u << 24);
  unsigned long long need = 0, above = 0;
  for (int level = 0; level < (nucleus ? 2 : 1); ++level) {
    const uint32_t hi = level ? (uint32_t)sel[0] : 0u;
    key_histogram<NT, NV, SPLIT>(row, hist, part, level, hi,
                          [&R](uint32_t bits, uint32_t& k) { return R.weight(bits, k); });
    if (level == 0) {
      if (warp == 0) {
        unsigned long long s = 0;
#pragma unroll
        for (int j = 0; j < 8; ++j) s += hist[8 * lane + j];
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
        if (lane == 0) sel[1] = s;
      }
      __syncthreads();
      total = sel[1];
      if (!nucleus) break;
      // P = ceil(q24 · W / 2^24), 128-bit: q24 · W < 2^74.
      const unsigned long long lo = (unsigned long long)q24 * total;
      unsigned long long hi2 = __umul64hi((unsigned long long)q24, total);
      const unsigned long long lo2 = lo + ((1ull << 24) - 1);
      hi2 += lo2 < lo;
      need = (hi2 << 40) | (lo2 >> 24);
      __syncthreads();
    }
    if (warp == 0) suffix_select(hist, need, sel);
    __syncthreads();
    if (level == 0) {
      above = sel[1];
      need -= above;
    } else {
      R.kp = (hi << 8) | (uint32_t)sel[0];
      total = above + sel[1] + hist[sel[0]];  // weight of the keys >= kp: W'
    }
    __syncthreads();
  }

  // SPEC, a draft's row: accept d with probability w_d / W'; else draw from the rest (w_d = 0).
  uint32_t purpose = 0u;
  if constexpr (SPEC) {
    if (draft >= 0) {
      uint32_t kd;
      const uint32_t bits = reinterpret_cast<const uint16_t*>(logits + (size_t)r * V)[draft];
      const unsigned long long wd = R.weight(bits, kd);
      const uint4 ua = philox4x32_10(make_uint4((uint32_t)pos_r, 1u, 0u, 0u), upar[4 * pr + 2],
                                     upar[4 * pr + 3]);
      const bool ok = __umul64hi(((unsigned long long)ua.y << 32) | ua.x, total) < wd;
      if (threadIdx.x == 0) acc[r] = ok ? 1 : 0;
      if (ok) return;
      total -= wd;  // > 0: W' = w_d would have accepted
      purpose = 2u;
    }
  }

  // 4. the draw: r = floor(U · W' / 2^64); the first index whose running weight exceeds r.
  const uint4 u = SPEC ? philox4x32_10(make_uint4((uint32_t)pos_r, purpose, 0u, 0u),
                                       upar[4 * pr + 2], upar[4 * pr + 3])
                       : philox4x32_10(make_uint4((uint32_t)ctr[r], 0u, 0u, 0u), upar[4 * r + 2],
                                       upar[4 * r + 3]);
  unsigned long long target = __umul64hi(((unsigned long long)u.y << 32) | u.x, total);
  const int v0 = warp * NVW, v1 = min(v0 + NVW, NV);
  unsigned long long s = 0;
  for (int v = v0 + lane; v < v1; v += 32) {
    uint32_t b[8], k;
    bf16_bits8(ldg16(row + v), b);
#pragma unroll
    for (int e = 0; e < 8; ++e) {
      if constexpr (SPEC) {
        if (8 * v + e == draft) continue;  // the rejected draft's weight is 0 here
      }
      s += R.weight(b[e], k);
    }
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
  if (lane == 0) wsum[warp] = s;
  __syncthreads();
  // The warp whose slice holds the target: the first whose running sum over warps exceeds it.
  unsigned long long run = lane < NW ? wsum[lane] : 0ull;
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const unsigned long long t = __shfl_up_sync(0xffffffffu, run, o);
    if (lane >= o) run += t;
  }
  const unsigned hit = __ballot_sync(0xffffffffu, run > target);
  const int tw = hit ? __ffs(hit) - 1 : NW - 1;
  if (warp != tw) return;
  target -= __shfl_sync(0xffffffffu, run, tw) - wsum[tw];
  for (int base = v0; base < v1; base += 32) {
    const int v = base + lane;
    unsigned long long w8[8];
    unsigned long long ws = 0;
    if (v < v1) {
      uint32_t b[8], k;
      bf16_bits8(ldg16(row + v), b);
#pragma unroll
      for (int e = 0; e < 8; ++e) {
        w8[e] = R.weight(b[e], k);
        if constexpr (SPEC) {
          if (8 * v + e == draft) w8[e] = 0ull;
        }
        ws += w8[e];
      }
    } else {
#pragma unroll
      for (int e = 0; e < 8; ++e) w8[e] = 0ull;
    }
    unsigned long long inc = ws;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
      const unsigned long long t = __shfl_up_sync(0xffffffffu, inc, o);
      if (lane >= o) inc += t;
    }
    const unsigned in = __ballot_sync(0xffffffffu, inc > target);
    if (in) {
      if (lane == __ffs(in) - 1) {
        unsigned long long acc = inc - ws;
        int pick = 7;
        bool found = false;
#pragma unroll
        for (int e = 0; e < 8; ++e) {  // the first element whose running sum passes the target
          acc += w8[e];
          if (!found && acc > target) { pick = e; found = true; }
        }
        tok[r] = 8 * v + pick;
      }
      return;
    }
    target -= __shfl_sync(0xffffffffu, inc, 31);
  }
}

}  // namespace q38

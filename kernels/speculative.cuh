// speculative.cuh: the bookkeeping kernels of the mtp lane (greedy speculative decoding with the
// MTP drafter, docs/MODEL.md §8.2–8.3). All int32, one thread per sequence (or row); no shared memory.
//
// A verify pass runs KP = drafts + 1 rows per sequence b: vtok[b·KP + 0] = x (the token the target
// has not yet processed), vtok[b·KP + j] = d_j (j = 1 … drafts), at positions pos[b] … pos[b]+drafts;
// its argmax per row is a[b·KP + j] = a_j.
//
//   spec_accept<KP>  n = number of leading j ≥ 1 with d_j == a_{j−1} (greedy acceptance);
//                    emit[b, 0..KP) = a_0 … a_n, then −1;  count[b] = n + 1;
//                    slot[b] = n (the GDN state slot after token n, gdn.cuh EACH = 1);
//                    ntok_m[b] = n + 1 (the MTP rows that are real);  vtok[b·KP] = a_n (the next
//                    verify's first token; d_1 … are written by the drafter). A sequence that
//                    idled in the pass (ntok[b] = 0: no rows, no state written) keeps slot[b] and
//                    vtok[b·KP]: emit all −1, count[b] = ntok_m[b] = 0 (its MTP rows idle and its
//                    position does not move). grid ceil(B/128).
//   spec_accept_sampled<KP>  spec_accept where slots may sample (Tuning.spec_sample): a slot
//                    whose temperature (fpar[2b]) is ≥ 1e-5 keeps its drafts while sacc[b·KP + j]
//                    (sampling.cuh, SPEC = 1) says so, then the token stok[b·KP + n] (the residual
//                    draw, or the bonus draw when all K are kept); its kept tokens also go to
//                    vnext[b·KP + t] (the MTP rows' tokens). Greedy slots as spec_accept.
//   spec_tokens<PT>  the MTP token rows of a prefill chunk: mtok[r] = mnext[r] if mnext[r] ≥ 0,
//                    else next[r / PT] (the target's freshly sampled token; next[rowseq[r]] in a
//                    packed chunk). mnext is host-supplied (the prompt token after row r; −1 on a
//                    prompt's last row). grid ceil(R/128).
//   spec_pos         mpos[b] = pos[b] + off; one[b] = 1 (position and row count of a one-row MTP
//                    draft step). grid ceil(B/128).
//   spec_put         dst[b·stride + j] = src[b] (a draft into its verify row). grid ceil(B/128).
//
// Launch (SpecLaunch): block 128 threads, grid as above.
//
// Compiles alone:
//   nvcc -arch=sm_90 -std=c++17 -cubin -Xptxas -v -x cu kernels/speculative.cuh -o /dev/null
#pragma once
#include "common.cuh"

namespace q38 {

struct SpecLaunch {
  static constexpr int threads = 128;
};

template <int KP>
__device__ __forceinline__ void spec_accept(int* __restrict__ vtok, const int* __restrict__ a,
                                            const int* __restrict__ ntok, int* __restrict__ emit,
                                            int* __restrict__ count, int* __restrict__ slot,
                                            int* __restrict__ ntok_m, int B) {
  static_assert(KP >= 2, "spec_accept: at least one draft");
  const int b = blockIdx.x * SpecLaunch::threads + threadIdx.x;
  if (b >= B) return;
  if (ntok[b] <= 0) {  // idled in the pass: nothing kept, nothing moves
#pragma unroll
    for (int j = 0; j < KP; ++j) emit[(size_t)b * KP + j] = -1;
    count[b] = 0;
    ntok_m[b] = 0;
    return;
  }
  int* const d = vtok + (size_t)b * KP;
  const int* const ab = a + (size_t)b * KP;
  int n = 0;
  while (n < KP - 1 && d[n + 1] == ab[n]) ++n;
#pragma unroll
  for (int j = 0; j < KP; ++j) emit[(size_t)b * KP + j] = j <= n ? ab[j] : -1;
  count[b] = n + 1;
  slot[b] = n;
  ntok_m[b] = n + 1;
  d[0] = ab[n];
}

template <int KP>
__device__ __forceinline__ void spec_accept_sampled(
    int* __restrict__ vtok, int* __restrict__ a, const int* __restrict__ ntok,
    const int* __restrict__ sacc, const int* __restrict__ stok, const float* __restrict__ fpar,
    int* __restrict__ emit, int* __restrict__ count, int* __restrict__ slot,
    int* __restrict__ ntok_m, int B) {
  static_assert(KP >= 2, "spec_accept_sampled: at least one draft");
  const int b = blockIdx.x * SpecLaunch::threads + threadIdx.x;
  if (b >= B) return;
  if (!(fpar[2 * b] >= 1e-5f) || ntok[b] <= 0) {  // greedy, or idled: spec_accept's rules
    spec_accept<KP>(vtok, a, ntok, emit, count, slot, ntok_m, B);
    return;
  }
  int* const d = vtok + (size_t)b * KP;
  int n = 0;
  while (n < KP - 1 && sacc[(size_t)b * KP + n] == 1) ++n;
#pragma unroll
  for (int j = 0; j < KP; ++j) {
    const int t = j < n ? d[j + 1] : j == n ? stok[(size_t)b * KP + n] : -1;
    emit[(size_t)b * KP + j] = t;
    if (j <= n) a[(size_t)b * KP + j] = t;
  }
  count[b] = n + 1;
  slot[b] = n;
  ntok_m[b] = n + 1;
  d[0] = stok[(size_t)b * KP + n];
}

template <int PT>
__device__ __forceinline__ void spec_tokens(const int* __restrict__ mnext,
                                            const int* __restrict__ next, int* __restrict__ mtok,
                                            int R, const int* __restrict__ rowseq = nullptr) {
  const int r = blockIdx.x * SpecLaunch::threads + threadIdx.x;
  if (r >= R) return;
  const int t = mnext[r];
  // A packed chunk's row r belongs to sequence rowseq[r]; mnext is 0 on rows past the
  // sequences' (rowseq −1), so next is read only for a sequence's last row.
  mtok[r] = t >= 0 ? t : next[rowseq ? rowseq[r] : r / PT];
}

__device__ __forceinline__ void spec_pos(const int* __restrict__ pos, int off,
                                         int* __restrict__ mpos, int* __restrict__ one, int B) {
  const int b = blockIdx.x * SpecLaunch::threads + threadIdx.x;
  if (b >= B) return;
  mpos[b] = pos[b] + off;
  one[b] = 1;
}

__device__ __forceinline__ void spec_put(int* __restrict__ dst, const int* __restrict__ src, int j,
                                         int stride, int B) {
  const int b = blockIdx.x * SpecLaunch::threads + threadIdx.x;
  if (b >= B) return;
  dst[(size_t)b * stride + j] = src[b];
}

}  // namespace q38

// rows.cuh: per-sequence bookkeeping between the layers and the sampler.
//
// gather_last: y[b, :] = x[b*PT + ntok[b] - 1, :], the last real row of each sequence's chunk
//   (its hidden state is the one whose logits pick the next token). x bf16 [B*PT, H], y bf16 [B, H].
//   A sequence with ntok[b] = 0 (idle this chunk) copies its row 0; its logits are ignored.
//   row0 int32 [B] or null: a packed chunk (docs/KERNELS.md "Packed chunks"): sequence b's rows
//   start at row0[b] instead of b*PT.
//   Launch: grid B, block 128, no smem.
//
// Compiles alone:
//   nvcc -arch=sm_90 -std=c++17 -cubin -Xptxas -v -x cu kernels/rows.cuh -o /dev/null
#pragma once
#include "common.cuh"

namespace q38 {

template <int H, int PT>
__device__ __forceinline__ void gather_last(const bf16* __restrict__ x, const int* __restrict__ ntok,
                                            bf16* __restrict__ y,
                                            const int* __restrict__ row0 = nullptr) {
  static_assert(H % 8 == 0, "gather_last: H must be a multiple of 8");
  const int b = blockIdx.x;
  const int t = ntok[b] > 0 ? ntok[b] - 1 : 0;
  const size_t first = row0 != nullptr ? (size_t)row0[b] : (size_t)b * PT;
  const uint4* src = reinterpret_cast<const uint4*>(x + (first + t) * H);
  uint4* dst = reinterpret_cast<uint4*>(y + (size_t)b * H);
  for (int i = threadIdx.x; i < H / 8; i += blockDim.x) dst[i] = src[i];
}

}  // namespace q38

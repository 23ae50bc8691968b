// Device code of ApplyTokenMasks (see token_mask.h for the contract).
//
// Grid: (num_rows, word groups); block: kThreads, one mask word a thread:
// a word of all ones (the common case: most of the vocabulary allowed, or
// an unconstrained row) costs one load; otherwise the word's clear bits set
// their ids to -inf.
#pragma once

#include <cmath>
#include <cstdint>

#include "kernels/cuda/sampling/token_mask.h"

namespace kvserve::cuda::token_mask_detail {

inline constexpr int kThreads = 256;

__global__ void __launch_bounds__(kThreads) TokenMaskKernel(const TokenMaskParams p) {
  const int64_t words = TokenMaskWords(p.vocab);
  const int64_t w = int64_t(blockIdx.y) * kThreads + threadIdx.x;
  if (w >= words) return;
  const int64_t row = blockIdx.x;
  const uint32_t bits = p.masks[row * words + w];
  if (bits == 0xffffffffu) return;
  float* l = p.logits + row * p.vocab + w * 32;
  const int n = static_cast<int>(min(int64_t{32}, int64_t{p.vocab} - w * 32));
  for (int i = 0; i < n; ++i) {
    if (!((bits >> i) & 1u)) l[i] = -INFINITY;
  }
}

}  // namespace kvserve::cuda::token_mask_detail

// Device code of the embedding lookup (see embedding.h for the contract).
//
// Algorithm: one thread block per token copies its row as raw words, 16
// bytes at a time when the launcher has proved the row bytes, the table and
// out 16-byte aligned, else 2 bytes at a time (every dtype is a multiple of
// 2 bytes). The copy is dtype-blind, so there is one instantiation; only
// the NaN pattern of an invalid id depends on the dtype.
//
// Grid: (num_tokens). Block: (kThreads).
#pragma once

#include <cstdint>

#include "kernels/cuda/layers/embedding.h"

namespace kvserve::cuda::embedding_detail {

inline constexpr int kThreads = 256;

__global__ void __launch_bounds__(kThreads)
    EmbeddingKernel(const EmbeddingParams p, const int64_t elem_bytes, const bool vectorized) {
  const int64_t t = blockIdx.x;
  const int32_t id = p.ids[t];
  const int64_t row_bytes = p.dim * elem_bytes;
  uint8_t* dst = static_cast<uint8_t*>(p.out) + t * p.out_stride * elem_bytes;
  if (id < 0 || id >= p.vocab) {
    // Quiet NaN of the dtype, as 16-bit halves: fp32 0x7fc00000 (little
    // endian: 0x0000, 0x7fc0), fp16 0x7e00, bf16 0x7fc0.
    const bool fp16 = p.dtype == ActDtype::kFp16;
    for (int64_t i = threadIdx.x; i < row_bytes / 2; i += kThreads) {
      uint16_t v = fp16 ? 0x7e00 : 0x7fc0;
      if (elem_bytes == 4 && i % 2 == 0) v = 0;
      reinterpret_cast<uint16_t*>(dst)[i] = v;
    }
    return;
  }
  const uint8_t* src = static_cast<const uint8_t*>(p.table) + id * row_bytes;
  if (vectorized) {
    for (int64_t i = threadIdx.x; i < row_bytes / 16; i += kThreads) {
      reinterpret_cast<uint4*>(dst)[i] = reinterpret_cast<const uint4*>(src)[i];
    }
  } else {
    for (int64_t i = threadIdx.x; i < row_bytes / 2; i += kThreads) {
      reinterpret_cast<uint16_t*>(dst)[i] = reinterpret_cast<const uint16_t*>(src)[i];
    }
  }
}

}  // namespace kvserve::cuda::embedding_detail

// Device code of CopyBlocks (see copy_blocks.h for the contract).
//
// Algorithm: one thread block per (copy, layer) pair copies that layer's
// block_bytes with 16-byte loads and stores, four in flight per thread
// (enough outstanding requests to keep PCIe busy when one side is mapped
// host memory). Pairs with an id outside its pool are skipped.
//
// Grid: (num_copies, num_layers). Block: (kThreads).
#pragma once

#include <cstdint>

#include "kernels/cuda/kv/copy_blocks.h"

namespace kvserve::cuda::copy_blocks_detail {

inline constexpr int kThreads = 256;
inline constexpr int kUnroll = 4;

__global__ void __launch_bounds__(kThreads) CopyBlocksKernel(const CopyBlocksParams p) {
  const int2 c = reinterpret_cast<const int2*>(p.copies)[blockIdx.x];  // {src, dst}
  if (c.x < 0 || c.x >= p.src_num_blocks || c.y < 0 || c.y >= p.dst_num_blocks) return;
  const int64_t layer = blockIdx.y;
  const uint4* src =
      reinterpret_cast<const uint4*>(p.src + (layer * p.src_num_blocks + c.x) * p.block_bytes);
  uint4* dst = reinterpret_cast<uint4*>(p.dst + (layer * p.dst_num_blocks + c.y) * p.block_bytes);
  const int64_t n = p.block_bytes / 16;
  for (int64_t base = threadIdx.x; base < n; base += kThreads * kUnroll) {
    uint4 v[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t i = base + u * kThreads;
      if (i < n) v[u] = src[i];
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t i = base + u * kThreads;
      if (i < n) dst[i] = v[u];
    }
  }
}

}  // namespace kvserve::cuda::copy_blocks_detail

// Device code of RoPE (see rope.h for the contract).
//
// Algorithm: one thread block per token; each thread rotates (head, j)
// pairs of that token, q heads first, then k heads, reading cos/sin of the
// token's position from the table (or from the token's own row past the
// table). Each pair is read and written by one
// thread only, so the update in place needs no barrier.
//
// Grid: (num_tokens). Block: (kThreads).
#pragma once

#include <cstdint>

#include "kernels/cuda/device/act_convert.cuh"
#include "kernels/cuda/device/exact_math.cuh"
#include "kernels/cuda/layers/rope.h"

namespace kvserve::cuda::rope_detail {

inline constexpr int kThreads = 256;

template <typename T>
__device__ __forceinline__ void RotatePair(T* head, int a, int b, float c, float s) {
  using namespace exact;
  const float v0 = ToFloat(head[a]), v1 = ToFloat(head[b]);
  head[a] = FromFloat<T>(Sub(Mul(v0, c), Mul(v1, s)));
  head[b] = FromFloat<T>(Add(Mul(v0, s), Mul(v1, c)));
}

template <typename T>
__global__ void __launch_bounds__(kThreads) RopeKernel(const RopeParams p) {
  const int64_t t = blockIdx.x;
  const int half = p.head_dim / 2;
  const int32_t pos = p.positions[t];
  const bool in_table = pos >= 0 && pos < p.max_positions;
  const bool past = pos >= p.max_positions && p.row_cos != nullptr;  // host-computed row t
  const bool valid = in_table || past;
  const float* cos_row =
      past ? p.row_cos + t * half : p.cos + static_cast<int64_t>(in_table ? pos : 0) * half;
  const float* sin_row =
      past ? p.row_sin + t * half : p.sin + static_cast<int64_t>(in_table ? pos : 0) * half;
  const int q_heads = p.q != nullptr ? p.num_q_heads : 0;
  const int k_heads = p.k != nullptr ? p.num_kv_heads : 0;
  const int pairs = (q_heads + k_heads) * half;
  for (int i = threadIdx.x; i < pairs; i += kThreads) {
    const int h = i / half, j = i % half;
    T* head = h < q_heads
                  ? static_cast<T*>(p.q) + t * p.q_stride + static_cast<int64_t>(h) * p.head_dim
                  : static_cast<T*>(p.k) + t * p.k_stride +
                        static_cast<int64_t>(h - q_heads) * p.head_dim;
    const int a = p.style == RopeStyle::kInterleaved ? 2 * j : j;
    const int b = p.style == RopeStyle::kInterleaved ? 2 * j + 1 : j + half;
    if (!valid) {
      head[a] = head[b] = FromFloat<T>(exact::FloatOf(0x7fc00000u));
      continue;
    }
    RotatePair(head, a, b, cos_row[j], sin_row[j]);
  }
}

}  // namespace kvserve::cuda::rope_detail

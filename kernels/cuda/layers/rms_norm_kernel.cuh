// Device code of RMSNorm (see rms_norm.h for the contract).
//
// Algorithm: one thread block per row, two passes over the row.
//   1. Each thread loads its elements (16-byte vectors when the launcher has
//      proved every row and the weight 16-byte aligned and dim a multiple of
//      the vector width, else one element at a time); in the fused form it
//      adds the residual, rounds to the storage type and stores x back; it
//      accumulates the sum of squares in fp32. A block reduction (warp
//      shuffles, then every warp folds the per-warp partials) gives each
//      thread the row's total without a second barrier.
//   2. Each thread re-reads the same elements (now in L1/L2), multiplies by
//      rsqrt(mean + eps) and the weight in fp32 and stores out, rounded once.
// A thread touches the same indices in both passes, which is what makes
// out == residual (and out == x when not fused) safe.
//
// Grid: (num_tokens), or (num_tokens * heads) in the per-head form (block b:
// token b / heads, head b % heads, one division per block). Block:
// (threads), a multiple of 32, at most 1024.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "kernels/cuda/device/act_convert.cuh"
#include "kernels/cuda/layers/rms_norm.h"

namespace kvserve::cuda::rms_norm_detail {

// 16 bytes of T: one vector load or store.
template <typename T>
struct alignas(16) Pack {
  static constexpr int kSize = 16 / sizeof(T);
  T v[kSize];
};

// Sum over the block; every thread gets the total. blockDim.x % 32 == 0.
__device__ __forceinline__ float BlockSum(float v) {
  __shared__ float partial[32];
  for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (lane == 0) partial[warp] = v;
  __syncthreads();
  v = lane < static_cast<int>(blockDim.x / 32) ? partial[lane] : 0.0f;
  for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}

// Both passes over one row for elements of type E (T or Pack<T>).
template <typename T, bool kFused, typename E>
__device__ __forceinline__ void NormalizeRow(E* x, const E* residual, const E* weight, E* out,
                                             int64_t n, int64_t dim, float eps) {
  constexpr int kWidth = sizeof(E) / sizeof(T);
  auto lanes = [](auto& e) -> auto* { return reinterpret_cast<T*>(&e); };
  float sum_sq = 0.0f;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
    E a = x[i];
    if constexpr (kFused) {
      const E r = residual[i];
      for (int j = 0; j < kWidth; ++j) {
        lanes(a)[j] =
            FromFloat<T>(ToFloat(lanes(a)[j]) + ToFloat(reinterpret_cast<const T*>(&r)[j]));
      }
      x[i] = a;
    }
    for (int j = 0; j < kWidth; ++j) {
      const float f = ToFloat(lanes(a)[j]);
      sum_sq += f * f;
    }
  }
  const float inv_rms = rsqrtf(BlockSum(sum_sq) / static_cast<float>(dim) + eps);
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
    E a = x[i];
    const E w = weight[i];
    for (int j = 0; j < kWidth; ++j) {
      lanes(a)[j] =
          FromFloat<T>(ToFloat(lanes(a)[j]) * inv_rms * ToFloat(reinterpret_cast<const T*>(&w)[j]));
    }
    out[i] = a;
  }
}

template <typename T, bool kFused>
__global__ void RmsNormKernel(const RmsNormParams p, const bool vectorized) {
  int64_t row = blockIdx.x, head = 0;
  if (p.heads > 0) {
    row = static_cast<int64_t>(blockIdx.x) / p.heads;
    head = static_cast<int64_t>(blockIdx.x) - row * p.heads;
  }
  T* x = static_cast<T*>(p.x) + row * p.x_stride + head * p.dim;
  const T* residual =
      kFused ? static_cast<const T*>(p.residual) + row * p.residual_stride : nullptr;
  const T* weight = static_cast<const T*>(
      p.heads > 0 && head >= p.weight2_from && p.weight2 != nullptr ? p.weight2 : p.weight);
  T* out = static_cast<T*>(p.out) + row * p.out_stride + head * p.dim;
  if (vectorized) {
    using V = Pack<T>;
    NormalizeRow<T, kFused>(reinterpret_cast<V*>(x), reinterpret_cast<const V*>(residual),
                            reinterpret_cast<const V*>(weight), reinterpret_cast<V*>(out),
                            p.dim / V::kSize, p.dim, p.eps);
  } else {
    NormalizeRow<T, kFused>(x, residual, weight, out, p.dim, p.dim, p.eps);
  }
}

}  // namespace kvserve::cuda::rms_norm_detail

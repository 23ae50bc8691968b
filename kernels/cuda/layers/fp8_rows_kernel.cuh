// Device code of QuantizeRowsFp8 (see fp8_rows.h for the contract).
//
// Algorithm: one thread block per row, two passes. 1. Each thread takes the
// max of |x| over its strided elements (a NaN compares false and is
// skipped), then the block folds the maxima (warp shuffles, then the
// per-warp values): a max of non-negative values is exact in any order. 2.
// Each thread divides its elements by the scale (a division, as the host
// quantizer does, never a multiply by 1 / scale), encodes them and writes
// the padding's zeros; thread 0 writes the scale.
//
// Grid: (rows). Block: (threads), a multiple of 32, at most 1024.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "kernels/cuda/device/act_convert.cuh"
#include "kernels/cuda/device/exact_math.cuh"
#include "kernels/cuda/device/kv_encode.cuh"
#include "kernels/cuda/layers/fp8_rows.h"

namespace kvserve::cuda::fp8_rows_detail {

// Max over the block of non-negative values; every thread gets it.
__device__ __forceinline__ float BlockMax(float v) {
  __shared__ float partial[32];
  for (int offset = 16; offset > 0; offset >>= 1) {
    const float o = __shfl_xor_sync(0xffffffffu, v, offset);
    v = o > v ? o : v;
  }
  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (lane == 0) partial[warp] = v;
  __syncthreads();
  v = lane < static_cast<int>(blockDim.x / 32) ? partial[lane] : 0.0f;
  for (int offset = 16; offset > 0; offset >>= 1) {
    const float o = __shfl_xor_sync(0xffffffffu, v, offset);
    v = o > v ? o : v;
  }
  return v;
}

template <typename T>
__global__ void QuantizeRowsFp8Kernel(const Fp8RowsParams p) {
  using namespace exact;
  const int64_t row = blockIdx.x;
  const T* x = static_cast<const T*>(p.x) + row * p.ldx;
  uint8_t* q = p.q + row * p.ldq;
  float amax = 0.0f;
  for (int64_t c = threadIdx.x; c < p.cols; c += blockDim.x) {
    const float a = Abs(ToFloat(x[c]));
    if (a > amax) amax = a;
  }
  amax = BlockMax(amax);
  const float scale = Div(amax, kv_encode::kFp8E4m3Max);
  const bool zero = !(scale > 0.0f) || !IsFinite(scale);
  for (int64_t c = threadIdx.x; c < p.ldq; c += blockDim.x) {
    q[c] = zero || c >= p.cols ? uint8_t{0} : kv_encode::FloatToFp8E4m3(Div(ToFloat(x[c]), scale));
  }
  if (threadIdx.x == 0) p.scale[row] = zero ? 0.0f : scale;
}

}  // namespace kvserve::cuda::fp8_rows_detail

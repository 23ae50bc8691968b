// Device side of FillWeights (weight_init.h). Grid-stride loop, one element
// per thread per iteration.
// Grid: (min(ceil(n / 256), 65535 * 8)), block 256.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "kernels/cuda/device/act_convert.cuh"
#include "kernels/cuda/layers/weight_init.h"
#include "kernels/random_weights.h"

namespace kvserve::cuda::weight_init_detail {

template <typename T>
__global__ void FillWeightsKernel(WeightFillParams p) {
  T* dst = static_cast<T*>(p.dst);
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < p.n;
       i += stride) {
    float v;
    switch (p.source) {
      case WeightSource::kFp32:
        v = p.src[i];
        break;
      case WeightSource::kDummy:
        v = DummyWeight(p.dummy_key, static_cast<uint64_t>(p.dummy_index + i));
        break;
      default:
        v = 1.0f;
        break;
    }
    dst[i] = FromFloat<T>(v);
  }
}

}  // namespace kvserve::cuda::weight_init_detail

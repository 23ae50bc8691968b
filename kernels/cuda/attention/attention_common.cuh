// Device helpers shared by the paged attention kernels (the per-token
// formats' in paged_attention_kernel.cuh, int4_kc's in
// paged_attention_kc_kernel.cuh): activation loads and stores in the step's
// dtype, warp reductions, and the attention plan's header.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "kernels/cuda/device/act_convert.cuh"
#include "kernels/cuda/device/act_dtype.h"
#include "kernels/plan/gpu_attention_plan.h"

namespace kvserve::cuda::attention_common {

// Element i of q, K/V rows or sink queries as fp32: act_convert.cuh's
// runtime-dtype load, under the name the attention kernels use.
__device__ __forceinline__ float LoadAct(const void* base, ActDtype dtype, int64_t i) {
  return LoadAsFloat(base, dtype, i);
}

__device__ __forceinline__ void StoreAct(void* base, ActDtype dtype, int64_t i, float v) {
  switch (dtype) {
    case ActDtype::kFp16:
      static_cast<__half*>(base)[i] = __float2half_rn(v);
      break;
    case ActDtype::kBf16:
      static_cast<__nv_bfloat16*>(base)[i] = __float2bfloat16_rn(v);
      break;
    default:
      static_cast<float*>(base)[i] = v;
      break;
  }
}

__device__ __forceinline__ float WarpMax(float v) {
  for (int offset = 16; offset > 0; offset >>= 1) {
    v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, offset));
  }
  return v;
}

__device__ __forceinline__ float WarpSum(float v) {
  for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}

__device__ __forceinline__ const GpuAttentionPlanHeader& PlanHeader(const int32_t* plan) {
  return *reinterpret_cast<const GpuAttentionPlanHeader*>(plan);
}

}  // namespace kvserve::cuda::attention_common

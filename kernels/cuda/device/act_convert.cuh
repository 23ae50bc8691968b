// Device conversions between the ActDtype storage types (float, __half,
// __nv_bfloat16) and the fp32 every kernel computes in, plus the host-side
// dispatch from a runtime ActDtype to a template argument. Loads are exact;
// stores round to nearest even once.
//
// Thread-safety: pure functions.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "kernels/cuda/device/act_dtype.h"

namespace kvserve::cuda {

template <typename T>
__device__ __forceinline__ float ToFloat(T v);
template <>
__device__ __forceinline__ float ToFloat<float>(float v) {
  return v;
}
template <>
__device__ __forceinline__ float ToFloat<__half>(__half v) {
  return __half2float(v);
}
template <>
__device__ __forceinline__ float ToFloat<__nv_bfloat16>(__nv_bfloat16 v) {
  return __bfloat162float(v);
}

template <typename T>
__device__ __forceinline__ T FromFloat(float v);
template <>
__device__ __forceinline__ float FromFloat<float>(float v) {
  return v;
}
template <>
__device__ __forceinline__ __half FromFloat<__half>(float v) {
  return __float2half_rn(v);
}
template <>
__device__ __forceinline__ __nv_bfloat16 FromFloat<__nv_bfloat16>(float v) {
  return __float2bfloat16_rn(v);
}

// Element i of an ActDtype array as fp32, with the dtype known only at run
// time (for kernels that read a few values and want one instantiation).
__device__ __forceinline__ float LoadAsFloat(const void* base, ActDtype dtype, int64_t i) {
  switch (dtype) {
    case ActDtype::kFp16:
      return __half2float(static_cast<const __half*>(base)[i]);
    case ActDtype::kBf16:
      return __bfloat162float(static_cast<const __nv_bfloat16*>(base)[i]);
    default:
      return static_cast<const float*>(base)[i];
  }
}

// Calls f(T{}) with T the storage type of `dtype`; false for an unknown dtype.
template <typename F>
bool DispatchActDtype(ActDtype dtype, F&& f) {
  switch (dtype) {
    case ActDtype::kFp32:
      f(float{});
      return true;
    case ActDtype::kFp16:
      f(__half{});
      return true;
    case ActDtype::kBf16:
      f(__nv_bfloat16{});
      return true;
  }
  return false;
}

}  // namespace kvserve::cuda

// Device code of SwiGLU (see swiglu.h for the contract).
//
// Algorithm: a two-dimensional grid-stride loop, tokens over blockIdx.y and
// channels over blockIdx.x * kThreads + threadIdx.x, one element per thread
// per step, so no element pays for a 64-bit division or modulo (the flat
// index's / hidden and % hidden); SiluMulExact transcribes the CPU's AVX2
// lane code (kernels/cpu/layers/ops.cc Exp8 / SiluMul8) with exact_math.cuh's
// rounding.
//
// Grid: (min(ceil(hidden / kThreads), kMaxBlocksX), min(num_tokens,
// kMaxBlocksY)). Block: (kThreads).
#pragma once

#include <cstdint>

#include "kernels/cuda/device/act_convert.cuh"
#include "kernels/cuda/device/exact_math.cuh"
#include "kernels/cuda/layers/swiglu.h"

namespace kvserve::cuda::swiglu_detail {

inline constexpr int kThreads = 256;
inline constexpr int kMaxBlocksX = 65535;
inline constexpr int kMaxBlocksY = 65535;  // the device's grid.y limit

// _mm256_max_ps(a, b) / _mm256_min_ps(a, b): the second operand unless the
// first is strictly larger / smaller (so NaN in a gives b).
__device__ __forceinline__ float MaxPs(float a, float b) { return a > b ? a : b; }
__device__ __forceinline__ float MinPs(float a, float b) { return a < b ? a : b; }

// cpu Exp8, one lane.
__device__ __forceinline__ float Exp(float x) {
  using namespace exact;
  x = MinPs(MaxPs(x, -87.3f), 88.7f);
  const float n = rintf(Mul(x, 1.44269504088896341f));  // round to nearest even
  float r = Fma(-n, 0.693359375f, x);                   // fnmadd
  r = Fma(-n, -2.12194440e-4f, r);
  float p = 1.9875691500e-4f;
  p = Fma(p, r, 1.3981999507e-3f);
  p = Fma(p, r, 8.3334519073e-3f);
  p = Fma(p, r, 4.1665795894e-2f);
  p = Fma(p, r, 1.6666665459e-1f);
  p = Fma(p, r, 5.0000001201e-1f);
  p = Fma(p, Mul(r, r), Add(r, 1.0f));
  const uint32_t e = static_cast<uint32_t>(static_cast<int32_t>(n) + 127) << 23;
  return Mul(p, FloatOf(e));
}

// cpu SiluMul8, one lane: g * (1 / (1 + e^(0 - g))) * u.
__device__ __forceinline__ float SiluMulExact(float g, float u) {
  using namespace exact;
  const float e = Exp(Sub(0.0f, g));
  return Mul(Mul(g, Div(1.0f, Add(1.0f, e))), u);
}

template <typename T>
__global__ void __launch_bounds__(kThreads) SwiGluKernel(const SwiGluParams p) {
  const T* gate_up = static_cast<const T*>(p.gate_up);
  T* out = static_cast<T*>(p.out);
  const int64_t c0 = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  const int64_t c_step = static_cast<int64_t>(gridDim.x) * kThreads;
  for (int64_t t = blockIdx.y; t < p.num_tokens; t += gridDim.y) {
    const T* row = gate_up + t * p.gate_up_stride;
    T* dst = out + t * p.out_stride;
    for (int64_t c = c0; c < p.hidden; c += c_step) {
      const float g = ToFloat(row[c]), u = ToFloat(row[p.hidden + c]);
      dst[c] = FromFloat<T>(SiluMulExact(g, u));
    }
  }
}

}  // namespace kvserve::cuda::swiglu_detail

// Float arithmetic that rounds exactly as written, on the device and on the
// host, so a CUDA kernel can reproduce a CPU kernel bit for bit.
//
// Why: nvcc contracts a * b + c into one fused multiply-add by default
// (--fmad=true), which rounds once where the CPU code (built without FMA)
// rounds twice. The __f*_rn intrinsics are never contracted and round to
// nearest even, as IEEE float operations on the host do. Division is the
// IEEE-rounded one (__fdiv_rn), never the approximate fast path.
// Kernels using these must not be built with --use_fast_math or -ftz=true
// (they are not: see CMakeLists.txt); subnormals are kept.
//
// This header compiles as plain C++ too (no CUDA headers): the host versions
// are ordinary operators, so host tests run the very code the kernels run.
// KV_HOST_DEVICE comes from cache/format/kv_layout.h.
//
// Thread-safety: pure functions.
#pragma once

#include <cstdint>
#include <cstring>

#include "cache/format/kv_layout.h"

namespace kvserve::cuda::exact {

KV_HOST_DEVICE inline uint32_t BitsOf(float x) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(x);
#else
  uint32_t u;
  std::memcpy(&u, &x, 4);
  return u;
#endif
}

KV_HOST_DEVICE inline float FloatOf(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float x;
  std::memcpy(&x, &u, 4);
  return x;
#endif
}

KV_HOST_DEVICE inline float Add(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fadd_rn(a, b);
#else
  return a + b;
#endif
}

KV_HOST_DEVICE inline float Sub(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fsub_rn(a, b);
#else
  return a - b;
#endif
}

KV_HOST_DEVICE inline float Mul(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fmul_rn(a, b);
#else
  return a * b;
#endif
}

KV_HOST_DEVICE inline float Div(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fdiv_rn(a, b);
#else
  return a / b;
#endif
}

// a * b + c rounded once (what _mm256_fmadd_ps computes).
KV_HOST_DEVICE inline float Fma(float a, float b, float c) {
#if defined(__CUDA_ARCH__)
  return __fmaf_rn(a, b, c);
#else
  return __builtin_fmaf(a, b, c);
#endif
}

KV_HOST_DEVICE inline bool IsNan(float x) { return (BitsOf(x) & 0x7fffffffu) > 0x7f800000u; }
KV_HOST_DEVICE inline bool IsFinite(float x) { return (BitsOf(x) & 0x7f800000u) != 0x7f800000u; }
KV_HOST_DEVICE inline float Abs(float x) { return FloatOf(BitsOf(x) & 0x7fffffffu); }

// Round to nearest, ties to even, exactly as kernels/cpu/kv/kv_quant.cc's
// RoundEven: add and subtract 1.5 * 2^23 (exact for |x| < 2^22, and the
// same operations, hence the same bits, beyond).
KV_HOST_DEVICE inline float RoundEven(float x) {
  constexpr float kMagic = 12582912.0f;
  return Sub(Add(x, kMagic), kMagic);
}

}  // namespace kvserve::cuda::exact

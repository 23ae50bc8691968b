// Internal to kernels/cpu/gemm*.cc: the reduction tree that fixes the bits of
// every Linear output, shared by the AVX2 and AVX-512 kernels, and the
// AVX-512 entry point.
//
// Every output element is eight FMA chains (lane j sums k = j, j + 8, ...
// in increasing k) reduced by one tree, ((l0 + l1) + (l2 + l3)) + ((l4 + l5)
// + (l6 + l7)). Both kernels compute exactly that, so they give the same bits
// and either may serve any row (gemm.h's batch invariance).
//
// Thread-safety: pure functions.
#pragma once

#include <cstdint>

#if defined(__x86_64__)
#include <immintrin.h>

#define KV_GEMM_AVX2_INLINE __attribute__((target("avx2,fma"), always_inline)) inline

namespace kvserve::cpu::internal {

// The tree for four accumulators: [sum a0, sum a1, sum a2, sum a3].
KV_GEMM_AVX2_INLINE __m128 Reduce4(__m256 a0, __m256 a1, __m256 a2, __m256 a3) {
  const __m256 h = _mm256_hadd_ps(_mm256_hadd_ps(a0, a1), _mm256_hadd_ps(a2, a3));
  return _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
}

// The same tree for eight accumulators at once: [sum a0 .. sum a7].
KV_GEMM_AVX2_INLINE __m256 Reduce8(const __m256* a) {
  const __m256 h0 = _mm256_hadd_ps(_mm256_hadd_ps(a[0], a[1]), _mm256_hadd_ps(a[2], a[3]));
  const __m256 h1 = _mm256_hadd_ps(_mm256_hadd_ps(a[4], a[5]), _mm256_hadd_ps(a[6], a[7]));
  return _mm256_add_ps(_mm256_permute2f128_ps(h0, h1, 0x20), _mm256_permute2f128_ps(h0, h1, 0x31));
}

// True when the CPU has what LinearAvx512 needs (AVX-512 F, DQ, VL).
bool CpuHasAvx512Gemm();

// gemm.h's Linear with 512-bit registers, for any number of rows (fastest
// from two rows up; one row is memory-bound and the AVX2 kernel is as fast).
// Call only when CpuHasAvx512Gemm().
void LinearAvx512(const float* x, int64_t rows, int64_t in, const float* w, int64_t out, float* y,
                  int64_t ldy, bool accumulate);

}  // namespace kvserve::cpu::internal

#endif  // __x86_64__

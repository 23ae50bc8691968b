// Internal to the CPU kernels: AVX2 horizontal reductions and the base-2
// exponential the attention kernels share. Include only from translation
// units that compile AVX2 code behind a runtime check (the functions carry
// the target attribute themselves).
//
// Thread-safety: pure functions.
#pragma once

#if defined(__x86_64__)
#include <immintrin.h>

#define KV_AVX2_INLINE __attribute__((target("avx2,fma,f16c"), always_inline)) inline

namespace kvserve::cpu::internal {

KV_AVX2_INLINE float HSum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

KV_AVX2_INLINE float HMax(__m256 v) {
  __m128 s = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_max_ps(s, _mm_movehl_ps(s, s));
  s = _mm_max_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// 2^x for x <= 0 (and -inf). Below -126 it returns 2^-126 instead of
// something smaller: a weight of 1e-38 next to the max's weight of 1 changes
// nothing, and it keeps every intermediate a normal float.
KV_AVX2_INLINE __m256 Exp2NonPositive(__m256 x) {
  x = _mm256_max_ps(x, _mm256_set1_ps(-126.0f));
  const __m256 n = _mm256_round_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m256 f = _mm256_sub_ps(x, n);  // [-0.5, 0.5], exact
  __m256 y = _mm256_set1_ps(1.327647245e-3f);
  y = _mm256_fmadd_ps(y, f, _mm256_set1_ps(9.675540961e-3f));
  y = _mm256_fmadd_ps(y, f, _mm256_set1_ps(5.550713092e-2f));
  y = _mm256_fmadd_ps(y, f, _mm256_set1_ps(2.402212024e-1f));
  y = _mm256_fmadd_ps(y, f, _mm256_set1_ps(6.931469440e-1f));
  y = _mm256_fmadd_ps(y, f, _mm256_set1_ps(1.000000119e+0f));
  const __m256i pow2n =
      _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_mul_ps(y, _mm256_castsi256_ps(pow2n));
}

}  // namespace kvserve::cpu::internal

#endif  // __x86_64__

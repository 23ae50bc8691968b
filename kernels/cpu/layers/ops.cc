#include "kernels/cpu/layers/ops.h"

#include <cmath>
#include <cstring>

#include "kernels/cpu/cpu_features.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace kvserve::cpu {

void Embedding(const float* table, const int32_t* ids, int64_t rows, int64_t dim, float* out) {
  for (int64_t t = 0; t < rows; ++t) {
    std::memcpy(out + t * dim, table + static_cast<int64_t>(ids[t]) * dim, dim * sizeof(float));
  }
}

void RmsNorm(const float* x, const float* weight, float* out, int64_t rows, int64_t dim,
             float eps) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * dim;
    float* o = out + r * dim;
    float ss = 0.0f;
    for (int64_t j = 0; j < dim; ++j) ss += xr[j] * xr[j];
    ss /= static_cast<float>(dim);
    ss += eps;
    ss = 1.0f / sqrtf(ss);
    for (int64_t j = 0; j < dim; ++j) o[j] = weight[j] * (ss * xr[j]);
  }
}

RopeTable::RopeTable(int max_positions, int head_dim, float theta)
    : max_positions_(max_positions), half_(head_dim / 2) {
  cos_.resize(static_cast<size_t>(max_positions) * half_);
  sin_.resize(cos_.size());
  for (int j = 0; j < half_; ++j) {
    // As run.c: freq = 1 / theta^(2j / head_dim), all in float.
    const float freq = 1.0f / powf(theta, static_cast<float>(2 * j) / static_cast<float>(head_dim));
    for (int pos = 0; pos < max_positions; ++pos) {
      const float val = static_cast<float>(pos) * freq;
      cos_[static_cast<size_t>(pos) * half_ + j] = cosf(val);
      sin_[static_cast<size_t>(pos) * half_ + j] = sinf(val);
    }
  }
}

RopeTable::RopeTable(int max_positions, const std::vector<float>& inv_freq)
    : max_positions_(max_positions), half_(static_cast<int>(inv_freq.size())) {
  cos_.resize(static_cast<size_t>(max_positions) * half_);
  sin_.resize(cos_.size());
  for (int j = 0; j < half_; ++j) {
    for (int pos = 0; pos < max_positions; ++pos) {
      const float val = static_cast<float>(pos) * inv_freq[j];
      cos_[static_cast<size_t>(pos) * half_ + j] = cosf(val);
      sin_[static_cast<size_t>(pos) * half_ + j] = sinf(val);
    }
  }
}

void AddBias(float* y, const float* bias, int64_t rows, int64_t dim) {
  for (int64_t r = 0; r < rows; ++r) {
    float* row = y + r * dim;
    for (int64_t i = 0; i < dim; ++i) row[i] += bias[i];
  }
}

void ApplyRope(float* vec, int num_heads, int head_dim, const float* cos, const float* sin,
               bool interleaved) {
  const int half = head_dim / 2;
  for (int h = 0; h < num_heads; ++h) {
    float* v = vec + static_cast<int64_t>(h) * head_dim;
    if (interleaved) {
      for (int j = 0; j < half; ++j) {
        const float v0 = v[2 * j], v1 = v[2 * j + 1];
        v[2 * j] = v0 * cos[j] - v1 * sin[j];
        v[2 * j + 1] = v0 * sin[j] + v1 * cos[j];
      }
    } else {
      for (int j = 0; j < half; ++j) {
        const float v0 = v[j], v1 = v[j + half];
        v[j] = v0 * cos[j] - v1 * sin[j];
        v[j + half] = v0 * sin[j] + v1 * cos[j];
      }
    }
  }
}

namespace {

void SiluMulScalar(float* gate, const float* up, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    float val = gate[i];
    val *= 1.0f / (1.0f + expf(-val));
    gate[i] = val * up[i];
  }
}

#if defined(__x86_64__)
#define KV_AVX2 __attribute__((target("avx2,fma")))

// e^x for 8 floats: x = n ln2 + r with |r| <= ln2/2 (ln2 split in two for an
// exact product), a degree-6 polynomial for e^r (the Cephes expf
// coefficients, about 1 ulp), and 2^n built in the exponent bits. Inputs are
// clamped to where e^x is a finite normal float.
KV_AVX2 inline __m256 Exp8(__m256 x) {
  x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(-87.3f)), _mm256_set1_ps(88.7f));
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
  __m256 p = _mm256_set1_ps(1.9875691500e-4f);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
  p = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
  const __m256i e =
      _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_mul_ps(p, _mm256_castsi256_ps(e));
}

KV_AVX2 inline __m256 SiluMul8(__m256 g, __m256 u) {
  const __m256 one = _mm256_set1_ps(1.0f);
  const __m256 e = Exp8(_mm256_sub_ps(_mm256_setzero_ps(), g));
  return _mm256_mul_ps(_mm256_mul_ps(g, _mm256_div_ps(one, _mm256_add_ps(one, e))), u);
}

KV_AVX2 void SiluMulAvx2(float* gate, const float* up, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    _mm256_storeu_ps(gate + i, SiluMul8(_mm256_loadu_ps(gate + i), _mm256_loadu_ps(up + i)));
  }
  if (i < n) {
    // The tail goes through the same vector code, so an element's value does
    // not depend on where the array starts (batch invariance).
    float g[8] = {0}, u[8] = {0};
    std::memcpy(g, gate + i, (n - i) * sizeof(float));
    std::memcpy(u, up + i, (n - i) * sizeof(float));
    _mm256_storeu_ps(g, SiluMul8(_mm256_loadu_ps(g), _mm256_loadu_ps(u)));
    std::memcpy(gate + i, g, (n - i) * sizeof(float));
  }
}
#endif

}  // namespace

void SiluMul(float* gate, const float* up, int64_t n) {
#if defined(__x86_64__)
  if (DefaultCpuIsa() == CpuIsa::kAvx2) {
    SiluMulAvx2(gate, up, n);
    return;
  }
#endif
  SiluMulScalar(gate, up, n);
}

}  // namespace kvserve::cpu

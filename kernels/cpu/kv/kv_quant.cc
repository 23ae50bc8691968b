#include "kernels/cpu/kv/kv_quant.h"

#include <array>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "kernels/cpu/kv/kv_quant_internal.h"

namespace kvserve::cpu {
namespace {

uint32_t BitsOf(float x) {
  uint32_t u;
  std::memcpy(&u, &x, 4);
  return u;
}

float FloatOf(uint32_t u) {
  float x;
  std::memcpy(&x, &u, 4);
  return x;
}

// Clamps to +-limit; NaN stays NaN.
float Saturate(float x, float limit) {
  if (x > limit) return limit;
  if (x < -limit) return -limit;
  return x;
}

using internal::ClampF;
using internal::RoundEven;

float Int8Code(float x, float scale) {
  return ClampF(RoundEven(ClampF(x / scale, -256.0f, 256.0f)), -kInt8Max, kInt8Max);
}

// Decoding table for E4M3FN, built at compile time (so it is ready before
// any static initializer could use it).
constexpr std::array<float, 256> MakeFp8Table() {
  std::array<float, 256> t{};
  for (int b = 0; b < 256; ++b) {
    const int e = (b >> 3) & 0xf, m = b & 7;
    float v = 0.0f;
    if (e == 15 && m == 7) {
      v = std::numeric_limits<float>::quiet_NaN();
    } else if (e == 0) {
      v = static_cast<float>(m) / 512.0f;  // m * 2^-9
    } else {
      v = static_cast<float>(8 + m) / 1024.0f;  // (1 + m/8) * 2^(e-7)
      for (int i = 0; i < e; ++i) v *= 2.0f;
    }
    t[b] = (b & 0x80) ? -v : v;
  }
  return t;
}

constexpr std::array<float, 256> kFp8Table = MakeFp8Table();

float RowAbsMax(const float* x, int n) {
  float amax = 0.0f;
  for (int i = 0; i < n; ++i) {
    const float a = std::fabs(x[i]);
    amax = a > amax ? a : amax;
  }
  return amax;
}

// ---- scalar row codecs ------------------------------------------------------

void QuantizeFp16Scalar(const float* x, int n, uint8_t* data) {
  for (int i = 0; i < n; ++i) {
    const uint16_t h = FloatToFp16(Saturate(x[i], kFp16Max));
    std::memcpy(data + 2 * i, &h, 2);
  }
}

void QuantizeBf16Scalar(const float* x, int n, uint8_t* data) {
  for (int i = 0; i < n; ++i) {
    const uint16_t h = FloatToBf16(x[i]);
    std::memcpy(data + 2 * i, &h, 2);
  }
}

void QuantizeInt8Scalar(const float* x, int n, uint8_t* data, uint8_t* meta) {
  float scale = RowAbsMax(x, n) / kInt8Max;
  if (!(scale > 0.0f) || !std::isfinite(scale)) {
    scale = 0.0f;
    std::memset(data, 0, n);
  } else {
    for (int i = 0; i < n; ++i) {
      data[i] = static_cast<uint8_t>(static_cast<int8_t>(Int8Code(x[i], scale)));
    }
  }
  std::memcpy(meta, &scale, 4);
}

// fp8 scale candidates: amax / 448 and amax / 448 * sqrt(2). E4M3's error is
// relative, so where a row's values fall between representable ones decides
// it; keeping the better of two offsets per row cuts the perplexity cost of
// an fp8 cache on stories260K from +1.06% to +0.66% (more candidates gain
// little: four give the same). A larger scale never overflows.
constexpr float kFp8ScaleSteps[2] = {1.0f, 1.41421356f};

// Sum of 8 lane partial sums, in the order the AVX2 code reduces a vector,
// so both paths compare candidate errors bit for bit.
float SumLanes(const float lanes[8]) {
  return ((lanes[0] + lanes[4]) + (lanes[2] + lanes[6])) +
         ((lanes[1] + lanes[5]) + (lanes[3] + lanes[7]));
}

void QuantizeFp8Scalar(const float* x, int n, uint8_t* data, uint8_t* meta) {
  const float base = RowAbsMax(x, n) / kFp8E4m3Max;
  if (!(base > 0.0f) || !std::isfinite(base)) {
    const float zero = 0.0f;
    std::memset(data, 0, n);
    std::memcpy(meta, &zero, 4);
    return;
  }
  float scale = base, best = INFINITY;
  for (float step : kFp8ScaleSteps) {
    const float s = base * step;
    float lanes[8] = {};
    for (int i = 0; i < n; ++i) {
      const float d = Fp8E4m3ToFloat(FloatToFp8E4m3(x[i] / s)) * s - x[i];
      lanes[i % 8] += d * d;
    }
    const float err = SumLanes(lanes);
    if (err < best) {
      best = err;
      scale = s;
    }
  }
  for (int i = 0; i < n; ++i) data[i] = FloatToFp8E4m3(x[i] / scale);
  std::memcpy(meta, &scale, 4);
}

// bits 4 (int4) or 2 (int2_kc's V): codes in [0, KvCodeLevels(bits)], 8 / bits
// to a byte, the lowest channel in the lowest bits.
void QuantizeInt4Scalar(const float* x, int n, int group, int bits, uint8_t* data, uint8_t* meta) {
  const int levels = KvCodeLevels(bits), per = 8 / bits;
  for (int g0 = 0; g0 < n; g0 += group) {
    float mn = x[g0], mx = x[g0];
    for (int i = g0 + 1; i < g0 + group; ++i) {
      mn = x[i] < mn ? x[i] : mn;
      mx = x[i] > mx ? x[i] : mx;
    }
    // Which of +0 and -0 a min or max keeps depends on the order it saw
    // them in, which the AVX2 reduction does not share: both paths store +0.
    mn += 0.0f;
    mx += 0.0f;
    const uint16_t scale_h =
        FloatToFp16(Saturate((mx - mn) / static_cast<float>(levels), kFp16Max));
    const uint16_t zero_h = FloatToFp16(Saturate(mn, kFp16Max));
    // Quantize against the values a reader will decode, not the exact ones.
    const float scale = Fp16ToFloat(scale_h), zero = Fp16ToFloat(zero_h);
    for (int i = g0; i < g0 + group; i += per) {
      uint32_t byte = 0;
      if (scale > 0.0f) {
        for (int k = 0; k < per; ++k) {
          const float c = RoundEven((x[i + k] - zero) / scale);
          byte |= static_cast<uint32_t>(ClampF(c, 0.0f, static_cast<float>(levels))) << (k * bits);
        }
      }
      data[i / per] = static_cast<uint8_t>(byte);
    }
    const uint16_t pair[2] = {scale_h, zero_h};
    std::memcpy(meta + (g0 / group) * 4, pair, 4);
  }
}

// ---- AVX2 row codecs (bit-identical to the scalar ones) ---------------------

#if defined(__x86_64__)
#define KV_AVX2 __attribute__((target("avx2,fma,f16c")))

KV_AVX2 void QuantizeFp16Avx2(const float* x, int n, uint8_t* data) {
  const __m256 hi = _mm256_set1_ps(kFp16Max), lo = _mm256_set1_ps(-kFp16Max);
  int i = 0;
  for (; i + 8 <= n; i += 8) {
    // Constant first: min/max return the second operand for NaN, keeping it.
    __m256 v = _mm256_max_ps(lo, _mm256_min_ps(hi, _mm256_loadu_ps(x + i)));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(data + 2 * i),
                     _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  }
  QuantizeFp16Scalar(x + i, n - i, data + 2 * i);
}

KV_AVX2 void QuantizeBf16Avx2(const float* x, int n, uint8_t* data) {
  const __m256i round = _mm256_set1_epi32(0x7fff), one = _mm256_set1_epi32(1),
                quiet = _mm256_set1_epi32(0x40);
  int i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 v = _mm256_loadu_ps(x + i);
    const __m256i u = _mm256_castps_si256(v);
    const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), one);
    const __m256i rounded =
        _mm256_srli_epi32(_mm256_add_epi32(_mm256_add_epi32(u, round), lsb), 16);
    const __m256i nan = _mm256_or_si256(_mm256_srli_epi32(u, 16), quiet);
    const __m256i is_nan = _mm256_castps_si256(_mm256_cmp_ps(v, v, _CMP_UNORD_Q));
    const __m256i r = _mm256_blendv_epi8(rounded, nan, is_nan);
    const __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(r, r), 0xd8);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(data + 2 * i), _mm256_castsi256_si128(packed));
  }
  QuantizeBf16Scalar(x + i, n - i, data + 2 * i);
}

KV_AVX2 void QuantizeInt8Avx2(const float* x, int n, uint8_t* data, uint8_t* meta) {
  if (n % 8 != 0) return QuantizeInt8Scalar(x, n, data, meta);
  const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
  __m256 vmax = _mm256_setzero_ps();
  for (int i = 0; i < n; i += 8) {
    vmax = _mm256_max_ps(vmax, _mm256_and_ps(_mm256_loadu_ps(x + i), abs_mask));
  }
  __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(vmax), _mm256_extractf128_ps(vmax, 1));
  m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
  m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
  float scale = _mm_cvtss_f32(m4) / kInt8Max;
  if (!(scale > 0.0f) || !std::isfinite(scale)) return QuantizeInt8Scalar(x, n, data, meta);
  const __m256 vs = _mm256_set1_ps(scale);
  const __m256i qmax = _mm256_set1_epi32(127), qmin = _mm256_set1_epi32(-127);
  for (int i = 0; i < n; i += 8) {
    // cvtps rounds to nearest even under the default MXCSR, like nearbyint.
    __m256i q = _mm256_cvtps_epi32(_mm256_div_ps(_mm256_loadu_ps(x + i), vs));
    q = _mm256_max_epi32(_mm256_min_epi32(q, qmax), qmin);
    const __m128i q16 = _mm_packs_epi32(_mm256_castsi256_si128(q), _mm256_extracti128_si256(q, 1));
    _mm_storel_epi64(reinterpret_cast<__m128i*>(data + i), _mm_packs_epi16(q16, q16));
  }
  std::memcpy(meta, &scale, 4);
}

// Largest |x[i]| of a row whose length is a multiple of 8 (exact: max is
// order-independent).
KV_AVX2 float AbsMaxAvx2(const float* x, int n) {
  const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
  __m256 vmax = _mm256_setzero_ps();
  for (int i = 0; i < n; i += 8) {
    vmax = _mm256_max_ps(vmax, _mm256_and_ps(_mm256_loadu_ps(x + i), abs_mask));
  }
  __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(vmax), _mm256_extractf128_ps(vmax, 1));
  m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
  m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
  return _mm_cvtss_f32(m4);
}

// Low byte of each 32-bit lane -> 8 bytes.
KV_AVX2 void StoreLowBytes(__m256i v, uint8_t* dst) {
  const __m256i b = _mm256_packus_epi16(_mm256_packus_epi32(v, v), v);
  const __m128i lo = _mm256_castsi256_si128(b), hi = _mm256_extracti128_si256(b, 1);
  _mm_storel_epi64(reinterpret_cast<__m128i*>(dst), _mm_unpacklo_epi32(lo, hi));
}

// FloatToFp8E4m3 on 8 lanes, the same steps without branches.
KV_AVX2 __m256i Fp8CodesAvx2(__m256 y) {
  const __m256i ybits = _mm256_castps_si256(y);
  const __m256i sign = _mm256_and_si256(_mm256_srli_epi32(ybits, 24), _mm256_set1_epi32(0x80));
  const __m256 a = _mm256_and_ps(y, _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff)));
  const __m256i abits = _mm256_castps_si256(a);
  const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(abits, 20), _mm256_set1_epi32(1));
  const __m256i normal = _mm256_sub_epi32(
      _mm256_srli_epi32(_mm256_add_epi32(_mm256_add_epi32(abits, _mm256_set1_epi32(0x7ffff)), lsb),
                        20),
      _mm256_set1_epi32(120 << 3));
  const __m256i sub = _mm256_cvtps_epi32(_mm256_mul_ps(a, _mm256_set1_ps(512.0f)));
  const __m256 is_sub = _mm256_cmp_ps(a, _mm256_set1_ps(0.015625f), _CMP_LT_OQ);
  __m256i code = _mm256_blendv_epi8(normal, sub, _mm256_castps_si256(is_sub));
  const __m256 is_sat = _mm256_cmp_ps(a, _mm256_set1_ps(kFp8E4m3Max), _CMP_NLT_UQ);
  code = _mm256_blendv_epi8(code, _mm256_set1_epi32(0x7e), _mm256_castps_si256(is_sat));
  code = _mm256_or_si256(code, sign);
  const __m256 is_nan = _mm256_cmp_ps(y, y, _CMP_UNORD_Q);
  return _mm256_blendv_epi8(code, _mm256_set1_epi32(0x7f), _mm256_castps_si256(is_nan));
}

// Fp8E4m3ToFloat on 8 code lanes, exactly.
KV_AVX2 __m256 Fp8ValuesAvx2(__m256i codes) {
  const __m256i em = _mm256_and_si256(codes, _mm256_set1_epi32(0x7f));
  const __m256i sign = _mm256_slli_epi32(_mm256_and_si256(codes, _mm256_set1_epi32(0x80)), 24);
  const __m256 normal = _mm256_castsi256_ps(
      _mm256_add_epi32(_mm256_slli_epi32(em, 20), _mm256_set1_epi32(120 << 23)));
  const __m256 sub = _mm256_mul_ps(_mm256_cvtepi32_ps(em), _mm256_set1_ps(1.0f / 512.0f));
  const __m256 is_sub = _mm256_castsi256_ps(_mm256_cmpgt_epi32(_mm256_set1_epi32(8), em));
  return _mm256_or_ps(_mm256_blendv_ps(normal, sub, is_sub), _mm256_castsi256_ps(sign));
}

KV_AVX2 void QuantizeFp8Avx2(const float* x, int n, uint8_t* data, uint8_t* meta) {
  if (n % 8 != 0) return QuantizeFp8Scalar(x, n, data, meta);
  const float base = AbsMaxAvx2(x, n) / kFp8E4m3Max;
  if (!(base > 0.0f) || !std::isfinite(base)) return QuantizeFp8Scalar(x, n, data, meta);
  float scale = base, best = INFINITY;
  for (float step : kFp8ScaleSteps) {
    const float s = base * step;
    const __m256 vs = _mm256_set1_ps(s);
    __m256 lanes = _mm256_setzero_ps();
    for (int i = 0; i < n; i += 8) {
      const __m256 v = _mm256_loadu_ps(x + i);
      const __m256 back = _mm256_mul_ps(Fp8ValuesAvx2(Fp8CodesAvx2(_mm256_div_ps(v, vs))), vs);
      const __m256 d = _mm256_sub_ps(back, v);
      lanes = _mm256_add_ps(lanes, _mm256_mul_ps(d, d));
    }
    __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(lanes), _mm256_extractf128_ps(lanes, 1));
    s4 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
    s4 = _mm_add_ss(s4, _mm_movehdup_ps(s4));
    const float err = _mm_cvtss_f32(s4);
    if (err < best) {
      best = err;
      scale = s;
    }
  }
  const __m256 vs = _mm256_set1_ps(scale);
  for (int i = 0; i < n; i += 8) {
    StoreLowBytes(Fp8CodesAvx2(_mm256_div_ps(_mm256_loadu_ps(x + i), vs)), data + i);
  }
  std::memcpy(meta, &scale, 4);
}

KV_AVX2 void QuantizeInt4Avx2(const float* x, int n, int group, uint8_t* data, uint8_t* meta) {
  if (group % 8 != 0) return QuantizeInt4Scalar(x, n, group, 4, data, meta);
  // Byte 0 and byte 8 of each 128-bit lane: the packed pairs (q0 | q1 << 4).
  const __m256i gather =
      _mm256_setr_epi8(0, 8, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, 0, 8, -1, -1,
                       -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1);
  for (int g0 = 0; g0 < n; g0 += group) {
    __m256 vmin = _mm256_loadu_ps(x + g0), vmax = vmin;
    for (int i = g0 + 8; i < g0 + group; i += 8) {
      const __m256 v = _mm256_loadu_ps(x + i);
      vmin = _mm256_min_ps(v, vmin);
      vmax = _mm256_max_ps(v, vmax);
    }
    __m128 lo4 = _mm_min_ps(_mm256_castps256_ps128(vmin), _mm256_extractf128_ps(vmin, 1));
    lo4 = _mm_min_ps(lo4, _mm_movehl_ps(lo4, lo4));
    lo4 = _mm_min_ss(lo4, _mm_movehdup_ps(lo4));
    __m128 hi4 = _mm_max_ps(_mm256_castps256_ps128(vmax), _mm256_extractf128_ps(vmax, 1));
    hi4 = _mm_max_ps(hi4, _mm_movehl_ps(hi4, hi4));
    hi4 = _mm_max_ss(hi4, _mm_movehdup_ps(hi4));
    // +0 for either zero, as the scalar path.
    const float mn = _mm_cvtss_f32(lo4) + 0.0f, mx = _mm_cvtss_f32(hi4) + 0.0f;
    const uint16_t scale_h =
        FloatToFp16(Saturate((mx - mn) / static_cast<float>(kInt4MaxLevel), kFp16Max));
    const uint16_t zero_h = FloatToFp16(Saturate(mn, kFp16Max));
    const float scale = Fp16ToFloat(scale_h), zero = Fp16ToFloat(zero_h);
    const __m256 vs = _mm256_set1_ps(scale), vz = _mm256_set1_ps(zero);
    const __m256 top = _mm256_set1_ps(static_cast<float>(kInt4MaxLevel));
    for (int i = g0; i < g0 + group; i += 8) {
      __m256i q = _mm256_setzero_si256();
      if (scale > 0.0f) {
        __m256 c = _mm256_round_ps(_mm256_div_ps(_mm256_sub_ps(_mm256_loadu_ps(x + i), vz), vs),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        // max/min return the second operand for NaN: NaN -> 0, as ClampF.
        c = _mm256_min_ps(_mm256_max_ps(c, _mm256_setzero_ps()), top);
        q = _mm256_cvtps_epi32(c);
      }
      const __m256i pairs =
          _mm256_shuffle_epi8(_mm256_or_si256(q, _mm256_srli_epi64(q, 28)), gather);
      const uint32_t packed = static_cast<uint32_t>(_mm256_extract_epi16(pairs, 0)) |
                              (static_cast<uint32_t>(_mm256_extract_epi16(pairs, 8)) << 16);
      std::memcpy(data + i / 2, &packed, 4);
    }
    const uint16_t pair[2] = {scale_h, zero_h};
    std::memcpy(meta + (g0 / group) * 4, pair, 4);
  }
}
#undef KV_AVX2
#endif

}  // namespace

// ---- element codecs -----------------------------------------------------------

uint16_t FloatToFp16(float x) {
  uint32_t u = BitsOf(x);
  const uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000);
  u &= 0x7fffffff;
  if (u >= 0x7f800000) {  // inf or NaN
    return sign | (u > 0x7f800000 ? 0x7e00 : 0x7c00);
  }
  if (u >= 0x47800000) return sign | 0x7c00;  // >= 65536: overflow
  if (u < 0x38800000) {
    // Below 2^-14 (fp16 subnormal): adding 0.5 puts the float's unit in the
    // last place at 2^-24, so the FPU's own round-to-nearest-even does the
    // rounding and the low mantissa bits are the fp16 subnormal code.
    const float shifted = FloatOf(u) + 0.5f;
    return sign | static_cast<uint16_t>(BitsOf(shifted) - BitsOf(0.5f));
  }
  // Normal: rebias the exponent (127 -> 15) and round the 13 dropped bits to
  // nearest even; a carry out of the mantissa bumps the exponent, and 65520
  // and above rounds up to inf as it should.
  const uint32_t odd = (u >> 13) & 1;
  u += (static_cast<uint32_t>(15 - 127) << 23) + 0xfff + odd;
  return sign | static_cast<uint16_t>(u >> 13);
}

float Fp16ToFloat(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000) << 16;
  const uint32_t e = (h >> 10) & 0x1f, m = h & 0x3ff;
  if (e == 0) {
    const float v = static_cast<float>(m) * 5.9604644775390625e-8f;  // m * 2^-24, exact
    return FloatOf(BitsOf(v) | sign);
  }
  if (e == 31) return FloatOf(sign | 0x7f800000 | (m << 13));
  return FloatOf(sign | ((e + 112) << 23) | (m << 13));
}

uint16_t FloatToBf16(float x) {
  const uint32_t u = BitsOf(x);
  if (std::isnan(x)) return static_cast<uint16_t>((u >> 16) | 0x40);
  return static_cast<uint16_t>((u + 0x7fff + ((u >> 16) & 1)) >> 16);
}

float Bf16ToFloat(uint16_t b) { return FloatOf(static_cast<uint32_t>(b) << 16); }

uint8_t FloatToFp8E4m3(float x) {
  const uint8_t sign = static_cast<uint8_t>((BitsOf(x) >> 24) & 0x80);
  if (std::isnan(x)) return 0x7f;
  const float a = std::fabs(x);
  if (!(a < kFp8E4m3Max)) return sign | 0x7e;  // saturate (E4M3FN has no inf)
  if (a < 0.015625f) {
    // Subnormal range (below 2^-6): codes 0..7 step 2^-9; 8 is 2^-6 itself,
    // which is also the first normal code.
    return sign | static_cast<uint8_t>(RoundEven(a * 512.0f));
  }
  // Keep 3 of the 23 mantissa bits, rounding the 20 dropped ones to nearest
  // even; a carry runs into the exponent as it should. Then rebias the
  // exponent from 127 to 7. a < 448 keeps the code at or below 0x7e, so
  // NaN's code is never made.
  const uint32_t u = BitsOf(a);
  const uint32_t rounded = u + 0x7ffff + ((u >> 20) & 1);
  return sign | static_cast<uint8_t>((rounded >> 20) - (120 << 3));
}

float Fp8E4m3ToFloat(uint8_t b) { return kFp8Table[b]; }

// ---- rows ------------------------------------------------------------------------

void QuantizeRow(const KvPartLayout& part, int head_dim, const float* x, uint8_t* data,
                 uint8_t* meta, CpuIsa isa) {
  const bool avx2 = ResolveCpuIsa(isa) == CpuIsa::kAvx2;
  switch (part.elem) {
    case KvElem::kFp32:
      std::memcpy(data, x, static_cast<size_t>(head_dim) * 4);
      return;
    case KvElem::kFp16:
#if defined(__x86_64__)
      if (avx2) return QuantizeFp16Avx2(x, head_dim, data);
#endif
      return QuantizeFp16Scalar(x, head_dim, data);
    case KvElem::kBf16:
#if defined(__x86_64__)
      if (avx2) return QuantizeBf16Avx2(x, head_dim, data);
#endif
      return QuantizeBf16Scalar(x, head_dim, data);
    case KvElem::kInt8:
#if defined(__x86_64__)
      if (avx2) return QuantizeInt8Avx2(x, head_dim, data, meta);
#endif
      return QuantizeInt8Scalar(x, head_dim, data, meta);
    case KvElem::kFp8E4m3:
#if defined(__x86_64__)
      if (avx2) return QuantizeFp8Avx2(x, head_dim, data, meta);
#endif
      return QuantizeFp8Scalar(x, head_dim, data, meta);
    case KvElem::kInt4:
#if defined(__x86_64__)
      // 2-bit rows (int2_kc's V, written once per full block) take the
      // scalar path.
      if (avx2 && part.bits == 4) return QuantizeInt4Avx2(x, head_dim, part.group_size, data, meta);
#endif
      return QuantizeInt4Scalar(x, head_dim, part.group_size, part.bits, data, meta);
    case KvElem::kInt4Channel:
      std::fprintf(stderr,
                   "QuantizeRow: int4_kc K is quantized per block (QuantizeBlockKChannel)\n");
      std::abort();
  }
  std::fprintf(stderr, "QuantizeRow: unknown element type %d\n", static_cast<int>(part.elem));
  std::abort();
}

void DequantizeRow(const KvPartLayout& part, int head_dim, const uint8_t* data, const uint8_t* meta,
                   float* out) {
  switch (part.elem) {
    case KvElem::kFp32:
      std::memcpy(out, data, static_cast<size_t>(head_dim) * 4);
      return;
    case KvElem::kFp16:
    case KvElem::kBf16:
      for (int i = 0; i < head_dim; ++i) {
        uint16_t h;
        std::memcpy(&h, data + 2 * i, 2);
        out[i] = part.elem == KvElem::kFp16 ? Fp16ToFloat(h) : Bf16ToFloat(h);
      }
      return;
    case KvElem::kInt8:
    case KvElem::kFp8E4m3: {
      float scale;
      std::memcpy(&scale, meta, 4);
      for (int i = 0; i < head_dim; ++i) {
        const float q = part.elem == KvElem::kInt8
                            ? static_cast<float>(static_cast<int8_t>(data[i]))
                            : Fp8E4m3ToFloat(data[i]);
        out[i] = q * scale;
      }
      return;
    }
    case KvElem::kInt4: {
      const int group = part.group_size;
      for (int g0 = 0; g0 < head_dim; g0 += group) {
        uint16_t pair[2];
        std::memcpy(pair, meta + (g0 / group) * 4, 4);
        const float scale = Fp16ToFloat(pair[0]), zero = Fp16ToFloat(pair[1]);
        for (int i = g0; i < g0 + group; ++i) {
          const int q = internal::CodeAt(data, i, part.bits);
          out[i] = static_cast<float>(q) * scale + zero;
        }
      }
      return;
    }
    case KvElem::kInt4Channel:
      for (int i = 0; i < head_dim; ++i) {
        float scale, zero;
        internal::Int4ChannelAffineAt(meta, i, &scale, &zero, KvCodeLevels(part.bits));
        const int q = internal::CodeAt(data, i, part.bits);
        out[i] = std::fma(static_cast<float>(q), scale, zero);
      }
      return;
  }
  std::fprintf(stderr, "DequantizeRow: unknown element type %d\n", static_cast<int>(part.elem));
  std::abort();
}

}  // namespace kvserve::cpu

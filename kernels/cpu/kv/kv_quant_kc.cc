// int4_kc / int2_kc K: per-channel quantization of a full block (kv_quant.h
// has the encoding, cache/format/kv_layout.h the bytes); bits (4 or 2) set the
// levels L = KvCodeLevels(bits) and the packing. The per-channel range codes are
// chosen by one scalar routine on both paths; AVX2 only does the per-element
// work (channel min/max over the block's rows, the codes), with the same IEEE
// operations in the same order, so both paths write identical bytes.
#include <cmath>
#include <cstring>
#include <vector>

#include "kernels/cpu/kv/kv_quant.h"
#include "kernels/cpu/kv/kv_quant_internal.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace kvserve::cpu {
namespace {

using internal::ClampF;
using internal::Int4ChannelAffineAt;
using internal::RoundEven;

constexpr float kTopCode = static_cast<float>(kInt4ChannelCodes);

// The head's range and each channel's (cmin, cmax) from the channels'
// min/max, with `levels` units a code step; writes the meta. Shared by both
// paths.
void EncodeRanges(const float* mn, const float* mx, int head_dim, int levels, uint8_t* meta) {
  const float levels_f = static_cast<float>(levels);
  float lo = mn[0], hi = mx[0];
  for (int d = 1; d < head_dim; ++d) {
    lo = mn[d] < lo ? mn[d] : lo;
    hi = mx[d] > hi ? mx[d] : hi;
  }
  float unit = (hi - lo) / (kTopCode * levels_f);
  uint8_t* codes = meta + kInt4ChannelHeader;
  if (!(unit > 0.0f) || !std::isfinite(unit) || !std::isfinite(lo)) {
    // Constant (or broken) block: every value decodes to lo.
    if (!std::isfinite(lo)) lo = 0.0f;
    unit = 0.0f;
    std::memset(codes, 0, 2 * static_cast<size_t>(head_dim));
  } else {
    const float step = levels_f * unit;
    for (int d = 0; d < head_dim; ++d) {
      int cmin = static_cast<int>(ClampF(std::floor((mn[d] - lo) / step), 0.0f, kTopCode));
      int cmax = static_cast<int>(
          ClampF(std::ceil((mx[d] - lo) / step), static_cast<float>(cmin), kTopCode));
      // Rounding may leave the decoded range a hair inside [min_d, max_d]:
      // widen it by a code until it covers them.
      float zero = std::fma(static_cast<float>(levels * cmin), unit, lo);
      while (cmin > 0 && zero > mn[d]) {
        --cmin;
        zero = std::fma(static_cast<float>(levels * cmin), unit, lo);
      }
      while (cmax < kInt4ChannelCodes &&
             std::fma(levels_f, static_cast<float>(cmax - cmin) * unit, zero) < mx[d]) {
        ++cmax;
      }
      codes[2 * d] = static_cast<uint8_t>(cmin);
      codes[2 * d + 1] = static_cast<uint8_t>(cmax);
    }
  }
  std::memcpy(meta, &lo, 4);
  std::memcpy(meta + 4, &unit, 4);
}

// Packs row j's codes q[0, head_dim) (8 / bits to a byte, lowest channel in
// the lowest bits).
void PackCodes(const int32_t* q, int head_dim, int bits, uint8_t* out) {
  const int per = 8 / bits;
  for (int d = 0; d < head_dim; d += per) {
    uint32_t byte = 0;
    for (int k = 0; k < per; ++k) byte |= static_cast<uint32_t>(q[d + k]) << (k * bits);
    out[d / per] = static_cast<uint8_t>(byte);
  }
}

void QuantizeBlockScalar(int head_dim, int block_size, int bits, const float* const* rows,
                         int row_bytes, uint8_t* codes, uint8_t* meta) {
  const int levels = KvCodeLevels(bits);
  const float levels_f = static_cast<float>(levels);
  thread_local std::vector<float> buf;
  buf.resize(4 * static_cast<size_t>(head_dim));
  float* mn = buf.data();
  float* mx = mn + head_dim;
  float* scale = mx + head_dim;
  float* zero = scale + head_dim;
  for (int d = 0; d < head_dim; ++d) mn[d] = mx[d] = rows[0][d];
  for (int j = 1; j < block_size; ++j) {
    for (int d = 0; d < head_dim; ++d) {
      const float x = rows[j][d];
      mn[d] = x < mn[d] ? x : mn[d];
      mx[d] = x > mx[d] ? x : mx[d];
    }
  }
  EncodeRanges(mn, mx, head_dim, levels, meta);
  for (int d = 0; d < head_dim; ++d) Int4ChannelAffineAt(meta, d, &scale[d], &zero[d], levels);
  thread_local std::vector<int32_t> q;
  q.resize(head_dim);
  for (int j = 0; j < block_size; ++j) {
    for (int d = 0; d < head_dim; ++d) {
      q[d] = 0;
      if (scale[d] > 0.0f) {
        const float c = RoundEven((rows[j][d] - zero[d]) / scale[d]);
        q[d] = static_cast<int32_t>(ClampF(c, 0.0f, levels_f));
      }
    }
    PackCodes(q.data(), head_dim, bits, codes + static_cast<int64_t>(j) * row_bytes);
  }
}

#if defined(__x86_64__)
#define KV_AVX2 __attribute__((target("avx2,fma,f16c")))

KV_AVX2 void QuantizeBlockAvx2(int head_dim, int block_size, int bits, const float* const* rows,
                               int row_bytes, uint8_t* codes, uint8_t* meta) {
  const int levels = KvCodeLevels(bits);
  const float levels_f = static_cast<float>(levels);
  thread_local std::vector<float> buf;
  buf.resize(4 * static_cast<size_t>(head_dim));
  float* mn = buf.data();
  float* mx = mn + head_dim;
  float* scale = mx + head_dim;
  float* zero = scale + head_dim;
  for (int d0 = 0; d0 < head_dim; d0 += 8) {
    __m256 vmin = _mm256_loadu_ps(rows[0] + d0), vmax = vmin;
    for (int j = 1; j < block_size; ++j) {
      const __m256 x = _mm256_loadu_ps(rows[j] + d0);
      // min_ps(x, m) is x < m ? x : m, as the scalar loop.
      vmin = _mm256_min_ps(x, vmin);
      vmax = _mm256_max_ps(x, vmax);
    }
    _mm256_storeu_ps(mn + d0, vmin);
    _mm256_storeu_ps(mx + d0, vmax);
  }
  EncodeRanges(mn, mx, head_dim, levels, meta);
  for (int d = 0; d < head_dim; ++d) Int4ChannelAffineAt(meta, d, &scale[d], &zero[d], levels);
  thread_local std::vector<int32_t> q2;  // 2-bit codes of a row, packed by PackCodes
  q2.resize(head_dim);
  // Byte 0 and byte 8 of each 128-bit lane: the packed pairs (q0 | q1 << 4).
  const __m256i gather =
      _mm256_setr_epi8(0, 8, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, 0, 8, -1, -1,
                       -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1);
  const __m256 top = _mm256_set1_ps(levels_f), vzero = _mm256_setzero_ps();
  for (int j = 0; j < block_size; ++j) {
    uint8_t* out = codes + static_cast<int64_t>(j) * row_bytes;
    for (int d0 = 0; d0 < head_dim; d0 += 8) {
      const __m256 s = _mm256_loadu_ps(scale + d0);
      const __m256 z = _mm256_loadu_ps(zero + d0);
      __m256 c = _mm256_round_ps(_mm256_div_ps(_mm256_sub_ps(_mm256_loadu_ps(rows[j] + d0), z), s),
                                 _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
      // max/min return the second operand for NaN: NaN -> 0, as ClampF.
      c = _mm256_min_ps(_mm256_max_ps(c, vzero), top);
      c = _mm256_and_ps(c, _mm256_cmp_ps(s, vzero, _CMP_GT_OQ));  // scale 0: q = 0
      const __m256i q = _mm256_cvtps_epi32(c);
      if (bits != 4) {
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(q2.data() + d0), q);
        continue;
      }
      const __m256i pairs =
          _mm256_shuffle_epi8(_mm256_or_si256(q, _mm256_srli_epi64(q, 28)), gather);
      const uint32_t packed = static_cast<uint32_t>(_mm256_extract_epi16(pairs, 0)) |
                              (static_cast<uint32_t>(_mm256_extract_epi16(pairs, 8)) << 16);
      std::memcpy(out + d0 / 2, &packed, 4);
    }
    if (bits != 4) PackCodes(q2.data(), head_dim, bits, out);
  }
}
#undef KV_AVX2
#endif

}  // namespace

void QuantizeBlockKChannel(const KvPartLayout& part, int head_dim, int block_size,
                           const float* const* rows, uint8_t* codes, uint8_t* meta, CpuIsa isa) {
#if defined(__x86_64__)
  if (ResolveCpuIsa(isa) == CpuIsa::kAvx2 && head_dim % 8 == 0) {
    return QuantizeBlockAvx2(head_dim, block_size, part.bits, rows, part.row_bytes, codes, meta);
  }
#endif
  QuantizeBlockScalar(head_dim, block_size, part.bits, rows, part.row_bytes, codes, meta);
}

void Int4ChannelAffine(const uint8_t* meta, int head_dim, float* scale, float* zero, int bits) {
  const int levels = KvCodeLevels(bits);
  for (int d = 0; d < head_dim; ++d) Int4ChannelAffineAt(meta, d, &scale[d], &zero[d], levels);
}

}  // namespace kvserve::cpu

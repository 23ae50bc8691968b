// The int4-weight kernels of QuantLinear (quant_matrix.h): AVX-512 VNNI and
// AVX2, unpacking the nibbles in registers. Both form, per row, channel and
// group, the exact int32s sum_{k in g} h_k (q_k + 8) - 8 sum_{k in g} h_k
// (and the same for l), then fma(128 float(h sum) + float(l sum), scale,
// acc) over the groups in order and a final multiply by the row's
// activation scale: the float operations of Q4Scalar, so all three give the
// same bits. int4_asym adds fma(sum_x, offset, acc) after each group's
// scale term (sum_x: the group's 128 float(sum h) + float(sum l)); the
// offsets are a template constant, not a test in the loops.
//
// One 64-byte load holds two quads for a block's 16 channels: the low
// nibbles are the quad at k, the high ones the quad at k + 4. The weights
// (q + 8 in [1, 15]) are the unsigned operand of vpdpbusd and the
// activation bytes (h in [-127, 127], l in [0, 127]) the signed one, so
// nothing is offset; the accumulators start at -8 * the group's sums. AVX2's vpmaddubsw
// pairs are at most 2 x 15 x 127 = 3810, so four quad pairs (eight of
// them) add in int16 before vpmaddwd widens them.
#include <algorithm>
#include <cstring>

#include "kernels/cpu/quant/quant_internal.h"

#if defined(__x86_64__)
#include <immintrin.h>

// GCC 12's AVX-512 intrinsics pass _mm512_undefined_*() as unused merge
// sources, which -Wmaybe-uninitialized reports; the value is never read.
#if !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif

namespace kvserve::cpu::internal {
namespace {

#define KV_VNNI __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")))
#define KV_AVX2 __attribute__((target("avx2,fma,f16c")))

template <int R, int NB, bool kOffsets>
KV_VNNI void TileVnni(const QuantGemmArgs& a, int64_t r0, int64_t b0) {
  const QuantMatrix& w = *a.w;
  const int64_t kp = w.k_padded(), groups = w.num_groups(), pairs = w.group_size() / 8;
  const uint8_t* wb[NB];
  for (int b = 0; b < NB; ++b) wb[b] = w.block(b0 + b);
  const int8_t* xh[R];
  const uint8_t* xl[R];
  for (int r = 0; r < R; ++r) {
    xh[r] = a.xh + (r0 + r) * kp;
    xl[r] = a.xl + (r0 + r) * kp;
  }
  const __m512i low = _mm512_set1_epi8(0x0F);
  const __m512 k128 = _mm512_set1_ps(128.0f);
  __m512 facc[R][NB];
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r) {
#pragma GCC unroll 16
    for (int b = 0; b < NB; ++b) facc[r][b] = _mm512_setzero_ps();
  }
  for (int64_t g = 0; g < groups; ++g) {
    __m512i ah[R][NB], al[R][NB];
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) {
      const __m512i ih = _mm512_set1_epi32(-8 * a.sum_h[(r0 + r) * groups + g]);
      const __m512i il = _mm512_set1_epi32(-8 * a.sum_l[(r0 + r) * groups + g]);
#pragma GCC unroll 16
      for (int b = 0; b < NB; ++b) {
        ah[r][b] = ih;
        al[r][b] = il;
      }
    }
    for (int64_t p = 0; p < pairs; ++p) {
      const int64_t off = (g * pairs + p) * 64;
      __m512i lo[NB], hi[NB];
#pragma GCC unroll 16
      for (int b = 0; b < NB; ++b) {
        const __m512i v = _mm512_load_si512(wb[b] + off);
        _mm_prefetch(reinterpret_cast<const char*>(wb[b] + off + 1024), _MM_HINT_T0);
        lo[b] = _mm512_and_si512(v, low);
        hi[b] = _mm512_and_si512(_mm512_srli_epi16(v, 4), low);
      }
      const int64_t k = (g * pairs + p) * 8;
#pragma GCC unroll 16
      for (int r = 0; r < R; ++r) {
        const __m512i h0 = _mm512_set1_epi32(Load4(xh[r] + k));
        const __m512i h1 = _mm512_set1_epi32(Load4(xh[r] + k + 4));
        const __m512i l0 = _mm512_set1_epi32(Load4(xl[r] + k));
        const __m512i l1 = _mm512_set1_epi32(Load4(xl[r] + k + 4));
#pragma GCC unroll 16
        for (int b = 0; b < NB; ++b) {
          ah[r][b] = _mm512_dpbusd_epi32(ah[r][b], lo[b], h0);
          ah[r][b] = _mm512_dpbusd_epi32(ah[r][b], hi[b], h1);
          al[r][b] = _mm512_dpbusd_epi32(al[r][b], lo[b], l0);
          al[r][b] = _mm512_dpbusd_epi32(al[r][b], hi[b], l1);
        }
      }
    }
#pragma GCC unroll 16
    for (int b = 0; b < NB; ++b) {
      const __m512 s = _mm512_cvtph_ps(_mm256_load_si256(
          reinterpret_cast<const __m256i*>(wb[b] + w.scale_offset() + g * kQuantBlock * 2)));
      __m512 off = _mm512_setzero_ps();
      if constexpr (kOffsets) {
        off = _mm512_cvtph_ps(_mm256_load_si256(
            reinterpret_cast<const __m256i*>(wb[b] + w.offset_offset() + g * kQuantBlock * 2)));
      }
#pragma GCC unroll 16
      for (int r = 0; r < R; ++r) {
        const __m512 comb = _mm512_add_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(ah[r][b]), k128),
                                          _mm512_cvtepi32_ps(al[r][b]));
        facc[r][b] = _mm512_fmadd_ps(comb, s, facc[r][b]);
        if constexpr (kOffsets) {
          facc[r][b] =
              _mm512_fmadd_ps(_mm512_set1_ps(a.sum_x[(r0 + r) * groups + g]), off, facc[r][b]);
        }
      }
    }
  }
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r) {
    const __m512 t = _mm512_set1_ps(a.xscale[r0 + r]);
#pragma GCC unroll 16
    for (int b = 0; b < NB; ++b) {
      _mm512_storeu_ps(a.out + (r0 + r) * a.ldo + (b0 + b - a.b_begin) * kQuantBlock,
                       _mm512_mul_ps(facc[r][b], t));
    }
  }
}

// One row (decode): one block at a time, so a thread streams its blocks as
// one sequential run of memory; four accumulators per group (high and low
// activation bytes times low and high nibbles) keep four chains in flight,
// and consecutive groups are independent until their fma.
template <bool kOffsets>
KV_VNNI void RowVnni(const QuantGemmArgs& a, int64_t r0, int64_t b) {
  const QuantMatrix& w = *a.w;
  const int64_t kp = w.k_padded(), groups = w.num_groups(), pairs = w.group_size() / 8;
  const uint8_t* wb = w.block(b);
  const int8_t* xh = a.xh + r0 * kp;
  const uint8_t* xl = a.xl + r0 * kp;
  const __m512i low = _mm512_set1_epi8(0x0F);
  const __m512 k128 = _mm512_set1_ps(128.0f);
  __m512 facc = _mm512_setzero_ps();
  for (int64_t g = 0; g < groups; ++g) {
    __m512i ah0 = _mm512_set1_epi32(-8 * a.sum_h[r0 * groups + g]);
    __m512i al0 = _mm512_set1_epi32(-8 * a.sum_l[r0 * groups + g]);
    __m512i ah1 = _mm512_setzero_si512(), al1 = _mm512_setzero_si512();
    for (int64_t p = 0; p < pairs; ++p) {
      const int64_t off = (g * pairs + p) * 64;
      const __m512i v = _mm512_load_si512(wb + off);
      _mm_prefetch(reinterpret_cast<const char*>(wb + off + 2048), _MM_HINT_T0);
      const __m512i lo = _mm512_and_si512(v, low);
      const __m512i hi = _mm512_and_si512(_mm512_srli_epi16(v, 4), low);
      const int64_t k = (g * pairs + p) * 8;
      ah0 = _mm512_dpbusd_epi32(ah0, lo, _mm512_set1_epi32(Load4(xh + k)));
      ah1 = _mm512_dpbusd_epi32(ah1, hi, _mm512_set1_epi32(Load4(xh + k + 4)));
      al0 = _mm512_dpbusd_epi32(al0, lo, _mm512_set1_epi32(Load4(xl + k)));
      al1 = _mm512_dpbusd_epi32(al1, hi, _mm512_set1_epi32(Load4(xl + k + 4)));
    }
    const __m512 s = _mm512_cvtph_ps(_mm256_load_si256(
        reinterpret_cast<const __m256i*>(wb + w.scale_offset() + g * kQuantBlock * 2)));
    const __m512 comb =
        _mm512_add_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_add_epi32(ah0, ah1)), k128),
                      _mm512_cvtepi32_ps(_mm512_add_epi32(al0, al1)));
    facc = _mm512_fmadd_ps(comb, s, facc);
    if constexpr (kOffsets) {
      const __m512 off = _mm512_cvtph_ps(_mm256_load_si256(
          reinterpret_cast<const __m256i*>(wb + w.offset_offset() + g * kQuantBlock * 2)));
      facc = _mm512_fmadd_ps(_mm512_set1_ps(a.sum_x[r0 * groups + g]), off, facc);
    }
  }
  _mm512_storeu_ps(a.out + r0 * a.ldo + (b - a.b_begin) * kQuantBlock,
                   _mm512_mul_ps(facc, _mm512_set1_ps(a.xscale[r0])));
}

template <int R, int NB, bool kOffsets>
KV_VNNI void ColsVnni(const QuantGemmArgs& a, int64_t r0, int64_t b_lo, int64_t b_hi) {
  if constexpr (R == 1) {
    for (int64_t b = b_lo; b < b_hi; ++b) RowVnni<kOffsets>(a, r0, b);
    return;
  }
  int64_t b = b_lo;
  for (; b + NB <= b_hi; b += NB) TileVnni<R, NB, kOffsets>(a, r0, b);
  for (; b < b_hi; ++b) TileVnni<R, 1, kOffsets>(a, r0, b);
}

// 8 channels (half a block) per ymm; R rows x one half.
template <int R, bool kOffsets>
KV_AVX2 void TileAvx2(const QuantGemmArgs& a, int64_t r0, int64_t h0) {
  const QuantMatrix& w = *a.w;
  const int64_t kp = w.k_padded(), groups = w.num_groups(), pairs = w.group_size() / 8;
  const uint8_t* wb = w.block(h0 / 2);
  const int half = static_cast<int>(h0 % 2);
  const int8_t* xh[R];
  const uint8_t* xl[R];
  for (int r = 0; r < R; ++r) {
    xh[r] = a.xh + (r0 + r) * kp;
    xl[r] = a.xl + (r0 + r) * kp;
  }
  const __m256i low = _mm256_set1_epi8(0x0F), ones = _mm256_set1_epi16(1);
  const __m256 k128 = _mm256_set1_ps(128.0f);
  __m256 facc[R];
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r) facc[r] = _mm256_setzero_ps();
  for (int64_t g = 0; g < groups; ++g) {
    __m256i ah[R], al[R];
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) {
      ah[r] = _mm256_set1_epi32(-8 * a.sum_h[(r0 + r) * groups + g]);
      al[r] = _mm256_set1_epi32(-8 * a.sum_l[(r0 + r) * groups + g]);
    }
    for (int64_t p0 = 0; p0 < pairs; p0 += 4) {
      const int64_t p1 = std::min<int64_t>(pairs, p0 + 4);
      __m256i sh[R], sl[R];
#pragma GCC unroll 16
      for (int r = 0; r < R; ++r) sh[r] = sl[r] = _mm256_setzero_si256();
      for (int64_t p = p0; p < p1; ++p) {
        const __m256i v = _mm256_load_si256(
            reinterpret_cast<const __m256i*>(wb + (g * pairs + p) * 64 + half * 32));
        const __m256i lo = _mm256_and_si256(v, low);
        const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), low);
        const int64_t k = (g * pairs + p) * 8;
#pragma GCC unroll 16
        for (int r = 0; r < R; ++r) {
          sh[r] = _mm256_add_epi16(sh[r],
                                   _mm256_maddubs_epi16(lo, _mm256_set1_epi32(Load4(xh[r] + k))));
          sh[r] = _mm256_add_epi16(
              sh[r], _mm256_maddubs_epi16(hi, _mm256_set1_epi32(Load4(xh[r] + k + 4))));
          sl[r] = _mm256_add_epi16(sl[r],
                                   _mm256_maddubs_epi16(lo, _mm256_set1_epi32(Load4(xl[r] + k))));
          sl[r] = _mm256_add_epi16(
              sl[r], _mm256_maddubs_epi16(hi, _mm256_set1_epi32(Load4(xl[r] + k + 4))));
        }
      }
#pragma GCC unroll 16
      for (int r = 0; r < R; ++r) {
        ah[r] = _mm256_add_epi32(ah[r], _mm256_madd_epi16(sh[r], ones));
        al[r] = _mm256_add_epi32(al[r], _mm256_madd_epi16(sl[r], ones));
      }
    }
    const __m256 s = _mm256_cvtph_ps(_mm_load_si128(
        reinterpret_cast<const __m128i*>(wb + w.scale_offset() + g * kQuantBlock * 2 + half * 16)));
    __m256 off = _mm256_setzero_ps();
    if constexpr (kOffsets) {
      off = _mm256_cvtph_ps(_mm_load_si128(reinterpret_cast<const __m128i*>(
          wb + w.offset_offset() + g * kQuantBlock * 2 + half * 16)));
    }
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) {
      const __m256 comb =
          _mm256_add_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(ah[r]), k128), _mm256_cvtepi32_ps(al[r]));
      facc[r] = _mm256_fmadd_ps(comb, s, facc[r]);
      if constexpr (kOffsets) {
        facc[r] = _mm256_fmadd_ps(_mm256_set1_ps(a.sum_x[(r0 + r) * groups + g]), off, facc[r]);
      }
    }
  }
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r) {
    _mm256_storeu_ps(a.out + (r0 + r) * a.ldo + h0 * 8 - a.b_begin * kQuantBlock,
                     _mm256_mul_ps(facc[r], _mm256_set1_ps(a.xscale[r0 + r])));
  }
}

template <int R, bool kOffsets>
KV_AVX2 void ColsAvx2(const QuantGemmArgs& a, int64_t r0, int64_t b_lo, int64_t b_hi) {
  for (int64_t h = 2 * b_lo; h < 2 * b_hi; ++h) TileAvx2<R, kOffsets>(a, r0, h);
}

template <bool kOffsets>
KV_VNNI void RunVnni(const QuantGemmArgs& a) {
  const int64_t per_group = BlocksPerGroup(*a.w);
  for (int64_t g0 = a.b_begin; g0 < a.b_end; g0 += per_group) {
    const int64_t g1 = std::min(a.b_end, g0 + per_group);
    int64_t r = 0;
    for (; r + 2 <= a.rows; r += 2) ColsVnni<2, 2, kOffsets>(a, r, g0, g1);
    if (r < a.rows) ColsVnni<1, 4, kOffsets>(a, r, g0, g1);
  }
}

template <bool kOffsets>
KV_AVX2 void RunAvx2(const QuantGemmArgs& a) {
  const int64_t per_group = BlocksPerGroup(*a.w);
  for (int64_t g0 = a.b_begin; g0 < a.b_end; g0 += per_group) {
    const int64_t g1 = std::min(a.b_end, g0 + per_group);
    int64_t r = 0;
    for (; r + 2 <= a.rows; r += 2) ColsAvx2<2, kOffsets>(a, r, g0, g1);
    if (r < a.rows) ColsAvx2<1, kOffsets>(a, r, g0, g1);
  }
}

}  // namespace

KV_VNNI void Q4Vnni512(const QuantGemmArgs& a) {
  a.w->has_offsets() ? RunVnni<true>(a) : RunVnni<false>(a);
}

KV_AVX2 void Q4Avx2(const QuantGemmArgs& a) {
  a.w->has_offsets() ? RunAvx2<true>(a) : RunAvx2<false>(a);
}

}  // namespace kvserve::cpu::internal

#endif  // __x86_64__

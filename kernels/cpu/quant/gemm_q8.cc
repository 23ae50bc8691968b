// The int8-weight kernels of QuantLinear (quant_matrix.h): AVX-512 VNNI and
// AVX2. Both produce the exact int32 sums sum_k h_rk q_ok and sum_k l_rk
// q_ok and then the same float operations as Q8Scalar, so all three give
// the same bits.
//
// VNNI: one 64-byte load is a quad of inputs for a block's 16 channels; a
// row's 4 high bytes (offset by 128, unsigned) and 4 low bytes are
// broadcast to every lane and two vpdpbusd add the products into each
// channel's two int32s. Tiles are R rows x NB blocks (2 x 4: 16
// accumulators, 4 weight loads and 4 broadcasts per 16 vpdpbusd; one row
// takes 4 blocks, i.e. 8 independent chains). The offset is removed at the
// end with the channel's 128 * sum_k q_ok.
//
// AVX2: vpmaddubsw(|q|, h with q's sign) and vpmaddubsw(l, q) give pairs of
// at most 2 x 127 x 127 < 2^15 (no saturation), vpmaddwd by ones widens to
// int32.
//
// Column blocks are walked in groups that stay in L2 while every row tile
// passes over them.
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

#define KV_VNNI __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma")))
#define KV_AVX2 __attribute__((target("avx2,fma")))

template <int R, int NB>
KV_VNNI void TileVnni(const QuantGemmArgs& a, int64_t r0, int64_t b0) {
  const QuantMatrix& w = *a.w;
  const int64_t kp = w.k_padded(), nq = kp / 4;
  const uint8_t* wb[NB];
  for (int b = 0; b < NB; ++b) wb[b] = w.block(b0 + b);
  const uint8_t* xh[R];
  const uint8_t* xl[R];
  for (int r = 0; r < R; ++r) {
    xh[r] = a.xhu + (r0 + r) * kp;
    xl[r] = a.xl + (r0 + r) * kp;
  }
  __m512i ah[R][NB], al[R][NB];
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r) {
#pragma GCC unroll 16
    for (int b = 0; b < NB; ++b) ah[r][b] = al[r][b] = _mm512_setzero_si512();
  }
  for (int64_t q = 0; q < nq; ++q) {
    __m512i wv[NB];
#pragma GCC unroll 16
    for (int b = 0; b < NB; ++b) {
      wv[b] = _mm512_load_si512(wb[b] + q * 64);
      _mm_prefetch(reinterpret_cast<const char*>(wb[b] + q * 64 + 1024), _MM_HINT_T0);
    }
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) {
      const __m512i vh = _mm512_set1_epi32(Load4(xh[r] + 4 * q));
      const __m512i vl = _mm512_set1_epi32(Load4(xl[r] + 4 * q));
#pragma GCC unroll 16
      for (int b = 0; b < NB; ++b) {
        ah[r][b] = _mm512_dpbusd_epi32(ah[r][b], vh, wv[b]);
        al[r][b] = _mm512_dpbusd_epi32(al[r][b], vl, wv[b]);
      }
    }
  }
  const __m512 k128 = _mm512_set1_ps(128.0f);
#pragma GCC unroll 16
  for (int b = 0; b < NB; ++b) {
    const int64_t c = (b0 + b) * kQuantBlock;
    const __m512i corr = _mm512_slli_epi32(_mm512_loadu_si512(w.channel_sums() + c), 7);
    const __m512 ws = _mm512_loadu_ps(w.channel_scales() + c);
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) {
      const __m512i h = _mm512_sub_epi32(ah[r][b], corr);
      const __m512 comb =
          _mm512_add_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(h), k128), _mm512_cvtepi32_ps(al[r][b]));
      const __m512 scale = _mm512_mul_ps(ws, _mm512_set1_ps(a.xscale[r0 + r]));
      _mm512_storeu_ps(a.out + (r0 + r) * a.ldo + (b0 + b - a.b_begin) * kQuantBlock,
                       _mm512_mul_ps(comb, scale));
    }
  }
}

// One row (decode): one block at a time, its quads dealt round-robin to four
// pairs of accumulators (the int32 sums are exact, so the split changes no
// bit), so a thread streams its blocks as one sequential run of memory.
KV_VNNI void RowVnni(const QuantGemmArgs& a, int64_t r0, int64_t b) {
  constexpr int C = 4;
  const QuantMatrix& w = *a.w;
  const int64_t kp = w.k_padded(), nq = kp / 4;
  const uint8_t* wb = w.block(b);
  const uint8_t* xh = a.xhu + r0 * kp;
  const uint8_t* xl = a.xl + r0 * kp;
  __m512i ah[C], al[C];
#pragma GCC unroll 16
  for (int j = 0; j < C; ++j) ah[j] = al[j] = _mm512_setzero_si512();
  int64_t q = 0;
  for (; q + C <= nq; q += C) {
#pragma GCC unroll 16
    for (int j = 0; j < C; ++j) {
      const __m512i wv = _mm512_load_si512(wb + (q + j) * 64);
      ah[j] = _mm512_dpbusd_epi32(ah[j], _mm512_set1_epi32(Load4(xh + 4 * (q + j))), wv);
      al[j] = _mm512_dpbusd_epi32(al[j], _mm512_set1_epi32(Load4(xl + 4 * (q + j))), wv);
    }
    _mm_prefetch(reinterpret_cast<const char*>(wb + q * 64 + 2048), _MM_HINT_T0);
    _mm_prefetch(reinterpret_cast<const char*>(wb + q * 64 + 2048 + 128), _MM_HINT_T0);
  }
  for (; q < nq; ++q) {
    const __m512i wv = _mm512_load_si512(wb + q * 64);
    ah[0] = _mm512_dpbusd_epi32(ah[0], _mm512_set1_epi32(Load4(xh + 4 * q)), wv);
    al[0] = _mm512_dpbusd_epi32(al[0], _mm512_set1_epi32(Load4(xl + 4 * q)), wv);
  }
  const __m512i sh =
      _mm512_add_epi32(_mm512_add_epi32(ah[0], ah[1]), _mm512_add_epi32(ah[2], ah[3]));
  const __m512i sl =
      _mm512_add_epi32(_mm512_add_epi32(al[0], al[1]), _mm512_add_epi32(al[2], al[3]));
  const int64_t c = b * kQuantBlock;
  const __m512i h =
      _mm512_sub_epi32(sh, _mm512_slli_epi32(_mm512_loadu_si512(w.channel_sums() + c), 7));
  const __m512 comb = _mm512_add_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(h), _mm512_set1_ps(128.0f)),
                                    _mm512_cvtepi32_ps(sl));
  const __m512 scale =
      _mm512_mul_ps(_mm512_loadu_ps(w.channel_scales() + c), _mm512_set1_ps(a.xscale[r0]));
  _mm512_storeu_ps(a.out + r0 * a.ldo + (b - a.b_begin) * kQuantBlock, _mm512_mul_ps(comb, scale));
}

template <int R>
KV_VNNI void ColsVnni(const QuantGemmArgs& a, int64_t r0, int64_t b_lo, int64_t b_hi) {
  if constexpr (R == 1) {
    for (int64_t b = b_lo; b < b_hi; ++b) RowVnni(a, r0, b);
    return;
  }
  int64_t b = b_lo;
  for (; b + 4 <= b_hi; b += 4) TileVnni<R, 4>(a, r0, b);
  for (; b < b_hi; ++b) TileVnni<R, 1>(a, r0, b);
}

// 8 columns (half a block, h = 0 or 1) per ymm; R rows x NH halves.
template <int R, int NH>
KV_AVX2 void TileAvx2(const QuantGemmArgs& a, int64_t r0, int64_t h0) {
  const QuantMatrix& w = *a.w;
  const int64_t kp = w.k_padded(), nq = kp / 4;
  const uint8_t* wh[NH];
  for (int h = 0; h < NH; ++h) wh[h] = w.block((h0 + h) / 2) + ((h0 + h) % 2) * 32;
  const int8_t* xh[R];
  const uint8_t* xl[R];
  for (int r = 0; r < R; ++r) {
    xh[r] = a.xh + (r0 + r) * kp;
    xl[r] = a.xl + (r0 + r) * kp;
  }
  const __m256i ones = _mm256_set1_epi16(1);
  __m256i ah[R][NH], al[R][NH];
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r) {
#pragma GCC unroll 16
    for (int h = 0; h < NH; ++h) ah[r][h] = al[r][h] = _mm256_setzero_si256();
  }
  for (int64_t q = 0; q < nq; ++q) {
    __m256i wv[NH], aw[NH];
#pragma GCC unroll 16
    for (int h = 0; h < NH; ++h) {
      wv[h] = _mm256_load_si256(reinterpret_cast<const __m256i*>(wh[h] + q * 64));
      aw[h] = _mm256_sign_epi8(wv[h], wv[h]);
    }
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) {
      const __m256i vh = _mm256_set1_epi32(Load4(xh[r] + 4 * q));
      const __m256i vl = _mm256_set1_epi32(Load4(xl[r] + 4 * q));
#pragma GCC unroll 16
      for (int h = 0; h < NH; ++h) {
        const __m256i ph = _mm256_maddubs_epi16(aw[h], _mm256_sign_epi8(vh, wv[h]));
        const __m256i pl = _mm256_maddubs_epi16(vl, wv[h]);
        ah[r][h] = _mm256_add_epi32(ah[r][h], _mm256_madd_epi16(ph, ones));
        al[r][h] = _mm256_add_epi32(al[r][h], _mm256_madd_epi16(pl, ones));
      }
    }
  }
  const __m256 k128 = _mm256_set1_ps(128.0f);
#pragma GCC unroll 16
  for (int h = 0; h < NH; ++h) {
    const int64_t c = (h0 + h) * 8;
    const __m256 ws = _mm256_loadu_ps(w.channel_scales() + c);
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) {
      const __m256 comb = _mm256_add_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(ah[r][h]), k128),
                                        _mm256_cvtepi32_ps(al[r][h]));
      const __m256 scale = _mm256_mul_ps(ws, _mm256_set1_ps(a.xscale[r0 + r]));
      _mm256_storeu_ps(a.out + (r0 + r) * a.ldo + c - a.b_begin * kQuantBlock,
                       _mm256_mul_ps(comb, scale));
    }
  }
}

template <int R, int NH>
KV_AVX2 void ColsAvx2(const QuantGemmArgs& a, int64_t r0, int64_t b_lo, int64_t b_hi) {
  int64_t h = 2 * b_lo;
  for (; h + NH <= 2 * b_hi; h += NH) TileAvx2<R, NH>(a, r0, h);
  for (; h < 2 * b_hi; ++h) TileAvx2<R, 1>(a, r0, h);
}

}  // namespace

KV_VNNI void Q8Vnni512(const QuantGemmArgs& a) {
  const int64_t per_group = BlocksPerGroup(*a.w);
  for (int64_t g0 = a.b_begin; g0 < a.b_end; g0 += per_group) {
    const int64_t g1 = std::min(a.b_end, g0 + per_group);
    int64_t r = 0;
    for (; r + 2 <= a.rows; r += 2) ColsVnni<2>(a, r, g0, g1);
    if (r < a.rows) ColsVnni<1>(a, r, g0, g1);
  }
}

KV_AVX2 void Q8Avx2(const QuantGemmArgs& a) {
  const int64_t per_group = BlocksPerGroup(*a.w);
  for (int64_t g0 = a.b_begin; g0 < a.b_end; g0 += per_group) {
    const int64_t g1 = std::min(a.b_end, g0 + per_group);
    int64_t r = 0;
    for (; r + 2 <= a.rows; r += 2) ColsAvx2<2, 2>(a, r, g0, g1);
    if (r < a.rows) ColsAvx2<1, 2>(a, r, g0, g1);
  }
}

}  // namespace kvserve::cpu::internal

#endif  // __x86_64__

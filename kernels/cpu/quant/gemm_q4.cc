// The int4-weight kernels of QuantLinear (quant_matrix.h): AVX-512 VNNI and
// AVX2, unpacking the nibbles in registers. Both form, per row, channel and
// group, the exact int32 sum_{k in g} p_k (q_k + 8) - 8 sum_{k in g} p_k,
// then fma(float(sum), scale, acc) over the groups in order and a final
// multiply by the row's activation scale: the float operations of Q4Scalar,
// so all three give the same bits.
//
// One 64-byte load holds two quads for a block's 16 channels: the low
// nibbles are the quad at k, the high ones the quad at k + 4. The weights
// (q + 8 in [1, 15]) are the unsigned operand of vpdpbusd and the
// activations (p in [-127, 127]) the signed one, so nothing is offset; the
// accumulator starts at -8 * sum p of the group instead. AVX2's vpmaddubsw
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

inline int32_t Load4(const void* p) {
  int32_t v;
  std::memcpy(&v, p, 4);
  return v;
}

int64_t BlocksPerGroup(const QuantMatrix& w) {
  return std::max<int64_t>(4, kQuantL2Bytes / w.block_stride());
}

template <int R, int NB>
KV_VNNI void TileVnni(const QuantGemmArgs& a, int64_t r0, int64_t b0) {
  const QuantMatrix& w = *a.w;
  const int64_t kp = w.k_padded(), groups = w.num_groups(), pairs = w.group_size() / 8;
  const uint8_t* wb[NB];
  for (int b = 0; b < NB; ++b) wb[b] = w.block(b0 + b);
  const int8_t* xr[R];
  for (int r = 0; r < R; ++r) xr[r] = a.xq + (r0 + r) * kp;
  const __m512i low = _mm512_set1_epi8(0x0F);
  __m512 facc[R][NB];
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r) {
#pragma GCC unroll 16
    for (int b = 0; b < NB; ++b) facc[r][b] = _mm512_setzero_ps();
  }
  for (int64_t g = 0; g < groups; ++g) {
    __m512i acc[R][NB];
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) {
      const __m512i init = _mm512_set1_epi32(-8 * a.xsum[(r0 + r) * groups + g]);
#pragma GCC unroll 16
      for (int b = 0; b < NB; ++b) acc[r][b] = init;
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
      const int64_t k = g * pairs * 8 + p * 8;
#pragma GCC unroll 16
      for (int r = 0; r < R; ++r) {
        const __m512i x0 = _mm512_set1_epi32(Load4(xr[r] + k));
        const __m512i x1 = _mm512_set1_epi32(Load4(xr[r] + k + 4));
#pragma GCC unroll 16
        for (int b = 0; b < NB; ++b) {
          acc[r][b] = _mm512_dpbusd_epi32(acc[r][b], lo[b], x0);
          acc[r][b] = _mm512_dpbusd_epi32(acc[r][b], hi[b], x1);
        }
      }
    }
#pragma GCC unroll 16
    for (int b = 0; b < NB; ++b) {
      const __m512 s = _mm512_cvtph_ps(_mm256_load_si256(
          reinterpret_cast<const __m256i*>(wb[b] + w.scale_offset() + g * kQuantBlock * 2)));
#pragma GCC unroll 16
      for (int r = 0; r < R; ++r) {
        facc[r][b] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(acc[r][b]), s, facc[r][b]);
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

template <int R, int NB>
KV_VNNI void ColsVnni(const QuantGemmArgs& a, int64_t r0, int64_t b_lo, int64_t b_hi) {
  int64_t b = b_lo;
  for (; b + NB <= b_hi; b += NB) TileVnni<R, NB>(a, r0, b);
  for (; b < b_hi; ++b) TileVnni<R, 1>(a, r0, b);
}

// 8 channels (half a block) per ymm; R rows x NH halves.
template <int R, int NH>
KV_AVX2 void TileAvx2(const QuantGemmArgs& a, int64_t r0, int64_t h0) {
  const QuantMatrix& w = *a.w;
  const int64_t kp = w.k_padded(), groups = w.num_groups(), pairs = w.group_size() / 8;
  const uint8_t* wb[NH];
  int half[NH];
  for (int h = 0; h < NH; ++h) {
    wb[h] = w.block((h0 + h) / 2);
    half[h] = static_cast<int>((h0 + h) % 2);
  }
  const int8_t* xr[R];
  for (int r = 0; r < R; ++r) xr[r] = a.xq + (r0 + r) * kp;
  const __m256i low = _mm256_set1_epi8(0x0F), ones = _mm256_set1_epi16(1);
  __m256 facc[R][NH];
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r) {
#pragma GCC unroll 16
    for (int h = 0; h < NH; ++h) facc[r][h] = _mm256_setzero_ps();
  }
  for (int64_t g = 0; g < groups; ++g) {
    __m256i acc[R][NH];
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) {
      const __m256i init = _mm256_set1_epi32(-8 * a.xsum[(r0 + r) * groups + g]);
#pragma GCC unroll 16
      for (int h = 0; h < NH; ++h) acc[r][h] = init;
    }
    for (int64_t p0 = 0; p0 < pairs; p0 += 4) {
      const int64_t p1 = std::min<int64_t>(pairs, p0 + 4);
      __m256i s16[R][NH];
#pragma GCC unroll 16
      for (int r = 0; r < R; ++r) {
#pragma GCC unroll 16
        for (int h = 0; h < NH; ++h) s16[r][h] = _mm256_setzero_si256();
      }
      for (int64_t p = p0; p < p1; ++p) {
        __m256i lo[NH], hi[NH];
#pragma GCC unroll 16
        for (int h = 0; h < NH; ++h) {
          const __m256i v = _mm256_load_si256(
              reinterpret_cast<const __m256i*>(wb[h] + (g * pairs + p) * 64 + half[h] * 32));
          lo[h] = _mm256_and_si256(v, low);
          hi[h] = _mm256_and_si256(_mm256_srli_epi16(v, 4), low);
        }
        const int64_t k = (g * pairs + p) * 8;
#pragma GCC unroll 16
        for (int r = 0; r < R; ++r) {
          const __m256i x0 = _mm256_set1_epi32(Load4(xr[r] + k));
          const __m256i x1 = _mm256_set1_epi32(Load4(xr[r] + k + 4));
#pragma GCC unroll 16
          for (int h = 0; h < NH; ++h) {
            s16[r][h] = _mm256_add_epi16(s16[r][h], _mm256_maddubs_epi16(lo[h], x0));
            s16[r][h] = _mm256_add_epi16(s16[r][h], _mm256_maddubs_epi16(hi[h], x1));
          }
        }
      }
#pragma GCC unroll 16
      for (int r = 0; r < R; ++r) {
#pragma GCC unroll 16
        for (int h = 0; h < NH; ++h) {
          acc[r][h] = _mm256_add_epi32(acc[r][h], _mm256_madd_epi16(s16[r][h], ones));
        }
      }
    }
#pragma GCC unroll 16
    for (int h = 0; h < NH; ++h) {
      const __m256 s = _mm256_cvtph_ps(_mm_load_si128(reinterpret_cast<const __m128i*>(
          wb[h] + w.scale_offset() + g * kQuantBlock * 2 + half[h] * 16)));
#pragma GCC unroll 16
      for (int r = 0; r < R; ++r) {
        facc[r][h] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(acc[r][h]), s, facc[r][h]);
      }
    }
  }
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r) {
    const __m256 t = _mm256_set1_ps(a.xscale[r0 + r]);
#pragma GCC unroll 16
    for (int h = 0; h < NH; ++h) {
      _mm256_storeu_ps(a.out + (r0 + r) * a.ldo + (h0 + h) * 8 - a.b_begin * kQuantBlock,
                       _mm256_mul_ps(facc[r][h], t));
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

KV_VNNI void Q4Vnni512(const QuantGemmArgs& a) {
  const int64_t per_group = BlocksPerGroup(*a.w);
  for (int64_t g0 = a.b_begin; g0 < a.b_end; g0 += per_group) {
    const int64_t g1 = std::min(a.b_end, g0 + per_group);
    int64_t r = 0;
    for (; r + 4 <= a.rows; r += 4) ColsVnni<4, 2>(a, r, g0, g1);
    switch (a.rows - r) {
      case 3:
        ColsVnni<3, 2>(a, r, g0, g1);
        break;
      case 2:
        ColsVnni<2, 2>(a, r, g0, g1);
        break;
      case 1:
        ColsVnni<1, 4>(a, r, g0, g1);
        break;
      default:
        break;
    }
  }
}

KV_AVX2 void Q4Avx2(const QuantGemmArgs& a) {
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

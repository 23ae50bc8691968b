// The AVX-512 kernel of cpu::Linear (gemm.h), for prefill and batched steps.
//
// A 512-bit register holds the eight FMA lanes of one output for two rows
// of x: lanes 0-7 for row 2p, 8-15 for row 2p + 1. So each step of eight k
// broadcasts eight weights of a row of W into both halves (one load, no
// shuffle) and multiplies them with a pair of rows, and every lane still
// runs the chain gemm_internal.h fixes: the bits equal the AVX2 kernel's.
// For that x is first packed pairwise, [pair][k / 8][2][8] (a missing odd
// row and the k tail are zeros, and a zero product leaves a chain as it
// was).
//
// Tiles are three pairs (six rows) by eight outputs: 24 accumulators, three
// loads of x and eight broadcasts of W per 24 FMAs. W is walked in blocks
// that stay in L2 while every row tile passes over them.
#include <algorithm>
#include <cstdlib>
#include <memory>

#include "kernels/cpu/layers/gemm_internal.h"

#if defined(__x86_64__)

// GCC 12's _mm512_broadcast_f32x8 and _mm512_extractf32x8_ps pass an
// _mm512_undefined_ps() as the unused merge source, which -Wmaybe-uninitialized
// reports once per call site; the value is never read.
#if !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

namespace kvserve::cpu::internal {
namespace {

#define KV_AVX512 __attribute__((target("avx512f,avx512dq,avx512vl,avx2,fma")))

struct FreeDeleter {
  void operator()(float* p) const { std::free(p); }
};

// A per-thread scratch of at least n floats, 64-byte aligned, grown, never shrunk.
float* Scratch(int64_t n) {
  thread_local std::unique_ptr<float, FreeDeleter> buf;
  thread_local int64_t cap = 0;
  if (n > cap) {
    cap = std::max<int64_t>(n, cap * 2);
    buf.reset(static_cast<float*>(std::aligned_alloc(64, (cap * sizeof(float) + 63) / 64 * 64)));
    if (buf == nullptr) std::abort();
  }
  return buf.get();
}

// Rows [0, rows) of x into pairs (see the top); `stride` floats per pair.
KV_AVX512 void PackPairs(const float* x, int64_t rows, int64_t in, float* packed, int64_t stride) {
  const int64_t in8 = in & ~int64_t{7};
  const __mmask8 tail = static_cast<__mmask8>((1u << (in & 7)) - 1);
  const int64_t pairs = (rows + 1) / 2;
  for (int64_t p = 0; p < pairs; ++p) {
    for (int64_t h = 0; h < 2; ++h) {
      float* dst = packed + p * stride + h * 8;
      const int64_t r = 2 * p + h;
      if (r >= rows) {
        for (int64_t k = 0; k < stride / 2; k += 8)
          _mm256_store_ps(dst + 2 * k, _mm256_setzero_ps());
        continue;
      }
      const float* src = x + r * in;
      int64_t k = 0;
      for (; k < in8; k += 8) _mm256_store_ps(dst + 2 * k, _mm256_loadu_ps(src + k));
      if (k < in) _mm256_store_ps(dst + 2 * k, _mm256_maskz_loadu_ps(tail, src + k));
    }
  }
}

// Stores (or adds) n <= 8 sums to y.
KV_AVX512 inline void Put(float* y, __m256 sums, int64_t n, bool accumulate) {
  if (n == 8) {
    _mm256_storeu_ps(y, accumulate ? _mm256_add_ps(_mm256_loadu_ps(y), sums) : sums);
    return;
  }
  const __mmask8 m = static_cast<__mmask8>((1u << n) - 1);
  if (accumulate) sums = _mm256_add_ps(_mm256_maskz_loadu_ps(m, y), sums);
  _mm256_mask_storeu_ps(y, m, sums);
}

// RP pairs of packed rows (the first at xp) against W rows o .. o + 7; rows
// of W past `out` are clamped to the last and their sums dropped. y_rows
// says how many of the 2 * RP rows exist.
template <int RP>
KV_AVX512 inline void Tile(const float* xp, int64_t stride, const float* w, int64_t in, int64_t o,
                           int64_t out, float* y, int64_t ldy, int64_t y_rows, bool accumulate) {
  constexpr int OT = 8;
  const float* wr[OT];
#pragma GCC unroll 8
  for (int i = 0; i < OT; ++i) wr[i] = w + std::min<int64_t>(o + i, out - 1) * in;
  __m512 acc[RP][OT];
#pragma GCC unroll 8
  for (int p = 0; p < RP; ++p) {
#pragma GCC unroll 8
    for (int i = 0; i < OT; ++i) acc[p][i] = _mm512_setzero_ps();
  }
  const int64_t in8 = in & ~int64_t{7};
  const float* xk = xp;
  for (int64_t k = 0; k < in8; k += 8, xk += 16) {
    __m512 xv[RP];
#pragma GCC unroll 8
    for (int p = 0; p < RP; ++p) xv[p] = _mm512_load_ps(xk + p * stride);
#pragma GCC unroll 8
    for (int i = 0; i < OT; ++i) {
      const __m512 wv = _mm512_broadcast_f32x8(_mm256_loadu_ps(wr[i] + k));
#pragma GCC unroll 8
      for (int p = 0; p < RP; ++p) acc[p][i] = _mm512_fmadd_ps(wv, xv[p], acc[p][i]);
    }
  }
  if (in8 < in) {
    const __mmask8 tail = static_cast<__mmask8>((1u << (in & 7)) - 1);
    __m512 xv[RP];
#pragma GCC unroll 8
    for (int p = 0; p < RP; ++p) xv[p] = _mm512_load_ps(xk + p * stride);
#pragma GCC unroll 8
    for (int i = 0; i < OT; ++i) {
      const __m512 wv = _mm512_broadcast_f32x8(_mm256_maskz_loadu_ps(tail, wr[i] + in8));
#pragma GCC unroll 8
      for (int p = 0; p < RP; ++p) acc[p][i] = _mm512_fmadd_ps(wv, xv[p], acc[p][i]);
    }
  }
  const int64_t valid = std::min<int64_t>(OT, out - o);
#pragma GCC unroll 8
  for (int p = 0; p < RP; ++p) {
    __m256 lo[OT], hi[OT];
#pragma GCC unroll 8
    for (int i = 0; i < OT; ++i) {
      lo[i] = _mm512_castps512_ps256(acc[p][i]);
      hi[i] = _mm512_extractf32x8_ps(acc[p][i], 1);
    }
    if (2 * p < y_rows) Put(y + 2 * p * ldy + o, Reduce8(lo), valid, accumulate);
    if (2 * p + 1 < y_rows) Put(y + (2 * p + 1) * ldy + o, Reduce8(hi), valid, accumulate);
  }
}

}  // namespace

bool CpuHasAvx512Gemm() {
  static const bool has = [] {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512dq") &&
           __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx2") &&
           __builtin_cpu_supports("fma");
  }();
  return has;
}

KV_AVX512 void LinearAvx512(const float* x, int64_t rows, int64_t in, const float* w, int64_t out,
                            float* y, int64_t ldy, bool accumulate) {
  const int64_t stride = (in + 7) / 8 * 16;  // floats per packed pair
  const int64_t pairs = (rows + 1) / 2;
  float* packed = Scratch(pairs * stride);
  PackPairs(x, rows, in, packed, stride);
  constexpr int64_t kBlockBytes = 512 * 1024;
  const int64_t block =
      std::max<int64_t>(8, (kBlockBytes / (in * int64_t{sizeof(float)})) & ~int64_t{7});
  for (int64_t o0 = 0; o0 < out; o0 += block) {
    const int64_t o1 = std::min(out, o0 + block);
    int64_t p = 0;
    for (; p + 3 <= pairs; p += 3) {
      const float* xp = packed + p * stride;
      float* yp = y + 2 * p * ldy;
      const int64_t n = std::min<int64_t>(6, rows - 2 * p);
      for (int64_t o = o0; o < o1; o += 8)
        Tile<3>(xp, stride, w, in, o, out, yp, ldy, n, accumulate);
    }
    const int64_t left = pairs - p;
    if (left == 0) continue;
    const float* xp = packed + p * stride;
    float* yp = y + 2 * p * ldy;
    const int64_t n = rows - 2 * p;
    for (int64_t o = o0; o < o1; o += 8) {
      if (left == 2) {
        Tile<2>(xp, stride, w, in, o, out, yp, ldy, n, accumulate);
      } else {
        Tile<1>(xp, stride, w, in, o, out, yp, ldy, n, accumulate);
      }
    }
  }
}

}  // namespace kvserve::cpu::internal

#endif  // __x86_64__

#include "kernels/cpu/layers/gemm.h"

#include <algorithm>

#include "kernels/cpu/cpu_features.h"
#include "kernels/cpu/layers/gemm_internal.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace kvserve::cpu {
namespace {

#if defined(__x86_64__)
using internal::Reduce4;
using internal::Reduce8;
#endif

void LinearScalar(const float* x, int64_t rows, int64_t in, const float* w, int64_t out, float* y,
                  int64_t ldy, bool accumulate) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * in;
    float* yr = y + r * ldy;
    for (int64_t o = 0; o < out; ++o) {
      const float* wr = w + o * in;
      float s = 0.0f;
      for (int64_t k = 0; k < in; ++k) s += wr[k] * xr[k];
      yr[o] = accumulate ? yr[o] + s : s;
    }
  }
}

#if defined(__x86_64__)
#define KV_AVX2 __attribute__((target("avx2,fma")))

// One tile: R rows of x against OT consecutive rows of W (OT = 4 or 8).
// Each output is its own FMA chain over k in steps of 8 (the last step
// masked), reduced by the same tree, so the result of an element does not
// depend on R, OT or where the tile starts. Rows of W past `out` are clamped
// to the last one and their results dropped.
//
// The loops over R and OT are unrolled so the accumulators live in
// registers; only the reduced sums go through memory (buf).
template <int R, int OT>
KV_AVX2 inline void Tile(const float* const* xr, const float* w, int64_t in, int64_t o, int64_t out,
                         float* const* yr, bool accumulate, __m256i tail_mask) {
  const float* wr[OT];
  if (o + OT <= out) {
#pragma GCC unroll 16
    for (int i = 0; i < OT; ++i) wr[i] = w + (o + i) * in;
  } else {
#pragma GCC unroll 16
    for (int i = 0; i < OT; ++i) wr[i] = w + std::min<int64_t>(o + i, out - 1) * in;
  }
  __m256 acc[R][OT];
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r) {
#pragma GCC unroll 16
    for (int i = 0; i < OT; ++i) acc[r][i] = _mm256_setzero_ps();
  }
  const int64_t in8 = in & ~int64_t{7};
  for (int64_t k = 0; k < in8; k += 8) {
    __m256 xv[R];
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) xv[r] = _mm256_loadu_ps(xr[r] + k);
#pragma GCC unroll 16
    for (int i = 0; i < OT; ++i) {
      const __m256 wv = _mm256_loadu_ps(wr[i] + k);
#pragma GCC unroll 16
      for (int r = 0; r < R; ++r) acc[r][i] = _mm256_fmadd_ps(wv, xv[r], acc[r][i]);
    }
  }
  if (in8 < in) {
    __m256 xv[R];
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) xv[r] = _mm256_maskload_ps(xr[r] + in8, tail_mask);
#pragma GCC unroll 16
    for (int i = 0; i < OT; ++i) {
      const __m256 wv = _mm256_maskload_ps(wr[i] + in8, tail_mask);
#pragma GCC unroll 16
      for (int r = 0; r < R; ++r) acc[r][i] = _mm256_fmadd_ps(wv, xv[r], acc[r][i]);
    }
  }
  alignas(32) float buf[R][OT];
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r) {
    if constexpr (OT == 8) {
      _mm256_store_ps(buf[r], Reduce8(acc[r]));
    } else {
      _mm_store_ps(buf[r], Reduce4(acc[r][0], acc[r][1], acc[r][2], acc[r][3]));
    }
  }
  const int64_t valid = std::min<int64_t>(OT, out - o);
  for (int r = 0; r < R; ++r) {
    float* yo = yr[r] + o;
    if (accumulate) {
      for (int64_t i = 0; i < valid; ++i) yo[i] += buf[r][i];
    } else {
      for (int64_t i = 0; i < valid; ++i) yo[i] = buf[r][i];
    }
  }
}

// Outputs [o_begin, o_end) of rows r .. r+R-1: tiles of three rows x four
// outputs (twelve independent chains); a single row (decode) takes eight
// outputs per tile so that it still has eight chains in flight.
template <int R>
KV_AVX2 void RowTile(const float* x, int64_t r, int64_t in, const float* w, int64_t o_begin,
                     int64_t o_end, int64_t out, float* y, int64_t ldy, bool accumulate,
                     __m256i tail_mask) {
  const float* xr[R];
  float* yr[R];
  for (int i = 0; i < R; ++i) {
    xr[i] = x + (r + i) * in;
    yr[i] = y + (r + i) * ldy;
  }
  constexpr int OT = R == 1 ? 8 : 4;
  for (int64_t o = o_begin; o < o_end; o += OT) {
    Tile<R, OT>(xr, w, in, o, out, yr, accumulate, tail_mask);
  }
}

KV_AVX2 void LinearAvx2(const float* x, int64_t rows, int64_t in, const float* w, int64_t out,
                        float* y, int64_t ldy, bool accumulate) {
  const int tail = static_cast<int>(in & 7);
  alignas(32) int32_t mask_bits[8];
  for (int i = 0; i < 8; ++i) mask_bits[i] = i < tail ? -1 : 0;
  const __m256i tail_mask = _mm256_load_si256(reinterpret_cast<const __m256i*>(mask_bits));
  // Walk W in blocks that stay in L2 while every row passes over them; a
  // block is a multiple of 8 outputs so tiles never straddle two blocks.
  constexpr int64_t kBlockBytes = 256 * 1024;
  const int64_t block =
      std::max<int64_t>(8, (kBlockBytes / (in * int64_t{sizeof(float)})) & ~int64_t{7});
  for (int64_t o0 = 0; o0 < out; o0 += block) {
    const int64_t o1 = std::min(out, o0 + block);
    int64_t r = 0;
    for (; r + 3 <= rows; r += 3) {
      RowTile<3>(x, r, in, w, o0, o1, out, y, ldy, accumulate, tail_mask);
    }
    if (rows - r == 2) {
      RowTile<2>(x, r, in, w, o0, o1, out, y, ldy, accumulate, tail_mask);
    } else if (rows - r == 1) {
      RowTile<1>(x, r, in, w, o0, o1, out, y, ldy, accumulate, tail_mask);
    }
  }
}
#endif  // __x86_64__

// What kBest means here: KVSERVE_CPU_ISA=scalar forces the scalar loop;
// otherwise AVX-512 from two rows up where the CPU has it (one row is
// memory-bound and gains nothing from it), else AVX2.
LinearKernel BestKernel(int64_t rows) {
#if defined(__x86_64__)
  if (DefaultCpuIsa() != CpuIsa::kAvx2) return LinearKernel::kScalar;
  return rows >= 2 && internal::CpuHasAvx512Gemm() ? LinearKernel::kAvx512 : LinearKernel::kAvx2;
#else
  return LinearKernel::kScalar;
#endif
}

}  // namespace

bool LinearKernelAvailable(LinearKernel kernel) {
  switch (kernel) {
    case LinearKernel::kBest:
    case LinearKernel::kScalar:
      return true;
    case LinearKernel::kAvx2:
#if defined(__x86_64__)
      return CpuHasAvx2();
#else
      return false;
#endif
    case LinearKernel::kAvx512:
#if defined(__x86_64__)
      return internal::CpuHasAvx512Gemm();
#else
      return false;
#endif
  }
  return false;
}

void Linear(const float* x, int64_t rows, int64_t in, const float* w, int64_t out, float* y,
            int64_t ldy, bool accumulate, LinearKernel kernel) {
  if (rows <= 0 || out <= 0) return;
  if (kernel == LinearKernel::kBest) kernel = BestKernel(rows);
  if (!LinearKernelAvailable(kernel)) kernel = LinearKernel::kScalar;
  switch (kernel) {
#if defined(__x86_64__)
    case LinearKernel::kAvx512:
      internal::LinearAvx512(x, rows, in, w, out, y, ldy, accumulate);
      return;
    case LinearKernel::kAvx2:
      LinearAvx2(x, rows, in, w, out, y, ldy, accumulate);
      return;
#endif
    default:
      LinearScalar(x, rows, in, w, out, y, ldy, accumulate);
      return;
  }
}

void MatVec(const float* w, const float* x, float* y, int64_t out, int64_t in, bool accumulate,
            MatVecKernel kernel) {
  const LinearKernel k = kernel == MatVecKernel::kAvx2     ? LinearKernel::kAvx2
                         : kernel == MatVecKernel::kScalar ? LinearKernel::kScalar
                                                           : LinearKernel::kBest;
  Linear(x, 1, in, w, out, y, out, accumulate, k);
}

}  // namespace kvserve::cpu

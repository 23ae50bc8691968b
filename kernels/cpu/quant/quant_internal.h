// Internal to kernels/cpu/quant/: what QuantLinear hands its kernels.
// Activations are already quantized (quant_matrix.h); a kernel fills `out`
// with the finished floats of whole blocks [b_begin, b_end) and QuantLinear
// stores or adds the requested outputs, so every kernel ends on the same
// float operations.
//
// Thread-safety: pure functions of their arguments.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "kernels/cpu/quant/quant_matrix.h"

namespace kvserve::cpu::internal {

struct QuantGemmArgs {
  const QuantMatrix* w = nullptr;
  const int8_t* xh = nullptr;      // [rows][k_padded] activations' high bytes h
  const uint8_t* xhu = nullptr;    // [rows][k_padded] h + 128 (int8 on VNNI only)
  const uint8_t* xl = nullptr;     // [rows][k_padded] low bytes l
  const float* xscale = nullptr;   // [rows] t
  const int32_t* sum_h = nullptr;  // [rows][num_groups] sums of h (int4 only)
  const int32_t* sum_l = nullptr;  // [rows][num_groups] sums of l (int4 only)
  // [rows][num_groups] 128 float(sum_h) + float(sum_l), what a group's
  // offset multiplies (int4_asym only)
  const float* sum_x = nullptr;
  int64_t rows = 0;
  int64_t b_begin = 0, b_end = 0;  // blocks of kQuantBlock outputs
  float* out = nullptr;            // [rows][ldo]; block b at (b - b_begin) * kQuantBlock
  int64_t ldo = 0;
};

// Weight bytes a group of blocks may span so that it stays in L2 while
// every row tile passes over it.
inline constexpr int64_t kQuantL2Bytes = 256 * 1024;

// Output-channel blocks per such group (at least 4).
inline int64_t BlocksPerGroup(const QuantMatrix& w) {
  return std::max<int64_t>(4, kQuantL2Bytes / w.block_stride());
}

// 128 h + l recombined in float, as every kernel does.
inline float Combine(int32_t acc_h, int32_t acc_l) {
  return static_cast<float>(acc_h) * 128.0f + static_cast<float>(acc_l);
}

// Four bytes as one int32 (an unaligned activation quad for a broadcast).
inline int32_t Load4(const void* p) {
  int32_t v;
  std::memcpy(&v, p, 4);
  return v;
}

void Q8Scalar(const QuantGemmArgs& a);
void Q4Scalar(const QuantGemmArgs& a);
#if defined(__x86_64__)
void Q8Avx2(const QuantGemmArgs& a);
void Q8Vnni512(const QuantGemmArgs& a);
void Q4Avx2(const QuantGemmArgs& a);
void Q4Vnni512(const QuantGemmArgs& a);
#endif

}  // namespace kvserve::cpu::internal

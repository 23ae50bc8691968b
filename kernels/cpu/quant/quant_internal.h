// Internal to kernels/cpu/quant/: what QuantLinear hands its kernels.
// Activations are already quantized (quant_matrix.h); a kernel fills `out`
// with the finished floats of whole blocks [b_begin, b_end) and QuantLinear
// stores or adds the requested outputs, so every kernel ends on the same
// float operations.
//
// Thread-safety: pure functions of their arguments.
#pragma once

#include <cstdint>

#include "kernels/cpu/quant/quant_matrix.h"

namespace kvserve::cpu::internal {

struct QuantGemmArgs {
  const QuantMatrix* w = nullptr;
  const int8_t* xq = nullptr;     // [rows][k_padded] activations p
  const uint8_t* xu = nullptr;    // [rows][k_padded] p + 128 (int8 on VNNI only)
  const float* xscale = nullptr;  // [rows] t
  const int32_t* xsum = nullptr;  // [rows][num_groups] sums of p (int4 only)
  int64_t rows = 0;
  int64_t b_begin = 0, b_end = 0;  // blocks of kQuantBlock outputs
  float* out = nullptr;            // [rows][ldo]; block b at (b - b_begin) * kQuantBlock
  int64_t ldo = 0;
};

// Weight bytes a group of blocks may span so that it stays in L2 while
// every row tile passes over it.
inline constexpr int64_t kQuantL2Bytes = 256 * 1024;

void Q8Scalar(const QuantGemmArgs& a);
void Q4Scalar(const QuantGemmArgs& a);
#if defined(__x86_64__)
void Q8Avx2(const QuantGemmArgs& a);
void Q8Vnni512(const QuantGemmArgs& a);
void Q4Avx2(const QuantGemmArgs& a);
void Q4Vnni512(const QuantGemmArgs& a);
#endif

}  // namespace kvserve::cpu::internal

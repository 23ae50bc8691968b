// Internal to the CPU KV codecs (kv_quant.cc, kv_quant_kc.cc): the scalar
// rounding and clamping every encoder shares, so the AVX2 paths (which use
// _mm256_round_ps and max/min with the operand order noted) match them bit
// for bit.
//
// Thread-safety: pure functions.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#include "cache/format/kv_layout.h"

namespace kvserve::cpu::internal {

// x clamped to [lo, hi]; NaN goes to lo (as the AVX2 integer clamp sends it).
inline float ClampF(float x, float lo, float hi) { return x > lo ? (x < hi ? x : hi) : lo; }

// Round to nearest, ties to even, for |x| < 2^22: adding 1.5 * 2^23 leaves no
// fraction bits, so the FPU's own rounding (nearest even by default) does
// the work. Inline and exact, unlike a libm call.
inline float RoundEven(float x) {
  constexpr float kMagic = 12582912.0f;
  return (x + kMagic) - kMagic;
}

// int4_kc / int2_kc K: channel d's scale and zero from a head's block meta,
// exactly as cache/format/kv_layout.h defines them (levels: KvCodeLevels(bits)).
inline void Int4ChannelAffineAt(const uint8_t* meta, int d, float* scale, float* zero,
                                int levels = kInt4ChannelLevels) {
  float lo, unit;
  std::memcpy(&lo, meta, 4);
  std::memcpy(&unit, meta + 4, 4);
  const int cmin = meta[kInt4ChannelHeader + 2 * d];
  const int cmax = meta[kInt4ChannelHeader + 2 * d + 1];
  *scale = static_cast<float>(cmax - cmin) * unit;
  *zero = std::fma(static_cast<float>(levels * cmin), unit, lo);
}

// Code c of a row of `bits`-bit codes (4: channel 2i in the low nibble of
// byte i; 2: channel 4i + k in bits 2k, 2k + 1).
inline int CodeAt(const uint8_t* row, int c, int bits) {
  const int per = 8 / bits;
  return (row[c / per] >> ((c % per) * bits)) & ((1 << bits) - 1);
}

}  // namespace kvserve::cpu::internal

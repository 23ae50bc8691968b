// KV quantization: how one token's K or V values for one head become one row
// of a KvFormat page (data + scales), and back. WriteKv quantizes with these;
// the attention kernels decode the same encodings in registers.
//
// Encodings (per row = one token, one kv head, head_dim values):
//   fp32  raw floats.
//   fp16  IEEE binary16, round to nearest even. Values beyond +-65504 are
//         saturated to +-65504 so a page never holds inf.
//   bf16  upper 16 bits of the float, round to nearest even.
//   fp8   OCP E4M3FN (bias 7, 3 mantissa bits, max 448, no inf, NaN = 0x7f):
//         q = e4m3(x / s), value = q * s, s (fp32, in meta) = amax / 448 or
//         amax / 448 * sqrt(2), whichever gives the row the smaller squared
//         error (E4M3's error is relative, so the offset decides where values
//         fall between representable ones; neither scale overflows).
//   int8  symmetric: s = amax / 127 (fp32, in meta), q = round(x / s) in
//         [-127, 127] (nearest, ties to even); value = q * s.
//   int4  asymmetric per group of G = part.group_size channels: scale =
//         (max - min) / 15 and zero = min, both stored as fp16 (meta holds
//         [scale, zero] per group, as uint16 pairs, group 0 first); q =
//         round((x - zero) / scale) in [0, 15] computed against the stored
//         fp16 values, value = q * scale + zero. Channel 2i is the low
//         nibble of byte i, 2i+1 the high nibble.
// A row whose scale would be 0 (all zeros; for int4 a constant group) stores
// q = 0 and scale 0, and decodes exactly to 0 (int4: to zero).
//
// Thread-safety: pure functions.
#pragma once

#include <cstdint>

#include "cache/kv_layout.h"
#include "kernels/cpu/cpu_features.h"

namespace kvserve::cpu {

inline constexpr float kFp16Max = 65504.0f;
inline constexpr float kFp8E4m3Max = 448.0f;
inline constexpr float kInt8Max = 127.0f;
inline constexpr int kInt4MaxLevel = 15;

// Element codecs (scalar, exact IEEE round to nearest even).
uint16_t FloatToFp16(float x);  // overflow -> inf, NaN -> quiet NaN
float Fp16ToFloat(uint16_t h);
uint16_t FloatToBf16(float x);  // NaN -> quiet NaN
float Bf16ToFloat(uint16_t b);
uint8_t FloatToFp8E4m3(float x);  // saturates to +-448; NaN -> 0x7f
float Fp8E4m3ToFloat(uint8_t b);

// Stores x[0, head_dim) as one row of `part`: data gets part.row_bytes bytes,
// meta gets part.meta_bytes (may be null when that is 0). head_dim must be
// even and a multiple of part.group_size for int4. The AVX2 and scalar paths
// produce identical bytes.
void QuantizeRow(const KvPartLayout& part, int head_dim, const float* x, uint8_t* data,
                 uint8_t* meta, CpuIsa isa = CpuIsa::kAuto);

// Decodes one row written by QuantizeRow into out[0, head_dim).
void DequantizeRow(const KvPartLayout& part, int head_dim, const uint8_t* data, const uint8_t* meta,
                   float* out);

}  // namespace kvserve::cpu

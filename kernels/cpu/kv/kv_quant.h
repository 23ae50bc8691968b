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
// A kInt4 part with bits = 2 (int2_kc's V) is int4 with 3 levels: scale =
// (max - min) / 3, q in [0, 3], four codes a byte (kv_layout.h).
//
// int4_kc K (kInt4Channel; layout and decoding in cache/format/kv_layout.h) is
// quantized per block, one kv head at a time, once all block_size rows are
// known: per channel d, min_d and max_d over the block's rows; the head's
// lo = min_d min_d, hi = max_d max_d, unit = (hi - lo) / 3825 (fp32);
// cmin_d = floor((min_d - lo) / (15 * unit)) and cmax_d = ceil((max_d - lo) /
// (15 * unit)), clamped to [0, 255], then widened one code at a time while
// the decoded zero_d is above min_d or zero_d + 15 * scale_d is below max_d
// (float rounding), so every channel's levels cover its values; q =
// round((x - zero_d) / scale_d) (nearest, ties to even) clamped to [0, 15],
// against the decoded scale_d and zero_d. Hence |x - value| <= scale_d / 2,
// and scale_d <= (max_d - min_d) / 15 + 2 * unit (+ rounding): each channel
// is quantized on its own range, whatever the other channels' magnitudes.
// A block whose values are all equal (or not finite) stores unit 0 and
// codes 0 and decodes to lo (0 when not finite). A channel with scale_d 0
// stores q = 0. int2_kc's K (part.bits = 2) is the same with L = 3 where
// int4_kc has 15: unit = (hi - lo) / (255 * 3), steps of 3 units, q in
// [0, 3].
//
// Thread-safety: pure functions.
#pragma once

#include <cstdint>

#include "cache/format/kv_layout.h"
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

// Decodes one row written by QuantizeRow into out[0, head_dim). For
// kInt4Channel, data is the row's codes and meta the head's block meta.
void DequantizeRow(const KvPartLayout& part, int head_dim, const uint8_t* data, const uint8_t* meta,
                   float* out);

// int4_kc K: quantizes one kv head's rows of a full block. rows[j] (j <
// block_size) points at row j's head_dim floats; row j's codes go to codes +
// j * part.row_bytes, the head's block meta (part.meta_bytes) to meta.
// head_dim must be even. The AVX2 and scalar paths produce identical bytes.
void QuantizeBlockKChannel(const KvPartLayout& part, int head_dim, int block_size,
                           const float* const* rows, uint8_t* codes, uint8_t* meta,
                           CpuIsa isa = CpuIsa::kAuto);

// The per-channel scale_d and zero_d that a head's int4_kc (bits 4) or
// int2_kc (bits 2) K meta encodes (cache/format/kv_layout.h), for d < head_dim.
void Int4ChannelAffine(const uint8_t* meta, int head_dim, float* scale, float* zero, int bits = 4);

}  // namespace kvserve::cpu

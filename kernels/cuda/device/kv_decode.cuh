// Device-side decoding of KV page rows (cache/format/kv_layout.h, encodings in
// kernels/cpu/kv/kv_quant.h), in registers. Every decoder returns exactly the
// floats kvserve::cpu::DequantizeRow returns for the same bytes (same
// products, same rounding: no fused multiply-add where the CPU rounds twice),
// so the CUDA and CPU attention kernels see identical K and V values and
// differ only in accumulation order.
//
//   DecodePair<E>(row, meta, i, group_size) -> channels 2i and 2i + 1
//
// row points at one token's row of one head (KvPageLayout::RowOffset), meta
// at its scales (MetaOffset; unused for fp32/fp16/bf16). Alignment: rows are
// whole multiples of 2 * element size from a 16-byte aligned region, so the
// pair loads (8, 4, 4, 2, 2, 1 bytes) are naturally aligned.
//
// Conversions: fp16 through cuda_fp16; bf16 by shifting into the high half
// of a float; fp8 e4m3 through cuda_fp8's paired conversion, which is one
// cvt.rn.f16x2.e4m3x2 instruction on sm_89 and later (a software path on
// older targets); int4 and int8 codes by planting them in the mantissa of
// 2^23 (0x4B000000 | q) and subtracting 2^23, which is exact and cheaper
// than an integer-to-float conversion.
//
// Thread-safety: pure device functions.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cstdint>

#include "cache/format/kv_layout.h"

namespace kvserve::cuda::kv_decode {

// q in [0, 2^23) as a float, exactly: 2^23 + q has q in its mantissa bits.
__device__ __forceinline__ float SmallUintToFloat(uint32_t q) {
  return __uint_as_float(0x4B000000u | q) - 8388608.0f;
}

// A signed byte (two's complement) as a float, exactly: bias by 128 first.
__device__ __forceinline__ float Int8ToFloat(uint32_t byte) {
  return __uint_as_float(0x4B000000u | ((byte ^ 0x80u) & 0xffu)) - 8388736.0f;  // 2^23 + 128
}

// Two E4M3FN codes (low byte = first) as floats, exactly.
__device__ __forceinline__ float2 Fp8x2ToFloat2(uint16_t codes) {
  const __half2_raw raw =
      __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(codes), __NV_E4M3);
  return __half22float2(__half2(raw));
}

template <KvElem E>
__device__ __forceinline__ float2 DecodePair(const uint8_t* row, const uint8_t* meta, int i,
                                             int group_size);

template <>
__device__ __forceinline__ float2 DecodePair<KvElem::kFp32>(const uint8_t* row, const uint8_t*,
                                                            int i, int) {
  return reinterpret_cast<const float2*>(row)[i];
}

template <>
__device__ __forceinline__ float2 DecodePair<KvElem::kFp16>(const uint8_t* row, const uint8_t*,
                                                            int i, int) {
  return __half22float2(reinterpret_cast<const __half2*>(row)[i]);
}

template <>
__device__ __forceinline__ float2 DecodePair<KvElem::kBf16>(const uint8_t* row, const uint8_t*,
                                                            int i, int) {
  const uint32_t u = reinterpret_cast<const uint32_t*>(row)[i];
  return make_float2(__uint_as_float(u << 16), __uint_as_float(u & 0xffff0000u));
}

template <>
__device__ __forceinline__ float2 DecodePair<KvElem::kFp8E4m3>(const uint8_t* row,
                                                               const uint8_t* meta, int i, int) {
  const float scale = *reinterpret_cast<const float*>(meta);
  const float2 f = Fp8x2ToFloat2(reinterpret_cast<const uint16_t*>(row)[i]);
  return make_float2(__fmul_rn(f.x, scale), __fmul_rn(f.y, scale));
}

template <>
__device__ __forceinline__ float2 DecodePair<KvElem::kInt8>(const uint8_t* row, const uint8_t* meta,
                                                            int i, int) {
  const float scale = *reinterpret_cast<const float*>(meta);
  const uint32_t b = reinterpret_cast<const uint16_t*>(row)[i];
  return make_float2(__fmul_rn(Int8ToFloat(b), scale), __fmul_rn(Int8ToFloat(b >> 8), scale));
}

// [scale, zero] fp16 pair of the group holding channel c.
__device__ __forceinline__ float2 Int4ScaleZero(const uint8_t* meta, int c, int group_size) {
  const __half2 sz = reinterpret_cast<const __half2*>(meta)[c / group_size];
  return __half22float2(sz);  // .x = scale (first in memory), .y = zero
}

template <>
__device__ __forceinline__ float2 DecodePair<KvElem::kInt4>(const uint8_t* row, const uint8_t* meta,
                                                            int i, int group_size) {
  // Channels 2i and 2i + 1 are in one group (group sizes are even).
  const float2 sz = Int4ScaleZero(meta, 2 * i, group_size);
  const uint32_t b = row[i];
  const float lo = SmallUintToFloat(b & 0xfu), hi = SmallUintToFloat(b >> 4);
  return make_float2(__fadd_rn(__fmul_rn(lo, sz.x), sz.y), __fadd_rn(__fmul_rn(hi, sz.x), sz.y));
}

}  // namespace kvserve::cuda::kv_decode

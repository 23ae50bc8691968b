// KvPageLayout: the byte layout of one block of the paged KV cache, for one
// layer, as a plain value that host and device code share. KvFormat (in
// kv_format.h) builds and validates it; kernels (CPU and CUDA) receive it by
// value and compute offsets with the helpers below, so both backends read and
// write the same bytes.
//
// Block layout (one layer; a block id names the same slot in every layer):
//   [K data][K meta][V data][V meta]        each region 16-byte aligned
//   K/V data: [num_kv_heads][block_size][row_bytes]
//   K/V meta: [num_kv_heads][block_size][meta_bytes]
// row_bytes = head_dim * bits / 8. meta_bytes per token per head:
//   fp32/fp16/bf16: 0
//   fp8_e4m3, int8: 4  (one fp32 scale; value = q * scale)
//   int4: (head_dim / group_size) * 4  (fp16 scale, fp16 zero per group,
//         stored as [scale, zero] pairs, group 0 first;
//         value = q * scale + zero, q in [0, 15], two values per byte,
//         channel 2i in the low nibble, 2i+1 in the high nibble)
// How values are quantized into this layout: kernels/cpu/kv_quant.h (the CUDA
// kernels follow it bit for bit). block_bytes is rounded up to 64 bytes so
// every block starts on a cache line.
//
// This header has no dependencies beyond <cstdint> so that nvcc device code
// can include it. Thread-safety: plain values.
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define KV_HOST_DEVICE __host__ __device__
#else
#define KV_HOST_DEVICE
#endif

namespace kvserve {

// What one half (K or V) of a block stores.
enum class KvElem : uint8_t { kFp32, kFp16, kBf16, kFp8E4m3, kInt8, kInt4 };

struct KvPartLayout {
  KvElem elem = KvElem::kFp32;
  int32_t row_bytes = 0;   // bytes of one token's head_dim values
  int32_t meta_bytes = 0;  // bytes of one token's scale/zero for one head
  int32_t group_size = 0;  // int4 channels per scale group; head_dim otherwise
  int64_t data_offset = 0; // from the block start
  int64_t meta_offset = 0; // from the block start
};

struct KvPageLayout {
  int32_t num_kv_heads = 0;
  int32_t head_dim = 0;
  int32_t block_size = 0;
  int64_t block_bytes = 0;  // one block of one layer, padded to 64
  KvPartLayout k;
  KvPartLayout v;

  // Byte offset, inside a block, of the row of (head, slot) in a part.
  KV_HOST_DEVICE int64_t RowOffset(const KvPartLayout& part, int head, int slot) const {
    return part.data_offset + (static_cast<int64_t>(head) * block_size + slot) * part.row_bytes;
  }
  KV_HOST_DEVICE int64_t MetaOffset(const KvPartLayout& part, int head, int slot) const {
    return part.meta_offset + (static_cast<int64_t>(head) * block_size + slot) * part.meta_bytes;
  }
};

}  // namespace kvserve

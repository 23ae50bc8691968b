// KvFormat: how one block of the paged KV cache is laid out in memory, for one
// layer, given a storage dtype. The page is self-describing: quantization
// scales live inside the block, right after the data they describe.
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
// How values are quantized into this layout: kernels/cpu/kv_quant.h.
// k8v4 stores K as int8 and V as int4.
//
// The pool is [num_layers][num_blocks][block_bytes]; block_bytes is rounded up
// to 64 bytes so every block starts on a cache line.
//
// Thread-safety: immutable value type.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"

namespace kvserve {

// What the engine is configured with (cache.kv_dtype).
enum class KvDtype : uint8_t { kFp32, kFp16, kBf16, kFp8E4m3, kInt8, kInt4, kK8V4 };
// What one half (K or V) of a block stores.
enum class KvElem : uint8_t { kFp32, kFp16, kBf16, kFp8E4m3, kInt8, kInt4 };

std::string_view KvDtypeName(KvDtype dtype);
// Accepts the names KvDtypeName returns, plus "fp8" and "float32"/"float16"/"bfloat16".
absl::StatusOr<KvDtype> ParseKvDtype(std::string_view name);
// Every dtype, in a stable order (fp32 first), for reports.
inline constexpr KvDtype kAllKvDtypes[] = {KvDtype::kFp32, KvDtype::kFp16, KvDtype::kBf16,
                                           KvDtype::kFp8E4m3, KvDtype::kInt8, KvDtype::kInt4,
                                           KvDtype::kK8V4};

struct KvPartLayout {
  KvElem elem = KvElem::kFp32;
  int32_t row_bytes = 0;   // bytes of one token's head_dim values
  int32_t meta_bytes = 0;  // bytes of one token's scale/zero for one head
  int32_t group_size = 0;  // int4 channels per scale group; head_dim otherwise
  int64_t data_offset = 0; // from the block start
  int64_t meta_offset = 0; // from the block start
};

class KvFormat {
 public:
  // int4_group_size is clamped to head_dim and must divide it.
  static absl::StatusOr<KvFormat> Create(KvDtype dtype, int num_kv_heads, int head_dim,
                                         int block_size, int int4_group_size = 64);

  KvDtype dtype() const { return dtype_; }
  int num_kv_heads() const { return num_kv_heads_; }
  int head_dim() const { return head_dim_; }
  int block_size() const { return block_size_; }
  const KvPartLayout& k() const { return k_; }
  const KvPartLayout& v() const { return v_; }
  // Bytes of one block in one layer (padded to 64).
  int64_t block_bytes() const { return block_bytes_; }
  // Unpadded K+V bytes one token needs in one layer, scales included.
  int64_t bytes_per_token_per_layer() const;

  // Byte offset, inside a block, of the row of (head, slot) in a part.
  int64_t RowOffset(const KvPartLayout& part, int head, int slot) const {
    return part.data_offset + (static_cast<int64_t>(head) * block_size_ + slot) * part.row_bytes;
  }
  int64_t MetaOffset(const KvPartLayout& part, int head, int slot) const {
    return part.meta_offset + (static_cast<int64_t>(head) * block_size_ + slot) * part.meta_bytes;
  }

 private:
  KvDtype dtype_ = KvDtype::kFp32;
  int num_kv_heads_ = 0;
  int head_dim_ = 0;
  int block_size_ = 0;
  KvPartLayout k_;
  KvPartLayout v_;
  int64_t block_bytes_ = 0;
};

}  // namespace kvserve

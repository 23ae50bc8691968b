// cache/format/: what a page of the paged KV cache holds, byte for byte:
// the layout every backend shares (kv_layout.h), the format of each dtype
// that builds and checks it (kv_format.h, this header), the dtype of every
// layer (kv_dtype_spec.h) and the host memory in that layout (kv_pages.h).
// Block ids and their lifetime are the cache manager's (cache/); this
// folder only maps them to bytes.
//
// KvFormat: how one block of the paged KV cache is laid out in memory, for one
// layer, given a storage dtype: builds and validates a KvPageLayout (see
// kv_layout.h for the byte layout every backend shares) and names the dtypes.
// k8v4 stores K as int8 and V as int4. int4_kc (KIVI-style) stores K as int4
// with per-channel ranges over each full block and V as int4 per token; a
// sequence's partial last block stays in full precision in a tail until it
// fills (kv_layout.h has the contract). int2_kc (KIVI-2) is the same with
// 2-bit codes for K and V. Layers may differ in dtype
// (kv_dtype_spec.h); every layer has the same block size.
//
// The pool is, per layer, [num_blocks][block_bytes] (+ [num_tails][tail
// bytes] for int4_kc and int2_kc).
//
// Thread-safety: immutable value type.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "cache/format/kv_layout.h"

namespace kvserve {

// What the engine is configured with (cache.kv_dtype).
enum class KvDtype : uint8_t {
  kFp32,
  kFp16,
  kBf16,
  kFp8E4m3,
  kInt8,
  kInt4,
  kK8V4,
  kInt4Kc,
  kInt2Kc
};

std::string_view KvDtypeName(KvDtype dtype);
// Accepts the names KvDtypeName returns, plus "fp8" and "float32"/"float16"/"bfloat16".
absl::StatusOr<KvDtype> ParseKvDtype(std::string_view name);
// Every per-token dtype (each token's K/V encoded on its own, written as it
// arrives; what every backend implements), in a stable order (fp32 first).
inline constexpr KvDtype kAllKvDtypes[] = {KvDtype::kFp32,    KvDtype::kFp16, KvDtype::kBf16,
                                           KvDtype::kFp8E4m3, KvDtype::kInt8, KvDtype::kInt4,
                                           KvDtype::kK8V4};
// Every dtype the CPU backend implements: kAllKvDtypes, int4_kc and
// int2_kc, for reports (kvserve plan, eval-kv --kv-dtype all).
inline constexpr KvDtype kCpuKvDtypes[] = {KvDtype::kFp32,    KvDtype::kFp16,   KvDtype::kBf16,
                                           KvDtype::kFp8E4m3, KvDtype::kInt8,   KvDtype::kInt4,
                                           KvDtype::kK8V4,    KvDtype::kInt4Kc, KvDtype::kInt2Kc};
// Whether a dtype quantizes K per channel over a block and keeps tails
// (int4_kc, int2_kc), and its code bits (4 or 2; 0 for the others).
inline constexpr bool IsKcDtype(KvDtype d) {
  return d == KvDtype::kInt4Kc || d == KvDtype::kInt2Kc;
}
inline constexpr int KcDtypeBits(KvDtype d) {
  return d == KvDtype::kInt4Kc ? 4 : d == KvDtype::kInt2Kc ? 2 : 0;
}
// Smallest block size int4_kc and int2_kc accept (per-channel ranges over
// fewer tokens cost more meta than they save).
inline constexpr int kInt4KcMinBlockSize = 16;

class KvFormat {
 public:
  // int4_group_size is clamped to head_dim and must divide it (int2_kc's
  // V groups too, a multiple of 4 there). tail_elem is how int4_kc and
  // int2_kc tails store rows: kFp32 (the CPU backend) or kFp16 (CUDA);
  // ignored by the other dtypes. Both need block_size >=
  // kInt4KcMinBlockSize (the error names cache.block_size).
  static absl::StatusOr<KvFormat> Create(KvDtype dtype, int num_kv_heads, int head_dim,
                                         int block_size, int int4_group_size = 64,
                                         KvElem tail_elem = KvElem::kFp32);

  // plain (a per-token dtype, no tails) as a layer of cross-layer sharing
  // (kv_layout.h): kBase keeps plain's page and adds fp32 tails; kShared
  // holds retain_slots retention rows per head in plain's format, the
  // per-token ratios and index, and fp32 tails. InvalidArgument (naming
  // cache.cross_layer) for int4_kc / int2_kc or retain_slots outside
  // [1, min(block_size, 254)].
  static absl::StatusOr<KvFormat> ForCrossLayer(const KvFormat& plain, KvCrossRole role,
                                                int retain_slots);

  KvDtype dtype() const { return dtype_; }
  KvCrossRole cross_role() const { return layout_.cross.role; }
  // The plain layout kernels receive.
  const KvPageLayout& layout() const { return layout_; }
  int num_kv_heads() const { return layout_.num_kv_heads; }
  int head_dim() const { return layout_.head_dim; }
  int block_size() const { return layout_.block_size; }
  const KvPartLayout& k() const { return layout_.k; }
  const KvPartLayout& v() const { return layout_.v; }
  // Bytes of one block in one layer (padded to 64).
  int64_t block_bytes() const { return layout_.block_bytes; }
  // Whether partial blocks live in tails (int4_kc, int2_kc), and one tail block's
  // bytes in one layer (0 without tails).
  bool has_tails() const { return layout_.has_tails(); }
  int64_t tail_block_bytes() const { return layout_.tail.block_bytes; }
  // Unpadded K+V bytes one token needs in one layer, scales included (for
  // int4_kc and int2_kc, whose K scales are per block, and for a cross-layer
  // shared page: the unpadded block over block_size, rounded up to a whole
  // byte).
  int64_t bytes_per_token_per_layer() const;

  int64_t RowOffset(const KvPartLayout& part, int head, int slot) const {
    return layout_.RowOffset(part, head, slot);
  }
  int64_t MetaOffset(const KvPartLayout& part, int head, int slot) const {
    return layout_.MetaOffset(part, head, slot);
  }

 private:
  KvDtype dtype_ = KvDtype::kFp32;
  KvPageLayout layout_;
};

}  // namespace kvserve

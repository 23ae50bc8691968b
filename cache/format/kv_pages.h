// HostKvPages: the host memory that backs a paged KV cache. Per layer it
// holds [num_blocks][block_bytes] in that layer's KvFormat page layout, and,
// for layers whose format keeps tails (int4_kc), [num_tails][tail_bytes]
// after them. Layers may use different formats (per-layer precision) but
// share the block size; a block id (and a tail id) names the same slot in
// every layer. Allocated once (64-byte aligned, zeroed) and never resized.
// Block and tail ids come from the cache manager's pools; this class only
// maps (layer, id) to bytes.
//
// Thread-safety: the engine thread writes; kernels running on its behalf may
// read and write disjoint blocks in parallel.
#pragma once

#include <cstdint>
#include <cstdlib>
#include <memory>
#include <vector>

#include "cache/format/kv_format.h"

namespace kvserve {

class HostKvPages {
 public:
  // Every layer in `format`, no tails.
  HostKvPages(const KvFormat& format, int num_layers, int32_t num_blocks);
  // One format per layer (same block size); num_tails tail blocks in each
  // layer whose format has tails.
  HostKvPages(std::vector<KvFormat> layer_formats, int32_t num_blocks, int32_t num_tails);

  // Layer 0's format (every layer's, unless the formats differ by layer).
  const KvFormat& format() const { return formats_[0]; }
  const KvFormat& format(int l) const { return formats_[l]; }
  const std::vector<KvFormat>& formats() const { return formats_; }
  int num_layers() const { return static_cast<int>(formats_.size()); }
  int32_t num_blocks() const { return num_blocks_; }
  int32_t num_tails() const { return num_tails_; }
  // Whether any layer keeps tails.
  bool has_tails() const { return has_tails_; }
  int64_t total_bytes() const { return total_bytes_; }
  // One block id in every layer (what a block costs in the pool).
  int64_t bytes_per_block() const;

  // [num_blocks][block_bytes] of one layer.
  uint8_t* layer(int l) { return data_.get() + layer_offset_[l]; }
  const uint8_t* layer(int l) const { return data_.get() + layer_offset_[l]; }
  uint8_t* block(int l, int32_t id) { return layer(l) + formats_[l].block_bytes() * id; }
  const uint8_t* block(int l, int32_t id) const {
    return layer(l) + formats_[l].block_bytes() * id;
  }
  // [num_tails][tail_block_bytes] of one layer (null when it keeps none).
  uint8_t* tails(int l) { return tail_bytes(l) ? data_.get() + tail_offset_[l] : nullptr; }
  const uint8_t* tails(int l) const {
    return tail_bytes(l) ? data_.get() + tail_offset_[l] : nullptr;
  }
  uint8_t* tail(int l, int32_t id) { return tails(l) + tail_bytes(l) * id; }
  const uint8_t* tail(int l, int32_t id) const { return tails(l) + tail_bytes(l) * id; }

 private:
  int64_t tail_bytes(int l) const { return formats_[l].tail_block_bytes(); }

  struct FreeDeleter {
    void operator()(uint8_t* p) const { std::free(p); }
  };
  std::vector<KvFormat> formats_;
  int32_t num_blocks_;
  int32_t num_tails_;
  bool has_tails_ = false;
  int64_t total_bytes_ = 0;
  std::vector<int64_t> layer_offset_;  // [num_layers] start of the layer's blocks
  std::vector<int64_t> tail_offset_;   // [num_layers] start of the layer's tails
  std::unique_ptr<uint8_t, FreeDeleter> data_;
};

}  // namespace kvserve

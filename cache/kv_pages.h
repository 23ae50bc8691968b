// HostKvPages: the host memory that backs a paged KV cache, laid out as
// [num_layers][num_blocks][block_bytes] in the KvFormat's page layout.
// Allocated once (64-byte aligned, zeroed) and never resized. Block ids come
// from the BlockPool; this class only maps (layer, block) to bytes.
//
// Thread-safety: the engine thread writes; kernels running on its behalf may
// read and write disjoint blocks in parallel.
#pragma once

#include <cstdint>
#include <cstdlib>
#include <memory>

#include "cache/kv_format.h"

namespace kvserve {

class HostKvPages {
 public:
  HostKvPages(const KvFormat& format, int num_layers, int32_t num_blocks);

  const KvFormat& format() const { return format_; }
  int num_layers() const { return num_layers_; }
  int32_t num_blocks() const { return num_blocks_; }
  int64_t total_bytes() const { return layer_bytes_ * num_layers_; }

  // [num_blocks][block_bytes] of one layer.
  uint8_t* layer(int l) { return data_.get() + layer_bytes_ * l; }
  const uint8_t* layer(int l) const { return data_.get() + layer_bytes_ * l; }
  uint8_t* block(int l, int32_t id) { return layer(l) + format_.block_bytes() * id; }
  const uint8_t* block(int l, int32_t id) const {
    return layer(l) + format_.block_bytes() * id;
  }

 private:
  struct FreeDeleter {
    void operator()(uint8_t* p) const { std::free(p); }
  };
  KvFormat format_;
  int num_layers_;
  int32_t num_blocks_;
  int64_t layer_bytes_;
  std::unique_ptr<uint8_t, FreeDeleter> data_;
};

}  // namespace kvserve

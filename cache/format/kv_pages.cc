#include "cache/format/kv_pages.h"

#include <cstdio>
#include <cstring>
#include <utility>

namespace kvserve {

HostKvPages::HostKvPages(const KvFormat& format, int num_layers, int32_t num_blocks)
    : HostKvPages(std::vector<KvFormat>(num_layers, format), num_blocks, 0) {}

HostKvPages::HostKvPages(std::vector<KvFormat> layer_formats, int32_t num_blocks, int32_t num_tails)
    : formats_(std::move(layer_formats)), num_blocks_(num_blocks), num_tails_(num_tails) {
  if (formats_.empty()) {
    std::fprintf(stderr, "HostKvPages: no layers\n");
    std::abort();
  }
  int64_t off = 0;
  for (const KvFormat& f : formats_) {
    if (f.block_size() != formats_[0].block_size()) {
      std::fprintf(stderr, "HostKvPages: layers with different block sizes\n");
      std::abort();
    }
    has_tails_ |= f.has_tails();
    layer_offset_.push_back(off);
    off += f.block_bytes() * num_blocks;
    tail_offset_.push_back(off);
    off += f.tail_block_bytes() * num_tails;
  }
  total_bytes_ = off;
  const size_t bytes = static_cast<size_t>(total_bytes_);
  void* p = std::aligned_alloc(64, bytes == 0 ? 64 : (bytes + 63) / 64 * 64);
  if (p == nullptr) {
    std::fprintf(stderr, "HostKvPages: cannot allocate %zu bytes\n", bytes);
    std::abort();
  }
  std::memset(p, 0, bytes);
  data_.reset(static_cast<uint8_t*>(p));
}

int64_t HostKvPages::bytes_per_block() const {
  int64_t total = 0;
  for (const KvFormat& f : formats_) total += f.block_bytes();
  return total;
}

}  // namespace kvserve

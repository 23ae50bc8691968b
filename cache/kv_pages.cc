#include "cache/kv_pages.h"

#include <cstdio>
#include <cstring>

namespace kvserve {

HostKvPages::HostKvPages(const KvFormat& format, int num_layers, int32_t num_blocks)
    : format_(format),
      num_layers_(num_layers),
      num_blocks_(num_blocks),
      layer_bytes_(format.block_bytes() * num_blocks) {
  const size_t bytes = static_cast<size_t>(layer_bytes_) * num_layers;
  void* p = std::aligned_alloc(64, bytes == 0 ? 64 : (bytes + 63) / 64 * 64);
  if (p == nullptr) {
    std::fprintf(stderr, "HostKvPages: cannot allocate %zu bytes\n", bytes);
    std::abort();
  }
  std::memset(p, 0, bytes);
  data_.reset(static_cast<uint8_t*>(p));
}

}  // namespace kvserve

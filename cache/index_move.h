// IndexMove: one KV entry moved by eviction (KvCacheManager::Evict): the
// entry at cache index `from` now lives at `to`. Its own header so the
// policies and the kernels' copy lists need not include the cache manager.
#pragma once

#include <cstdint>

namespace kvserve {

struct IndexMove {
  int32_t from;
  int32_t to;
  friend bool operator==(const IndexMove&, const IndexMove&) = default;
};

}  // namespace kvserve

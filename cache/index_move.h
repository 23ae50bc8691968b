// IndexMove: one KV entry moved by eviction (KvCacheManager::Evict): the
// entry at cache index `from` now lives at `to`; EvictResult: what one Evict
// did. Their own header so the policies, the per-sequence evictor and the
// kernels' copy lists need not include the cache manager.
#pragma once

#include <cstdint>
#include <vector>

namespace kvserve {

struct IndexMove {
  int32_t from;
  int32_t to;
  friend bool operator==(const IndexMove&, const IndexMove&) = default;
};

struct EvictResult {
  std::vector<IndexMove> moves;  // holes ascending
  int32_t num_evicted = 0;       // entries dropped
  int32_t freed_blocks = 0;      // blocks the sequence no longer holds
};

}  // namespace kvserve

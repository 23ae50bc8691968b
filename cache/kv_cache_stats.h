// KvCacheStats: a snapshot of the KV cache for the metrics endpoint and logs.
// Gauges describe the pools right now; counters are cumulative since the
// KvCacheManager was built. Block counts are of the primary (device) pool
// unless named swap.
//
// Thread-safety: plain value; KvCacheManager::Stats() builds one on the engine
// thread, which may then hand copies to other threads.
#pragma once

#include <cstdint>

namespace kvserve {

struct KvCacheStats {
  // Gauges.
  int32_t num_blocks = 0;
  int32_t num_free_blocks = 0;    // allocatable now; includes num_cached_blocks
  int32_t num_active_blocks = 0;  // held by sequences (or by this step's pending copies)
  int32_t num_cached_blocks = 0;  // free but holding a reusable prefix
  double active_usage = 0;        // num_active_blocks / num_blocks
  double usage_with_cached = 0;   // (num_active_blocks + num_cached_blocks) / num_blocks
  int32_t num_swap_blocks = 0;
  int32_t num_swap_free_blocks = 0;
  int32_t num_tail_blocks = 0;  // int4_kc: full-precision tails for partial blocks
  int32_t num_free_tail_blocks = 0;
  int32_t num_sequences = 0;  // resident and swapped
  int32_t num_swapped_sequences = 0;

  // Counters.
  int64_t prefix_queries = 0;         // allocations looked up in the prefix cache
  int64_t prefix_query_tokens = 0;    // their prompt tokens
  int64_t prefix_hit_tokens = 0;      // of which served from the cache
  int64_t tier_hit_tokens = 0;        // cached prompt tokens a lower tier served (not in the above)
  int64_t cow_copies = 0;             // copy-on-write block copies
  int64_t swapped_out_blocks = 0;     // primary -> host block copies
  int64_t swapped_in_blocks = 0;      // host -> primary block copies
  int64_t evicted_cached_blocks = 0;  // cached blocks handed out for new content (LRU)
  // KV eviction (KvCacheManager::Evict; not the prefix cache's LRU above).
  int64_t kv_evictions = 0;              // Evict calls that dropped at least one entry
  int64_t kv_evicted_tokens = 0;         // entries dropped
  int64_t kv_eviction_freed_blocks = 0;  // blocks Evict took out of sequences
  int64_t kv_eviction_slot_moves = 0;    // entries moved to refill holes

  double prefix_hit_rate() const {
    return prefix_query_tokens == 0
               ? 0.0
               : static_cast<double>(prefix_hit_tokens) / static_cast<double>(prefix_query_tokens);
  }
};

}  // namespace kvserve

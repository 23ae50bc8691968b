// EngineStats: a snapshot of the engine's counters and gauges for /metrics
// and GetStats. Counters only grow; gauges are current values.
#pragma once

#include <cstdint>

namespace kvserve {

// EvictionPolicyKind values (cache/eviction_policy.h).
inline constexpr int kNumEvictionPolicies = 6;

struct EngineStats {
  // Gauges.
  int64_t num_waiting = 0;         // queued, not yet admitted (incl. preempted)
  int64_t num_running = 0;         // sequences in the running batch
  int64_t num_swapped = 0;         // sequences swapped to host
  int64_t kv_blocks_total = 0;
  int64_t kv_blocks_free = 0;      // free, including cached-reusable
  int64_t kv_blocks_active = 0;    // held by live sequences
  int64_t kv_blocks_cached = 0;    // free but still holding a reusable prefix
  double kv_usage_active = 0;      // active / total
  double kv_usage_with_cached = 0; // (active + cached) / total
  // Counters.
  int64_t steps = 0;
  int64_t batched_tokens = 0;      // sum of BatchInput sizes
  int64_t batched_seqs = 0;        // sum of sequences per step (mean batch = this / steps)
  int64_t prompt_tokens = 0;
  int64_t generated_tokens = 0;
  int64_t preemptions = 0;
  int64_t prefix_queries_tokens = 0;
  int64_t prefix_hits_tokens = 0;
  int64_t cow_copies = 0;
  int64_t swap_out_blocks = 0;
  int64_t swap_in_blocks = 0;
  int64_t cached_block_evictions = 0;
  // KV eviction, per policy (index: EvictionPolicyKind): Evict calls that
  // dropped entries, entries dropped, blocks the sequences gave back.
  int64_t kv_evictions[kNumEvictionPolicies] = {};
  int64_t kv_evicted_tokens[kNumEvictionPolicies] = {};
  int64_t kv_eviction_freed_blocks[kNumEvictionPolicies] = {};
  int64_t requests_finished_stop = 0;
  int64_t requests_finished_length = 0;
  int64_t requests_finished_cancelled = 0;
  int64_t requests_finished_error = 0;
  int64_t requests_rejected = 0;
};

}  // namespace kvserve

// EngineStats: the one snapshot of the engine, for /metrics, GetStats, logs
// and benchmarks. It holds the KV cache's own snapshot (KvCacheStats, as
// KvCacheManager::Stats() builds it) as a member rather than copying its
// fields, so a cache counter added there reaches every front end; each front
// end converts this struct once (server/observability/metrics.cc for Prometheus,
// server/grpc/stats_proto.h for gRPC).
//
// Counters only grow; gauges are current values. EngineImpl publishes one
// after every step; GetStats() adds what it sees in the inbox.
//
// Thread-safety: plain value.
#pragma once

#include <cstdint>
#include <iterator>

#include "cache/eviction/eviction_policy.h"
#include "cache/kv_cache_stats.h"
#include "cache/tier/kv_tiers.h"

namespace kvserve {

// Per-policy arrays are indexed by EvictionPolicyKind.
inline constexpr int kNumEvictionPolicies = static_cast<int>(std::size(kAllEvictionPolicies));

struct EngineStats {
  // Scheduler gauges.
  int64_t num_waiting = 0;       // queued, not yet admitted (incl. preempted and tier loading)
  int64_t num_tier_loading = 0;  // of which waiting for disk or remote KV (tier_prefetch.h)
  int64_t num_running = 0;       // sequences in the running batch
  int64_t num_swapped = 0;       // sequences swapped to host

  // The KV cache after the last step: pool gauges, prefix-cache, copy-on-write
  // and swap counters, eviction totals.
  KvCacheStats kv;

  // Engine counters.
  int64_t steps = 0;
  int64_t batched_tokens = 0;  // sum of BatchInput sizes
  int64_t batched_seqs = 0;    // sum of sequences per step (mean batch = this / steps)
  int64_t prompt_tokens = 0;
  int64_t generated_tokens = 0;
  int64_t preemptions = 0;
  // KV eviction, per policy (index: EvictionPolicyKind; kv holds the totals):
  // Evict calls that dropped entries, entries dropped, blocks the sequences
  // gave back.
  int64_t kv_evictions[kNumEvictionPolicies] = {};
  int64_t kv_evicted_tokens[kNumEvictionPolicies] = {};
  int64_t kv_eviction_freed_blocks[kNumEvictionPolicies] = {};
  int64_t requests_finished_stop = 0;
  int64_t requests_finished_length = 0;
  int64_t requests_finished_cancelled = 0;
  int64_t requests_finished_error = 0;
  int64_t requests_rejected = 0;

  // KV tiers (index: TierKind), when any tier below the device is configured.
  bool tiers_enabled = false;
  TierStats tiers{};
};

}  // namespace kvserve

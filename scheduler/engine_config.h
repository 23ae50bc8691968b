// EngineConfig: the scheduler and cache knobs of one engine (from YAML
// `scheduler.*` and `cache.*`). Validate() names the bad key. Its eviction
// defaults are EvictionParams (cache/eviction/eviction_params.h: the policy kinds,
// their names and parser), which front ends reach through this header.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "cache/eviction/eviction_params.h"
#include "cache/tier/kv_tiers.h"
#include "scheduler/request.h"
#include "scheduler/request_validation.h"
#include "util/clock.h"

namespace kvserve {

enum class PreemptionMode : uint8_t { kRecompute, kSwap };

struct EngineConfig {
  int32_t max_num_seqs = 64;             // scheduler.max_num_seqs
  int32_t max_num_batched_tokens = 512;  // scheduler.max_num_batched_tokens (chunked prefill)
  int32_t max_model_len = 0;             // 0: the model's max_position_embeddings
  int32_t max_queue_size = 4096;         // waiting requests beyond this: ResourceExhausted
  PreemptionMode preemption_mode = PreemptionMode::kRecompute;  // scheduler.preemption_mode
  bool prefix_caching = true;                                   // cache.prefix_caching
  // scheduler.fairness: clients (GenerateRequest::client) take turns for
  // admission and a waiting request of one client may preempt another's
  // (Scheduler step 0); false: first come, first served.
  bool fair_clients = false;
  // KV eviction defaults (cache.eviction_policy, cache.eviction_budget,
  // cache.sink_tokens, cache.recent_tokens, cache.eviction_history);
  // requests override them with GenerateRequest::kv_policy.
  EvictionParams eviction;
  // The request cost budget (the config's limits section); Submit resolves
  // its derived limits against max_model_len and holds n to max_num_seqs.
  RequestLimits request_limits = kDefaultRequestLimits;
  // Tiers below the device pool (cache.host_tier_bytes, cache.disk_tier_*,
  // cache.remote_tier_url, cache.tier_load_timeout_ms; cache/tier/), and the
  // weights' fingerprint their blocks are keyed by.
  KvTierConfig tiers;
  std::string weights_fingerprint;
  // cache.evictor_model: the predictor file policy learned ranks with.
  std::string evictor_model;
  // Runs KvCacheManager::CheckInvariants after every step and aborts on a
  // broken one (O(blocks + tokens) per step: tests and debugging only).
  bool debug_check_invariants = false;

  // Called on the engine thread once per finished request (metrics); must
  // not block.
  std::function<void(const RequestMetrics&)> on_request_finished;
  // Where the engine reads the time (request metrics, Drain's deadline);
  // null: RealClock(). Tests inject a SimulatedClock.
  std::shared_ptr<const Clock> clock;

  absl::Status Validate() const;
};

}  // namespace kvserve

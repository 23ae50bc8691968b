// SequenceEvictor: one sequence's eviction, step by step. It owns the
// sequence's EvictionState and asks its policy which entries to drop; the
// engine (and the eval-kv study, which drives a sequence the same way) runs:
//   rows = StepRows(...)            how many tokens the next step computes
//   ... forward pass (BatchInput::num_sinks = num_sinks(), attention
//       statistics for this sequence when needs_attention_stats()) ...
//   Observe(positions, stats)       the step's rows become entries
//   victims = SelectVictims()       empty while within budget
//   KvCacheManager::Evict(seq, victims) -> Compact(result)
//
// Steps. After each step's eviction the sequence holds at most budget - 1
// entries. Prompt tokens run in chunks that keep it within `hold_limit`
// entries (budget + block_size in the engine, so a sequence never holds more
// than budget / block_size + 2 blocks; budget where a model's own sliding
// window cuts attention by cache index, see the engine). Every later token
// (decode, or a recompute replaying output) runs alone, as it first did, so
// a replay evicts exactly as the first run did. The rule depends only on the
// sequence, so its tokens do not depend on what it is batched with.
//
// Thread-safety: none; owned by one sequence on the engine thread. Copyable
// (forked samples copy their parent's state).
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "cache/eviction/eviction_policy.h"
#include "cache/index_move.h"

namespace kvserve {

class SequenceEvictor {
 public:
  // params must be valid and evicting; hold_limit >= budget.
  SequenceEvictor(std::shared_ptr<const EvictionPolicy> policy, const EvictionParams& params,
                  int32_t hold_limit);

  const EvictionParams& params() const { return params_; }
  EvictionPolicyKind kind() const { return params_.policy; }
  int32_t hold_limit() const { return hold_limit_; }
  bool needs_attention_stats() const { return policy_->needs_attention_stats(); }
  const EvictionState& state() const { return state_; }
  // Entries dropped so far: the absolute index of a new token minus this is
  // its cache index.
  int64_t num_evicted() const { return num_evicted_; }

  // Tokens the next step computes, with `cache_len` entries held and
  // `prompt_left` prompt tokens not yet computed (0 once the prompt is).
  int32_t StepRows(int32_t cache_len, int32_t prompt_left) const;

  // streaming: keys at cache indices below this are sinks, scored with the
  // query at its in-cache position (BatchInput::num_sinks); 0 otherwise and
  // before the first eviction (positions then agree).
  int32_t num_sinks() const;

  // The step's new entries (their absolute positions, in cache order) and,
  // when the policy needs them, the attention of the step's `rows` rows:
  // mass [num_layers][entries after append] as ModelRunner reports it.
  void Observe(std::span<const int32_t> new_positions, std::span<const float> mass,
               int32_t num_layers, int32_t num_heads, int32_t rows);

  // Cache indices to drop now so that budget - 1 entries stay; empty when
  // within budget. Valid until the next call.
  const std::vector<int32_t>& SelectVictims();
  // KvCacheManager::Evict carried out the last SelectVictims.
  void Compact(const EvictResult& result);

  // Starts over (recompute preemption freed the sequence's blocks).
  void Reset();

 private:
  std::shared_ptr<const EvictionPolicy> policy_;
  EvictionParams params_;
  int32_t hold_limit_;
  EvictionState state_;
  int64_t num_evicted_ = 0;
  std::vector<int32_t> victims_;
};

}  // namespace kvserve

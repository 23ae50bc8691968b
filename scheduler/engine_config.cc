#include "scheduler/engine_config.h"

#include "absl/strings/str_cat.h"

namespace kvserve {

absl::Status EngineConfig::Validate() const {
  if (max_num_seqs < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("scheduler.max_num_seqs must be >= 1, got ", max_num_seqs));
  }
  if (max_num_batched_tokens < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "scheduler.max_num_batched_tokens must be >= 1, got ", max_num_batched_tokens));
  }
  if (max_num_batched_tokens < max_num_seqs) {
    // Every running sequence needs one token of budget per step to decode.
    return absl::InvalidArgumentError(
        absl::StrCat("scheduler.max_num_batched_tokens (", max_num_batched_tokens,
                     ") must be >= scheduler.max_num_seqs (", max_num_seqs, ")"));
  }
  if (max_model_len < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_model_len must be >= 0 (0: the model's), got ", max_model_len));
  }
  if (max_queue_size < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("scheduler.max_queue_size must be >= 1, got ", max_queue_size));
  }
  // sliding_window without a budget takes the model's window (checked when
  // the engine knows the model).
  if (!(eviction.policy == EvictionPolicyKind::kSlidingWindow && eviction.budget == 0)) {
    if (absl::Status s = eviction.Validate(kEvictionConfigFields); !s.ok()) return s;
  }
  if (eviction.policy == EvictionPolicyKind::kLearned && evictor_model.empty()) {
    return absl::InvalidArgumentError(
        "cache.eviction_policy learned needs cache.evictor_model (kvserve train-evictor)");
  }
  return tiers.Validate();
}

}  // namespace kvserve

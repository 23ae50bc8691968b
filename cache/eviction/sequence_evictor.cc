#include "cache/eviction/sequence_evictor.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"

namespace kvserve {
namespace {

[[noreturn]] void Die(const std::string& what) {
  std::fprintf(stderr, "SequenceEvictor: broken invariant: %s\n", what.c_str());
  std::abort();
}

}  // namespace

SequenceEvictor::SequenceEvictor(std::shared_ptr<const EvictionPolicy> policy,
                                 const EvictionParams& params, int32_t hold_limit)
    : policy_(std::move(policy)), params_(params), hold_limit_(hold_limit) {
  if (policy_ == nullptr || !params_.evicts() || policy_->kind() != params_.policy ||
      !params_.Validate(kEvictionConfigFields).ok() || hold_limit_ < params_.budget) {
    Die(absl::StrCat("SequenceEvictor for ", std::string(EvictionPolicyName(params_.policy)),
                     ", budget ", params_.budget, ", hold limit ", hold_limit_));
  }
}

int32_t SequenceEvictor::StepRows(int32_t cache_len, int32_t prompt_left) const {
  if (prompt_left <= 0) return 1;
  return std::max(1, std::min(prompt_left, hold_limit_ - cache_len));
}

int32_t SequenceEvictor::num_sinks() const {
  if (params_.policy != EvictionPolicyKind::kStreaming || num_evicted_ == 0) return 0;
  return std::min(params_.sink_tokens, state_.size());
}

void SequenceEvictor::Observe(std::span<const int32_t> new_positions, std::span<const float> mass,
                              int32_t num_layers, int32_t num_heads, int32_t rows) {
  state_.Append(new_positions);
  if (needs_attention_stats()) state_.Observe(mass, num_layers, num_heads, rows);
}

const std::vector<int32_t>& SequenceEvictor::SelectVictims() {
  victims_.clear();
  const int32_t keep = params_.budget - 1;
  const int32_t n = state_.size();
  if (n > keep) policy_->SelectVictims(state_, params_, n - keep, &victims_);
  return victims_;
}

void SequenceEvictor::Compact(const EvictResult& result) {
  state_.Compact(result.moves, state_.size() - result.num_evicted);
  num_evicted_ += result.num_evicted;
}

void SequenceEvictor::Reset() {
  state_.Clear();
  num_evicted_ = 0;
  victims_.clear();
}

}  // namespace kvserve

// The eviction settings a config or a request gives (cache.eviction_* keys,
// kv_policy fields): the policy kinds, their names, and EvictionParams with
// its validation. Small on purpose: the engine's config includes it, so it
// must not bring the cache manager or the policies (eviction_policy.h) with
// it. The functions are defined in eviction_policy.cc.
#pragma once

#include <cstdint>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace kvserve {

enum class EvictionPolicyKind : uint8_t {
  kNone,
  kSlidingWindow,
  kStreaming,
  kH2o,
  kScissorhands,
  kLearned
};

inline constexpr EvictionPolicyKind kAllEvictionPolicies[] = {
    EvictionPolicyKind::kNone, EvictionPolicyKind::kSlidingWindow, EvictionPolicyKind::kStreaming,
    EvictionPolicyKind::kH2o,  EvictionPolicyKind::kScissorhands,  EvictionPolicyKind::kLearned};

// "none", "sliding_window", "streaming", "h2o", "scissorhands", "learned".
std::string_view EvictionPolicyName(EvictionPolicyKind kind);
// InvalidArgument naming `field` for an unknown name.
absl::StatusOr<EvictionPolicyKind> ParseEvictionPolicy(std::string_view name,
                                                       std::string_view field);

// The names errors use for each setting: the config keys or the request's
// kv_policy fields.
struct EvictionFieldNames {
  const char* policy;
  const char* budget;
  const char* sink_tokens;
  const char* recent_tokens;
  const char* history;
};
inline constexpr EvictionFieldNames kEvictionConfigFields = {
    "cache.eviction_policy", "cache.eviction_budget", "cache.sink_tokens", "cache.recent_tokens",
    "cache.eviction_history"};
inline constexpr EvictionFieldNames kEvictionRequestFields = {
    "kv_policy.policy", "kv_policy.budget", "kv_policy.sink_tokens", "kv_policy.recent_tokens",
    "kv_policy.history"};

struct EvictionParams {
  EvictionPolicyKind policy = EvictionPolicyKind::kNone;
  // Entries a decode step attends, its own included (>= 2 unless none).
  int32_t budget = 0;
  // streaming: the first tokens always kept.
  int32_t sink_tokens = 4;
  // streaming: budget - sink_tokens (0 derives it; another value must equal
  // it). h2o, scissorhands, learned: most recent entries always kept, in
  // [1, budget - 1]; 0 derives budget / 2 (H2O's even split).
  int32_t recent_tokens = 0;
  // scissorhands: steps of attention history, 1 .. 64.
  int32_t history = 16;

  bool evicts() const { return policy != EvictionPolicyKind::kNone; }
  // The recent entries kept, as derived above (0 for none / sliding_window).
  int32_t RecentTokens() const;
  // InvalidArgument naming the bad setting with `names`.
  absl::Status Validate(const EvictionFieldNames& names) const;
  friend bool operator==(const EvictionParams&, const EvictionParams&) = default;
};

}  // namespace kvserve

#include "cache/eviction/eviction_policy.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <numeric>
#include <string>

#include "absl/strings/str_cat.h"

namespace kvserve {
namespace {

constexpr int32_t kMaxHistory = 64;

[[noreturn]] void Die(const std::string& what) {
  std::fprintf(stderr, "eviction: broken invariant: %s\n", what.c_str());
  std::abort();
}

absl::Status Invalid(const std::string& message) { return absl::InvalidArgumentError(message); }

// Oldest first: the score is the position itself.
class OldestFirst final : public EvictionPolicy {
 public:
  explicit OldestFirst(EvictionPolicyKind kind) : kind_(kind) {}
  EvictionPolicyKind kind() const override { return kind_; }
  bool needs_attention_stats() const override { return false; }
  void SelectVictims(const EvictionState& state, const EvictionParams& params, int32_t count,
                     std::vector<int32_t>* victims) const override {
    const int32_t sinks = kind_ == EvictionPolicyKind::kStreaming ? params.sink_tokens : 0;
    internal::LowestScored(state, {}, params.RecentTokens(), sinks, count, victims);
  }

 private:
  EvictionPolicyKind kind_;
};

class H2o final : public EvictionPolicy {
 public:
  EvictionPolicyKind kind() const override { return EvictionPolicyKind::kH2o; }
  bool needs_attention_stats() const override { return true; }
  void SelectVictims(const EvictionState& state, const EvictionParams& params, int32_t count,
                     std::vector<int32_t>* victims) const override {
    internal::LowestScored(state, state.accumulated(), params.RecentTokens(), 0, count, victims);
  }
};

class Scissorhands final : public EvictionPolicy {
 public:
  EvictionPolicyKind kind() const override { return EvictionPolicyKind::kScissorhands; }
  bool needs_attention_stats() const override { return true; }
  void SelectVictims(const EvictionState& state, const EvictionParams& params, int32_t count,
                     std::vector<int32_t>* victims) const override {
    const uint64_t mask =
        params.history >= kMaxHistory ? ~uint64_t{0} : (uint64_t{1} << params.history) - 1;
    // Most low-attention steps first; among equals, the least accumulated
    // attention: the count scaled past the largest accumulation comes first.
    scratch_.resize(state.size());
    float scale = 1.0f;
    for (float a : state.accumulated()) scale = std::max(scale, 2.0f * a + 1.0f);
    for (int32_t i = 0; i < state.size(); ++i) {
      const int low = std::popcount(state.low_history()[i] & mask);
      scratch_[i] = state.accumulated()[i] - scale * static_cast<float>(low);
    }
    internal::LowestScored(state, scratch_, params.RecentTokens(), 0, count, victims);
  }

 private:
  mutable std::vector<float> scratch_;  // engine thread only, as every policy call
};

}  // namespace

std::string_view EvictionPolicyName(EvictionPolicyKind kind) {
  switch (kind) {
    case EvictionPolicyKind::kNone:
      return "none";
    case EvictionPolicyKind::kSlidingWindow:
      return "sliding_window";
    case EvictionPolicyKind::kStreaming:
      return "streaming";
    case EvictionPolicyKind::kH2o:
      return "h2o";
    case EvictionPolicyKind::kScissorhands:
      return "scissorhands";
    case EvictionPolicyKind::kLearned:
      return "learned";
  }
  return "?";
}

absl::StatusOr<EvictionPolicyKind> ParseEvictionPolicy(std::string_view name,
                                                       std::string_view field) {
  for (EvictionPolicyKind k : kAllEvictionPolicies) {
    if (EvictionPolicyName(k) == name) return k;
  }
  return Invalid(absl::StrCat(std::string(field), " \"", std::string(name),
                              "\" is not a policy (none, sliding_window, streaming, h2o, "
                              "scissorhands, learned)"));
}

int32_t EvictionParams::RecentTokens() const {
  switch (policy) {
    case EvictionPolicyKind::kNone:
      return 0;
    case EvictionPolicyKind::kSlidingWindow:
      return budget;
    case EvictionPolicyKind::kStreaming:
      return budget - sink_tokens;
    default:
      return recent_tokens > 0 ? recent_tokens : std::max(1, budget / 2);
  }
}

absl::Status EvictionParams::Validate(const EvictionFieldNames& names) const {
  if (!evicts()) return absl::OkStatus();
  const std::string name(EvictionPolicyName(policy));
  if (budget < 2) {
    return Invalid(absl::StrCat(names.budget, " must be >= 2 for ", name, ", got ", budget));
  }
  switch (policy) {
    case EvictionPolicyKind::kStreaming:
      if (sink_tokens < 0 || sink_tokens > budget - 1) {
        return Invalid(absl::StrCat(names.sink_tokens, " must be in [0, ", names.budget,
                                    " - 1 = ", budget - 1, "], got ", sink_tokens));
      }
      if (recent_tokens != 0 && recent_tokens != budget - sink_tokens) {
        return Invalid(absl::StrCat(names.recent_tokens, " (", recent_tokens, ") + ",
                                    names.sink_tokens, " (", sink_tokens, ") must equal ",
                                    names.budget, " (", budget, ") for streaming"));
      }
      break;
    case EvictionPolicyKind::kH2o:
    case EvictionPolicyKind::kScissorhands:
    case EvictionPolicyKind::kLearned:
      if (recent_tokens < 0 || recent_tokens > budget - 1) {
        return Invalid(absl::StrCat(names.recent_tokens, " must be in [0, ", names.budget,
                                    " - 1 = ", budget - 1, "] for ", name, " (0: ", names.budget,
                                    " / 2), got ", recent_tokens));
      }
      if (policy == EvictionPolicyKind::kScissorhands && (history < 1 || history > kMaxHistory)) {
        return Invalid(
            absl::StrCat(names.history, " must be in [1, ", kMaxHistory, "], got ", history));
      }
      break;
    default:
      break;
  }
  return absl::OkStatus();
}

// ---- EvictionState ----------------------------------------------------------

void EvictionState::Append(std::span<const int32_t> positions) {
  position_.insert(position_.end(), positions.begin(), positions.end());
  const size_t n = position_.size();
  accumulated_.resize(n, 0.0f);
  last_.resize(n, 0.0f);
  low_.resize(n, 0);
  spread_.resize(n, 0.0f);
}

void EvictionState::Observe(std::span<const float> mass, int32_t num_layers, int32_t num_heads,
                            int32_t rows) {
  const int32_t n = size();
  if (num_layers <= 0 || num_heads <= 0 || rows <= 0 ||
      mass.size() != static_cast<size_t>(num_layers) * n) {
    Die(absl::StrCat("Observe of ", mass.size(), " weights for ", n, " entries, ", num_layers,
                     " layers, ", num_heads, " heads, ", rows, " rows"));
  }
  ++steps_;
  const float per_row = 1.0f / (static_cast<float>(num_heads) * static_cast<float>(num_layers));
  const float per_query = per_row / static_cast<float>(rows);
  const float per_layer_query = 1.0f / (static_cast<float>(num_heads) * static_cast<float>(rows));
  const float average = 1.0f / static_cast<float>(n);
  for (int32_t i = 0; i < n; ++i) {
    float total = 0.0f;
    for (int32_t l = 0; l < num_layers; ++l) total += mass[static_cast<size_t>(l) * n + i];
    accumulated_[i] += total * per_row;
    const float mean = total * per_query;
    last_[i] = mean;
    low_[i] = (low_[i] << 1) | (mean < average ? 1 : 0);
    float var = 0.0f;
    for (int32_t l = 0; l < num_layers; ++l) {
      const float d = mass[static_cast<size_t>(l) * n + i] * per_layer_query - mean;
      var += d * d;
    }
    spread_[i] = std::sqrt(var / static_cast<float>(num_layers)) * static_cast<float>(n);
  }
}

void EvictionState::Compact(std::span<const IndexMove> moves, int32_t new_size) {
  for (const IndexMove& m : moves) {
    if (m.from < 0 || m.from >= size() || m.to < 0 || m.to >= new_size) {
      Die(absl::StrCat("Compact move ", m.from, " -> ", m.to, " of ", size(), " entries to ",
                       new_size));
    }
    position_[m.to] = position_[m.from];
    accumulated_[m.to] = accumulated_[m.from];
    last_[m.to] = last_[m.from];
    low_[m.to] = low_[m.from];
    spread_[m.to] = spread_[m.from];
  }
  position_.resize(new_size);
  accumulated_.resize(new_size);
  last_.resize(new_size);
  low_.resize(new_size);
  spread_.resize(new_size);
}

void EvictionState::Clear() {
  position_.clear();
  accumulated_.clear();
  last_.clear();
  low_.clear();
  spread_.clear();
  steps_ = 0;
}

// ---- Policies ---------------------------------------------------------------

std::shared_ptr<const EvictionPolicy> MakeEvictionPolicy(EvictionPolicyKind kind) {
  switch (kind) {
    case EvictionPolicyKind::kSlidingWindow:
    case EvictionPolicyKind::kStreaming:
      return std::make_shared<OldestFirst>(kind);
    case EvictionPolicyKind::kH2o:
      return std::make_shared<H2o>();
    case EvictionPolicyKind::kScissorhands:
      return std::make_shared<Scissorhands>();
    case EvictionPolicyKind::kNone:
    case EvictionPolicyKind::kLearned:
      break;
  }
  Die("MakeEvictionPolicy(" + std::string(EvictionPolicyName(kind)) + ")");
}

namespace internal {

void LowestScored(const EvictionState& state, std::span<const float> score, int32_t recent,
                  int32_t sinks, int32_t count, std::vector<int32_t>* victims) {
  const int32_t n = state.size();
  std::span<const int32_t> pos = state.positions();
  // The newest recent - 1 entries are protected: the positions at or above
  // the (recent - 1)-th largest. Positions are distinct.
  const int32_t protect = std::max(0, recent - 1);
  thread_local std::vector<int32_t> order;
  int32_t newest_cut = INT32_MAX;  // positions >= this are protected
  if (protect > 0) {
    order.assign(pos.begin(), pos.end());
    if (protect >= n) {
      newest_cut = INT32_MIN;
    } else {
      std::nth_element(order.begin(), order.begin() + (n - protect), order.end());
      newest_cut = order[n - protect];
    }
  }
  order.clear();
  for (int32_t i = 0; i < n; ++i) {
    if (pos[i] < sinks || pos[i] >= newest_cut) continue;
    order.push_back(i);
  }
  if (count <= 0 || count > static_cast<int32_t>(order.size())) {
    Die(absl::StrCat("eviction of ", count, " entries with ", order.size(), " candidates (", n,
                     " entries, ", protect, " recent and sinks below ", sinks, " protected)"));
  }
  auto less = [&](int32_t a, int32_t b) {
    if (!score.empty() && score[a] != score[b]) return score[a] < score[b];
    return pos[a] < pos[b];
  };
  if (count < static_cast<int32_t>(order.size())) {
    std::nth_element(order.begin(), order.begin() + (count - 1), order.end(), less);
    std::sort(order.begin(), order.begin() + count, less);
  } else {
    std::sort(order.begin(), order.end(), less);
  }
  victims->insert(victims->end(), order.begin(), order.begin() + count);
}

}  // namespace internal
}  // namespace kvserve

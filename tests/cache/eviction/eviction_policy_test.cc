// Eviction policies and SequenceEvictor on hand-made states: exact victims
// for each policy, parameter validation messages, the step-size rule, and
// how per-entry statistics follow compaction.
#include "cache/eviction/eviction_policy.h"

#include <catch2/catch.hpp>
#include <numeric>
#include <string>
#include <vector>

#include "cache/eviction/sequence_evictor.h"
#include "tests/cache/tiny_cache.h"

namespace kvserve {
namespace {

using testing::Range;
using Victims = std::vector<int32_t>;

std::string Message(const absl::Status& s) { return std::string(s.message()); }

EvictionParams Params(EvictionPolicyKind kind, int32_t budget, int32_t recent = 0,
                      int32_t sinks = 4) {
  EvictionParams p;
  p.policy = kind;
  p.budget = budget;
  p.recent_tokens = recent;
  p.sink_tokens = sinks;
  return p;
}

// One layer, one head, one row: mass[i] is entry i's weight.
void ObserveOneRow(EvictionState& s, const std::vector<float>& mass) { s.Observe(mass, 1, 1, 1); }

TEST_CASE("Eviction policy names parse both ways and unknown ones name the field",
          "[cache][eviction]") {
  for (EvictionPolicyKind k : kAllEvictionPolicies) {
    absl::StatusOr<EvictionPolicyKind> back =
        ParseEvictionPolicy(EvictionPolicyName(k), "kv_policy.policy");
    REQUIRE(back.ok());
    REQUIRE(*back == k);
  }
  REQUIRE(Message(ParseEvictionPolicy("lru", "cache.eviction_policy").status()) ==
          "cache.eviction_policy \"lru\" is not a policy (none, sliding_window, streaming, h2o, "
          "scissorhands, learned)");
}

TEST_CASE("EvictionParams validate and name the offending field", "[cache][eviction]") {
  REQUIRE(EvictionParams{}.Validate(kEvictionConfigFields).ok());  // none needs nothing
  EvictionParams p = Params(EvictionPolicyKind::kH2o, 1);
  REQUIRE(Message(p.Validate(kEvictionConfigFields)) ==
          "cache.eviction_budget must be >= 2 for h2o, got 1");
  REQUIRE(Message(p.Validate(kEvictionRequestFields)) ==
          "kv_policy.budget must be >= 2 for h2o, got 1");
  p = Params(EvictionPolicyKind::kStreaming, 8, 0, 8);
  REQUIRE(Message(p.Validate(kEvictionRequestFields)) ==
          "kv_policy.sink_tokens must be in [0, kv_policy.budget - 1 = 7], got 8");
  p = Params(EvictionPolicyKind::kStreaming, 256, 200, 4);
  REQUIRE(Message(p.Validate(kEvictionConfigFields)) ==
          "cache.recent_tokens (200) + cache.sink_tokens (4) must equal cache.eviction_budget "
          "(256) for streaming");
  p = Params(EvictionPolicyKind::kStreaming, 256, 252, 4);
  REQUIRE(p.Validate(kEvictionConfigFields).ok());
  p = Params(EvictionPolicyKind::kScissorhands, 16, 16);
  REQUIRE(Message(p.Validate(kEvictionRequestFields)) ==
          "kv_policy.recent_tokens must be in [0, kv_policy.budget - 1 = 15] for scissorhands "
          "(0: kv_policy.budget / 2), got 16");
  p = Params(EvictionPolicyKind::kScissorhands, 16);
  p.history = 65;
  REQUIRE(Message(p.Validate(kEvictionConfigFields)) ==
          "cache.eviction_history must be in [1, 64], got 65");
}

TEST_CASE("Recent entries kept per policy", "[cache][eviction]") {
  REQUIRE(Params(EvictionPolicyKind::kSlidingWindow, 64).RecentTokens() == 64);
  REQUIRE(Params(EvictionPolicyKind::kStreaming, 256, 0, 4).RecentTokens() == 252);
  REQUIRE(Params(EvictionPolicyKind::kH2o, 64).RecentTokens() == 32);
  REQUIRE(Params(EvictionPolicyKind::kH2o, 64, 10).RecentTokens() == 10);
  REQUIRE(Params(EvictionPolicyKind::kLearned, 3).RecentTokens() == 1);
}

TEST_CASE("Each policy picks its exact victims", "[cache][eviction]") {
  EvictionState s;
  s.Append(Range(0, 10));  // positions 0..9 at cache indices 0..9
  Victims v;

  SECTION("sliding_window drops the oldest") {
    auto policy = MakeEvictionPolicy(EvictionPolicyKind::kSlidingWindow);
    REQUIRE_FALSE(policy->needs_attention_stats());
    policy->SelectVictims(s, Params(EvictionPolicyKind::kSlidingWindow, 8), 3, &v);
    REQUIRE(v == Victims{0, 1, 2});
  }
  SECTION("streaming keeps the sinks and drops the oldest after them") {
    auto policy = MakeEvictionPolicy(EvictionPolicyKind::kStreaming);
    policy->SelectVictims(s, Params(EvictionPolicyKind::kStreaming, 8, 0, 2), 3, &v);
    REQUIRE(v == Victims{2, 3, 4});
  }
  SECTION("streaming follows positions, not cache order") {
    // After a compaction the newest entry sits in a hole.
    s.Compact(std::vector<IndexMove>{{9, 3}}, 9);  // positions 0 1 2 9 4 5 6 7 8
    REQUIRE(s.positions()[3] == 9);
    auto policy = MakeEvictionPolicy(EvictionPolicyKind::kStreaming);
    policy->SelectVictims(s, Params(EvictionPolicyKind::kStreaming, 8, 0, 2), 2, &v);
    REQUIRE(v == Victims{2, 4});
  }
  SECTION("h2o drops the least accumulated attention outside the recent window") {
    auto policy = MakeEvictionPolicy(EvictionPolicyKind::kH2o);
    REQUIRE(policy->needs_attention_stats());
    ObserveOneRow(s, {0.30f, 0.01f, 0.20f, 0.02f, 0.15f, 0.03f, 0.04f, 0.05f, 0.10f, 0.10f});
    ObserveOneRow(s, {0.30f, 0.01f, 0.20f, 0.01f, 0.15f, 0.03f, 0.04f, 0.05f, 0.11f, 0.10f});
    // recent 4: the newest 3 (positions 7, 8, 9) are protected.
    policy->SelectVictims(s, Params(EvictionPolicyKind::kH2o, 8, 4), 3, &v);
    REQUIRE(v == Victims{1, 3, 5});
    REQUIRE(s.accumulated()[3] == Approx(0.03f));
  }
  SECTION("scissorhands drops the most persistently unimportant first") {
    auto policy = MakeEvictionPolicy(EvictionPolicyKind::kScissorhands);
    // Average is 0.1. Below it: entries 3 and 5 in all three steps (5 with
    // less accumulated attention), entry 1 in the first two, entry 7 in the
    // last; 8 and 9 are recent.
    ObserveOneRow(s, {0.30f, 0.01f, 0.20f, 0.05f, 0.15f, 0.02f, 0.12f, 0.15f, 0.10f, 0.10f});
    ObserveOneRow(s, {0.30f, 0.01f, 0.20f, 0.05f, 0.15f, 0.01f, 0.12f, 0.15f, 0.05f, 0.05f});
    ObserveOneRow(s, {0.30f, 0.12f, 0.20f, 0.05f, 0.15f, 0.02f, 0.12f, 0.05f, 0.03f, 0.02f});
    REQUIRE(s.low_history()[1] == 0b110);
    REQUIRE(s.low_history()[3] == 0b111);
    REQUIRE(s.low_history()[7] == 0b001);
    EvictionParams p = Params(EvictionPolicyKind::kScissorhands, 8, 3);
    policy->SelectVictims(s, p, 3, &v);
    REQUIRE(v == Victims{5, 3, 1});
    SECTION("only the last `history` steps count") {
      v.clear();
      p.history = 1;
      policy->SelectVictims(s, p, 3, &v);
      REQUIRE(v == Victims{5, 3, 7});
    }
  }
}

TEST_CASE("EvictionState statistics sum over layers, heads and rows", "[cache][eviction]") {
  EvictionState s;
  s.Append(Range(0, 2));
  // 2 layers, 2 heads, 2 rows: each (row, head, layer) gives out weight 1.
  // Layer 0: entry 0 gets 3 of its 4, layer 1: 1 of 4.
  s.Observe(std::vector<float>{3.0f, 1.0f, 1.0f, 3.0f}, 2, 2, 2);
  REQUIRE(s.steps() == 1);
  REQUIRE(s.accumulated()[0] == Approx(1.0f));  // (3 + 1) / (2 heads * 2 layers)
  REQUIRE(s.last()[0] == Approx(0.5f));
  REQUIRE(s.low_history()[0] == 0);
  // Per layer 0.75 and 0.25 around 0.5: deviation 0.25, times 2 entries.
  REQUIRE(s.layer_spread()[0] == Approx(0.5f));
  s.Append(std::vector<int32_t>{2});
  REQUIRE(s.accumulated()[2] == 0.0f);
  REQUIRE(s.size() == 3);
}

TEST_CASE("SequenceEvictor steps, keeps budget - 1 and counts what it evicted",
          "[cache][eviction]") {
  const EvictionParams p = Params(EvictionPolicyKind::kStreaming, 8, 0, 2);
  SequenceEvictor e(MakeEvictionPolicy(EvictionPolicyKind::kStreaming), p, /*hold_limit=*/12);
  // A 20-token prompt: chunks up to the hold limit, then one token per step.
  REQUIRE(e.StepRows(0, 20) == 12);
  REQUIRE(e.StepRows(7, 8) == 5);
  REQUIRE(e.StepRows(11, 3) == 1);
  REQUIRE(e.StepRows(7, 0) == 1);

  e.Observe(Range(0, 12), {}, 1, 1, 12);
  REQUIRE(e.num_sinks() == 0);
  const std::vector<int32_t>& v = e.SelectVictims();
  REQUIRE(v == Victims{2, 3, 4, 5, 6});  // keep 2 sinks + 5 recent
  EvictResult r;
  r.moves = {{7, 2}, {8, 3}, {9, 4}, {10, 5}, {11, 6}};
  r.num_evicted = 5;
  e.Compact(r);
  REQUIRE(e.num_evicted() == 5);
  REQUIRE(e.state().size() == 7);
  REQUIRE(std::vector<int32_t>(e.state().positions().begin(), e.state().positions().end()) ==
          std::vector<int32_t>{0, 1, 7, 8, 9, 10, 11});
  REQUIRE(e.num_sinks() == 2);
  e.Observe(std::vector<int32_t>{12}, {}, 1, 1, 1);
  REQUIRE(e.SelectVictims() == Victims{2});
  e.Reset();
  REQUIRE(e.num_evicted() == 0);
  REQUIRE(e.state().size() == 0);
  REQUIRE(e.SelectVictims().empty());
}

}  // namespace
}  // namespace kvserve

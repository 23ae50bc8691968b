#include "scheduler/request_validation.h"

#include <catch2/catch.hpp>
#include <string>

#include "util/field_status.h"

namespace kvserve {
namespace {

// A 512-token model with a 32-block pool of 16-token blocks, no eviction by
// default, every policy but learned available.
SubmitBounds Bounds() {
  SubmitBounds b;
  b.max_model_len = 512;
  b.block_size = 16;
  b.num_blocks = 32;
  b.runner_evicts = true;
  for (EvictionPolicyKind k : kAllEvictionPolicies) {
    if (k != EvictionPolicyKind::kLearned) b.available_policies |= 1u << static_cast<int>(k);
  }
  return b;
}

std::string Message(const absl::Status& s) { return std::string(s.message()); }

TEST_CASE("ResolveRequestEviction: kv_policy over the server's, errors naming the field",
          "[scheduler]") {
  SubmitBounds b = Bounds();
  REQUIRE_FALSE(ResolveRequestEviction({}, b)->evicts());
  KvPolicyOverride h2o{"h2o", 64, -1, -1};
  const EvictionParams p = *ResolveRequestEviction(h2o, b);
  REQUIRE(p.policy == EvictionPolicyKind::kH2o);
  REQUIRE(p.budget == 64);
  REQUIRE(EvictionHoldLimit(p, b) == 64 + 16);  // a block more while a prompt is written
  b.sliding_window = 128;
  REQUIRE(EvictionHoldLimit(p, b) == 64);  // the model's own window: never past the budget
  // sliding_window without a budget takes the model's window.
  REQUIRE(ResolveRequestEviction({"sliding_window", 0, -1, -1}, b)->budget == 128);
  const absl::Status over = ResolveRequestEviction({"h2o", 256, -1, -1}, b).status();
  REQUIRE(ErrorField(over) == "kv_policy.budget");
  REQUIRE(Message(over) == "kv_policy.budget (256) exceeds the model's sliding_window (128)");
  b = Bounds();
  const absl::Status no_budget = ResolveRequestEviction({"h2o", 0, -1, -1}, b).status();
  REQUIRE(Message(no_budget) ==
          "kv_policy.budget must be set for h2o (the server has no cache.eviction_budget)");
  const absl::Status learned = ResolveRequestEviction({"learned", 64, -1, -1}, b).status();
  REQUIRE(ErrorField(learned) == "kv_policy.policy");
  REQUIRE(Message(learned) ==
          "kv_policy.policy \"learned\" needs cache.evictor_model (kvserve train-evictor)");
  REQUIRE(ErrorField(ResolveRequestEviction({"lru", 64, -1, -1}, b).status()) ==
          "kv_policy.policy");
  b.runner_evicts = false;
  REQUIRE(
      Message(ResolveRequestEviction(h2o, b).status())
          .starts_with(
              "kv_policy.policy \"h2o\" needs KV eviction, which this model runner does not have"));
}

TEST_CASE("CheckRequestFits: the prompt and max_tokens against max_model_len and the pool",
          "[scheduler]") {
  const SubmitBounds b = Bounds();
  const EvictionParams none;
  REQUIRE(CheckRequestFits(100, 412, none, 0, b).ok());
  const absl::Status long_gen = CheckRequestFits(100, 413, none, 0, b);
  REQUIRE(ErrorField(long_gen) == "max_tokens");
  REQUIRE(Message(long_gen) ==
          "max_tokens (413) + prompt (100 tokens) = 513 exceeds max_model_len (512); lower "
          "max_tokens to at most 412");
  REQUIRE(ErrorField(CheckRequestFits(512, 1, none, 0, b)) == "prompt");
  REQUIRE(ErrorField(CheckRequestFits(0, 1, none, 0, b)) == "prompt");
  SubmitBounds small = b;
  small.num_blocks = 8;  // 128 tokens
  REQUIRE(
      Message(CheckRequestFits(100, 29, none, 0, small)) ==
      "max_tokens: prompt + max_tokens = 129 tokens need 9 KV blocks, but the whole pool has 8");
  // A streaming request runs past max_model_len; only its hold limit must fit the pool.
  EvictionParams streaming;
  streaming.policy = EvictionPolicyKind::kStreaming;
  streaming.budget = 64;
  REQUIRE(CheckRequestFits(100, 100000, streaming, 80, small).ok());
  REQUIRE(Message(CheckRequestFits(100, 1, streaming, 200, small)) ==
          "kv_policy.budget: 200 tokens held need 13 KV blocks, but the whole pool has 8");
}

}  // namespace
}  // namespace kvserve

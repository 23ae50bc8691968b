// KV eviction through the engine on stories260K (CpuModelRunner): per-request
// policies mixed in one batch give exactly the tokens each gives alone (also
// under preemption), a greedy request without eviction keeps the golden text
// while others evict, streaming runs past the model's 512 positions, the
// blocks a sequence holds stay within budget / block_size + 2, and bad
// kv_policy values are refused naming the field.
#include <algorithm>
#include <catch2/catch.hpp>
#include <fstream>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "cache/eviction/learned_evictor.h"
#include "model/cpu/cpu_model_runner.h"
#include "model/eval/evicting_sequence.h"
#include "model/loader/model_loader.h"
#include "scheduler/engine.h"
#include "tests/engine_harness.h"
#include "tests/test_util.h"

namespace kvserve {
namespace {

using Catch::Matchers::Contains;
using testing::Collect;
using testing::Greedy;
using testing::RandomSnippet;
using testing::RequireAllBlocksFree;
using testing::Result;
using testing::RunConcurrently;
using testing::RunOne;

using testing::Stories;

// A hand-made predictor (mostly accumulated attention) for policy learned.
const std::string& EvictorFile() {
  static const std::string* path = [] {
    EvictorModel m;
    m.horizon = 8;
    m.mean.fill(0.0f);
    m.scale.fill(1.0f);
    m.weights = {1.0f, 0.5f, 0.3f, -0.2f, -0.5f, 2.0f, 0.0f};
    m.bias = 0.1f;
    auto* p = new std::string(testing::MakeTempDir("evictor") + "/evictor.txt");
    std::ofstream(*p) << m.Serialize();
    return p;
  }();
  return *path;
}

struct Setup : testing::EngineSetup {
  Setup() { max_num_batched_tokens = 256; }
  int32_t model_window = 0;  // ModelConfig::sliding_window (a Mistral-style model)
  EvictionParams eviction;   // the engine's default
};

std::unique_ptr<Engine> MakeEngine(const Setup& s) {
  CpuRunnerOptions opt;
  opt.block_size = s.block_size;
  opt.num_blocks = s.num_blocks;
  opt.num_swap_blocks = s.num_swap_blocks;
  LlamaWeights weights = Stories().weights;  // views: a cheap copy
  weights.config.sliding_window = s.model_window;
  auto runner = CpuModelRunner::Create(std::move(weights), opt);
  REQUIRE(runner.ok());
  EngineConfig config = testing::EngineConfigOf(s);
  config.eviction = s.eviction;
  config.evictor_model = EvictorFile();
  auto engine = Engine::Create(config, std::move(*runner), Stories().tokenizer);
  INFO(engine.status().ToString());
  REQUIRE(engine.ok());
  return std::move(*engine);
}

KvPolicyOverride Policy(const char* name, int32_t budget, int32_t sinks = -1) {
  KvPolicyOverride p;
  p.policy = name;
  p.budget = budget;
  p.sink_tokens = sinks;
  return p;
}

// Mixed requests: every policy, prompts longer than the budgets, greedy and
// seeded sampling, a few n > 1.
std::vector<GenerateRequest> MixedRequests(uint32_t seed, int count) {
  std::mt19937 rng(seed);
  const KvPolicyOverride policies[] = {Policy("none", 0),          Policy("sliding_window", 32),
                                       Policy("streaming", 48, 4), Policy("streaming", 40, 0),
                                       Policy("h2o", 40),          Policy("scissorhands", 36),
                                       Policy("learned", 44)};
  std::vector<GenerateRequest> reqs;
  for (int i = 0; i < count; ++i) {
    GenerateRequest r = Greedy(RandomSnippet(rng, 400), 1 + rng() % 80);
    r.kv_policy = policies[i % std::size(policies)];
    r.ignore_eos = rng() % 3 == 0;
    if (i % 5 == 1) {
      r.sampling.temperature = 0.8f;
      r.sampling.seed = rng();
    }
    if (i % 11 == 3) {
      r.n = 2;
      r.sampling.temperature = 0.7f;
      r.sampling.seed = rng();
    }
    reqs.push_back(std::move(r));
  }
  return reqs;
}

void RequireSame(const std::vector<GenerateRequest>& reqs, const std::vector<Result>& solo,
                 const std::vector<Result>& together) {
  for (size_t i = 0; i < reqs.size(); ++i) {
    INFO("request " << i << " (" << reqs[i].kv_policy.policy << "): " << reqs[i].prompt);
    REQUIRE(together[i].tokens == solo[i].tokens);
    REQUIRE(together[i].text == solo[i].text);
    REQUIRE(together[i].finish == solo[i].finish);
  }
}

TEST_CASE("64 concurrent requests with mixed kv_policy give exactly their solo tokens",
          "[scheduler][eviction]") {
  for (int block_size : {4, 16}) {
    DYNAMIC_SECTION("block_size " << block_size) {
      Setup setup;
      setup.block_size = block_size;
      setup.num_blocks = 64 * 512 / block_size;
      auto engine = MakeEngine(setup);
      const std::vector<GenerateRequest> reqs = MixedRequests(77 + block_size, 64);
      std::vector<Result> solo;
      for (const GenerateRequest& r : reqs) solo.push_back(RunOne(*engine, r));
      const EngineStats solo_stats = engine->GetStats();
      std::vector<Result> together = RunConcurrently(*engine, reqs);
      RequireSame(reqs, solo, together);
      const EngineStats st = engine->GetStats();
      // Batched: far fewer steps than alone.
      CHECK(st.steps - solo_stats.steps < solo_stats.steps / 4);
      // Eviction is in effect: the same greedy requests without it differ.
      int differ = 0, evicting = 0;
      for (size_t i = 0; i < reqs.size(); ++i) {
        if (reqs[i].kv_policy.policy == "none" || reqs[i].sampling.temperature != 0.0f) continue;
        GenerateRequest plain = reqs[i];
        plain.kv_policy = KvPolicyOverride{};
        ++evicting;
        differ += RunOne(*engine, plain).tokens != solo[i].tokens ? 1 : 0;
      }
      INFO(differ << " of " << evicting << " greedy evicting requests differ from policy none");
      CHECK(differ * 3 >= evicting);
      for (EvictionPolicyKind k :
           {EvictionPolicyKind::kSlidingWindow, EvictionPolicyKind::kStreaming,
            EvictionPolicyKind::kH2o, EvictionPolicyKind::kScissorhands,
            EvictionPolicyKind::kLearned}) {
        INFO(EvictionPolicyName(k));
        CHECK(st.kv_evictions[static_cast<int>(k)] > 0);
        CHECK(st.kv_evicted_tokens[static_cast<int>(k)] >= st.kv_evictions[static_cast<int>(k)]);
      }
      CHECK(st.kv_evictions[0] == 0);
      RequireAllBlocksFree(*engine);
    }
  }
}

TEST_CASE("Evicting requests under preemption still give their solo tokens",
          "[scheduler][eviction]") {
  const PreemptionMode mode = GENERATE(PreemptionMode::kRecompute, PreemptionMode::kSwap);
  Setup setup;
  setup.num_blocks = 40;  // 640 tokens for 24 requests of up to 4 blocks each
  setup.max_model_len = 512;
  setup.mode = mode;
  setup.num_swap_blocks = mode == PreemptionMode::kSwap ? 24 : 0;
  std::vector<GenerateRequest> reqs = MixedRequests(5, 24);
  for (GenerateRequest& r : reqs) {
    if (r.kv_policy.policy == "none") r.kv_policy = Policy("h2o", 48);
  }
  auto engine = MakeEngine(setup);
  std::vector<Result> solo;
  for (const GenerateRequest& r : reqs) solo.push_back(RunOne(*engine, r));
  const int64_t solo_preemptions = engine->GetStats().preemptions;
  // All queued in one step (RunConcurrently's submissions can trail the
  // engine on a loaded machine, and then nothing is preempted).
  std::vector<Result> together = testing::RunInOneStep(*engine, reqs);
  RequireSame(reqs, solo, together);
  CHECK(engine->GetStats().preemptions > solo_preemptions);
  RequireAllBlocksFree(*engine);
}

TEST_CASE("A greedy request without eviction keeps the golden text while others evict",
          "[scheduler][eviction]") {
  auto engine = MakeEngine({});
  std::vector<GenerateRequest> reqs = MixedRequests(9, 24);
  for (GenerateRequest& r : reqs) {
    if (r.kv_policy.policy == "none") r.kv_policy = Policy("streaming", 32, 4);
  }
  GenerateRequest golden = Greedy("", 256);
  golden.kv_policy.policy = "none";
  reqs.insert(reqs.begin() + 7, golden);
  std::vector<Result> together = RunConcurrently(*engine, reqs);
  REQUIRE(together[7].text[0] == testing::GoldenGreedyText());
  const EngineStats st = engine->GetStats();
  CHECK(st.kv_evictions[static_cast<int>(EvictionPolicyKind::kStreaming)] > 0);
  RequireAllBlocksFree(*engine);
}

// The engine must carry out every copy eviction asks for, the slot moves
// that refill holes included: its greedy tokens equal those of
// EvictingSequence (model/eval/evicting_sequence.h), which drives one sequence
// through the same evictor and cache manager and runs the moves itself.
TEST_CASE("An evicting request's greedy tokens equal EvictingSequence's, slot moves included",
          "[scheduler][eviction]") {
  struct Case {
    const char* name;
    EvictionPolicyKind kind;
    int32_t budget;
    int32_t sinks;
  };
  const Case c = GENERATE(Case{"h2o", EvictionPolicyKind::kH2o, 40, -1},
                          Case{"scissorhands", EvictionPolicyKind::kScissorhands, 36, -1},
                          Case{"streaming", EvictionPolicyKind::kStreaming, 48, 4},
                          Case{"sliding_window", EvictionPolicyKind::kSlidingWindow, 32, -1});
  INFO(c.name);
  Setup setup;
  setup.block_size = 4;
  setup.num_blocks = 256;
  auto engine = MakeEngine(setup);
  const std::vector<int32_t> prompt =
      Stories().tokenizer->Encode(testing::DevStories()[3].substr(0, 300), true);
  constexpr int32_t kNew = 150;
  GenerateRequest req;
  req.prompt_token_ids = prompt;
  req.max_tokens = kNew;
  req.ignore_eos = true;
  req.sampling.temperature = 0.0f;
  req.kv_policy = Policy(c.name, c.budget, c.sinks);
  const Result got = RunOne(*engine, req);
  REQUIRE(got.tokens[0].size() == kNew);
  const EngineStats stats = engine->GetStats();
  RequireAllBlocksFree(*engine);

  CpuRunnerOptions opt;
  opt.block_size = setup.block_size;
  opt.num_blocks = setup.num_blocks;
  auto runner = CpuModelRunner::Create(Stories().weights, opt);
  REQUIRE(runner.ok());
  EvictionParams params;
  params.policy = c.kind;
  params.budget = c.budget;
  if (c.sinks >= 0) params.sink_tokens = c.sinks;
  REQUIRE(params.Validate(kEvictionRequestFields).ok());
  EvictingSequence seq(**runner, MakeEvictionPolicy(c.kind), params, c.budget + setup.block_size);
  std::vector<int32_t> stream = prompt;
  std::vector<int32_t> want;
  std::vector<float> logits;
  const int32_t vocab = Stories().weights.config.vocab_size;
  while (static_cast<int32_t>(want.size()) < kNew) {
    const int32_t begin = seq.computed();
    const int32_t left = static_cast<int32_t>(prompt.size()) - begin;
    const int32_t rows = left > 0 ? seq.StepRows(left) : 1;
    REQUIRE(seq.Step(stream, begin, begin + rows, &logits).ok());
    if (begin + rows < static_cast<int32_t>(stream.size())) continue;  // prompt left
    const float* last = logits.data() + static_cast<size_t>(rows - 1) * vocab;
    const int32_t next = static_cast<int32_t>(std::max_element(last, last + vocab) - last);
    want.push_back(next);
    stream.push_back(next);
  }
  REQUIRE(got.tokens[0] == want);
  // The case must exercise what it is about: entries were evicted, and for
  // the scored policies survivors were moved into holes.
  REQUIRE(seq.evictor()->num_evicted() > 0);
  if (c.kind == EvictionPolicyKind::kH2o || c.kind == EvictionPolicyKind::kScissorhands) {
    REQUIRE(seq.kv().Stats().kv_eviction_slot_moves > 0);
    REQUIRE(stats.kv.kv_eviction_slot_moves > 0);
  }
}

TEST_CASE("An evicting sequence holds at most budget / block_size + 2 blocks",
          "[scheduler][eviction]") {
  for (const char* policy : {"streaming", "h2o", "sliding_window", "scissorhands", "learned"}) {
    DYNAMIC_SECTION(policy) {
      auto engine = MakeEngine({});
      // A prompt of ~150 tokens, three budgets' worth.
      GenerateRequest r = Greedy(testing::DevStories()[3].substr(0, 600), 200);
      r.ignore_eos = true;
      r.kv_policy = Policy(policy, 50);
      auto stream = engine->Submit(r);
      REQUIRE(stream.ok());
      GenerateOutput out;
      int32_t max_active = 0;
      int events = 0;
      while ((*stream)->Next(&out) == RequestStream::Pop::kOutput) {
        // Stats are published before a step's events are pushed.
        max_active = std::max(max_active, engine->GetStats().kv.num_active_blocks);
        ++events;
      }
      REQUIRE(events >= 200);
      CHECK(max_active <= 50 / 16 + 2);
      CHECK(max_active >= 50 / 16);
      RequireAllBlocksFree(*engine);
    }
  }
}

TEST_CASE("A model's own sliding window: the policy takes it and holds window / block_size + 1",
          "[scheduler][eviction]") {
  Setup plain;
  plain.model_window = 64;
  Setup evicting = plain;
  evicting.eviction.policy = EvictionPolicyKind::kSlidingWindow;  // budget 0: the model's
  auto dense = MakeEngine(plain);
  auto engine = MakeEngine(evicting);
  GenerateRequest r = Greedy(testing::DevStories()[5].substr(0, 600), 120);
  r.ignore_eos = true;
  auto stream = engine->Submit(r);
  REQUIRE(stream.ok());
  GenerateOutput out;
  int32_t max_active = 0;
  std::vector<int32_t> tokens;
  while ((*stream)->Next(&out) == RequestStream::Pop::kOutput) {
    max_active = std::max(max_active, engine->GetStats().kv.num_active_blocks);
    tokens.insert(tokens.end(), out.token_ids.begin(), out.token_ids.end());
  }
  REQUIRE(tokens.size() == 120);
  CHECK(max_active <= 64 / 16 + 1);
  CHECK(engine->GetStats().kv_evictions[static_cast<int>(EvictionPolicyKind::kSlidingWindow)] > 0);
  // (The model attends only its window anyway, so its logits are those of
  // keeping everything up to the order of summation; eviction_forward_test
  // checks that. Greedy tokens may still differ where two are near-tied.)
  REQUIRE(RunOne(*dense, r).tokens[0].size() == 120);
  // Budgets past the model's window are refused.
  GenerateRequest big = r;
  big.kv_policy = Policy("h2o", 100);
  auto refused = engine->Submit(big);
  REQUIRE_FALSE(refused.ok());
  REQUIRE(std::string(refused.status().message()) ==
          "kv_policy.budget (100) exceeds the model's sliding_window (64)");
  RequireAllBlocksFree(*engine);
}

TEST_CASE("streaming and sliding_window generate past the model's 512 positions",
          "[scheduler][eviction]") {
  auto engine = MakeEngine({});
  for (const char* policy : {"streaming", "sliding_window"}) {
    GenerateRequest r = Greedy("Once upon a time", 1500);
    r.ignore_eos = true;
    r.kv_policy = Policy(policy, 64);
    Result res = RunOne(*engine, r);
    REQUIRE(res.tokens[0].size() == 1500);
    REQUIRE(res.finish[0] == FinishReason::kLength);
  }
  // The others keep absolute positions: held to max_model_len.
  GenerateRequest h2o = Greedy("Once upon a time", 600);
  h2o.kv_policy = Policy("h2o", 64);
  auto refused = engine->Submit(h2o);
  REQUIRE_FALSE(refused.ok());
  REQUIRE_THAT(std::string(refused.status().message()), Contains("max_tokens"));
  RequireAllBlocksFree(*engine);
}

TEST_CASE("Bad kv_policy values are refused naming the field", "[scheduler][eviction]") {
  Setup setup;
  setup.num_blocks = 64;
  auto engine = MakeEngine(setup);
  auto message_of = [&](KvPolicyOverride p) {
    GenerateRequest r = Greedy("Hi", 4);
    r.kv_policy = std::move(p);
    auto s = engine->Submit(std::move(r));
    REQUIRE_FALSE(s.ok());
    REQUIRE(s.status().code() == absl::StatusCode::kInvalidArgument);
    return std::string(s.status().message());
  };
  REQUIRE(message_of(Policy("lru", 8)) ==
          "kv_policy.policy \"lru\" is not a policy (none, sliding_window, streaming, h2o, "
          "scissorhands, learned)");
  REQUIRE(message_of(Policy("h2o", 0)) ==
          "kv_policy.budget must be set for h2o (the server has no cache.eviction_budget)");
  REQUIRE(message_of(Policy("h2o", 1)) == "kv_policy.budget must be >= 2 for h2o, got 1");
  REQUIRE(message_of(Policy("streaming", 8, 8)) ==
          "kv_policy.sink_tokens must be in [0, kv_policy.budget - 1 = 7], got 8");
  KvPolicyOverride recent = Policy("scissorhands", 16);
  recent.recent_tokens = 20;
  REQUIRE(message_of(recent) ==
          "kv_policy.recent_tokens must be in [0, kv_policy.budget - 1 = 15] for scissorhands "
          "(0: kv_policy.budget / 2), got 20");
  REQUIRE(message_of(Policy("streaming", 4000)) ==
          "kv_policy.budget: 4016 tokens held need 251 KV blocks, but the whole pool has 64");
  REQUIRE(engine->GetStats().requests_rejected == 6);

  SECTION("engine defaults are checked at start-up") {
    auto create = [](EvictionParams e, const std::string& model) {
      CpuRunnerOptions opt;
      opt.num_blocks = 64;
      auto runner = CpuModelRunner::Create(Stories().weights, opt);
      REQUIRE(runner.ok());
      EngineConfig config;
      config.eviction = e;
      config.evictor_model = model;
      auto engine = Engine::Create(config, std::move(*runner), Stories().tokenizer);
      REQUIRE_FALSE(engine.ok());
      return std::string(engine.status().message());
    };
    EvictionParams e;
    e.policy = EvictionPolicyKind::kSlidingWindow;
    REQUIRE(create(e, "") ==
            "cache.eviction_budget must be set for sliding_window (the model has no "
            "sliding_window)");
    e.policy = EvictionPolicyKind::kH2o;
    e.budget = 1;
    REQUIRE(create(e, "") == "cache.eviction_budget must be >= 2 for h2o, got 1");
    e.policy = EvictionPolicyKind::kLearned;
    e.budget = 64;
    REQUIRE(create(e, "") ==
            "cache.eviction_policy learned needs cache.evictor_model (kvserve train-evictor)");
    REQUIRE_THAT(create(e, "/nonexistent/evictor.txt"),
                 Contains("cache.evictor_model: cannot read evictor model"));
  }
  SECTION("a default policy applies to requests without kv_policy") {
    Setup s;
    s.eviction.policy = EvictionPolicyKind::kStreaming;
    s.eviction.budget = 32;
    auto e = MakeEngine(s);
    GenerateRequest r = Greedy("Once upon a time", 100);
    r.ignore_eos = true;
    RunOne(*e, r);
    CHECK(e->GetStats().kv_evictions[static_cast<int>(EvictionPolicyKind::kStreaming)] > 0);
    // ... and "none" turns it off for one request.
    GenerateRequest off = Greedy("", 256);
    off.kv_policy.policy = "none";
    REQUIRE(RunOne(*e, off).text[0] == testing::GoldenGreedyText());
  }
}

}  // namespace
}  // namespace kvserve

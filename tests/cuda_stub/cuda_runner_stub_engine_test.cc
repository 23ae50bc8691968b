// The CUDA model runner through the stand-in under the engine's harder
// paths, on stories260K (small limits, stub_engine.h):
//   - preemption by recompute and by swap on a pool too small for the
//     batch (fp32 KV, and int4_kc, whose tails are swapped and rebuilt
//     too) gives exactly the tokens of a run that never preempts;
//   - n = 4 forks share the prompt's blocks and copy the partial one on
//     write exactly as the CPU engine does, event by event; a greedy fork
//     gives the CPU's tokens; a shared 100-token prefix is served from the
//     prefix cache with the CPU's tokens;
//   - every eviction policy (cache/eviction/eviction_params.h kAllEvictionPolicies)
//     gives the CPU engine's greedy tokens, for fp32 and int8 KV;
//   - prompts evicted from a small pool come back from the host tier
//     (ExportBlocks/ImportBlocks on the CUDA runner) with their tokens, its
//     slots in the runner's pinned arena (asynchronous copies on the copy
//     stream, no pageable copy);
//   - constrained decoding masks on the device (kernels/cuda/sampling/token_mask.h):
//     greedy regex and choice outputs are the CPU engine's, samples match;
// and every test ends with every block back in the pool.
//
// On a real GPU: a preempted sequence is recomputed in batches of other
// shapes than its first run, so "exactly the tokens" needs the runner's
// batch invariance (a row's logits independent of its batch: one GEMM
// algorithm whatever the row count, an attention split that depends on the
// row alone); the stand-in's reference GEMM has it by construction, the
// device path by the launchers' choices (tests/cuda_stub/
// cuda_batch_invariance_stub_test.cc). Fork sampling draws from Philox on
// the device and from the host sampler on the CPU, so seeded samples are
// compared with the CUDA engine's own solo runs, greedy ones with the CPU.
#include <algorithm>
#include <catch2/catch.hpp>
#include <cstring>
#include <random>
#include <regex>
#include <string>
#include <vector>

#include "cache/eviction/eviction_params.h"
#include "model/grammar/grammar_spec.h"
#include "tests/cuda_stub/cuda_stub.h"
#include "tests/cuda_stub/stub_engine.h"

namespace kvserve {
namespace {

using testing::Greedy;
using testing::MakeStubEngine;
using testing::RandomSnippet;
using testing::RequireAllBlocksFree;
using testing::Result;
using testing::RunConcurrently;
using testing::RunOne;
using testing::Stories;
using testing::StubEngine;
using testing::StubSetup;

TEST_CASE("stub runner: preemption by recompute and by swap changes no token", "[cuda_stub]") {
  const std::vector<GenerateRequest> reqs = [] {
    std::mt19937 rng(7);
    std::vector<GenerateRequest> out;
    for (int i = 0; i < 6; ++i) {
      out.push_back(Greedy(RandomSnippet(rng, 100), 30 + rng() % 30));
      out.back().ignore_eos = true;
      if (i % 3 == 2) out.back().priority = -1;
    }
    return out;
  }();
  for (const char* kv : {"fp32", "int4_kc", "int2_kc"}) {
    DYNAMIC_SECTION("kv " << kv) {
      StubSetup roomy;
      roomy.kv_dtype = kv;
      roomy.max_model_len = 128;
      StubEngine reference = MakeStubEngine(roomy);
      const std::vector<Result> expected = RunConcurrently(*reference.engine, reqs);
      REQUIRE(reference.engine->GetStats().preemptions == 0);
      RequireAllBlocksFree(*reference.engine);
      for (PreemptionMode mode : {PreemptionMode::kRecompute, PreemptionMode::kSwap}) {
        INFO((mode == PreemptionMode::kSwap ? "swap" : "recompute"));
        StubSetup tight = roomy;
        tight.num_blocks = 10;  // 160 tokens: about two of the four running sequences
        tight.num_swap_blocks = mode == PreemptionMode::kSwap ? 24 : 0;
        tight.mode = mode;
        StubEngine t = MakeStubEngine(tight);
        const std::vector<Result> got = RunConcurrently(*t.engine, reqs);
        for (size_t i = 0; i < reqs.size(); ++i) {
          INFO("request " << i);
          REQUIRE(got[i].finish[0] == FinishReason::kLength);
          REQUIRE(got[i].tokens[0] == expected[i].tokens[0]);
        }
        const EngineStats st = t.engine->GetStats();
        REQUIRE(st.preemptions > 0);
        if (mode == PreemptionMode::kSwap) {
          REQUIRE(st.kv.swapped_out_blocks > 0);
          REQUIRE(st.kv.swapped_in_blocks > 0);
        } else {
          REQUIRE(st.kv.swapped_out_blocks == 0);
        }
        RequireAllBlocksFree(*t.engine);
      }
    }
  }
}

TEST_CASE("stub runner: n = 4 forks and prefix caching share blocks exactly as on the CPU",
          "[cuda_stub][fiber_order]") {
  GenerateRequest req = testing::ForkRequest();  // 100 prompt tokens, n = 4
  req.max_tokens = 20;
  const std::vector<int32_t> prompt = req.prompt_token_ids;

  SECTION("copy-on-write of the shared partial block, step by step") {
    StubSetup gpu;
    gpu.max_num_batched_tokens = 16;  // a 7-step prefill: the callback is set in time
    StubSetup cpu = gpu;
    cpu.device = "cpu";
    StubEngine g = MakeStubEngine(gpu);
    StubEngine c = MakeStubEngine(cpu);
    Result on_gpu, on_cpu;
    const std::vector<EngineStats> gs = testing::StatsPerEvent(*g.engine, req, &on_gpu);
    const std::vector<EngineStats> cs = testing::StatsPerEvent(*c.engine, req, &on_cpu);
    // Block accounting is the cache manager's, whatever the backend. (How
    // many notify callbacks a run gets depends on when the consumer drains
    // its stream, so the events are not compared one for one.)
    testing::RequireForkSharing(gs);
    testing::RequireForkSharing(cs);
    auto peak = [](const std::vector<EngineStats>& v) {
      int64_t m = 0;
      for (const EngineStats& st : v) m = std::max<int64_t>(m, st.kv.num_active_blocks);
      return m;
    };
    REQUIRE(peak(gs) == peak(cs));
    // Copies of this run (StatsPerEvent may have submitted it more than once).
    REQUIRE(gs.back().kv.cow_copies - gs.front().kv.cow_copies ==
            cs.back().kv.cow_copies - cs.front().kv.cow_copies);
    REQUIRE(g.cuda->counters().graph_steps > 0);  // the 4 decoding samples: bucket 4
    // Sample i is the request with seed + i (Philox on the device).
    for (int i = 0; i < 4; ++i) {
      GenerateRequest one = req;
      one.n = 1;
      one.sampling.seed = 1234 + i;
      INFO("sample " << i);
      REQUIRE(RunOne(*g.engine, one).tokens[0] == on_gpu.tokens[i]);
    }
    RequireAllBlocksFree(*g.engine);
    RequireAllBlocksFree(*c.engine);
  }
  SECTION("greedy samples of a fork equal the CPU's, with logprobs") {
    GenerateRequest greedy = req;
    greedy.sampling = SamplingParams();
    greedy.sampling.temperature = 0;
    greedy.logprobs = 3;
    StubSetup gpu;
    StubSetup cpu = gpu;
    cpu.device = "cpu";
    StubEngine g = MakeStubEngine(gpu);
    StubEngine c = MakeStubEngine(cpu);
    const Result on_gpu = RunOne(*g.engine, greedy);
    const Result on_cpu = RunOne(*c.engine, greedy);
    REQUIRE(on_cpu.tokens[0].size() == 20);
    for (int i = 0; i < 4; ++i) REQUIRE(on_gpu.tokens[i] == on_cpu.tokens[0]);
    RequireAllBlocksFree(*g.engine);
  }
  SECTION("int8,int4_kc*,int8: the int8 layers' shared partial block is copied on write") {
    // The int8 layers keep the partial block's rows in the block itself, the
    // int4_kc ones in tails: the fork copies the block too (as on the CPU),
    // or its samples would read another block's rows there.
    GenerateRequest greedy = req;
    greedy.sampling = SamplingParams();
    greedy.sampling.temperature = 0;
    StubSetup gpu;
    gpu.kv_dtype = "int8,int4_kc*,int8";
    StubEngine g = MakeStubEngine(gpu);
    REQUIRE(g.cuda->partial_rows_in_blocks());
    const Result forked = RunOne(*g.engine, greedy);
    // The CPU engine's copies (the cache manager's; without the copy of the
    // int8 layers' rows there would be none).
    StubSetup cpu = gpu;
    cpu.device = "cpu";
    StubEngine c = MakeStubEngine(cpu);
    RunOne(*c.engine, greedy);
    REQUIRE(g.engine->GetStats().kv.cow_copies == 6);
    REQUIRE(c.engine->GetStats().kv.cow_copies == 6);
    GenerateRequest one = greedy;
    one.n = 1;
    const Result alone = RunOne(*g.engine, one);  // a prefix hit, no fork
    REQUIRE(alone.tokens[0].size() == 20);
    for (int i = 0; i < 4; ++i) {
      INFO("sample " << i);
      REQUIRE(forked.tokens[i] == alone.tokens[0]);
    }
    RequireAllBlocksFree(*g.engine);
  }
  SECTION("a shared 100-token prefix is served from the cache, tokens unchanged") {
    std::vector<GenerateRequest> reqs = testing::SharedPrefixRequests(prompt);
    reqs.resize(8);
    for (GenerateRequest& r : reqs) r.max_tokens = 12;
    StubSetup gpu;
    gpu.num_blocks = 96;  // the prefix stays cached
    StubSetup cpu = gpu;
    cpu.device = "cpu";
    StubEngine g = MakeStubEngine(gpu);
    StubEngine c = MakeStubEngine(cpu);
    auto run = [&](Engine& e) {
      std::vector<Result> out;
      out.push_back(RunOne(e, reqs[0]));
      std::vector<GenerateRequest> rest(reqs.begin() + 1, reqs.end());
      for (Result& r : RunConcurrently(e, rest)) out.push_back(r);
      return out;
    };
    const std::vector<Result> on_gpu = run(*g.engine);
    const std::vector<Result> on_cpu = run(*c.engine);
    for (size_t i = 0; i < reqs.size(); ++i) {
      INFO("request " << i);
      REQUIRE(on_gpu[i].tokens[0] == on_cpu[i].tokens[0]);
      REQUIRE(on_gpu[i].usage.cached_prompt_tokens == (i == 0 ? 0 : 96));
    }
    REQUIRE(g.engine->GetStats().kv.prefix_hit_tokens == 7 * 96);
    REQUIRE(g.engine->GetStats().kv.prefix_hit_tokens == c.engine->GetStats().kv.prefix_hit_tokens);
    RequireAllBlocksFree(*g.engine);
  }
}

KvPolicyOverride Policy(const char* name, int32_t budget, int32_t sinks = -1) {
  KvPolicyOverride p;
  p.policy = name;
  p.budget = budget;
  p.sink_tokens = sinks;
  return p;
}

TEST_CASE("stub runner: every eviction policy gives the CPU engine's greedy tokens",
          "[cuda_stub][fiber_order]") {
  // One request per policy (streaming with and without sinks), prompts of
  // about 60 to 100 tokens against budgets of 24 to 40.
  const KvPolicyOverride policies[] = {Policy("none", 0),          Policy("sliding_window", 24),
                                       Policy("streaming", 32, 4), Policy("streaming", 28, 0),
                                       Policy("h2o", 32),          Policy("scissorhands", 28),
                                       Policy("learned", 36)};
  static_assert(std::size(kAllEvictionPolicies) == 6, "a new policy needs a request here");
  std::mt19937 rng(91);
  std::vector<GenerateRequest> reqs;
  for (const KvPolicyOverride& p : policies) {
    GenerateRequest r = Greedy(RandomSnippet(rng, 400), 24 + rng() % 16);
    r.kv_policy = p;
    r.ignore_eos = true;
    reqs.push_back(std::move(r));
  }
  for (const char* kv : {"fp32", "int8"}) {
    DYNAMIC_SECTION("kv " << kv) {
      StubSetup gpu;
      gpu.kv_dtype = kv;
      gpu.block_size = std::string(kv) == "fp32" ? 4 : 16;
      gpu.num_blocks = 4 * 192 / gpu.block_size;
      gpu.eviction = true;
      StubSetup cpu = gpu;
      cpu.device = "cpu";
      StubEngine g = MakeStubEngine(gpu);
      StubEngine c = MakeStubEngine(cpu);
      REQUIRE(g.cuda->supports_eviction());
      const std::vector<Result> on_gpu = RunConcurrently(*g.engine, reqs);
      const std::vector<Result> on_cpu = RunConcurrently(*c.engine, reqs);
      for (size_t i = 0; i < reqs.size(); ++i) {
        INFO("request " << i << " (" << reqs[i].kv_policy.policy << "): " << reqs[i].prompt);
        REQUIRE(on_gpu[i].tokens[0].size() == static_cast<size_t>(reqs[i].max_tokens));
        REQUIRE(on_gpu[i].tokens == on_cpu[i].tokens);
      }
      const EngineStats st = g.engine->GetStats();
      const EngineStats cst = c.engine->GetStats();
      for (EvictionPolicyKind k : kAllEvictionPolicies) {
        INFO(EvictionPolicyName(k));
        if (k != EvictionPolicyKind::kNone) REQUIRE(st.kv_evictions[static_cast<int>(k)] > 0);
        REQUIRE(st.kv_evictions[static_cast<int>(k)] == cst.kv_evictions[static_cast<int>(k)]);
      }
      RequireAllBlocksFree(*g.engine);
      RequireAllBlocksFree(*c.engine);
    }
  }
}

// The host tier under the CUDA runner (tests/scheduler/engine_tier_test.cc
// on the CPU): four 200-token prompts through a 40-block pool spill prompt
// 0's filed blocks to the host tier; prompt 0 again is served from there,
// 192 tokens cached, with the greedy tokens it had when computed.
TEST_CASE("stub engine: prompts evicted from a small pool come back from the host tier",
          "[cuda_stub]") {
  for (const char* kv : {"fp32", "int8,fp16,int8*"}) {
    INFO("kv " << kv);
    testing::StubSetup s;
    s.kv_dtype = kv;
    s.num_blocks = 40;
    s.max_num_seqs = 4;
    s.max_num_batched_tokens = 64;
    std::unique_ptr<ModelRunner> runner = testing::MakeStubRunner(s);
    REQUIRE(runner->supports_kv_tiers());
    EngineConfig config = testing::EngineConfigOf(s);
    config.tiers.host_bytes = 8 << 20;
    config.weights_fingerprint = "stories";
    auto engine = Engine::Create(config, std::move(runner), testing::Stories().tokenizer);
    REQUIRE(engine.ok());
    const auto prompt = [](int i) {
      std::vector<int32_t> ids =
          testing::Stories().tokenizer->Encode(testing::DevStories()[i], true);
      REQUIRE(ids.size() >= 200);
      ids.resize(200);
      GenerateRequest r;
      r.prompt_token_ids = ids;
      r.max_tokens = 12;
      r.ignore_eos = true;
      r.sampling.temperature = 0.0f;
      return r;
    };
    // Every spill and load goes through the pinned arena: no copy with
    // pageable memory on either side, from the first prompt on.
    const int64_t pageable = cuda_stub::GetCounters().pageable_copies;
    std::vector<Result> first;
    for (int i = 0; i < 4; ++i) first.push_back(RunOne(**engine, prompt(i)));
    constexpr int kHost = static_cast<int>(TierKind::kHost);
    REQUIRE((*engine)->GetStats().tiers[kHost].stored_tokens > 0);
    const Result again = RunOne(**engine, prompt(0));
    REQUIRE(again.tokens == first[0].tokens);
    REQUIRE(again.usage.cached_prompt_tokens == 192);
    REQUIRE((*engine)->GetStats().tiers[kHost].hit_blocks == 12);
    REQUIRE(RunOne(**engine, prompt(1)).tokens == first[1].tokens);
    REQUIRE(cuda_stub::GetCounters().pageable_copies == pageable);
    RequireAllBlocksFree(**engine);
  }
}

// The arena's copies are asynchronous: an export into it is there only
// once FinishExports returns (the stand-in runs a queued copy when something
// waits for it, so before that the slot still holds its old bytes), and an
// import from it is ordered before the compute stream's next work.
TEST_CASE("stub runner: tier copies to and from the pinned arena run on the copy stream",
          "[cuda_stub]") {
  testing::StubSetup s;
  s.kv_dtype = "int8";
  std::unique_ptr<ModelRunner> runner = testing::MakeStubRunner(s);
  const size_t per = static_cast<size_t>(runner->tier_block_bytes());
  auto arena = runner->AllocateTierArena(static_cast<int64_t>(4 * per));
  REQUIRE(arena.ok());
  REQUIRE(arena->size() == 4 * per);
  REQUIRE(runner->AllocateTierArena(64).status().code() == absl::StatusCode::kFailedPrecondition);
  std::vector<uint8_t> payload(per);
  for (size_t i = 0; i < per; ++i) payload[i] = static_cast<uint8_t>(i * 7 + 3);
  const std::vector<BlockId> three = {3}, four = {4};
  const std::vector<const uint8_t*> from_pageable = {payload.data()};
  REQUIRE(runner->ImportBlocks(three, from_pageable).ok());  // pageable: done at return

  uint8_t* slot = arena->data() + per;
  std::memset(slot, 0, per);
  const std::vector<uint8_t*> to_slot = {slot};
  const int64_t pageable = cuda_stub::GetCounters().pageable_copies;
  REQUIRE(runner->ExportBlocksTo(three, to_slot).ok());
  REQUIRE(std::vector<uint8_t>(slot, slot + per) == std::vector<uint8_t>(per, 0));
  REQUIRE(runner->FinishExports().ok());
  REQUIRE(std::vector<uint8_t>(slot, slot + per) == payload);

  const std::vector<const uint8_t*> from_slot = {slot};
  REQUIRE(runner->ImportBlocks(four, from_slot).ok());
  REQUIRE(cuda_stub::GetCounters().pageable_copies == pageable);
  std::vector<uint8_t> back(per, 0);
  REQUIRE(runner->ExportBlocks(four, back).ok());  // pageable, after the import
  REQUIRE(back == payload);
}

TEST_CASE("stub engine: constrained decoding masks on the device with the CPU engine's tokens",
          "[cuda_stub][fiber_order]") {
  StubSetup gpu;
  StubSetup cpu = gpu;
  cpu.device = "cpu";
  StubEngine g = MakeStubEngine(gpu);
  StubEngine c = MakeStubEngine(cpu);
  const auto constrained = [](GrammarSpec::Kind kind, const char* text, const char* field,
                              float temperature, uint64_t seed) {
    GenerateRequest r;
    r.prompt = "Once upon a time";
    r.max_tokens = 40;
    r.ignore_eos = true;  // the grammar ends the output
    r.sampling.temperature = temperature;
    r.sampling.seed = seed;
    r.constraint.kind = kind;
    r.constraint.text = text;
    r.constraint.field = field;
    return r;
  };
  const std::regex re("[0-9]{3}-[a-z]{2,4}");
  // Greedy: the device-masked argmax is the CPU's, token for token.
  GenerateRequest greedy =
      constrained(GrammarSpec::Kind::kRegex, "[0-9]{3}-[a-z]{2,4}", "guided_regex", 0.0f, 0);
  const Result on_gpu = RunOne(*g.engine, greedy);
  const Result on_cpu = RunOne(*c.engine, greedy);
  INFO(on_gpu.text[0]);
  REQUIRE(std::regex_match(on_gpu.text[0], re));
  REQUIRE(on_gpu.tokens[0] == on_cpu.tokens[0]);
  // Sampled (Philox on the device, so not the CPU's draws): every output
  // still matches, and a choice is one of its strings.
  for (uint64_t seed = 0; seed < 4; ++seed) {
    const Result r = RunOne(*g.engine, constrained(GrammarSpec::Kind::kRegex, "[0-9]{3}-[a-z]{2,4}",
                                                   "guided_regex", 1.0f, seed));
    INFO(r.text[0]);
    REQUIRE(std::regex_match(r.text[0], re));
    REQUIRE(r.finish[0] == FinishReason::kStop);
    GenerateRequest choice =
        constrained(GrammarSpec::Kind::kChoice, "", "guided_choice", 1.0f, seed);
    choice.constraint.choices = {"dragon", "princess", "frog"};
    const Result cr = RunOne(*g.engine, choice);
    INFO(cr.text[0]);
    REQUIRE((cr.text[0] == "dragon" || cr.text[0] == "princess" || cr.text[0] == "frog"));
  }
  RequireAllBlocksFree(*g.engine);
  RequireAllBlocksFree(*c.engine);
}

}  // namespace
}  // namespace kvserve

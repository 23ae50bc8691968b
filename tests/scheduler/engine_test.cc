// Engine end to end on stories260K (CpuModelRunner): continuous batching,
// chunked prefill, preemption (recompute and swap), prefix caching, parallel
// samples, stop conditions, streaming text, cancellation and validation.
//
// The reference for every batched run is the same request run alone on the
// same kind of engine: continuous batching must not change a single token.
// That holds for int4_kc too (its partial blocks live in full-precision
// tails, forked, copied on write, swapped and recomputed with the sequence),
// and for cross-layer pairs (cache.cross_layer: merged when a block fills,
// tails until then, steps cut into rounds at block boundaries).
#include "scheduler/engine.h"

#include <algorithm>
#include <catch2/catch.hpp>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "cache/format/kv_dtype_spec.h"
#include "model/cpu/cpu_model_runner.h"
#include "model/loader/model_loader.h"
#include "scheduler/detokenizer.h"
#include "tests/engine_harness.h"
#include "tests/test_util.h"
#include "util/clock.h"
#include "util/field_status.h"

namespace kvserve {
namespace {

using testing::Stories;

struct Setup : testing::EngineSetup {
  KvDtypeSpec kv_dtype = KvDtype::kFp32;
  KvCrossLayerSpec cross_layer;  // off
  std::function<void(const RequestMetrics&)> on_finished;
  std::vector<int32_t> model_stop_ids;  // ModelConfig::stop_ids
  std::shared_ptr<const Clock> clock;   // null: the real clock
  bool fair_clients = false;            // EngineConfig::fair_clients
};

std::unique_ptr<Engine> MakeEngine(const Setup& s) {
  CpuRunnerOptions opt;
  opt.kv_dtype = s.kv_dtype;
  opt.block_size = s.block_size;
  opt.num_blocks = s.num_blocks;
  opt.num_swap_blocks = s.num_swap_blocks;
  opt.num_tail_blocks = 2 * s.max_num_seqs;  // as the runner factory reserves them
  opt.cross_layer = s.cross_layer;
  LlamaWeights weights = Stories().weights;  // views: a cheap copy
  weights.config.stop_ids = s.model_stop_ids;
  auto runner = CpuModelRunner::Create(std::move(weights), opt);
  REQUIRE(runner.ok());
  EngineConfig config = testing::EngineConfigOf(s);
  config.on_request_finished = s.on_finished;
  config.clock = s.clock;
  config.fair_clients = s.fair_clients;
  auto engine = Engine::Create(config, std::move(*runner), Stories().tokenizer);
  REQUIRE(engine.ok());
  return std::move(*engine);
}

using testing::Collect;
using testing::DevStories;
using testing::Greedy;
using testing::RandomSnippet;
using testing::RequireAllBlocksFree;
using testing::Result;
using testing::RunConcurrently;
using testing::RunOne;

// A request that cannot end on its own while a test runs: streaming eviction
// keeps its positions bounded, so it is not held to max_model_len, and it
// asks for a billion tokens.
GenerateRequest Endless() {
  GenerateRequest r = Greedy("Once", 1 << 29);
  r.ignore_eos = true;
  r.kv_policy.policy = "streaming";
  r.kv_policy.budget = 48;
  r.kv_policy.sink_tokens = 4;
  return r;
}

// Blocks until the stream's first event (so its request is running) and
// returns its tokens.
std::vector<int32_t> FirstEvent(RequestStream& stream) {
  GenerateOutput out;
  REQUIRE(stream.Next(&out) == RequestStream::Pop::kOutput);
  REQUIRE(out.finish_reason == FinishReason::kNone);
  return out.token_ids;
}

TEST_CASE("Engine reproduces llama2.c's greedy story from BOS", "[scheduler]") {
  auto engine = MakeEngine({});
  GenerateRequest req = Greedy("", 256);  // run.c: 256 forward steps, 256 tokens
  Result r = RunOne(*engine, req);
  REQUIRE(r.text[0] == testing::GoldenGreedyText());
  REQUIRE(r.usage.prompt_tokens == 1);
  REQUIRE(r.usage.completion_tokens == static_cast<int32_t>(r.tokens[0].size()));
}

TEST_CASE("64 concurrent requests produce exactly their solo greedy tokens", "[scheduler]") {
  for (int block_size : {1, 16}) {
    for (bool prefix : {false, true}) {
      DYNAMIC_SECTION("block_size " << block_size << ", prefix caching " << prefix) {
        Setup setup;
        setup.block_size = block_size;
        setup.num_blocks = 64 * 512 / block_size;
        setup.prefix_caching = prefix;
        setup.max_num_batched_tokens = 256;  // long prompts are chunked
        auto engine = MakeEngine(setup);
        std::mt19937 rng(1000 + block_size + prefix);
        std::vector<GenerateRequest> reqs;
        for (int i = 0; i < 64; ++i) {
          reqs.push_back(Greedy(RandomSnippet(rng, 400), 1 + rng() % 80));
          reqs.back().ignore_eos = rng() % 4 == 0;
        }
        std::vector<Result> solo;
        for (const GenerateRequest& r : reqs) solo.push_back(RunOne(*engine, r));
        const EngineStats solo_stats = engine->GetStats();
        std::vector<Result> together = RunConcurrently(*engine, reqs);
        for (size_t i = 0; i < reqs.size(); ++i) {
          INFO("request " << i << ": " << reqs[i].prompt);
          REQUIRE(together[i].tokens[0] == solo[i].tokens[0]);
          REQUIRE(together[i].text[0] == solo[i].text[0]);
          REQUIRE(together[i].finish[0] == solo[i].finish[0]);
          REQUIRE(together[i].usage.completion_tokens == solo[i].usage.completion_tokens);
        }
        const EngineStats st = engine->GetStats();
        REQUIRE(st.preemptions == 0);
        REQUIRE(st.requests_finished_stop + st.requests_finished_length == 128);
        // The concurrent run really batched: many sequences per step.
        REQUIRE(st.batched_seqs - solo_stats.batched_seqs > 8 * (st.steps - solo_stats.steps));
        if (prefix) {
          REQUIRE(st.kv.prefix_hit_tokens > 0);
        } else {
          REQUIRE(st.kv.prefix_hit_tokens == 0);
        }
        RequireAllBlocksFree(*engine);
      }
    }
  }
}

TEST_CASE("64 concurrent requests with an int4_kc cache produce exactly their solo tokens",
          "[scheduler]") {
  struct Variant {
    const char* dtype;
    int block_size;
    bool prefix;
  };
  for (Variant v : {Variant{"int4_kc", 16, false}, Variant{"int4_kc", 16, true},
                    Variant{"int8,int4_kc*,int8", 32, true}}) {
    DYNAMIC_SECTION(v.dtype << ", block_size " << v.block_size << ", prefix caching " << v.prefix) {
      Setup setup;
      setup.kv_dtype = *KvDtypeSpec::Parse(v.dtype);
      setup.block_size = v.block_size;
      setup.num_blocks = 64 * 512 / v.block_size;
      setup.prefix_caching = v.prefix;
      setup.max_num_batched_tokens = 256;  // long prompts are chunked, at any row
      auto engine = MakeEngine(setup);
      std::mt19937 rng(2000 + v.block_size + v.prefix);
      std::vector<GenerateRequest> reqs;
      for (int i = 0; i < 64; ++i) {
        reqs.push_back(Greedy(RandomSnippet(rng, 400), 1 + rng() % 80));
        reqs.back().ignore_eos = rng() % 4 == 0;
      }
      std::vector<Result> solo;
      for (const GenerateRequest& r : reqs) solo.push_back(RunOne(*engine, r));
      const EngineStats solo_stats = engine->GetStats();
      std::vector<Result> together = RunConcurrently(*engine, reqs);
      for (size_t i = 0; i < reqs.size(); ++i) {
        INFO("request " << i << ": " << reqs[i].prompt);
        REQUIRE(together[i].tokens[0] == solo[i].tokens[0]);
        REQUIRE(together[i].text[0] == solo[i].text[0]);
      }
      const EngineStats st = engine->GetStats();
      REQUIRE(st.preemptions == 0);
      REQUIRE(st.batched_seqs - solo_stats.batched_seqs > 8 * (st.steps - solo_stats.steps));
      if (v.prefix) REQUIRE(st.kv.prefix_hit_tokens > 0);
      RequireAllBlocksFree(*engine);
    }
  }
}

TEST_CASE("int4_kc: preemption (recompute and swap), forks and prefix hits keep every token",
          "[scheduler]") {
  // int2_kc runs the same tails with 2-bit blocks; an int8 first and last
  // layer keeps its partial block's rows in the block; cross-layer pairs
  // keep tails too, in fp32 (from layer 2) and int8 (from layer 1) pages.
  struct Tails {
    const char* dtype;
    int cross_from;  // -1: no cross-layer sharing
  };
  const Tails t = GENERATE(Tails{"int4_kc", -1}, Tails{"int2_kc", -1},
                           Tails{"int8,int4_kc*,int8", -1}, Tails{"fp32", 2}, Tails{"int8", 1});
  const KvDtypeSpec kc = *KvDtypeSpec::Parse(t.dtype);
  KvCrossLayerSpec cross;
  cross.from_layer = t.cross_from;
  // Layers without tails keep a partial block's rows in it.
  const bool rows_in_blocks = t.cross_from >= 0 || !kc.is_uniform();
  INFO(t.dtype << ", cross_layer from " << t.cross_from);
  for (PreemptionMode mode : {PreemptionMode::kRecompute, PreemptionMode::kSwap}) {
    DYNAMIC_SECTION((mode == PreemptionMode::kSwap ? "swap" : "recompute")) {
      Setup setup;
      setup.kv_dtype = kc;
      setup.cross_layer = cross;
      setup.max_model_len = 192;
      setup.num_blocks = 2 * 192 / 16;  // two long sequences at most
      setup.num_swap_blocks = mode == PreemptionMode::kSwap ? 6 * 192 / 16 : 0;
      setup.mode = mode;
      setup.max_num_seqs = 16;
      auto engine = MakeEngine(setup);
      std::mt19937 rng(17);
      std::vector<GenerateRequest> reqs;
      for (int i = 0; i < 16; ++i) {
        reqs.push_back(Greedy(RandomSnippet(rng, 120), 40 + rng() % 100));
        reqs.back().ignore_eos = true;
      }
      std::vector<Result> solo;
      for (const GenerateRequest& r : reqs) solo.push_back(RunOne(*engine, r));
      REQUIRE(engine->GetStats().preemptions == 0);
      std::vector<Result> together = RunConcurrently(*engine, reqs);
      for (size_t i = 0; i < reqs.size(); ++i) {
        INFO("request " << i);
        REQUIRE(together[i].tokens[0] == solo[i].tokens[0]);
      }
      const EngineStats st = engine->GetStats();
      REQUIRE(st.preemptions > 0);
      if (mode == PreemptionMode::kSwap) REQUIRE(st.kv.swapped_in_blocks > 0);
      RequireAllBlocksFree(*engine);
    }
  }
  SECTION("n = 4 samples fork the prompt's tail and match separate seeded runs") {
    Setup setup;
    setup.kv_dtype = kc;
    setup.cross_layer = cross;
    setup.num_blocks = 512;
    setup.max_num_batched_tokens = 16;  // the prompt ends mid-block after chunks
    setup.max_num_seqs = 16;
    auto engine = MakeEngine(setup);
    GenerateRequest req = testing::ForkRequest();  // 6 full blocks and 4 rows in the tail
    req.sampling.seed = 99;
    const Result together = RunOne(*engine, req);
    const EngineStats st = engine->GetStats();
    // Three samples copy the shared tail once each; where layers without
    // tails keep the partial block's rows in it, it is copied too.
    REQUIRE(st.kv.cow_copies == (rows_in_blocks ? 6 : 3));
    for (int i = 0; i < 4; ++i) {
      GenerateRequest one = req;
      one.n = 1;
      one.sampling.seed = 99 + i;
      INFO("sample " << i);
      REQUIRE(RunOne(*engine, one).tokens[0] == together.tokens[i]);
    }
    RequireAllBlocksFree(*engine);
  }
  SECTION("a prefix hit gives the tokens computing the prefix gives") {
    std::vector<int32_t> prefix = Stories().tokenizer->Encode(DevStories()[10], true);
    prefix.resize(100);
    std::mt19937 rng(5);
    std::vector<GenerateRequest> reqs;
    for (int i = 0; i < 8; ++i) {
      GenerateRequest r;
      r.sampling.temperature = 0.0f;
      r.prompt_token_ids = prefix;
      std::string text = " ";  // not " " + snippet: gcc 12's -Wrestrict false positive
      text += RandomSnippet(rng, 60);
      std::vector<int32_t> more = Stories().tokenizer->Encode(text, false);
      r.prompt_token_ids.insert(r.prompt_token_ids.end(), more.begin(), more.end());
      r.max_tokens = 30;
      reqs.push_back(r);
    }
    std::vector<std::vector<int32_t>> runs[2];
    for (bool prefix_caching : {false, true}) {
      Setup setup;
      setup.kv_dtype = kc;
      setup.cross_layer = cross;
      setup.prefix_caching = prefix_caching;
      setup.max_num_seqs = 8;
      setup.max_num_batched_tokens = 48;  // prompts are chunked at rows that split blocks
      auto engine = MakeEngine(setup);
      runs[prefix_caching].push_back(RunOne(*engine, reqs[0]).tokens[0]);
      std::vector<GenerateRequest> rest(reqs.begin() + 1, reqs.end());
      for (Result& r : RunConcurrently(*engine, rest)) runs[prefix_caching].push_back(r.tokens[0]);
      REQUIRE(engine->GetStats().kv.prefix_hit_tokens == (prefix_caching ? 7 * 96 : 0));
    }
    REQUIRE(runs[1] == runs[0]);
  }
}

TEST_CASE("A pool too small forces preemption and every request still finishes exactly",
          "[scheduler]") {
  for (PreemptionMode mode : {PreemptionMode::kRecompute, PreemptionMode::kSwap}) {
    for (int block_size : {4, 16}) {
      DYNAMIC_SECTION((mode == PreemptionMode::kSwap ? "swap" : "recompute")
                      << ", block_size " << block_size) {
        Setup setup;
        setup.block_size = block_size;
        setup.max_model_len = 192;
        setup.num_blocks = 2 * 192 / block_size;  // two long sequences at most
        setup.num_swap_blocks = mode == PreemptionMode::kSwap ? 6 * 192 / block_size : 0;
        setup.mode = mode;
        setup.max_num_seqs = 16;
        auto engine = MakeEngine(setup);
        std::mt19937 rng(7 + block_size);
        std::vector<GenerateRequest> reqs;
        for (int i = 0; i < 16; ++i) {
          reqs.push_back(Greedy(RandomSnippet(rng, 120), 40 + rng() % 100));
          reqs.back().ignore_eos = true;
          if (i % 5 == 4) reqs.back().priority = -1;  // some jump the queue
        }
        std::vector<Result> solo;
        for (const GenerateRequest& r : reqs) solo.push_back(RunOne(*engine, r));
        REQUIRE(engine->GetStats().preemptions == 0);
        std::vector<Result> together = RunConcurrently(*engine, reqs);
        for (size_t i = 0; i < reqs.size(); ++i) {
          INFO("request " << i);
          REQUIRE(together[i].finish[0] == FinishReason::kLength);
          REQUIRE(together[i].tokens[0] == solo[i].tokens[0]);
          REQUIRE(together[i].text[0] == solo[i].text[0]);
        }
        const EngineStats st = engine->GetStats();
        REQUIRE(st.preemptions > 0);
        if (mode == PreemptionMode::kSwap) {
          REQUIRE(st.kv.swapped_out_blocks > 0);
          REQUIRE(st.kv.swapped_in_blocks > 0);
        } else {
          REQUIRE(st.kv.swapped_out_blocks == 0);
        }
        RequireAllBlocksFree(*engine);
      }
    }
  }
}

TEST_CASE("Swap preemption falls back to recompute when the host pool is full", "[scheduler]") {
  Setup setup;
  setup.max_model_len = 192;
  setup.num_blocks = 24;
  setup.num_swap_blocks = 12;  // room for about one swapped sequence
  setup.mode = PreemptionMode::kSwap;
  auto engine = MakeEngine(setup);
  std::mt19937 rng(99);
  std::vector<GenerateRequest> reqs;
  for (int i = 0; i < 12; ++i) {
    reqs.push_back(Greedy(RandomSnippet(rng, 100), 100 + rng() % 60));
    reqs.back().ignore_eos = true;
  }
  std::vector<Result> solo;
  for (const GenerateRequest& r : reqs) solo.push_back(RunOne(*engine, r));
  std::vector<Result> together = RunConcurrently(*engine, reqs);
  for (size_t i = 0; i < reqs.size(); ++i) REQUIRE(together[i].tokens[0] == solo[i].tokens[0]);
  const EngineStats st = engine->GetStats();
  REQUIRE(st.preemptions > 0);
  REQUIRE(st.kv.swapped_out_blocks > 0);
  RequireAllBlocksFree(*engine);
}

TEST_CASE("Cancelling half the requests mid-stream leaks no blocks", "[scheduler]") {
  Setup setup;
  setup.num_blocks = 256;  // tight enough that some requests wait
  auto engine = MakeEngine(setup);
  std::mt19937 rng(5);
  std::vector<std::shared_ptr<RequestStream>> streams;
  std::vector<GenerateRequest> reqs;
  for (int i = 0; i < 32; ++i) {
    GenerateRequest r = Greedy(RandomSnippet(rng, 200), 200);
    r.ignore_eos = true;
    reqs.push_back(r);
    auto s = engine->Submit(r);
    REQUIRE(s.ok());
    RequestStream* raw = s->get();
    if (i % 2 == 0) {
      // Cancel from the engine thread right after a few tokens arrived.
      auto count = std::make_shared<int>(0);
      const int after = 1 + i % 7;
      raw->SetNotify([raw, count, after] {
        if (++*count == after) raw->Cancel();
      });
    }
    streams.push_back(*s);
  }
  streams[30]->Cancel();  // before it ever ran, perhaps
  for (int i = 0; i < 32; ++i) {
    INFO("request " << i);
    Result r = Collect(*streams[i]);
    if (i % 2 == 0) {
      REQUIRE(r.finish[0] == FinishReason::kCancelled);
      REQUIRE(r.tokens[0].size() < 200);
    } else {
      REQUIRE(r.finish[0] == FinishReason::kLength);
      REQUIRE(r.tokens[0].size() == 200);
    }
  }
  const EngineStats st = engine->GetStats();
  REQUIRE(st.requests_finished_cancelled == 16);
  REQUIRE(st.requests_finished_length == 16);
  RequireAllBlocksFree(*engine);

  SECTION("the survivors produced their solo tokens") {
    for (int i = 1; i < 32; i += 2) {
      auto stream = engine->Submit(reqs[i]);
      REQUIRE(stream.ok());
      Result solo = Collect(**stream);
      REQUIRE(solo.tokens[0].size() == 200);
    }
  }
}

TEST_CASE("Stop strings and stop tokens end a sample without emitting the stop", "[scheduler]") {
  auto engine = MakeEngine({});
  GenerateRequest base = Greedy("Once upon a time, there was a", 120);
  base.ignore_eos = true;
  Result full = RunOne(*engine, base);
  const std::string& text = full.text[0];
  REQUIRE(text.size() > 200);

  SECTION("a stop string spanning several tokens") {
    const std::string stop = text.substr(100, 9);
    GenerateRequest req = base;
    req.stop = {"never appears", stop};
    Result r = RunOne(*engine, req);
    REQUIRE(r.finish[0] == FinishReason::kStop);
    REQUIRE(r.text[0] == text.substr(0, text.find(stop)));
    // The tokens are the solo tokens up to the one that completed the stop.
    REQUIRE(r.tokens[0].size() < full.tokens[0].size());
    REQUIRE(std::equal(r.tokens[0].begin(), r.tokens[0].end(), full.tokens[0].begin()));
    REQUIRE(Stories().tokenizer->Decode(r.tokens[0], base.prompt.empty() ? 1 : 0).size() > 0);
  }
  SECTION("a stop string that never matches leaves the text whole") {
    GenerateRequest req = base;
    req.stop = {"zzz"};
    Result r = RunOne(*engine, req);
    REQUIRE(r.finish[0] == FinishReason::kLength);
    REQUIRE(r.text[0] == text);
  }
  SECTION("a stop token id ends the sample and adds no text") {
    const int32_t stop_id = full.tokens[0][10];
    const size_t first =
        std::find(full.tokens[0].begin(), full.tokens[0].end(), stop_id) - full.tokens[0].begin();
    GenerateRequest req = base;
    req.stop_token_ids = {stop_id};
    Result r = RunOne(*engine, req);
    REQUIRE(r.finish[0] == FinishReason::kStop);
    REQUIRE(r.tokens[0] ==
            std::vector<int32_t>(full.tokens[0].begin(), full.tokens[0].begin() + first + 1));
    const std::vector<int32_t> prompt_ids = Stories().tokenizer->Encode(base.prompt, true);
    REQUIRE(r.text[0] ==
            Stories().tokenizer->Decode(std::span<const int32_t>(r.tokens[0]).first(first),
                                        prompt_ids.back()));
  }
  SECTION("the model's other stop ids (generation_config.json) stop like EOS") {
    const int32_t stop_id = full.tokens[0][10];
    const size_t first =
        std::find(full.tokens[0].begin(), full.tokens[0].end(), stop_id) - full.tokens[0].begin();
    Setup setup;
    setup.model_stop_ids = {stop_id};
    auto stopping = MakeEngine(setup);
    GenerateRequest req = base;
    req.ignore_eos = false;
    Result r = RunOne(*stopping, req);
    REQUIRE(r.finish[0] == FinishReason::kStop);
    REQUIRE(r.tokens[0] ==
            std::vector<int32_t>(full.tokens[0].begin(), full.tokens[0].begin() + first + 1));
    req.ignore_eos = true;
    REQUIRE(RunOne(*stopping, req).tokens[0] == full.tokens[0]);
  }
  SECTION("EOS stops unless ignore_eos") {
    GenerateRequest req = Greedy("", 400);
    Result r = RunOne(*engine, req);
    REQUIRE(r.finish[0] == FinishReason::kStop);
    REQUIRE(r.tokens[0].back() == Stories().tokenizer->bos_id());  // BOS ends a story here
    req.ignore_eos = true;
    Result r2 = RunOne(*engine, req);
    REQUIRE(r2.finish[0] == FinishReason::kLength);
    REQUIRE(r2.tokens[0].size() == 400);
  }
}

TEST_CASE("n > 1 samples share the prompt and match separate seeded runs", "[scheduler]") {
  Setup setup;
  setup.num_blocks = 512;
  // A 100-token prompt is prefilled over 7 steps, so a notify callback set
  // right after Submit is in place long before the first token.
  setup.max_num_batched_tokens = 16;
  setup.max_num_seqs = 16;
  auto engine = MakeEngine(setup);
  const GenerateRequest req = testing::ForkRequest();

  SECTION("sample i equals a separate request with seed + i") {
    Result together;
    testing::RequireForkSharing(testing::StatsPerEvent(*engine, req, &together));
    REQUIRE(together.usage.prompt_tokens == 100);
    REQUIRE(together.usage.completion_tokens == 160);
    std::vector<std::vector<int32_t>> distinct;
    for (int i = 0; i < 4; ++i) {
      GenerateRequest one = req;
      one.n = 1;
      one.sampling.seed = 1234 + i;
      Result solo = RunOne(*engine, one);
      INFO("sample " << i);
      REQUIRE(together.tokens[i] == solo.tokens[0]);
      REQUIRE(together.text[i] == solo.text[0]);
      REQUIRE(together.finish[i] == FinishReason::kLength);
      distinct.push_back(solo.tokens[0]);
    }
    std::sort(distinct.begin(), distinct.end());
    REQUIRE(std::unique(distinct.begin(), distinct.end()) == distinct.end());
  }
  SECTION("samples under preemption still match") {
    Setup small;
    small.num_blocks = 12;  // 4 samples of 140 tokens need 6 shared + 4 x 3 blocks
    small.max_model_len = 160;
    auto tight = MakeEngine(small);
    Result together = RunOne(*tight, req);
    REQUIRE(tight->GetStats().preemptions > 0);
    for (int i = 0; i < 4; ++i) {
      GenerateRequest one = req;
      one.n = 1;
      one.sampling.seed = 1234 + i;
      REQUIRE(together.tokens[i] == RunOne(*tight, one).tokens[0]);
    }
    RequireAllBlocksFree(*tight);
  }
  SECTION("greedy samples with logprobs") {
    GenerateRequest g = req;
    g.sampling = SamplingParams();
    g.sampling.temperature = 0.0f;
    g.logprobs = 3;
    g.n = 2;
    g.max_tokens = 5;
    auto stream = engine->Submit(g);
    REQUIRE(stream.ok());
    GenerateOutput out;
    int with_logprobs = 0;
    while ((*stream)->Next(&out) == RequestStream::Pop::kOutput) {
      REQUIRE(out.logprobs.size() == out.token_ids.size());
      for (size_t k = 0; k < out.logprobs.size(); ++k) {
        const TokenLogprob& lp = out.logprobs[k];
        REQUIRE(lp.token_id == out.token_ids[k]);
        REQUIRE(lp.top.size() == 3);
        REQUIRE(lp.top[0].first == lp.token_id);  // greedy picks the most likely
        REQUIRE(lp.top[0].second == lp.logprob);
        REQUIRE(lp.top[0].second >= lp.top[1].second);
        REQUIRE(lp.logprob <= 0.0f);
        ++with_logprobs;
      }
    }
    REQUIRE(with_logprobs == 10);
  }
}

TEST_CASE("Streamed text of byte-fallback output is valid UTF-8 and equals the whole text",
          "[scheduler]") {
  auto engine = MakeEngine({});
  GenerateRequest req;
  req.prompt = "\xF0\x9F\x90\xB6\xE4\xBD\xA0\xE5\xA5\xBD \xC3\xA9t\xC3\xA9 \xE2\x9C\x93 Lily";
  req.max_tokens = 300;
  req.ignore_eos = true;
  req.sampling.temperature = 8.0f;  // nearly uniform: about half are byte pieces
  req.sampling.seed = 42;
  const std::vector<int32_t> prompt_ids = Stories().tokenizer->Encode(req.prompt, true);
  Result r = RunOne(*engine, req);
  REQUIRE(r.all_text_valid);
  int byte_pieces = 0;
  for (int32_t id : r.tokens[0]) {
    if (Stories().tokenizer->IdToPiece(id).rfind("<0x", 0) == 0) ++byte_pieces;
  }
  REQUIRE(byte_pieces > 20);
  REQUIRE(r.text[0] == SanitizeUtf8(Stories().tokenizer->Decode(r.tokens[0], prompt_ids.back())));
}

TEST_CASE("Prefix caching reuses a shared 100-token prefix without changing tokens",
          "[scheduler]") {
  std::vector<int32_t> prefix = Stories().tokenizer->Encode(DevStories()[10], true);
  prefix.resize(100);
  const std::vector<GenerateRequest> reqs = testing::SharedPrefixRequests(prefix);
  auto run = [&](bool prefix_caching, std::vector<Usage>* usage) {
    Setup setup;
    setup.prefix_caching = prefix_caching;
    auto engine = MakeEngine(setup);
    // The first request computes the prefix; the rest arrive after it.
    std::vector<std::vector<int32_t>> tokens;
    Result first = RunOne(*engine, reqs[0]);
    tokens.push_back(first.tokens[0]);
    usage->push_back(first.usage);
    std::vector<GenerateRequest> rest(reqs.begin() + 1, reqs.end());
    for (Result& r : RunConcurrently(*engine, rest)) {
      tokens.push_back(r.tokens[0]);
      usage->push_back(r.usage);
    }
    const EngineStats st = engine->GetStats();
    RequireAllBlocksFree(*engine);
    return std::make_pair(tokens, st);
  };
  std::vector<Usage> usage_off, usage_on;
  auto [off, st_off] = run(false, &usage_off);
  auto [on, st_on] = run(true, &usage_on);
  REQUIRE(on == off);
  REQUIRE(st_off.kv.prefix_hit_tokens == 0);
  REQUIRE(usage_on[0].cached_prompt_tokens == 0);
  for (int i = 1; i < 16; ++i) {
    REQUIRE(usage_on[i].cached_prompt_tokens == 96);  // 6 full blocks of 16
    REQUIRE(usage_off[i].cached_prompt_tokens == 0);
  }
  REQUIRE(st_on.kv.prefix_hit_tokens == 15 * 96);
  REQUIRE(st_on.kv.num_cached_blocks > 0);

  SECTION("a different cache salt shares nothing") {
    Setup setup;
    auto engine = MakeEngine(setup);
    GenerateRequest a = reqs[0];
    a.cache_salt = "tenant-a";
    GenerateRequest b = reqs[1];
    b.cache_salt = "tenant-b";
    RunOne(*engine, a);
    REQUIRE(RunOne(*engine, b).usage.cached_prompt_tokens == 0);
    b.cache_salt = "tenant-a";
    REQUIRE(RunOne(*engine, b).usage.cached_prompt_tokens == 96);
  }
}

TEST_CASE("Requests that can never fit are rejected naming the field", "[scheduler]") {
  Setup setup;
  setup.max_model_len = 128;
  setup.num_blocks = 16;
  auto engine = MakeEngine(setup);
  GenerateRequest ok = Greedy("Once upon a time", 100);
  ok.ignore_eos = true;
  auto running = engine->Submit(ok);
  REQUIRE(running.ok());

  auto message_of = [&](GenerateRequest r) {
    auto s = engine->Submit(std::move(r));
    REQUIRE_FALSE(s.ok());
    REQUIRE(s.status().code() == absl::StatusCode::kInvalidArgument);
    return std::string(s.status().message());
  };
  using Catch::Matchers::Contains;
  REQUIRE_THAT(message_of(Greedy("Once upon a time", 127)), Contains("max_tokens"));
  REQUIRE_THAT(message_of(Greedy("Once upon a time", 0)), Contains("max_tokens"));
  GenerateRequest empty = Greedy("", 10);
  empty.add_bos = false;
  REQUIRE_THAT(message_of(empty), Contains("prompt"));
  GenerateRequest huge;
  huge.prompt_token_ids.assign(200, 5);
  REQUIRE_THAT(message_of(huge), Contains("prompt"));
  GenerateRequest bad_id;
  bad_id.prompt_token_ids = {1, 600};
  REQUIRE_THAT(message_of(bad_id), Contains("prompt_token_ids[1]"));
  GenerateRequest n0 = Greedy("Hi", 4);
  n0.n = 0;
  REQUIRE_THAT(message_of(n0), Contains("n must be"));
  GenerateRequest n_big = Greedy("Hi", 4);
  n_big.n = 65;
  REQUIRE_THAT(message_of(n_big), Contains("n must be"));
  GenerateRequest temp = Greedy("Hi", 4);
  temp.sampling.temperature = -1;
  REQUIRE_THAT(message_of(temp), Contains("temperature"));
  GenerateRequest lp = Greedy("Hi", 4);
  lp.logprobs = 21;
  REQUIRE_THAT(message_of(lp), Contains("logprobs"));
  GenerateRequest stop = Greedy("Hi", 4);
  stop.stop = {""};
  REQUIRE_THAT(message_of(stop), Contains("stop[0]"));
  GenerateRequest stop_id = Greedy("Hi", 4);
  stop_id.stop_token_ids = {512};
  REQUIRE_THAT(message_of(stop_id), Contains("stop_token_ids[0]"));

  Result r = Collect(**running);
  REQUIRE(r.finish[0] == FinishReason::kLength);
  REQUIRE(r.tokens[0].size() == 100);
  REQUIRE(engine->GetStats().requests_rejected == 11);

  SECTION("an engine whose pool cannot hold max_model_len is refused") {
    CpuRunnerOptions opt;
    opt.block_size = 16;
    opt.num_blocks = 4;
    auto runner = CpuModelRunner::Create(Stories().weights, opt);
    REQUIRE(runner.ok());
    EngineConfig config;
    config.max_model_len = 128;
    auto e = Engine::Create(config, std::move(*runner), Stories().tokenizer);
    REQUIRE_FALSE(e.ok());
    REQUIRE_THAT(std::string(e.status().message()), Contains("max_model_len"));
  }
}

TEST_CASE("prompt + max_tokens may equal max_model_len exactly and one token more is refused",
          "[scheduler]") {
  Setup setup;
  setup.max_model_len = 128;
  setup.num_blocks = 16;
  auto engine = MakeEngine(setup);
  GenerateRequest req;
  req.prompt_token_ids = Stories().tokenizer->Encode("Once upon a time", true);
  const int32_t prompt_len = static_cast<int32_t>(req.prompt_token_ids.size());
  req.ignore_eos = true;
  req.sampling.temperature = 0.0f;

  GenerateRequest exact = req;
  exact.max_tokens = 128 - prompt_len;
  Result r = RunOne(*engine, exact);
  REQUIRE(r.finish[0] == FinishReason::kLength);
  REQUIRE(r.tokens[0].size() == static_cast<size_t>(128 - prompt_len));
  REQUIRE(r.usage.prompt_tokens == prompt_len);
  REQUIRE(r.usage.completion_tokens == 128 - prompt_len);

  GenerateRequest over = req;
  over.max_tokens = 129 - prompt_len;
  auto refused = engine->Submit(over);
  REQUIRE(refused.status().code() == absl::StatusCode::kInvalidArgument);
  REQUIRE(ErrorField(refused.status()) == "max_tokens");
  REQUIRE(std::string(refused.status().message()) ==
          absl::StrCat("max_tokens (", 129 - prompt_len, ") + prompt (", prompt_len,
                       " tokens) = 129 exceeds max_model_len (128); lower max_tokens to at most ",
                       128 - prompt_len));
  const EngineStats st = engine->GetStats();
  REQUIRE(st.requests_rejected == 1);
  REQUIRE(st.requests_finished_length == 1);
  RequireAllBlocksFree(*engine);
}

TEST_CASE("Finish-reason counters count stop apart from length and cancelled exactly",
          "[scheduler]") {
  auto engine = MakeEngine({});
  GenerateRequest base = Greedy("Once upon a time, there was a", 60);
  base.ignore_eos = true;
  const Result full = RunOne(*engine, base);  // length 1
  REQUIRE(full.finish[0] == FinishReason::kLength);

  GenerateRequest by_id = base;  // stop 1
  by_id.stop_token_ids = {full.tokens[0][10]};
  GenerateRequest by_text = base;  // stop 2
  by_text.stop = {full.text[0].substr(20, 6)};
  GenerateRequest eos = Greedy("", 400);  // stop 3: BOS ends the story
  GenerateRequest two = base;             // length 2: one request, two samples
  two.n = 2;
  const std::vector<Result> done = RunConcurrently(*engine, {by_id, by_text, eos, two});
  REQUIRE(done[0].finish[0] == FinishReason::kStop);
  REQUIRE(done[1].finish[0] == FinishReason::kStop);
  REQUIRE(done[2].finish[0] == FinishReason::kStop);
  REQUIRE(done[3].finish ==
          std::vector<FinishReason>{FinishReason::kLength, FinishReason::kLength});

  auto endless = engine->Submit(Endless());  // cancelled 1
  REQUIRE(endless.ok());
  FirstEvent(**endless);
  (*endless)->Cancel();
  REQUIRE(Collect(**endless).finish[0] == FinishReason::kCancelled);

  const EngineStats st = engine->GetStats();
  REQUIRE(st.requests_finished_stop == 3);
  REQUIRE(st.requests_finished_length == 2);
  REQUIRE(st.requests_finished_cancelled == 1);
  REQUIRE(st.requests_finished_error == 0);
  RequireAllBlocksFree(*engine);
}

TEST_CASE("Chunked prefill, priorities, metrics and drain", "[scheduler]") {
  absl::Mutex mu;
  std::vector<RequestMetrics> metrics;
  Setup setup;
  setup.max_num_batched_tokens = 64;  // prompts of ~100 tokens take 2+ steps
  setup.max_num_seqs = 4;
  setup.on_finished = [&](const RequestMetrics& m) {
    absl::MutexLock lock(&mu);
    metrics.push_back(m);
  };
  auto engine = MakeEngine(setup);
  std::mt19937 rng(11);
  std::vector<GenerateRequest> reqs;
  for (int i = 0; i < 10; ++i) {
    reqs.push_back(Greedy(DevStories()[20 + i].substr(0, 300 + rng() % 200), 20));
    reqs.back().request_id = "r" + std::to_string(i);
    reqs.back().ignore_eos = true;
  }
  std::vector<Result> solo;
  for (const GenerateRequest& r : reqs) solo.push_back(RunOne(*engine, r));
  std::vector<Result> together = RunConcurrently(*engine, reqs);
  for (size_t i = 0; i < reqs.size(); ++i) REQUIRE(together[i].tokens[0] == solo[i].tokens[0]);
  {
    absl::MutexLock lock(&mu);
    REQUIRE(metrics.size() == 20);
    for (const RequestMetrics& m : metrics) {
      REQUIRE(m.finish_reason == FinishReason::kLength);
      REQUIRE(m.usage.completion_tokens == 20);
      REQUIRE(m.ttft_s > 0);
      REQUIRE(m.ttft_s >= m.queue_s);
      REQUIRE(m.tpot_s > 0);
      REQUIRE(m.e2e_s >= m.ttft_s);
    }
  }
  const EngineStats st = engine->GetStats();
  REQUIRE(st.batched_tokens <= st.steps * 64);
  REQUIRE(st.prompt_tokens > 0);

  SECTION("Drain lets in-flight requests finish, then refuses new ones") {
    auto a = engine->Submit(reqs[0]);
    REQUIRE(a.ok());
    engine->Drain(absl::InfiniteFuture());
    REQUIRE(engine->draining());
    Result r = Collect(**a);
    REQUIRE(r.finish[0] == FinishReason::kLength);
    auto refused = engine->Submit(reqs[1]);
    REQUIRE(refused.status().code() == absl::StatusCode::kUnavailable);
  }
  SECTION("Drain past its deadline cancels what is left") {
    auto a = engine->Submit(Endless());
    REQUIRE(a.ok());
    FirstEvent(**a);
    engine->Drain(absl::Now());
    Result r = Collect(**a);
    REQUIRE(r.finish[0] == FinishReason::kCancelled);
    RequireAllBlocksFree(*engine);
  }
}

TEST_CASE("Waiting requests are admitted by priority, then in arrival order", "[scheduler]") {
  absl::Mutex mu;
  std::vector<std::string> finished;
  Setup setup;
  setup.max_num_seqs = 1;  // one at a time: admission order is finishing order
  setup.max_num_batched_tokens = 16;
  setup.on_finished = [&](const RequestMetrics& m) {
    absl::MutexLock lock(&mu);
    finished.push_back(m.request_id);
  };
  auto engine = MakeEngine(setup);
  Engine* e = engine.get();
  struct Queued {
    absl::Mutex mu;
    std::vector<std::shared_ptr<RequestStream>> streams;
  };
  auto queued = std::make_shared<Queued>();
  for (int attempt = 0; attempt < 5; ++attempt) {
    GenerateRequest first = Greedy("Once upon a time", 300);
    first.ignore_eos = true;
    first.request_id = "first";
    auto a = engine->Submit(first);
    REQUIRE(a.ok());
    // From the engine thread, while "first" runs: queue four more at once.
    (*a)->SetNotify([queued, e] {
      absl::MutexLock lock(&queued->mu);
      if (!queued->streams.empty()) return;
      const std::pair<const char*, int> order[] = {{"b0", 0}, {"c1", 1}, {"d-1", -1}, {"e0", 0}};
      for (const auto& [id, priority] : order) {
        GenerateRequest r = Greedy("The dog", 8);
        r.request_id = id;
        r.priority = priority;
        auto s = e->Submit(r);
        if (s.ok()) queued->streams.push_back(*s);
      }
    });
    Result r = Collect(**a);
    REQUIRE(r.finish[0] == FinishReason::kLength);
    absl::MutexLock lock(&queued->mu);
    if (!queued->streams.empty()) break;  // else "first" ended before SetNotify: again
  }
  std::vector<std::shared_ptr<RequestStream>> streams;
  {
    absl::MutexLock lock(&queued->mu);
    streams = queued->streams;
  }
  REQUIRE(streams.size() == 4);
  for (auto& s : streams) Collect(*s);
  absl::MutexLock lock(&mu);
  REQUIRE(finished.size() >= 5);
  REQUIRE(std::vector<std::string>(finished.end() - 5, finished.end()) ==
          std::vector<std::string>{"first", "d-1", "b0", "e0", "c1"});
}

TEST_CASE("Per-client fairness: a light client's request overtakes a heavy client's queue",
          "[scheduler]") {
  std::vector<std::vector<int32_t>> heavy_tokens[2];
  for (bool fair : {true, false}) {
    absl::Mutex mu;
    std::vector<std::string> finished;
    Setup setup;
    setup.max_num_seqs = 2;
    setup.fair_clients = fair;
    setup.on_finished = [&](const RequestMetrics& m) {
      absl::MutexLock lock(&mu);
      finished.push_back(m.request_id);
    };
    auto engine = MakeEngine(setup);
    Engine* e = engine.get();
    // Client a queues six 64-token requests; once its first has streamed a
    // token, client b sends one of a single token (from the engine thread,
    // so a's first request is surely mid-generation). All are in place
    // before the engine steps (WithEngineHeld).
    std::vector<std::shared_ptr<RequestStream>> heavy;
    auto light = std::make_shared<std::shared_ptr<RequestStream>>();
    auto light_mu = std::make_shared<absl::Mutex>();
    testing::WithEngineHeld(*engine, [&] {
      for (int i = 0; i < 6; ++i) {
        GenerateRequest r = Greedy(i % 2 == 0 ? "Once upon a time" : "The dog", 64);
        r.ignore_eos = true;
        r.request_id = absl::StrCat("a", i);
        r.client = "key:a";
        auto s = engine->Submit(r);
        REQUIRE(s.ok());
        heavy.push_back(*s);
      }
      heavy[0]->SetNotify([e, light, light_mu] {
        absl::MutexLock lock(light_mu.get());
        if (*light != nullptr) return;
        GenerateRequest r = Greedy("The cat", 1);
        r.request_id = "b0";
        r.client = "key:b";
        auto s = e->Submit(r);
        if (s.ok()) *light = *s;
      });
    });
    for (auto& s : heavy) {
      Result r = Collect(*s);
      REQUIRE(r.tokens[0].size() == 64);
      heavy_tokens[fair ? 0 : 1].push_back(r.tokens[0]);
    }
    std::shared_ptr<RequestStream> b;
    {
      absl::MutexLock lock(light_mu.get());
      b = *light;
    }
    REQUIRE(b != nullptr);
    REQUIRE(Collect(*b).tokens[0].size() == 1);
    absl::MutexLock lock(&mu);
    REQUIRE(finished.size() == 8);
    REQUIRE(finished.front() == "hold");  // cancelled before the first step
    finished.erase(finished.begin());
    INFO("fair " << fair);
    if (fair) {
      // b0 took the place of a1 (recomputed later) and ended first.
      REQUIRE(finished.front() == "b0");
      REQUIRE(engine->GetStats().preemptions >= 1);
    } else {
      // First come, first served: b0 waits for the whole queue.
      REQUIRE(finished == std::vector<std::string>{"a0", "a1", "a2", "a3", "a4", "a5", "b0"});
    }
    RequireAllBlocksFree(*engine);
  }
  // Preempted and recomputed, a's requests keep every token.
  REQUIRE(heavy_tokens[0] == heavy_tokens[1]);
}

TEST_CASE("Destroying a busy engine cancels its requests", "[scheduler]") {
  std::shared_ptr<RequestStream> stream;
  {
    auto engine = MakeEngine({});
    auto s = engine->Submit(Endless());
    REQUIRE(s.ok());
    stream = *s;
    FirstEvent(*stream);  // running when the engine goes
  }
  GenerateOutput out;
  Result r = Collect(*stream);
  REQUIRE(r.finish[0] == FinishReason::kCancelled);
  REQUIRE(stream->Next(&out) == RequestStream::Pop::kEnd);
}

TEST_CASE("Drain's deadline is read on the engine's clock", "[scheduler]") {
  const absl::Time t0 = absl::FromUnixSeconds(1000);
  auto clock = std::make_shared<SimulatedClock>(t0);
  absl::Mutex mu;
  std::vector<RequestMetrics> metrics;
  Setup setup;
  setup.clock = clock;
  setup.on_finished = [&](const RequestMetrics& m) {
    absl::MutexLock lock(&mu);
    metrics.push_back(m);
  };
  auto engine = MakeEngine(setup);

  SECTION("before the deadline in-flight requests finish, however long they take") {
    GenerateRequest req = Greedy("Once", 400);
    req.ignore_eos = true;
    auto a = engine->Submit(req);
    REQUIRE(a.ok());
    // The clock stands still: the deadline never comes, real time passes.
    engine->Drain(t0 + absl::Milliseconds(1));
    Result r = Collect(**a);
    REQUIRE(r.finish[0] == FinishReason::kLength);
    REQUIRE(r.tokens[0].size() == 400);
    absl::MutexLock lock(&mu);
    REQUIRE(metrics.size() == 1);
    REQUIRE(metrics[0].e2e_s == 0.0);  // no simulated time went by
  }
  SECTION("once the clock passes the deadline the rest is cancelled") {
    auto a = engine->Submit(Endless());
    REQUIRE(a.ok());
    FirstEvent(**a);  // first token at t0
    std::thread drain([&] { engine->Drain(t0 + absl::Seconds(5)); });
    clock->AdvanceTime(absl::Seconds(5));
    drain.join();  // returns once the engine has cancelled and gone idle
    Result r = Collect(**a);
    REQUIRE(r.finish[0] == FinishReason::kCancelled);
    RequireAllBlocksFree(*engine);
    absl::MutexLock lock(&mu);
    REQUIRE(metrics.size() == 1);
    REQUIRE(metrics[0].finish_reason == FinishReason::kCancelled);
    REQUIRE(metrics[0].ttft_s == 0.0);
    REQUIRE(metrics[0].e2e_s == 5.0);  // submitted at t0, cancelled at t0 + 5 s
  }
}

}  // namespace
}  // namespace kvserve

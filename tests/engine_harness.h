// Driving an Engine from a test: the reference model loaded once, the engine
// knobs the tests vary and their EngineConfig, collect every stream event per
// sample, run requests alone or all at once, random prompts from the
// TinyStories dev set, and the end-of-test check that every block is back in
// the pool.
// Shared by the CPU engine tests and the [gpu] CUDA runner tests, so both
// backends are held to the same harness.
#pragma once

#include <catch2/catch.hpp>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "model/loader/model_loader.h"
#include "model/runner_factory.h"
#include "scheduler/detokenizer.h"
#include "scheduler/engine.h"
#include "tests/test_util.h"

namespace kvserve::testing {

// stories260K's weights and tokenizer, loaded once per test binary.
struct StoriesModel {
  LlamaWeights weights;
  std::shared_ptr<const Tokenizer> tokenizer;
};

inline const StoriesModel& Stories() {
  static const StoriesModel* model = [] {
    auto m = LoadModel(Stories260kCheckpoint());
    if (!m.ok()) std::abort();
    return new StoriesModel{m->weights, std::shared_ptr<const Tokenizer>(std::move(m->tokenizer))};
  }();
  return *model;
}

// The engine knobs the engine tests vary, on either backend.
struct EngineSetup {
  int block_size = 16;
  int32_t num_blocks = 2048;
  int32_t num_swap_blocks = 0;
  bool prefix_caching = true;
  PreemptionMode mode = PreemptionMode::kRecompute;
  int32_t max_num_seqs = 64;
  int32_t max_num_batched_tokens = 512;
  int32_t max_model_len = 0;
};

// Its EngineConfig, checking the cache's invariants after every step.
inline EngineConfig EngineConfigOf(const EngineSetup& s) {
  EngineConfig config;
  config.max_num_seqs = s.max_num_seqs;
  config.max_num_batched_tokens = s.max_num_batched_tokens;
  config.max_model_len = s.max_model_len;
  config.preemption_mode = s.mode;
  config.prefix_caching = s.prefix_caching;
  config.debug_check_invariants = true;
  // Endless streaming-eviction requests (tests that cancel or drain them)
  // ask for far more than the default n x max_tokens budget.
  config.request_limits.max_generated_tokens = int64_t{1} << 40;
  return config;
}

// The runner options the setup fixes (pool, batch and length limits); the
// caller sets the device, dtypes and graphs.
inline RunnerOptions RunnerOptionsOf(const EngineSetup& s) {
  RunnerOptions o;
  o.block_size = s.block_size;
  o.num_blocks = s.num_blocks;
  o.num_swap_blocks = s.num_swap_blocks;
  o.max_num_seqs = s.max_num_seqs;
  o.max_num_batched_tokens = s.max_num_batched_tokens;
  o.max_model_len = s.max_model_len;
  return o;
}

// Everything one request streamed, per sample.
struct Result {
  std::vector<std::vector<int32_t>> tokens;
  std::vector<std::string> text;
  std::vector<FinishReason> finish;
  std::vector<int> events;
  Usage usage;
  bool all_text_valid = true;
  int finished_events = 0;  // events with request_finished (must be 1, the last)
};

inline Result Collect(RequestStream& stream, int n = 1) {
  Result r;
  r.tokens.resize(n);
  r.text.resize(n);
  r.finish.assign(n, FinishReason::kNone);
  r.events.assign(n, 0);
  GenerateOutput out;
  bool last_was_finished = false;
  while (stream.Next(&out) == RequestStream::Pop::kOutput) {
    REQUIRE(out.index >= 0);
    REQUIRE(out.index < n);
    REQUIRE(r.finish[out.index] == FinishReason::kNone);  // nothing after a sample's end
    r.tokens[out.index].insert(r.tokens[out.index].end(), out.token_ids.begin(),
                               out.token_ids.end());
    r.text[out.index] += out.text;
    if (!IsValidUtf8(out.text)) r.all_text_valid = false;
    r.finish[out.index] = out.finish_reason;
    ++r.events[out.index];
    last_was_finished = out.request_finished;
    if (out.request_finished) {
      ++r.finished_events;
      r.usage = out.usage;
    }
  }
  REQUIRE(last_was_finished);
  REQUIRE(r.finished_events == 1);
  return r;
}

inline Result RunOne(Engine& engine, GenerateRequest req) {
  const int n = req.n;
  auto stream = engine.Submit(std::move(req));
  REQUIRE(stream.ok());
  return Collect(**stream, n);
}

// Submits all requests at once, then collects every stream.
inline std::vector<Result> RunConcurrently(Engine& engine,
                                           const std::vector<GenerateRequest>& reqs) {
  std::vector<std::shared_ptr<RequestStream>> streams;
  for (const GenerateRequest& r : reqs) {
    auto s = engine.Submit(r);
    REQUIRE(s.ok());
    streams.push_back(*s);
  }
  std::vector<Result> results;
  for (size_t i = 0; i < streams.size(); ++i) results.push_back(Collect(*streams[i], reqs[i].n));
  return results;
}

inline void RequireAllBlocksFree(const Engine& engine) {
  const EngineStats st = engine.GetStats();
  REQUIRE(st.num_running == 0);
  REQUIRE(st.num_waiting == 0);
  REQUIRE(st.num_swapped == 0);
  REQUIRE(st.kv.num_active_blocks == 0);
  REQUIRE(st.kv.num_free_blocks == st.kv.num_blocks);
}

inline GenerateRequest Greedy(std::string prompt, int32_t max_tokens) {
  GenerateRequest r;
  r.prompt = std::move(prompt);
  r.max_tokens = max_tokens;
  r.sampling.temperature = 0.0f;
  return r;
}

// Stories of the dev set longer than 200 characters, for prompts.
inline const std::vector<std::string>& DevStories() {
  static const std::vector<std::string>* stories = [] {
    std::string all = ReadFileOrDie(SharedDir() + "/data/tinystories_valid_dev.txt");
    auto* out = new std::vector<std::string>;
    size_t pos = 0;
    const std::string sep = "<|endoftext|>";
    while (pos < all.size()) {
      size_t end = all.find(sep, pos);
      if (end == std::string::npos) end = all.size();
      std::string s = all.substr(pos, end - pos);
      while (!s.empty() && (s.front() == '\n' || s.front() == ' ')) s.erase(0, 1);
      if (s.size() > 200) out->push_back(s);
      pos = end + sep.size();
    }
    return out;
  }();
  return *stories;
}

// A random snippet of a dev story: starts at a word, 1 .. max_chars long.
inline std::string RandomSnippet(std::mt19937& rng, size_t max_chars) {
  const auto& stories = DevStories();
  const std::string& s = stories[rng() % stories.size()];
  size_t start = rng() % (s.size() / 2);
  while (start > 0 && s[start - 1] != ' ') --start;
  const size_t len = 1 + rng() % max_chars;
  return s.substr(start, len);
}

// n = 4 seeded samples of 40 tokens from a 100-token prompt (6 full blocks
// of 16 and 4 tokens in a seventh): the fork and copy-on-write scenario.
inline GenerateRequest ForkRequest() {
  std::vector<int32_t> prompt = Stories().tokenizer->Encode(DevStories()[3], true);
  prompt.resize(100);
  GenerateRequest req;
  req.prompt_token_ids = prompt;
  req.max_tokens = 40;
  req.ignore_eos = true;
  req.sampling.temperature = 1.0f;
  req.sampling.top_k = 40;
  req.sampling.seed = 1234;
  req.n = 4;
  return req;
}

// The stats snapshot at every event of one request: stats are published
// before a step's events are pushed, so a notify callback (engine thread)
// sees the snapshot of the step it reports. Submits again (at most 5 times)
// when an event beats the callback; *result gets the request's outputs.
inline std::vector<EngineStats> StatsPerEvent(Engine& engine, const GenerateRequest& req,
                                              Result* result) {
  struct Seen {
    absl::Mutex mu;
    std::vector<EngineStats> stats;
  };
  for (int attempt = 0; attempt < 5; ++attempt) {
    auto s = engine.Submit(req);
    REQUIRE(s.ok());
    auto seen = std::make_shared<Seen>();
    Engine* e = &engine;
    (*s)->SetNotify([seen, e] {
      absl::MutexLock lock(&seen->mu);
      seen->stats.push_back(e->GetStats());
    });
    GenerateOutput early;
    if ((*s)->TryNext(&early) != RequestStream::Pop::kTimeout) {
      while ((*s)->Next(&early) == RequestStream::Pop::kOutput) {
      }
      continue;  // an event arrived before the callback was set
    }
    *result = Collect(**s, req.n);
    // One snapshot per output: every Push notifies before the stream is
    // closed, but Close()'s own notification may come after Collect has
    // seen the end (a GPU run got it, a CPU run of the same request not).
    size_t outputs = 0;
    for (int e : result->events) outputs += static_cast<size_t>(e);
    absl::MutexLock lock(&seen->mu);
    std::vector<EngineStats> stats = seen->stats;
    if (stats.size() > outputs) stats.resize(outputs);
    return stats;
  }
  FAIL("could not set the notify callback before the first event");
  return {};
}

// ForkRequest's block accounting, event by event: at the fork the 7 prompt
// blocks are held once by all 4 samples; a step later 3 samples have copied
// the shared partial block (copy-on-write), the 4th keeps the original, and
// the 6 full blocks stay shared.
inline void RequireForkSharing(const std::vector<EngineStats>& seen) {
  REQUIRE(seen.size() >= 8);
  REQUIRE(seen[0].kv.num_active_blocks == 7);
  REQUIRE(seen[0].num_running == 4);
  REQUIRE(seen[4].kv.num_active_blocks == 10);
  REQUIRE(seen[4].kv.cow_copies - seen[0].kv.cow_copies == 3);
}

// 16 greedy requests that share `prefix` and go on with a random dev-set
// snippet each, 30 to 59 tokens: the prefix-caching scenario.
inline std::vector<GenerateRequest> SharedPrefixRequests(const std::vector<int32_t>& prefix) {
  std::mt19937 rng(3);
  std::vector<GenerateRequest> reqs;
  for (int i = 0; i < 16; ++i) {
    GenerateRequest r;
    r.sampling.temperature = 0.0f;
    r.prompt_token_ids = prefix;
    // Appended, not " " + snippet: gcc 12 warns (-Wrestrict, a false
    // positive) on operator+ of a literal and a temporary string.
    std::string text = " ";
    text += RandomSnippet(rng, 60);
    std::vector<int32_t> tail = Stories().tokenizer->Encode(text, false);
    r.prompt_token_ids.insert(r.prompt_token_ids.end(), tail.begin(), tail.end());
    r.max_tokens = 30 + rng() % 30;
    reqs.push_back(r);
  }
  return reqs;
}

// Runs `submit` on this thread while the engine thread is held inside a step,
// so everything it submits (and every notify it sets on the streams) is in
// place before the engine's next step, however slowly this thread runs. The
// hold is a request that cannot end on its own (streaming eviction, 2^29
// tokens, request id "hold"): its first event blocks the engine thread until
// `submit` has returned; it is cancelled before the engine goes on, so it
// takes no slot in the step that admits what `submit` sent.
inline void WithEngineHeld(Engine& engine, const std::function<void()>& submit) {
  struct Hold {
    absl::Mutex mu;
    bool entered = false;
    bool released = false;
  };
  auto hold = std::make_shared<Hold>();
  GenerateRequest holder = Greedy("Once", 1 << 29);
  holder.request_id = "hold";
  holder.ignore_eos = true;
  holder.kv_policy.policy = "streaming";
  holder.kv_policy.budget = 48;
  holder.kv_policy.sink_tokens = 4;
  auto stream = engine.Submit(holder);
  REQUIRE(stream.ok());
  (*stream)->SetNotify([hold] {
    absl::MutexLock lock(&hold->mu);
    if (hold->entered) return;  // only its first event holds the engine
    hold->entered = true;
    hold->mu.Await(absl::Condition(&hold->released));
  });
  {
    absl::MutexLock lock(&hold->mu);
    hold->mu.Await(absl::Condition(&hold->entered));
  }
  auto release = [&] {
    (*stream)->Cancel();
    absl::MutexLock lock(&hold->mu);
    hold->released = true;
  };
  try {
    submit();
  } catch (...) {  // a failed REQUIRE: let the engine go before unwinding
    release();
    throw;
  }
  release();
  GenerateOutput out;
  while ((*stream)->Next(&out) == RequestStream::Pop::kOutput) {
  }
  REQUIRE(out.finish_reason == FinishReason::kCancelled);
}

// As RunConcurrently, but every request reaches the engine in the same step
// (WithEngineHeld). So a test that needs them all queued at once (to force
// preemption, say) does not depend on how fast this thread submits.
inline std::vector<Result> RunInOneStep(Engine& engine, const std::vector<GenerateRequest>& reqs) {
  std::vector<std::shared_ptr<RequestStream>> streams;
  WithEngineHeld(engine, [&] {
    for (const GenerateRequest& r : reqs) {
      auto s = engine.Submit(r);
      REQUIRE(s.ok());
      streams.push_back(*s);
    }
  });
  std::vector<Result> results;
  for (size_t i = 0; i < streams.size(); ++i) results.push_back(Collect(*streams[i], reqs[i].n));
  return results;
}

}  // namespace kvserve::testing

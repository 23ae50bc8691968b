// Driving an Engine from a test: collect every stream event per sample,
// run requests alone or all at once, random prompts from the TinyStories dev
// set, and the end-of-test check that every block is back in the pool.
// Shared by the CPU engine tests and the [gpu] CUDA runner tests, so both
// backends are held to the same harness.
#pragma once

#include <catch2/catch.hpp>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "scheduler/detokenizer.h"
#include "scheduler/engine.h"
#include "tests/test_util.h"

namespace kvserve::testing {

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

}  // namespace kvserve::testing

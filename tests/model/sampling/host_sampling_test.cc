// HostRowSampler: the CPU path of ModelRunner::Sample.
#include "model/sampling/host_sampling.h"

#include <catch2/catch.hpp>
#include <cmath>
#include <string>
#include <vector>

namespace kvserve {
namespace {

TEST_CASE("Host sampling: rows sharing a logits row all see the raw logits", "[model]") {
  constexpr int32_t kVocab = 6;
  // Logits row 0 prefers token 2, row 1 token 5.
  const std::vector<float> logits = {0, 1, 3, 0, 0, 0, /**/ 0, 0, 0, 1, 0, 2};
  SamplingParams greedy;
  greedy.temperature = 0;
  SamplingParams penalized = greedy;
  penalized.repetition_penalty = 10.0f;  // token 2 seen: 3 / 10 < 1
  const std::vector<int32_t> prompt = {2};
  std::vector<SampleRow> rows(3);
  rows[0].logits_index = 0;
  rows[0].params = &penalized;
  rows[0].prompt = prompt;
  rows[1].logits_index = 0;  // same logits row, no penalty: the raw argmax
  rows[1].params = &greedy;
  rows[1].num_logprobs = 2;
  rows[2].logits_index = 1;
  rows[2].params = &greedy;
  std::vector<SampledToken> out(3);
  HostRowSampler sampler;
  REQUIRE(sampler.Sample(logits, kVocab, rows, out).ok());
  REQUIRE(out[0].token == 1);
  REQUIRE(out[1].token == 2);
  REQUIRE(out[2].token == 5);
  // Raw logprobs of row 0: log_softmax of {0, 1, 3, 0, 0, 0}.
  const double z = std::log(4.0 + std::exp(1.0) + std::exp(3.0));
  REQUIRE(out[1].logprob == Approx(3.0 - z).epsilon(1e-6));
  REQUIRE(out[1].top.size() == 2);
  REQUIRE(out[1].top[0].first == 2);
  REQUIRE(out[1].top[1].first == 1);
  REQUIRE(out[0].top.empty());
}

TEST_CASE("Host sampling: a seeded random draw advances the sequence's own state", "[model]") {
  const std::vector<float> logits = {1, 1, 1, 1};
  SamplingParams p;
  p.temperature = 1.0f;
  SamplerState a(42), b(42);
  std::vector<SampleRow> rows(2);
  rows[0].params = &p;
  rows[0].state = &a;
  rows[1].params = &p;
  rows[1].state = &b;
  std::vector<SampledToken> out(2);
  HostRowSampler sampler;
  REQUIRE(sampler.Sample(logits, 4, rows, out).ok());
  REQUIRE(out[0].token == out[1].token);  // same seed, same draw
  REQUIRE(a.rng == b.rng);
  REQUIRE_FALSE(a.rng == SamplerState(42).rng);
}

TEST_CASE("Host sampling: malformed rows are named before anything is drawn", "[model]") {
  const std::vector<float> logits(8, 0.0f);
  SamplingParams p;
  p.temperature = 0;
  SamplingParams random;
  std::vector<SampleRow> rows(1);
  rows[0].params = &p;
  std::vector<SampledToken> out(1);
  HostRowSampler sampler;
  auto message = [&] { return std::string(sampler.Sample(logits, 4, rows, out).message()); };
  rows[0].logits_index = 2;
  REQUIRE(message() ==
          "Sample: rows[0].logits_index = 2 is outside the last batch's 2 logits rows");
  rows[0].logits_index = 1;
  rows[0].num_logprobs = 21;
  REQUIRE(message() == "Sample: rows[0].num_logprobs = 21 is outside [-1, 20]");
  rows[0].num_logprobs = -1;
  rows[0].params = &random;
  REQUIRE(message() == "Sample: rows[0] draws at random but has no generator state");
  rows[0].params = nullptr;
  REQUIRE(message() == "Sample: rows[0].params is null");
  std::vector<SampledToken> none;
  REQUIRE(std::string(sampler.Sample(logits, 4, rows, none).message()) ==
          "Sample: 1 rows but 0 outputs");
}

}  // namespace
}  // namespace kvserve

namespace kvserve {
namespace {

TEST_CASE("Host sampling: a token mask is never left by greedy top-k top-p or random draws",
          "[model]") {
  constexpr int32_t kVocab = 40;  // two mask words, the second partly used
  std::vector<float> logits(kVocab);
  for (int32_t i = 0; i < kVocab; ++i) logits[i] = static_cast<float>(i % 7);
  // Allowed: 3, 10 and 33 (logits 3, 3 and 5); the best tokens (6, 13, ...) are not.
  std::vector<uint32_t> mask = {(1u << 3) | (1u << 10), 1u << (33 - 32)};
  for (float temperature : {0.0f, 0.7f, 1.0f, 2.0f}) {
    for (int32_t top_k : {0, 2, 50}) {
      for (float top_p : {1.0f, 0.5f}) {
        SamplingParams p;
        p.temperature = temperature;
        p.top_k = top_k;
        p.top_p = top_p;
        for (uint64_t seed = 0; seed < 25; ++seed) {
          SamplerState state(seed);
          std::vector<SampleRow> rows(1);
          rows[0].params = &p;
          rows[0].state = &state;
          rows[0].allowed = mask;
          rows[0].num_logprobs = 1;
          std::vector<SampledToken> out(1);
          HostRowSampler sampler;
          REQUIRE(sampler.Sample(logits, kVocab, rows, out).ok());
          INFO("temperature " << temperature << " top_k " << top_k << " seed " << seed);
          REQUIRE((out[0].token == 3 || out[0].token == 10 || out[0].token == 33));
          if (temperature == 0.0f) REQUIRE(out[0].token == 33);
          // Logprobs stay the model's: the raw best token (6) leads the top list.
          REQUIRE(out[0].top[0].first == 6);
        }
      }
    }
  }
}

TEST_CASE("Host sampling: masks of the wrong size or with no token are refused", "[model]") {
  const std::vector<float> logits(40, 0.0f);
  SamplingParams greedy;
  greedy.temperature = 0;
  std::vector<SampleRow> rows(1);
  rows[0].params = &greedy;
  std::vector<SampledToken> out(1);
  HostRowSampler sampler;
  const std::vector<uint32_t> short_mask = {1};
  rows[0].allowed = short_mask;
  absl::Status s = sampler.Sample(logits, 40, rows, out);
  CHECK(s.message() == "Sample: rows[0].allowed has 1 words; vocab 40 needs 2");
  const std::vector<uint32_t> empty_mask = {0, 0};
  rows[0].allowed = empty_mask;
  s = sampler.Sample(logits, 40, rows, out);
  CHECK(s.message() == "Sample: rows[0].allowed allows no token");
  // Backends whose sampler does not apply masks refuse a masked row.
  s = ValidateSampleRows(rows, 1, 1);
  CHECK(s.code() == absl::StatusCode::kUnimplemented);
  CHECK(s.message() == "Sample: rows[0] has a token mask, which this sampler does not apply yet");
}

}  // namespace
}  // namespace kvserve

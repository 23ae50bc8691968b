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

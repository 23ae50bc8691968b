#include "model/sampling/sampler.h"

#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <limits>
#include <map>
#include <string>
#include <vector>

namespace kvserve {
namespace {

std::vector<float> LogitsOf(const std::vector<double>& probs) {
  std::vector<float> logits;
  for (double p : probs) logits.push_back(static_cast<float>(std::log(p)));
  return logits;
}

// Draws n tokens from the same logits row, counting each id.
std::vector<int> Histogram(const std::vector<float>& logits, const SamplingParams& params,
                           uint64_t seed, int n) {
  Sampler sampler;
  SamplerState state(seed);
  std::vector<int> counts(logits.size(), 0);
  for (int i = 0; i < n; ++i) {
    std::vector<float> row = logits;
    ++counts[sampler.Sample(row, params, {}, {}, &state)];
  }
  return counts;
}

// Every id's count is within 5 standard errors of n * expected[id]; ids
// with expected probability 0 never appear.
void RequireFrequencies(const std::vector<int>& counts, const std::vector<double>& expected,
                        int n) {
  REQUIRE(counts.size() == expected.size());
  for (size_t i = 0; i < counts.size(); ++i) {
    INFO("token " << i << " count " << counts[i] << " expected p " << expected[i]);
    if (expected[i] == 0.0) {
      REQUIRE(counts[i] == 0);
      continue;
    }
    const double mean = n * expected[i];
    const double sd = std::sqrt(n * expected[i] * (1.0 - expected[i]));
    REQUIRE(std::abs(counts[i] - mean) <= 5.0 * sd);
  }
}

std::vector<double> Renormalized(const std::vector<double>& probs, const std::vector<int>& keep) {
  std::vector<double> out(probs.size(), 0.0);
  double mass = 0.0;
  for (int id : keep) mass += probs[id];
  for (int id : keep) out[id] = probs[id] / mass;
  return out;
}

// A context-dependent logits row so that a sequence's history matters.
std::vector<float> StepLogits(int32_t vocab, int32_t last_token) {
  std::vector<float> logits(vocab);
  for (int32_t i = 0; i < vocab; ++i) {
    logits[i] = 2.0f * std::sin(0.37f * i) + 0.5f * std::cos(0.11f * i * (last_token + 1));
  }
  return logits;
}

std::vector<int32_t> Generate(Sampler& sampler, SamplerState& state, const SamplingParams& params,
                              int steps) {
  const std::vector<int32_t> prompt = {1, 7, 7, 30};
  std::vector<int32_t> output;
  for (int i = 0; i < steps; ++i) {
    std::vector<float> logits = StepLogits(64, output.empty() ? prompt.back() : output.back());
    output.push_back(sampler.Sample(logits, params, prompt, output, &state));
  }
  return output;
}

SamplingParams Creative() {
  SamplingParams p;
  p.temperature = 0.8f;
  p.top_k = 40;
  p.top_p = 0.95f;
  p.min_p = 0.01f;
  p.repetition_penalty = 1.1f;
  p.presence_penalty = 0.2f;
  p.frequency_penalty = 0.1f;
  return p;
}

TEST_CASE("The same seed gives the same tokens, another seed does not", "[model]") {
  const SamplingParams params = Creative();
  Sampler a, b;
  SamplerState sa(42), sb(42);
  const std::vector<int32_t> first = Generate(a, sa, params, 200);
  const std::vector<int32_t> second = Generate(b, sb, params, 200);
  REQUIRE(first.size() == 200);
  REQUIRE(first == second);

  SECTION("a different seed gives a different sequence") {
    SamplerState other(43);
    REQUIRE(Generate(a, other, params, 200) != first);
  }
  SECTION("ForRequest uses the request's seed") {
    SamplingParams seeded = params;
    seeded.seed = 42;
    SamplerState state = SamplerState::ForRequest(seeded);
    REQUIRE(Generate(a, state, params, 200) == first);
  }
  SECTION("requests without a seed get different random seeds") {
    SamplerState x = SamplerState::ForRequest(params);
    SamplerState y = SamplerState::ForRequest(params);
    REQUIRE(Generate(a, x, params, 200) != Generate(a, y, params, 200));
  }
  SECTION("interleaving with another sequence changes nothing") {
    SamplerState s1(42), s2(7);
    SamplerState s2_alone(7);
    const std::vector<int32_t> second_alone = Generate(b, s2_alone, params, 200);
    const std::vector<int32_t> prompt = {1, 7, 7, 30};
    std::vector<int32_t> out1, out2;
    for (int i = 0; i < 200; ++i) {
      std::vector<float> l1 = StepLogits(64, out1.empty() ? prompt.back() : out1.back());
      std::vector<float> l2 = StepLogits(64, out2.empty() ? prompt.back() : out2.back());
      out1.push_back(a.Sample(l1, params, prompt, out1, &s1));
      out2.push_back(a.Sample(l2, params, prompt, out2, &s2));
    }
    REQUIRE(out1 == first);
    REQUIRE(out2 == second_alone);
  }
}

TEST_CASE("A draw maps one standard mt19937_64 output onto the distribution", "[model]") {
  // The generator is the one the C++ standard specifies (its 10000th output).
  std::mt19937_64 reference;
  reference.discard(9999);
  REQUIRE(reference() == 9981545732273789042ULL);

  // Equal logits: every weight is exactly 1, so the token is floor(u * vocab)
  // with u = (x >> 11) * 2^-53 for the state's next 64-bit output x.
  SamplingParams params;
  Sampler sampler;
  SamplerState state(2024);
  std::mt19937_64 expected_rng(2024);
  for (int i = 0; i < 100; ++i) {
    std::vector<float> logits(512, 0.0f);
    const double u = static_cast<double>(expected_rng() >> 11) * 0x1.0p-53;
    REQUIRE(sampler.Sample(logits, params, {}, {}, &state) == static_cast<int32_t>(u * 512));
  }
}

TEST_CASE("Greedy takes the argmax, lowest id on ties, after penalties", "[model]") {
  Sampler sampler;
  SamplerState state(1);
  const SamplerState before = state;
  SamplingParams greedy;
  greedy.temperature = 0.0f;
  greedy.top_k = 1;  // ignored when greedy, as are top_p and min_p
  greedy.top_p = 0.1f;

  SECTION("ties go to the lowest id and no random number is drawn") {
    std::vector<float> logits = {1.0f, 3.0f, -2.0f, 3.0f, 2.0f};
    REQUIRE(sampler.Sample(logits, greedy, {}, {}, &state) == 1);
    REQUIRE(state.rng == before.rng);
  }
  SECTION("a repetition penalty can move the argmax") {
    greedy.repetition_penalty = 2.0f;
    std::vector<float> logits = {1.0f, 3.0f, -2.0f, 2.0f};
    const std::vector<int32_t> output = {1};
    REQUIRE(sampler.Sample(logits, greedy, {}, output, &state) == 3);
    REQUIRE(logits == std::vector<float>{1.0f, 1.5f, -2.0f, 2.0f});
  }
  SECTION("NaN never wins") {
    std::vector<float> logits = {std::nanf(""), 0.5f, 0.25f};
    REQUIRE(sampler.Sample(logits, greedy, {}, {}, &state) == 1);
  }
}

TEST_CASE("Penalties have their exact documented effect", "[model]") {
  Sampler sampler;
  const std::vector<float> base = {2.0f, -1.0f, 0.5f, 0.0f, 3.0f, -2.0f};
  const std::vector<int32_t> prompt = {0, 1, 0};
  const std::vector<int32_t> output = {2, 2, 5, 0, 2};  // counts: 2 x3, 5 x1, 0 x1

  SECTION("repetition divides positive and multiplies non-positive logits, once per id") {
    SamplingParams p;
    p.repetition_penalty = 2.0f;
    std::vector<float> logits = base;
    sampler.ApplyPenalties(logits, p, prompt, output);
    REQUIRE(logits == std::vector<float>{1.0f, -2.0f, 0.25f, 0.0f, 3.0f, -4.0f});
  }
  SECTION("repetition covers the prompt even with no output") {
    SamplingParams p;
    p.repetition_penalty = 0.5f;  // < 1 encourages repeats
    std::vector<float> logits = base;
    sampler.ApplyPenalties(logits, p, prompt, {});
    REQUIRE(logits == std::vector<float>{4.0f, -0.5f, 0.5f, 0.0f, 3.0f, -2.0f});
  }
  SECTION("frequency subtracts penalty times the count in the output only") {
    SamplingParams p;
    p.frequency_penalty = 0.5f;
    std::vector<float> logits = base;
    sampler.ApplyPenalties(logits, p, prompt, output);
    REQUIRE(logits == std::vector<float>{1.5f, -1.0f, -1.0f, 0.0f, 3.0f, -2.5f});
  }
  SECTION("presence subtracts the penalty once per distinct output token") {
    SamplingParams p;
    p.presence_penalty = -0.25f;
    std::vector<float> logits = base;
    sampler.ApplyPenalties(logits, p, prompt, output);
    REQUIRE(logits == std::vector<float>{2.25f, -1.0f, 0.75f, 0.0f, 3.0f, -1.75f});
  }
  SECTION("all three compose: repetition first, then frequency, then presence") {
    SamplingParams p;
    p.repetition_penalty = 2.0f;
    p.frequency_penalty = 0.5f;
    p.presence_penalty = 0.25f;
    std::vector<float> logits = base;
    sampler.ApplyPenalties(logits, p, prompt, output);
    REQUIRE(logits == std::vector<float>{0.25f, -2.0f, -1.5f, 0.0f, 3.0f, -4.75f});
    SECTION("and the scratch is clean for the next call") {
      std::vector<float> again = base;
      sampler.ApplyPenalties(again, p, prompt, output);
      REQUIRE(again == logits);
      std::vector<float> no_history = base;
      sampler.ApplyPenalties(no_history, p, {}, {});
      REQUIRE(no_history == base);
    }
  }
}

TEST_CASE("Temperature scales the logits before the draw", "[model]") {
  const std::vector<float> logits = {1.0f, 0.5f, 0.0f, -0.5f, -1.0f, 2.0f, 0.25f, -2.0f};
  for (float temperature : {0.5f, 1.0f, 2.0f}) {
    SamplingParams p;
    p.temperature = temperature;
    std::vector<double> expected;
    double z = 0.0;
    for (float l : logits) z += std::exp(l / temperature);
    for (float l : logits) expected.push_back(std::exp(l / temperature) / z);

    const int n = 20000;
    const std::vector<int> counts = Histogram(logits, p, 99, n);
    double chi2 = 0.0;
    for (size_t i = 0; i < logits.size(); ++i) {
      const double e = n * expected[i];
      chi2 += (counts[i] - e) * (counts[i] - e) / e;
    }
    INFO("temperature " << temperature << " chi2 " << chi2);
    REQUIRE(chi2 < 24.32);  // 7 degrees of freedom, p = 0.001

    Sampler sampler;
    SamplerState state(1);
    std::vector<float> row = logits;
    sampler.Sample(row, p, {}, {}, &state);
    for (size_t i = 0; i < logits.size(); ++i) REQUIRE(row[i] == logits[i] / temperature);
  }
}

TEST_CASE("Top-k keeps only the k most likely tokens", "[model]") {
  const int n = 20000;
  SECTION("k = 3 draws ids 1, 3, 5 in proportion to their renormalised mass") {
    const std::vector<double> probs = {0.05, 0.3, 0.02, 0.2, 0.1, 0.15, 0.08, 0.03, 0.04, 0.03};
    SamplingParams p;
    p.top_k = 3;
    const std::vector<int> counts = Histogram(LogitsOf(probs), p, 5, n);
    RequireFrequencies(counts, Renormalized(probs, {1, 3, 5}), n);
  }
  SECTION("ties at the boundary go to the lower ids") {
    SamplingParams p;
    p.top_k = 2;
    const std::vector<int> counts = Histogram({1.0f, 2.0f, 2.0f, 2.0f, 0.0f}, p, 6, n);
    RequireFrequencies(counts, {0.0, 0.5, 0.5, 0.0, 0.0}, n);
  }
  SECTION("k >= vocab keeps everything") {
    const std::vector<double> probs = {0.1, 0.2, 0.3, 0.4};
    SamplingParams p;
    p.top_k = 4;
    RequireFrequencies(Histogram(LogitsOf(probs), p, 7, n), probs, n);
  }
}

TEST_CASE("Top-p keeps the smallest most-likely prefix reaching the mass", "[model]") {
  const int n = 20000;
  // Most likely first: 1 (0.4), 3 (0.3), 4 (0.15), 0 (0.1), 2 (0.05).
  const std::vector<double> probs = {0.1, 0.4, 0.05, 0.3, 0.15};
  auto with_top_p = [](float top_p) {
    SamplingParams p;
    p.top_p = top_p;
    return p;
  };
  SECTION("0.75 keeps 1, 3 and 4") {
    RequireFrequencies(Histogram(LogitsOf(probs), with_top_p(0.75f), 11, n),
                       Renormalized(probs, {1, 3, 4}), n);
  }
  SECTION("0.65 keeps 1 and 3") {
    RequireFrequencies(Histogram(LogitsOf(probs), with_top_p(0.65f), 12, n),
                       Renormalized(probs, {1, 3}), n);
  }
  SECTION("0.3 keeps only the top token") {
    RequireFrequencies(Histogram(LogitsOf(probs), with_top_p(0.3f), 13, n),
                       Renormalized(probs, {1}), n);
  }
  SECTION("it is measured on the top-k renormalised distribution") {
    SamplingParams p = with_top_p(0.5f);
    p.top_k = 2;  // {1, 3} renormalised: 0.571, 0.429; 0.571 >= 0.5
    RequireFrequencies(Histogram(LogitsOf(probs), p, 14, n), Renormalized(probs, {1}), n);
    p = with_top_p(0.8f);
    p.top_k = 3;  // {1, 3, 4} over 0.85: 0.47 + 0.353 >= 0.8
    RequireFrequencies(Histogram(LogitsOf(probs), p, 15, n), Renormalized(probs, {1, 3}), n);
  }
  SECTION("over a large flat vocabulary ties keep the lowest ids") {
    // 1000 equal logits: ties order by id, so 0.2995 keeps ids 0..299.
    const int draws = 30000;
    const std::vector<int> counts =
        Histogram(std::vector<float>(1000, 0.0f), with_top_p(0.2995f), 16, draws);
    std::vector<double> expected(1000, 0.0);
    for (int i = 0; i < 300; ++i) expected[i] = 1.0 / 300;
    RequireFrequencies(counts, expected, draws);
  }
}

TEST_CASE("Min-p drops tokens below min_p times the top probability", "[model]") {
  const int n = 20000;
  const std::vector<double> probs = {0.0625, 0.25, 0.5, 0.125, 0.0625};
  SamplingParams p;
  p.min_p = 0.2f;  // threshold 0.1: keeps 2, 1, 3
  SECTION("alone") {
    RequireFrequencies(Histogram(LogitsOf(probs), p, 21, n), Renormalized(probs, {1, 2, 3}), n);
  }
  SECTION("after top-k") {
    p.top_k = 4;
    RequireFrequencies(Histogram(LogitsOf(probs), p, 22, n), Renormalized(probs, {1, 2, 3}), n);
  }
  SECTION("after top-p") {
    p.top_p = 0.8f;  // keeps 2, 1 (0.75 < 0.8), 3
    p.min_p = 0.3f;  // threshold 0.15: drops 3
    RequireFrequencies(Histogram(LogitsOf(probs), p, 23, n), Renormalized(probs, {1, 2}), n);
  }
}

TEST_CASE("Logprobs are log_softmax of the raw logits", "[model]") {
  const std::vector<float> raw = {1.0f, 2.0f, 3.0f, 0.5f, 3.0f, -1.0f};
  double z = 0.0;
  for (float l : raw) z += std::exp(static_cast<double>(l));
  auto log_softmax = [&](int id) { return static_cast<double>(raw[id]) - std::log(z); };

  SamplingParams p;
  p.temperature = 0.7f;
  p.repetition_penalty = 1.3f;
  p.frequency_penalty = 0.4f;
  p.top_k = 3;
  const std::vector<int32_t> output = {2, 4};
  Sampler sampler;
  SamplerState state(3);
  for (int i = 0; i < 20; ++i) {
    std::vector<float> logits = raw;
    SampleLogprobs lp;
    const int32_t token = sampler.Sample(logits, p, {}, output, &state, &lp, 3);
    REQUIRE(lp.chosen.token == token);
    REQUIRE(lp.chosen.logprob == Approx(log_softmax(token)).margin(1e-6));
    REQUIRE(lp.top.size() == 3);
    REQUIRE(lp.top[0].token == 2);  // tie with 4: lower id first
    REQUIRE(lp.top[1].token == 4);
    REQUIRE(lp.top[2].token == 1);
    for (const SampledLogprob& t : lp.top) {
      REQUIRE(t.logprob == Approx(log_softmax(t.token)).margin(1e-6));
    }
  }
  SECTION("greedy too, and num_top_logprobs is clamped to the vocabulary") {
    p.temperature = 0.0f;
    std::vector<float> logits = raw;
    SampleLogprobs lp;
    REQUIRE(sampler.Sample(logits, p, {}, {}, &state, &lp, 100) == 2);
    REQUIRE(lp.chosen.logprob == Approx(log_softmax(2)).margin(1e-6));
    REQUIRE(lp.top.size() == raw.size());
    REQUIRE(lp.top.back().token == 5);
  }
}

TEST_CASE("NaN logits are never drawn", "[model]") {
  Sampler sampler;
  SamplerState state(4);
  SamplingParams p;
  for (int i = 0; i < 1000; ++i) {
    std::vector<float> logits = {std::nanf(""), 0.0f, 0.0f, std::nanf("")};
    SampleLogprobs lp;
    const int32_t token = sampler.Sample(logits, p, {}, {}, &state, &lp, 4);
    REQUIRE((token == 1 || token == 2));
    REQUIRE(lp.chosen.logprob == Approx(std::log(0.5)));
    REQUIRE(lp.top[3].token == 3);
    REQUIRE(lp.top[3].logprob == -std::numeric_limits<float>::infinity());
  }
}

TEST_CASE("A large vocabulary samples inside the filtered set", "[model]") {
  // Llama 3's vocabulary size with a peaked, deterministic row.
  const int32_t vocab = 128256;
  std::vector<float> logits(vocab);
  std::mt19937_64 gen(5);
  for (float& l : logits) l = static_cast<float>(gen() >> 40) * 0x1.0p-24f * 12.0f;
  std::vector<int32_t> order(vocab);
  for (int32_t i = 0; i < vocab; ++i) order[i] = i;
  std::sort(order.begin(), order.end(), [&](int32_t a, int32_t b) {
    return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
  });
  std::vector<int32_t> rank(vocab);
  for (int32_t r = 0; r < vocab; ++r) rank[order[r]] = r;

  Sampler sampler;
  SamplerState state(8);
  SamplingParams p;
  p.top_k = 50;
  for (int i = 0; i < 200; ++i) {
    std::vector<float> row = logits;
    REQUIRE(rank[sampler.Sample(row, p, {}, {}, &state)] < 50);
  }
  p.top_k = 0;
  p.top_p = 0.5f;
  double z = 0.0;
  for (float l : logits) z += std::exp(static_cast<double>(l) - logits[order[0]]);
  double mass = 0.0;
  int32_t kept = 0;
  while (mass < 0.5 * z)
    mass += std::exp(static_cast<double>(logits[order[kept++]]) - logits[order[0]]);
  for (int i = 0; i < 200; ++i) {
    std::vector<float> row = logits;
    REQUIRE(rank[sampler.Sample(row, p, {}, {}, &state)] < kept + 1);
  }
}

TEST_CASE("Validate names the bad field", "[model]") {
  REQUIRE(SamplingParams{}.Validate().ok());
  std::map<std::string, SamplingParams> bad;
  bad["temperature"].temperature = -0.5f;
  bad["top_k"].top_k = -2;
  bad["top_p"].top_p = 0.0f;
  bad["min_p"].min_p = 1.0f;
  bad["repetition_penalty"].repetition_penalty = 0.0f;
  bad["presence_penalty"].presence_penalty = 2.5f;
  bad["frequency_penalty"].frequency_penalty = std::nanf("");
  for (const auto& [field, params] : bad) {
    const absl::Status status = params.Validate();
    INFO(field << ": " << std::string(status.message()));
    REQUIRE(status.code() == absl::StatusCode::kInvalidArgument);
    REQUIRE(std::string(status.message()).rfind(field + " must be", 0) == 0);
  }
}

}  // namespace
}  // namespace kvserve

// The learned eviction policy's predictor: features, the versioned file
// (round trip and every validation error), logistic regression on data with
// a known answer, and the policy's choice of victims.
#include "cache/eviction/learned_evictor.h"

#include <catch2/catch.hpp>
#include <cmath>
#include <numeric>
#include <random>
#include <string>
#include <vector>

namespace kvserve {
namespace {

std::string Message(const absl::Status& s) { return std::string(s.message()); }

EvictorModel Simple() {
  EvictorModel m;
  m.horizon = 8;
  m.mean = {0.5f, 0, 0, 0, 0, 0, 0};
  m.scale = {2.0f, 1, 1, 1, 1, 1, 1};
  m.weights = {1.0f, 0, 0, 0, 0, 0, 0};
  m.bias = -0.25f;
  return m;
}

TEST_CASE("Evictor features of a hand-made state", "[cache][eviction]") {
  EvictionState s;
  s.Append(std::vector<int32_t>{0, 1, 9});
  s.Observe(std::vector<float>{0.5f, 0.25f, 0.25f}, 1, 1, 1);
  std::vector<EvictorFeatures> f;
  ComputeEvictorFeatures(s, &f);
  REQUIRE(f.size() == 3);
  REQUIRE(f[0][0] == Approx(std::log(0.5f + 1e-6f)));
  REQUIRE(f[0][1] == Approx(std::log(0.5f / 10.0f + 1e-6f)));  // age 9
  REQUIRE(f[0][2] == Approx(std::log(1.5f + 1e-6f)));          // 3 entries x 0.5
  REQUIRE(f[0][3] == Approx(std::log1p(9.0f)));
  REQUIRE(f[1][4] == Approx(1.0f / 16.0f));  // 0.25 < 1/3: one low step
  REQUIRE(f[0][4] == 0.0f);
  REQUIRE(f[1][5] == 1.0f);  // position 1 < 4
  REQUIRE(f[2][5] == 0.0f);
  REQUIRE(f[2][3] == 0.0f);  // the newest
}

TEST_CASE("Evictor features of positions 2 to 5 around the sink boundary", "[cache][eviction]") {
  // Positions 0 .. 3 are sinks; 4 is the first that is not.
  EvictionState s;
  s.Append(std::vector<int32_t>{2, 3, 4, 5});
  s.Observe(std::vector<float>{0.25f, 0.5f, 0.125f, 0.125f}, 1, 1, 1);
  std::vector<EvictorFeatures> f;
  ComputeEvictorFeatures(s, &f);
  REQUIRE(f.size() == 4);
  // Entry (position, weight): every feature, in the file's order.
  auto expected = [](int32_t pos, float w, float low, float sink) {
    const float age = static_cast<float>(5 - pos);
    return EvictorFeatures{std::log(w + 1e-6f),
                           std::log(w / (age + 1.0f) + 1e-6f),
                           std::log(4.0f * w + 1e-6f),
                           std::log1p(age),
                           low,
                           sink,
                           0.0f};  // one layer: no spread
  };
  // 0.125 < 1/4: one low step for positions 4 and 5.
  const EvictorFeatures want[] = {expected(2, 0.25f, 0.0f, 1.0f), expected(3, 0.5f, 0.0f, 1.0f),
                                  expected(4, 0.125f, 1.0f / 16.0f, 0.0f),
                                  expected(5, 0.125f, 1.0f / 16.0f, 0.0f)};
  for (int i = 0; i < 4; ++i) {
    INFO("entry " << i);
    for (int k = 0; k < kEvictorFeatures; ++k) {
      INFO("feature " << kEvictorFeatureNames[k]);
      REQUIRE(f[i][k] == Approx(want[i][k]).margin(1e-6));
    }
  }
  // The sink feature is exactly 0 or 1.
  REQUIRE(f[1][5] == 1.0f);
  REQUIRE(f[2][5] == 0.0f);
}

TEST_CASE("Evictor model files round-trip and are validated", "[cache][eviction]") {
  const EvictorModel m = Simple();
  absl::StatusOr<EvictorModel> back = EvictorModel::Parse(m.Serialize(), "m.txt");
  REQUIRE(back.ok());
  REQUIRE(back->horizon == 8);
  REQUIRE(back->mean == m.mean);
  REQUIRE(back->scale == m.scale);
  REQUIRE(back->weights == m.weights);
  REQUIRE(back->bias == m.bias);
  EvictorFeatures x = {2.5f, 0, 0, 0, 0, 0, 0};
  REQUIRE(back->Score(x) == Approx(0.75f));  // (2.5 - 0.5) / 2 - 0.25

  auto error = [](std::string text) {
    absl::StatusOr<EvictorModel> r = EvictorModel::Parse(text, "m.txt");
    REQUIRE_FALSE(r.ok());
    return Message(r.status());
  };
  const std::string good = m.Serialize();
  auto replace_line = [&](int line, const std::string& with) {
    std::vector<std::string> lines;
    size_t pos = 0;
    while (pos < good.size()) {
      const size_t eol = good.find('\n', pos);
      lines.push_back(good.substr(pos, eol - pos));
      pos = eol + 1;
    }
    lines[line - 1] = with;
    std::string out;
    for (const std::string& l : lines) out += l + "\n";
    return out;
  };
  REQUIRE(error("hello\n") ==
          "m.txt: an evictor model has 7 lines (kvserve-evictor, features, horizon, mean, scale, "
          "weights, bias), found 1");
  REQUIRE(error(replace_line(1, "kvserve-evictor 2")) ==
          "m.txt:1: version 2 is not supported (this kvserve reads version 1)");
  REQUIRE(error(replace_line(1, "gguf 1")) ==
          "m.txt:1: not a kvserve evictor model (want 'kvserve-evictor 1')");
  REQUIRE(error(replace_line(2, "features 2 acc_log age_log")) ==
          "m.txt:2: features differ from this kvserve's: want 'features 7 acc_log acc_rate_log "
          "last_rel_log age_log low_frac sink layer_spread'");
  REQUIRE(error(replace_line(3, "horizon 0")) == "m.txt:3: horizon must be an integer >= 1");
  REQUIRE(error(replace_line(4, "mean 1 2 3")) == "m.txt:4: 'mean' needs 7 numbers, found 3");
  REQUIRE(error(replace_line(5, "scale 1 1 1 0 1 1 1")) == "m.txt:5: scale values must be > 0");
  REQUIRE(error(replace_line(6, "weights 1 1 1 nan 1 1 1")) ==
          "m.txt:6: 'nan' is not a finite number");
  REQUIRE(error(replace_line(7, "offset 1")) == "m.txt:7: expected 'bias'");
  REQUIRE(Message(EvictorModel::Load("/nonexistent/m.txt").status()) ==
          "cannot read evictor model /nonexistent/m.txt");
}

TEST_CASE("Logistic regression recovers a known rule", "[cache][eviction]") {
  // needed <=> 2 * x0 - x3 + noise > 0: weight 0 positive, weight 3
  // negative, the others near zero.
  std::mt19937 rng(3);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<EvictorFeatures> x(4000);
  std::vector<uint8_t> y(x.size());
  int correct = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    for (float& v : x[i]) v = normal(rng);
    y[i] = 2 * x[i][0] - x[i][3] + 0.3f * normal(rng) > 0 ? 1 : 0;
  }
  absl::StatusOr<EvictorModel> m = FitEvictorModel(x, y, 16);
  REQUIRE(m.ok());
  REQUIRE(m->weights[0] > 2.0f);
  REQUIRE(m->weights[3] < -1.0f);
  for (int k : {1, 2, 4, 5, 6}) REQUIRE(std::fabs(m->weights[k]) < 0.3f * m->weights[0]);
  for (size_t i = 0; i < x.size(); ++i) correct += (m->Score(x[i]) > 0) == (y[i] != 0) ? 1 : 0;
  REQUIRE(correct > 3700);
  std::vector<uint8_t> all_one(x.size(), 1);
  REQUIRE(Message(FitEvictorModel(x, all_one, 16).status()) ==
          "training needs samples of both labels; got 4000 samples, 4000 positive");
}

TEST_CASE("The learned policy drops the lowest-scored entries outside the recent window",
          "[cache][eviction]") {
  auto policy = MakeLearnedPolicy(std::make_shared<const EvictorModel>(Simple()));
  REQUIRE(policy->kind() == EvictionPolicyKind::kLearned);
  REQUIRE(policy->needs_attention_stats());
  EvictionState s;
  std::vector<int32_t> pos(8);
  std::iota(pos.begin(), pos.end(), 0);
  s.Append(pos);
  s.Observe(std::vector<float>{0.3f, 0.01f, 0.2f, 0.02f, 0.1f, 0.03f, 0.04f, 0.3f}, 1, 1, 1);
  EvictionParams p;
  p.policy = EvictionPolicyKind::kLearned;
  p.budget = 6;
  p.recent_tokens = 3;  // the newest 2 (positions 6, 7) are kept
  std::vector<int32_t> v;
  policy->SelectVictims(s, p, 3, &v);
  // The score grows with accumulated attention: the three least.
  REQUIRE(v == std::vector<int32_t>{1, 3, 5});
}

}  // namespace
}  // namespace kvserve

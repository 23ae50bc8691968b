#include "cache/eviction/learned_evictor.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <fstream>
#include <sstream>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"

namespace kvserve {
namespace {

constexpr const char* kMagic = "kvserve-evictor";
constexpr int32_t kSinkPositions = 4;
constexpr uint64_t kLowWindow = 0xffff;  // 16 steps

class LearnedPolicy final : public EvictionPolicy {
 public:
  explicit LearnedPolicy(std::shared_ptr<const EvictorModel> model) : model_(std::move(model)) {}
  EvictionPolicyKind kind() const override { return EvictionPolicyKind::kLearned; }
  bool needs_attention_stats() const override { return true; }
  void SelectVictims(const EvictionState& state, const EvictionParams& params, int32_t count,
                     std::vector<int32_t>* victims) const override {
    thread_local std::vector<EvictorFeatures> features;
    thread_local std::vector<float> score;
    ComputeEvictorFeatures(state, &features);
    score.resize(features.size());
    for (size_t i = 0; i < features.size(); ++i) score[i] = model_->Score(features[i]);
    internal::LowestScored(state, score, params.RecentTokens(), 0, count, victims);
  }

 private:
  std::shared_ptr<const EvictorModel> model_;
};

absl::Status Bad(const std::string& what, int line, const std::string& msg) {
  return absl::InvalidArgumentError(absl::StrCat(what, ":", line, ": ", msg));
}

}  // namespace

void ComputeEvictorFeatures(const EvictionState& state, std::vector<EvictorFeatures>* out) {
  const int32_t n = state.size();
  out->resize(n);
  if (n == 0) return;
  const auto pos = state.positions();
  const int32_t newest = *std::max_element(pos.begin(), pos.end());
  for (int32_t i = 0; i < n; ++i) {
    const float age = static_cast<float>(newest - pos[i]);
    const float acc = state.accumulated()[i];
    EvictorFeatures& f = (*out)[i];
    f[0] = std::log(acc + 1e-6f);
    f[1] = std::log(acc / (age + 1.0f) + 1e-6f);
    f[2] = std::log(static_cast<float>(n) * state.last()[i] + 1e-6f);
    f[3] = std::log1p(age);
    f[4] = static_cast<float>(std::popcount(state.low_history()[i] & kLowWindow)) / 16.0f;
    f[5] = pos[i] < kSinkPositions ? 1.0f : 0.0f;
    f[6] = state.layer_spread()[i];
  }
}

float EvictorModel::Score(const EvictorFeatures& f) const {
  float z = bias;
  for (int k = 0; k < kEvictorFeatures; ++k) z += weights[k] * (f[k] - mean[k]) / scale[k];
  return z;
}

std::string EvictorModel::Serialize() const {
  std::string out = absl::StrCat(kMagic, " ", kEvictorFileVersion, "\nfeatures ", kEvictorFeatures);
  for (const char* name : kEvictorFeatureNames) absl::StrAppend(&out, " ", name);
  absl::StrAppend(&out, "\nhorizon ", horizon, "\n");
  auto row = [&](const char* key, const EvictorFeatures& v) {
    absl::StrAppend(&out, key);
    for (float x : v) absl::StrAppendFormat(&out, " %.9g", x);
    absl::StrAppend(&out, "\n");
  };
  row("mean", mean);
  row("scale", scale);
  row("weights", weights);
  absl::StrAppendFormat(&out, "bias %.9g\n", bias);
  return out;
}

absl::StatusOr<EvictorModel> EvictorModel::Parse(const std::string& text, const std::string& what) {
  std::vector<std::string> lines = absl::StrSplit(text, '\n', absl::SkipWhitespace());
  const char* keys[] = {"", "features", "horizon", "mean", "scale", "weights", "bias"};
  if (lines.size() != 7) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": an evictor model has 7 lines (", kMagic,
                                                   ", features, horizon, mean, scale, "
                                                   "weights, bias), found ",
                                                   lines.size()));
  }
  EvictorModel m;
  for (int l = 0; l < 7; ++l) {
    std::vector<std::string> tok = absl::StrSplit(lines[l], ' ', absl::SkipEmpty());
    const int line = l + 1;
    if (l == 0) {
      int version = 0;
      if (tok.size() != 2 || tok[0] != kMagic || !absl::SimpleAtoi(tok[1], &version)) {
        return Bad(what, line,
                   absl::StrCat("not a kvserve evictor model (want '", kMagic, " ",
                                kEvictorFileVersion, "')"));
      }
      if (version != kEvictorFileVersion) {
        return Bad(what, line,
                   absl::StrCat("version ", version,
                                " is not supported (this kvserve "
                                "reads version ",
                                kEvictorFileVersion, ")"));
      }
      continue;
    }
    if (tok.empty() || tok[0] != keys[l]) {
      return Bad(what, line, absl::StrCat("expected '", keys[l], "'"));
    }
    if (l == 1) {
      bool ok = tok.size() == 2 + kEvictorFeatures && tok[1] == absl::StrCat(kEvictorFeatures);
      for (int k = 0; ok && k < kEvictorFeatures; ++k) ok = tok[2 + k] == kEvictorFeatureNames[k];
      if (!ok) {
        std::string want = absl::StrCat("features ", kEvictorFeatures);
        for (const char* n : kEvictorFeatureNames) absl::StrAppend(&want, " ", n);
        return Bad(what, line,
                   absl::StrCat("features differ from this kvserve's: want '", want, "'"));
      }
      continue;
    }
    if (l == 2) {
      if (tok.size() != 2 || !absl::SimpleAtoi(tok[1], &m.horizon) || m.horizon < 1) {
        return Bad(what, line, "horizon must be an integer >= 1");
      }
      continue;
    }
    const size_t want = l == 6 ? 1 : kEvictorFeatures;
    if (tok.size() != want + 1) {
      return Bad(what, line,
                 absl::StrCat("'", keys[l], "' needs ", want, " numbers, found ", tok.size() - 1));
    }
    float* dst = l == 3   ? m.mean.data()
                 : l == 4 ? m.scale.data()
                 : l == 5 ? m.weights.data()
                          : &m.bias;
    for (size_t k = 0; k < want; ++k) {
      if (!absl::SimpleAtof(tok[1 + k], &dst[k]) || !std::isfinite(dst[k])) {
        return Bad(what, line, absl::StrCat("'", tok[1 + k], "' is not a finite number"));
      }
      if (l == 4 && !(dst[k] > 0.0f)) return Bad(what, line, "scale values must be > 0");
    }
  }
  return m;
}

absl::StatusOr<EvictorModel> EvictorModel::Load(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read evictor model ", path));
  std::stringstream text;
  text << in.rdbuf();
  if (text.str().size() > (1 << 16)) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": too large for an evictor model"));
  }
  return Parse(text.str(), path);
}

absl::StatusOr<EvictorModel> FitEvictorModel(std::span<const EvictorFeatures> x,
                                             std::span<const uint8_t> y, int32_t horizon,
                                             double l2) {
  const size_t n = x.size();
  size_t positives = 0;
  for (uint8_t v : y) positives += v ? 1 : 0;
  if (n == 0 || y.size() != n || positives == 0 || positives == n) {
    return absl::InvalidArgumentError(absl::StrCat("training needs samples of both labels; got ", n,
                                                   " samples, ", positives, " positive"));
  }
  EvictorModel m;
  m.horizon = horizon;
  constexpr int D = kEvictorFeatures;
  for (int k = 0; k < D; ++k) {
    double s = 0, s2 = 0;
    for (const EvictorFeatures& f : x) {
      s += f[k];
      s2 += double(f[k]) * f[k];
    }
    const double mean = s / n, var = std::max(0.0, s2 / n - mean * mean);
    m.mean[k] = static_cast<float>(mean);
    m.scale[k] = static_cast<float>(std::sqrt(var) > 1e-6 ? std::sqrt(var) : 1.0);
  }
  // Newton's method on the mean log-loss + l2/2 |w|^2 (bias not penalized).
  std::array<double, D + 1> w{};
  std::vector<std::array<double, D + 1>> z(n);
  for (size_t i = 0; i < n; ++i) {
    for (int k = 0; k < D; ++k) z[i][k] = (x[i][k] - m.mean[k]) / m.scale[k];
    z[i][D] = 1.0;
  }
  for (int iter = 0; iter < 50; ++iter) {
    std::array<double, D + 1> g{};
    std::array<std::array<double, D + 1>, D + 1> h{};
    for (size_t i = 0; i < n; ++i) {
      double t = 0;
      for (int k = 0; k <= D; ++k) t += w[k] * z[i][k];
      const double p = 1.0 / (1.0 + std::exp(-t));
      const double r = p - (y[i] ? 1.0 : 0.0), s = std::max(p * (1 - p), 1e-12);
      for (int a = 0; a <= D; ++a) {
        g[a] += r * z[i][a];
        for (int b = 0; b <= D; ++b) h[a][b] += s * z[i][a] * z[i][b];
      }
    }
    for (int a = 0; a <= D; ++a) {
      g[a] /= n;
      for (int b = 0; b <= D; ++b) h[a][b] /= n;
      if (a < D) {
        g[a] += l2 * w[a];
        h[a][a] += l2;
      }
    }
    // Solve h * step = g (Gaussian elimination with partial pivoting).
    std::array<double, D + 1> step = g;
    for (int c = 0; c <= D; ++c) {
      int piv = c;
      for (int r = c + 1; r <= D; ++r) {
        if (std::fabs(h[r][c]) > std::fabs(h[piv][c])) piv = r;
      }
      std::swap(h[c], h[piv]);
      std::swap(step[c], step[piv]);
      if (std::fabs(h[c][c]) < 1e-15) h[c][c] = 1e-15;
      for (int r = c + 1; r <= D; ++r) {
        const double f = h[r][c] / h[c][c];
        for (int k = c; k <= D; ++k) h[r][k] -= f * h[c][k];
        step[r] -= f * step[c];
      }
    }
    for (int c = D; c >= 0; --c) {
      for (int k = c + 1; k <= D; ++k) step[c] -= h[c][k] * step[k];
      step[c] /= h[c][c];
    }
    double change = 0;
    for (int k = 0; k <= D; ++k) {
      w[k] -= step[k];
      change = std::max(change, std::fabs(step[k]));
    }
    if (change < 1e-8) break;
  }
  for (int k = 0; k < D; ++k) m.weights[k] = static_cast<float>(w[k]);
  m.bias = static_cast<float>(w[D]);
  return m;
}

std::shared_ptr<const EvictionPolicy> MakeLearnedPolicy(std::shared_ptr<const EvictorModel> model) {
  return std::make_shared<LearnedPolicy>(std::move(model));
}

}  // namespace kvserve

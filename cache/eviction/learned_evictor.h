// The `learned` eviction policy: a logistic regression over per-entry
// attention features predicts whether an entry will be needed in the next
// `horizon` decode steps; the policy drops the entries it deems least
// needed (keeping recent_tokens recent ones, as h2o does).
//
// Why logistic regression: seven features, a monotone score and a file of a
// few hundred bytes; it trains in milliseconds by Newton's method, needs no
// tuning beyond an L2 weight, and its weights can be read (docs/kv-eviction.md lists
// them); the features already carry the non-linear transforms (logs).
//
// Features of entry i (EvictionState, n entries, newest position p):
//   acc_log       log(accumulated + 1e-6)
//   acc_rate_log  log(accumulated / (age + 1) + 1e-6): mean attention per step
//   last_rel_log  log(n * last + 1e-6): the last step's weight against uniform
//   age_log       log(1 + age), age = p - position
//   low_frac      fraction of the last 16 steps below average attention
//   sink          1 for the first 4 positions of the sequence, else 0
//   layer_spread  the last step's spread over layers (EvictionState)
// Label (train-evictor, model/eval/evictor_training.h): the entry's mean weight
// over the next `horizon` steps is at least the uniform 1 / n.
//
// File (text, versioned, validated on load; numbers in C locale):
//   kvserve-evictor 1
//   features 7 acc_log acc_rate_log last_rel_log age_log low_frac sink layer_spread
//   horizon 16
//   mean <7 numbers>      standardization: z = (x - mean) / scale
//   scale <7 numbers>     (> 0)
//   weights <7 numbers>
//   bias <number>
//
// Thread-safety: EvictorModel and LearnedPolicy are immutable once built.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "cache/eviction/eviction_policy.h"

namespace kvserve {

inline constexpr int kEvictorFeatures = 7;
inline constexpr const char* kEvictorFeatureNames[kEvictorFeatures] = {
    "acc_log", "acc_rate_log", "last_rel_log", "age_log", "low_frac", "sink", "layer_spread"};
inline constexpr int kEvictorFileVersion = 1;

using EvictorFeatures = std::array<float, kEvictorFeatures>;

// The features of every entry of `state` ([size()]).
void ComputeEvictorFeatures(const EvictionState& state, std::vector<EvictorFeatures>* out);

struct EvictorModel {
  int32_t horizon = 16;
  EvictorFeatures mean{};
  EvictorFeatures scale{};
  EvictorFeatures weights{};
  float bias = 0.0f;

  // The logit of "needed" (higher: keep).
  float Score(const EvictorFeatures& f) const;
  std::string Serialize() const;
  // InvalidArgument naming `what` (a file name) and the line for anything
  // malformed: magic, version, feature names, counts, non-finite numbers,
  // scale <= 0, horizon < 1.
  static absl::StatusOr<EvictorModel> Parse(const std::string& text, const std::string& what);
  static absl::StatusOr<EvictorModel> Load(const std::string& path);
};

// Fits the model by L2-regularized logistic regression (Newton's method) on
// samples x[i] with labels y[i] (0/1). InvalidArgument without both labels.
absl::StatusOr<EvictorModel> FitEvictorModel(std::span<const EvictorFeatures> x,
                                             std::span<const uint8_t> y, int32_t horizon,
                                             double l2 = 1e-3);

std::shared_ptr<const EvictionPolicy> MakeLearnedPolicy(std::shared_ptr<const EvictorModel> model);

}  // namespace kvserve

// Training the `learned` eviction policy's predictor (cache/eviction/learned_evictor.h)
// on a model's own attention: `kvserve train-evictor`.
//
// Each stream (BOS first) is fed one token per step through the paged cache
// without evicting, while the attention statistics every eviction policy
// sees (EvictionState) are recorded. At step t, a random sample of the
// entries then cached gives one example each: its features at t, and the
// label "needed in the next `horizon` steps": its mean weight over steps
// t+1 .. t+horizon is at least the uniform 1 / entries. Steps too close to
// the stream's end to have a full horizon give no examples. The model is
// then fitted by logistic regression (FitEvictorModel).
//
// Thread-safety: none; drives `runner` from the calling thread.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "absl/status/statusor.h"
#include "cache/eviction/learned_evictor.h"
#include "model/model_runner.h"

namespace kvserve {

struct EvictorTrainingOptions {
  int32_t horizon = 16;
  int32_t samples_per_step = 32;  // examples drawn per step (all entries if fewer)
  uint64_t seed = 1;
  double l2 = 1e-3;
  std::function<void(int64_t, int64_t)> progress;  // (tokens done, total)
};

struct EvictorTrainingResult {
  EvictorModel model;
  int64_t examples = 0;
  double positive_rate = 0;   // share of examples labelled needed
  double train_accuracy = 0;  // of the fitted model on its examples (threshold 0.5)
};

// `runner` must hold one stream (its pool at least the longest stream).
absl::StatusOr<EvictorTrainingResult> TrainEvictor(const std::vector<std::vector<int32_t>>& streams,
                                                   ModelRunner& runner,
                                                   const EvictorTrainingOptions& options);

}  // namespace kvserve

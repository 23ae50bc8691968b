#include "model/eval/evictor_training.h"

#include <algorithm>
#include <limits>
#include <numeric>
#include <random>

#include "absl/strings/str_cat.h"
#include "model/eval/evicting_sequence.h"
#include "util/status_macros.h"

namespace kvserve {

absl::StatusOr<EvictorTrainingResult> TrainEvictor(const std::vector<std::vector<int32_t>>& streams,
                                                   ModelRunner& runner,
                                                   const EvictorTrainingOptions& o) {
  if (o.horizon < 1 || o.samples_per_step < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "horizon and samples per step must be >= 1, got ", o.horizon, " and ", o.samples_per_step));
  }
  int64_t total = 0;
  for (const auto& s : streams) total += static_cast<int64_t>(s.size());
  std::mt19937_64 rng(o.seed);
  std::vector<EvictorFeatures> xs;
  std::vector<uint8_t> ys;
  std::vector<EvictorFeatures> features;
  std::vector<int32_t> order;
  std::vector<float> logits;
  int64_t done = 0;
  for (const std::vector<int32_t>& stream : streams) {
    const int32_t n = static_cast<int32_t>(stream.size());
    // Records without evicting: an h2o evictor whose budget is never reached.
    EvictionParams p;
    p.policy = EvictionPolicyKind::kH2o;
    p.budget = std::numeric_limits<int32_t>::max() / 2;
    EvictingSequence seq(runner, MakeEvictionPolicy(EvictionPolicyKind::kH2o), p, p.budget);
    // last[t][i]: entry i's weight at step t (entries 0 .. t; cache index =
    // position, nothing is evicted).
    std::vector<std::vector<float>> last;
    struct Pending {
      int32_t step;
      int32_t entry;
      EvictorFeatures x;
    };
    std::vector<Pending> pending;
    for (int32_t t = 0; t < n; ++t) {
      KV_RETURN_IF_ERROR(seq.Step(stream, t, t + 1, &logits));
      const EvictionState& state = seq.evictor()->state();
      last.emplace_back(state.last().begin(), state.last().end());
      if (t + o.horizon < n && state.size() > 1) {
        ComputeEvictorFeatures(state, &features);
        // The newest entry is always kept (recent window): not an example.
        order.resize(state.size() - 1);
        std::iota(order.begin(), order.end(), 0);
        if (static_cast<int32_t>(order.size()) > o.samples_per_step) {
          std::shuffle(order.begin(), order.end(), rng);
          order.resize(o.samples_per_step);
        }
        for (int32_t i : order) pending.push_back({t, i, features[i]});
      }
      if (o.progress) o.progress(++done, total);
    }
    for (const Pending& e : pending) {
      double mean = 0;
      for (int32_t k = 1; k <= o.horizon; ++k) {
        const std::vector<float>& w = last[e.step + k];
        mean += static_cast<double>(w[e.entry]) * static_cast<double>(w.size());
      }
      xs.push_back(e.x);
      ys.push_back(mean / o.horizon >= 1.0 ? 1 : 0);
    }
  }
  KV_ASSIGN_OR_RETURN(EvictorModel model, FitEvictorModel(xs, ys, o.horizon, o.l2));
  EvictorTrainingResult r;
  r.model = model;
  r.examples = static_cast<int64_t>(xs.size());
  int64_t pos = 0, right = 0;
  for (size_t i = 0; i < xs.size(); ++i) {
    pos += ys[i];
    right += (model.Score(xs[i]) >= 0.0f) == (ys[i] != 0) ? 1 : 0;
  }
  r.positive_rate = static_cast<double>(pos) / static_cast<double>(xs.size());
  r.train_accuracy = static_cast<double>(right) / static_cast<double>(xs.size());
  return r;
}

}  // namespace kvserve

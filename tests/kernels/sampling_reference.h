// Test helpers shared by the host run of the device sampler's algorithm
// (tests/kernels/sample_row_test.cc) and the [gpu] sampler test: the CPU
// sampler called with a SampleRowParams and a reference survivor set (the
// logits generators and the host run live in sample_row_host.h).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <span>
#include <vector>

#include "kernels/sample_rows.h"
#include "model/sampling/sampler.h"
#include "model/sampling/sampling_params.h"
#include "tests/kernels/sample_row_host.h"

namespace kvserve::testing {

inline SamplingParams CpuParamsOf(const SampleRowParams& p) {
  SamplingParams s;
  s.temperature = p.temperature;
  s.top_k = p.top_k;
  s.top_p = p.top_p;
  s.min_p = p.min_p;
  s.repetition_penalty = p.repetition_penalty;
  s.presence_penalty = p.presence_penalty;
  s.frequency_penalty = p.frequency_penalty;
  s.seed = p.seed;
  return s;
}

// What the CPU sampler returns for one row: the token, the processed
// logits it leaves behind and its logprobs.
struct CpuSample {
  int32_t token = -1;
  std::vector<float> processed;
  SampleLogprobs logprobs;
};

inline CpuSample RunCpuSampler(const std::vector<float>& logits, const SampleRowParams& p,
                               const std::vector<int32_t>& prompt,
                               const std::vector<int32_t>& output, uint64_t mt_seed = 1) {
  Sampler sampler;
  SamplerState state(mt_seed);
  CpuSample r;
  r.processed = logits;
  const int32_t n = std::max(p.num_top_logprobs, 0);
  r.token = sampler.Sample(std::span<float>(r.processed), CpuParamsOf(p), prompt, output, &state,
                           p.num_top_logprobs >= 0 ? &r.logprobs : nullptr, n);
  return r;
}

// The tokens a non-greedy draw may pick, from the CPU's processed logits
// (penalties and temperature applied, NaN as -inf), following
// model/sampling/sampler.h's definitions in double precision. `may` loosens every
// threshold by `slack` (relative) and `must` tightens it, so a correct
// sampler's token is always in `may`, and `must` holds the tokens no
// rounding difference can exclude.
struct Survivors {
  std::vector<bool> may, must;
  int32_t num_may = 0, num_must = 0;
};

inline Survivors SurvivorSets(const std::vector<float>& processed, const SampleRowParams& p,
                              double slack = 1e-6) {
  const int32_t n = static_cast<int32_t>(processed.size());
  Survivors s;
  s.may.assign(n, false);
  s.must.assign(n, false);
  float max_logit = -INFINITY;
  for (float l : processed) max_logit = std::max(max_logit, l);
  std::vector<int32_t> order(n);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](int32_t a, int32_t b) { return processed[a] > processed[b]; });
  if (!std::isfinite(max_logit)) {  // degenerate: the argmax
    s.may[order[0]] = s.must[order[0]] = true;
    s.num_may = s.num_must = 1;
    return s;
  }
  std::vector<double> w(n);
  for (int32_t i = 0; i < n; ++i) w[i] = std::exp(static_cast<double>(processed[i]) - max_logit);
  int32_t k = (p.top_k > 0 && p.top_k < n) ? p.top_k : n;
  auto prefix_len = [&](double factor) {
    if (!(p.top_p < 1.0f)) return k;
    double mass = 0.0;
    for (int32_t j = 0; j < k; ++j) mass += w[order[j]];
    const double needed = p.top_p * mass * factor;
    double cumulative = 0.0;
    for (int32_t j = 0; j < k; ++j) {
      cumulative += w[order[j]];
      if (cumulative >= needed) return j + 1;
    }
    return k;
  };
  const int32_t len_may = prefix_len(1.0 + slack), len_must = prefix_len(1.0 - slack);
  for (int32_t j = 0; j < len_may; ++j) {
    const int32_t id = order[j];
    if (j == 0 || !(p.min_p > 0.0f) || w[id] >= p.min_p * (1.0 - slack)) {
      s.may[id] = true;
      ++s.num_may;
    }
  }
  for (int32_t j = 0; j < len_must; ++j) {
    const int32_t id = order[j];
    if (j == 0 || !(p.min_p > 0.0f) || w[id] >= p.min_p * (1.0 + slack)) {
      s.must[id] = true;
      ++s.num_must;
    }
  }
  return s;
}

}  // namespace kvserve::testing

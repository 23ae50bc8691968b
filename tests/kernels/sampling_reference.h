// Test helpers shared by the host run of the device sampler's algorithm
// (tests/kernels/sample_row_test.cc) and the [gpu] sampler test: the CPU
// sampler called with a SampleRowParams, a reference survivor set, and
// logits rows with the edge cases that matter (ties, NaN, -inf, -0).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <numeric>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "kernels/cuda/sample_row.cuh"
#include "kernels/sample_rows.h"
#include "kernels/sampling_batch.h"
#include "model/sampler.h"
#include "model/sampling_params.h"

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
// model/sampler.h's definitions in double precision. `may` loosens every
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

// Gaussian logits of the given scale, then edge cases on request: the
// maximum copied to a few other ids (ties), some NaN and -inf entries, and
// -0 / +0 pairs.
struct LogitsShape {
  float scale = 3.0f;
  int ties = 0;
  int nans = 0;
  int neg_infs = 0;
  bool signed_zeros = false;
};

inline std::vector<float> RandomLogits(int32_t vocab, const LogitsShape& shape,
                                       std::mt19937_64* rng) {
  std::normal_distribution<float> normal(0.0f, shape.scale);
  std::uniform_int_distribution<int32_t> pick(0, vocab - 1);
  std::vector<float> x(vocab);
  for (float& v : x) v = normal(*rng);
  if (shape.ties > 0) {
    const float top = *std::max_element(x.begin(), x.end());
    for (int t = 0; t < shape.ties; ++t) x[pick(*rng)] = top;
  }
  for (int t = 0; t < shape.nans; ++t) x[pick(*rng)] = NAN;
  for (int t = 0; t < shape.neg_infs; ++t) x[pick(*rng)] = -INFINITY;
  if (shape.signed_zeros) {
    x[pick(*rng)] = -0.0f;
    x[pick(*rng)] = 0.0f;
  }
  return x;
}

// Bitwise equality with every NaN equal to every other.
inline bool SameFloats(const std::vector<float>& a, const std::vector<float>& b,
                       int64_t* first_bad) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (std::isnan(a[i]) && std::isnan(b[i])) continue;
    uint32_t ua, ub;
    std::memcpy(&ua, &a[i], 4);
    std::memcpy(&ub, &b[i], 4);
    if (ua != ub) {
      *first_bad = static_cast<int64_t>(i);
      return false;
    }
  }
  return true;
}

// The device sampler's algorithm run on the host (one-thread team) for one
// row. `logits` holds the row in `dtype` (fp32 floats or 16-bit codes).
struct HostSample {
  SampleRowResult result;
  std::vector<float> processed;
  bool counts_zero_after = false;
};

inline HostSample RunHostSampler(const void* logits, cuda::ActDtype dtype, int32_t vocab,
                                 const SampleRowParams& p, const std::vector<int32_t>& prompt,
                                 const std::vector<int32_t>& output) {
  SamplingBatch batch(vocab);
  const absl::Status status = batch.AddRow(p, prompt, output);
  if (!status.ok()) {
    std::fprintf(stderr, "RunHostSampler: %s\n", std::string(status.message()).c_str());
    std::abort();
  }
  HostSample h;
  h.processed.assign(vocab, 0.0f);
  std::vector<int32_t> counts(vocab, 0);
  cuda::sample_row::RowIo io;
  io.logits = logits;
  io.dtype = dtype;
  io.vocab = vocab;
  io.processed = h.processed.data();
  io.counts = counts.data();
  io.params = batch.rows()[0];
  io.history = batch.history().data() + io.params.history_begin;
  cuda::sample_row::RowShared shared;
  cuda::sample_row::SampleRow(cuda::sample_row::SerialRowTeam{}, io, &shared, &h.result);
  h.counts_zero_after = std::all_of(counts.begin(), counts.end(), [](int32_t c) { return c == 0; });
  return h;
}

// Random token histories (prompt, output) with repeats.
inline void RandomHistory(int32_t vocab, int prompt_len, int output_len, std::mt19937_64* rng,
                          std::vector<int32_t>* prompt, std::vector<int32_t>* output) {
  // Draw from a small range so ids repeat within and across the two.
  const int32_t hi = std::min(vocab - 1, std::max(1, 3 * (prompt_len + output_len) / 2));
  std::uniform_int_distribution<int32_t> pick(0, hi);
  prompt->resize(prompt_len);
  output->resize(output_len);
  for (int32_t& t : *prompt) t = pick(*rng);
  for (int32_t& t : *output) t = pick(*rng);
}

}  // namespace kvserve::testing

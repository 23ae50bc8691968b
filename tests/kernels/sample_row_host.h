// Host-side helpers for testing the device sampler without the CPU sampler
// (no model/ dependency, so the cuda_sim tests can use them too): logits rows
// with the edge cases that matter (ties, NaN, -inf, -0), token histories,
// bitwise float comparison, and the device algorithm run on the host with a
// one-thread team (RunHostSampler).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "kernels/cuda/device/act_dtype.h"
#include "kernels/cuda/sampling/sample_row.cuh"
#include "kernels/plan/sampling_batch.h"
#include "kernels/sample_rows.h"

namespace kvserve::testing {

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

// TokenSampler and SampleRng: the engine's narrow view of model/Sampler.
//
// The scheduler only needs "pick the next token of this sample, maybe with
// log-probabilities" and "own this sample's random stream". Keeping the
// Sampler behind this header means scheduler headers never include
// model/sampler.h (whose logprob types are the model's, not the API's).
//
// Seeds: a sample's stream is a std::mt19937_64 seeded once, when the sample
// is created; it lives as long as the sample (preemption by recompute keeps
// it, so re-running a preempted sample draws the same numbers).
//
// Thread-safety: one TokenSampler per thread (it holds scratch); a SampleRng
// is owned by one sample.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <utility>
#include <vector>

#include "model/sampling_params.h"

namespace kvserve {

class Sampler;
struct SamplerState;

class SampleRng {
 public:
  explicit SampleRng(uint64_t seed);
  ~SampleRng();
  SampleRng(SampleRng&&) noexcept;
  SampleRng& operator=(SampleRng&&) noexcept;

 private:
  friend class TokenSampler;
  std::unique_ptr<SamplerState> state_;
};

class TokenSampler {
 public:
  TokenSampler();
  ~TokenSampler();

  // Picks the next token from one logits row (modified in place). When
  // num_logprobs >= 0, *chosen_logprob gets the chosen token's raw logprob
  // and *top the num_logprobs most likely tokens, best first.
  int32_t Sample(std::span<float> logits, const SamplingParams& params,
                 std::span<const int32_t> prompt, std::span<const int32_t> output, SampleRng* rng,
                 int32_t num_logprobs, float* chosen_logprob,
                 std::vector<std::pair<int32_t, float>>* top);

 private:
  std::unique_ptr<Sampler> sampler_;
};

}  // namespace kvserve

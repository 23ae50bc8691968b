#include "scheduler/token_sampler.h"

#include "model/sampler.h"

namespace kvserve {

SampleRng::SampleRng(uint64_t seed) : state_(std::make_unique<SamplerState>(seed)) {}
SampleRng::~SampleRng() = default;
SampleRng::SampleRng(SampleRng&&) noexcept = default;
SampleRng& SampleRng::operator=(SampleRng&&) noexcept = default;

TokenSampler::TokenSampler() : sampler_(std::make_unique<Sampler>()) {}
TokenSampler::~TokenSampler() = default;

int32_t TokenSampler::Sample(std::span<float> logits, const SamplingParams& params,
                             std::span<const int32_t> prompt, std::span<const int32_t> output,
                             SampleRng* rng, int32_t num_logprobs, float* chosen_logprob,
                             std::vector<std::pair<int32_t, float>>* top) {
  if (num_logprobs < 0) {
    return sampler_->Sample(logits, params, prompt, output, rng->state_.get());
  }
  SampleLogprobs lp;
  const int32_t token =
      sampler_->Sample(logits, params, prompt, output, rng->state_.get(), &lp, num_logprobs);
  *chosen_logprob = lp.chosen.logprob;
  top->clear();
  top->reserve(lp.top.size());
  for (const auto& t : lp.top) top->emplace_back(t.token, t.logprob);
  return token;
}

}  // namespace kvserve

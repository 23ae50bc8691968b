// SamplerState: one sequence's generator for the CPU sampler
// (model/sampling/sampler.h), apart from the sampler so that what holds one
// per sequence (scheduler/sequence.h) need not include the sampler.
// Thread-safety: plain value; one sequence's.
#pragma once

#include <cstdint>
#include <random>

#include "model/sampling/sampling_params.h"

namespace kvserve {

// The per-sequence random state. Copyable (a forked sequence may copy it).
struct SamplerState {
  explicit SamplerState(uint64_t seed) : rng(seed) {}
  // Seeded from params.seed, or from a fresh nondeterministic seed when the
  // request has none.
  static SamplerState ForRequest(const SamplingParams& params);

  std::mt19937_64 rng;
};

}  // namespace kvserve

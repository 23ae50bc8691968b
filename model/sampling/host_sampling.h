// HostRowSampler: draws the SampleRows of one step (model/model_runner.h) on
// the host from raw logits rows [num_logits_rows][vocab], with the CPU
// Sampler (model/sampling/sampler.h). The CPU runner samples this way; it is also the
// reference the device sampler is tested against.
//
// Each row is sampled from a private copy of its logits row (the Sampler
// processes a row in place), so rows that share a logits row (the n samples
// of a request) all see the raw logits.
//
// Thread-safety: holds scratch; one per runner (the engine thread).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "absl/status/status.h"
#include "model/model_runner.h"
#include "model/sampling/sampler.h"

namespace kvserve {

class HostRowSampler {
 public:
  // logits: [num_logits_rows][vocab]. InvalidArgument names the bad row
  // (logits_index outside the rows, no params, no state for a random draw,
  // num_logprobs above kMaxSampleLogprobs, a mask of the wrong size or with
  // no token set) before anything is drawn.
  absl::Status Sample(std::span<const float> logits, int32_t vocab, std::span<const SampleRow> rows,
                      std::span<SampledToken> out);

 private:
  Sampler sampler_;
  std::vector<float> row_;
  SampleLogprobs logprobs_;
};

// The checks HostRowSampler::Sample makes, for other backends. A row with a
// token mask (SampleRow::allowed) is refused unless masks_supported: the
// CUDA sampling kernel does not apply masks yet, and a constrained row must
// never be sampled unconstrained.
absl::Status ValidateSampleRows(std::span<const SampleRow> rows, size_t out_size,
                                int64_t num_logits_rows, bool masks_supported = false);

}  // namespace kvserve

// SamplingParams: how the next token is chosen from the logits, per request.
// Semantics follow vLLM / the OpenAI API:
//   temperature 0 is greedy (argmax, ties to the lowest id);
//   top_k 0 or -1 is off; top_p in (0, 1]; min_p in [0, 1) relative to the top
//   probability; repetition_penalty > 0 (1 off; divides positive logits and
//   multiplies negative ones of tokens seen in prompt or output);
//   presence_penalty / frequency_penalty in [-2, 2] over output tokens.
// A request with a seed samples the same tokens every time it runs.
//
// Thread-safety: value type.
#pragma once

#include <cstdint>
#include <optional>

#include "absl/status/status.h"

namespace kvserve {

struct SamplingParams {
  float temperature = 1.0f;
  int32_t top_k = 0;
  float top_p = 1.0f;
  float min_p = 0.0f;
  float repetition_penalty = 1.0f;
  float presence_penalty = 0.0f;
  float frequency_penalty = 0.0f;
  std::optional<uint64_t> seed;

  bool is_greedy() const { return temperature == 0.0f; }
  // InvalidArgument naming the field (e.g. "temperature must be >= 0, got -1").
  absl::Status Validate() const;
};

}  // namespace kvserve

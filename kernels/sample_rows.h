// What the device sampler reads and writes per logits row: SampleRowParams
// (one request's sampling settings, its Philox seed and step, and where its
// token history sits) and SampleRowResult (the token and its logprobs).
// Plain 64-bit-aligned PODs with fixed sizes, shared by the host packer
// (kernels/plan/sampling_batch.h) and the CUDA kernel (kernels/cuda/sampling/sample.h);
// no dependencies, so device code (C++17) includes it too.
//
// Semantics are model/sampling/sampler.h's (vLLM's order: penalties -> temperature
// -> top-k -> top-p -> min-p -> draw; temperature 0 is greedy), except the
// draw's random source: see kernels/cuda/sampling/sample.h.
//
// Thread-safety: plain values.
#pragma once

#include <cstdint>

namespace kvserve {

// Most alternatives a row can ask for (OpenAI's top_logprobs limit).
inline constexpr int kMaxTopLogprobs = 20;
// Largest vocabulary the device sampler takes (its fixed-point mass sums
// need vocab * 2^43 < 2^64).
inline constexpr int32_t kMaxSampleVocab = 1 << 20;

struct SampleRowParams {
  float temperature = 1.0f;         // 0: greedy (argmax, ties to the lowest id)
  int32_t top_k = 0;                // <= 0 or >= vocab: off
  float top_p = 1.0f;               // in (0, 1]; 1: off
  float min_p = 0.0f;               // in [0, 1); 0: off
  float repetition_penalty = 1.0f;  // > 0; 1: off
  float frequency_penalty = 0.0f;   // 0: off (with presence 0)
  float presence_penalty = 0.0f;
  int32_t num_top_logprobs = -1;  // -1: no logprobs; 0: the chosen token's; up to 20
  uint64_t seed = 0;              // Philox key of the sequence
  uint64_t step = 0;              // which draw of the sequence (its output length)
  // The row's token history, for penalties: history[history_begin ..] holds
  // prompt_len prompt ids, then output_len output ids. Filled by
  // SamplingBatch (empty when no penalty is on).
  int64_t history_begin = 0;
  int32_t prompt_len = 0;
  int32_t output_len = 0;
};
static_assert(sizeof(SampleRowParams) == 64, "SampleRowParams is uploaded as raw bytes");

struct SampleRowResult {
  int32_t token = -1;
  float logprob = 0.0f;  // raw log_softmax of the chosen token; NaN without logprobs
  // The num_top_logprobs most likely tokens of the raw distribution, most
  // likely first, ties towards the lower id; unused entries: id -1, -inf.
  int32_t top_ids[kMaxTopLogprobs] = {};
  float top_logprobs[kMaxTopLogprobs] = {};
};
static_assert(sizeof(SampleRowResult) == 168, "SampleRowResult is downloaded as raw bytes");

}  // namespace kvserve

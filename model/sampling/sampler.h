// Sampler: picks the next token of one sequence from its logits row.
//
// Order of operations (vLLM's):
//   repetition / frequency / presence penalties -> temperature -> top-k ->
//   top-p -> min-p -> draw.
// Temperature 0 is greedy: argmax after the penalties, ties to the lowest id;
// top-k/top-p/min-p are ignored and no random number is drawn.
//
// Filters, on the distribution p = softmax(processed logits):
//   top-k keeps the k most probable tokens (ties broken towards the lower id,
//     so exactly k survive);
//   top-p then keeps the smallest most-probable-first prefix of the top-k set
//     whose mass, renormalised over that set, reaches top_p;
//   min-p then keeps the survivors with p >= min_p * max p.
// The draw is an inverse CDF over the survivors with one 64-bit output of the
// sequence's own generator.
//
// Determinism: every sequence owns a SamplerState (a std::mt19937_64, whose
// output the C++ standard fixes). A non-greedy Sample consumes exactly one
// 64-bit output, mapped to [0, 1) as (x >> 11) * 2^-53, and a greedy one
// consumes none, so a seeded request gives the same tokens whatever it is
// batched with and on every conforming build.
//
// Log-probabilities follow vLLM's default ("raw logprobs"): they describe the
// model's own distribution, log_softmax of the logits as passed in, before
// penalties, temperature and filters, so a client sees what the model
// predicted rather than how it was sampled.
//
// Cost at vocab 128256, one core of the shared dev VM (noisy): greedy
// 0.07-0.15 ms, temperature only 0.19-0.26 ms, top-k 50 0.28-0.35 ms, top-p
// 0.9 0.48-0.53 ms, dominated by the O(vocab) passes. Penalties are O(history) with scratch reused
// across calls (no per-call O(vocab) allocation). No full sort anywhere: top-k keeps a buffer cut
// back with nth_element (then sorts the k), top-p buckets the mass by weight exponent and runs a
// weighted quickselect inside one bucket. exp is our own vectorisable polynomial (relative error <
// 1e-7), so a draw is the same IEEE arithmetic on every machine.
//
// Thread-safety: a Sampler holds scratch buffers; use one per thread (the
// engine thread). SamplerState is a value owned by its sequence.
#pragma once

#include <cstdint>
#include <random>
#include <span>
#include <vector>

#include "model/sampling/sampler_state.h"
#include "model/sampling/sampling_params.h"

namespace kvserve {

struct SampledLogprob {
  int32_t token = -1;
  float logprob = 0.0f;
};

struct SampleLogprobs {
  SampledLogprob chosen;
  // The num_top_logprobs most likely tokens of the raw distribution, most
  // likely first, ties towards the lower id.
  std::vector<SampledLogprob> top;
};

class Sampler {
 public:
  // Returns the chosen token id in [0, logits.size()).
  //   logits: one row [vocab]; on return it holds the processed logits
  //     (penalties applied, then divided by the temperature unless greedy).
  //   prompt, output: the sequence's token ids so far; every id must be in
  //     [0, vocab) (a broken invariant aborts).
  //   state: the sequence's generator; untouched when greedy.
  //   logprobs: optional; filled with the chosen token's raw logprob and the
  //     num_top_logprobs best alternatives.
  //   allowed: empty, or a bitset of the tokens that may be drawn (bit id % 32
  //     of word id / 32, ceil(vocab / 32) words): the others' logits become
  //     -inf after the penalties (logprobs stay raw). At least one must be
  //     set (a broken invariant aborts).
  // params must have passed Validate().
  int32_t Sample(std::span<float> logits, const SamplingParams& params,
                 std::span<const int32_t> prompt, std::span<const int32_t> output,
                 SamplerState* state, SampleLogprobs* logprobs = nullptr,
                 int32_t num_top_logprobs = 0, std::span<const uint32_t> allowed = {});

  // Sets the logits of the tokens not in `allowed` (as in Sample) to -inf.
  static void ApplyMask(std::span<float> logits, std::span<const uint32_t> allowed);

  // The penalty stage alone, in place (what Sample does first):
  //   repetition (HF / vLLM): each distinct token of prompt + output has its
  //     logit divided by the penalty if > 0, multiplied by it otherwise;
  //   frequency and presence (OpenAI): logit -= frequency * count_in_output
  //     + presence * (count_in_output > 0).
  void ApplyPenalties(std::span<float> logits, const SamplingParams& params,
                      std::span<const int32_t> prompt, std::span<const int32_t> output);

 private:
  // weights_[i] = exp(logits[i] - max_logit) for every id.
  void ComputeWeights(std::span<const float> logits, float max_logit);
  // Fills block_sums_ from weights_; returns their total.
  double SumBlocks();
  // The first id whose running weight total exceeds target (weights_ in id
  // order, blocked through block_sums_).
  int32_t DrawFromWeights(double target) const;
  int32_t SampleTopK(std::span<const float> logits, const SamplingParams& params, int32_t k,
                     double unit);
  int32_t SampleTopP(std::span<const float> logits, const SamplingParams& params, double total,
                     double unit);
  // The last id (ByLogitDesc order) of the smallest most-probable-first
  // prefix whose weight reaches `needed`; -1 if rounding left it short.
  int32_t TopPBoundary(std::span<const float> logits, double needed);
  void FillLogprobs(std::span<const float> raw, int32_t chosen, int32_t num_top,
                    SampleLogprobs* out);

  std::vector<float> weights_;       // [vocab] exp(logit - max), by token id
  std::vector<double> block_sums_;   // [ceil(vocab / kBlock)] sums of weights_
  std::vector<double> bucket_mass_;  // top-p's weight histogram
  std::vector<int32_t> ids_;         // [vocab] token ids, partially ordered
  std::vector<float> raw_;           // [vocab] copy of the raw logits for logprobs
  std::vector<int32_t> counts_;      // [vocab] all zero between calls
  std::vector<uint8_t> seen_;        // [vocab] all zero between calls
};

}  // namespace kvserve

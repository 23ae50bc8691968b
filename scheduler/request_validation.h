// The one validator of GenerateRequest parameters, with the one set of
// request limits. Front ends call ValidateRequestParams right after parsing
// (so a bad request is refused before any work), and the engine calls it
// again at Submit with its own tighter limits (n <= scheduler.max_num_seqs)
// before the checks that need the tokenizer and the pool. Every error is a
// FieldError (model/field_status.h) naming the request field.
//
// Thread-safety: pure functions.
#pragma once

#include <cstdint>

#include "absl/status/status.h"
#include "scheduler/request.h"

namespace kvserve {

struct RequestLimits {
  int32_t max_samples = 64;             // n
  int32_t max_logprobs = 20;            // alternatives per token (OpenAI's top_logprobs limit)
  int32_t max_stop_strings = 16;        // stop (OpenAI allows 4; vLLM any)
  int32_t max_stop_string_bytes = 256;  // each stop string
  int32_t max_stop_token_ids = 256;     // stop_token_ids
  int32_t vocab_size = 0;               // token ids must be below it; 0: not checked
};

// The limits every front end applies (the engine may tighten max_samples).
inline constexpr RequestLimits kDefaultRequestLimits{};

// Checks sampling, max_tokens, n, logprobs, stop strings and ids, and the
// range of prompt_token_ids. Prompt length and pool size are the engine's.
absl::Status ValidateRequestParams(const GenerateRequest& r, const RequestLimits& limits);

}  // namespace kvserve

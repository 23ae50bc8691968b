// The request and output types that cross between the front ends (gRPC, HTTP,
// CLI) and the engine thread. Plain values; validation lives in the engine,
// which names the bad field in an InvalidArgument status.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "model/grammar/grammar_spec.h"
#include "model/sampling/sampling_params.h"

namespace kvserve {

enum class FinishReason : uint8_t { kNone, kStop, kLength, kCancelled, kError };
// "", "stop", "length", "cancelled", "error"
std::string_view FinishReasonName(FinishReason r);

// A request's KV eviction override (cache/eviction/eviction_policy.h): unset fields
// keep the engine's defaults (cache.eviction_policy, cache.eviction_budget,
// cache.sink_tokens, cache.recent_tokens).
struct KvPolicyOverride {
  std::string policy;          // "" = the engine's
  int32_t budget = 0;          // 0 = the engine's
  int32_t sink_tokens = -1;    // -1 = the engine's
  int32_t recent_tokens = -1;  // -1 = the engine's
  bool empty() const {
    return policy.empty() && budget == 0 && sink_tokens < 0 && recent_tokens < 0;
  }
};

struct GenerateRequest {
  std::string request_id;  // the engine assigns one when empty
  std::string prompt;      // text; ignored when prompt_token_ids is set
  std::vector<int32_t> prompt_token_ids;
  bool add_bos = true;  // prepend BOS to a text prompt
  SamplingParams sampling;
  int32_t max_tokens = 16;              // >= 1; prompt + max_tokens <= max_model_len
  int32_t n = 1;                        // parallel samples sharing the prompt (Fork)
  std::vector<int32_t> stop_token_ids;  // besides EOS (and BOS for llama2.c stories)
  std::vector<std::string> stop;        // stop strings: matched on text, not emitted
  bool ignore_eos = false;
  int32_t logprobs = -1;   // -1 off; 0 chosen token only; k > 0: + top k
  std::string cache_salt;  // isolates prefix-cache sharing between tenants
  int32_t priority = 0;    // lower runs first; FCFS within a priority
  // Who sent it, for per-client fairness (EngineConfig::fair_clients): the
  // front ends set it (server/admission/client_limiter.h ClientKey), never the caller.
  std::string client;
  KvPolicyOverride kv_policy;  // KV eviction; empty = the engine's
  GrammarSpec constraint;      // constrained decoding (model/grammar); empty = none
};

struct TokenLogprob {
  int32_t token_id = 0;
  float logprob = 0.0f;
  std::vector<std::pair<int32_t, float>> top;  // (token id, logprob), best first
};

struct Usage {
  int32_t prompt_tokens = 0;
  int32_t cached_prompt_tokens = 0;  // served from the prefix cache
  int32_t completion_tokens = 0;     // summed over the n samples
};

// One streamed event for one of the request's samples.
struct GenerateOutput {
  int32_t index = 0;                                 // which of the n samples
  std::string text;                                  // new text; always whole UTF-8 characters
  std::vector<int32_t> token_ids;                    // new tokens
  std::vector<TokenLogprob> logprobs;                // one per new token when requested
  FinishReason finish_reason = FinishReason::kNone;  // set on the sample's last event
  std::string error;                                 // when finish_reason == kError
  bool request_finished = false;                     // the last event of the whole request
  Usage usage;                                       // filled on the last event of the request
};

// Per-request timings, reported once when the request ends.
struct RequestMetrics {
  std::string request_id;
  FinishReason finish_reason = FinishReason::kNone;
  double queue_s = 0;  // submit -> first scheduled
  double ttft_s = 0;   // submit -> first token (0 if none)
  double tpot_s = 0;   // mean time per output token after the first (0 if < 2 tokens)
  double e2e_s = 0;    // submit -> end
  Usage usage;
};

}  // namespace kvserve

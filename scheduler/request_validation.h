// The one validator of GenerateRequest parameters, with the one set of
// request limits: the cost budget of a request. Front ends call
// ValidateRequestParams right after parsing (so a bad request is refused
// before any work), and the engine calls it again at Submit with its own
// tighter limits (n <= scheduler.max_num_seqs) before the checks that need
// the tokenizer and the pool. Every error is a FieldError
// (util/field_status.h) naming the request field.
//
// The budget, cheapest check first: a text prompt's bytes are checked before
// it is tokenized (CheckPromptBytes), its tokens right after
// (CheckPromptTokens), so a 5 MB prompt costs a length comparison, not a
// tokenization; stop strings are counted before they are copied
// (CheckStopCount); n x max_tokens bounds the tokens one request may
// generate. The limits come from the config's `limits` section
// (server/config/config.h); ResolveRequestLimits fills the ones that default to the
// served model's max_model_len.
//
// At Submit the engine also resolves the request's KV eviction
// (ResolveRequestEviction: its kv_policy over cache.*) and checks that the
// prompt and max_tokens fit the model and the pool (CheckRequestFits),
// against the SubmitBounds it was built with; what needs the engine itself
// (the policy objects, the grammar cache, the tokenizer) stays in it.
//
// Thread-safety: pure functions.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "cache/eviction/eviction_params.h"
#include "scheduler/request.h"

namespace kvserve {

struct RequestLimits {
  int32_t max_samples = 64;             // n
  int32_t max_logprobs = 20;            // alternatives per token (OpenAI's top_logprobs limit)
  int32_t max_stop_strings = 16;        // stop (OpenAI allows 4; vLLM any)
  int32_t max_stop_string_bytes = 256;  // each stop string
  int32_t max_stop_token_ids = 256;     // stop_token_ids
  // A text prompt's bytes (UTF-8, as sent; chat: as rendered), checked
  // before tokenizing. 0: not checked (ResolveRequestLimits: 32 bytes per
  // allowed prompt token).
  int64_t max_prompt_bytes = 0;
  // Prompt tokens (text prompts once tokenized, token-id prompts as sent).
  // 0: not checked (ResolveRequestLimits: max_model_len).
  int64_t max_prompt_tokens = 0;
  // n x max_tokens: the most tokens one request may ask to generate.
  // 0: not checked (ResolveRequestLimits: 64 x max_model_len).
  int64_t max_generated_tokens = 0;
  int32_t vocab_size = 0;  // token ids must be below it; 0: not checked
};

// The limits every front end applies (the engine may tighten max_samples).
inline constexpr RequestLimits kDefaultRequestLimits{};
// cache_salt bytes: a salt names a cache partition, it is no payload (the
// daemon salts with a 71-byte tenant digest, server/admission/auth.h).
inline constexpr size_t kMaxCacheSaltBytes = 256;

// Bytes of prompt text per allowed prompt token when max_prompt_bytes is
// derived: typical text is 3-5 bytes a token, so only prompts far past the
// token limit are refused on bytes alone.
inline constexpr int64_t kPromptBytesPerToken = 32;
// Generated tokens per max_model_len when max_generated_tokens is derived.
inline constexpr int64_t kGeneratedTokensPerModelLen = 64;

// `configured` with its derived (0) limits filled from the served model's
// max_model_len.
RequestLimits ResolveRequestLimits(RequestLimits configured, int32_t max_model_len);

// Checks sampling, max_tokens, n, n x max_tokens, logprobs, stop strings and
// ids, the prompt's bytes (text) or tokens (ids), and the range of
// prompt_token_ids. Prompt length against max_model_len and the pool are the
// engine's.
absl::Status ValidateRequestParams(const GenerateRequest& r, const RequestLimits& limits);

// The single checks, for front ends that meet the data before it is a
// GenerateRequest. `field` is what the request calls the prompt.
absl::Status CheckPromptBytes(size_t bytes, const RequestLimits& limits,
                              std::string_view field = "prompt");
absl::Status CheckPromptTokens(size_t tokens, const RequestLimits& limits,
                               std::string_view field = "prompt");
absl::Status CheckStopCount(size_t count, const RequestLimits& limits);

// What the engine checks a request against at Submit.
struct SubmitBounds {
  int32_t max_model_len = 0;
  int32_t block_size = 0;
  int32_t num_blocks = 0;           // the primary pool
  int32_t sliding_window = 0;       // the model's own window; 0: none
  EvictionParams eviction;          // cache.*, the budget resolved against the model
  bool runner_evicts = false;       // ModelRunner::supports_eviction
  uint32_t available_policies = 0;  // bit k: policy kind k has its implementation
};

// Policies that keep every relative position within the budget, so their
// sequences may run past max_model_len.
bool EvictionUnbounded(EvictionPolicyKind kind);

// Why a runner has no KV eviction, for the config's and a request's error.
inline constexpr char kNoEvictionReason[] =
    "needs KV eviction, which this model runner does not have for this cache.kv_dtype (CPU: "
    "every one but int4_kc and int2_kc, without cache.low_rank or cache.cross_layer; CUDA: one "
    "per-token dtype in every layer)";

// A request's eviction: bounds.eviction with o's fields over it. FieldErrors
// name kv_policy.policy or kv_policy.budget (and the other kv_policy.*
// fields through EvictionParams::Validate).
absl::StatusOr<EvictionParams> ResolveRequestEviction(const KvPolicyOverride& o,
                                                      const SubmitBounds& bounds);

// KV entries a sample of an evicting request may hold after a step's append:
// the budget, plus a block while a prompt is written through (none under the
// model's own window, which cuts attention by cache index).
int32_t EvictionHoldLimit(const EvictionParams& p, const SubmitBounds& bounds);

// The prompt's tokens and max_tokens against max_model_len (unless p is an
// unbounded eviction) and the pool (the hold limit's blocks when evicting).
// FieldErrors name prompt, max_tokens or kv_policy.budget.
absl::Status CheckRequestFits(int64_t prompt_len, int64_t max_tokens, const EvictionParams& p,
                              int32_t hold_limit, const SubmitBounds& bounds);

}  // namespace kvserve

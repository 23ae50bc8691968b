#include "scheduler/request_validation.h"

#include "absl/strings/str_cat.h"
#include "util/field_status.h"
#include "util/status_macros.h"

namespace kvserve {
namespace {

absl::Status CheckIds(const std::vector<int32_t>& ids, const char* field, int32_t vocab) {
  if (vocab <= 0) return absl::OkStatus();
  for (size_t i = 0; i < ids.size(); ++i) {
    if (ids[i] < 0 || ids[i] >= vocab) {
      return FieldError(field, absl::StrCat(field, "[", i, "] = ", ids[i],
                                            " is outside the vocabulary [0, ", vocab, ")"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

RequestLimits ResolveRequestLimits(RequestLimits configured, int32_t max_model_len) {
  RequestLimits l = configured;
  if (l.max_prompt_tokens == 0) l.max_prompt_tokens = max_model_len;
  if (l.max_prompt_bytes == 0) l.max_prompt_bytes = kPromptBytesPerToken * l.max_prompt_tokens;
  if (l.max_generated_tokens == 0) {
    l.max_generated_tokens = kGeneratedTokensPerModelLen * int64_t{max_model_len};
  }
  return l;
}

absl::Status CheckPromptBytes(size_t bytes, const RequestLimits& limits, std::string_view field) {
  if (limits.max_prompt_bytes > 0 && static_cast<int64_t>(bytes) > limits.max_prompt_bytes) {
    return FieldError(
        field, absl::StrCat(std::string(field), " has ", bytes, " bytes, at most ",
                            limits.max_prompt_bytes, " are allowed (limits.max_prompt_bytes)"));
  }
  return absl::OkStatus();
}

absl::Status CheckPromptTokens(size_t tokens, const RequestLimits& limits, std::string_view field) {
  if (limits.max_prompt_tokens > 0 && static_cast<int64_t>(tokens) > limits.max_prompt_tokens) {
    return FieldError(
        field, absl::StrCat(std::string(field), " has ", tokens, " tokens, at most ",
                            limits.max_prompt_tokens, " are allowed (limits.max_prompt_tokens)"));
  }
  return absl::OkStatus();
}

absl::Status CheckStopCount(size_t count, const RequestLimits& limits) {
  if (static_cast<int64_t>(count) > limits.max_stop_strings) {
    return FieldError("stop", absl::StrCat("stop has ", count, " strings, at most ",
                                           limits.max_stop_strings, " are allowed"));
  }
  return absl::OkStatus();
}

absl::Status ValidateRequestParams(const GenerateRequest& r, const RequestLimits& limits) {
  KV_RETURN_IF_ERROR(r.sampling.Validate());
  if (r.max_tokens < 1) {
    return FieldError("max_tokens", absl::StrCat("max_tokens must be >= 1, got ", r.max_tokens));
  }
  if (r.n < 1 || r.n > limits.max_samples) {
    return FieldError("n", absl::StrCat("n must be in [1, ", limits.max_samples, "], got ", r.n));
  }
  if (r.logprobs < -1 || r.logprobs > limits.max_logprobs) {
    return FieldError("logprobs", absl::StrCat("logprobs must be -1 (off) or in [0, ",
                                               limits.max_logprobs, "], got ", r.logprobs));
  }
  if (limits.max_generated_tokens > 0 &&
      int64_t{r.n} * r.max_tokens > limits.max_generated_tokens) {
    return FieldError("max_tokens", absl::StrCat("n x max_tokens = ", r.n, " x ", r.max_tokens,
                                                 " = ", int64_t{r.n} * r.max_tokens,
                                                 " tokens, at most ", limits.max_generated_tokens,
                                                 " are allowed (limits.max_generated_tokens)"));
  }
  KV_RETURN_IF_ERROR(CheckStopCount(r.stop.size(), limits));
  for (size_t i = 0; i < r.stop.size(); ++i) {
    if (r.stop[i].empty())
      return FieldError("stop", absl::StrCat("stop[", i, "] must not be empty"));
    if (static_cast<int64_t>(r.stop[i].size()) > limits.max_stop_string_bytes) {
      return FieldError("stop",
                        absl::StrCat("stop[", i, "] has ", r.stop[i].size(), " bytes, at most ",
                                     limits.max_stop_string_bytes, " are allowed"));
    }
  }
  if (static_cast<int64_t>(r.stop_token_ids.size()) > limits.max_stop_token_ids) {
    return FieldError("stop_token_ids",
                      absl::StrCat("stop_token_ids has ", r.stop_token_ids.size(), " ids, at most ",
                                   limits.max_stop_token_ids, " are allowed"));
  }
  KV_RETURN_IF_ERROR(CheckIds(r.stop_token_ids, "stop_token_ids", limits.vocab_size));
  if (r.prompt_token_ids.empty()) {
    KV_RETURN_IF_ERROR(CheckPromptBytes(r.prompt.size(), limits));
  } else {
    KV_RETURN_IF_ERROR(CheckPromptTokens(r.prompt_token_ids.size(), limits, "prompt_token_ids"));
  }
  KV_RETURN_IF_ERROR(CheckIds(r.prompt_token_ids, "prompt_token_ids", limits.vocab_size));
  if (r.cache_salt.size() > kMaxCacheSaltBytes) {
    return FieldError("cache_salt",
                      absl::StrCat("cache_salt has ", r.cache_salt.size(), " bytes, at most ",
                                   kMaxCacheSaltBytes, " are allowed"));
  }
  return absl::OkStatus();
}

}  // namespace kvserve

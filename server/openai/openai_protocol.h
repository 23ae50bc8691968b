// The OpenAI-compatible wire format: request bodies of /v1/completions and
// /v1/chat/completions parsed and validated into a GenerateRequest, engine
// outputs rendered as completion objects or as streamed chunks, and errors
// as OpenAI error objects.
//
// Parsing is strict about what it uses (wrong JSON type or out of range ->
// an ApiError naming the field in `param`) and ignores fields it does not
// know, as OpenAI clients send many. Prompts are tokenized here, so length
// errors name `prompt`/`messages` or `max_tokens` precisely and the engine
// receives token ids. The request cost budget (ApiContext::limits,
// scheduler/request_validation.h) comes first: every other field is checked,
// then the prompt's bytes (chat: the contents before rendering, then the
// rendered text), and only then is it tokenized, and its tokens counted.
//
// Supported fields: model, prompt (string, [string], [ids] or [[ids]]),
// messages (assistant tool_calls and "tool" messages included), tools,
// max_tokens (chat also max_completion_tokens), temperature, top_p,
// n, stop, seed, logprobs (completions: int; chat: bool + top_logprobs),
// presence_penalty, frequency_penalty, user, echo (completions), stream,
// stream_options.include_usage; extensions: top_k, min_p,
// repetition_penalty, ignore_eos, stop_token_ids, cache_salt, kv_policy (KV
// eviction: a policy name or {"policy", "budget", "sink_tokens",
// "recent_tokens"}, errors name e.g. kv_policy.budget),
// priority, and (chat) add_generation_prompt and chat_template_kwargs as
// vLLM has them; structured outputs: response_format, guided_json,
// guided_regex, guided_choice and structured_outputs
// (server/openai/structured_output.h). Messages, tools and chat_template_kwargs reach a
// checkpoint's own chat template (model/chat/chat_template.h); when it refuses a
// conversation (raise_exception) the 400 names `messages`.
//
// Thread-safety: free functions; ResponseAccumulator and StreamFormatter are
// per-request values.
#pragma once

#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "model/chat/chat_template.h"
#include "model/tokenizer/tokenizer.h"
#include "scheduler/request.h"
#include "scheduler/request_validation.h"
#include "server/openai/tool_calls.h"

namespace kvserve {

// An OpenAI error object with its HTTP status.
struct ApiError {
  int http_status = 400;
  std::string message;
  std::string type = "invalid_request_error";
  std::string param;  // "" -> null
  std::string code;   // "" -> null

  nlohmann::json ToJson() const;  // {"error": {...}}
  std::string Body() const;
};

ApiError InvalidRequest(std::string param, std::string message);
// Maps an engine status (Submit) to an error: InvalidArgument -> 400 with the
// field named in the message as param, ResourceExhausted -> 429 (code
// queue_full, or concurrency_limit_exceeded from server/admission/client_limiter.h),
// Unavailable -> 503, anything else -> 500. `prompt_param` is what a prompt
// field is called in this API ("prompt" or "messages").
ApiError ApiErrorFromStatus(const absl::Status& status, const std::string& prompt_param);

enum class ApiKind { kCompletion, kChat };

// What parsing needs to know about the served model.
struct ApiContext {
  const Tokenizer* tokenizer = nullptr;
  const ChatTemplate* chat_template = nullptr;
  std::string model_name;  // the one served model; a different `model` is 404
  int32_t max_model_len = 0;
  // What a request that sets no sampling parameter gets (the checkpoint's
  // generation_config.json recommendations).
  SamplingParams default_sampling;
  // The server's KV eviction policy (cache.eviction_policy): streaming and
  // sliding_window requests (this default or their kv_policy) may run past
  // max_model_len, which the engine then checks instead.
  std::string default_kv_policy = "none";
  // The request cost budget (the config's limits section); the limits left
  // 0 are derived from max_model_len (ResolveRequestLimits). A text prompt
  // over max_prompt_bytes is refused before it is tokenized.
  RequestLimits limits = kDefaultRequestLimits;
};

struct ApiRequest {
  ApiKind kind = ApiKind::kCompletion;
  GenerateRequest request;  // prompt_token_ids filled; request_id left to the caller
  std::string model;        // as sent (defaults to the served name)
  bool stream = false;
  bool include_usage = false;  // stream_options.include_usage
  bool echo = false;           // completions: prepend the prompt text
  std::string echo_text;
  std::string user;
  // Chat with tools and tool_choice other than "none": the output is parsed
  // for tool calls (server/openai/tool_calls.h); streamed, each sample's
  // text is held until it ends, then sent as delta.tool_calls or content.
  bool parse_tool_calls = false;
  // The model family's format (model.tool_call_format or the chat
  // template's markers); kAuto tries every format.
  ToolCallFormat tool_call_format = ToolCallFormat::kAuto;
};

// Request bodies nested deeper than this (arrays and objects, the body's own
// object counting 1) are refused with a 400: copying and dumping a JSON value
// recurse once per level, so a deep enough body would overflow the stack.
inline constexpr int kMaxJsonDepth = 64;

// Parses a request body; nullopt on success with *out filled.
std::optional<ApiError> ParseApiRequest(ApiKind kind, const std::string& body,
                                        const ApiContext& ctx, ApiRequest* out);

// "stop", "length", "abort" (cancelled or drained) or "error"; null while running.
nlohmann::json FinishReasonJson(FinishReason reason);
nlohmann::json UsageJson(const Usage& usage);

// Renders per-token logprobs in the API's shape, tracking the previous token
// of each sample so token texts follow the detokenizer's spacing rules.
class LogprobFormatter {
 public:
  LogprobFormatter(ApiKind kind, const Tokenizer* tokenizer, int32_t last_prompt_token)
      : kind_(kind), tokenizer_(tokenizer), last_prompt_token_(last_prompt_token) {}

  // Completions: {"tokens", "token_logprobs", "top_logprobs", "text_offset"};
  // chat: {"content": [{"token", "logprob", "bytes", "top_logprobs"}]}.
  // Appends to `*into` (an object, created when null) for sample `index`.
  void Append(int32_t index, const std::vector<TokenLogprob>& logprobs, nlohmann::json* into);

 private:
  std::string TokenText(int32_t id, int32_t prev) const;

  ApiKind kind_;
  const Tokenizer* tokenizer_;
  int32_t last_prompt_token_;
  std::map<int32_t, int32_t> prev_;         // index -> previous token
  std::map<int32_t, int64_t> text_offset_;  // index -> bytes of text so far
};

// Collects a whole (non-streaming) response.
class ResponseAccumulator {
 public:
  ResponseAccumulator(const ApiRequest& request, const Tokenizer* tokenizer);

  void Add(const GenerateOutput& out);
  // The completion object; `error` set when a sample ended with kError.
  nlohmann::json ToJson(const std::string& id, int64_t created, const std::string& model) const;
  const std::string& error() const { return error_; }

 private:
  struct Choice {
    std::string text;
    FinishReason finish = FinishReason::kNone;
    nlohmann::json logprobs;  // null unless requested
  };
  ApiKind kind_;
  bool want_logprobs_;
  bool parse_tool_calls_;
  ToolCallFormat tool_call_format_;
  std::vector<Choice> choices_;
  Usage usage_;
  std::string error_;
  LogprobFormatter logprob_formatter_;
};

// Turns outputs into SSE events ("data: {...}\n\n"), OpenAI chunk format.
class StreamFormatter {
 public:
  StreamFormatter(const ApiRequest& request, const Tokenizer* tokenizer, std::string id,
                  int64_t created, std::string model);

  // Events to send before any output (chat: the role delta of each sample;
  // completions with echo: the prompt).
  std::string Start();
  // Events for one engine output (empty when it carries nothing to send).
  std::string Add(const GenerateOutput& out);
  // The usage chunk (when asked for) and "data: [DONE]".
  std::string Finish();

 private:
  std::string Event(const nlohmann::json& chunk) const;
  nlohmann::json Chunk(nlohmann::json choices) const;

  ApiKind kind_;
  bool want_logprobs_;
  bool include_usage_;
  bool echo_;
  std::string echo_text_;
  int32_t n_;
  std::string id_;
  int64_t created_;
  std::string model_;
  Usage usage_;
  bool parse_tool_calls_;
  ToolCallFormat tool_call_format_;
  std::map<int32_t, std::string> held_;  // index -> text held for tool-call parsing
  LogprobFormatter logprob_formatter_;
};

// JSON text that never throws on invalid UTF-8 (replaced by U+FFFD).
std::string DumpJson(const nlohmann::json& j);

}  // namespace kvserve

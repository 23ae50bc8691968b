// Request parsing of the OpenAI wire format (server/openai/openai_protocol.h):
// bodies into GenerateRequests, and errors as OpenAI error objects.
#include <cmath>
#include <limits>
#include <utility>
#include <variant>

#include "absl/strings/str_cat.h"
#include "scheduler/detokenizer.h"
#include "scheduler/request_validation.h"
#include "server/admission/client_limiter.h"
#include "server/admission/request_budget.h"
#include "server/openai/json_body.h"
#include "server/openai/json_fields.h"
#include "server/openai/openai_protocol.h"
#include "server/openai/structured_output.h"
#include "util/field_status.h"

namespace kvserve {
namespace {

using json = nlohmann::json;
using json_fields::GetBool;
using json_fields::GetInt;
using json_fields::GetNumber;
using json_fields::GetString;
using json_fields::GetTokenIds;
using json_fields::Member;
using json_fields::OutOfRange;
using json_fields::TypeName;
using json_fields::WrongType;

#define API_TRY(expr)                                               \
  do {                                                              \
    if (std::optional<ApiError> api_err_ = (expr)) return api_err_; \
  } while (0)

template <typename T>
std::string Num(T v) {
  return absl::StrCat(v);
}

std::optional<ApiError> ParseSampling(const json& body, ApiRequest* r) {
  SamplingParams& s = r->request.sampling;
  std::optional<double> d;
  std::optional<int64_t> i;

  // Types only: ranges are checked by ValidateRequestParams once the whole
  // request is read (scheduler/request_validation.h, shared with gRPC and
  // the engine).
  struct NumberParam {
    const char* name;
    float* dest;
  };
  for (const NumberParam& p :
       {NumberParam{"temperature", &s.temperature}, NumberParam{"top_p", &s.top_p},
        NumberParam{"min_p", &s.min_p}, NumberParam{"repetition_penalty", &s.repetition_penalty},
        NumberParam{"presence_penalty", &s.presence_penalty},
        NumberParam{"frequency_penalty", &s.frequency_penalty}}) {
    d.reset();
    API_TRY(GetNumber(body, p.name, &d));
    if (d) *p.dest = static_cast<float>(*d);
  }
  API_TRY(GetInt(body, "top_k", &i));
  if (i) {
    if (*i < std::numeric_limits<int32_t>::min() || *i > std::numeric_limits<int32_t>::max()) {
      return OutOfRange("top_k", "a 32-bit integer", Num(*i));
    }
    s.top_k = static_cast<int32_t>(*i);
  }
  i.reset();
  API_TRY(GetInt(body, "seed", &i));
  if (i) s.seed = static_cast<uint64_t>(*i);
  return std::nullopt;
}

// kv_policy: a policy name, or {"policy", "budget", "sink_tokens",
// "recent_tokens"} (each optional); the engine checks the values.
std::optional<ApiError> ParseKvPolicy(const json& body, KvPolicyOverride* out) {
  const json* v = Member(body, "kv_policy");
  if (v == nullptr) return std::nullopt;
  if (v->is_string()) {
    out->policy = v->get<std::string>();
    return std::nullopt;
  }
  if (!v->is_object()) return WrongType("kv_policy", "an object or a policy name", *v);
  for (const auto& [key, value] : v->items()) {
    if (key != "policy" && key != "budget" && key != "sink_tokens" && key != "recent_tokens") {
      return InvalidRequest("kv_policy." + key,
                            absl::StrCat("'kv_policy' has no field '", key,
                                         "' (policy, budget, sink_tokens, recent_tokens)"));
    }
  }
  std::optional<std::string> name;
  API_TRY(GetString(*v, "policy", &name));
  if (name) out->policy = *name;
  struct IntField {
    const char* name;
    const char* param;
    int64_t min;
    int32_t* dst;
  };
  for (const IntField& f :
       {IntField{"budget", "kv_policy.budget", 2, &out->budget},
        IntField{"sink_tokens", "kv_policy.sink_tokens", 0, &out->sink_tokens},
        IntField{"recent_tokens", "kv_policy.recent_tokens", 0, &out->recent_tokens}}) {
    std::optional<int64_t> i;
    if (std::optional<ApiError> e = GetInt(*v, f.name, &i)) {
      e->param = f.param;
      e->message = absl::StrCat("'", f.param, "' must be an integer");
      return e;
    }
    if (!i) continue;
    if (*i < f.min || *i > std::numeric_limits<int32_t>::max()) {
      return OutOfRange(f.param, absl::StrCat("an integer >= ", f.min), Num(*i));
    }
    *f.dst = static_cast<int32_t>(*i);
  }
  return std::nullopt;
}

std::optional<ApiError> ParseStops(const json& body, const RequestLimits& limits,
                                   GenerateRequest* g) {
  if (const json* stop = Member(body, "stop")) {
    if (stop->is_string()) {
      if (!stop->get<std::string>().empty()) g->stop.push_back(stop->get<std::string>());
    } else if (stop->is_array()) {
      // Counted before a string is copied (the budget's check).
      if (absl::Status c = CheckStopCount(stop->size(), limits); !c.ok()) {
        return InvalidRequest("stop", std::string(c.message()));
      }
      for (const json& s : *stop) {
        if (!s.is_string()) {
          return InvalidRequest("stop",
                                absl::StrCat("'stop' entries must be strings, got ", TypeName(s)));
        }
        if (!s.get<std::string>().empty()) g->stop.push_back(s.get<std::string>());
      }
    } else {
      return WrongType("stop", "a string or an array of strings", *stop);
    }
  }
  if (const json* ids = Member(body, "stop_token_ids")) {
    if (!ids->is_array()) return WrongType("stop_token_ids", "an array of token ids", *ids);
    API_TRY(GetTokenIds(*ids, "stop_token_ids", limits.vocab_size, &g->stop_token_ids));
  }
  return std::nullopt;
}

// Chat message content: a string, null, or an array of {"type": "text"} parts.
std::optional<ApiError> MessageContent(const json& msg, size_t index, std::string* out) {
  std::string param = absl::StrCat("messages[", index, "].content");
  auto it = msg.find("content");
  if (it == msg.end() || it->is_null()) return std::nullopt;
  if (it->is_string()) {
    *out = it->get<std::string>();
    return std::nullopt;
  }
  if (!it->is_array()) return WrongType(param, "a string or an array of content parts", *it);
  std::string text;
  for (const json& part : *it) {
    if (!part.is_object() || part.value("type", "") != "text" || !part.contains("text") ||
        !part["text"].is_string()) {
      return InvalidRequest(param, absl::StrCat("'", param,
                                                "' parts must be {\"type\": \"text\", "
                                                "\"text\": \"...\"} (only text is supported)"));
    }
    if (!text.empty()) text.push_back('\n');
    text += part["text"].get<std::string>();
  }
  *out = std::move(text);
  return std::nullopt;
}

// What a checkpoint's chat template sees beyond role and content: each
// message as sent (tool_calls, tool_call_id, ...), `tools` and the vLLM
// extensions add_generation_prompt and chat_template_kwargs. The body is
// parsed again keeping member order, which tool schemas rendered with
// tojson must keep.
std::optional<ApiError> ChatTemplateInputs(const json& body, const std::string& raw_body,
                                           std::vector<ChatMessage>* chat,
                                           ChatRenderOptions* options) {
  const json* tools = Member(body, "tools");
  if (tools != nullptr && !tools->is_array())
    return WrongType("tools", "an array of tools", *tools);
  const json* kwargs = Member(body, "chat_template_kwargs");
  if (kwargs != nullptr && !kwargs->is_object()) {
    return WrongType("chat_template_kwargs", "an object", *kwargs);
  }
  // The body parsed once already, so this parse succeeds.
  std::variant<nlohmann::ordered_json, JsonBodyError> parsed =
      ParseOrderedJsonBody(raw_body, kMaxJsonDepth);
  if (const JsonBodyError* err = std::get_if<JsonBodyError>(&parsed)) {
    return InvalidRequest(err->path, err->message);
  }
  const nlohmann::ordered_json& ordered = std::get<nlohmann::ordered_json>(parsed);
  for (size_t k = 0; k < chat->size(); ++k) (*chat)[k].fields = ordered["messages"][k];
  if (tools != nullptr) options->tools = ordered["tools"];
  if (kwargs != nullptr) options->variables = ordered["chat_template_kwargs"];
  return std::nullopt;
}

// The JSON schema of one call of `tool` ({"type": "function", "function":
// {"name", "parameters"}}): {"name": <its name>, "arguments": <parameters>},
// the shape every format's parser reads (tool_calls.h).
nlohmann::ordered_json CallSchema(const nlohmann::ordered_json& tool) {
  using ojson = nlohmann::ordered_json;
  const ojson& fn = tool["function"];
  ojson params =
      fn.contains("parameters") && fn["parameters"].is_object() && !fn["parameters"].empty()
          ? fn["parameters"]
          : ojson{{"type", "object"}};
  return ojson{{"type", "object"},
               {"properties", {{"name", {{"const", fn["name"]}}}, {"arguments", params}}},
               {"required", {"name", "arguments"}},
               {"additionalProperties", false}};
}

// tool_choice: "none", "auto", "required" or {"type": "function", "function":
// {"name"}} naming one of `tools`. Tool calls are parsed from the output
// unless there are no tools or tool_choice is "none"; "required" and a named
// function constrain decoding to one call ({"name", "arguments"} JSON of the
// tools' schemas), which errors name under "tools".
std::optional<ApiError> ParseToolChoice(const json& body, const std::string& raw_body,
                                        const ApiContext& ctx, ApiRequest* r) {
  bool* parse = &r->parse_tool_calls;
  if (ctx.chat_template != nullptr) {
    r->tool_call_format = ToolCallFormatNamed(ctx.chat_template->tool_call_format());
  }
  const json* tools = Member(body, "tools");
  const json* choice = Member(body, "tool_choice");
  *parse = tools != nullptr && tools->is_array() && !tools->empty();
  if (choice == nullptr) return std::nullopt;
  std::string named;
  if (choice->is_string()) {
    const std::string c = choice->get<std::string>();
    if (c != "none" && c != "auto" && c != "required") {
      return InvalidRequest("tool_choice",
                            "'tool_choice' must be \"none\", \"auto\", "
                            "\"required\" or a named function");
    }
    if (c == "none") *parse = false;
    if (c != "none" && !*parse) {
      return InvalidRequest("tool_choice", "'tool_choice' needs 'tools'");
    }
    if (c != "required") return std::nullopt;
  } else {
    const json* fn = choice->is_object() ? Member(*choice, "function") : nullptr;
    const json* name = fn != nullptr && fn->is_object() ? Member(*fn, "name") : nullptr;
    if (name == nullptr || !name->is_string()) {
      return InvalidRequest("tool_choice.function.name",
                            "'tool_choice' must be a string or {\"type\": \"function\", "
                            "\"function\": {\"name\": ...}}");
    }
    named = name->get<std::string>();
  }
  // Constrain to a call: the tools re-read in member order.
  std::variant<nlohmann::ordered_json, JsonBodyError> parsed =
      ParseOrderedJsonBody(raw_body, kMaxJsonDepth);
  if (const JsonBodyError* err = std::get_if<JsonBodyError>(&parsed)) {
    return InvalidRequest(err->path, err->message);
  }
  const nlohmann::ordered_json& ordered = std::get<nlohmann::ordered_json>(parsed)["tools"];
  nlohmann::ordered_json calls = nlohmann::ordered_json::array();
  for (size_t i = 0; i < ordered.size(); ++i) {
    const auto& t = ordered[i];
    const bool ok = t.is_object() && t.contains("function") && t["function"].is_object() &&
                    t["function"].contains("name") && t["function"]["name"].is_string();
    if (!ok) {
      const std::string param = absl::StrCat("tools[", i, "].function.name");
      return InvalidRequest(param, absl::StrCat("'", param, "' must be a string"));
    }
    if (named.empty() || t["function"]["name"] == named) calls.push_back(CallSchema(t));
  }
  if (calls.empty()) {
    return InvalidRequest("tool_choice.function.name",
                          absl::StrCat("'tool_choice.function.name' names '",
                                       CapClientText(named, 64), "', which is not one of 'tools'"));
  }
  if (!r->request.constraint.empty()) {
    return InvalidRequest("tool_choice",
                          absl::StrCat("'tool_choice' requires a tool call, but '",
                                       r->request.constraint.field, "' constrains the output too"));
  }
  GrammarSpec& spec = r->request.constraint;
  spec.kind = GrammarSpec::Kind::kJsonSchema;
  spec.text = (calls.size() == 1 ? calls[0] : nlohmann::ordered_json{{"anyOf", calls}}).dump();
  spec.field = "tools";
  const ToolCallFrame frame = ConstrainedCallFrame(r->tool_call_format);
  spec.prefix = frame.prefix;
  spec.suffix = frame.suffix;
  return std::nullopt;
}

// The prompt's text within the byte budget, tokenized. Its token count is
// checked by the caller, after the context-length check that names OpenAI's
// code.
std::optional<ApiError> EncodeWithinBudget(const std::string& text, bool add_bos,
                                           const RequestLimits& limits, const std::string& param,
                                           const Tokenizer& tokenizer, std::vector<int32_t>* ids) {
  if (absl::Status s = CheckPromptBytes(text.size(), limits, param); !s.ok()) {
    return ApiErrorFromStatus(s, param);
  }
  *ids = tokenizer.Encode(text, add_bos);
  return std::nullopt;
}

std::optional<ApiError> ParsePrompt(ApiKind kind, const json& body, const std::string& raw_body,
                                    const ApiContext& ctx, const RequestLimits& limits,
                                    ApiRequest* r) {
  const int vocab = ctx.tokenizer->vocab_size();
  std::vector<int32_t>& ids = r->request.prompt_token_ids;
  if (kind == ApiKind::kChat) {
    const json* messages = Member(body, "messages");
    if (messages == nullptr) return InvalidRequest("messages", "'messages' is required");
    if (!messages->is_array()) return WrongType("messages", "an array of messages", *messages);
    if (messages->empty()) return InvalidRequest("messages", "'messages' must not be empty");
    std::vector<ChatMessage> chat;
    size_t content_bytes = 0;
    for (size_t k = 0; k < messages->size(); ++k) {
      const json& m = (*messages)[k];
      std::string param = absl::StrCat("messages[", k, "]");
      if (!m.is_object()) return WrongType(param, "an object", m);
      auto role = m.find("role");
      if (role == m.end() || !role->is_string() || role->get<std::string>().empty()) {
        return InvalidRequest(param + ".role",
                              absl::StrCat("'", param, ".role' must be a non-empty string"));
      }
      if (const json* calls = Member(m, "tool_calls"); calls != nullptr && !calls->is_array()) {
        return WrongType(param + ".tool_calls", "an array of tool calls", *calls);
      }
      ChatMessage cm{role->get<std::string>(), ""};
      API_TRY(MessageContent(m, k, &cm.content));
      content_bytes += cm.content.size();
      chat.push_back(std::move(cm));
    }
    // The contents alone over the budget: refused before rendering.
    if (absl::Status s = CheckPromptBytes(content_bytes, limits, "messages"); !s.ok()) {
      return ApiErrorFromStatus(s, "messages");
    }
    ChatRenderOptions options;
    std::optional<bool> b;
    API_TRY(GetBool(body, "add_generation_prompt", &b));
    options.add_generation_prompt = b.value_or(true);
    if (ctx.chat_template->from_checkpoint()) {
      API_TRY(ChatTemplateInputs(body, raw_body, &chat, &options));
    }
    absl::StatusOr<std::string> prompt = ctx.chat_template->Render(chat, options);
    if (!prompt.ok()) {
      return InvalidRequest("messages",
                            absl::StrCat("'messages' cannot be rendered with the model's chat "
                                         "template: ",
                                         prompt.status().message()));
    }
    return EncodeWithinBudget(*prompt, ctx.chat_template->add_bos(), limits, "messages",
                              *ctx.tokenizer, &ids);
  }

  const json* prompt = Member(body, "prompt");
  if (prompt == nullptr) return InvalidRequest("prompt", "'prompt' is required");
  const json* p = prompt;
  if (p->is_array() && p->size() == 1 && ((*p)[0].is_string() || (*p)[0].is_array())) {
    p = &(*p)[0];  // [string] or [[ids]]: one prompt
  } else if (p->is_array() && !p->empty() && ((*p)[0].is_string() || (*p)[0].is_array())) {
    return InvalidRequest("prompt",
                          "batched prompts are not supported: send one prompt per request");
  }
  if (p->is_string()) {
    r->echo_text = p->get<std::string>();
    return EncodeWithinBudget(r->echo_text, /*add_bos=*/true, limits, "prompt", *ctx.tokenizer,
                              &ids);
  }
  if (p->is_array()) {
    if (p->empty()) return InvalidRequest("prompt", "'prompt' must not be empty");
    if (absl::Status s = CheckPromptTokens(p->size(), limits, "prompt"); !s.ok()) {
      return ApiErrorFromStatus(s, "prompt");
    }
    API_TRY(GetTokenIds(*p, "prompt", vocab, &ids));
    r->echo_text = SanitizeUtf8(ctx.tokenizer->Decode(ids));
    return std::nullopt;
  }
  return WrongType("prompt", "a string, an array of one string or an array of token ids", *prompt);
}

}  // namespace

nlohmann::json ApiError::ToJson() const {
  json e = {{"message", message}, {"type", type}, {"param", nullptr}, {"code", nullptr}};
  if (!param.empty()) e["param"] = param;
  if (!code.empty()) e["code"] = code;
  return json{{"error", e}};
}

std::string ApiError::Body() const { return DumpJson(ToJson()); }

ApiError InvalidRequest(std::string param, std::string message) {
  ApiError e;
  e.param = std::move(param);
  e.message = std::move(message);
  return e;
}

ApiError ApiErrorFromStatus(const absl::Status& status, const std::string& prompt_param) {
  ApiError e;
  e.message = std::string(status.message());
  switch (status.code()) {
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kOutOfRange: {
      e.http_status = 400;
      const std::string field = ErrorField(status);
      e.param = field == "prompt" || field == "prompt_token_ids" ? prompt_param : field;
      break;
    }
    case absl::StatusCode::kResourceExhausted:
      e.http_status = 429;
      e.type = "rate_limit_exceeded";
      e.code = IsClientLimitError(status) ? "concurrency_limit_exceeded" : "queue_full";
      break;
    case absl::StatusCode::kUnavailable:
      e.http_status = 503;
      e.type = "service_unavailable";
      break;
    default:
      e.http_status = 500;
      e.type = "server_error";
      break;
  }
  return e;
}

std::optional<ApiError> ParseApiRequest(ApiKind kind, const std::string& body,
                                        const ApiContext& ctx, ApiRequest* out) {
  std::variant<json, JsonBodyError> parsed = ParseJsonBody(body, kMaxJsonDepth);
  if (const JsonBodyError* err = std::get_if<JsonBodyError>(&parsed)) {
    return InvalidRequest(err->path, err->message);
  }
  const json& j = std::get<json>(parsed);
  if (!j.is_object()) return InvalidRequest("", "the request body must be a JSON object");

  ApiRequest r;
  r.request.sampling = ctx.default_sampling;
  r.kind = kind;
  GenerateRequest& g = r.request;
  const std::string prompt_param = kind == ApiKind::kChat ? "messages" : "prompt";

  std::optional<std::string> s;
  API_TRY(GetString(j, "model", &s));
  r.model = s.value_or(ctx.model_name);
  if (r.model != ctx.model_name) {
    ApiError e = InvalidRequest(
        "model", absl::StrCat("The model '", CapClientText(r.model, 256),
                              "' does not exist; this server serves '", ctx.model_name, "'"));
    e.http_status = 404;
    e.code = "model_not_found";
    return e;
  }

  std::optional<bool> b;
  API_TRY(GetBool(j, "stream", &b));
  r.stream = b.value_or(false);
  if (const json* so = Member(j, "stream_options")) {
    if (!so->is_object()) return WrongType("stream_options", "an object", *so);
    b.reset();
    API_TRY(GetBool(*so, "include_usage", &b));
    r.include_usage = b.value_or(false);
  }

  API_TRY(ParseSampling(j, &r));
  API_TRY(ParseStructuredOutput(j, body, &g.constraint));
  if (kind == ApiKind::kChat) API_TRY(ParseToolChoice(j, body, ctx, &r));

  std::optional<int64_t> i;
  API_TRY(GetInt(j, "n", &i));
  if (i) {
    if (*i < std::numeric_limits<int32_t>::min() || *i > std::numeric_limits<int32_t>::max()) {
      return OutOfRange("n", "a 32-bit integer", Num(*i));
    }
    g.n = static_cast<int32_t>(*i);
  }
  i.reset();
  API_TRY(GetInt(j, "best_of", &i));
  if (i && *i != g.n) {
    return InvalidRequest("best_of", "'best_of' other than n is not supported");
  }

  std::optional<int64_t> max_tokens;
  const char* max_tokens_param = "max_tokens";
  API_TRY(GetInt(j, "max_tokens", &max_tokens));
  if (kind == ApiKind::kChat) {
    std::optional<int64_t> mct;
    API_TRY(GetInt(j, "max_completion_tokens", &mct));
    if (mct) {
      max_tokens = mct;
      max_tokens_param = "max_completion_tokens";
    }
  }
  if (max_tokens && (*max_tokens < 1 || *max_tokens > std::numeric_limits<int32_t>::max())) {
    return OutOfRange(max_tokens_param, "in [1, 2^31)", Num(*max_tokens));
  }

  RequestLimits limits = ResolveRequestLimits(ctx.limits, ctx.max_model_len);
  limits.vocab_size = ctx.tokenizer->vocab_size();
  API_TRY(ParseStops(j, limits, &g));

  b.reset();
  API_TRY(GetBool(j, "ignore_eos", &b));
  g.ignore_eos = b.value_or(false);
  s.reset();
  API_TRY(GetString(j, "cache_salt", &s));
  g.cache_salt = s.value_or("");
  s.reset();
  API_TRY(ParseKvPolicy(j, &g.kv_policy));
  API_TRY(GetString(j, "user", &s));
  r.user = s.value_or("");
  i.reset();
  API_TRY(GetInt(j, "priority", &i));
  if (i) {
    if (*i < std::numeric_limits<int32_t>::min() || *i > std::numeric_limits<int32_t>::max()) {
      return OutOfRange("priority", "a 32-bit integer", Num(*i));
    }
    g.priority = static_cast<int32_t>(*i);
  }

  // logprobs: an int on completions, a bool plus top_logprobs on chat.
  if (kind == ApiKind::kCompletion) {
    i.reset();
    API_TRY(GetInt(j, "logprobs", &i));
    if (i) {
      if (*i < 0 || *i > std::numeric_limits<int32_t>::max()) {
        return OutOfRange("logprobs", "a non-negative integer", Num(*i));
      }
      g.logprobs = static_cast<int32_t>(*i);
    }
    b.reset();
    API_TRY(GetBool(j, "echo", &b));
    r.echo = b.value_or(false);
    s.reset();
    API_TRY(GetString(j, "suffix", &s));
    if (s && !s->empty()) return InvalidRequest("suffix", "'suffix' is not supported");
  } else {
    b.reset();
    API_TRY(GetBool(j, "logprobs", &b));
    i.reset();
    API_TRY(GetInt(j, "top_logprobs", &i));
    if (i && (*i < 0 || *i > std::numeric_limits<int32_t>::max())) {
      return OutOfRange("top_logprobs", "a non-negative integer", Num(*i));
    }
    if (i && !b.value_or(false)) {
      return InvalidRequest("top_logprobs", "'top_logprobs' requires 'logprobs': true");
    }
    if (b.value_or(false)) g.logprobs = static_cast<int32_t>(i.value_or(0));
  }
  if (const json* bias = Member(j, "logit_bias")) {
    if (!bias->is_object()) return WrongType("logit_bias", "an object", *bias);
    if (!bias->empty()) return InvalidRequest("logit_bias", "'logit_bias' is not supported");
  }

  // Everything but the prompt is checked before the prompt is tokenized
  // (max_tokens, when absent, waits for the prompt's length).
  g.max_tokens = static_cast<int32_t>(max_tokens.value_or(1));
  if (absl::Status v = ValidateRequestParams(g, limits); !v.ok()) {
    ApiError e = ApiErrorFromStatus(v, prompt_param);
    if (e.param == "max_tokens") e.param = max_tokens_param;
    if (e.param == "logprobs" && kind == ApiKind::kChat) e.param = "top_logprobs";
    return e;
  }
  API_TRY(ParsePrompt(kind, j, body, ctx, limits, &r));
  const int64_t prompt_len = static_cast<int64_t>(g.prompt_token_ids.size());
  const std::string& policy =
      g.kv_policy.policy.empty() ? ctx.default_kv_policy : g.kv_policy.policy;
  // These keep every relative position within their budget (the engine
  // checks the rest).
  const bool unbounded = policy == "streaming" || policy == "sliding_window";
  if (unbounded) {
    if (!max_tokens) {
      max_tokens =
          kind == ApiKind::kChat ? std::max<int64_t>(16, ctx.max_model_len - prompt_len) : 16;
    }
  } else if (prompt_len >= ctx.max_model_len) {
    ApiError e = InvalidRequest(
        prompt_param, absl::StrCat("This model's maximum context length is ", ctx.max_model_len,
                                   " tokens, and the prompt has ", prompt_len,
                                   " tokens, leaving no room for the completion"));
    e.code = "context_length_exceeded";
    return e;
  }
  if (absl::Status t = CheckPromptTokens(prompt_len, limits, prompt_param); !t.ok()) {
    return ApiErrorFromStatus(t, prompt_param);
  }
  if (!max_tokens) {
    max_tokens = kind == ApiKind::kChat ? ctx.max_model_len - prompt_len : 16;
  }
  if (!unbounded && prompt_len + *max_tokens > ctx.max_model_len) {
    ApiError e = InvalidRequest(
        max_tokens_param,
        absl::StrCat("This model's maximum context length is ", ctx.max_model_len, " tokens, but ",
                     prompt_len + *max_tokens, " were requested (", prompt_len, " in the prompt, ",
                     *max_tokens, " for the completion)"));
    e.code = "context_length_exceeded";
    return e;
  }
  g.max_tokens = static_cast<int32_t>(*max_tokens);
  if (absl::Status v = ValidateRequestParams(g, limits); !v.ok()) {
    ApiError e = ApiErrorFromStatus(v, prompt_param);
    // The engine's field names, as this request spelled them.
    if (e.param == "max_tokens") e.param = max_tokens_param;
    if (e.param == "logprobs" && kind == ApiKind::kChat) e.param = "top_logprobs";
    return e;
  }
  *out = std::move(r);
  return std::nullopt;
}

}  // namespace kvserve

#include "server/openai/tokenize.h"

#include <variant>
#include <vector>

#include "absl/strings/str_cat.h"
#include "scheduler/detokenizer.h"
#include "server/openai/json_body.h"

namespace kvserve {
namespace {

using json = nlohmann::json;

std::optional<ApiError> ParseBody(const std::string& body, const ApiContext& ctx, json* out) {
  std::variant<json, JsonBodyError> parsed = ParseJsonBody(body, kMaxJsonDepth);
  if (const JsonBodyError* err = std::get_if<JsonBodyError>(&parsed)) {
    return InvalidRequest(err->path, err->message);
  }
  *out = std::move(std::get<json>(parsed));
  if (!out->is_object()) return InvalidRequest("", "the request body must be a JSON object");
  auto model = out->find("model");
  if (model != out->end() && !model->is_null()) {
    if (!model->is_string()) return InvalidRequest("model", "'model' must be a string");
    if (model->get<std::string>() != ctx.model_name) {
      ApiError e = InvalidRequest(
          "model", absl::StrCat("The model '", CapClientText(model->get<std::string>(), 256),
                                "' does not exist; this server serves '", ctx.model_name, "'"));
      e.http_status = 404;
      e.code = "model_not_found";
      return e;
    }
  }
  return std::nullopt;
}

std::optional<ApiError> GetFlag(const json& j, const char* name, bool fallback, bool* out) {
  *out = fallback;
  auto it = j.find(name);
  if (it == j.end() || it->is_null()) return std::nullopt;
  if (!it->is_boolean())
    return InvalidRequest(name, absl::StrCat("'", name, "' must be a boolean"));
  *out = it->get<bool>();
  return std::nullopt;
}

}  // namespace

std::optional<ApiError> Tokenize(const std::string& body, const ApiContext& ctx, json* response) {
  json j;
  if (auto e = ParseBody(body, ctx, &j)) return e;
  bool token_strs = false;
  if (auto e = GetFlag(j, "return_token_strs", false, &token_strs)) return e;
  std::vector<int32_t> ids;
  const bool has_messages = j.contains("messages") && !j["messages"].is_null();
  if (has_messages) {
    // The chat route's own parse renders and tokenizes the messages; only
    // what shapes the prompt is kept.
    json chat = json::object();
    for (const char* k : {"messages", "tools", "add_generation_prompt", "chat_template_kwargs"}) {
      if (j.contains(k)) chat[k] = j[k];
    }
    chat["max_tokens"] = 1;
    ApiContext c = ctx;
    c.max_model_len = std::numeric_limits<int32_t>::max();
    c.limits.max_prompt_tokens = 0;
    ApiRequest r;
    if (auto e = ParseApiRequest(ApiKind::kChat, DumpJson(chat), c, &r)) return e;
    ids = std::move(r.request.prompt_token_ids);
  } else {
    auto prompt = j.find("prompt");
    if (prompt == j.end() || !prompt->is_string()) {
      return InvalidRequest("prompt", "'prompt' (a string) or 'messages' is required");
    }
    bool special = true;
    if (auto e = GetFlag(j, "add_special_tokens", true, &special)) return e;
    if (ctx.limits.max_prompt_bytes > 0 && prompt->get_ref<const std::string&>().size() >
                                               static_cast<size_t>(ctx.limits.max_prompt_bytes)) {
      return InvalidRequest(
          "prompt", absl::StrCat("'prompt' is over ", ctx.limits.max_prompt_bytes, " bytes"));
    }
    ids = ctx.tokenizer->Encode(prompt->get<std::string>(), special);
  }
  json strs = nullptr;
  if (token_strs) {
    strs = json::array();
    for (int32_t id : ids) strs.push_back(ctx.tokenizer->IdToPiece(id));
  }
  *response = json{{"count", ids.size()},
                   {"max_model_len", ctx.max_model_len},
                   {"tokens", ids},
                   {"token_strs", strs}};
  return std::nullopt;
}

std::optional<ApiError> Detokenize(const std::string& body, const ApiContext& ctx, json* response) {
  json j;
  if (auto e = ParseBody(body, ctx, &j)) return e;
  auto tokens = j.find("tokens");
  if (tokens == j.end() || !tokens->is_array()) {
    return InvalidRequest("tokens", "'tokens' (an array of token ids) is required");
  }
  std::vector<int32_t> ids;
  const int vocab = ctx.tokenizer->vocab_size();
  for (size_t i = 0; i < tokens->size(); ++i) {
    const json& t = (*tokens)[i];
    if (!t.is_number_integer() || t.get<int64_t>() < 0 || t.get<int64_t>() >= vocab) {
      const std::string param = absl::StrCat("tokens[", i, "]");
      return InvalidRequest(param,
                            absl::StrCat("'", param, "' must be a token id in [0, ", vocab, ")"));
    }
    ids.push_back(static_cast<int32_t>(t.get<int64_t>()));
  }
  *response = json{{"prompt", SanitizeUtf8(ctx.tokenizer->Decode(ids))}};
  return std::nullopt;
}

}  // namespace kvserve

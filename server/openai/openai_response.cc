// Response rendering of the OpenAI wire format (server/openai/openai_protocol.h):
// finish reasons, usage, logprobs, whole responses and streamed chunks.
#include <utility>

#include "absl/strings/str_cat.h"
#include "scheduler/detokenizer.h"
#include "server/openai/openai_protocol.h"
#include "server/openai/tool_calls.h"

namespace kvserve {

using json = nlohmann::json;

nlohmann::json FinishReasonJson(FinishReason reason) {
  switch (reason) {
    case FinishReason::kNone:
      return nullptr;
    case FinishReason::kStop:
      return "stop";
    case FinishReason::kLength:
      return "length";
    case FinishReason::kCancelled:
      return "abort";
    case FinishReason::kError:
      return "error";
  }
  return nullptr;
}

nlohmann::json UsageJson(const Usage& usage) {
  return json{{"prompt_tokens", usage.prompt_tokens},
              {"completion_tokens", usage.completion_tokens},
              {"total_tokens", usage.prompt_tokens + usage.completion_tokens},
              {"prompt_tokens_details", {{"cached_tokens", usage.cached_prompt_tokens}}}};
}

std::string DumpJson(const nlohmann::json& j) {
  return j.dump(-1, ' ', false, json::error_handler_t::replace);
}

// ---- logprobs ----------------------------------------------------------------

std::string LogprobFormatter::TokenText(int32_t id, int32_t prev) const {
  return SanitizeUtf8(tokenizer_->TokenBytes(id, prev));
}

void LogprobFormatter::Append(int32_t index, const std::vector<TokenLogprob>& logprobs,
                              nlohmann::json* into) {
  // OpenAI writes -9999 where a probability underflows; JSON has no -inf.
  auto finite = [](float lp) { return std::isfinite(lp) ? static_cast<double>(lp) : -9999.0; };
  auto bytes = [this](int32_t id, int32_t prev) {
    json b = json::array();
    for (unsigned char c : tokenizer_->TokenBytes(id, prev)) b.push_back(static_cast<int>(c));
    return b;
  };
  if (into->is_null()) {
    *into = kind_ == ApiKind::kChat ? json{{"content", json::array()}}
                                    : json{{"tokens", json::array()},
                                           {"token_logprobs", json::array()},
                                           {"top_logprobs", json::array()},
                                           {"text_offset", json::array()}};
  }
  auto [it, inserted] = prev_.try_emplace(index, last_prompt_token_);
  int32_t& prev = it->second;
  int64_t& offset = text_offset_[index];
  for (const TokenLogprob& tl : logprobs) {
    std::string text = TokenText(tl.token_id, prev);
    if (kind_ == ApiKind::kChat) {
      json top = json::array();
      for (const auto& [id, lp] : tl.top) {
        top.push_back(
            {{"token", TokenText(id, prev)}, {"logprob", finite(lp)}, {"bytes", bytes(id, prev)}});
      }
      (*into)["content"].push_back({{"token", text},
                                    {"logprob", finite(tl.logprob)},
                                    {"bytes", bytes(tl.token_id, prev)},
                                    {"top_logprobs", top}});
    } else {
      (*into)["tokens"].push_back(text);
      (*into)["token_logprobs"].push_back(finite(tl.logprob));
      if (tl.top.empty()) {
        (*into)["top_logprobs"].push_back(nullptr);
      } else {
        json top = json::object();
        for (const auto& [id, lp] : tl.top) top[TokenText(id, prev)] = finite(lp);
        (*into)["top_logprobs"].push_back(top);
      }
      (*into)["text_offset"].push_back(offset);
    }
    offset += static_cast<int64_t>(text.size());
    prev = tl.token_id;
  }
}

// ---- whole responses -----------------------------------------------------------

namespace {
int32_t LastPromptToken(const ApiRequest& r) {
  return r.request.prompt_token_ids.empty() ? -1 : r.request.prompt_token_ids.back();
}
}  // namespace

ResponseAccumulator::ResponseAccumulator(const ApiRequest& request, const Tokenizer* tokenizer)
    : kind_(request.kind),
      want_logprobs_(request.request.logprobs >= 0),
      parse_tool_calls_(request.parse_tool_calls),
      tool_call_format_(request.tool_call_format),
      choices_(static_cast<size_t>(request.request.n)),
      logprob_formatter_(request.kind, tokenizer, LastPromptToken(request)) {
  if (request.echo) {
    for (Choice& c : choices_) c.text = request.echo_text;
  }
}

void ResponseAccumulator::Add(const GenerateOutput& out) {
  if (out.index < 0 || out.index >= static_cast<int32_t>(choices_.size())) return;
  Choice& c = choices_[static_cast<size_t>(out.index)];
  c.text += out.text;
  if (want_logprobs_ && !out.logprobs.empty()) {
    logprob_formatter_.Append(out.index, out.logprobs, &c.logprobs);
  }
  if (out.finish_reason != FinishReason::kNone) c.finish = out.finish_reason;
  if (out.finish_reason == FinishReason::kError && error_.empty()) {
    error_ = out.error.empty() ? "generation failed" : out.error;
  }
  if (out.request_finished) usage_ = out.usage;
}

nlohmann::json ResponseAccumulator::ToJson(const std::string& id, int64_t created,
                                           const std::string& model) const {
  json choices = json::array();
  for (size_t k = 0; k < choices_.size(); ++k) {
    const Choice& c = choices_[k];
    json logprobs = want_logprobs_ && c.logprobs.is_null()
                        ? (kind_ == ApiKind::kChat ? json{{"content", json::array()}} : json())
                        : c.logprobs;
    if (kind_ == ApiKind::kChat && parse_tool_calls_ && c.finish == FinishReason::kStop) {
      ParsedToolCalls parsed = ParseToolCalls(c.text, tool_call_format_);
      if (!parsed.calls.empty()) {
        json content = parsed.content.empty() ? json() : json(parsed.content);
        choices.push_back(
            {{"index", k},
             {"message",
              {{"role", "assistant"},
               {"content", content},
               {"tool_calls", ToolCallsJson(parsed.calls, absl::StrCat(id, "_", k))}}},
             {"logprobs", logprobs},
             {"finish_reason", "tool_calls"}});
        continue;
      }
    }
    if (kind_ == ApiKind::kChat) {
      choices.push_back({{"index", k},
                         {"message", {{"role", "assistant"}, {"content", c.text}}},
                         {"logprobs", logprobs},
                         {"finish_reason", FinishReasonJson(c.finish)}});
    } else {
      choices.push_back({{"index", k},
                         {"text", c.text},
                         {"logprobs", logprobs},
                         {"finish_reason", FinishReasonJson(c.finish)}});
    }
  }
  return json{{"id", id},
              {"object", kind_ == ApiKind::kChat ? "chat.completion" : "text_completion"},
              {"created", created},
              {"model", model},
              {"choices", choices},
              {"usage", UsageJson(usage_)}};
}

// ---- streaming --------------------------------------------------------------------

StreamFormatter::StreamFormatter(const ApiRequest& request, const Tokenizer* tokenizer,
                                 std::string id, int64_t created, std::string model)
    : kind_(request.kind),
      want_logprobs_(request.request.logprobs >= 0),
      include_usage_(request.include_usage),
      echo_(request.echo),
      echo_text_(request.echo_text),
      n_(request.request.n),
      id_(std::move(id)),
      created_(created),
      model_(std::move(model)),
      parse_tool_calls_(request.parse_tool_calls),
      tool_call_format_(request.tool_call_format),
      logprob_formatter_(request.kind, tokenizer, LastPromptToken(request)) {}

nlohmann::json StreamFormatter::Chunk(nlohmann::json choices) const {
  json chunk = {{"id", id_},
                {"object", kind_ == ApiKind::kChat ? "chat.completion.chunk" : "text_completion"},
                {"created", created_},
                {"model", model_},
                {"choices", std::move(choices)}};
  if (include_usage_) chunk["usage"] = nullptr;
  return chunk;
}

std::string StreamFormatter::Event(const nlohmann::json& chunk) const {
  return absl::StrCat("data: ", DumpJson(chunk), "\n\n");
}

std::string StreamFormatter::Start() {
  std::string events;
  for (int32_t k = 0; k < n_; ++k) {
    if (kind_ == ApiKind::kChat) {
      events += Event(Chunk(json::array({{{"index", k},
                                          {"delta", {{"role", "assistant"}, {"content", ""}}},
                                          {"logprobs", nullptr},
                                          {"finish_reason", nullptr}}})));
    } else if (echo_ && !echo_text_.empty()) {
      events += Event(Chunk(json::array({{{"index", k},
                                          {"text", echo_text_},
                                          {"logprobs", nullptr},
                                          {"finish_reason", nullptr}}})));
    }
  }
  return events;
}

std::string StreamFormatter::Add(const GenerateOutput& out) {
  if (out.request_finished) usage_ = out.usage;
  if (out.finish_reason == FinishReason::kError) {
    ApiError e;
    e.http_status = 500;
    e.type = "server_error";
    e.message = out.error.empty() ? "generation failed" : out.error;
    return Event(e.ToJson());
  }
  json logprobs;
  if (want_logprobs_ && !out.logprobs.empty()) {
    logprob_formatter_.Append(out.index, out.logprobs, &logprobs);
  }
  const bool finished = out.finish_reason != FinishReason::kNone;
  std::string events;
  if (kind_ == ApiKind::kChat) {
    // With tools the text is held until the sample ends: then it is either
    // tool calls (delta.tool_calls) or content.
    std::string_view text = out.text;
    if (parse_tool_calls_) {
      held_[out.index] += out.text;
      text = {};
    }
    if (!text.empty() || !logprobs.is_null()) {
      events += Event(Chunk(json::array({{{"index", out.index},
                                          {"delta", {{"content", text}}},
                                          {"logprobs", logprobs},
                                          {"finish_reason", nullptr}}})));
    }
    if (finished && parse_tool_calls_) {
      const std::string held = std::move(held_[out.index]);
      held_.erase(out.index);
      ParsedToolCalls parsed = out.finish_reason == FinishReason::kStop
                                   ? ParseToolCalls(held, tool_call_format_)
                                   : ParsedToolCalls{held, {}};
      if (!parsed.calls.empty()) {
        json calls = ToolCallsJson(parsed.calls, absl::StrCat(id_, "_", out.index));
        for (size_t c = 0; c < calls.size(); ++c) calls[c]["index"] = c;
        json delta = {{"tool_calls", calls}};
        if (!parsed.content.empty()) delta["content"] = parsed.content;
        events += Event(Chunk(json::array({{{"index", out.index},
                                            {"delta", delta},
                                            {"logprobs", nullptr},
                                            {"finish_reason", nullptr}}})));
        events += Event(Chunk(json::array({{{"index", out.index},
                                            {"delta", json::object()},
                                            {"logprobs", nullptr},
                                            {"finish_reason", "tool_calls"}}})));
        return events;
      }
      if (!held.empty()) {
        events += Event(Chunk(json::array({{{"index", out.index},
                                            {"delta", {{"content", held}}},
                                            {"logprobs", nullptr},
                                            {"finish_reason", nullptr}}})));
      }
    }
    if (finished) {
      events +=
          Event(Chunk(json::array({{{"index", out.index},
                                    {"delta", json::object()},
                                    {"logprobs", nullptr},
                                    {"finish_reason", FinishReasonJson(out.finish_reason)}}})));
    }
  } else if (!out.text.empty() || !logprobs.is_null() || finished) {
    events += Event(Chunk(json::array({{{"index", out.index},
                                        {"text", out.text},
                                        {"logprobs", logprobs},
                                        {"finish_reason", FinishReasonJson(out.finish_reason)}}})));
  }
  return events;
}

std::string StreamFormatter::Finish() {
  std::string events;
  if (include_usage_) {
    json chunk = Chunk(json::array());
    chunk["usage"] = UsageJson(usage_);
    events += Event(chunk);
  }
  events += "data: [DONE]\n\n";
  return events;
}

}  // namespace kvserve

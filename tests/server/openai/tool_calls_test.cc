// Tool-call text of each model family parsed into OpenAI tool_calls, and
// chat responses that carry them with finish_reason tool_calls.
#include "server/openai/tool_calls.h"

#include <catch2/catch.hpp>
#include <memory>
#include <string>
#include <vector>

#include "model/chat/hf_chat_template.h"
#include "model/grammar/grammar_compiler.h"
#include "model/grammar/grammar_matcher.h"
#include "server/openai/openai_protocol.h"

namespace kvserve {
namespace {

using json = nlohmann::json;

// A request context on a 512-token byte-level tokenizer and the plain chat
// template, serving "tiny" with 4096 positions.
struct TinyChat {
  decltype(Tokenizer::ByteLevel(512)) tokenizer = Tokenizer::ByteLevel(512);
  ChatTemplate chat_template;
  ApiContext ctx;
  TinyChat() {
    ctx.tokenizer = tokenizer.get();
    ctx.chat_template = &chat_template;
    ctx.model_name = "tiny";
    ctx.max_model_len = 4096;
  }
};

TEST_CASE("Tool calls: Hermes tags Llama-3 JSON and Mistral arrays parse", "[server]") {
  ParsedToolCalls p = ParseToolCalls(
      "Let me look.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": "
      "\"Oslo\"}}\n</tool_call>\n<tool_call>{\"name\": \"now\", \"arguments\": {}}</tool_call>",
      ToolCallFormat::kAuto);
  REQUIRE(p.calls.size() == 2);
  CHECK(p.content == "Let me look.");
  CHECK(p.calls[0].name == "get_weather");
  CHECK(p.calls[0].arguments == R"({"city":"Oslo"})");
  CHECK(p.calls[1].name == "now");
  CHECK(p.calls[1].arguments == "{}");

  p = ParseToolCalls(R"(<|python_tag|>{"name": "f", "parameters": {"x": 1}})",
                     ToolCallFormat::kLlama3Json);
  REQUIRE(p.calls.size() == 1);
  CHECK(p.calls[0].name == "f");
  CHECK(p.calls[0].arguments == R"({"x":1})");
  CHECK(p.content.empty());
  p = ParseToolCalls(R"({"name": "a", "parameters": {}}; {"name": "b", "parameters": {"y": 2}})",
                     ToolCallFormat::kAuto);
  REQUIRE(p.calls.size() == 2);
  CHECK(p.calls[1].name == "b");

  p = ParseToolCalls(R"([TOOL_CALLS][{"name": "g", "arguments": "{\"k\": true}"}])",
                     ToolCallFormat::kMistral);
  REQUIRE(p.calls.size() == 1);
  CHECK(p.calls[0].arguments == R"({"k": true})");

  // Not a call: the text stays content.
  p = ParseToolCalls("The weather is fine.", ToolCallFormat::kAuto);
  CHECK(p.calls.empty());
  CHECK(p.content == "The weather is fine.");
  p = ParseToolCalls("<tool_call>{\"nam\": 1}</tool_call>", ToolCallFormat::kHermes);
  CHECK(p.calls.empty());
  CHECK(p.content == "<tool_call>{\"nam\": 1}</tool_call>");
}

TEST_CASE("Tool calls: a chat response with tools carries message.tool_calls", "[server]") {
  TinyChat t;
  ApiContext& ctx = t.ctx;
  const std::string tools =
      R"("tools": [{"type": "function", "function": {"name": "get_weather", "parameters": {}}}])";
  ApiRequest r;
  REQUIRE_FALSE(ParseApiRequest(
      ApiKind::kChat, R"({"messages": [{"role": "user", "content": "hi"}], "n": 2, )" + tools + "}",
      ctx, &r));
  REQUIRE(r.parse_tool_calls);
  ResponseAccumulator acc(r, t.tokenizer.get());
  GenerateOutput out;
  out.index = 0;
  out.text = R"(<tool_call>{"name": "get_weather", "arguments": {"city": "Oslo"}}</tool_call>)";
  out.finish_reason = FinishReason::kStop;
  acc.Add(out);
  out.index = 1;
  out.text = "No tool needed.";
  acc.Add(out);
  const json j = acc.ToJson("chatcmpl-1", 0, "tiny");
  CHECK(j["choices"][0]["finish_reason"] == "tool_calls");
  CHECK(j["choices"][0]["message"] ==
        json::parse(R"({"role": "assistant", "content": null, "tool_calls": [{"id":
          "call_chatcmpl-1_0_0", "type": "function", "function": {"name": "get_weather",
          "arguments": "{\"city\":\"Oslo\"}"}}]})"));
  CHECK(j["choices"][1]["finish_reason"] == "stop");
  CHECK(j["choices"][1]["message"]["content"] == "No tool needed.");

  ApiRequest none;
  REQUIRE_FALSE(ParseApiRequest(
      ApiKind::kChat,
      R"({"messages": [{"role": "user", "content": "hi"}], "tool_choice": "none", )" + tools + "}",
      ctx, &none));
  CHECK_FALSE(none.parse_tool_calls);
  std::optional<ApiError> e = ParseApiRequest(
      ApiKind::kChat,
      R"({"messages": [{"role": "user", "content": "hi"}], "tool_choice": {"type": "function",
          "function": {"name": "other"}}, )" +
          tools + "}",
      ctx, &none);
  REQUIRE(e);
  CHECK(e->param == "tool_choice.function.name");
  CHECK(e->message == "'tool_choice.function.name' names 'other', which is not one of 'tools'");
  e = ParseApiRequest(ApiKind::kChat,
                      R"({"messages": [{"role": "user", "content": "hi"}], "tool_choice": "any"})",
                      ctx, &none);
  REQUIRE(e);
  CHECK(e->param == "tool_choice");
}

TEST_CASE("Tool calls: required and a named function constrain decoding to a call", "[server]") {
  TinyChat t;
  ApiContext& ctx = t.ctx;
  const std::string head = R"({"messages": [{"role": "user", "content": "hi"}], "tools": [
      {"type": "function", "function": {"name": "f", "parameters": {"type": "object",
        "properties": {"z": {"type": "integer"}, "a": {"type": "string"}}, "required": ["z"]}}},
      {"type": "function", "function": {"name": "g"}}], )";
  ApiRequest r;
  REQUIRE_FALSE(ParseApiRequest(ApiKind::kChat, head + R"("tool_choice": "required"})", ctx, &r));
  CHECK(r.parse_tool_calls);
  CHECK(r.request.constraint.kind == GrammarSpec::Kind::kJsonSchema);
  CHECK(r.request.constraint.field == "tools");
  const std::string f_call =
      R"({"type":"object","properties":{"name":{"const":"f"},"arguments":{"type":"object",)"
      R"("properties":{"z":{"type":"integer"},"a":{"type":"string"}},"required":["z"]}},)"
      R"("required":["name","arguments"],"additionalProperties":false})";
  const std::string g_call =
      R"({"type":"object","properties":{"name":{"const":"g"},"arguments":{"type":"object"}},)"
      R"("required":["name","arguments"],"additionalProperties":false})";
  CHECK(r.request.constraint.text == R"({"anyOf":[)" + f_call + "," + g_call + "]}");
  ApiRequest named;
  REQUIRE_FALSE(ParseApiRequest(
      ApiKind::kChat, head + R"("tool_choice": {"type": "function", "function": {"name": "g"}}})",
      ctx, &named));
  CHECK(named.request.constraint.text == g_call);
  ApiRequest autod;
  REQUIRE_FALSE(ParseApiRequest(ApiKind::kChat, head + R"("tool_choice": "auto"})", ctx, &autod));
  CHECK(autod.request.constraint.empty());
  std::optional<ApiError> e = ParseApiRequest(
      ApiKind::kChat, head + R"("tool_choice": "required", "guided_regex": "x"})", ctx, &autod);
  REQUIRE(e);
  CHECK(e->param == "tool_choice");
  CHECK(e->message ==
        "'tool_choice' requires a tool call, but 'guided_regex' constrains the output too");
}

TEST_CASE("Tool calls: the family's format frames a constrained call and picks the parser",
          "[server]") {
  // The markers of each family's chat template.
  CHECK(DetectToolCallFormat("{{- '<tool_call>\\n' + tool_call | tojson }}") == "hermes");
  CHECK(DetectToolCallFormat("{{ '[TOOL_CALLS]' + tool_calls | tojson }}") == "mistral");
  CHECK(DetectToolCallFormat("{{- '<|python_tag|>' }}") == "llama3_json");
  CHECK(DetectToolCallFormat("<|start_header_id|>ipython<|end_header_id|>") == "llama3_json");
  CHECK(DetectToolCallFormat("{{ message.content }}").empty());
  CHECK(ToolCallFormatNamed("hermes") == ToolCallFormat::kHermes);
  CHECK(ToolCallFormatNamed("mistral") == ToolCallFormat::kMistral);
  CHECK(ToolCallFormatNamed("llama3_json") == ToolCallFormat::kLlama3Json);
  CHECK(ToolCallFormatNamed("") == ToolCallFormat::kAuto);

  TinyChat t;
  ApiContext& ctx = t.ctx;
  const std::string body = R"({"messages": [{"role": "user", "content": "hi"}], "tools": [
      {"type": "function", "function": {"name": "f"}}], "tool_choice": "required"})";
  struct Case {
    const char* format;
    const char* prefix;
    const char* suffix;
  };
  for (const Case& c :
       {Case{"", "", ""}, Case{"llama3_json", "", ""},
        Case{"hermes", "<tool_call>\n", "\n</tool_call>"}, Case{"mistral", "[TOOL_CALLS][", "]"}}) {
    INFO(c.format);
    t.chat_template.set_tool_call_format(c.format);
    ApiRequest r;
    REQUIRE_FALSE(ParseApiRequest(ApiKind::kChat, body, ctx, &r));
    CHECK(r.tool_call_format == ToolCallFormatNamed(c.format));
    CHECK(r.request.constraint.prefix == c.prefix);
    CHECK(r.request.constraint.suffix == c.suffix);
    // The framed call is in the grammar, and the format's parser reads it.
    GrammarBuilder b;
    REQUIRE(BuildGrammar(r.request.constraint, &b).ok());
    auto g = std::make_shared<const CompiledGrammar>(
        b.Lower(), std::make_shared<TokenVocab>(std::vector<std::string>{"x"}));
    const std::string call = std::string(c.prefix) + R"({"name":"f","arguments":{}})" + c.suffix;
    GrammarMatcher m(g);
    CHECK((m.AcceptBytes(call) && m.CanEnd()));
    GrammarMatcher bare(g);
    if (*c.prefix != '\0') CHECK_FALSE(bare.AcceptBytes(R"({"name")"));
    ParsedToolCalls parsed = ParseToolCalls(call, r.tool_call_format);
    REQUIRE(parsed.calls.size() == 1);
    CHECK(parsed.calls[0].name == "f");
    CHECK(parsed.content.empty());
  }
  // A known format reads only its own text: a Hermes block is content to the
  // Mistral parser, a call to every parser under kAuto.
  const std::string hermes = R"(<tool_call>{"name": "f", "arguments": {}}</tool_call>)";
  CHECK(ParseToolCalls(hermes, ToolCallFormat::kMistral).calls.empty());
  CHECK(ParseToolCalls(hermes, ToolCallFormat::kAuto).calls.size() == 1);
}

}  // namespace
}  // namespace kvserve

namespace kvserve {
namespace {

// The JSON payloads of SSE events.
std::vector<nlohmann::json> Events(const std::string& sse) {
  std::vector<nlohmann::json> out;
  size_t pos = 0;
  while ((pos = sse.find("data: ", pos)) != std::string::npos) {
    const size_t end = sse.find("\n\n", pos);
    const std::string data = sse.substr(pos + 6, end - pos - 6);
    if (data != "[DONE]") out.push_back(nlohmann::json::parse(data));
    pos = end;
  }
  return out;
}

TEST_CASE("Tool calls: a streamed chat response with tools ends in delta.tool_calls", "[server]") {
  TinyChat t;
  ApiContext& ctx = t.ctx;
  ApiRequest r;
  REQUIRE_FALSE(
      ParseApiRequest(ApiKind::kChat,
                      R"({"messages": [{"role": "user", "content": "hi"}], "stream": true, "n": 2,
          "tools": [{"type": "function", "function": {"name": "f"}}]})",
                      ctx, &r));
  StreamFormatter f(r, t.tokenizer.get(), "chatcmpl-9", 0, "tiny");
  std::string sse = f.Start();
  GenerateOutput out;
  out.index = 0;
  out.text = R"({"name": "f", )";
  sse += f.Add(out);
  CHECK(Events(sse).size() == 2);  // the role deltas only: the text is held
  out.text = R"("arguments": {"q": 1}})";
  out.finish_reason = FinishReason::kStop;
  sse += f.Add(out);
  out.index = 1;
  out.text = "plain words";
  sse += f.Add(out);
  const std::vector<nlohmann::json> ev = Events(sse);
  REQUIRE(ev.size() == 6);
  CHECK(ev[2]["choices"][0]["delta"] ==
        nlohmann::json::parse(R"({"tool_calls": [{"index": 0, "id": "call_chatcmpl-9_0_0",
          "type": "function", "function": {"name": "f", "arguments": "{\"q\":1}"}}]})"));
  CHECK(ev[3]["choices"][0]["finish_reason"] == "tool_calls");
  CHECK(ev[4]["choices"][0]["index"] == 1);
  CHECK(ev[4]["choices"][0]["delta"] == nlohmann::json{{"content", "plain words"}});
  CHECK(ev[5]["choices"][0]["finish_reason"] == "stop");
}

}  // namespace
}  // namespace kvserve

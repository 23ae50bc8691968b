// Request bodies that crashed the daemon, found with tests/fuzz
// (openai_request_fuzz.cc), as regression tests: JSON nested deep enough to
// overflow the stack when the parser copied it (tools, chat_template_kwargs)
// or when a chat template dumped a tool call's parsed arguments.
#include <catch2/catch.hpp>
#include <string>

#include "model/chat/chat_template.h"
#include "server/openai/openai_protocol.h"
#include "tests/server/openai/api_fixture.h"

namespace kvserve {
namespace {

// `levels` nested arrays around a 1: [[1]] for 2.
std::string NestedArrays(int levels) {
  return std::string(levels, '[') + "1" + std::string(levels, ']');
}

// `levels` nested objects around a 1: {"a": {"a": 1}} for 2.
std::string NestedObjects(int levels) {
  std::string s;
  for (int i = 0; i < levels; ++i) s += "{\"a\": ";
  s += "1";
  return s + std::string(levels, '}');
}

// A context long enough for the fuzzers' inputs.
struct Fixture : testing::ApiFixture {
  Fixture() { max_model_len = 4096; }
};

TEST_CASE("Request bodies nested too deep are refused before they reach the stack", "[server]") {
  Fixture f;
  ApiRequest r;
  SECTION("100,000 nested arrays in tools (used to overflow the stack)") {
    const std::string body = R"({"messages": [{"role": "user", "content": "x"}], "tools": [)" +
                             NestedArrays(100000) + "]}";
    std::optional<ApiError> e = ParseApiRequest(ApiKind::kChat, body, f.ctx(), &r);
    REQUIRE(e.has_value());
    REQUIRE(e->http_status == 400);
    REQUIRE(e->message == "the JSON body is nested more than 64 levels deep");
  }
  SECTION("the limit: 64 levels counting the body's own object") {
    // body (1) + chat_template_kwargs (1) + 62 arrays: the 1 sits at level 64.
    const std::string ok = R"({"messages": [{"role": "user", "content": "x"}], )"
                           R"("chat_template_kwargs": {"x": )" +
                           NestedArrays(62) + "}}";
    std::optional<ApiError> e = ParseApiRequest(ApiKind::kChat, ok, f.ctx(), &r);
    INFO((e ? e->message : ""));
    REQUIRE_FALSE(e.has_value());
    const std::string deep = R"({"messages": [{"role": "user", "content": "x"}], )"
                             R"("chat_template_kwargs": {"x": )" +
                             NestedArrays(63) + "}}";
    e = ParseApiRequest(ApiKind::kChat, deep, f.ctx(), &r);
    REQUIRE(e.has_value());
    REQUIRE(e->message == "the JSON body is nested more than 64 levels deep");
  }
  SECTION("completions too") {
    std::optional<ApiError> e =
        ParseApiRequest(ApiKind::kCompletion,
                        R"({"prompt": "x", "extra": )" + NestedObjects(70) + "}", f.ctx(), &r);
    REQUIRE(e.has_value());
    REQUIRE(e->message == "the JSON body is nested more than 64 levels deep");
  }
}

TEST_CASE("Tool call arguments nested too deep reach a template as the string sent", "[server]") {
  auto hf = HfChatTemplate::FromConfig(R"({"chat_template": "{{ messages|tojson }}"})", "", "test");
  REQUIRE(hf.ok());
  const ChatTemplate t = ChatTemplate::FromCheckpoint(**hf);
  auto render = [&](const std::string& arguments) {
    nlohmann::ordered_json fields = {{"role", "assistant"},
                                     {"content", nullptr},
                                     {"tool_calls",
                                      {{{"id", "c1"},
                                        {"type", "function"},
                                        {"function", {{"name", "f"}, {"arguments", arguments}}}}}}};
    ChatMessage m("assistant", "", fields);
    absl::StatusOr<std::string> s = t.Render({&m, 1});
    REQUIRE(s.ok());
    return *s;
  };
  const std::string prefix =
      R"([{"role": "assistant", "content": "", "tool_calls": [{"id": "c1", "type": "function", )"
      R"("function": {"name": "f", "arguments": )";
  SECTION("shallow arguments are parsed, as transformers' templates expect") {
    REQUIRE(render(NestedObjects(2)) == prefix + R"({"a": {"a": 1}}}}]}])");
  }
  SECTION("64 levels are parsed, 65 stay a string") {
    REQUIRE(render(NestedObjects(64)) == prefix + NestedObjects(64) + "}}]}]");
    const std::string deep = NestedObjects(65);
    REQUIRE(render(deep) == prefix + nlohmann::json(deep).dump() + "}}]}]");
  }
  SECTION("100,000 levels (used to overflow the stack when dumped)") {
    const std::string deep = NestedObjects(100000);
    REQUIRE(render(deep) == prefix + nlohmann::json(deep).dump() + "}}]}]");
  }
}

}  // namespace
}  // namespace kvserve

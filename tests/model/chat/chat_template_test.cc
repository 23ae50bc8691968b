#include "model/chat/chat_template.h"

#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>

#include "tests/test_util.h"

namespace kvserve {
namespace {

using ojson = nlohmann::ordered_json;

// A model directory holding `files` (name -> text).
std::string ModelDir(const std::map<std::string, std::string>& files) {
  std::string dir = testing::MakeTempDir("chat-template");
  for (const auto& [name, text] : files) std::ofstream(dir + "/" + name) << text;
  return dir;
}

std::string Config(const std::string& chat_template) {
  return ojson{{"bos_token", {{"__type", "AddedToken"}, {"content", "<s>"}}},
               {"eos_token", "</s>"},
               {"chat_template", chat_template}}
      .dump();
}

TEST_CASE("Chat templates render messages and the generation prompt", "[server]") {
  std::vector<ChatMessage> m = {{"system", "Be kind."}, {"user", "Tell a story."}};
  SECTION("plain: role-prefixed lines, then the assistant's turn") {
    ChatTemplate t;
    REQUIRE(t.name() == "plain");
    REQUIRE(*t.Render(m) == "system: Be kind.\nuser: Tell a story.\nassistant:");
  }
  SECTION("chatml") {
    auto t = ChatTemplate::Builtin("chatml");
    REQUIRE(t.ok());
    REQUIRE(*t->Render(m) ==
            "<|im_start|>system\nBe kind.<|im_end|>\n<|im_start|>user\nTell a "
            "story.<|im_end|>\n<|im_start|>assistant\n");
  }
  SECTION("llama3") {
    auto t = ChatTemplate::Builtin("llama3");
    REQUIRE(t.ok());
    REQUIRE(*t->Render({{{"user", "Hi"}}}) ==
            "<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|><|start_header_id|>assistant"
            "<|end_header_id|>\n\n");
  }
  SECTION("without the generation prompt") {
    ChatTemplate t;
    ChatRenderOptions no_prompt;
    no_prompt.add_generation_prompt = false;
    REQUIRE(*t.Render(m, no_prompt) == "system: Be kind.\nuser: Tell a story.\n");
  }
  SECTION("unknown built-ins are refused") {
    auto t = ChatTemplate::Builtin("vicuna");
    REQUIRE_FALSE(t.ok());
    REQUIRE(t.status().message() ==
            "unknown chat template 'vicuna' (built-ins: plain, chatml, llama3)");
  }
}

TEST_CASE("Custom patterns fill placeholders once, never inside content", "[server]") {
  auto t =
      ChatTemplate::FromPatterns({{"user", "U({content})"}, {"assistant", "A({content})"}}, "A(");
  REQUIRE(t.ok());
  REQUIRE(t->name() == "custom");
  // A role without a pattern uses the plain line; content holding a
  // placeholder stays literal.
  std::vector<ChatMessage> m = {{"tool", "x"}, {"user", "say {role}"}, {"assistant", "ok"}};
  REQUIRE(*t->Render(m) == "tool: x\nU(say {role})A(ok)A(");
  auto bad = ChatTemplate::FromPatterns({{"user", "{contents}"}}, "");
  REQUIRE(bad.status().message() ==
          "user: unknown placeholder {contents} (known: {role}, {content})");
}

TEST_CASE("A checkpoint's template sees whole messages, tools and extra variables", "[server]") {
  const std::string source =
      "{{ bos_token }}{% for m in messages %}[{{ m.role }}]{{ m.content }}"
      "{% for c in m.tool_calls or [] %}<call {{ c.function.name }} {{ c.function.arguments|tojson "
      "}}>"
      "{% endfor %}{% if m.tool_call_id is defined %}({{ m.tool_call_id }}){% endif %}{% endfor %}"
      "{% if tools %}{{ tools|tojson }}{% endif %}{% if add_generation_prompt %}[assistant]{% "
      "endif %}"
      "{% if think is defined %} think={{ think }}{% endif %}{{ eos_token }}";
  absl::StatusOr<ChatTemplate> t =
      ChatTemplate::ForModelDir(ModelDir({{"tokenizer_config.json", Config(source)}}));
  REQUIRE(t.ok());
  REQUIRE(t->name() == "checkpoint");
  REQUIRE(t->from_checkpoint());
  REQUIRE_FALSE(t->add_bos());  // the template writes <s> itself

  // Tool-call arguments sent as a JSON string reach the template as an
  // object (member order kept); content null becomes "".
  std::vector<ChatMessage> m = {
      {"user", "Weather?",
       ojson::parse(R"({"role": "user", "content": [{"type": "text", "text": "Weather?"}]})")},
      {"assistant", "",
       ojson::parse(
           R"({"role": "assistant", "content": null, "tool_calls": [{"id": "c1", "type": "function",
                        "function": {"name": "get", "arguments": "{\"z\":1,\"a\":[2]}"}}]})")},
      {"tool", "22C", ojson::parse(R"({"role": "tool", "tool_call_id": "c1", "content": "22C"})")},
      {"user", "Thanks"}};
  ChatRenderOptions o;
  o.tools = ojson::parse(
      R"([{"type": "function", "function": {"name": "get", "parameters": {"b": 1, "a": 2}}}])");
  o.variables = ojson::parse(R"({"think": false, "messages": "cannot replace the messages"})");
  REQUIRE(*t->Render(m, o) ==
          "<s>[user]Weather?[assistant]<call get {\"z\": 1, \"a\": [2]}>[tool]22C(c1)[user]Thanks"
          "[{\"type\": \"function\", \"function\": {\"name\": \"get\", \"parameters\": {\"b\": 1, "
          "\"a\": 2}}}]"
          "[assistant] think=False</s>");
  o.add_generation_prompt = false;
  o.tools = nullptr;
  o.variables = nullptr;
  REQUIRE(*t->Render(std::span(m).first(1), o) == "<s>[user]Weather?</s>");
}

TEST_CASE("A checkpoint template's raise_exception comes back verbatim", "[server]") {
  absl::StatusOr<ChatTemplate> t = ChatTemplate::ForModelDir(
      ModelDir({{"tokenizer_config.json",
                 Config("{{ raise_exception('No ' ~ messages[0].role ~ ' here') }}")}}));
  REQUIRE(t.ok());
  absl::StatusOr<std::string> out = t->Render({{{"system", "x"}}});
  REQUIRE(out.status().code() == absl::StatusCode::kInvalidArgument);
  REQUIRE(out.status().message() == "No system here");
}

TEST_CASE("ForModelDir finds the template a directory ships, or falls back to plain", "[server]") {
  std::vector<ChatMessage> m = {{"user", "Hi"}};
  SECTION("no directory, or no template in it: plain") {
    REQUIRE(ChatTemplate::ForModelDir("/nonexistent/model")->name() == "plain");
    REQUIRE(ChatTemplate::ForModelDir(ModelDir({{"config.json", "{}"}}))->name() == "plain");
    REQUIRE(
        ChatTemplate::ForModelDir(ModelDir({{"tokenizer_config.json", R"({"bos_token": "<s>"})"}}))
            ->name() == "plain");
  }
  SECTION("chat_template.jinja wins over tokenizer_config.json") {
    auto t = ChatTemplate::ForModelDir(
        ModelDir({{"tokenizer_config.json", Config("config")},
                  {"chat_template.jinja", "{{ bos_token }}jinja file\n"}}));
    REQUIRE(*t->Render(m) == "<s>jinja file");
  }
  SECTION("a list of named templates: default, or tool_use when tools are given") {
    const std::string config =
        ojson{{"chat_template",
               {{{"name", "default"}, {"template", "plain {{ messages|length }}"}},
                {{"name", "tool_use"}, {"template", "tools {{ tools|length }}"}}}}}
            .dump();
    auto t = ChatTemplate::ForModelDir(ModelDir({{"tokenizer_config.json", config}}));
    REQUIRE(*t->Render(m) == "plain 1");
    ChatRenderOptions o;
    o.tools = ojson::parse(R"([{"type": "function"}, {"type": "function"}])");
    REQUIRE(*t->Render(m, o) == "tools 2");
  }
  SECTION("malformed files are errors naming the file") {
    std::string dir = ModelDir({{"tokenizer_config.json", "{not json"}});
    REQUIRE(ChatTemplate::ForModelDir(dir).status().message() ==
            dir + "/tokenizer_config.json: not a JSON object");
    dir = ModelDir({{"tokenizer_config.json", Config("{% for %}")}});
    REQUIRE(ChatTemplate::ForModelDir(dir).status().message() ==
            dir + "/tokenizer_config.json: chat template line 1: expected a name, got '%}'");
    dir = ModelDir({{"tokenizer_config.json",
                     R"({"chat_template": [{"name": "tool_use", "template": "x"}]})"}});
    REQUIRE(ChatTemplate::ForModelDir(dir).status().message() ==
            dir + "/tokenizer_config.json: chat_template: the list has no \"default\" template");
    dir = ModelDir({{"tokenizer_config.json", R"({"bos_token": 1, "chat_template": "x"})"}});
    REQUIRE(ChatTemplate::ForModelDir(dir).status().message() ==
            dir +
                "/tokenizer_config.json: bos_token: expected a string or an object with a "
                "\"content\" string");
  }
}

}  // namespace
}  // namespace kvserve

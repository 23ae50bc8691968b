#include "server/chat_template.h"

#include <catch2/catch.hpp>

namespace kvserve {
namespace {

TEST_CASE("Chat templates render messages and the generation prompt", "[server]") {
  std::vector<ChatMessage> m = {{"system", "Be kind."}, {"user", "Tell a story."}};
  SECTION("plain: role-prefixed lines, then the assistant's turn") {
    ChatTemplate t;
    REQUIRE(t.name() == "plain");
    REQUIRE(t.Render(m) == "system: Be kind.\nuser: Tell a story.\nassistant:");
  }
  SECTION("chatml") {
    auto t = ChatTemplate::Builtin("chatml");
    REQUIRE(t.ok());
    REQUIRE(t->Render(m) ==
            "<|im_start|>system\nBe kind.<|im_end|>\n<|im_start|>user\nTell a "
            "story.<|im_end|>\n<|im_start|>assistant\n");
  }
  SECTION("llama3") {
    auto t = ChatTemplate::Builtin("llama3");
    REQUIRE(t.ok());
    REQUIRE(t->Render({{{"user", "Hi"}}}) ==
            "<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|><|start_header_id|>assistant"
            "<|end_header_id|>\n\n");
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
  REQUIRE(t->Render(m) == "tool: x\nU(say {role})A(ok)A(");
  auto bad = ChatTemplate::FromPatterns({{"user", "{contents}"}}, "");
  REQUIRE(bad.status().message() ==
          "user: unknown placeholder {contents} (known: {role}, {content})");
}

}  // namespace
}  // namespace kvserve

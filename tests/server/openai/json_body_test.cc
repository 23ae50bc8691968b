#include "server/openai/json_body.h"

#include <catch2/catch.hpp>

namespace kvserve {
namespace {

JsonBodyError ErrorOf(const std::string& body) {
  auto parsed = ParseJsonBody(body, 64);
  INFO(body);
  REQUIRE(std::holds_alternative<JsonBodyError>(parsed));
  return std::get<JsonBodyError>(parsed);
}

TEST_CASE("JSON bodies: numbers beyond a double are an error naming their field", "[server]") {
  struct Case {
    const char* body;
    const char* path;
  };
  const Case cases[] = {
      {R"({"max_tokens": 1e309})", "max_tokens"},
      {R"({"temperature": -1e999})", "temperature"},
      {R"({"a": 1, "b": {"c": [1, 2, {"d": 1E400}]}})", "b.c[2].d"},
      {R"({"messages": [{"role": "user"}, {"role": "user", "content": [1e309]}]})",
       "messages[1].content[0]"},
      {R"({"x": [[], [0, [1e309]]]})", "x[1][1][0]"},
      {R"({"logit_bias": {"5": 2e308}})", "logit_bias.5"},
  };
  for (const Case& c : cases) {
    JsonBodyError e = ErrorOf(c.body);
    REQUIRE(e.kind == JsonBodyError::Kind::kOutOfRange);
    REQUIRE(e.path == c.path);
    REQUIRE(e.message ==
            std::string("'") + c.path + "' is a number out of range (beyond a double's +-1.8e308)");
  }
  JsonBodyError top = ErrorOf("1e309");
  REQUIRE(top.kind == JsonBodyError::Kind::kOutOfRange);
  REQUIRE(top.path.empty());
  // The largest double and huge integers (stored as doubles) still parse.
  REQUIRE(std::holds_alternative<nlohmann::json>(ParseJsonBody(R"({"a": 1.7e308})", 64)));
  REQUIRE(std::holds_alternative<nlohmann::json>(
      ParseJsonBody(R"({"a": 123456789012345678901234567890})", 64)));
}

TEST_CASE("JSON bodies: every kind of parse failure is returned and never thrown", "[server]") {
  // One body for each failure nlohmann's parser reports: syntax
  // (parse_error 101), invalid UTF-8 and a lone surrogate escape (101 from
  // the lexer), a number overflow (out_of_range 406), depth (the callback).
  REQUIRE(ErrorOf("{\"prompt\": ").kind == JsonBodyError::Kind::kSyntax);
  REQUIRE(ErrorOf("{\"prompt\": \"\xff\"}").kind == JsonBodyError::Kind::kSyntax);
  REQUIRE(ErrorOf(R"({"prompt": "\ud800"})").kind == JsonBodyError::Kind::kSyntax);
  REQUIRE(ErrorOf("").kind == JsonBodyError::Kind::kSyntax);
  REQUIRE(ErrorOf(R"({"a": 1} x)").kind == JsonBodyError::Kind::kSyntax);
  REQUIRE(ErrorOf(R"({"a": -})").kind == JsonBodyError::Kind::kSyntax);
  REQUIRE(ErrorOf(std::string(70, '[') + std::string(70, ']')).kind ==
          JsonBodyError::Kind::kTooDeep);
  REQUIRE(ParseOrderedJsonBody(R"({"b": 1e309})", 64).index() == 1);
  // A syntax error's message is capped: a body of 1 MiB in one bad token
  // does not come back whole.
  std::string big = "{\"a\": 1" + std::string(1 << 20, '0') + "x}";
  REQUIRE(ErrorOf(big).message.size() < 400);
  std::string big_number = "{\"a\": 1" + std::string(1 << 20, '0') + "}";
  JsonBodyError e = ErrorOf(big_number);
  REQUIRE(e.kind == JsonBodyError::Kind::kOutOfRange);
  REQUIRE(e.path == "a");
}

TEST_CASE("Client text in messages is capped at a UTF-8 boundary", "[server]") {
  REQUIRE(CapClientText("short") == "short");
  REQUIRE(CapClientText(std::string(100, 'a'), 8) == "aaaaaaaa... (100 bytes)");
  // "é" is two bytes: a cut inside it backs off to before it.
  REQUIRE(CapClientText("abcdefg\xc3\xa9xyz", 8) == "abcdefg... (12 bytes)");
}

}  // namespace
}  // namespace kvserve

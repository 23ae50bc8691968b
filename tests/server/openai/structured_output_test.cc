// response_format, vLLM's guided_* fields and structured_outputs parsed into
// a GrammarSpec; bad values are 400s naming the field.
#include <catch2/catch.hpp>

#include "server/openai/openai_protocol.h"
#include "tests/server/openai/api_fixture.h"

namespace kvserve {
namespace {

using Fixture = testing::ApiFixture;

GrammarSpec Constraint(const std::string& fields) {
  Fixture f;
  ApiRequest r;
  const std::string body = R"({"messages":[{"role":"user","content":"hi"}],)" + fields + "}";
  std::optional<ApiError> err = ParseApiRequest(ApiKind::kChat, body, f.ctx(), &r);
  INFO(body);
  if (err) FAIL(err->Body());
  return r.request.constraint;
}

ApiError Error(const std::string& fields) {
  Fixture f;
  ApiRequest r;
  const std::string body = R"({"prompt":"hi",)" + fields + "}";
  std::optional<ApiError> err = ParseApiRequest(ApiKind::kCompletion, body, f.ctx(), &r);
  INFO(body);
  REQUIRE(err.has_value());
  return *err;
}

TEST_CASE("Structured outputs: response_format json_schema keeps the schema in member order",
          "[server]") {
  const GrammarSpec s = Constraint(
      R"("response_format":{"type":"json_schema","json_schema":{"name":"p","strict":true,)"
      R"("schema":{"type":"object","properties":{"zeta":{"type":"string"},"alpha":{"type":"integer"}}}}})");
  CHECK(s.kind == GrammarSpec::Kind::kJsonSchema);
  CHECK(s.field == "response_format.json_schema.schema");
  CHECK(s.text ==
        R"({"type":"object","properties":{"zeta":{"type":"string"},"alpha":{"type":"integer"}}})");
  CHECK(Constraint(R"("response_format":{"type":"json_object"})").kind ==
        GrammarSpec::Kind::kJsonObject);
  CHECK(Constraint(R"("response_format":{"type":"text"})").empty());
  CHECK(Constraint(R"("max_tokens":3)").empty());
}

TEST_CASE("Structured outputs: vLLM guided fields and structured_outputs", "[server]") {
  GrammarSpec s = Constraint(R"("guided_json":{"type":"integer"})");
  CHECK(s.kind == GrammarSpec::Kind::kJsonSchema);
  CHECK(s.text == R"({"type":"integer"})");
  CHECK(s.field == "guided_json");
  s = Constraint(R"("guided_json":"{\"type\": \"boolean\"}")");
  CHECK(s.text == R"({"type": "boolean"})");
  s = Constraint(R"("guided_regex":"[a-z]+")");
  CHECK(s.kind == GrammarSpec::Kind::kRegex);
  CHECK(s.text == "[a-z]+");
  s = Constraint(R"("guided_choice":["yes","no"])");
  CHECK(s.kind == GrammarSpec::Kind::kChoice);
  CHECK(s.choices == std::vector<std::string>{"yes", "no"});
  s = Constraint(R"("structured_outputs":{"choice":["a","b"]})");
  CHECK(s.field == "structured_outputs.choice");
  CHECK(s.choices == std::vector<std::string>{"a", "b"});
  s = Constraint(R"("structured_outputs":{"regex":"x+"})");
  CHECK(s.kind == GrammarSpec::Kind::kRegex);
  s = Constraint(R"("structured_outputs":{"json_object":true})");
  CHECK(s.kind == GrammarSpec::Kind::kJsonObject);
  s = Constraint(R"("guided_grammar":"root ::= \"a\"")");
  CHECK(s.kind == GrammarSpec::Kind::kGbnf);
  CHECK(s.field == "guided_grammar");
  CHECK(s.text == R"(root ::= "a")");
  s = Constraint(R"("structured_outputs":{"grammar":"root ::= [0-9]+"})");
  CHECK(s.kind == GrammarSpec::Kind::kGbnf);
  CHECK(s.field == "structured_outputs.grammar");
}

TEST_CASE("Structured outputs: bad values are 400s naming the field", "[server]") {
  ApiError e = Error(R"("response_format":{"type":"xml"})");
  CHECK(e.http_status == 400);
  CHECK(e.param == "response_format.type");
  CHECK(e.message ==
        R"('response_format.type' must be one of "text", "json_object", "json_schema", got "xml")");
  e = Error(R"("response_format":{"type":"json_schema","json_schema":{"name":"x"}})");
  CHECK(e.param == "response_format.json_schema.schema");
  CHECK(e.message == "'response_format.json_schema.schema' is required");
  e = Error(R"("response_format":{"type":"json_schema","json_schema":{"schema":3}})");
  CHECK(e.param == "response_format.json_schema.schema");
  e = Error(R"("guided_choice":["a",1])");
  CHECK(e.param == "guided_choice[1]");
  CHECK(e.message == "'guided_choice[1]' must be a string");
  e = Error(R"("guided_grammar":{"root":"a"})");
  CHECK(e.param == "guided_grammar");
  CHECK(e.message == "'guided_grammar' must be a string (a GBNF grammar)");
  e = Error(R"("guided_regex":"a","guided_choice":["b"])");
  CHECK(e.param == "guided_choice");
  CHECK(e.message == "'guided_choice' and 'guided_regex' both constrain the output; give one");
  e = Error(R"("structured_outputs":{"regex":"a","choice":["b"]})");
  CHECK(e.param == "structured_outputs.choice");
}

}  // namespace
}  // namespace kvserve

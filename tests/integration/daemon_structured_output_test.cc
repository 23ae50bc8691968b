// Structured outputs through the real `kvserve serve` binary on stories260K:
// response_format json_schema with n = 4 over seeds and temperatures, plain
// and streamed, every closed output parsing and validating; a schema the
// engine cannot compile is a 400 naming its path; /tokenize and /detokenize
// round-trip; guided_grammar (GBNF) outputs match the grammar; no KV block
// stays in use.
#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>
#include <regex>
#include <string>

#include "tests/integration/daemon_fixture.h"

namespace kvserve {
namespace {

using json = nlohmann::json;
using testing::DaemonProcess;

const json kSchema = json::parse(R"({"type":"object","properties":{
    "hero":{"type":"string","minLength":1,"maxLength":8},
    "year":{"type":"integer","minimum":1900,"maximum":2100},
    "mood":{"enum":["happy","sad"]},
    "friends":{"type":"array","items":{"type":"string","maxLength":5},"maxItems":2}},
    "required":["hero","year","mood"],"additionalProperties":false})");

bool Valid(const std::string& text) {
  const json j = json::parse(text, nullptr, false);
  if (j.is_discarded() || !j.is_object()) return false;
  for (auto it = j.begin(); it != j.end(); ++it) {
    if (!kSchema["properties"].contains(it.key())) return false;
  }
  if (!j.contains("hero") || !j["hero"].is_string() || j["hero"].get<std::string>().empty()) {
    return false;
  }
  if (!j.contains("year") || !j["year"].is_number_integer() || j["year"] < 1900 ||
      j["year"] > 2100) {
    return false;
  }
  if (!j.contains("mood") || (j["mood"] != "happy" && j["mood"] != "sad")) return false;
  if (j.contains("friends") && (!j["friends"].is_array() || j["friends"].size() > 2)) return false;
  return true;
}

double MetricValue(const std::string& text, const std::string& series) {
  size_t pos = text.find("\n" + series + " ");
  REQUIRE(pos != std::string::npos);
  pos += series.size() + 2;
  return std::stod(text.substr(pos, text.find('\n', pos) - pos));
}

TEST_CASE("Daemon: response_format json_schema outputs validate plain and streamed",
          "[integration]") {
  DaemonProcess d;
  int closed = 0, total = 0;
  for (double temperature : {0.0, 0.8, 1.5}) {
    for (int seed = 0; seed < 3; ++seed) {
      json body = {{"model", "stories260k"},
                   {"prompt", "Once upon a time"},
                   {"max_tokens", 100},
                   {"n", 4},
                   {"seed", seed},
                   {"temperature", temperature},
                   {"response_format",
                    {{"type", "json_schema"},
                     {"json_schema", {{"name", "story"}, {"strict", true}, {"schema", kSchema}}}}}};
      auto r = d.Client().Post("/v1/completions", body.dump(), "application/json");
      REQUIRE(r);
      INFO(r->body);
      REQUIRE(r->status == 200);
      const json parsed = json::parse(r->body);  // the range below must not outlive it
      for (const json& c : parsed["choices"]) {
        ++total;
        REQUIRE(c["finish_reason"] != "error");
        if (c["finish_reason"] == "stop") {
          ++closed;
          INFO(c["text"]);
          CHECK(Valid(c["text"].get<std::string>()));
        }
      }
      body["stream"] = true;
      body["n"] = 1;
      r = d.Client().Post("/v1/completions", body.dump(), "application/json");
      REQUIRE(r);
      REQUIRE(r->status == 200);
      std::string text, finish;
      for (const std::string& data : testing::SseData(r->body)) {
        if (data == "[DONE]") continue;
        const json chunk = json::parse(data);
        if (chunk["choices"].empty()) continue;
        text += chunk["choices"][0]["text"].get<std::string>();
        if (!chunk["choices"][0]["finish_reason"].is_null()) {
          finish = chunk["choices"][0]["finish_reason"];
        }
      }
      INFO(text);
      REQUIRE(finish != "error");
      if (finish == "stop") CHECK(Valid(text));
    }
  }
  // The others ran into max_tokens (100) inside the object: 22 of 36 close
  // here; a third is the bound, since sampled tokens may differ with the
  // CPU's kernels (AVX-512 against AVX2).
  INFO(closed << " of " << total << " samples closed their JSON");
  CHECK(closed * 3 >= total);

  auto bad = d.Client().Post(
      "/v1/completions",
      R"({"prompt":"x","response_format":{"type":"json_schema","json_schema":{"name":"n",)"
      R"("schema":{"type":"object","properties":{"a":{"type":"string","pattern":"x+"}}}}}})",
      "application/json");
  REQUIRE(bad);
  REQUIRE(bad->status == 400);
  CHECK(json::parse(bad->body)["error"]["param"] ==
        "response_format.json_schema.schema.properties.a.pattern");

  auto tok = d.Client().Post("/tokenize", R"({"prompt":"Once upon a time"})", "application/json");
  REQUIRE(tok);
  REQUIRE(tok->status == 200);
  const json ids = json::parse(tok->body)["tokens"];
  CHECK(json::parse(tok->body)["count"] == ids.size());
  auto detok = d.Client().Post("/detokenize", json{{"tokens", ids}}.dump(), "application/json");
  REQUIRE(detok);
  CHECK(json::parse(detok->body)["prompt"] == "Once upon a time");

  const std::string metrics = d.Client().Get("/metrics")->body;
  CHECK(MetricValue(metrics, "kvserve_kv_blocks{state=\"active\"}") == 0);
}

TEST_CASE("Daemon: guided_grammar (GBNF) outputs are in the grammar's language", "[integration]") {
  DaemonProcess d;
  // Bounded everywhere, so every sample closes well within max_tokens.
  const std::string grammar = R"(root ::= item ("," " "? item){0,3} "."
item ::= word | num   # a word or a number
word ::= [a-z]{1,6}
num  ::= [1-9] [0-9]?
)";
  const std::regex language(R"(([a-z]{1,6}|[1-9][0-9]?)(, ?([a-z]{1,6}|[1-9][0-9]?)){0,3}\.)");
  int samples = 0;
  for (double temperature : {0.0, 0.9, 1.6}) {
    json body = {{"model", "stories260k"},
                 {"prompt", "Tom had"},
                 {"max_tokens", 64},
                 {"n", 4},
                 {"seed", 7},
                 {"temperature", temperature},
                 {"guided_grammar", grammar}};
    auto r = d.Client().Post("/v1/completions", body.dump(), "application/json");
    REQUIRE(r);
    INFO(r->body);
    REQUIRE(r->status == 200);
    const json parsed = json::parse(r->body);
    for (const json& c : parsed["choices"]) {
      ++samples;
      CHECK(c["finish_reason"] == "stop");
      const std::string text = c["text"].get<std::string>();
      INFO(text);
      CHECK(std::regex_match(text, language));
    }
  }
  CHECK(samples == 12);
  // A grammar error is a 400 naming the field, with the line and column.
  auto bad = d.Client().Post(
      "/v1/completions",
      json{{"model", "stories260k"}, {"prompt", "x"}, {"guided_grammar", "root ::= nope\n"}}.dump(),
      "application/json");
  REQUIRE(bad);
  REQUIRE(bad->status == 400);
  const json err = json::parse(bad->body)["error"];
  CHECK(err["param"] == "guided_grammar");
  CHECK(err["message"] ==
        "guided_grammar: line 1 column 10: the rule 'nope' is used but never defined");
  const std::string metrics = d.Client().Get("/metrics")->body;
  CHECK(MetricValue(metrics, "kvserve_kv_blocks{state=\"active\"}") == 0);
}

}  // namespace
}  // namespace kvserve

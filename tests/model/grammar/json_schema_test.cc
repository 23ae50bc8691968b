#include <catch2/catch.hpp>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "model/grammar/grammar_compiler.h"
#include "model/grammar/grammar_matcher.h"

namespace kvserve {
namespace {

using nlohmann::json;

GrammarSpec Schema(std::string schema) {
  GrammarSpec s;
  s.kind = GrammarSpec::Kind::kJsonSchema;
  s.text = std::move(schema);
  s.field = "response_format.json_schema.schema";
  return s;
}

std::string CompileError(const std::string& schema) {
  GrammarBuilder b;
  return std::string(BuildGrammar(Schema(schema), &b).message());
}

// Every single byte is a token (id = byte), then some multi-byte ones.
std::shared_ptr<const TokenVocab> ByteVocab() {
  std::vector<std::string> v;
  for (int b = 0; b < 256; ++b) v.push_back(std::string(1, static_cast<char>(b)));
  for (const char* t :
       {"{\"", "\":", "\"name\"", "true", "null", "  ", "\n  ", "é", "[1,", "\"}"}) {
    v.push_back(t);
  }
  return std::make_shared<const TokenVocab>(std::move(v));
}

std::shared_ptr<const CompiledGrammar> Compile(const GrammarSpec& spec) {
  GrammarBuilder b;
  absl::Status s = BuildGrammar(spec, &b);
  INFO(std::string(s.message()));
  REQUIRE(s.ok());
  static const std::shared_ptr<const TokenVocab> vocab = ByteVocab();
  return std::make_shared<const CompiledGrammar>(b.Lower(), vocab);
}

bool Matches(const std::string& schema, const std::string& text) {
  GrammarMatcher m(Compile(Schema(schema)));
  return m.AcceptBytes(text) && m.CanEnd();
}

// Samples tokens uniformly from the mask (ending with probability 1/4 where
// the grammar may end) until the grammar ends; "" if it ran past max_tokens.
std::string RandomOutput(const std::shared_ptr<const CompiledGrammar>& g, uint64_t seed,
                         int max_tokens = 4000) {
  std::mt19937_64 rng(seed);
  GrammarMatcher m(g);
  std::vector<uint32_t> mask(g->vocab().mask_words());
  std::string out;
  for (int step = 0; step < max_tokens; ++step) {
    if (m.MustEnd() || (m.CanEnd() && rng() % 4 == 0)) return out;
    const int32_t n = m.FillMask(mask);
    REQUIRE(n > 0);  // never a live state with no allowed token
    int32_t pick = static_cast<int32_t>(rng() % n);
    for (int32_t id = 0; id < g->vocab().vocab_size(); ++id) {
      if (((mask[id >> 5] >> (id & 31)) & 1) && pick-- == 0) {
        REQUIRE(m.AcceptBytes(g->vocab().bytes(id)));
        out += g->vocab().bytes(id);
        break;
      }
    }
  }
  return "";
}

size_t CodePoints(const std::string& s) {
  size_t n = 0;
  for (unsigned char c : s) n += (c & 0xc0) != 0x80;
  return n;
}

TEST_CASE("JSON schema: unsupported keywords are refused naming the schema path", "[grammar]") {
  CHECK(CompileError(R"({"type":"object","properties":{"a":{"type":"string","pattern":"x+"}}})") ==
        "response_format.json_schema.schema.properties.a.pattern: the JSON Schema keyword "
        "'pattern' is not supported");
  CHECK(CompileError(R"({"type":"number","minimum":0})") ==
        "response_format.json_schema.schema.minimum: bounds on a number are not supported (they "
        "are on an integer)");
  CHECK(CompileError(R"({"$ref":"#/$defs/missing"})") ==
        "response_format.json_schema.schema.$ref: '#/$defs/missing' is not a definition of this "
        "schema (only #, #/$defs/... and #/definitions/... are supported)");
  CHECK(CompileError(R"({"type":"string","format":"email"})") ==
        "response_format.json_schema.schema.format: the string format 'email' is not supported");
  CHECK(CompileError(R"({"type":"array","items":{"type":"string","maxLength":5000}})") ==
        "response_format.json_schema.schema.items.maxLength: must be an integer from 0 to 4096");
  CHECK(CompileError(R"({"type":"object","properties":{"a":{}},"required":["b"]})") ==
        "response_format.json_schema.schema.required: names 'b', which is not in properties");
  CHECK(CompileError(R"({"$defs":{"n":{"type":"strin"}},"$ref":"#/$defs/n"})") ==
        "response_format.json_schema.schema.$defs.n.type: unknown type 'strin'");
  CHECK(CompileError("{\"type\":") == "response_format.json_schema.schema: is not valid JSON");
}

TEST_CASE("JSON schema: integer ranges accept exactly the values between the bounds", "[grammar]") {
  const std::string s = R"({"type":"integer","minimum":-5,"maximum":130})";
  for (int v = -20; v <= 200; ++v) {
    INFO(v);
    CHECK(Matches(s, std::to_string(v)) == (v >= -5 && v <= 130));
  }
  CHECK_FALSE(Matches(s, "007"));
  CHECK_FALSE(Matches(s, "-0"));
  CHECK(Matches(R"({"type":"integer","exclusiveMinimum":99,"exclusiveMaximum":1000})", "100"));
  CHECK_FALSE(Matches(R"({"type":"integer","exclusiveMinimum":99,"exclusiveMaximum":1000})", "99"));
  CHECK_FALSE(
      Matches(R"({"type":"integer","exclusiveMinimum":99,"exclusiveMaximum":1000})", "1000"));
  CHECK(Matches(R"({"type":"integer","minimum":10})", "123456789012"));
  CHECK_FALSE(Matches(R"({"type":"integer","minimum":10})", "9"));
}

TEST_CASE("JSON schema: objects take required properties in order and may skip optional ones",
          "[grammar]") {
  const std::string s =
      R"({"type":"object","properties":{"b":{"type":"integer"},"a":{"type":"boolean"},)"
      R"("c":{"type":"null"}},"required":["a"],"additionalProperties":false})";
  CHECK(Matches(s, R"({"a":true})"));
  CHECK(Matches(s, R"({"b":1,"a":false})"));
  CHECK(Matches(s, R"({ "b" : 1 , "a" : false , "c" : null })"));
  CHECK(Matches(s, "{\n  \"a\": true,\n  \"c\": null\n}"));
  CHECK_FALSE(Matches(s, R"({"b":1})"));
  CHECK_FALSE(Matches(s, R"({"a":true,"b":1})"));
  CHECK_FALSE(Matches(s, R"({"a":true,})"));
  CHECK_FALSE(Matches(s, R"({"a":true,"d":1})"));
  CHECK_FALSE(Matches(s, "{" + std::string(4, ' ') + "\"a\":true}"));
}

TEST_CASE("JSON schema: strings enums consts arrays anyOf and refs", "[grammar]") {
  CHECK(Matches(R"({"type":"string","minLength":2,"maxLength":3})", R"("ab")"));
  CHECK(Matches(R"({"type":"string","minLength":2,"maxLength":3})", R"("a\né")"));
  CHECK_FALSE(Matches(R"({"type":"string","minLength":2,"maxLength":3})", R"("a")"));
  CHECK_FALSE(Matches(R"({"type":"string","minLength":2,"maxLength":3})", R"("abcd")"));
  CHECK_FALSE(Matches(R"({"type":"string"})", "\"a\x01\""));
  CHECK_FALSE(Matches(R"({"type":"string"})", R"("\ud800")"));
  CHECK(Matches(R"({"type":"string"})", R"("\u00e9\"")"));
  CHECK(Matches(R"({"enum":["red",1,null,{"k":[true]}]})", R"({"k":[true]})"));
  CHECK(Matches(R"({"enum":["red",1,null]})", R"("red")"));
  CHECK_FALSE(Matches(R"({"enum":["red",1,null]})", R"("blue")"));
  CHECK(Matches(R"({"const":"ünï"})", "\"ünï\""));
  const std::string arr =
      R"({"type":"array","items":{"type":"integer"},"minItems":2,"maxItems":3})";
  CHECK(Matches(arr, "[1,2]"));
  CHECK(Matches(arr, "[ 1 , 2 , 3 ]"));
  CHECK_FALSE(Matches(arr, "[1]"));
  CHECK_FALSE(Matches(arr, "[1,2,3,4]"));
  CHECK(Matches(R"({"type":"array","maxItems":0})", "[]"));
  CHECK(Matches(R"({"anyOf":[{"type":"string"},{"type":"null"}]})", "null"));
  CHECK(Matches(R"({"type":["integer","boolean"]})", "false"));
  const std::string tree =
      R"({"$defs":{"node":{"type":"object","properties":{"v":{"type":"integer"},)"
      R"("kids":{"type":"array","items":{"$ref":"#/$defs/node"}}},"required":["v"]}},)"
      R"("$ref":"#/$defs/node"})";
  CHECK(Matches(tree, R"({"v":1,"kids":[{"v":2},{"v":3,"kids":[{"v":4,"kids":[]}]}]})"));
  CHECK_FALSE(Matches(tree, R"({"v":1,"kids":[{"kids":[]}]})"));
  CHECK(Matches(R"({"type":"string","format":"date-time"})", R"("2024-02-28T23:59:07Z")"));
  CHECK_FALSE(Matches(R"({"type":"string","format":"date"})", R"("2024-13-01")"));
  CHECK(
      Matches(R"({"type":"string","format":"uuid"})", R"("123e4567-e89b-12d3-a456-426614174000")"));
  CHECK(Matches("{}", R"([{"a":[1.5e3,-0.25,"x",true,null]}])"));
  CHECK(Matches(R"({"type":"object","additionalProperties":{"type":"integer"}})",
                R"({"x":1,"y":2})"));
  CHECK_FALSE(
      Matches(R"({"type":"object","additionalProperties":{"type":"integer"}})", R"({"x":"1"})"));
}

TEST_CASE("JSON schema: random walks over the mask always give valid JSON", "[grammar]") {
  struct Case {
    std::string schema;
    std::function<bool(const json&)> valid;
  };
  const std::vector<Case> cases = {
      {R"({"type":"object","properties":{"name":{"type":"string","maxLength":8},)"
       R"("age":{"type":"integer","minimum":0,"maximum":120},)"
       R"("tags":{"type":"array","items":{"enum":["a","bé","c"]},"maxItems":3}},)"
       R"("required":["name","age"],"additionalProperties":false})",
       [](const json& j) {
         if (!j.is_object() || !j.contains("name") || !j.contains("age")) return false;
         for (auto it = j.begin(); it != j.end(); ++it) {
           if (it.key() != "name" && it.key() != "age" && it.key() != "tags") return false;
         }
         if (!j["name"].is_string() || CodePoints(j["name"].get<std::string>()) > 8) return false;
         if (!j["age"].is_number_integer() || j["age"] < 0 || j["age"] > 120) return false;
         if (j.contains("tags")) {
           if (!j["tags"].is_array() || j["tags"].size() > 3) return false;
           for (const json& t : j["tags"]) {
             if (t != "a" && t != "bé" && t != "c") return false;
           }
         }
         return true;
       }},
      {R"({"$defs":{"n":{"type":"object","properties":{"k":{"anyOf":[{"type":"null"},)"
       R"({"$ref":"#/$defs/n"}]}},"required":["k"]}},"$ref":"#/$defs/n"})",
       [](const json& j) {
         const json* p = &j;
         while (p->is_object() && p->size() == 1 && p->contains("k")) {
           if ((*p)["k"].is_null()) return true;
           p = &(*p)["k"];
         }
         return false;
       }},
      {R"({"type":"array","items":{"type":"integer","minimum":-3,"maximum":3},)"
       R"("minItems":1,"maxItems":4})",
       [](const json& j) {
         if (!j.is_array() || j.empty() || j.size() > 4) return false;
         for (const json& x : j) {
           if (!x.is_number_integer() || x < -3 || x > 3) return false;
         }
         return true;
       }},
  };
  for (const Case& c : cases) {
    auto g = Compile(Schema(c.schema));
    int completed = 0;
    for (uint64_t seed = 0; seed < 60; ++seed) {
      const std::string out = RandomOutput(g, seed);
      if (out.empty()) continue;
      ++completed;
      INFO(c.schema << "\nseed " << seed << ": " << out);
      const json j = json::parse(out, nullptr, false);
      REQUIRE_FALSE(j.is_discarded());
      CHECK(c.valid(j));
    }
    CHECK(completed >= 50);
  }
}

}  // namespace
}  // namespace kvserve

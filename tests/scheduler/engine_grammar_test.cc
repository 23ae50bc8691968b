// Constrained decoding in the engine on stories260K (SentencePiece with byte
// fallback, vocab 512): JSON schema, regex and choice constraints hold for
// every seed and temperature, through n = 4 forks and preemption
// (recompute and swap), and bad constraints are refused naming the field.
#include <catch2/catch.hpp>
#include <memory>
#include <nlohmann/json.hpp>
#include <random>
#include <regex>
#include <string>
#include <vector>

#include "model/cpu/cpu_model_runner.h"
#include "scheduler/engine.h"
#include "scheduler/grammar_state.h"
#include "tests/engine_harness.h"
#include "util/field_status.h"

namespace kvserve {
namespace {

using nlohmann::json;
using testing::Result;
using testing::Stories;

std::unique_ptr<Engine> MakeEngine(const testing::EngineSetup& s) {
  CpuRunnerOptions opt;
  opt.block_size = s.block_size;
  opt.num_blocks = s.num_blocks;
  opt.num_swap_blocks = s.num_swap_blocks;
  opt.num_tail_blocks = 2 * s.max_num_seqs;
  auto runner = CpuModelRunner::Create(Stories().weights, opt);
  REQUIRE(runner.ok());
  auto engine = Engine::Create(testing::EngineConfigOf(s), std::move(*runner), Stories().tokenizer);
  REQUIRE(engine.ok());
  return std::move(*engine);
}

constexpr char kPersonSchema[] =
    R"({"type":"object","properties":{"name":{"type":"string","maxLength":6},)"
    R"("age":{"type":"integer","minimum":1,"maximum":99},"pet":{"enum":["cat","dog"]}},)"
    R"("required":["name","age","pet"],"additionalProperties":false})";

GrammarSpec Spec(GrammarSpec::Kind kind, std::string text, std::string field) {
  GrammarSpec s;
  s.kind = kind;
  s.text = std::move(text);
  s.field = std::move(field);
  return s;
}

GenerateRequest Constrained(GrammarSpec spec, float temperature, uint64_t seed) {
  GenerateRequest r;
  r.prompt = "Once upon a time";
  r.max_tokens = 120;
  r.sampling.temperature = temperature;
  r.sampling.seed = seed;
  r.constraint = std::move(spec);
  return r;
}

bool ValidPerson(const std::string& text) {
  const json j = json::parse(text, nullptr, false);
  if (j.is_discarded() || !j.is_object() || j.size() != 3) return false;
  if (!j.contains("name") || !j["name"].is_string()) return false;
  size_t cps = 0;
  for (unsigned char c : j["name"].get<std::string>()) cps += (c & 0xc0) != 0x80;
  if (cps > 6) return false;
  if (!j.contains("age") || !j["age"].is_number_integer() || j["age"] < 1 || j["age"] > 99) {
    return false;
  }
  return j.contains("pet") && (j["pet"] == "cat" || j["pet"] == "dog");
}

TEST_CASE("Engine grammar: JSON schema outputs parse and validate for every seed and temperature",
          "[scheduler]") {
  auto engine = MakeEngine(testing::EngineSetup{});
  std::vector<GenerateRequest> reqs;
  for (float t : {0.0f, 0.5f, 1.0f, 1.5f}) {
    for (uint64_t seed = 0; seed < 8; ++seed) {
      reqs.push_back(Constrained(
          Spec(GrammarSpec::Kind::kJsonSchema, kPersonSchema, "response_format"), t, seed));
    }
  }
  const std::vector<Result> results = testing::RunConcurrently(*engine, reqs);
  int stopped = 0;
  for (size_t i = 0; i < results.size(); ++i) {
    INFO("request " << i << ": " << results[i].text[0]);
    REQUIRE(results[i].finish[0] != FinishReason::kError);
    if (results[i].finish[0] == FinishReason::kStop) {
      ++stopped;
      CHECK(ValidPerson(results[i].text[0]));
    }
  }
  CHECK(stopped >= 28);  // of 32: a name of at most 6 characters ends quickly
  testing::RequireAllBlocksFree(*engine);
}

TEST_CASE("Engine grammar: regex and choice outputs match exactly and stop at the end",
          "[scheduler]") {
  auto engine = MakeEngine(testing::EngineSetup{});
  const std::regex re("[0-9]{3}-[a-z]{2,4}");
  for (uint64_t seed = 0; seed < 10; ++seed) {
    GenerateRequest r = Constrained(
        Spec(GrammarSpec::Kind::kRegex, "[0-9]{3}-[a-z]{2,4}", "guided_regex"), 1.0f, seed);
    r.ignore_eos = true;  // the grammar ends the output, not EOS
    const Result out = testing::RunOne(*engine, r);
    INFO(out.text[0]);
    REQUIRE(std::regex_match(out.text[0], re));
    // {2,4} letters: after the fourth nothing may follow, so it stops there
    // at the latest; before, only EOS could end it and EOS is ignored.
    CHECK(out.text[0].size() == 8);
    CHECK(out.finish[0] == FinishReason::kStop);
  }
  GrammarSpec choice = Spec(GrammarSpec::Kind::kChoice, "", "guided_choice");
  choice.choices = {"dragon", "princess", "frog"};
  for (uint64_t seed = 0; seed < 10; ++seed) {
    const Result out = testing::RunOne(*engine, Constrained(choice, 1.0f, seed));
    INFO(out.text[0]);
    CHECK((out.text[0] == "dragon" || out.text[0] == "princess" || out.text[0] == "frog"));
    CHECK(out.finish[0] == FinishReason::kStop);
  }
  testing::RequireAllBlocksFree(*engine);
}

TEST_CASE("Engine grammar: n = 4 forks and preemption keep every sample's grammar state",
          "[scheduler]") {
  for (PreemptionMode mode : {PreemptionMode::kRecompute, PreemptionMode::kSwap}) {
    DYNAMIC_SECTION((mode == PreemptionMode::kSwap ? "swap" : "recompute")) {
      testing::EngineSetup setup;
      setup.max_model_len = 192;
      setup.num_blocks = 2 * 192 / 16;  // room for two long sequences
      setup.num_swap_blocks = mode == PreemptionMode::kSwap ? 8 * 192 / 16 : 0;
      setup.mode = mode;
      setup.max_num_seqs = 16;
      auto engine = MakeEngine(setup);
      std::mt19937 rng(5);
      std::vector<GenerateRequest> reqs;
      for (int i = 0; i < 6; ++i) {
        GenerateRequest r = Constrained(
            Spec(GrammarSpec::Kind::kJsonSchema, kPersonSchema, "response_format"), 1.0f, 100 + i);
        r.prompt = testing::RandomSnippet(rng, 300);
        r.max_tokens = 60;
        r.n = i % 2 == 0 ? 4 : 1;
        reqs.push_back(r);
      }
      std::vector<Result> solo;
      for (const GenerateRequest& r : reqs) solo.push_back(testing::RunOne(*engine, r));
      REQUIRE(engine->GetStats().preemptions == 0);
      const std::vector<Result> together = testing::RunConcurrently(*engine, reqs);
      REQUIRE(engine->GetStats().preemptions > 0);
      for (size_t i = 0; i < reqs.size(); ++i) {
        for (int k = 0; k < reqs[i].n; ++k) {
          INFO("request " << i << " sample " << k << ": " << together[i].text[k]);
          REQUIRE(together[i].tokens[k] == solo[i].tokens[k]);
          REQUIRE(together[i].finish[k] != FinishReason::kError);
          // Constrained from the first token on, forks included (a sample
          // that ran past max_tokens is a prefix of a valid object).
          REQUIRE(together[i].text[k].rfind("{", 0) == 0);
          if (together[i].finish[k] == FinishReason::kStop) CHECK(ValidPerson(together[i].text[k]));
        }
      }
      testing::RequireAllBlocksFree(*engine);
    }
  }
}

TEST_CASE("Engine grammar: a tool-call schema (tool_choice required) gives calls of the tools",
          "[scheduler]") {
  auto engine = MakeEngine(testing::EngineSetup{});
  const std::string call_f =
      R"({"type":"object","properties":{"name":{"const":"f"},"arguments":{"type":"object",)"
      R"("properties":{"n":{"type":"integer","minimum":0,"maximum":9}},"required":["n"]}},)"
      R"("required":["name","arguments"],"additionalProperties":false})";
  const std::string call_g =
      R"({"type":"object","properties":{"name":{"const":"g"},"arguments":{"type":"object",)"
      R"("properties":{}}},"required":["name","arguments"],"additionalProperties":false})";
  int stopped = 0;
  for (uint64_t seed = 0; seed < 12; ++seed) {
    const Result out = testing::RunOne(
        *engine, Constrained(Spec(GrammarSpec::Kind::kJsonSchema,
                                  R"({"anyOf":[)" + call_f + "," + call_g + "]}", "tools"),
                             1.0f, seed));
    INFO(out.text[0]);
    REQUIRE(out.finish[0] != FinishReason::kError);
    if (out.finish[0] != FinishReason::kStop) continue;
    ++stopped;
    const json call = json::parse(out.text[0]);
    REQUIRE((call["name"] == "f" || call["name"] == "g"));
    if (call["name"] == "f") {
      CHECK(call["arguments"].size() == 1);
      CHECK(call["arguments"]["n"].is_number_integer());
    } else {
      CHECK(call["arguments"].empty());
    }
  }
  CHECK(stopped >= 10);
  testing::RequireAllBlocksFree(*engine);
}

TEST_CASE("Engine grammar: bad constraints are refused at Submit naming the field", "[scheduler]") {
  auto engine = MakeEngine(testing::EngineSetup{});
  GenerateRequest r =
      Constrained(Spec(GrammarSpec::Kind::kJsonSchema,
                       R"({"type":"object","properties":{"a":{"type":"string","pattern":"x"}}})",
                       "response_format.json_schema.schema"),
                  0.0f, 0);
  auto s = engine->Submit(r);
  REQUIRE(s.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(ErrorField(s.status()) == "response_format.json_schema.schema.properties.a.pattern");
  CHECK(s.status().message() ==
        "response_format.json_schema.schema.properties.a.pattern: the JSON Schema keyword "
        "'pattern' is not supported");
  r.constraint = Spec(GrammarSpec::Kind::kRegex, "(a", "guided_regex");
  s = engine->Submit(r);
  CHECK(ErrorField(s.status()) == "guided_regex");
  r.constraint = Spec(GrammarSpec::Kind::kRegex, "", "guided_regex");
  s = engine->Submit(r);
  CHECK(s.status().message() ==
        "guided_regex: matches only the empty text, so no token can be generated");
  testing::RequireAllBlocksFree(*engine);
}

TEST_CASE("Sequence grammar: end tokens only where the grammar may end and no token is no mask",
          "[scheduler]") {
  // Token 0 is EOS (no bytes); 'a' and 'b' exist, 'c' does not.
  auto vocab = std::make_shared<TokenVocab>(std::vector<std::string>{"", "a", "b", "ab"});
  GrammarBuilder b;
  GrammarSpec spec = Spec(GrammarSpec::Kind::kRegex, "a(b|c)?", "guided_regex");
  REQUIRE(BuildGrammar(spec, &b).ok());
  SequenceGrammar g(std::make_shared<const CompiledGrammar>(b.Lower(), vocab));
  const std::vector<int32_t> eos = {0};
  REQUIRE(g.PrepareMask(eos));
  CHECK(g.mask()[0] == 0b1010u);  // a, ab
  REQUIRE(g.Accept("a"));
  REQUIRE(g.PrepareMask(eos));
  CHECK(g.mask()[0] == 0b0101u);  // EOS, b
  GrammarBuilder b2;
  REQUIRE(BuildGrammar(Spec(GrammarSpec::Kind::kRegex, "ac", "guided_regex"), &b2).ok());
  SequenceGrammar dead(std::make_shared<const CompiledGrammar>(b2.Lower(), vocab));
  REQUIRE(dead.Accept("a"));
  CHECK_FALSE(dead.PrepareMask(eos));  // no token spells 'c'
}

}  // namespace
}  // namespace kvserve

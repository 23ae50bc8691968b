// The token mask against brute force: for every state met along random
// walks, FillMask (cached masks, canonical repeat copies, walks over the long
// tokens only) must set exactly the tokens whose bytes Advance accepts one by
// one. The vocabulary has tokens far longer than the bounded repeats'
// remaining counts, where sharing a mask between repeat copies could go
// wrong.
#include <catch2/catch.hpp>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "model/grammar/grammar_compiler.h"
#include "model/grammar/grammar_matcher.h"

namespace kvserve {
namespace {

// 256 single bytes, then 4,000 strings of 2 to 64 bytes over what the test
// grammars read (letters, digits, JSON punctuation, escapes, multi-byte
// UTF-8 and its pieces), many of them runs of one byte as real vocabularies
// have ("    ", "----"), and some repeated as the same bytes.
std::vector<std::string> TestVocab() {
  std::vector<std::string> tokens;
  for (int b = 0; b < 256; ++b) tokens.push_back(std::string(1, static_cast<char>(b)));
  const std::vector<std::string> pieces = {
      "a",    "b",      "e",       "x",   "Z",   " ",    "0",     "7",    "-",       "\"",
      "\\",   ":",      ",",       "{",   "}",   "[",    "]",     "\n",   "u",       "true",
      "null", "name",   "\\u00e9", "é",   "€",   "\xe2", "\x82",  "\t",   "\\n",     "ab c",
      "12",   "\", \"", "\":",     "\",", "\"}", "\"]",  "\",\"", "\"},", "\\u20ac", "\\\""};
  std::mt19937_64 rng(11);
  while (tokens.size() < 4256) {
    const size_t len = 2 + rng() % (rng() % 4 == 0 ? 63 : 12);
    std::string t;
    if (rng() % 5 == 0) {
      const std::string& p = pieces[rng() % pieces.size()];
      while (t.size() < len) t += p;
    } else {
      while (t.size() < len) t += pieces[rng() % pieces.size()];
    }
    t.resize(std::min(t.size(), size_t{64}));
    tokens.push_back(t);
    if (rng() % 50 == 0) tokens.push_back(t);  // a duplicate id
  }
  tokens.push_back("");  // a control token: never allowed
  return tokens;
}

std::shared_ptr<const CompiledGrammar> Compile(GrammarSpec::Kind kind, std::string text,
                                               std::shared_ptr<const TokenVocab> vocab) {
  GrammarSpec spec;
  spec.kind = kind;
  spec.text = std::move(text);
  spec.field = "grammar";
  GrammarBuilder b;
  absl::Status s = BuildGrammar(spec, &b);
  INFO(std::string(s.message()));
  REQUIRE(s.ok());
  return std::make_shared<const CompiledGrammar>(b.Lower(), std::move(vocab));
}

// Walks the grammar `walks` times from its start, comparing every mask with
// the brute-force one; returns the states compared.
int CompareAlongWalks(const std::shared_ptr<const CompiledGrammar>& g, int walks, int max_steps,
                      uint64_t seed) {
  const TokenVocab& vocab = g->vocab();
  std::mt19937_64 rng(seed);
  std::vector<uint32_t> mask(vocab.mask_words());
  int compared = 0;
  for (int w = 0; w < walks; ++w) {
    GrammarMatcher m(g);
    for (int step = 0; step < max_steps && !m.MustEnd(); ++step) {
      const int32_t count = m.FillMask(mask);
      std::vector<int32_t> allowed;
      int32_t mismatches = 0;
      for (int32_t id = 0; id < vocab.vocab_size(); ++id) {
        GrammarMatcher probe = m;
        const bool expected = !vocab.bytes(id).empty() && probe.AcceptBytes(vocab.bytes(id));
        const bool got = (mask[id >> 5] >> (id & 31)) & 1;
        if (expected != got) {
          ++mismatches;
          UNSCOPED_INFO("token " << id << " '" << vocab.bytes(id) << "' expected " << expected);
        }
        if (expected) allowed.push_back(id);
      }
      INFO("walk " << w << " step " << step);
      REQUIRE(mismatches == 0);
      REQUIRE(count == static_cast<int32_t>(allowed.size()));
      ++compared;
      if (allowed.empty() || (m.CanEnd() && rng() % 4 == 0)) break;
      // Mostly long tokens, which cross the most repeat copies, and now and
      // then the shortest, which stays longest inside a repeat.
      int32_t id = allowed[rng() % allowed.size()];
      for (int tries = 0; tries < 3; ++tries) {
        const int32_t other = allowed[rng() % allowed.size()];
        if (vocab.bytes(other).size() > vocab.bytes(id).size()) id = other;
      }
      if (rng() % 3 == 0) {
        for (int32_t a : allowed) {
          if (vocab.bytes(a).size() < vocab.bytes(id).size()) id = a;
        }
      }
      REQUIRE(m.AcceptBytes(vocab.bytes(id)));
    }
  }
  return compared;
}

TEST_CASE("Grammar mask: equals brute force along random walks, long tokens included",
          "[grammar]") {
  auto vocab = std::make_shared<const TokenVocab>(TestVocab());
  REQUIRE(vocab->vocab_size() > 4000);
  REQUIRE(vocab->max_token_bytes() == 64);
  using Kind = GrammarSpec::Kind;

  SECTION("a schema of bounded strings, a bounded array of them and an integer range") {
    auto g = Compile(Kind::kJsonSchema,
                     R"({"type":"object","properties":{"name":{"type":"string","maxLength":32},)"
                     R"("code":{"type":"string","minLength":20,"maxLength":40},)"
                     R"("age":{"type":"integer","minimum":0,"maximum":150},"tags":{"type":"array",)"
                     R"("items":{"type":"string","maxLength":12},"maxItems":5}},)"
                     R"("required":["name","code","age","tags"]})",
                     vocab);
    CHECK(CompareAlongWalks(g, 12, 60, 1) > 100);
    CHECK(g->cache_hits() + g->walks() > g->full_walks());
  }
  SECTION("the bench's regex, and mandatory copies and nested bounded repeats") {
    auto g = Compile(Kind::kRegex, "[0-9]{3}-[0-9]{4} [A-Za-z ]{1,40}", vocab);
    CHECK(CompareAlongWalks(g, 15, 40, 2) > 60);
    g = Compile(Kind::kRegex, "[ab]{30,50}(x[ a-z]{2,20}\"){1,6}", vocab);
    CHECK(CompareAlongWalks(g, 15, 40, 3) > 60);
  }
  SECTION("a recursive GBNF with bounded repeats inside the recursion") {
    auto g = Compile(Kind::kGbnf, R"(root ::= list
list ::= "[" (item ("," item){0,8})? "]"
item ::= list | [a-z ]{1,30} | "\"" [^"\\]{0,25} "\"")",
                     vocab);
    CHECK(CompareAlongWalks(g, 12, 50, 4) > 60);
  }
  SECTION("strings of many length ranges, nested, in arrays and next to enums (shared rules)") {
    // Fields of one range share their string rule's masks; the tokens that
    // close a string and go on ("," "}" "]" ",\"") are checked against what
    // follows each field.
    auto g =
        Compile(Kind::kJsonSchema,
                R"({"type":"object","properties":{)"
                R"("a":{"type":"string","maxLength":6},"b":{"type":"string","maxLength":6},)"
                R"("c":{"type":"string","minLength":3,"maxLength":9},)"
                R"("d":{"enum":["x","yy",3]},"e":{"type":"string","maxLength":6},)"
                R"("f":{"type":"object","properties":{"g":{"type":"string","minLength":2},)"
                R"("h":{"type":"array","items":{"type":"string","maxLength":4},"maxItems":4},)"
                R"("i":{"type":"string","maxLength":6}},"required":["g","h","i"]},)"
                R"("j":{"type":"array","items":{"type":"string","minLength":1,"maxLength":3}},)"
                R"("k":{"type":"string"}},"required":["a","b","c","d","e","f","j"]})",
                vocab);
    CHECK(CompareAlongWalks(g, 16, 80, 6) > 300);
    CHECK(g->cut_masks() > 30);
  }
  SECTION("a string at the end of an object, of an array and of the whole grammar") {
    auto g = Compile(Kind::kJsonSchema,
                     R"({"anyOf":[{"type":"string","maxLength":5},{"type":"array","items":)"
                     R"({"type":"object","properties":{"s":{"type":"string","maxLength":5}},)"
                     R"("required":["s"],"additionalProperties":false}}]})",
                     vocab);
    CHECK(CompareAlongWalks(g, 40, 40, 7) > 100);
    CHECK(g->cut_masks() > 5);
  }
  SECTION("json_object") {
    auto g = Compile(Kind::kJsonObject, "", vocab);
    CHECK(CompareAlongWalks(g, 8, 50, 5) > 60);
    CHECK(g->cut_masks() > 0);
  }
}

TEST_CASE("Grammar mask: a repeat copy far from both ends shares its mask", "[grammar]") {
  // 100 copies of [ab] and tokens of at most 3 bytes: copies with at least
  // 4 after them read the same next 3 bytes, so their masks are one cached
  // mask at the last length level.
  auto vocab = std::make_shared<const TokenVocab>(
      std::vector<std::string>{"a", "b", "ab", "aba", "c", "ac", "bbc"});
  auto g = Compile(GrammarSpec::Kind::kRegex, "[ab]{100}c", vocab);
  GrammarMatcher m(g);
  std::vector<uint32_t> mask(vocab->mask_words());
  CHECK(m.FillMask(mask) == 4);  // a b ab aba
  for (int i = 0; i < 90; ++i) {
    REQUIRE(m.AcceptBytes("a"));
    CHECK(m.FillMask(mask) == 4);
  }
  CHECK(g->full_walks() == 1);
  for (int i = 0; i < 8; ++i) REQUIRE(m.AcceptBytes("b"));
  CHECK(m.FillMask(mask) == 4);  // two left: a b ab bbc (aba would need three)
  CHECK(mask[0] == 0b100'0111u);
  REQUIRE(m.AcceptBytes("b"));
  CHECK(m.FillMask(mask) == 3);  // one left: a b ac
  CHECK(mask[0] == 0b010'0011u);
}

}  // namespace
}  // namespace kvserve

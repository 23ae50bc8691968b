#include "model/grammar/grammar_matcher.h"

#include <catch2/catch.hpp>
#include <memory>
#include <string>
#include <vector>

#include "model/grammar/grammar_compiler.h"

namespace kvserve {
namespace {

std::shared_ptr<const CompiledGrammar> Compile(const GrammarSpec& spec,
                                               std::shared_ptr<const TokenVocab> vocab) {
  GrammarBuilder b;
  absl::Status s = BuildGrammar(spec, &b);
  INFO(std::string(s.message()));
  REQUIRE(s.ok());
  return std::make_shared<const CompiledGrammar>(b.Lower(), std::move(vocab));
}

GrammarSpec Regex(std::string pattern) {
  GrammarSpec s;
  s.kind = GrammarSpec::Kind::kRegex;
  s.text = std::move(pattern);
  s.field = "guided_regex";
  return s;
}

GrammarSpec Schema(std::string schema) {
  GrammarSpec s;
  s.kind = GrammarSpec::Kind::kJsonSchema;
  s.text = std::move(schema);
  s.field = "response_format.json_schema.schema";
  return s;
}

bool Matches(const GrammarSpec& spec, const std::string& text) {
  auto g = Compile(spec, std::make_shared<TokenVocab>(std::vector<std::string>{"x"}));
  GrammarMatcher m(g);
  return m.AcceptBytes(text) && m.CanEnd();
}

std::vector<int32_t> Allowed(const GrammarMatcher& m) {
  std::vector<uint32_t> mask(m.grammar().vocab().mask_words());
  const int32_t count = m.FillMask(mask);
  std::vector<int32_t> ids;
  for (int32_t id = 0; id < m.grammar().vocab().vocab_size(); ++id) {
    if ((mask[id >> 5] >> (id & 31)) & 1) ids.push_back(id);
  }
  CHECK(count == static_cast<int32_t>(ids.size()));
  return ids;
}

TEST_CASE("TokenVocab: the trie is in preorder with subtree ends and leaves out empty tokens",
          "[grammar]") {
  TokenVocab v({"ab", "", "a", "b", "abc", "a"});
  const auto& n = v.nodes();
  // a, ab, abc, b
  REQUIRE(n.size() == 4);
  CHECK(n[0].byte == 'a');
  CHECK(n[0].depth == 1);
  CHECK(n[0].subtree_end == 3);
  CHECK(n[0].num_tokens == 2);
  CHECK(v.node_tokens(n[0])[0] == 2);
  CHECK(v.node_tokens(n[0])[1] == 5);
  CHECK(n[1].byte == 'b');
  CHECK(n[1].depth == 2);
  CHECK(v.node_tokens(n[1])[0] == 0);
  CHECK(n[2].byte == 'c');
  CHECK(n[2].depth == 3);
  CHECK(n[2].subtree_end == 3);
  CHECK(n[3].byte == 'b');
  CHECK(n[3].depth == 1);
  CHECK(n[3].subtree_end == 4);
  CHECK(v.mask_words() == 1);
}

TEST_CASE("Grammar mask: exact allowed sets over a tiny vocabulary for a choice list",
          "[grammar]") {
  auto vocab = std::make_shared<TokenVocab>(
      std::vector<std::string>{"", "y", "ye", "yes", "n", "no", "s", "es", "o", "yesno", " "});
  GrammarSpec spec;
  spec.kind = GrammarSpec::Kind::kChoice;
  spec.choices = {"yes", "no"};
  GrammarMatcher m(Compile(spec, vocab));
  CHECK(Allowed(m) == std::vector<int32_t>{1, 2, 3, 4, 5});
  CHECK_FALSE(m.CanEnd());
  REQUIRE(m.AcceptBytes("y"));
  CHECK(Allowed(m) == std::vector<int32_t>{7});  // "es"
  REQUIRE(m.AcceptBytes("es"));
  CHECK(m.CanEnd());
  CHECK(m.MustEnd());
  CHECK(Allowed(m).empty());
  CHECK_FALSE(m.AcceptBytes("s"));
  CHECK(m.CanEnd());  // a rejected byte leaves the state as it was
}

TEST_CASE("Grammar mask: a cached state gives the same mask as its first walk", "[grammar]") {
  auto vocab = std::make_shared<TokenVocab>(std::vector<std::string>{"a", "b", "ab", "\"", "a\""});
  auto g = Compile(Schema(R"({"type":"string"})"), vocab);
  GrammarMatcher m(g);
  CHECK(Allowed(m) == std::vector<int32_t>{3});
  REQUIRE(m.AcceptBytes("\""));
  const std::vector<int32_t> first = Allowed(m);
  CHECK(first == std::vector<int32_t>{0, 1, 2, 3, 4});
  const int64_t walks = g->walks();
  REQUIRE(m.AcceptBytes("ab"));
  CHECK(Allowed(m) == first);
  CHECK(g->walks() == walks);
  CHECK(g->cache_hits() >= 1);
}

TEST_CASE("Regex subset: classes quantifiers groups and alternation match exactly", "[grammar]") {
  CHECK(Matches(Regex("[a-c]{2,3}x?"), "abx"));
  CHECK(Matches(Regex("[a-c]{2,3}x?"), "abc"));
  CHECK_FALSE(Matches(Regex("[a-c]{2,3}x?"), "a"));
  CHECK_FALSE(Matches(Regex("[a-c]{2,3}x?"), "abca"));
  CHECK(Matches(Regex("^(cat|dog)s?$"), "dogs"));
  CHECK_FALSE(Matches(Regex("(cat|dog)s?"), "cow"));
  CHECK(Matches(Regex("\\d+\\.\\d{2}"), "12.50"));
  CHECK_FALSE(Matches(Regex("\\d+\\.\\d{2}"), "12x50"));
  CHECK(Matches(Regex("[^a]+"), "bé"));
  CHECK_FALSE(Matches(Regex("[^a]+"), "ba"));
  CHECK(Matches(Regex("(?:ab)*"), ""));
  CHECK(Matches(Regex("(?:ab)*"), "abab"));
  CHECK(Matches(Regex("é+"), "éé"));
  CHECK(Matches(Regex("a.c"), "a€c"));
  CHECK_FALSE(Matches(Regex("a.c"), "a\nc"));
}

TEST_CASE("Regex subset: unsupported constructs are refused naming the offset", "[grammar]") {
  GrammarBuilder b;
  auto err = [&](const std::string& p) {
    GrammarBuilder bb;
    return std::string(BuildGrammar(Regex(p), &bb).message());
  };
  CHECK(err("(a)\\1") ==
        "guided_regex: backreferences are not supported at offset 4 of the pattern");
  CHECK(err("a(?=b)") ==
        "guided_regex: lookaround and named groups are not supported at offset 2 of the pattern");
  CHECK(err("a{5000}") == "guided_regex: a count above 4096 at offset 5 of the pattern");
  CHECK(err("(ab") == "guided_regex: ')' is expected at offset 3 of the pattern");
  CHECK(err("*a") ==
        "guided_regex: a quantifier with nothing to repeat at offset 0 of the pattern");
}

}  // namespace
}  // namespace kvserve

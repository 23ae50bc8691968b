// GBNF grammars (model/grammar/gbnf.h): llama.cpp's syntax into the grammar
// engine, code-point classes encoded as UTF-8, and the errors that name the
// line and column; the nesting and size bounds every grammar kind shares.
#include "model/grammar/gbnf.h"

#include <catch2/catch.hpp>
#include <memory>
#include <string>
#include <vector>

#include "model/grammar/grammar_compiler.h"
#include "model/grammar/grammar_matcher.h"

namespace kvserve {
namespace {

GrammarSpec Gbnf(std::string text) {
  GrammarSpec s;
  s.kind = GrammarSpec::Kind::kGbnf;
  s.text = std::move(text);
  s.field = "guided_grammar";
  return s;
}

std::shared_ptr<const CompiledGrammar> Compile(const GrammarSpec& spec,
                                               std::vector<std::string> tokens = {"x"}) {
  GrammarBuilder b;
  absl::Status s = BuildGrammar(spec, &b);
  INFO(std::string(s.message()));
  REQUIRE(s.ok());
  return std::make_shared<const CompiledGrammar>(b.Lower(),
                                                 std::make_shared<TokenVocab>(std::move(tokens)));
}

// Whether the whole text is in the grammar's language.
bool Matches(const std::shared_ptr<const CompiledGrammar>& g, const std::string& text) {
  GrammarMatcher m(g);
  return m.AcceptBytes(text) && m.CanEnd();
}

std::string ErrorOf(const GrammarSpec& spec) {
  GrammarBuilder b;
  absl::Status s = BuildGrammar(spec, &b);
  REQUIRE_FALSE(s.ok());
  CHECK(s.code() == absl::StatusCode::kInvalidArgument);
  return std::string(s.message());
}

std::string Utf8(uint32_t cp) {
  std::string s;
  if (cp < 0x80) {
    s += static_cast<char>(cp);
  } else if (cp < 0x800) {
    s += static_cast<char>(0xc0 | (cp >> 6));
    s += static_cast<char>(0x80 | (cp & 0x3f));
  } else if (cp < 0x10000) {
    s += static_cast<char>(0xe0 | (cp >> 12));
    s += static_cast<char>(0x80 | ((cp >> 6) & 0x3f));
    s += static_cast<char>(0x80 | (cp & 0x3f));
  } else {
    s += static_cast<char>(0xf0 | (cp >> 18));
    s += static_cast<char>(0x80 | ((cp >> 12) & 0x3f));
    s += static_cast<char>(0x80 | ((cp >> 6) & 0x3f));
    s += static_cast<char>(0x80 | (cp & 0x3f));
  }
  return s;
}

TEST_CASE("GBNF: rules, references before definitions, groups, classes and comments", "[grammar]") {
  auto g = Compile(Gbnf(R"gbnf(# arithmetic, as in llama.cpp's examples
root ::= expr
expr ::= term (op term)*   # a comment after a rule
op   ::= [-+*/]
term ::= num
       | "(" expr ")"
num  ::= [0-9]+
)gbnf"));
  CHECK(Matches(g, "1"));
  CHECK(Matches(g, "12+3*(4-5)/6"));
  CHECK(Matches(g, "((7))"));
  CHECK_FALSE(Matches(g, ""));
  CHECK_FALSE(Matches(g, "1+"));
  CHECK_FALSE(Matches(g, "+1"));
  CHECK_FALSE(Matches(g, "(1"));
  CHECK_FALSE(Matches(g, "1 + 2"));  // no whitespace rule

  // A body continued inside parentheses over lines; '?' and an empty literal.
  g = Compile(Gbnf("root ::= (\n  \"a\"\n  \"b\"?\n) \"\" \"c\"\n"));
  CHECK(Matches(g, "ac"));
  CHECK(Matches(g, "abc"));
  CHECK_FALSE(Matches(g, "abbc"));
  // No trailing newline, CRLF line ends, '_' in names.
  g = Compile(Gbnf("root ::= my_rule my-rule\r\nmy_rule ::= \"x\"\r\nmy-rule ::= \"y\""));
  CHECK(Matches(g, "xy"));
  CHECK_FALSE(Matches(g, "x"));
}

TEST_CASE("GBNF: counted repetition {m} {m,} {,n} {m,n}", "[grammar]") {
  auto count = [](const std::string& q) { return Compile(Gbnf("root ::= \"a\"" + q + "\n")); };
  auto exactly = count("{3}");
  CHECK_FALSE(Matches(exactly, "aa"));
  CHECK(Matches(exactly, "aaa"));
  CHECK_FALSE(Matches(exactly, "aaaa"));
  auto at_least = count("{2,}");
  CHECK_FALSE(Matches(at_least, "a"));
  CHECK(Matches(at_least, "aa"));
  CHECK(Matches(at_least, std::string(50, 'a')));
  auto at_most = count("{,2}");
  CHECK(Matches(at_most, ""));
  CHECK(Matches(at_most, "aa"));
  CHECK_FALSE(Matches(at_most, "aaa"));
  auto between = count("{ 1 , 3 }");
  CHECK_FALSE(Matches(between, ""));
  CHECK(Matches(between, "a"));
  CHECK(Matches(between, "aaa"));
  CHECK_FALSE(Matches(between, "aaaa"));
  auto star_plus = Compile(Gbnf(R"(root ::= "x"* "y"+)"));
  CHECK(Matches(star_plus, "y"));
  CHECK(Matches(star_plus, "xxyy"));
  CHECK_FALSE(Matches(star_plus, "xx"));
}

TEST_CASE("GBNF: literals and classes are over code points, encoded as UTF-8", "[grammar]") {
  auto greek = Compile(Gbnf("root ::= [α-ω]+\n"));
  CHECK(Matches(greek, "αβγω"));
  CHECK_FALSE(Matches(greek, "a"));
  CHECK_FALSE(Matches(greek, "Ω"));  // U+03A9, below α
  auto not_a = Compile(Gbnf("root ::= [^a]\n"));
  for (const char* s : {"b", "\n", "é", "日", "😀"}) {
    INFO(s);
    CHECK(Matches(not_a, s));
  }
  CHECK_FALSE(Matches(not_a, "a"));
  CHECK_FALSE(Matches(not_a, "bb"));
  auto dot = Compile(Gbnf("root ::= . .\n"));
  CHECK(Matches(dot, "\n😀"));
  CHECK(Matches(dot, "ab"));
  CHECK_FALSE(Matches(dot, "a"));
  // Escapes name code points: \xHH is U+00HH, not a raw byte.
  auto esc = Compile(Gbnf(R"(root ::= "\x41\u00e9\U0001F600\t\"\\" [\]\-\x00-\x08])"));
  CHECK(Matches(esc, "Aé😀\t\"\\]"));
  CHECK(Matches(esc, std::string("Aé😀\t\"\\") + '\0'));
  CHECK(Matches(esc, "Aé😀\t\"\\-"));
  CHECK_FALSE(Matches(esc, "Aé😀\t\"\\a"));
  // Ill-formed UTF-8 is never accepted: an encoded surrogate, an overlong
  // form, a lone continuation byte.
  for (const char* bad : {"\xed\xa0\x80", "\xc0\x80", "\x80"}) CHECK_FALSE(Matches(not_a, bad));
}

TEST_CASE("CodePointClass: membership equals the ranges at every UTF-8 boundary", "[grammar]") {
  // Ranges that straddle each encoded-length boundary and the surrogates.
  const std::vector<std::pair<uint32_t, uint32_t>> ranges = {
      {0x41, 0x5a},     {0x7e, 0x81},      {0x7fe, 0x801},
      {0xd7fe, 0xe001}, {0xfffe, 0x10001}, {0x10fff0, 0x10ffff}};
  auto in = [&](uint32_t cp) {
    if (cp >= 0xd800 && cp <= 0xdfff) return false;
    for (auto [lo, hi] : ranges) {
      if (cp >= lo && cp <= hi) return true;
    }
    return false;
  };
  for (bool negated : {false, true}) {
    GrammarBuilder b;
    const RuleId root = b.NewRule("root");
    b.SetBody(root, CodePointClass(&b, ranges, negated));
    auto g = std::make_shared<const CompiledGrammar>(
        b.Lower(), std::make_shared<TokenVocab>(std::vector<std::string>{"x"}));
    std::vector<uint32_t> probes;
    for (uint32_t cp = 0; cp <= 0x10ffff; cp += 251) probes.push_back(cp);
    for (auto [lo, hi] : ranges) {
      for (uint32_t cp : {lo - 1, lo, hi, hi + 1}) probes.push_back(cp);
    }
    for (uint32_t cp : {0x7fu, 0x80u, 0x7ffu, 0x800u, 0xffffu, 0x10000u, 0xd7ffu, 0xe000u}) {
      probes.push_back(cp);
    }
    int members = 0;
    for (uint32_t cp : probes) {
      if (cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) continue;
      const bool expected = in(cp) != negated;
      members += expected;
      INFO("U+" << std::hex << cp << (negated ? " negated" : ""));
      CHECK(Matches(g, Utf8(cp)) == expected);
    }
    CHECK(members > 10);
  }
}

TEST_CASE("GBNF: the allowed-token mask follows the grammar", "[grammar]") {
  auto g = Compile(Gbnf(R"(root ::= "yes" | "no" | [0-9]{2})"),
                   {"y", "es", "no", "n", "o", "x", "4", "42", "421"});
  GrammarMatcher m(g);
  std::vector<uint32_t> mask(g->vocab().mask_words());
  CHECK(m.FillMask(mask) == 5);  // y, no, n, 4, 42
  CHECK(mask[0] == 0b1100'1101u);
  REQUIRE(m.AcceptBytes("4"));
  CHECK(m.FillMask(mask) == 1);  // only "4" completes [0-9]{2}
  CHECK(mask[0] == 0b00'0100'0000u);
  REQUIRE(m.AcceptBytes("2"));
  CHECK(m.CanEnd());
  CHECK(m.MustEnd());
}

TEST_CASE("GBNF: errors name the line and column", "[grammar]") {
  CHECK(ErrorOf(Gbnf("root ::= a\n\nb ::= \"x\"\n  c ::= \"y\"\n")) ==
        "guided_grammar: line 1 column 10: the rule 'a' is used but never defined");
  CHECK(ErrorOf(Gbnf("a ::= \"x\"\n")) == "guided_grammar: the grammar has no 'root' rule");
  CHECK(ErrorOf(Gbnf("root ::= \"x\"\nroot ::= \"y\"\n")) ==
        "guided_grammar: line 2 column 1: the rule 'root' is defined twice");
  CHECK(ErrorOf(Gbnf("root ::= expr\nexpr ::= expr \"+\" num | num\nnum ::= [0-9]\n")) ==
        "guided_grammar: line 2 column 1: the rule 'expr' is left-recursive (it can reach "
        "itself before reading a character); rewrite it with repetition");
  // Through a nullable prefix and another rule.
  CHECK(ErrorOf(Gbnf("root ::= a\na ::= \"\"? b \"x\"\nb ::= \"y\"* a | \"z\"\n"))
            .find("is left-recursive") != std::string::npos);
  CHECK(ErrorOf(Gbnf("root ::= \"a\n\"")) ==
        "guided_grammar: line 1 column 12: an unterminated string literal");
  CHECK(ErrorOf(Gbnf("root ::= [a-")) ==
        "guided_grammar: line 1 column 13: an unterminated character class");
  CHECK(ErrorOf(Gbnf("root ::= [z-a]")) ==
        "guided_grammar: line 1 column 14: a character range with its end before its start");
  CHECK(ErrorOf(Gbnf("root ::= <think> \"x\"")) ==
        "guided_grammar: line 1 column 10: token references (<...>) are not supported");
  CHECK(ErrorOf(Gbnf("root = \"x\"")) ==
        "guided_grammar: line 1 column 6: '::=' is expected after the rule name");
  CHECK(ErrorOf(Gbnf("root ::= \"x\" )")) == "guided_grammar: line 1 column 14: unbalanced ')'");
  CHECK(ErrorOf(Gbnf("root ::= * \"x\"")) ==
        "guided_grammar: line 1 column 10: a quantifier with nothing before it");
  CHECK(ErrorOf(Gbnf("root ::= \"x\"{4097}")) ==
        "guided_grammar: line 1 column 17: a count above 4096");
  CHECK(ErrorOf(Gbnf("root ::= \"x\"{3,2}")) ==
        "guided_grammar: line 1 column 17: a count range {m,n} with n < m");
  CHECK(ErrorOf(Gbnf(R"(root ::= "\ud800")")) ==
        "guided_grammar: line 1 column 17: the escape is not a Unicode scalar value");
  CHECK(ErrorOf(Gbnf(R"(root ::= "\q")")) ==
        "guided_grammar: line 1 column 12: the escape \\q is not supported");
}

TEST_CASE("Grammars: deep nesting and repeats that multiply are refused, not run", "[grammar]") {
  // Each would overflow the stack or lower into billions of states.
  const std::string deep = std::string(200, '(') + "\"a\"" + std::string(200, ')');
  CHECK(ErrorOf(Gbnf("root ::= " + deep)) ==
        "guided_grammar: line 1 column 138: groups nest deeper than 128 levels");
  GrammarSpec regex;
  regex.kind = GrammarSpec::Kind::kRegex;
  regex.field = "guided_regex";
  regex.text = std::string(200, '(') + "a" + std::string(200, ')');
  CHECK(ErrorOf(regex) ==
        "guided_regex: groups nest deeper than 128 levels at offset 128 of the "
        "pattern");
  const std::string too_big =
      "guided_grammar: the grammar expands to more than 2097152 states (bounded repeats nested in "
      "one another multiply); use smaller counts or unbounded repeats";
  CHECK(ErrorOf(Gbnf(R"(root ::= ("a"{4096}){4096})")) == too_big);
  regex.text = "(a{2000}){2000}";
  CHECK(ErrorOf(regex).find("expands to more than 2097152 states") != std::string::npos);
  // Just under the bound compiles.
  GrammarBuilder b;
  CHECK(BuildGrammar(Gbnf(R"(root ::= ("ab"{100}){100})"), &b).ok());
  CHECK(b.LoweredStates(kMaxGrammarStates) < kMaxGrammarStates);
  CHECK(b.LoweredStates(kMaxGrammarStates) == static_cast<int64_t>(b.Lower().states.size()));
}

}  // namespace
}  // namespace kvserve

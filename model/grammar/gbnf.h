// GBNF (the grammar format of llama.cpp's grammars/README.md) -> grammar
// rules (model/grammar/grammar.h), for guided_grammar and
// structured_outputs.grammar.
//
// Supported: rules `name ::= alternatives` (names of letters, digits, '-'
// and '_'; `root` is the start rule; a rule may be defined after its first
// reference, and its body may continue on the next line after '|' or inside
// parentheses), string literals "..." and character classes [...] / [^...]
// with ranges, over Unicode code points (encoded as UTF-8; surrogates and
// code points above U+10FFFF match nothing), '.' (any one character, newline
// included, as in llama.cpp), groups ( ), the quantifiers * + ? {m} {m,}
// {m,n} {,n}, escapes \t \n \r \xHH \uHHHH \UHHHHHHHH and escaped
// punctuation (\" \\ \[ \] \-), and # comments.
//
// Refused, with the line and column named: an undefined rule, a rule
// defined twice, no root rule, groups nested deeper than 128 levels,
// left recursion (a rule that can reach itself
// without reading a character: the matcher would only cut it at its stack
// depth), token references (<...>), counts above kMaxRepeat, and malformed
// syntax.
//
// Thread-safety: free function.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "model/grammar/grammar.h"

namespace kvserve {

// Builds the grammar's rules into `builder`, with GBNF's `root` as `root`.
// `path` prefixes error messages (e.g. "guided_grammar").
absl::Status BuildGbnfGrammar(std::string_view text, const std::string& path,
                              GrammarBuilder* builder, RuleId root);

// The expression matching one character of the code point ranges
// (inclusive, any order, overlaps allowed), or of every other character
// when `negated`; surrogates and code points above U+10FFFF never match.
ExprId CodePointClass(GrammarBuilder* builder, std::vector<std::pair<uint32_t, uint32_t>> ranges,
                      bool negated);

}  // namespace kvserve

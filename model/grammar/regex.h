// A regex subset -> grammar expression (model/grammar/grammar.h), for
// guided_regex and tool-call formats. The whole output must match (the
// pattern is anchored at both ends; a leading ^ and trailing $ are accepted
// and mean the same).
//
// Supported: literals (UTF-8 characters included), escapes \d \w \s \D \W \S
// \t \n \r \f \v \0 \xHH and escaped punctuation, '.', classes [...] with
// ranges and negation (ASCII members; a negated class and '.' match any
// other UTF-8 character, '.' not a newline), groups (...) and (?:...),
// alternation, and the quantifiers * + ? {m} {m,} {m,n} (lazy forms read as
// greedy: only the language matters here). Refused, with the offset named:
// backreferences, lookaround, anchors inside the pattern, \b, named groups,
// possessive quantifiers, counts above kMaxRepeat and groups nested deeper
// than 128 levels.
//
// Thread-safety: free function.
#pragma once

#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "model/grammar/grammar.h"

namespace kvserve {

// `path` prefixes error messages (e.g. "guided_regex").
absl::StatusOr<ExprId> BuildRegexExpr(std::string_view pattern, const std::string& path,
                                      GrammarBuilder* builder);

}  // namespace kvserve

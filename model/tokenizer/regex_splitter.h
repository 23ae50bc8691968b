// RegexSplitter: the pre-tokenizer step "split this text with that regex",
// as Hugging Face tokenizers' Split and ByteLevel(use_regex) do it, run with
// PCRE2 (UTF mode + Unicode properties, JIT-compiled once).
//
// Patterns come from tokenizer.json and were written for Oniguruma, the
// engine HF tokenizers runs. The two agree on the syntax these files use
// (\p{L}, \p{N}, (?i:...), lookahead) but not on \s: Oniguruma's \s is
// Unicode White_Space, PCRE2's also matches U+180E and is missing nothing
// else, so \s and \S outside a character class and \s inside one are
// rewritten to an explicit White_Space class (OnigurumaWhitespace below).
// Text that is not valid UTF-8 is matched anyway: invalid bytes match
// nothing and end up in the gaps between matches.
//
// Split with behavior "Isolated" (the only one real checkpoints use) keeps
// matches and the gaps between them as pieces, in order; "Removed" drops the
// matches. Empty pieces are never produced.
//
// Thread-safety: immutable after Compile; Split is safe from any thread.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace kvserve {

class RegexSplitter {
 public:
  enum class Behavior { kIsolated, kRemoved };

  // `pattern` is a regex, or a literal string when `literal`. `field` names
  // where it came from, for the error when it does not compile.
  static absl::StatusOr<RegexSplitter> Compile(const std::string& pattern, bool literal,
                                               Behavior behavior, const std::string& field);

  // Appends the pieces of `text` to *out; they point into `text`.
  void Split(std::string_view text, std::vector<std::string_view>* out) const;

 private:
  struct Code;
  RegexSplitter(std::shared_ptr<const Code> code, Behavior behavior)
      : code_(std::move(code)), behavior_(behavior) {}
  std::shared_ptr<const Code> code_;
  Behavior behavior_;
};

// `pattern` with \s (anywhere) and \S (outside a character class) replaced
// by Unicode White_Space classes, which is what they mean to Oniguruma.
std::string OnigurumaWhitespace(std::string_view pattern);

// The pre-tokenizer regex of GPT-2, used by ByteLevel with use_regex = true.
inline constexpr char kGpt2SplitPattern[] =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

}  // namespace kvserve

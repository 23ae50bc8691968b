// Grammar: a byte-level context-free grammar, built as expressions over byte
// classes (a JSON schema, a regex and a choice list all compile to one), then
// lowered to a recursive transition network (one Thompson NFA per rule, with
// call edges between rules) that GrammarMatcher runs.
//
// Building: GrammarBuilder hands out expression ids (Class, Literal, Seq, Alt,
// Repeat, Ref to a rule); every rule has one body; rule 0 is the start rule.
// Repeat with a bounded max expands into copies, so counts are capped at
// kMaxRepeat (a larger one is the caller's error to report).
//
// NFA invariants (after Lower): a rule's end state has no outgoing edge; a
// consuming edge carries a 256-bit byte set; a call edge enters a rule's start
// state and resumes at its target when that rule reaches its end.
//
// Repeat copies (GrammarNfa::repeats): the copies of a bounded repeat are
// lowered alike, so copy c's states are copy 0's shifted by a fixed offset;
// Lower records where each copy starts. A position d or more copies away
// from the repeat's ends reads the same next d bytes as the same position in
// another such copy (CompiledGrammar shares token masks through that).
//
// Shared rules (GrammarBuilder::MarkShared): a rule called from many places
// (a JSON string of one length range) whose inside reads the same bytes
// whoever called it; CompiledGrammar computes the tokens that stay inside
// it once for all callers and checks only those that return from it.
//
// Thread-safety: a built Grammar is immutable.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace kvserve {

// A set of bytes.
struct ByteSet {
  std::array<uint64_t, 4> bits{};
  void Add(uint8_t b) { bits[b >> 6] |= uint64_t{1} << (b & 63); }
  void AddRange(uint8_t lo, uint8_t hi) {
    for (int b = lo; b <= hi; ++b) Add(static_cast<uint8_t>(b));
  }
  bool Has(uint8_t b) const { return (bits[b >> 6] >> (b & 63)) & 1; }
  void Or(const ByteSet& o) {
    for (int i = 0; i < 4; ++i) bits[i] |= o.bits[i];
  }
  ByteSet Complement() const {
    ByteSet c;
    for (int i = 0; i < 4; ++i) c.bits[i] = ~bits[i];
    return c;
  }
  bool Empty() const { return !(bits[0] | bits[1] | bits[2] | bits[3]); }
  bool operator==(const ByteSet& o) const { return bits == o.bits; }
};

inline constexpr int32_t kMaxRepeat = 4096;
inline constexpr int32_t kUnbounded = -1;
// A repeat count's decimal digits at text[*pos], as the regex and GBNF
// parsers read them: the value, with *pos past the digits; kNoCount when
// there is no digit; kCountTooBig, with *pos at the digit that took the
// count over kMaxRepeat.
inline constexpr int32_t kNoCount = -1, kCountTooBig = -2;
inline int32_t ScanRepeatCount(std::string_view text, size_t* pos) {
  const size_t start = *pos;
  int32_t v = 0;
  for (; *pos < text.size() && text[*pos] >= '0' && text[*pos] <= '9'; ++*pos) {
    v = v * 10 + (text[*pos] - '0');
    if (v > kMaxRepeat) return kCountTooBig;
  }
  return *pos == start ? kNoCount : v;
}
// The most NFA states a request's grammar may lower to (GrammarCompiler
// refuses more): about 100 bytes each.
inline constexpr int64_t kMaxGrammarStates = int64_t{1} << 21;

using ExprId = int32_t;
using RuleId = int32_t;

struct GrammarExpr {
  enum class Kind : uint8_t { kEmpty, kClass, kSeq, kAlt, kRepeat, kRef };
  Kind kind = Kind::kEmpty;
  ByteSet bytes;                 // kClass
  std::vector<ExprId> children;  // kSeq, kAlt; kRepeat: one child
  int32_t min = 0, max = 0;      // kRepeat; max kUnbounded for no limit
  RuleId rule = -1;              // kRef
};

struct GrammarNfa {
  struct Edge {
    int32_t byteset = -1;  // index into bytesets; -1: epsilon or call
    int32_t call = -1;     // rule entered by a call edge
    int32_t target = 0;
  };
  struct State {
    std::vector<Edge> edges;
    int32_t rule_end = -1;  // >= 0: the end state of that rule
    bool consumes = false;  // has an edge with a byte set
  };
  // The copies of one bounded repeat whose child matches no empty string:
  // copy c is the states [entry[c], entry[c] + size), copies below `min`
  // are mandatory, and parent is the repeat whose copy holds these states
  // (-1: none).
  struct RepeatCopies {
    std::vector<int32_t> entry;  // ascending
    int32_t size = 0;
    int32_t min = 0;
    int32_t parent = -1;
  };
  std::vector<State> states;
  std::vector<ByteSet> bytesets;
  std::vector<int32_t> rule_start;  // [num_rules]
  int32_t start_rule = 0;
  std::vector<RepeatCopies> repeats;
  // [states] the innermost repeat with a copy that holds the state; -1 none.
  std::vector<int32_t> state_repeat;
  // [states] the rule whose body holds the state.
  std::vector<int32_t> state_rule;
  // [num_rules] 1 for a shared rule.
  std::vector<uint8_t> rule_shared;
};

class GrammarBuilder {
 public:
  GrammarBuilder();
  ExprId Empty();
  ExprId Class(const ByteSet& bytes);
  ExprId Byte(uint8_t b);
  ExprId Literal(std::string_view text);
  ExprId Seq(std::vector<ExprId> parts);
  ExprId Alt(std::vector<ExprId> options);
  ExprId Repeat(ExprId e, int32_t min, int32_t max);
  ExprId Optional(ExprId e) { return Repeat(e, 0, 1); }
  // A new rule without a body yet (for recursion); rule 0 is the start.
  RuleId NewRule(std::string name);
  void SetBody(RuleId rule, ExprId body);
  // Marks a rule as shared (see above): a hint for the mask, the language
  // stays the same.
  void MarkShared(RuleId rule) { rules_[rule].shared = true; }
  ExprId Ref(RuleId rule);
  int32_t num_rules() const { return static_cast<int32_t>(rules_.size()); }

  // The NFA of every rule; rule 0 starts. A rule without a body matches
  // nothing.
  GrammarNfa Lower() const;
  // The number of states Lower would make, counted without making them and
  // capped at `cap` (bounded repeats nested in one another multiply).
  int64_t LoweredStates(int64_t cap) const;

 private:
  struct Rule {
    std::string name;
    ExprId body = -1;
    bool shared = false;
  };
  std::pair<int32_t, int32_t> LowerExpr(ExprId e, GrammarNfa* nfa, int32_t rule,
                                        const std::vector<bool>& nullable) const;
  // Per expression: whether it matches the empty string.
  std::vector<bool> Nullable() const;
  int32_t NewState(GrammarNfa* nfa) const;

  std::vector<GrammarExpr> exprs_;
  std::vector<Rule> rules_;
};

// Common pieces.
// One UTF-8 encoded character whose first byte is not in `exclude_ascii`
// (ASCII bytes only are excluded; multi-byte characters are all allowed).
ExprId Utf8Char(GrammarBuilder* b, const ByteSet& exclude_ascii);

}  // namespace kvserve

#include "model/grammar/gbnf.h"

#include <algorithm>
#include <cctype>
#include <functional>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"

namespace kvserve {
namespace {

using Ranges = std::vector<std::pair<uint32_t, uint32_t>>;
using ByteRanges = std::vector<std::pair<uint8_t, uint8_t>>;

constexpr uint32_t kMaxCodePoint = 0x10ffff;
constexpr uint32_t kSurrogateLo = 0xd800, kSurrogateHi = 0xdfff;

void AppendUtf8(uint32_t cp, std::string* out) {
  if (cp < 0x80) {
    out->push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out->push_back(static_cast<char>(0xc0 | (cp >> 6)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3f)));
  } else if (cp < 0x10000) {
    out->push_back(static_cast<char>(0xe0 | (cp >> 12)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3f)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3f)));
  } else {
    out->push_back(static_cast<char>(0xf0 | (cp >> 18)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3f)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3f)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3f)));
  }
}

// The UTF-8 encodings of [lo, hi] (no surrogates inside) as sequences of
// byte ranges: first split where the encoded length changes, then where a
// continuation byte's range would not cover 80-BF whole, so each sequence's
// bytes vary independently (the construction RE2 and Rust's regex use).
void Utf8Sequences(uint32_t lo, uint32_t hi, std::vector<ByteRanges>* out) {
  for (uint32_t max : {0x7fu, 0x7ffu, 0xffffu}) {
    if (lo <= max && hi > max) {
      Utf8Sequences(lo, max, out);
      Utf8Sequences(max + 1, hi, out);
      return;
    }
  }
  if (hi < 0x80) {
    out->push_back({{static_cast<uint8_t>(lo), static_cast<uint8_t>(hi)}});
    return;
  }
  for (int i = 1; i < 4; ++i) {
    const uint32_t m = (1u << (6 * i)) - 1;
    if ((lo & ~m) == (hi & ~m)) continue;
    if ((lo & m) != 0) {
      Utf8Sequences(lo, lo | m, out);
      Utf8Sequences((lo | m) + 1, hi, out);
      return;
    }
    if ((hi & m) != m) {
      Utf8Sequences(lo, (hi & ~m) - 1, out);
      Utf8Sequences(hi & ~m, hi, out);
      return;
    }
  }
  std::string a, b;
  AppendUtf8(lo, &a);
  AppendUtf8(hi, &b);
  ByteRanges seq;
  for (size_t k = 0; k < a.size(); ++k) {
    seq.emplace_back(static_cast<uint8_t>(a[k]), static_cast<uint8_t>(b[k]));
  }
  out->push_back(std::move(seq));
}

// Sorted, merged, clipped to valid scalar values (surrogates cut out).
Ranges Normalize(Ranges r) {
  Ranges clipped;
  for (auto [lo, hi] : r) {
    if (lo > hi) std::swap(lo, hi);
    hi = std::min(hi, kMaxCodePoint);
    if (lo > hi) continue;
    if (lo < kSurrogateLo && hi >= kSurrogateLo) {
      clipped.emplace_back(lo, kSurrogateLo - 1);
      lo = kSurrogateLo;
    }
    if (lo >= kSurrogateLo && lo <= kSurrogateHi) {
      if (hi <= kSurrogateHi) continue;
      lo = kSurrogateHi + 1;
    }
    clipped.emplace_back(lo, hi);
  }
  std::sort(clipped.begin(), clipped.end());
  Ranges merged;
  for (const auto& [lo, hi] : clipped) {
    if (!merged.empty() && lo <= merged.back().second + 1) {
      merged.back().second = std::max(merged.back().second, hi);
    } else {
      merged.emplace_back(lo, hi);
    }
  }
  return merged;
}

Ranges Complement(const Ranges& sorted) {
  Ranges out;
  uint32_t next = 0;
  for (const auto& [lo, hi] : sorted) {
    if (lo > next) out.emplace_back(next, lo - 1);
    next = hi + 1;
  }
  if (next <= kMaxCodePoint) out.emplace_back(next, kMaxCodePoint);
  return Normalize(std::move(out));
}

// The grammar as parsed, before it is built: left recursion is checked here.
struct Node {
  enum class Kind : uint8_t { kBytes, kClass, kRef, kSeq, kAlt, kRepeat };
  Kind kind = Kind::kSeq;
  std::string bytes;  // kBytes
  Ranges ranges;      // kClass, normalized, not negated
  int32_t rule = -1;  // kRef
  std::vector<int32_t> kids;
  int32_t min = 0, max = 0;  // kRepeat
};

struct ParsedRule {
  std::string name;
  int32_t body = -1;
  size_t defined_at = 0, first_ref_at = 0;
};

bool IsWordChar(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' ||
         c == '_';
}

class GbnfParser {
 public:
  GbnfParser(std::string_view text, const std::string& path) : s_(text), path_(path) {}

  absl::Status Parse() {
    Space(true);
    while (!AtEnd()) {
      if (absl::Status st = Rule(); !st.ok()) return st;
    }
    auto root = rule_ids_.find("root");
    if (root == rule_ids_.end() || rules_[root->second].body < 0) {
      return absl::InvalidArgumentError(absl::StrCat(path_, ": the grammar has no 'root' rule"));
    }
    for (const ParsedRule& r : rules_) {
      if (r.body < 0) {
        pos_ = r.first_ref_at;
        return Error(absl::StrCat("the rule '", r.name, "' is used but never defined"));
      }
    }
    return CheckLeftRecursion();
  }

  absl::Status Emit(GrammarBuilder* b, RuleId root) const {
    std::vector<RuleId> ids(rules_.size());
    for (size_t r = 0; r < rules_.size(); ++r) {
      ids[r] = rules_[r].name == "root" ? root : b->NewRule(rules_[r].name);
    }
    std::function<ExprId(int32_t)> emit = [&](int32_t n) -> ExprId {
      const Node& node = nodes_[n];
      std::vector<ExprId> kids;
      for (int32_t k : node.kids) kids.push_back(emit(k));
      switch (node.kind) {
        case Node::Kind::kBytes:
          return node.bytes.empty() ? b->Empty() : b->Literal(node.bytes);
        case Node::Kind::kClass:
          return CodePointClass(b, node.ranges, false);
        case Node::Kind::kRef:
          return b->Ref(ids[node.rule]);
        case Node::Kind::kSeq:
          return kids.empty() ? b->Empty() : kids.size() == 1 ? kids[0] : b->Seq(std::move(kids));
        case Node::Kind::kAlt:
          return kids.size() == 1 ? kids[0] : b->Alt(std::move(kids));
        case Node::Kind::kRepeat:
          return b->Repeat(kids[0], node.min, node.max);
      }
      return b->Empty();
    };
    for (size_t r = 0; r < rules_.size(); ++r) b->SetBody(ids[r], emit(rules_[r].body));
    return absl::OkStatus();
  }

 private:
  bool AtEnd() const { return pos_ >= s_.size(); }
  char Peek() const { return s_[pos_]; }

  absl::Status Error(std::string_view what) const {
    size_t line = 1, col = 1;
    for (size_t i = 0; i < pos_ && i < s_.size(); ++i) {
      if (s_[i] == '\n') {
        ++line, col = 1;
      } else {
        ++col;
      }
    }
    return absl::InvalidArgumentError(
        absl::StrCat(path_, ": line ", line, " column ", col, ": ", std::string(what)));
  }

  // Blanks and # comments; newlines too when `newline_ok`.
  void Space(bool newline_ok) {
    while (!AtEnd()) {
      const char c = Peek();
      if (c == ' ' || c == '\t') {
        ++pos_;
      } else if (c == '#') {
        while (!AtEnd() && Peek() != '\n' && Peek() != '\r') ++pos_;
      } else if (newline_ok && (c == '\n' || c == '\r')) {
        ++pos_;
      } else {
        break;
      }
    }
  }

  int32_t AddNode(Node n) {
    nodes_.push_back(std::move(n));
    return static_cast<int32_t>(nodes_.size()) - 1;
  }

  int32_t RuleIndex(const std::string& name, size_t at) {
    auto [it, inserted] = rule_ids_.try_emplace(name, static_cast<int32_t>(rules_.size()));
    if (inserted) rules_.push_back(ParsedRule{name, -1, 0, at});
    return it->second;
  }

  std::string Name() {
    const size_t start = pos_;
    while (!AtEnd() && IsWordChar(Peek())) ++pos_;
    return std::string(s_.substr(start, pos_ - start));
  }

  absl::Status Rule() {
    const size_t at = pos_;
    const std::string name = Name();
    if (name.empty()) return Error("a rule name is expected");
    Space(false);
    if (s_.substr(pos_, 3) != "::=") return Error("'::=' is expected after the rule name");
    pos_ += 3;
    Space(true);
    const int32_t r = RuleIndex(name, at);
    if (rules_[r].body >= 0) {
      pos_ = at;
      return Error(absl::StrCat("the rule '", name, "' is defined twice"));
    }
    absl::StatusOr<int32_t> body = Alternates(false);
    if (!body.ok()) return body.status();
    rules_[r].body = *body;
    rules_[r].defined_at = at;
    if (!AtEnd() && Peek() == '\r') ++pos_;
    if (!AtEnd() && Peek() == '\n') {
      ++pos_;
    } else if (!AtEnd()) {
      return Error(Peek() == ')' ? "unbalanced ')'" : "a newline or the end is expected");
    }
    Space(true);
    return absl::OkStatus();
  }

  absl::StatusOr<int32_t> Alternates(bool nested) {
    Node alt;
    alt.kind = Node::Kind::kAlt;
    while (true) {
      absl::StatusOr<int32_t> seq = Sequence(nested);
      if (!seq.ok()) return seq;
      alt.kids.push_back(*seq);
      // At the top level a line that starts with '|' continues the rule
      // (a new rule starts with a name).
      if (!nested) {
        const size_t at = pos_;
        Space(true);
        if (AtEnd() || Peek() != '|') pos_ = at;
      }
      if (AtEnd() || Peek() != '|') break;
      ++pos_;
      Space(true);
    }
    return AddNode(std::move(alt));
  }

  absl::StatusOr<uint32_t> Hex(int digits) {
    uint32_t v = 0;
    for (int i = 0; i < digits; ++i) {
      if (AtEnd()) return Error(absl::StrCat("the escape needs ", digits, " hex digits"));
      const char h = Peek();
      const int d = h >= '0' && h <= '9'   ? h - '0'
                    : h >= 'a' && h <= 'f' ? h - 'a' + 10
                    : h >= 'A' && h <= 'F' ? h - 'A' + 10
                                           : -1;
      if (d < 0) return Error(absl::StrCat("the escape needs ", digits, " hex digits"));
      v = v * 16 + static_cast<uint32_t>(d);
      ++pos_;
    }
    return v;
  }

  // One character of a literal or class (pos_ at it), as a code point.
  absl::StatusOr<uint32_t> Char() {
    const auto c = static_cast<uint8_t>(Peek());
    if (c == '\\') {
      ++pos_;
      if (AtEnd()) return Error("a trailing '\\'");
      const char e = Peek();
      ++pos_;
      absl::StatusOr<uint32_t> cp;
      switch (e) {
        case 't':
          return uint32_t{'\t'};
        case 'n':
          return uint32_t{'\n'};
        case 'r':
          return uint32_t{'\r'};
        case 'x':
          cp = Hex(2);
          break;
        case 'u':
          cp = Hex(4);
          break;
        case 'U':
          cp = Hex(8);
          break;
        default:
          if (std::isalnum(static_cast<unsigned char>(e))) {
            --pos_;
            return Error(absl::StrCat("the escape \\", std::string(1, e), " is not supported"));
          }
          return static_cast<uint32_t>(static_cast<uint8_t>(e));
      }
      if (!cp.ok()) return cp;
      if (*cp > kMaxCodePoint || (*cp >= kSurrogateLo && *cp <= kSurrogateHi)) {
        return Error("the escape is not a Unicode scalar value");
      }
      return cp;
    }
    // Raw UTF-8 (the grammar arrives as JSON text, so it is well formed).
    const int len = c < 0x80 ? 1 : c < 0xe0 ? 2 : c < 0xf0 ? 3 : 4;
    if (pos_ + len > s_.size()) return Error("a truncated UTF-8 character");
    uint32_t cp = len == 1 ? c : len == 2 ? c & 0x1f : len == 3 ? c & 0x0f : c & 0x07;
    for (int i = 1; i < len; ++i) cp = (cp << 6) | (static_cast<uint8_t>(s_[pos_ + i]) & 0x3f);
    pos_ += len;
    return cp;
  }

  absl::StatusOr<int32_t> Literal() {
    ++pos_;  // '"'
    Node n;
    n.kind = Node::Kind::kBytes;
    while (true) {
      if (AtEnd() || Peek() == '\n') return Error("an unterminated string literal");
      if (Peek() == '"') break;
      absl::StatusOr<uint32_t> cp = Char();
      if (!cp.ok()) return cp.status();
      AppendUtf8(*cp, &n.bytes);
    }
    ++pos_;
    return AddNode(std::move(n));
  }

  absl::StatusOr<int32_t> Class() {
    ++pos_;  // '['
    bool negated = false;
    if (!AtEnd() && Peek() == '^') negated = true, ++pos_;
    Ranges ranges;
    while (true) {
      if (AtEnd() || Peek() == '\n') return Error("an unterminated character class");
      if (Peek() == ']') break;
      absl::StatusOr<uint32_t> lo = Char();
      if (!lo.ok()) return lo.status();
      uint32_t hi = *lo;
      if (pos_ + 1 < s_.size() && Peek() == '-' && s_[pos_ + 1] != ']') {
        ++pos_;
        absl::StatusOr<uint32_t> h = Char();
        if (!h.ok()) return h.status();
        if (*h < *lo) return Error("a character range with its end before its start");
        hi = *h;
      }
      ranges.emplace_back(*lo, hi);
    }
    ++pos_;
    Node n;
    n.kind = Node::Kind::kClass;
    n.ranges = negated ? Complement(Normalize(std::move(ranges))) : Normalize(std::move(ranges));
    return AddNode(std::move(n));
  }

  absl::StatusOr<int32_t> Count() {
    const int32_t v = ScanRepeatCount(s_, &pos_);
    if (v == kCountTooBig) return Error(absl::StrCat("a count above ", kMaxRepeat));
    if (v == kNoCount) return Error("a count is expected");
    return v;
  }

  // The quantifier at pos_ applied to the last item of seq.
  absl::Status Quantify(Node* seq) {
    if (seq->kids.empty()) return Error("a quantifier with nothing before it");
    int32_t min = 0, max = 0;
    const char c = Peek();
    ++pos_;
    if (c == '*') {
      max = kUnbounded;
    } else if (c == '+') {
      min = 1, max = kUnbounded;
    } else if (c == '?') {
      max = 1;
    } else {  // '{'
      Space(true);
      if (!AtEnd() && Peek() != ',') {
        absl::StatusOr<int32_t> lo = Count();
        if (!lo.ok()) return lo.status();
        min = max = *lo;
      }
      Space(true);
      if (!AtEnd() && Peek() == ',') {
        ++pos_;
        Space(true);
        max = kUnbounded;
        if (!AtEnd() && Peek() != '}') {
          absl::StatusOr<int32_t> hi = Count();
          if (!hi.ok()) return hi.status();
          if (*hi < min) return Error("a count range {m,n} with n < m");
          max = *hi;
        }
        Space(true);
      }
      if (AtEnd() || Peek() != '}') return Error("'}' is expected");
      ++pos_;
    }
    Node rep;
    rep.kind = Node::Kind::kRepeat;
    rep.kids = {seq->kids.back()};
    rep.min = min;
    rep.max = max;
    seq->kids.back() = AddNode(std::move(rep));
    return absl::OkStatus();
  }

  absl::StatusOr<int32_t> Sequence(bool nested) {
    Node seq;
    seq.kind = Node::Kind::kSeq;
    while (!AtEnd()) {
      const char c = Peek();
      absl::StatusOr<int32_t> item = -1;
      if (c == '"') {
        item = Literal();
      } else if (c == '[') {
        item = Class();
      } else if (c == '.') {
        ++pos_;
        Node any;
        any.kind = Node::Kind::kClass;
        any.ranges = Complement({});
        item = AddNode(std::move(any));
      } else if (c == '(') {
        if (++depth_ > kMaxNesting) {
          return Error(absl::StrCat("groups nest deeper than ", kMaxNesting, " levels"));
        }
        ++pos_;
        Space(true);
        item = Alternates(true);
        if (item.ok()) {
          if (AtEnd() || Peek() != ')') return Error("')' is expected");
          ++pos_;
        }
        --depth_;
      } else if (IsWordChar(c)) {
        const size_t at = pos_;
        Node ref;
        ref.kind = Node::Kind::kRef;
        ref.rule = RuleIndex(Name(), at);
        item = AddNode(std::move(ref));
      } else if (c == '*' || c == '+' || c == '?' || c == '{') {
        if (absl::Status st = Quantify(&seq); !st.ok()) return st;
      } else if (c == '<') {
        return Error("token references (<...>) are not supported");
      } else {
        break;
      }
      if (!item.ok()) return item;
      if (*item >= 0) seq.kids.push_back(*item);
      Space(nested);
    }
    return AddNode(std::move(seq));
  }

  // Nullable rules by fixpoint, then the rules each rule may call before it
  // reads a byte; a cycle there is left recursion.
  absl::Status CheckLeftRecursion() {
    std::vector<bool> nullable(rules_.size(), false);
    std::function<bool(int32_t)> null = [&](int32_t n) -> bool {
      const Node& node = nodes_[n];
      switch (node.kind) {
        case Node::Kind::kBytes:
          return node.bytes.empty();
        case Node::Kind::kClass:
          return false;
        case Node::Kind::kRef:
          return nullable[node.rule];
        case Node::Kind::kSeq:
          return std::all_of(node.kids.begin(), node.kids.end(), null);
        case Node::Kind::kAlt:
          return std::any_of(node.kids.begin(), node.kids.end(), null);
        case Node::Kind::kRepeat:
          return node.min == 0 || null(node.kids[0]);
      }
      return false;
    };
    for (bool changed = true; changed;) {
      changed = false;
      for (size_t r = 0; r < rules_.size(); ++r) {
        if (!nullable[r] && null(rules_[r].body)) nullable[r] = changed = true;
      }
    }
    std::vector<std::vector<int32_t>> left(rules_.size());
    std::function<void(int32_t, std::vector<int32_t>*)> lefts = [&](int32_t n,
                                                                    std::vector<int32_t>* out) {
      const Node& node = nodes_[n];
      switch (node.kind) {
        case Node::Kind::kRef:
          out->push_back(node.rule);
          return;
        case Node::Kind::kSeq:
          for (int32_t k : node.kids) {
            lefts(k, out);
            if (!null(k)) return;
          }
          return;
        case Node::Kind::kAlt:
        case Node::Kind::kRepeat:
          if (node.kind == Node::Kind::kRepeat && node.max == 0) return;
          for (int32_t k : node.kids) lefts(k, out);
          return;
        default:
          return;
      }
    };
    for (size_t r = 0; r < rules_.size(); ++r) lefts(rules_[r].body, &left[r]);
    // Depth-first search for a cycle: 0 unseen, 1 on the path, 2 done.
    std::vector<int> mark(rules_.size(), 0);
    std::function<int32_t(int32_t)> cycle = [&](int32_t r) -> int32_t {
      mark[r] = 1;
      for (int32_t next : left[r]) {
        if (mark[next] == 1) return next;
        if (mark[next] == 0) {
          if (int32_t c = cycle(next); c >= 0) return c;
        }
      }
      mark[r] = 2;
      return -1;
    };
    for (size_t r = 0; r < rules_.size(); ++r) {
      if (mark[r] != 0) continue;
      if (int32_t c = cycle(static_cast<int32_t>(r)); c >= 0) {
        pos_ = rules_[c].defined_at;
        return Error(absl::StrCat("the rule '", rules_[c].name,
                                  "' is left-recursive (it can reach itself before reading a "
                                  "character); rewrite it with repetition"));
      }
    }
    return absl::OkStatus();
  }

  static constexpr int kMaxNesting = 128;

  std::string_view s_;
  const std::string& path_;
  size_t pos_ = 0;
  int depth_ = 0;
  std::vector<Node> nodes_;
  std::vector<ParsedRule> rules_;
  absl::flat_hash_map<std::string, int32_t> rule_ids_;
};

}  // namespace

ExprId CodePointClass(GrammarBuilder* b, std::vector<std::pair<uint32_t, uint32_t>> ranges,
                      bool negated) {
  Ranges set = Normalize(std::move(ranges));
  if (negated) set = Complement(set);
  std::vector<ByteRanges> seqs;
  for (const auto& [lo, hi] : set) Utf8Sequences(lo, hi, &seqs);
  ByteSet ascii;
  std::vector<ExprId> alts;
  for (const ByteRanges& seq : seqs) {
    if (seq.size() == 1) {
      ascii.AddRange(seq[0].first, seq[0].second);
      continue;
    }
    std::vector<ExprId> parts;
    for (const auto& [lo, hi] : seq) {
      ByteSet bytes;
      bytes.AddRange(lo, hi);
      parts.push_back(b->Class(bytes));
    }
    alts.push_back(b->Seq(std::move(parts)));
  }
  if (!ascii.Empty()) alts.insert(alts.begin(), b->Class(ascii));
  return b->Alt(std::move(alts));  // no option (an empty class): matches nothing
}

absl::Status BuildGbnfGrammar(std::string_view text, const std::string& path,
                              GrammarBuilder* builder, RuleId root) {
  GbnfParser parser(text, path);
  if (absl::Status s = parser.Parse(); !s.ok()) return s;
  return parser.Emit(builder, root);
}

}  // namespace kvserve

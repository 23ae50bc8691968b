#include "model/grammar/regex.h"

#include <algorithm>
#include <vector>

#include "absl/strings/str_cat.h"

namespace kvserve {
namespace {

class RegexParser {
 public:
  RegexParser(std::string_view p, const std::string& path, GrammarBuilder* b)
      : p_(p), path_(path), b_(b) {}

  absl::StatusOr<ExprId> Parse() {
    if (!p_.empty() && p_[0] == '^') ++pos_;
    absl::StatusOr<ExprId> e = Alternation();
    if (!e.ok()) return e;
    if (pos_ < p_.size() && p_[pos_] == '$' && pos_ + 1 == p_.size()) ++pos_;
    if (pos_ < p_.size()) return Error(p_[pos_] == ')' ? "unbalanced ')'" : "unexpected character");
    return e;
  }

 private:
  absl::Status Error(std::string_view what) const {
    return absl::InvalidArgumentError(
        absl::StrCat(path_, ": ", std::string(what), " at offset ", pos_, " of the pattern"));
  }
  bool AtEnd() const { return pos_ >= p_.size(); }
  char Peek() const { return p_[pos_]; }

  absl::StatusOr<ExprId> Alternation() {
    std::vector<ExprId> alts;
    while (true) {
      absl::StatusOr<ExprId> s = Sequence();
      if (!s.ok()) return s;
      alts.push_back(*s);
      if (AtEnd() || Peek() != '|') break;
      ++pos_;
    }
    return b_->Alt(std::move(alts));
  }

  absl::StatusOr<ExprId> Sequence() {
    std::vector<ExprId> parts;
    while (!AtEnd() && Peek() != '|' && Peek() != ')') {
      if (Peek() == '$' && pos_ + 1 == p_.size()) break;
      absl::StatusOr<ExprId> a = Atom();
      if (!a.ok()) return a;
      absl::StatusOr<ExprId> q = Quantified(*a);
      if (!q.ok()) return q;
      parts.push_back(*q);
    }
    return b_->Seq(std::move(parts));
  }

  absl::StatusOr<int32_t> Number() {
    const int32_t v = ScanRepeatCount(p_, &pos_);
    if (v == kCountTooBig) return Error(absl::StrCat("a count above ", kMaxRepeat));
    if (v == kNoCount) return Error("a count is expected");
    return v;
  }

  absl::StatusOr<ExprId> Quantified(ExprId atom) {
    while (!AtEnd()) {
      int32_t min = 0, max = 0;
      const char c = Peek();
      if (c == '*') {
        min = 0, max = kUnbounded, ++pos_;
      } else if (c == '+') {
        min = 1, max = kUnbounded, ++pos_;
      } else if (c == '?') {
        min = 0, max = 1, ++pos_;
      } else if (c == '{') {
        ++pos_;
        absl::StatusOr<int32_t> lo = Number();
        if (!lo.ok()) return lo.status();
        min = max = *lo;
        if (!AtEnd() && Peek() == ',') {
          ++pos_;
          max = kUnbounded;
          if (!AtEnd() && Peek() != '}') {
            absl::StatusOr<int32_t> hi = Number();
            if (!hi.ok()) return hi.status();
            max = *hi;
            if (max < min) return Error("a count range {m,n} with n < m");
          }
        }
        if (AtEnd() || Peek() != '}') return Error("'}' is expected");
        ++pos_;
      } else {
        break;
      }
      if (!AtEnd() && Peek() == '?') ++pos_;  // lazy: same language
      if (!AtEnd() && Peek() == '+') return Error("possessive quantifiers are not supported");
      atom = b_->Repeat(atom, min, max);
    }
    return atom;
  }

  // A class escape (\d \w \s and negations) into `set`; false if not one.
  static bool ClassEscape(char c, ByteSet* set, bool* negated) {
    ByteSet s;
    switch (c) {
      case 'd':
      case 'D':
        s.AddRange('0', '9');
        break;
      case 'w':
      case 'W':
        s.AddRange('0', '9');
        s.AddRange('a', 'z');
        s.AddRange('A', 'Z');
        s.Add('_');
        break;
      case 's':
      case 'S':
        for (char x : std::string_view(" \t\n\r\f\v")) s.Add(static_cast<uint8_t>(x));
        break;
      default:
        return false;
    }
    *negated = c >= 'A' && c <= 'Z';
    *set = s;
    return true;
  }

  // The byte of a single-character escape after '\' (pos_ at the character).
  absl::StatusOr<uint8_t> EscapedByte() {
    const char c = Peek();
    ++pos_;
    switch (c) {
      case 't':
        return '\t';
      case 'n':
        return '\n';
      case 'r':
        return '\r';
      case 'f':
        return '\f';
      case 'v':
        return '\v';
      case '0':
        return 0;
      case 'x': {
        int v = 0;
        for (int i = 0; i < 2; ++i) {
          if (AtEnd()) return Error("\\x needs two hex digits");
          const char h = Peek();
          ++pos_;
          int d = h >= '0' && h <= '9'   ? h - '0'
                  : h >= 'a' && h <= 'f' ? h - 'a' + 10
                  : h >= 'A' && h <= 'F' ? h - 'A' + 10
                                         : -1;
          if (d < 0) return Error("\\x needs two hex digits");
          v = v * 16 + d;
        }
        if (v >= 0x80) return Error("\\x above 7F is not supported (write the UTF-8 character)");
        return static_cast<uint8_t>(v);
      }
      default:
        break;
    }
    if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9')) {
      --pos_;
      return Error(absl::StrCat("the escape \\", std::string(1, c), " is not supported"));
    }
    return static_cast<uint8_t>(c);
  }

  ExprId SetExpr(const ByteSet& ascii, bool negated) {
    if (!negated) return b_->Class(ascii);
    return Utf8Char(b_, ascii);
  }

  absl::StatusOr<ExprId> Bracket() {
    ++pos_;  // '['
    bool negated = false;
    if (!AtEnd() && Peek() == '^') negated = true, ++pos_;
    ByteSet set;
    bool first = true;
    while (true) {
      if (AtEnd()) return Error("unterminated '['");
      char c = Peek();
      if (c == ']' && !first) break;
      first = false;
      uint8_t lo;
      if (c == '\\') {
        ++pos_;
        if (AtEnd()) return Error("a trailing '\\'");
        ByteSet cls;
        bool neg = false;
        if (ClassEscape(Peek(), &cls, &neg)) {
          if (neg) return Error("a negated class escape inside [...] is not supported");
          set.Or(cls);
          ++pos_;
          continue;
        }
        absl::StatusOr<uint8_t> b = EscapedByte();
        if (!b.ok()) return b.status();
        lo = *b;
      } else {
        if (static_cast<uint8_t>(c) >= 0x80) {
          return Error("non-ASCII characters inside [...] are not supported");
        }
        lo = static_cast<uint8_t>(c);
        ++pos_;
      }
      uint8_t hi = lo;
      if (pos_ + 1 < p_.size() && Peek() == '-' && p_[pos_ + 1] != ']') {
        ++pos_;
        char h = Peek();
        if (h == '\\') {
          ++pos_;
          if (AtEnd()) return Error("a trailing '\\'");
          absl::StatusOr<uint8_t> b = EscapedByte();
          if (!b.ok()) return b.status();
          hi = *b;
        } else {
          if (static_cast<uint8_t>(h) >= 0x80) {
            return Error("non-ASCII characters inside [...] are not supported");
          }
          hi = static_cast<uint8_t>(h);
          ++pos_;
        }
        if (hi < lo) return Error("a range [a-b] with b before a");
      }
      set.AddRange(lo, hi);
    }
    ++pos_;  // ']'
    return SetExpr(set, negated);
  }

  absl::StatusOr<ExprId> Atom() {
    const char c = Peek();
    switch (c) {
      case '(': {
        // Bounded, so a deep pattern is an error, not a stack overflow.
        if (++depth_ > kMaxNesting) {
          return Error(absl::StrCat("groups nest deeper than ", kMaxNesting, " levels"));
        }
        ++pos_;
        if (!AtEnd() && Peek() == '?') {
          if (pos_ + 1 < p_.size() && p_[pos_ + 1] == ':') {
            pos_ += 2;
          } else {
            return Error("lookaround and named groups are not supported");
          }
        }
        absl::StatusOr<ExprId> e = Alternation();
        if (!e.ok()) return e;
        if (AtEnd() || Peek() != ')') return Error("')' is expected");
        ++pos_;
        --depth_;
        return e;
      }
      case '[':
        return Bracket();
      case '.': {
        ++pos_;
        ByteSet nl;
        nl.Add('\n');
        return Utf8Char(b_, nl);
      }
      case '^':
      case '$':
        return Error("anchors inside the pattern are not supported");
      case '*':
      case '+':
      case '?':
      case '{':
        return Error("a quantifier with nothing to repeat");
      case '\\': {
        ++pos_;
        if (AtEnd()) return Error("a trailing '\\'");
        ByteSet cls;
        bool neg = false;
        if (ClassEscape(Peek(), &cls, &neg)) {
          ++pos_;
          return SetExpr(cls, neg);
        }
        if (Peek() >= '1' && Peek() <= '9') return Error("backreferences are not supported");
        if (Peek() == 'b' || Peek() == 'B') return Error("\\b is not supported");
        absl::StatusOr<uint8_t> b = EscapedByte();
        if (!b.ok()) return b.status();
        return b_->Byte(*b);
      }
      default: {
        // One whole UTF-8 character, so a quantifier repeats all of it.
        const uint8_t lead = static_cast<uint8_t>(c);
        size_t len = lead < 0x80 ? 1 : lead >= 0xf0 ? 4 : lead >= 0xe0 ? 3 : 2;
        len = std::min(len, p_.size() - pos_);
        const ExprId e = b_->Literal(p_.substr(pos_, len));
        pos_ += len;
        return e;
      }
    }
  }

  static constexpr int kMaxNesting = 128;

  std::string_view p_;
  const std::string& path_;
  GrammarBuilder* b_;
  size_t pos_ = 0;
  int depth_ = 0;
};

}  // namespace

absl::StatusOr<ExprId> BuildRegexExpr(std::string_view pattern, const std::string& path,
                                      GrammarBuilder* builder) {
  return RegexParser(pattern, path, builder).Parse();
}

}  // namespace kvserve

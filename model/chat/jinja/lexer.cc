#include "model/chat/jinja/lexer.h"

#include <cctype>

#include "absl/strings/str_cat.h"

namespace kvserve::jinja {
namespace {

// Length of the code point ending at `end` (1 for invalid bytes).
size_t LastCodePointLength(std::string_view s, size_t end) {
  size_t n = 1;
  while (n < 4 && n < end && (static_cast<unsigned char>(s[end - n]) & 0xc0) == 0x80) ++n;
  return n;
}

char32_t CodePointAt(std::string_view s, size_t pos, size_t* len) {
  std::u32string u = DecodeUtf8(s.substr(pos, 4));
  char32_t c = u.empty() ? 0 : u[0];
  *len = c < 0x80 ? 1 : c < 0x800 ? 2 : c < 0x10000 ? 3 : 4;
  if (c == 0xfffd && static_cast<unsigned char>(s[pos]) != 0xef) *len = 1;
  return c;
}

void RStripSpace(std::string* s) {
  while (!s->empty()) {
    size_t n = LastCodePointLength(*s, s->size());
    size_t len;
    if (!IsSpace(CodePointAt(*s, s->size() - n, &len))) break;
    s->erase(s->size() - n);
  }
}

class Lexer {
 public:
  // Like Jinja2, newlines (\r\n, \r) become \n before anything else, and
  // one trailing newline is dropped (keep_trailing_newline=False).
  explicit Lexer(std::string_view src)
      : source_(NormalizeNewlines(std::string(src))), src_(source_) {
    if (src_.ends_with("\n")) src_.remove_suffix(1);
  }

  std::vector<Token> Run() {
    bool line_starting = true;
    while (pos_ < src_.size()) {
      size_t tag = FindTag(pos_);
      std::string text(src_.substr(pos_, tag - pos_));
      int text_line = line_;
      Advance(tag);
      if (tag == src_.size()) {
        Emit(Tok::kText, std::move(text), text_line);
        break;
      }
      const char kind = src_[tag + 1];  // '{', '%' or '#'
      const char sign = tag + 2 < src_.size() ? src_[tag + 2] : 0;
      if (sign == '-') {
        RStripSpace(&text);
      } else if (sign != '+' && kind != '{') {
        // lstrip_blocks: drop the spaces before the tag if alone on its line.
        size_t l_pos = text.rfind('\n');
        l_pos = l_pos == std::string::npos ? 0 : l_pos + 1;
        if (l_pos > 0 || line_starting) {
          bool blank = l_pos < text.size();
          for (size_t i = l_pos; i < text.size(); ++i) {
            if (text[i] != ' ' && text[i] != '\t' && text[i] != '\r' && text[i] != '\v' &&
                text[i] != '\f') {
              blank = false;
            }
          }
          if (blank) text.resize(l_pos);
        }
      }
      Emit(Tok::kText, std::move(text), text_line);
      Advance(tag + 2 + (sign == '-' || sign == '+' ? 1 : 0));
      if (kind == '#') {
        line_starting = Comment();
      } else {
        line_starting = Tag(kind == '{');
      }
    }
    tokens_.push_back({Tok::kEof, "", line_, Value()});
    return std::move(tokens_);
  }

 private:
  // The next "{{", "{%" or "{#" at or after `from`, or the end.
  size_t FindTag(size_t from) const {
    for (size_t i = src_.find('{', from); i != std::string_view::npos; i = src_.find('{', i + 1)) {
      if (i + 1 < src_.size() && (src_[i + 1] == '{' || src_[i + 1] == '%' || src_[i + 1] == '#')) {
        return i;
      }
    }
    return src_.size();
  }

  void Advance(size_t to) {
    for (; pos_ < to; ++pos_) {
      if (src_[pos_] == '\n') ++line_;
    }
  }

  static std::string NormalizeNewlines(const std::string& s) {
    if (s.find('\r') == std::string::npos) return s;
    std::string out;
    for (size_t i = 0; i < s.size(); ++i) {
      if (s[i] == '\r') {
        out.push_back('\n');
        if (i + 1 < s.size() && s[i + 1] == '\n') ++i;
      } else {
        out.push_back(s[i]);
      }
    }
    return out;
  }

  void Emit(Tok type, std::string text, int line) {
    if (type == Tok::kText && text.empty()) return;
    tokens_.push_back({type, std::move(text), line, Value()});
  }

  // After a closing tag: "-" strips all following whitespace; trim_blocks
  // drops one newline after a block or comment. Returns whether the next
  // text starts a line (for lstrip_blocks).
  bool AfterClose(bool strip, bool trim_newline) {
    if (strip) {
      while (pos_ < src_.size()) {
        size_t len;
        if (!IsSpace(CodePointAt(src_, pos_, &len))) break;
        Advance(pos_ + len);
      }
      return pos_ > 0 && src_[pos_ - 1] == '\n';
    }
    if (trim_newline && pos_ < src_.size() && src_[pos_] == '\n') {
      Advance(pos_ + 1);
      return true;
    }
    return false;
  }

  bool Comment() {
    size_t end = src_.find("#}", pos_);
    if (end == std::string_view::npos) throw Error("missing end of comment tag", line_);
    bool strip = end > pos_ && src_[end - 1] == '-';
    Advance(end + 2);
    return AfterClose(strip, /*trim_newline=*/true);
  }

  // Tokens of one {{ ... }} or {% ... %} up to and including its end.
  bool Tag(bool variable) {
    const int begin_line = line_;
    tokens_.push_back({variable ? Tok::kVarBegin : Tok::kBlockBegin, "", line_, Value()});
    const std::string_view close = variable ? "}}" : "%}";
    int depth = 0;  // open brackets: "}}" inside a dict literal is not the end
    while (true) {
      while (pos_ < src_.size()) {
        size_t len;
        if (!IsSpace(CodePointAt(src_, pos_, &len))) break;
        Advance(pos_ + len);
      }
      if (pos_ >= src_.size()) {
        throw Error(absl::StrCat("unexpected end of template, expected '", std::string(close), "'"),
                    begin_line);
      }
      std::string_view rest = src_.substr(pos_);
      if (depth == 0 && (rest.starts_with(close) || (rest.size() >= 3 && rest[0] == '-' &&
                                                     rest.substr(1).starts_with(close)))) {
        bool strip = rest[0] == '-';
        tokens_.push_back({variable ? Tok::kVarEnd : Tok::kBlockEnd, "", line_, Value()});
        Advance(pos_ + close.size() + (strip ? 1 : 0));
        return AfterClose(strip, /*trim_newline=*/!variable);
      }
      const char c = rest[0];
      if (c == '\'' || c == '"') {
        String(c);
      } else if (std::isdigit(static_cast<unsigned char>(c))) {
        Number();
      } else if (std::isalpha(static_cast<unsigned char>(c)) || c == '_') {
        size_t n = 1;
        while (n < rest.size() &&
               (std::isalnum(static_cast<unsigned char>(rest[n])) || rest[n] == '_'))
          ++n;
        tokens_.push_back({Tok::kName, std::string(rest.substr(0, n)), line_, Value()});
        Advance(pos_ + n);
      } else {
        static const char* kOps[] = {"//", "**", "==", "!=", ">=", "<=", "+", "-", "/",
                                     "*",  "%",  "~",  "[",  "]",  "(",  ")", "{", "}",
                                     ">",  "<",  "=",  ".",  ":",  "|",  ",", ";"};
        std::string op;
        for (const char* o : kOps) {
          if (rest.starts_with(o)) {
            op = o;
            break;
          }
        }
        if (op.empty()) {
          throw Error(absl::StrCat("unexpected character '", std::string(1, c), "'"), line_);
        }
        if (op == "(" || op == "[" || op == "{") ++depth;
        if (op == ")" || op == "]" || op == "}") --depth;
        tokens_.push_back({Tok::kOp, op, line_, Value()});
        Advance(pos_ + op.size());
      }
    }
  }

  // A string literal with Python's escapes; unknown escapes stay as written.
  void String(char quote) {
    const int line = line_;
    std::string out;
    size_t i = pos_ + 1;
    while (true) {
      if (i >= src_.size()) throw Error("unterminated string literal", line);
      char c = src_[i];
      if (c == quote) break;
      if (c != '\\' || i + 1 >= src_.size()) {
        out.push_back(c);
        ++i;
        continue;
      }
      char e = src_[i + 1];
      i += 2;
      switch (e) {
        case 'n':
          out.push_back('\n');
          break;
        case 't':
          out.push_back('\t');
          break;
        case 'r':
          out.push_back('\r');
          break;
        case 'b':
          out.push_back('\b');
          break;
        case 'f':
          out.push_back('\f');
          break;
        case 'v':
          out.push_back('\v');
          break;
        case 'a':
          out.push_back('\a');
          break;
        case '0':
          out.push_back('\0');
          break;
        case '\\':
          out.push_back('\\');
          break;
        case '\'':
          out.push_back('\'');
          break;
        case '"':
          out.push_back('"');
          break;
        case '\n':
          break;  // line continuation
        case 'x':
        case 'u':
        case 'U': {
          size_t n = e == 'x' ? 2 : e == 'u' ? 4 : 8;
          std::string hex(src_.substr(i, n));
          if (hex.size() != n || hex.find_first_not_of("0123456789abcdefABCDEF") != hex.npos) {
            throw Error(absl::StrCat("invalid \\", std::string(1, e), " escape in string literal"),
                        line);
          }
          out += EncodeUtf8(std::u32string(1, static_cast<char32_t>(std::stoul(hex, nullptr, 16))));
          i += n;
          break;
        }
        default:
          out.push_back('\\');
          out.push_back(e);
      }
    }
    tokens_.push_back({Tok::kString, std::move(out), line, Value()});
    Advance(i + 1);
  }

  void Number() {
    std::string_view rest = src_.substr(pos_);
    auto digits = [&](size_t i) {
      while (i < rest.size() && (std::isdigit(static_cast<unsigned char>(rest[i])) ||
                                 (rest[i] == '_' && i + 1 < rest.size() &&
                                  std::isdigit(static_cast<unsigned char>(rest[i + 1]))))) {
        ++i;
      }
      return i;
    };
    size_t n = digits(0);
    bool is_float = false;
    // After a dot (items.0.name) only integers are read.
    const bool after_dot = pos_ > 0 && src_[pos_ - 1] == '.';
    if (!after_dot && n + 1 < rest.size() && rest[n] == '.' &&
        std::isdigit(static_cast<unsigned char>(rest[n + 1]))) {
      n = digits(n + 1);
      is_float = true;
    }
    if (!after_dot && n < rest.size() && (rest[n] == 'e' || rest[n] == 'E')) {
      size_t m = n + 1;
      if (m < rest.size() && (rest[m] == '+' || rest[m] == '-')) ++m;
      if (m < rest.size() && std::isdigit(static_cast<unsigned char>(rest[m]))) {
        n = digits(m);
        is_float = true;
      }
    }
    std::string text;
    for (char c : rest.substr(0, n)) {
      if (c != '_') text.push_back(c);
    }
    Token t{is_float ? Tok::kFloat : Tok::kInt, text, line_, Value()};
    t.number = is_float ? Value(std::stod(text)) : Value(static_cast<int64_t>(std::stoll(text)));
    tokens_.push_back(std::move(t));
    Advance(pos_ + n);
  }

  std::string source_;
  std::string_view src_;
  size_t pos_ = 0;
  int line_ = 1;
  std::vector<Token> tokens_;
};

}  // namespace

std::vector<Token> Lex(std::string_view source) { return Lexer(source).Run(); }

}  // namespace kvserve::jinja

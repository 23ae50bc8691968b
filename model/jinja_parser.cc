// Lexer and recursive-descent parser for kvserve's Jinja subset. The grammar
// and operator precedence are Jinja2's (jinja2/parser.py), lowest first:
//   a if b else c · or · and · not · comparisons and in · + - · ~ · * / // %
//   · ** · unary - + · postfix (.attr [item] [a:b:c] (call) |filter is test)
// Whitespace control is Jinja2's with transformers' environment: trim_blocks
// drops the newline after a block or comment tag, lstrip_blocks drops the
// spaces and tabs before one on its line, {%- and -%} strip all whitespace.
#include <cctype>
#include <optional>

#include "absl/strings/str_cat.h"
#include "model/jinja_ast.h"

namespace kvserve::jinja {
namespace {

enum class Tok { kText, kBlockBegin, kBlockEnd, kVarBegin, kVarEnd, kName, kString, kInt, kFloat, kOp, kEof };

struct Token {
  Tok type;
  std::string text;  // name, operator, decoded string literal, text data
  int line;
  Value number;
};

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
    s->resize(s->size() - n);
  }
}

class Lexer {
 public:
  // Like Jinja2, newlines (\r\n, \r) become \n before anything else, and
  // one trailing newline is dropped (keep_trailing_newline=False).
  explicit Lexer(std::string_view src) : source_(NormalizeNewlines(std::string(src))), src_(source_) {
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
        throw Error(absl::StrCat("unexpected end of template, expected '", std::string(close), "'"), begin_line);
      }
      std::string_view rest = src_.substr(pos_);
      if (depth == 0 && (rest.starts_with(close) ||
                         (rest.size() >= 3 && rest[0] == '-' && rest.substr(1).starts_with(close)))) {
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
        while (n < rest.size() && (std::isalnum(static_cast<unsigned char>(rest[n])) || rest[n] == '_')) ++n;
        tokens_.push_back({Tok::kName, std::string(rest.substr(0, n)), line_, Value()});
        Advance(pos_ + n);
      } else {
        static const char* kOps[] = {"//", "**", "==", "!=", ">=", "<=", "+", "-", "/", "*", "%",
                                     "~",  "[",  "]",  "(",  ")",  "{", "}", ">", "<", "=", ".",
                                     ":",  "|",  ",",  ";"};
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
        case 'n': out.push_back('\n'); break;
        case 't': out.push_back('\t'); break;
        case 'r': out.push_back('\r'); break;
        case 'b': out.push_back('\b'); break;
        case 'f': out.push_back('\f'); break;
        case 'v': out.push_back('\v'); break;
        case 'a': out.push_back('\a'); break;
        case '0': out.push_back('\0'); break;
        case '\\': out.push_back('\\'); break;
        case '\'': out.push_back('\''); break;
        case '"': out.push_back('"'); break;
        case '\n': break;  // line continuation
        case 'x':
        case 'u':
        case 'U': {
          size_t n = e == 'x' ? 2 : e == 'u' ? 4 : 8;
          std::string hex(src_.substr(i, n));
          if (hex.size() != n || hex.find_first_not_of("0123456789abcdefABCDEF") != hex.npos) {
            throw Error(absl::StrCat("invalid \\", std::string(1, e), " escape in string literal"), line);
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

class Parser {
 public:
  explicit Parser(std::vector<Token> tokens) : t_(std::move(tokens)) {}

  std::unique_ptr<Program> Run() {
    auto program = std::make_unique<Program>();
    std::string end = Subparse({}, &program->body);
    if (!end.empty()) throw Error(absl::StrCat("unexpected '", end, "'"), cur().line);
    return program;
  }

 private:
  const Token& cur() const { return t_[i_]; }
  const Token& peek(size_t k = 1) const { return t_[std::min(i_ + k, t_.size() - 1)]; }
  bool IsOp(const char* op) const { return cur().type == Tok::kOp && cur().text == op; }
  bool IsName(const char* name) const { return cur().type == Tok::kName && cur().text == name; }
  bool SkipOp(const char* op) {
    if (!IsOp(op)) return false;
    ++i_;
    return true;
  }
  bool SkipName(const char* name) {
    if (!IsName(name)) return false;
    ++i_;
    return true;
  }

  static std::string Describe(const Token& t) {
    switch (t.type) {
      case Tok::kEof: return "end of template";
      case Tok::kBlockEnd: return "'%}'";
      case Tok::kVarEnd: return "'}}'";
      case Tok::kBlockBegin: return "'{%'";
      case Tok::kVarBegin: return "'{{'";
      case Tok::kText: return "text";
      case Tok::kString: return "a string";
      case Tok::kInt:
      case Tok::kFloat: return absl::StrCat("'", t.text, "'");
      default: return absl::StrCat("'", t.text, "'");
    }
  }

  [[noreturn]] void Fail(const std::string& expected) const {
    throw Error(absl::StrCat("expected ", expected, ", got ", Describe(cur())), cur().line);
  }
  void ExpectOp(const char* op) {
    if (!SkipOp(op)) Fail(absl::StrCat("'", op, "'"));
  }
  void ExpectBlockEnd() {
    if (cur().type != Tok::kBlockEnd) Fail("'%}'");
    ++i_;
  }
  std::string ExpectName() {
    if (cur().type != Tok::kName) Fail("a name");
    return t_[i_++].text;
  }

  ExprPtr Node(Expr::Kind kind, int line) {
    auto e = std::make_unique<Expr>();
    e->kind = kind;
    e->line = line;
    return e;
  }

  // Statements until a block tag named in `ends` (left unconsumed: returns
  // its name) or the end of the template (returns "").
  std::string Subparse(std::initializer_list<const char*> ends, Body* body) {
    while (true) {
      const Token& t = cur();
      if (t.type == Tok::kEof) {
        if (ends.size() > 0) {
          throw Error(absl::StrCat("unexpected end of template, expected '", *ends.begin(), "'"), t.line);
        }
        return "";
      }
      if (t.type == Tok::kText) {
        auto s = std::make_unique<Stmt>();
        s->kind = Stmt::Kind::kText;
        s->line = t.line;
        s->text = t.text;
        body->push_back(std::move(s));
        ++i_;
      } else if (t.type == Tok::kVarBegin) {
        ++i_;
        auto s = std::make_unique<Stmt>();
        s->kind = Stmt::Kind::kOutput;
        s->line = t.line;
        s->expr = Tuple();
        if (cur().type != Tok::kVarEnd) Fail("'}}'");
        ++i_;
        body->push_back(std::move(s));
      } else if (t.type == Tok::kBlockBegin) {
        const Token& name = peek();
        if (name.type == Tok::kName) {
          for (const char* end : ends) {
            if (name.text == end) {
              i_ += 2;
              return end;
            }
          }
        }
        if (name.type == Tok::kName && (name.text.starts_with("end") || name.text == "elif" ||
                                        name.text == "else")) {
          std::string expected;
          for (const char* end : ends) {
            absl::StrAppend(&expected, expected.empty() ? ", expected '" : "' or '", end);
          }
          if (!expected.empty()) expected += "'";
          throw Error(absl::StrCat("unexpected '", name.text, "'", expected), name.line);
        }
        ++i_;
        body->push_back(Statement());
      } else {
        Fail("text or a tag");
      }
    }
  }

  StmtPtr Statement() {
    const int line = cur().line;
    std::string tag = ExpectName();
    auto s = std::make_unique<Stmt>();
    s->line = line;
    if (tag == "if") {
      s->kind = Stmt::Kind::kIf;
      If(s.get());
    } else if (tag == "for") {
      s->kind = Stmt::Kind::kFor;
      s->targets = Targets();
      if (!SkipName("in")) Fail("'in'");
      s->expr = Tuple(/*condexpr=*/false);
      if (SkipName("if")) s->cond = Expression();
      if (IsName("recursive")) throw Error("recursive loops are not supported", line);
      ExpectBlockEnd();
      if (Subparse({"endfor", "else"}, &s->body) == "else") {
        ExpectBlockEnd();
        Subparse({"endfor"}, &s->else_body);
      }
      ExpectBlockEnd();
    } else if (tag == "set") {
      if (cur().type == Tok::kName && peek().type == Tok::kOp && peek().text == ".") {
        s->kind = Stmt::Kind::kSet;
        s->expr = Node(Expr::Kind::kName, line);
        s->expr->name = ExpectName();
        ++i_;
        s->name = ExpectName();
      } else {
        s->targets = Targets();
      }
      if (SkipOp("=")) {
        s->kind = Stmt::Kind::kSet;
        s->value = Tuple();
        ExpectBlockEnd();
      } else {
        if (s->expr || s->targets.size() != 1) Fail("'='");
        s->kind = Stmt::Kind::kSetBlock;
        while (SkipOp("|")) s->filters.push_back(Filter(nullptr));
        ExpectBlockEnd();
        Subparse({"endset"}, &s->body);
        ExpectBlockEnd();
      }
    } else if (tag == "macro") {
      s->kind = Stmt::Kind::kMacro;
      s->name = ExpectName();
      s->params = Params();
      ExpectBlockEnd();
      Subparse({"endmacro"}, &s->body);
      ExpectBlockEnd();
    } else if (tag == "call") {
      s->kind = Stmt::Kind::kCallBlock;
      if (IsOp("(")) s->params = Params();
      s->expr = Unary();
      if (s->expr->kind != Expr::Kind::kCall) Fail("a call");
      ExpectBlockEnd();
      Subparse({"endcall"}, &s->body);
      ExpectBlockEnd();
    } else if (tag == "filter") {
      s->kind = Stmt::Kind::kFilterBlock;
      do {
        s->filters.push_back(Filter(nullptr));
      } while (SkipOp("|"));
      ExpectBlockEnd();
      Subparse({"endfilter"}, &s->body);
      ExpectBlockEnd();
    } else if (tag == "generation") {
      s->kind = Stmt::Kind::kGeneration;
      ExpectBlockEnd();
      Subparse({"endgeneration"}, &s->body);
      ExpectBlockEnd();
    } else if (tag == "break" || tag == "continue") {
      s->kind = tag == "break" ? Stmt::Kind::kBreak : Stmt::Kind::kContinue;
      ExpectBlockEnd();
    } else {
      throw Error(absl::StrCat("unknown tag '", tag, "'"), line);
    }
    return s;
  }

  void If(Stmt* s) {
    s->expr = Tuple();
    ExpectBlockEnd();
    std::string end = Subparse({"elif", "else", "endif"}, &s->body);
    if (end == "elif") {
      auto elif = std::make_unique<Stmt>();
      elif->kind = Stmt::Kind::kIf;
      elif->line = cur().line;
      If(elif.get());
      s->else_body.push_back(std::move(elif));
      return;  // the innermost elif consumed the endif
    }
    if (end == "else") {
      ExpectBlockEnd();
      Subparse({"endif"}, &s->else_body);
    }
    ExpectBlockEnd();
  }

  // Assignment targets: a name, or names separated by commas (optionally in
  // parentheses).
  std::vector<std::string> Targets() {
    std::vector<std::string> names;
    bool paren = SkipOp("(");
    do {
      if (paren && IsOp(")")) break;
      names.push_back(ExpectName());
    } while (SkipOp(","));
    if (paren) ExpectOp(")");
    return names;
  }

  std::vector<Param> Params() {
    std::vector<Param> params;
    ExpectOp("(");
    while (!SkipOp(")")) {
      if (!params.empty()) ExpectOp(",");
      if (SkipOp(")")) break;
      Param p;
      p.name = ExpectName();
      if (SkipOp("=")) {
        p.default_value = Expression();
      } else if (!params.empty() && params.back().default_value) {
        throw Error("non-default argument follows default argument", cur().line);
      }
      params.push_back(std::move(p));
    }
    return params;
  }

  // Comma-separated expressions: one without a comma is itself, else a tuple.
  ExprPtr Tuple(bool condexpr = true) {
    const int line = cur().line;
    std::vector<ExprPtr> items;
    bool comma = false;
    while (true) {
      if (!items.empty()) {
        if (!SkipOp(",")) break;
        comma = true;
        if (cur().type == Tok::kBlockEnd || cur().type == Tok::kVarEnd || IsOp(")") || IsOp("=") ||
            IsName("if")) {
          break;
        }
      }
      items.push_back(condexpr ? Expression() : Or());
    }
    if (!comma) return std::move(items[0]);
    auto e = Node(Expr::Kind::kTuple, line);
    e->args = std::move(items);
    return e;
  }

  ExprPtr Expression() {
    ExprPtr e = Or();
    while (IsName("if")) {
      const int line = cur().line;
      ++i_;
      auto c = Node(Expr::Kind::kCondExpr, line);
      c->args.push_back(Or());
      c->args.push_back(std::move(e));
      c->args.push_back(SkipName("else") ? Expression() : nullptr);
      e = std::move(c);
    }
    return e;
  }

  ExprPtr Binary(ExprPtr left, std::string op, ExprPtr right, int line) {
    auto e = Node(Expr::Kind::kBinary, line);
    e->name = std::move(op);
    e->args.push_back(std::move(left));
    e->args.push_back(std::move(right));
    return e;
  }

  ExprPtr Or() {
    ExprPtr e = And();
    while (IsName("or")) {
      const int line = t_[i_++].line;
      e = Binary(std::move(e), "or", And(), line);
    }
    return e;
  }

  ExprPtr And() {
    ExprPtr e = Not();
    while (IsName("and")) {
      const int line = t_[i_++].line;
      e = Binary(std::move(e), "and", Not(), line);
    }
    return e;
  }

  ExprPtr Not() {
    if (IsName("not")) {
      auto e = Node(Expr::Kind::kUnary, t_[i_++].line);
      e->name = "not";
      e->args.push_back(Not());
      return e;
    }
    return Compare();
  }

  ExprPtr Compare() {
    const int line = cur().line;
    ExprPtr first = Math1();
    auto e = Node(Expr::Kind::kCompare, line);
    e->args.push_back(std::move(first));
    while (true) {
      std::string op;
      if (cur().type == Tok::kOp &&
          (IsOp("==") || IsOp("!=") || IsOp("<") || IsOp(">") || IsOp("<=") || IsOp(">="))) {
        op = t_[i_++].text;
      } else if (IsName("in")) {
        ++i_;
        op = "in";
      } else if (IsName("not") && peek().type == Tok::kName && peek().text == "in") {
        i_ += 2;
        op = "not in";
      } else {
        break;
      }
      e->ops.push_back(op);
      e->args.push_back(Math1());
    }
    if (e->ops.empty()) return std::move(e->args[0]);
    return e;
  }

  ExprPtr Math1() {
    ExprPtr e = Concat();
    while (IsOp("+") || IsOp("-")) {
      const Token& op = t_[i_++];
      e = Binary(std::move(e), op.text, Concat(), op.line);
    }
    return e;
  }

  ExprPtr Concat() {
    ExprPtr e = Math2();
    while (IsOp("~")) {
      const int line = t_[i_++].line;
      e = Binary(std::move(e), "~", Math2(), line);
    }
    return e;
  }

  ExprPtr Math2() {
    ExprPtr e = Pow();
    while (IsOp("*") || IsOp("/") || IsOp("//") || IsOp("%")) {
      const Token& op = t_[i_++];
      e = Binary(std::move(e), op.text, Pow(), op.line);
    }
    return e;
  }

  ExprPtr Pow() {
    ExprPtr e = Unary();
    while (IsOp("**")) {
      const int line = t_[i_++].line;
      e = Binary(std::move(e), "**", Unary(), line);
    }
    return e;
  }

  ExprPtr Unary(bool with_filter = true) {
    ExprPtr e;
    if (IsOp("-") || IsOp("+")) {
      const Token& op = t_[i_++];
      e = Node(Expr::Kind::kUnary, op.line);
      e->name = op.text;
      e->args.push_back(Unary(/*with_filter=*/false));
    } else {
      e = Primary();
    }
    e = Postfix(std::move(e));
    if (with_filter) e = FilterTests(std::move(e));
    return e;
  }

  ExprPtr Primary() {
    const Token& t = cur();
    switch (t.type) {
      case Tok::kName: {
        ++i_;
        auto e = Node(Expr::Kind::kLiteral, t.line);
        if (t.text == "true" || t.text == "True") {
          e->value = true;
        } else if (t.text == "false" || t.text == "False") {
          e->value = false;
        } else if (t.text == "none" || t.text == "None") {
          e->value = nullptr;
        } else {
          e->kind = Expr::Kind::kName;
          e->name = t.text;
        }
        return e;
      }
      case Tok::kString: {
        auto e = Node(Expr::Kind::kLiteral, t.line);
        std::string s;
        while (cur().type == Tok::kString) s += t_[i_++].text;  // "a" "b" is "ab"
        e->value = std::move(s);
        return e;
      }
      case Tok::kInt:
      case Tok::kFloat: {
        auto e = Node(Expr::Kind::kLiteral, t.line);
        e->value = t.number;
        ++i_;
        return e;
      }
      case Tok::kOp:
        if (t.text == "(") {
          ++i_;
          if (SkipOp(")")) {
            return Node(Expr::Kind::kTuple, t.line);
          }
          ExprPtr e = Tuple();
          ExpectOp(")");
          return e;
        }
        if (t.text == "[" || t.text == "{") {
          ++i_;
          const bool list = t.text == "[";
          auto e = Node(list ? Expr::Kind::kList : Expr::Kind::kDict, t.line);
          const char* close = list ? "]" : "}";
          while (!SkipOp(close)) {
            if (!e->args.empty()) {
              ExpectOp(",");
              if (SkipOp(close)) break;
            }
            e->args.push_back(Expression());
            if (!list) {
              ExpectOp(":");
              e->args.push_back(Expression());
            }
          }
          return e;
        }
        break;
      default:
        break;
    }
    Fail("an expression");
  }

  ExprPtr Postfix(ExprPtr e) {
    while (true) {
      const int line = cur().line;
      if (SkipOp(".")) {
        if (cur().type == Tok::kInt) {
          auto g = Node(Expr::Kind::kGetItem, line);
          g->args.push_back(std::move(e));
          auto idx = Node(Expr::Kind::kLiteral, line);
          idx->value = t_[i_++].number;
          g->args.push_back(std::move(idx));
          e = std::move(g);
        } else {
          auto g = Node(Expr::Kind::kGetAttr, line);
          g->name = ExpectName();
          g->args.push_back(std::move(e));
          e = std::move(g);
        }
      } else if (SkipOp("[")) {
        e = Subscript(std::move(e), line);
      } else if (IsOp("(")) {
        auto c = Node(Expr::Kind::kCall, line);
        c->args.push_back(std::move(e));
        CallArguments(c.get());
        e = std::move(c);
      } else {
        return e;
      }
    }
  }

  ExprPtr Subscript(ExprPtr object, int line) {
    std::vector<ExprPtr> parts(1);
    bool slice = false;
    while (!IsOp("]")) {
      if (SkipOp(":")) {
        slice = true;
        if (parts.size() == 3) Fail("']'");
        parts.emplace_back();
        continue;
      }
      if (parts.back()) Fail("':' or ']'");
      parts.back() = Expression();
    }
    ++i_;
    if (!slice) {
      if (!parts[0]) Fail("an index");
      auto g = Node(Expr::Kind::kGetItem, line);
      g->args.push_back(std::move(object));
      g->args.push_back(std::move(parts[0]));
      return g;
    }
    parts.resize(3);
    auto s = Node(Expr::Kind::kSlice, line);
    s->args.push_back(std::move(object));
    for (auto& p : parts) s->args.push_back(std::move(p));
    return s;
  }

  // "(a, b, key=c)" into e->args (after whatever is there) and e->keywords.
  void CallArguments(Expr* e) {
    ExpectOp("(");
    bool first = true;
    while (!SkipOp(")")) {
      if (!first) {
        ExpectOp(",");
        if (SkipOp(")")) break;
      }
      first = false;
      if (cur().type == Tok::kName && peek().type == Tok::kOp && peek().text == "=") {
        std::string key = t_[i_].text;
        i_ += 2;
        e->keywords.emplace_back(std::move(key), Expression());
      } else {
        if (!e->keywords.empty()) {
          throw Error("positional argument follows keyword argument", cur().line);
        }
        e->args.push_back(Expression());
      }
    }
  }

  // "name" or "name(args)" after a "|"; args[0] is the operand.
  ExprPtr Filter(ExprPtr operand) {
    auto f = Node(Expr::Kind::kFilter, cur().line);
    f->name = ExpectName();
    while (SkipOp(".")) f->name += "." + ExpectName();
    f->args.push_back(std::move(operand));
    if (IsOp("(")) CallArguments(f.get());
    return f;
  }

  ExprPtr FilterTests(ExprPtr e) {
    while (true) {
      if (SkipOp("|")) {
        e = Filter(std::move(e));
      } else if (IsName("is")) {
        auto t = Node(Expr::Kind::kTest, t_[i_++].line);
        t->negate = SkipName("not");
        t->name = ExpectName();
        while (SkipOp(".")) t->name += "." + ExpectName();
        t->args.push_back(std::move(e));
        const Token& c = cur();
        if (IsOp("(")) {
          CallArguments(t.get());
        } else if ((c.type == Tok::kName || c.type == Tok::kString || c.type == Tok::kInt ||
                    c.type == Tok::kFloat || IsOp("[") || IsOp("{")) &&
                   !IsName("else") && !IsName("or") && !IsName("and")) {
          // One argument without parentheses: `x is divisibleby 3`.
          t->args.push_back(Postfix(Primary()));
        }
        e = std::move(t);
      } else if (IsOp("(")) {
        auto c = Node(Expr::Kind::kCall, cur().line);
        c->args.push_back(std::move(e));
        CallArguments(c.get());
        e = std::move(c);
      } else {
        return e;
      }
    }
  }

  std::vector<Token> t_;
  size_t i_ = 0;
};

}  // namespace

std::unique_ptr<Program> Parse(std::string_view source) {
  return Parser(Lexer(source).Run()).Run();
}

}  // namespace kvserve::jinja

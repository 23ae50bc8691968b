// Recursive-descent parser for kvserve's Jinja subset. The grammar and
// operator precedence are Jinja2's (jinja2/parser.py), lowest first:
//   a if b else c · or · and · not · comparisons and in · + - · ~ · * / // %
//   · ** · unary - + · postfix (.attr [item] [a:b:c] (call) |filter is test)
#include <algorithm>

#include "absl/strings/str_cat.h"
#include "model/chat/jinja/ast.h"
#include "model/chat/jinja/lexer.h"

namespace kvserve::jinja {
namespace {

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
      case Tok::kEof:
        return "end of template";
      case Tok::kBlockEnd:
        return "'%}'";
      case Tok::kVarEnd:
        return "'}}'";
      case Tok::kBlockBegin:
        return "'{%'";
      case Tok::kVarBegin:
        return "'{{'";
      case Tok::kText:
        return "text";
      case Tok::kString:
        return "a string";
      case Tok::kInt:
      case Tok::kFloat:
        return absl::StrCat("'", t.text, "'");
      default:
        return absl::StrCat("'", t.text, "'");
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
          throw Error(absl::StrCat("unexpected end of template, expected '", *ends.begin(), "'"),
                      t.line);
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
        if (name.type == Tok::kName &&
            (name.text.starts_with("end") || name.text == "elif" || name.text == "else")) {
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

std::unique_ptr<Program> Parse(std::string_view source) { return Parser(Lex(source)).Run(); }

}  // namespace kvserve::jinja

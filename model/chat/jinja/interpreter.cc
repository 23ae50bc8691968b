#include "model/chat/jinja/interpreter.h"

#include "absl/strings/str_cat.h"
#include "model/chat/jinja/builtins.h"

namespace kvserve::jinja {
namespace {

constexpr int kMaxCallDepth = 256;

}  // namespace

Value Scope::Lookup(std::string_view name) const {
  for (const Scope* s = this; s != nullptr; s = s->parent.get()) {
    if (const Value* v = s->vars.Find(name)) return *v;
  }
  return Value();
}

std::string Interpreter::Render(const Program& program, Object globals) {
  auto scope = std::make_shared<Scope>();
  scope->vars = std::move(globals);
  std::string out;
  if (Exec(program.body, scope, &out) != Flow::kNormal) {
    throw Error("'break' or 'continue' outside a loop");
  }
  return out;
}

Interpreter::Flow Interpreter::Exec(const Body& body, const std::shared_ptr<Scope>& scope,
                                    std::string* out) {
  for (const StmtPtr& s : body) {
    Flow f;
    try {
      f = ExecOne(*s, scope, out);
    } catch (Error& e) {
      if (e.line() == 0) e.set_line(s->line);
      throw;
    }
    if (f != Flow::kNormal) return f;
  }
  return Flow::kNormal;
}

Interpreter::Flow Interpreter::ExecOne(const Stmt& s, const std::shared_ptr<Scope>& scope,
                                       std::string* out) {
  switch (s.kind) {
    case Stmt::Kind::kText:
      out->append(s.text);
      return Flow::kNormal;
    case Stmt::Kind::kOutput:
      out->append(ToString(Eval(*s.expr, scope)));
      return Flow::kNormal;
    case Stmt::Kind::kIf:
      return Exec(Eval(*s.expr, scope).Truthy() ? s.body : s.else_body, scope, out);
    case Stmt::Kind::kFor:
      ExecFor(s, scope, out);
      return Flow::kNormal;
    case Stmt::Kind::kSet: {
      Value v = Eval(*s.value, scope);
      if (s.expr) {
        Value ns = Eval(*s.expr, scope);
        if (!ns.is_namespace()) throw Error("cannot assign attribute on non-namespace object");
        ns.as_namespace().attrs.Set(s.name, std::move(v));
      } else if (s.targets.size() == 1) {
        scope->vars.Set(s.targets[0], std::move(v));
      } else {
        Array items = Iterate(v);
        if (items.size() != s.targets.size()) {
          throw Error(
              absl::StrCat("cannot unpack ", items.size(), " values into ", s.targets.size()));
        }
        for (size_t i = 0; i < items.size(); ++i) scope->vars.Set(s.targets[i], items[i]);
      }
      return Flow::kNormal;
    }
    case Stmt::Kind::kSetBlock:
    case Stmt::Kind::kFilterBlock: {
      std::string text;
      if (Exec(s.body, scope, &text) != Flow::kNormal) {
        throw Error("'break' or 'continue' outside a loop");
      }
      Value v(std::move(text));
      for (const ExprPtr& f : s.filters) v = ApplyFilter(*f, std::move(v), scope);
      if (s.kind == Stmt::Kind::kSetBlock) {
        scope->vars.Set(s.targets[0], std::move(v));
      } else {
        out->append(ToString(v));
      }
      return Flow::kNormal;
    }
    case Stmt::Kind::kMacro:
      scope->vars.Set(s.name, MakeMacro(s, scope));
      return Flow::kNormal;
    case Stmt::Kind::kCallBlock: {
      Value caller = MakeMacro(s, scope);
      const Expr& call = *s.expr;
      CallArgs args = EvalArgs(call, 1, scope);
      args.keyword.emplace_back("caller", caller);
      out->append(ToString(Call(Eval(*call.args[0], scope), args)));
      return Flow::kNormal;
    }
    case Stmt::Kind::kGeneration:
      return Exec(s.body, scope, out);
    case Stmt::Kind::kBreak:
      return Flow::kBreak;
    case Stmt::Kind::kContinue:
      return Flow::kContinue;
  }
  return Flow::kNormal;
}

// Each iteration runs in a fresh child scope of the loop's surroundings, as
// in Jinja2: a `set` in the body is gone by the next iteration.
void Interpreter::ExecFor(const Stmt& s, const std::shared_ptr<Scope>& scope, std::string* out) {
  auto bind = [&](Scope* iteration, const Value& item) {
    if (s.targets.size() == 1) {
      iteration->vars.Set(s.targets[0], item);
      return;
    }
    Array parts = Iterate(item);
    if (parts.size() != s.targets.size()) {
      throw Error(absl::StrCat("cannot unpack ", parts.size(), " values into ", s.targets.size(),
                               " loop variables"));
    }
    for (size_t i = 0; i < parts.size(); ++i) iteration->vars.Set(s.targets[i], parts[i]);
  };

  Array items = Iterate(Eval(*s.expr, scope));
  if (s.cond) {
    Array kept;
    for (const Value& item : items) {
      auto test_scope = std::make_shared<Scope>();
      test_scope->parent = scope;
      bind(test_scope.get(), item);
      if (Eval(*s.cond, test_scope).Truthy()) kept.push_back(item);
    }
    items = std::move(kept);
  }
  if (items.empty()) {
    if (Exec(s.else_body, scope, out) != Flow::kNormal) {
      throw Error("'break' or 'continue' outside a loop");
    }
    return;
  }
  const int64_t n = static_cast<int64_t>(items.size());
  for (int64_t i = 0; i < n; ++i) {
    Object loop;
    loop.entries = {{"index", Value(i + 1)},
                    {"index0", Value(i)},
                    {"revindex", Value(n - i)},
                    {"revindex0", Value(n - i - 1)},
                    {"first", Value(i == 0)},
                    {"last", Value(i == n - 1)},
                    {"length", Value(n)},
                    {"previtem", i > 0 ? items[i - 1] : Value()},
                    {"nextitem", i + 1 < n ? items[i + 1] : Value()},
                    {"depth", Value(1)},
                    {"depth0", Value(0)}};
    loop.entries.emplace_back("cycle", Value(Function([i](Interpreter&, CallArgs& args) {
                                if (args.positional.empty()) {
                                  throw Error("no items for cycling given");
                                }
                                return args.positional[i % args.positional.size()];
                              })));
    auto iteration = std::make_shared<Scope>();
    iteration->parent = scope;
    iteration->vars.Set("loop", Value(std::move(loop)));
    bind(iteration.get(), items[i]);
    if (Exec(s.body, iteration, out) == Flow::kBreak) break;
  }
}

// A macro (or a call block's body, as `caller`) as a function value. Its
// body runs in a child of the scope it was defined in.
Value Interpreter::MakeMacro(const Stmt& s, const std::shared_ptr<Scope>& scope) {
  const Stmt* macro = &s;
  std::weak_ptr<Scope> weak = scope;
  const std::string name = s.kind == Stmt::Kind::kMacro ? s.name : "caller";
  return Value(Function([macro, weak, name](Interpreter& in, CallArgs& args) {
    std::shared_ptr<Scope> defined_in = weak.lock();
    if (!defined_in) throw Error(absl::StrCat("macro '", name, "' called after its scope ended"));
    if (++in.depth_ > kMaxCallDepth) {
      --in.depth_;
      throw Error(absl::StrCat("macro '", name, "': calls nested deeper than ", kMaxCallDepth));
    }
    auto local = std::make_shared<Scope>();
    local->parent = defined_in;
    const std::vector<Param>& params = macro->params;
    Array varargs;
    for (size_t i = params.size(); i < args.positional.size(); ++i) {
      varargs.push_back(args.positional[i]);
    }
    Object kwargs;
    for (const auto& [k, v] : args.keyword) {
      bool is_param = false;
      for (const Param& p : params) is_param |= p.name == k;
      if (k == "caller") {
        local->vars.Set("caller", v);
      } else if (!is_param) {
        kwargs.Set(k, v);
      }
    }
    local->vars.Set("varargs", Value::Tuple(std::move(varargs)));
    local->vars.Set("kwargs", Value(std::move(kwargs)));
    for (size_t i = 0; i < params.size(); ++i) {
      Value v = args.Get(static_cast<int>(i), params[i].name);
      if (v.is_undefined() && params[i].default_value) {
        v = in.Eval(*params[i].default_value, local);
      }
      local->vars.Set(params[i].name, std::move(v));
    }
    std::string out;
    Flow f = in.Exec(macro->body, local, &out);
    --in.depth_;
    if (f != Flow::kNormal) throw Error("'break' or 'continue' outside a loop");
    return Value(std::move(out));
  }));
}

CallArgs Interpreter::EvalArgs(const Expr& e, size_t first, const std::shared_ptr<Scope>& scope) {
  CallArgs args;
  for (size_t i = first; i < e.args.size(); ++i) args.positional.push_back(Eval(*e.args[i], scope));
  for (const auto& [k, v] : e.keywords) args.keyword.emplace_back(k, Eval(*v, scope));
  return args;
}

Value Interpreter::Call(const Value& fn, CallArgs& args) {
  if (!fn.is_function()) throw Error(absl::StrCat("'", fn.TypeName(), "' object is not callable"));
  return fn.as_function()(*this, args);
}

Value Interpreter::ApplyFilter(const Expr& f, Value operand, const std::shared_ptr<Scope>& scope) {
  CallArgs args = EvalArgs(f, 1, scope);
  return Filter(f.name, operand, args);
}

Value Interpreter::Filter(const std::string& name, const Value& operand, CallArgs& args) {
  return FilterBuiltin(*this, name, operand, args);
}

bool Interpreter::Test(const std::string& name, const Value& operand, CallArgs& args) {
  return TestBuiltin(*this, name, operand, args);
}

Value Interpreter::Eval(const Expr& e, const std::shared_ptr<Scope>& scope) {
  try {
    return EvalInner(e, scope);
  } catch (Error& err) {
    if (err.line() == 0) err.set_line(e.line);
    throw;
  }
}

Value Interpreter::EvalInner(const Expr& e, const std::shared_ptr<Scope>& scope) {
  using K = Expr::Kind;
  switch (e.kind) {
    case K::kLiteral:
      return e.value;
    case K::kName:
      return scope->Lookup(e.name);
    case K::kList:
    case K::kTuple: {
      Array a;
      for (const ExprPtr& x : e.args) a.push_back(Eval(*x, scope));
      return e.kind == K::kTuple ? Value::Tuple(std::move(a)) : Value(std::move(a));
    }
    case K::kDict: {
      Object o;
      for (size_t i = 0; i + 1 < e.args.size(); i += 2) {
        Value k = Eval(*e.args[i], scope);
        if (!k.is_string()) {
          throw Error(absl::StrCat("mapping keys must be strings, got ", k.TypeName()));
        }
        o.Set(k.as_string(), Eval(*e.args[i + 1], scope));
      }
      return Value(std::move(o));
    }
    case K::kGetAttr:
      return GetAttr(Eval(*e.args[0], scope), e.name);
    case K::kGetItem:
      return GetItem(Eval(*e.args[0], scope), Eval(*e.args[1], scope));
    case K::kSlice: {
      Value obj = Eval(*e.args[0], scope);
      Value part[3];
      for (int i = 0; i < 3; ++i) {
        if (e.args[i + 1]) part[i] = Eval(*e.args[i + 1], scope);
      }
      return GetSlice(obj, part[0], part[1], part[2]);
    }
    case K::kCall: {
      Value fn = Eval(*e.args[0], scope);
      CallArgs args = EvalArgs(e, 1, scope);
      return Call(fn, args);
    }
    case K::kFilter:
      return ApplyFilter(e, Eval(*e.args[0], scope), scope);
    case K::kTest: {
      Value operand = Eval(*e.args[0], scope);
      CallArgs args = EvalArgs(e, 1, scope);
      return Value(Test(e.name, operand, args) != e.negate);
    }
    case K::kUnary: {
      Value v = Eval(*e.args[0], scope);
      if (e.name == "not") return Value(!v.Truthy());
      if (v.is_float()) return Value(e.name == "-" ? -v.as_float() : v.as_float());
      if (v.is_int() || v.is_bool()) {
        int64_t i = v.is_int() ? v.as_int() : v.as_bool();
        return Value(e.name == "-" ? -i : i);
      }
      throw Error(absl::StrCat("bad operand type for unary ", e.name, ": '", v.TypeName(), "'"));
    }
    case K::kBinary: {
      Value a = Eval(*e.args[0], scope);
      if (e.name == "and") return a.Truthy() ? Eval(*e.args[1], scope) : a;
      if (e.name == "or") return a.Truthy() ? a : Eval(*e.args[1], scope);
      return BinaryOp(e.name, a, Eval(*e.args[1], scope));
    }
    case K::kCompare: {
      Value left = Eval(*e.args[0], scope);
      for (size_t i = 0; i < e.ops.size(); ++i) {
        Value right = Eval(*e.args[i + 1], scope);
        if (!CompareOp(e.ops[i], left, right)) return Value(false);
        left = std::move(right);
      }
      return Value(true);
    }
    case K::kCondExpr:
      if (Eval(*e.args[0], scope).Truthy()) return Eval(*e.args[1], scope);
      return e.args[2] ? Eval(*e.args[2], scope) : Value();
  }
  return Value();
}

}  // namespace kvserve::jinja

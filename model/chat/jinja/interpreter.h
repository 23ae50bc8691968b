// jinja::Interpreter: renders a parsed Program (model/chat/jinja/ast.h) against a
// scope of variables. Internal to model/chat/jinja/template.cc; the builtins
// (operators, filters, tests, methods, globals such as namespace() and
// raise_exception()) are declared in jinja_builtins.h.
//
// Scoping is Jinja2's: the template has one global scope, each loop
// iteration and each macro call a child scope, so a `set` inside a loop
// lasts one iteration (namespace() is how templates carry state out).
//
// Thread-safety: one Interpreter per render.
#pragma once

#include <memory>
#include <string>

#include "model/chat/jinja/ast.h"

namespace kvserve::jinja {

struct Scope {
  std::shared_ptr<Scope> parent;
  Object vars;

  // The variable, or undefined.
  Value Lookup(std::string_view name) const;
};

class Interpreter {
 public:
  // Renders `program` with `globals` (the caller's context plus the
  // builtins) as the template's global scope.
  std::string Render(const Program& program, Object globals);

  Value Eval(const Expr& e, const std::shared_ptr<Scope>& scope);
  // Calls a function value.
  Value Call(const Value& fn, CallArgs& args);
  // Applies the filter named in `f` (a kFilter node) to `operand`.
  Value ApplyFilter(const Expr& f, Value operand, const std::shared_ptr<Scope>& scope);
  // Filter or test by name with already evaluated arguments (select, map).
  Value Filter(const std::string& name, const Value& operand, CallArgs& args);
  bool Test(const std::string& name, const Value& operand, CallArgs& args);

 private:
  enum class Flow { kNormal, kBreak, kContinue };

  Flow Exec(const Body& body, const std::shared_ptr<Scope>& scope, std::string* out);
  Flow ExecOne(const Stmt& s, const std::shared_ptr<Scope>& scope, std::string* out);
  void ExecFor(const Stmt& s, const std::shared_ptr<Scope>& scope, std::string* out);
  Value MakeMacro(const Stmt& s, const std::shared_ptr<Scope>& scope);
  CallArgs EvalArgs(const Expr& e, size_t first, const std::shared_ptr<Scope>& scope);
  Value EvalInner(const Expr& e, const std::shared_ptr<Scope>& scope);

  int depth_ = 0;  // nested macro calls, bounded against runaway recursion
};

}  // namespace kvserve::jinja

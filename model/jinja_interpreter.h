// jinja::Interpreter: renders a parsed Program (model/jinja_ast.h) against a
// scope of variables. Internal to model/jinja_template.cc; the builtins
// (filters, tests, methods of strings and mappings, globals such as
// namespace() and raise_exception()) live in jinja_builtins.cc.
//
// Scoping is Jinja2's: the template has one global scope, each for loop and
// each macro call a child scope, so `set` inside a loop stays in the loop
// (namespace() is how templates carry state out of one).
//
// Thread-safety: one Interpreter per render.
#pragma once

#include <memory>
#include <string>

#include "model/jinja_ast.h"

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

// --- builtins (jinja_builtins.cc) ---

// Binary operators other than and/or; `~` included.
Value BinaryOp(const std::string& op, const Value& a, const Value& b);
// One comparison of a chain: == != < > <= >= in, not in.
bool CompareOp(const std::string& op, const Value& a, const Value& b);
// obj.name: a member, an item of a mapping, or a bound method.
Value GetAttr(const Value& obj, const std::string& name);
// obj[key].
Value GetItem(const Value& obj, const Value& key);
// obj[start:stop:step] on lists and strings.
Value GetSlice(const Value& obj, const Value& start, const Value& stop, const Value& step);
// The items a for loop visits: list items, mapping keys, string characters.
Array Iterate(const Value& v);
// Adds range, namespace, dict, raise_exception and strftime_now.
void AddGlobals(Object* globals);
Value FilterBuiltin(Interpreter& in, const std::string& name, const Value& operand, CallArgs& args);
bool TestBuiltin(Interpreter& in, const std::string& name, const Value& operand, CallArgs& args);

}  // namespace kvserve::jinja

// The syntax tree of kvserve's Jinja subset (see model/chat/jinja/template.h):
// expressions (Expr) and statements (Stmt), produced by jinja::Parse and
// walked by jinja::Interpreter. One generic node per family keeps the tree
// small; each Kind documents which fields it uses.
//
// Thread-safety: immutable after parsing; many renders may walk one tree.
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "model/chat/jinja/value.h"

namespace kvserve::jinja {

struct Expr;
using ExprPtr = std::unique_ptr<Expr>;

struct Expr {
  enum class Kind {
    kLiteral,  // value
    kName,     // name
    kList,     // args: elements
    kTuple,    // args: elements (a list at run time)
    kDict,     // args: key0, value0, key1, value1, ...
    kGetAttr,  // args[0] . name
    kGetItem,  // args[0] [ args[1] ]
    kSlice,    // args[0] [ args[1] : args[2] : args[3] ] (null = omitted)
    kCall,     // args[0] ( args[1..], keywords )
    kFilter,   // args[0] | name ( args[1..], keywords )
    kTest,     // args[0] is [not] name ( args[1..] ); negate
    kUnary,    // name ("not", "-", "+") args[0]
    kBinary,   // args[0] name args[1]; name in and or + - * / // % ** ~
    kCompare,  // args[0] ops[0] args[1] ops[1] args[2] ... (chained)
    kCondExpr  // args[1] if args[0] else args[2] (null: undefined)
  };
  Kind kind;
  int line = 0;
  Value value;
  std::string name;
  std::vector<ExprPtr> args;
  std::vector<std::pair<std::string, ExprPtr>> keywords;
  std::vector<std::string> ops;
  bool negate = false;
};

struct Stmt;
using StmtPtr = std::unique_ptr<Stmt>;
using Body = std::vector<StmtPtr>;

struct Param {
  std::string name;
  ExprPtr default_value;  // null: required
};

struct Stmt {
  enum class Kind {
    kText,         // text
    kOutput,       // {{ expr }}
    kIf,           // expr, body, else_body (an elif is an If inside else_body)
    kFor,          // targets in expr [if cond], body, else_body
    kSet,          // targets (or expr = namespace, name = attribute) = value
    kSetBlock,     // {% set targets[0] | filters %} body {% endset %}
    kMacro,        // name (params) body
    kCallBlock,    // {% call(params) expr %} body {% endcall %}: body is `caller`
    kFilterBlock,  // {% filter filters %} body {% endfilter %}
    kGeneration,   // {% generation %} body {% endgeneration %}: rendered as is
    kBreak,
    kContinue
  };
  Kind kind;
  int line = 0;
  std::string text;
  std::string name;
  ExprPtr expr;
  ExprPtr value;
  ExprPtr cond;
  std::vector<std::string> targets;
  std::vector<ExprPtr> filters;  // kFilter nodes whose args[0] is null
  std::vector<Param> params;
  Body body;
  Body else_body;
};

// A whole template.
struct Program {
  Body body;
};

// Parses template source with transformers' settings (trim_blocks,
// lstrip_blocks, one trailing newline dropped). Throws Error with a line.
std::unique_ptr<Program> Parse(std::string_view source);

}  // namespace kvserve::jinja

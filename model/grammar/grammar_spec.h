// GrammarSpec: what a request constrains its output to, as the front ends
// parse it (response_format, guided_* fields, the gRPC Constraint message,
// tool calls). Compiled by GrammarCompiler (model/grammar/grammar_compiler.h).
//
// Thread-safety: value type.
#pragma once

#include <string>
#include <vector>

namespace kvserve {

struct GrammarSpec {
  enum class Kind : unsigned char { kNone, kJsonSchema, kJsonObject, kRegex, kChoice, kGbnf };
  Kind kind = Kind::kNone;
  std::string text;                  // the schema (JSON text), the regex or the GBNF text
  std::vector<std::string> choices;  // kChoice: the output is one of these exactly
  // kJsonSchema: literal text before and after the JSON value (a tool call's
  // family tags, e.g. "<tool_call>\n" and "\n</tool_call>").
  std::string prefix, suffix;
  // The request field this came from, for error messages
  // ("response_format.json_schema.schema", "guided_regex").
  std::string field;

  bool empty() const { return kind == Kind::kNone; }
};

}  // namespace kvserve

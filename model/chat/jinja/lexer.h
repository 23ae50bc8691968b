// The lexer of kvserve's Jinja subset (see model/chat/jinja/template.h): template
// source to tokens, with Jinja2's whitespace control under transformers'
// environment: newlines normalised to \n, one trailing newline dropped,
// trim_blocks (the newline after a block or comment tag goes),
// lstrip_blocks (spaces and tabs before a block or comment tag alone on its
// line go), {%- / -%} / {{- / -}} strip all whitespace, {%+ keeps it.
// Internal to jinja_parser.cc.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "model/chat/jinja/value.h"

namespace kvserve::jinja {

enum class Tok {
  kText,
  kBlockBegin,
  kBlockEnd,
  kVarBegin,
  kVarEnd,
  kName,
  kString,
  kInt,
  kFloat,
  kOp,
  kEof
};

struct Token {
  Tok type;
  std::string text;  // name, operator, decoded string literal, text data
  int line;
  Value number;
};

// Throws Error (with a line) on malformed input.
std::vector<Token> Lex(std::string_view source);

}  // namespace kvserve::jinja

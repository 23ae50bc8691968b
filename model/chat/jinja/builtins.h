// The built-ins of kvserve's Jinja subset (see model/chat/jinja/template.h), with
// Python's semantics: operators and access (jinja_operators.cc), string
// methods and text helpers (jinja_strings.cc), filters, tests and globals
// (jinja_filters.cc). Internal to the interpreter; errors are thrown as
// jinja::Error.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "model/chat/jinja/value.h"

namespace kvserve::jinja {

// --- operators and access (jinja_operators.cc) ---

inline bool IsIntLike(const Value& v) { return v.is_int() || v.is_bool(); }
inline int64_t AsInt(const Value& v) { return v.is_bool() ? v.as_bool() : v.as_int(); }
// An integer argument; `fallback` when undefined or none.
int64_t IntArg(const Value& v, int64_t fallback, const char* what);

// Binary operators other than and/or; `~` included.
Value BinaryOp(const std::string& op, const Value& a, const Value& b);
// One comparison of a chain: == != < > <= >= in, not in.
bool CompareOp(const std::string& op, const Value& a, const Value& b);
// -1, 0 or 1 for sorting: numbers, strings (case-folded unless
// case_sensitive) and lists of those.
int CompareValues(const Value& a, const Value& b, bool case_sensitive);
// obj.name: a member, an item of a mapping, or a bound method.
Value GetAttr(const Value& obj, const std::string& name);
// obj[key].
Value GetItem(const Value& obj, const Value& key);
// obj[start:stop:step] on lists and strings.
Value GetSlice(const Value& obj, const Value& start, const Value& stop, const Value& step);
// The items a for loop visits: list items, mapping keys, string characters.
Array Iterate(const Value& v);
// dict.items() as [key, value] pairs.
Array Items(const Object& o);
// dict.get / items / keys / values.
Value MappingMethod(const Object& o, const std::string& name, CallArgs& a);

// --- strings (jinja_strings.cc) ---

bool IsStringMethod(const std::string& name);
// str.<name>(args) on `s`.
Value StringMethod(const std::string& s, const std::string& name, CallArgs& a);
// str.upper() / str.lower() (simple case mapping).
std::string CaseMap(const std::string& s, bool upper);
// str.splitlines().
std::vector<std::string> SplitLines(const std::string& s, bool keepends);
std::string HtmlEscape(const std::string& s);
// Runs of letters, digits and underscores (the wordcount filter).
int64_t CountWords(const std::string& s);

// --- filters, tests and globals (jinja_filters.cc) ---

// Adds range, namespace, dict, raise_exception and strftime_now.
void AddGlobals(Object* globals);
Value FilterBuiltin(Interpreter& in, const std::string& name, const Value& operand, CallArgs& args);
bool TestBuiltin(Interpreter& in, const std::string& name, const Value& operand, CallArgs& args);

}  // namespace kvserve::jinja

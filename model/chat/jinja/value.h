// jinja::Value: the dynamic value of kvserve's Jinja interpreter (see
// model/chat/jinja/template.h), a JSON-like tree plus the two things templates add:
// `undefined` (a missing variable or key, distinct from none) and callables
// (macros, globals, bound methods such as `text.strip`).
//
// Semantics follow Python Jinja2 as Hugging Face transformers runs chat
// templates: ints and floats stay distinct (1 vs 1.0), objects keep insertion
// order, `{{ none }}` prints "None" and `{{ true }}` prints "True", strings are
// UTF-8 and measured in code points. Lists and objects are shared and
// immutable once built; a namespace() is the one mutable container and is
// shared by reference, as in Jinja.
//
// Errors inside the interpreter are thrown as jinja::Error and become an
// absl::Status at the JinjaTemplate boundary; nothing here throws past it.
//
// Thread-safety: Values are not synchronized; one render owns its values
// (the parsed template's literal values are only read).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

namespace kvserve::jinja {

// A template error. `raised` marks raise_exception(), whose message is the
// template author's and is passed on verbatim.
class Error : public std::runtime_error {
 public:
  Error(std::string message, int line = 0, bool raised = false)
      : std::runtime_error(std::move(message)), line_(line), raised_(raised) {}
  int line() const { return line_; }
  void set_line(int line) { line_ = line; }
  bool raised() const { return raised_; }

 private:
  int line_;
  bool raised_;
};

class Value;
struct Object;
struct CallArgs;
class Interpreter;

using Array = std::vector<Value>;
using Function = std::function<Value(Interpreter&, CallArgs&)>;

struct Undefined {
  bool operator==(const Undefined&) const = default;
};
struct Namespace;

class Value {
 public:
  enum class Kind {
    kUndefined,
    kNone,
    kBool,
    kInt,
    kFloat,
    kString,
    kArray,
    kObject,
    kNamespace,
    kFunction
  };

  Value() = default;
  Value(std::nullptr_t) : v_(nullptr) {}
  Value(bool b) : v_(b) {}
  Value(int v) : v_(static_cast<int64_t>(v)) {}
  Value(int64_t v) : v_(v) {}
  Value(double v) : v_(v) {}
  Value(std::string s) : v_(std::move(s)) {}
  Value(const char* s) : v_(std::string(s)) {}
  Value(std::string_view s) : v_(std::string(s)) {}
  Value(Array a) : v_(std::make_shared<const Array>(std::move(a))) {}
  // A list that prints as a Python tuple, "(1, 2)"; otherwise a list.
  static Value Tuple(Array a) {
    Value v(std::move(a));
    v.tuple_ = true;
    return v;
  }
  Value(Object o);
  Value(std::shared_ptr<Namespace> ns) : v_(std::move(ns)) {}
  Value(Function f) : v_(std::make_shared<const Function>(std::move(f))) {}

  Kind kind() const { return static_cast<Kind>(v_.index()); }
  bool is_undefined() const { return kind() == Kind::kUndefined; }
  bool is_none() const { return kind() == Kind::kNone; }
  bool is_bool() const { return kind() == Kind::kBool; }
  bool is_int() const { return kind() == Kind::kInt; }
  bool is_float() const { return kind() == Kind::kFloat; }
  bool is_number() const { return is_int() || is_float(); }
  bool is_string() const { return kind() == Kind::kString; }
  bool is_array() const { return kind() == Kind::kArray; }
  bool is_object() const { return kind() == Kind::kObject; }
  bool is_namespace() const { return kind() == Kind::kNamespace; }
  bool is_function() const { return kind() == Kind::kFunction; }
  bool is_tuple() const { return tuple_; }

  bool as_bool() const { return std::get<bool>(v_); }
  int64_t as_int() const { return std::get<int64_t>(v_); }
  double as_float() const { return std::get<double>(v_); }
  // Ints, floats and bools as a double.
  double as_number() const;
  const std::string& as_string() const { return std::get<std::string>(v_); }
  const Array& as_array() const { return *std::get<std::shared_ptr<const Array>>(v_); }
  const Object& as_object() const { return *std::get<std::shared_ptr<const Object>>(v_); }
  Namespace& as_namespace() const { return *std::get<std::shared_ptr<Namespace>>(v_); }
  const Function& as_function() const { return *std::get<std::shared_ptr<const Function>>(v_); }

  // Python truthiness: undefined, none, false, 0, "", [] and {} are false.
  bool Truthy() const;

  // "string", "integer", "list", ... for error messages.
  const char* TypeName() const;

 private:
  std::variant<Undefined, std::nullptr_t, bool, int64_t, double, std::string,
               std::shared_ptr<const Array>, std::shared_ptr<const Object>,
               std::shared_ptr<Namespace>, std::shared_ptr<const Function>>
      v_;
  bool tuple_ = false;
};

// Insertion-ordered string-keyed map; chat template objects are small, so a
// linear search beats hashing.
struct Object {
  std::vector<std::pair<std::string, Value>> entries;

  const Value* Find(std::string_view key) const;
  void Set(std::string key, Value value);
};

struct Namespace {
  Object attrs;
};

// Arguments of a call: positional, then keyword (in call order).
struct CallArgs {
  std::vector<Value> positional;
  std::vector<std::pair<std::string, Value>> keyword;

  // The argument named `name` at position `pos` (or -1: keyword only),
  // or undefined when not given. Marks keywords as used.
  Value Get(int pos, std::string_view name);
  // Fails when a keyword was not consumed by Get or there are more than
  // max_positional positional arguments.
  void CheckConsumed(std::string_view callee, size_t max_positional) const;

 private:
  std::vector<std::string_view> used_;
};

// Deep equality with Python's rules (1 == 1.0 == true, "1" != 1).
bool Equals(const Value& a, const Value& b);

// Text as `{{ value }}` prints it: strings as is, undefined as "", numbers,
// True/False/None and containers as Python's str() would.
std::string ToString(const Value& v);

struct JsonOptions {
  int indent = -1;  // < 0: one line
  bool sort_keys = false;
  bool ensure_ascii = false;
  std::string item_separator;  // "" = ", " (or "," with an indent)
  std::string key_separator;   // "" = ": "
};
// json.dumps as transformers' `tojson` filter calls it (ensure_ascii=False).
std::string ToJson(const Value& v, const JsonOptions& options = {});

// From and to nlohmann JSON (objects keep their member order).
Value FromJson(const nlohmann::ordered_json& j);

// Python float repr: "1.0", "0.1", "1e-05", "1e+16", "inf", "nan".
std::string FormatFloat(double d);

// UTF-8 <-> code points. Invalid bytes decode as U+FFFD.
std::u32string DecodeUtf8(std::string_view s);
std::string EncodeUtf8(std::u32string_view s);
// Python's str.isspace() for one code point.
bool IsSpace(char32_t c);
// str.strip / lstrip / rstrip: `chars` none or undefined strips whitespace.
std::string Strip(std::string_view s, const Value& chars, bool left, bool right);

}  // namespace kvserve::jinja

// Filters, tests and globals of kvserve's Jinja subset: Jinja2's built-ins
// and transformers' additions (tojson, raise_exception, strftime_now).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <ctime>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "model/chat/jinja/builtins.h"
#include "model/chat/jinja/interpreter.h"

namespace kvserve::jinja {
namespace {

constexpr int64_t kMaxRange = 100000;  // Jinja's sandbox limit

// item.attr for filters taking attribute="a.b" (dotted, integers index lists).
Value AttributePath(const Value& item, const Value& attribute) {
  if (attribute.is_undefined() || attribute.is_none()) return item;
  if (IsIntLike(attribute)) return GetItem(item, attribute);
  if (!attribute.is_string()) throw Error("attribute must be a string or an integer");
  Value v = item;
  for (absl::string_view part : absl::StrSplit(attribute.as_string(), '.')) {
    bool digits = !part.empty() && part.find_first_not_of("0123456789") == absl::string_view::npos;
    v = digits ? GetItem(v, Value(static_cast<int64_t>(std::stoll(std::string(part)))))
               : GetItem(v, Value(std::string(part)));
  }
  return v;
}

// The test name and its arguments from a select/reject style argument list
// starting at `first`.
bool ApplyNamedTest(Interpreter& in, const CallArgs& a, size_t first, const Value& v) {
  if (a.positional.size() <= first) return v.Truthy();
  const Value& name = a.positional[first];
  if (!name.is_string()) throw Error("the test name must be a string");
  CallArgs targs;
  targs.positional.assign(a.positional.begin() + first + 1, a.positional.end());
  return in.Test(name.as_string(), v, targs);
}

}  // namespace

void AddGlobals(Object* g) {
  g->Set("range", Value(Function([](Interpreter&, CallArgs& a) {
           a.CheckConsumed("range", 3);
           int64_t start = 0, stop, step = 1;
           if (a.positional.size() == 1) {
             stop = IntArg(a.positional[0], 0, "range() argument");
           } else if (a.positional.size() >= 2) {
             start = IntArg(a.positional[0], 0, "range() argument");
             stop = IntArg(a.positional[1], 0, "range() argument");
             if (a.positional.size() == 3) step = IntArg(a.positional[2], 1, "range() argument");
           } else {
             throw Error("range expected at least 1 argument, got 0");
           }
           if (step == 0) throw Error("range() arg 3 must not be zero");
           Array out;
           for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) {
             if (static_cast<int64_t>(out.size()) >= kMaxRange) {
               throw Error(absl::StrCat("range too big (more than ", kMaxRange, " items)"));
             }
             out.push_back(Value(i));
           }
           return Value(std::move(out));
         })));
  auto make_namespace = [](Interpreter&, CallArgs& a) {
    auto ns = std::make_shared<Namespace>();
    if (a.positional.size() > 1) throw Error("namespace() takes at most 1 positional argument");
    if (a.positional.size() == 1) {
      const Value& init = a.positional[0];
      if (init.is_object()) {
        ns->attrs = init.as_object();
      } else {
        for (const Value& pair : Iterate(init)) {
          Array kv = Iterate(pair);
          if (kv.size() != 2 || !kv[0].is_string()) {
            throw Error("namespace() expects (key, value) pairs");
          }
          ns->attrs.Set(kv[0].as_string(), kv[1]);
        }
      }
    }
    for (const auto& [k, v] : a.keyword) ns->attrs.Set(k, v);
    return Value(ns);
  };
  g->Set("namespace", Value(Function(make_namespace)));
  g->Set("dict", Value(Function([](Interpreter&, CallArgs& a) {
           Object o;
           if (!a.positional.empty()) {
             if (a.positional.size() > 1 || !a.positional[0].is_object()) {
               throw Error("dict() takes one mapping and keyword arguments");
             }
             o = a.positional[0].as_object();
           }
           for (const auto& [k, v] : a.keyword) o.Set(k, v);
           return Value(std::move(o));
         })));
  g->Set("raise_exception", Value(Function([](Interpreter&, CallArgs& a) -> Value {
           Value message = a.Get(0, "message");
           throw Error(ToString(message), 0, /*raised=*/true);
         })));
  g->Set("strftime_now", Value(Function([](Interpreter&, CallArgs& a) {
           Value format = a.Get(0, "format");
           a.CheckConsumed("strftime_now", 1);
           if (!format.is_string()) throw Error("strftime_now() argument must be str");
           std::time_t now = std::time(nullptr);
           std::tm tm{};
           localtime_r(&now, &tm);
           char buf[256];
           size_t n = std::strftime(buf, sizeof(buf), format.as_string().c_str(), &tm);
           return Value(std::string(buf, n));
         })));
}

Value FilterBuiltin(Interpreter& in, const std::string& name, const Value& v, CallArgs& a) {
  const std::string& n = name;
  if (n == "safe" || n == "string" || n == "pprint") {
    a.CheckConsumed(n, 0);
    return n == "safe" ? v : Value(ToString(v));
  }
  if (n == "tojson") {
    JsonOptions o;
    o.indent = static_cast<int>(IntArg(a.Get(0, "indent"), -1, "indent"));
    Value separators = a.Get(-1, "separators");
    o.sort_keys = a.Get(-1, "sort_keys").Truthy();
    o.ensure_ascii = a.Get(-1, "ensure_ascii").Truthy();
    a.CheckConsumed(n, 1);
    if (separators.is_array()) {
      const Array& s = separators.as_array();
      if (s.size() != 2 || !s[0].is_string() || !s[1].is_string()) {
        throw Error("separators must be a pair of strings");
      }
      o.item_separator = s[0].as_string();
      o.key_separator = s[1].as_string();
    }
    return Value(ToJson(v, o));
  }
  if (n == "default" || n == "d") {
    Value fallback = a.Get(0, "default_value");
    bool boolean = a.Get(1, "boolean").Truthy();
    a.CheckConsumed(n, 2);
    if (v.is_undefined() || (boolean && !v.Truthy())) {
      return fallback.is_undefined() ? Value("") : fallback;
    }
    return v;
  }
  if (n == "length" || n == "count") {
    a.CheckConsumed(n, 0);
    if (v.is_string()) return Value(static_cast<int64_t>(DecodeUtf8(v.as_string()).size()));
    if (v.is_array()) return Value(static_cast<int64_t>(v.as_array().size()));
    if (v.is_object()) return Value(static_cast<int64_t>(v.as_object().entries.size()));
    if (v.is_undefined()) return Value(static_cast<int64_t>(0));
    throw Error(absl::StrCat("object of type '", v.TypeName(), "' has no len()"));
  }
  if (n == "trim") {
    Value chars = a.Get(0, "chars");
    a.CheckConsumed(n, 1);
    if (!v.is_string()) throw Error(absl::StrCat("trim expects a string, got ", v.TypeName()));
    return Value(Strip(v.as_string(), chars, true, true));
  }
  if (n == "upper" || n == "lower" || n == "title" || n == "capitalize" || n == "replace") {
    if (v.is_undefined()) return Value("");
    if (!v.is_string()) throw Error(absl::StrCat(n, " expects a string, got ", v.TypeName()));
    return StringMethod(v.as_string(), n, a);
  }
  if (n == "first" || n == "last") {
    a.CheckConsumed(n, 0);
    Array items = Iterate(v);
    if (items.empty()) return Value();
    return n == "first" ? items.front() : items.back();
  }
  if (n == "list") {
    a.CheckConsumed(n, 0);
    return Value(Iterate(v));
  }
  if (n == "reverse") {
    a.CheckConsumed(n, 0);
    if (v.is_string()) {
      std::u32string u = DecodeUtf8(v.as_string());
      std::reverse(u.begin(), u.end());
      return Value(EncodeUtf8(u));
    }
    Array items = Iterate(v);
    std::reverse(items.begin(), items.end());
    return Value(std::move(items));
  }
  if (n == "join") {
    Value sep = a.Get(0, "d");
    Value attribute = a.Get(1, "attribute");
    a.CheckConsumed(n, 2);
    std::string out;
    bool first = true;
    for (const Value& item : Iterate(v)) {
      if (!first && sep.is_string()) out += sep.as_string();
      out += ToString(AttributePath(item, attribute));
      first = false;
    }
    return Value(std::move(out));
  }
  if (n == "items") {
    a.CheckConsumed(n, 0);
    if (v.is_undefined()) return Value(Array{});
    if (!v.is_object()) throw Error(absl::StrCat("items expects a mapping, got ", v.TypeName()));
    return Value(Items(v.as_object()));
  }
  if (n == "dictsort") {
    bool case_sensitive = a.Get(0, "case_sensitive").Truthy();
    Value by = a.Get(1, "by");
    bool reverse = a.Get(2, "reverse").Truthy();
    a.CheckConsumed(n, 3);
    if (!v.is_object()) throw Error(absl::StrCat("dictsort expects a mapping, got ", v.TypeName()));
    const int pos = by.is_string() && by.as_string() == "value" ? 1 : 0;
    Array items = Items(v.as_object());
    std::stable_sort(items.begin(), items.end(), [&](const Value& x, const Value& y) {
      int c = CompareValues(x.as_array()[pos], y.as_array()[pos], case_sensitive);
      return reverse ? c > 0 : c < 0;
    });
    return Value(std::move(items));
  }
  if (n == "sort") {
    bool reverse = a.Get(0, "reverse").Truthy();
    bool case_sensitive = a.Get(1, "case_sensitive").Truthy();
    Value attribute = a.Get(2, "attribute");
    a.CheckConsumed(n, 3);
    Array items = Iterate(v);
    std::stable_sort(items.begin(), items.end(), [&](const Value& x, const Value& y) {
      int c =
          CompareValues(AttributePath(x, attribute), AttributePath(y, attribute), case_sensitive);
      return reverse ? c > 0 : c < 0;
    });
    return Value(std::move(items));
  }
  if (n == "unique") {
    bool case_sensitive = a.Get(0, "case_sensitive").Truthy();
    Value attribute = a.Get(1, "attribute");
    a.CheckConsumed(n, 2);
    Array out, seen;
    for (const Value& item : Iterate(v)) {
      Value key = AttributePath(item, attribute);
      if (key.is_string() && !case_sensitive) key = Value(CaseMap(key.as_string(), false));
      bool dup = false;
      for (const Value& s : seen) dup = dup || Equals(s, key);
      if (!dup) {
        seen.push_back(key);
        out.push_back(item);
      }
    }
    return Value(std::move(out));
  }
  if (n == "min" || n == "max") {
    bool case_sensitive = a.Get(0, "case_sensitive").Truthy();
    Value attribute = a.Get(1, "attribute");
    a.CheckConsumed(n, 2);
    Array items = Iterate(v);
    if (items.empty()) return Value();
    size_t best = 0;
    for (size_t i = 1; i < items.size(); ++i) {
      int c = CompareValues(AttributePath(items[i], attribute),
                            AttributePath(items[best], attribute), case_sensitive);
      if (n == "min" ? c < 0 : c > 0) best = i;
    }
    return items[best];
  }
  if (n == "sum") {
    Value attribute = a.Get(0, "attribute");
    Value total = a.Get(1, "start");
    a.CheckConsumed(n, 2);
    if (total.is_undefined()) total = Value(static_cast<int64_t>(0));
    for (const Value& item : Iterate(v))
      total = BinaryOp("+", total, AttributePath(item, attribute));
    return total;
  }
  if (n == "map") {
    Array out;
    Value attribute = a.Get(-1, "attribute");
    if (!attribute.is_undefined()) {
      Value fallback = a.Get(-1, "default");
      a.CheckConsumed(n, 0);
      for (const Value& item : Iterate(v)) {
        Value x = AttributePath(item, attribute);
        out.push_back(x.is_undefined() && !fallback.is_undefined() ? fallback : x);
      }
      return Value(std::move(out));
    }
    if (a.positional.empty() || !a.positional[0].is_string()) {
      throw Error("map() needs a filter name or attribute=");
    }
    CallArgs fargs;
    fargs.positional.assign(a.positional.begin() + 1, a.positional.end());
    fargs.keyword = a.keyword;
    for (const Value& item : Iterate(v)) {
      CallArgs each = fargs;
      out.push_back(in.Filter(a.positional[0].as_string(), item, each));
    }
    return Value(std::move(out));
  }
  if (n == "select" || n == "reject" || n == "selectattr" || n == "rejectattr") {
    const bool attr = n.ends_with("attr");
    const bool keep_if = n.starts_with("select");
    if (attr && a.positional.empty()) throw Error(absl::StrCat(n, "() needs an attribute name"));
    Array out;
    for (const Value& item : Iterate(v)) {
      Value x = attr ? AttributePath(item, a.positional[0]) : item;
      if (ApplyNamedTest(in, a, attr ? 1 : 0, x) == keep_if) out.push_back(item);
    }
    return Value(std::move(out));
  }
  if (n == "attr") {
    Value attribute = a.Get(0, "name");
    a.CheckConsumed(n, 1);
    if (!attribute.is_string()) throw Error("attr() name must be a string");
    return GetAttr(v, attribute.as_string());
  }
  if (n == "int" || n == "float") {
    Value fallback = a.Get(0, "default");
    a.CheckConsumed(n, n == "int" ? 2 : 1);
    if (fallback.is_undefined()) {
      fallback = n == "int" ? Value(static_cast<int64_t>(0)) : Value(0.0);
    }
    double d = 0;
    if (v.is_number() || v.is_bool()) {
      d = v.as_number();
    } else if (v.is_string()) {
      std::string t = Strip(v.as_string(), Value(), true, true);
      char* end = nullptr;
      d = t.empty() ? 0 : std::strtod(t.c_str(), &end);
      if (t.empty() || end != t.c_str() + t.size() || std::isnan(d)) return fallback;
    } else {
      return fallback;
    }
    if (n == "float") return Value(d);
    if (v.is_int()) return v;
    if (!std::isfinite(d)) return fallback;
    return Value(static_cast<int64_t>(std::trunc(d)));
  }
  if (n == "abs") {
    a.CheckConsumed(n, 0);
    if (v.is_float()) return Value(std::fabs(v.as_float()));
    if (IsIntLike(v)) return Value(std::abs(AsInt(v)));
    throw Error(absl::StrCat("bad operand type for abs(): '", v.TypeName(), "'"));
  }
  if (n == "round") {
    int64_t precision = IntArg(a.Get(0, "precision"), 0, "precision");
    Value method = a.Get(1, "method");
    a.CheckConsumed(n, 2);
    const std::string m = method.is_string() ? method.as_string() : "common";
    const double x = v.as_number();
    if (m == "common" && precision >= 0 && precision < 300 && std::isfinite(x)) {
      // Python's round(): the exact binary value, correctly rounded to
      // `precision` decimals, halves to even; printf does exactly that.
      char buf[512];
      std::snprintf(buf, sizeof(buf), "%.*f", static_cast<int>(precision), x);
      return Value(std::strtod(buf, nullptr));
    }
    const double scale = std::pow(10.0, static_cast<double>(precision));
    const double y = x * scale;
    return Value((m == "ceil"    ? std::ceil(y)
                  : m == "floor" ? std::floor(y)
                                 : std::nearbyint(y)) /
                 scale);
  }
  if (n == "indent") {
    Value width = a.Get(0, "width");
    bool first = a.Get(1, "first").Truthy();
    bool blank = a.Get(2, "blank").Truthy();
    a.CheckConsumed(n, 3);
    std::string pad = width.is_string()
                          ? width.as_string()
                          : std::string(static_cast<size_t>(IntArg(width, 4, "width")), ' ');
    std::vector<std::string> lines = SplitLines(ToString(v) + "\n", false);
    std::string out;
    for (size_t i = 0; i < lines.size(); ++i) {
      if (i > 0) out += "\n";
      bool indent = (i > 0 || first) && (blank || !lines[i].empty());
      out += (indent ? pad : "") + lines[i];
    }
    return Value(std::move(out));
  }
  if (n == "escape" || n == "e" || n == "forceescape") {
    a.CheckConsumed(n, 0);
    return Value(HtmlEscape(ToString(v)));
  }
  if (n == "wordcount") {
    a.CheckConsumed(n, 0);
    return Value(CountWords(ToString(v)));
  }
  throw Error(absl::StrCat("no filter named '", n, "'"));
}

bool TestBuiltin(Interpreter& in, const std::string& n, const Value& v, CallArgs& a) {
  auto arg = [&]() {
    Value x = a.Get(0, "other");
    a.CheckConsumed(n, 1);
    return x;
  };
  if (n == "defined") return !v.is_undefined();
  if (n == "undefined") return v.is_undefined();
  if (n == "none") return v.is_none();
  if (n == "boolean") return v.is_bool();
  if (n == "true") return v.is_bool() && v.as_bool();
  if (n == "false") return v.is_bool() && !v.as_bool();
  if (n == "string") return v.is_string();
  if (n == "number") return v.is_number() || v.is_bool();  // bool is an int in Python
  if (n == "integer") return v.is_int();
  if (n == "float") return v.is_float();
  if (n == "mapping") return v.is_object();
  if (n == "iterable") return v.is_array() || v.is_object() || v.is_string() || v.is_undefined();
  if (n == "sequence") return v.is_array() || v.is_object() || v.is_string();
  if (n == "callable") return v.is_function();
  if (n == "lower" || n == "upper") {
    return v.is_string() && CaseMap(v.as_string(), n == "upper") == v.as_string();
  }
  if (n == "odd" || n == "even") {
    if (!IsIntLike(v)) {
      throw Error(absl::StrCat("the ", n, " test needs an integer, got ", v.TypeName()));
    }
    return (AsInt(v) % 2 != 0) == (n == "odd");
  }
  if (n == "divisibleby") {
    int64_t d = IntArg(arg(), 0, "divisibleby argument");
    if (d == 0) throw Error("division by zero");
    return IntArg(v, 0, "divisibleby operand") % d == 0;
  }
  if (n == "eq" || n == "equalto" || n == "==") return Equals(v, arg());
  if (n == "ne" || n == "!=") return !Equals(v, arg());
  if (n == "lt" || n == "lessthan" || n == "<") return CompareOp("<", v, arg());
  if (n == "le" || n == "<=") return CompareOp("<=", v, arg());
  if (n == "gt" || n == "greaterthan" || n == ">") return CompareOp(">", v, arg());
  if (n == "ge" || n == ">=") return CompareOp(">=", v, arg());
  if (n == "in") return CompareOp("in", v, arg());
  if (n == "sameas") {
    Value o = arg();
    if (v.kind() != o.kind()) return false;
    if (v.is_none() || v.is_undefined()) return true;
    if (v.is_bool()) return v.as_bool() == o.as_bool();
    if (v.is_namespace()) return &v.as_namespace() == &o.as_namespace();
    return false;
  }
  if (n == "escaped") return false;
  throw Error(absl::StrCat("no test named '", n, "'"));
}

}  // namespace kvserve::jinja

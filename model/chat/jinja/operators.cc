// Operators, item and attribute access, slicing and iteration of kvserve's
// Jinja subset, with Python's semantics.
#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "model/chat/jinja/builtins.h"

namespace kvserve::jinja {
namespace {

[[noreturn]] void TypeError(const std::string& what, const Value& a, const Value& b) {
  throw Error(absl::StrCat(what, " between '", a.TypeName(), "' and '", b.TypeName(), "'"));
}

int64_t FloorDiv(int64_t a, int64_t b) {
  int64_t q = a / b;
  if ((a % b != 0) && ((a < 0) != (b < 0))) --q;
  return q;
}

}  // namespace

int64_t IntArg(const Value& v, int64_t fallback, const char* what) {
  if (v.is_undefined() || v.is_none()) return fallback;
  if (!IsIntLike(v)) throw Error(absl::StrCat(what, " must be an integer, got ", v.TypeName()));
  return AsInt(v);
}

Array Items(const Object& o) {
  Array out;
  for (const auto& [k, v] : o.entries) out.push_back(Value::Tuple({Value(k), v}));
  return out;
}

Value MappingMethod(const Object& o, const std::string& name, CallArgs& a) {
  if (name == "get") {
    Value key = a.Get(0, "key"), fallback = a.Get(1, "default");
    a.CheckConsumed(name, 2);
    const Value* v = key.is_string() ? o.Find(key.as_string()) : nullptr;
    return v ? *v : fallback.is_undefined() ? Value(nullptr) : fallback;
  }
  a.CheckConsumed(name, 0);
  if (name == "items") return Value(Items(o));
  Array out;
  for (const auto& [k, v] : o.entries) out.push_back(name == "keys" ? Value(k) : v);
  return Value(std::move(out));
}

// Sort key comparison: numbers, strings (optionally case-folded) and lists.
int CompareValues(const Value& a, const Value& b, bool case_sensitive) {
  if ((a.is_number() || a.is_bool()) && (b.is_number() || b.is_bool())) {
    double x = a.as_number(), y = b.as_number();
    return x < y ? -1 : x > y ? 1 : 0;
  }
  if (a.is_string() && b.is_string()) {
    const std::string x = case_sensitive ? a.as_string() : CaseMap(a.as_string(), false);
    const std::string y = case_sensitive ? b.as_string() : CaseMap(b.as_string(), false);
    return x < y ? -1 : x > y ? 1 : 0;
  }
  if (a.is_array() && b.is_array()) {
    const Array& x = a.as_array();
    const Array& y = b.as_array();
    for (size_t i = 0; i < x.size() && i < y.size(); ++i) {
      if (int c = CompareValues(x[i], y[i], case_sensitive)) return c;
    }
    return x.size() < y.size() ? -1 : x.size() > y.size() ? 1 : 0;
  }
  TypeError("'<' not supported", a, b);
}

Value BinaryOp(const std::string& op, const Value& a, const Value& b) {
  if (op == "~") return Value(ToString(a) + ToString(b));
  const bool numeric = (a.is_number() || a.is_bool()) && (b.is_number() || b.is_bool());
  const bool ints = IsIntLike(a) && IsIntLike(b);
  if (op == "+") {
    if (ints) return Value(AsInt(a) + AsInt(b));
    if (numeric) return Value(a.as_number() + b.as_number());
    if (a.is_string() && b.is_string()) return Value(a.as_string() + b.as_string());
    if (a.is_array() && b.is_array()) {
      Array out = a.as_array();
      out.insert(out.end(), b.as_array().begin(), b.as_array().end());
      return Value(std::move(out));
    }
    TypeError("unsupported operand type(s) for +", a, b);
  }
  if (op == "*") {
    if (ints) return Value(AsInt(a) * AsInt(b));
    if (numeric) return Value(a.as_number() * b.as_number());
    const Value& seq = IsIntLike(a) ? b : a;
    const Value& times = IsIntLike(a) ? a : b;
    if (IsIntLike(times) && (seq.is_string() || seq.is_array())) {
      int64_t n = std::max<int64_t>(0, AsInt(times));
      if (seq.is_string()) {
        std::string out;
        for (int64_t i = 0; i < n; ++i) out += seq.as_string();
        return Value(std::move(out));
      }
      Array out;
      for (int64_t i = 0; i < n; ++i)
        out.insert(out.end(), seq.as_array().begin(), seq.as_array().end());
      return Value(std::move(out));
    }
    TypeError("unsupported operand type(s) for *", a, b);
  }
  if (!numeric) TypeError(absl::StrCat("unsupported operand type(s) for ", op), a, b);
  if (op == "-") return ints ? Value(AsInt(a) - AsInt(b)) : Value(a.as_number() - b.as_number());
  if (op == "**") {
    if (ints && AsInt(b) >= 0) {
      int64_t r = 1, base = AsInt(a);
      for (int64_t e = AsInt(b); e > 0; e >>= 1, base *= base) {
        if (e & 1) r *= base;
      }
      return Value(r);
    }
    return Value(std::pow(a.as_number(), b.as_number()));
  }
  if (b.as_number() == 0) throw Error("division by zero");
  if (op == "/") return Value(a.as_number() / b.as_number());
  if (op == "//") {
    if (ints) return Value(FloorDiv(AsInt(a), AsInt(b)));
    return Value(std::floor(a.as_number() / b.as_number()));
  }
  if (op == "%") {
    if (ints) return Value(AsInt(a) - FloorDiv(AsInt(a), AsInt(b)) * AsInt(b));
    double x = a.as_number(), y = b.as_number();
    double r = std::fmod(x, y);
    if (r != 0 && ((r < 0) != (y < 0))) r += y;
    return Value(r);
  }
  throw Error(absl::StrCat("unknown operator '", op, "'"));
}

bool CompareOp(const std::string& op, const Value& a, const Value& b) {
  if (op == "==") return Equals(a, b);
  if (op == "!=") return !Equals(a, b);
  if (op == "in" || op == "not in") {
    bool found = false;
    if (b.is_string()) {
      if (!a.is_string()) {
        throw Error(
            absl::StrCat("'in <string>' requires string as left operand, not ", a.TypeName()));
      }
      found = b.as_string().find(a.as_string()) != std::string::npos;
    } else if (b.is_array()) {
      for (const Value& v : b.as_array()) found = found || Equals(a, v);
    } else if (b.is_object()) {
      found = a.is_string() && b.as_object().Find(a.as_string()) != nullptr;
    } else if (!b.is_undefined()) {
      throw Error(absl::StrCat("argument of type '", b.TypeName(), "' is not iterable"));
    }
    return op == "in" ? found : !found;
  }
  int c = CompareValues(a, b, /*case_sensitive=*/true);
  if (op == "<") return c < 0;
  if (op == ">") return c > 0;
  if (op == "<=") return c <= 0;
  if (op == ">=") return c >= 0;
  throw Error(absl::StrCat("unknown comparison '", op, "'"));
}

Value GetAttr(const Value& obj, const std::string& name) {
  if (obj.is_object()) {
    if (const Value* v = obj.as_object().Find(name)) return *v;
    if (name == "get" || name == "items" || name == "keys" || name == "values") {
      return Value(Function([obj, name](Interpreter&, CallArgs& a) {
        return MappingMethod(obj.as_object(), name, a);
      }));
    }
    return Value();
  }
  if (obj.is_namespace()) {
    const Value* v = obj.as_namespace().attrs.Find(name);
    return v ? *v : Value();
  }
  if (obj.is_string() && IsStringMethod(name)) {
    return Value(Function([s = obj.as_string(), name](Interpreter&, CallArgs& a) {
      return StringMethod(s, name, a);
    }));
  }
  return Value();
}

Value GetItem(const Value& obj, const Value& key) {
  if (obj.is_array() && IsIntLike(key)) {
    const Array& a = obj.as_array();
    int64_t i = AsInt(key);
    if (i < 0) i += static_cast<int64_t>(a.size());
    return i >= 0 && i < static_cast<int64_t>(a.size()) ? a[i] : Value();
  }
  if (obj.is_string() && IsIntLike(key)) {
    std::u32string u = DecodeUtf8(obj.as_string());
    int64_t i = AsInt(key);
    if (i < 0) i += static_cast<int64_t>(u.size());
    return i >= 0 && i < static_cast<int64_t>(u.size()) ? Value(EncodeUtf8(u.substr(i, 1)))
                                                        : Value();
  }
  if (key.is_string()) return GetAttr(obj, key.as_string());
  return Value();
}

Value GetSlice(const Value& obj, const Value& start, const Value& stop, const Value& step) {
  std::u32string u;
  int64_t n;
  if (obj.is_array()) {
    n = static_cast<int64_t>(obj.as_array().size());
  } else if (obj.is_string()) {
    u = DecodeUtf8(obj.as_string());
    n = static_cast<int64_t>(u.size());
  } else {
    throw Error(absl::StrCat("'", obj.TypeName(), "' object is not subscriptable"));
  }
  int64_t st = IntArg(step, 1, "slice step");
  if (st == 0) throw Error("slice step cannot be zero");
  auto clamp = [&](const Value& v, int64_t dflt) {
    if (v.is_undefined() || v.is_none()) return dflt;
    int64_t i = IntArg(v, 0, "slice index");
    if (i < 0) i += n;
    return st > 0 ? std::clamp<int64_t>(i, 0, n) : std::clamp<int64_t>(i, -1, n - 1);
  };
  int64_t b = clamp(start, st > 0 ? 0 : n - 1);
  int64_t e = clamp(stop, st > 0 ? n : -1);
  Array items;
  std::u32string chars;
  for (int64_t i = b; st > 0 ? i < e : i > e; i += st) {
    if (obj.is_array()) {
      items.push_back(obj.as_array()[i]);
    } else {
      chars.push_back(u[i]);
    }
  }
  return obj.is_array() ? Value(std::move(items)) : Value(EncodeUtf8(chars));
}

Array Iterate(const Value& v) {
  if (v.is_array()) return v.as_array();
  if (v.is_object()) {
    Array keys;
    for (const auto& [k, x] : v.as_object().entries) keys.push_back(Value(k));
    return keys;
  }
  if (v.is_string()) {
    Array chars;
    for (char32_t c : DecodeUtf8(v.as_string()))
      chars.push_back(Value(EncodeUtf8(std::u32string(1, c))));
    return chars;
  }
  if (v.is_undefined()) return {};
  throw Error(absl::StrCat("'", v.TypeName(), "' object is not iterable"));
}

}  // namespace kvserve::jinja

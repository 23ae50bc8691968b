#include "model/chat/jinja/value.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>

#include "absl/strings/str_cat.h"

namespace kvserve::jinja {

Value::Value(Object o) : v_(std::make_shared<const Object>(std::move(o))) {}

double Value::as_number() const {
  switch (kind()) {
    case Kind::kInt:
      return static_cast<double>(as_int());
    case Kind::kFloat:
      return as_float();
    case Kind::kBool:
      return as_bool() ? 1 : 0;
    default:
      throw Error(absl::StrCat("expected a number, got ", TypeName()));
  }
}

bool Value::Truthy() const {
  switch (kind()) {
    case Kind::kUndefined:
    case Kind::kNone:
      return false;
    case Kind::kBool:
      return as_bool();
    case Kind::kInt:
      return as_int() != 0;
    case Kind::kFloat:
      return as_float() != 0;
    case Kind::kString:
      return !as_string().empty();
    case Kind::kArray:
      return !as_array().empty();
    case Kind::kObject:
      return !as_object().entries.empty();
    case Kind::kNamespace:
    case Kind::kFunction:
      return true;
  }
  return false;
}

const char* Value::TypeName() const {
  switch (kind()) {
    case Kind::kUndefined:
      return "undefined";
    case Kind::kNone:
      return "none";
    case Kind::kBool:
      return "boolean";
    case Kind::kInt:
      return "integer";
    case Kind::kFloat:
      return "float";
    case Kind::kString:
      return "string";
    case Kind::kArray:
      return "list";
    case Kind::kObject:
      return "mapping";
    case Kind::kNamespace:
      return "namespace";
    case Kind::kFunction:
      return "callable";
  }
  return "value";
}

const Value* Object::Find(std::string_view key) const {
  for (const auto& [k, v] : entries) {
    if (k == key) return &v;
  }
  return nullptr;
}

void Object::Set(std::string key, Value value) {
  for (auto& [k, v] : entries) {
    if (k == key) {
      v = std::move(value);
      return;
    }
  }
  entries.emplace_back(std::move(key), std::move(value));
}

Value CallArgs::Get(int pos, std::string_view name) {
  if (pos >= 0 && static_cast<size_t>(pos) < positional.size()) return positional[pos];
  for (const auto& [k, v] : keyword) {
    if (k == name) {
      used_.push_back(k);
      return v;
    }
  }
  return Value();
}

void CallArgs::CheckConsumed(std::string_view callee, size_t max_positional) const {
  if (positional.size() > max_positional) {
    throw Error(absl::StrCat(std::string(callee), "() takes at most ", max_positional,
                             " positional argument", max_positional == 1 ? "" : "s", ", got ",
                             positional.size()));
  }
  for (const auto& [k, v] : keyword) {
    if (std::find(used_.begin(), used_.end(), k) == used_.end()) {
      throw Error(
          absl::StrCat(std::string(callee), "() got an unexpected keyword argument '", k, "'"));
    }
  }
}

bool Equals(const Value& a, const Value& b) {
  using K = Value::Kind;
  auto numeric = [](const Value& v) { return v.is_number() || v.is_bool(); };
  if (numeric(a) && numeric(b)) {
    if (a.is_float() || b.is_float()) return a.as_number() == b.as_number();
    return (a.is_bool() ? a.as_bool() : a.as_int()) == (b.is_bool() ? b.as_bool() : b.as_int());
  }
  if (a.kind() != b.kind()) return false;
  switch (a.kind()) {
    case K::kUndefined:
    case K::kNone:
      return true;
    case K::kString:
      return a.as_string() == b.as_string();
    case K::kArray: {
      const Array& x = a.as_array();
      const Array& y = b.as_array();
      if (x.size() != y.size()) return false;
      for (size_t i = 0; i < x.size(); ++i) {
        if (!Equals(x[i], y[i])) return false;
      }
      return true;
    }
    case K::kObject: {
      const Object& x = a.as_object();
      const Object& y = b.as_object();
      if (x.entries.size() != y.entries.size()) return false;
      for (const auto& [k, v] : x.entries) {
        const Value* w = y.Find(k);
        if (w == nullptr || !Equals(v, *w)) return false;
      }
      return true;
    }
    case K::kNamespace:
      return &a.as_namespace() == &b.as_namespace();
    default:
      return false;
  }
}

std::string FormatFloat(double d) {
  if (std::isnan(d)) return "nan";
  if (std::isinf(d)) return d > 0 ? "inf" : "-inf";
  if (d == 0) return std::signbit(d) ? "-0.0" : "0.0";
  // Shortest round-trip digits, then Python's repr layout: fixed notation
  // when the decimal point falls within [-4, 16], else scientific.
  char buf[64];
  auto res = std::to_chars(buf, buf + sizeof(buf), d, std::chars_format::scientific);
  std::string sci(buf, res.ptr);
  bool negative = sci[0] == '-';
  if (negative) sci.erase(0, 1);
  size_t e = sci.find('e');
  int exp = std::stoi(sci.substr(e + 1));
  std::string digits;
  for (char c : sci.substr(0, e)) {
    if (c != '.') digits.push_back(c);
  }
  int decpt = exp + 1;  // digits d1 d2 ... times 10^(decpt - ndigits)
  std::string out = negative ? "-" : "";
  const int n = static_cast<int>(digits.size());
  if (decpt > -4 && decpt <= 16) {
    if (decpt <= 0) {
      out += "0." + std::string(-decpt, '0') + digits;
    } else if (decpt >= n) {
      out += digits + std::string(decpt - n, '0') + ".0";
    } else {
      out.append(digits, 0, decpt).append(".").append(digits, decpt);
    }
    return out;
  }
  out += digits.substr(0, 1);
  if (n > 1) out.append(".").append(digits, 1);
  char ebuf[16];
  std::snprintf(ebuf, sizeof(ebuf), "e%c%02d", exp < 0 ? '-' : '+', std::abs(exp));
  return out + ebuf;
}

std::u32string DecodeUtf8(std::string_view s) {
  std::u32string out;
  out.reserve(s.size());
  size_t i = 0;
  while (i < s.size()) {
    unsigned char c = s[i];
    int len = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
    char32_t cp = len == 1 ? c : len == 2 ? (c & 0x1f) : len == 3 ? (c & 0x0f) : (c & 0x07);
    bool ok = len > 0 && i + len <= s.size();
    for (int k = 1; ok && k < len; ++k) {
      unsigned char cc = s[i + k];
      if ((cc & 0xc0) != 0x80) ok = false;
      cp = (cp << 6) | (cc & 0x3f);
    }
    if (!ok) {
      out.push_back(0xfffd);
      ++i;
      continue;
    }
    out.push_back(cp);
    i += len;
  }
  return out;
}

std::string EncodeUtf8(std::u32string_view s) {
  std::string out;
  out.reserve(s.size());
  for (char32_t c : s) {
    if (c < 0x80) {
      out.push_back(static_cast<char>(c));
    } else if (c < 0x800) {
      out.push_back(static_cast<char>(0xc0 | (c >> 6)));
      out.push_back(static_cast<char>(0x80 | (c & 0x3f)));
    } else if (c < 0x10000) {
      out.push_back(static_cast<char>(0xe0 | (c >> 12)));
      out.push_back(static_cast<char>(0x80 | ((c >> 6) & 0x3f)));
      out.push_back(static_cast<char>(0x80 | (c & 0x3f)));
    } else {
      out.push_back(static_cast<char>(0xf0 | (c >> 18)));
      out.push_back(static_cast<char>(0x80 | ((c >> 12) & 0x3f)));
      out.push_back(static_cast<char>(0x80 | ((c >> 6) & 0x3f)));
      out.push_back(static_cast<char>(0x80 | (c & 0x3f)));
    }
  }
  return out;
}

bool IsSpace(char32_t c) {
  return (c >= 0x09 && c <= 0x0d) || (c >= 0x1c && c <= 0x20) || c == 0x85 || c == 0xa0 ||
         c == 0x1680 || (c >= 0x2000 && c <= 0x200a) || c == 0x2028 || c == 0x2029 || c == 0x202f ||
         c == 0x205f || c == 0x3000;
}

std::string Strip(std::string_view s, const Value& chars, bool left, bool right) {
  std::u32string set;
  const bool whitespace = chars.is_none() || chars.is_undefined();
  if (!whitespace) {
    if (!chars.is_string()) throw Error("strip arg must be None or str");
    set = DecodeUtf8(chars.as_string());
  }
  std::u32string u = DecodeUtf8(s);
  auto strip = [&](char32_t c) { return whitespace ? IsSpace(c) : set.find(c) != set.npos; };
  size_t begin = 0, end = u.size();
  if (left) {
    while (begin < end && strip(u[begin])) ++begin;
  }
  if (right) {
    while (end > begin && strip(u[end - 1])) --end;
  }
  return EncodeUtf8(std::u32string_view(u).substr(begin, end - begin));
}

namespace {

// Python's repr() of a string: single quotes unless the text holds one and
// no double quote.
std::string PyRepr(const std::string& s) {
  const bool dq = s.find('\'') != std::string::npos && s.find('"') == std::string::npos;
  const char q = dq ? '"' : '\'';
  std::string out(1, q);
  for (char32_t c : DecodeUtf8(s)) {
    if (c == static_cast<char32_t>(q) || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\r') {
      out += "\\r";
    } else if (c == '\t') {
      out += "\\t";
    } else if (c < 0x20 || (c >= 0x7f && c <= 0xa0) || c == 0xad) {
      char buf[8];
      std::snprintf(buf, sizeof(buf), "\\x%02x", static_cast<unsigned>(c));
      out += buf;
    } else {
      out += EncodeUtf8(std::u32string(1, c));
    }
  }
  out += q;
  return out;
}

// str() of a value nested in a container: Python's repr().
std::string NestedRepr(const Value& v) {
  if (v.is_string()) return PyRepr(v.as_string());
  if (v.is_undefined()) return "Undefined";
  return ToString(v);
}

void JsonString(const std::string& s, bool ensure_ascii, std::string* out) {
  out->push_back('"');
  for (char32_t c : DecodeUtf8(s)) {
    char buf[16];
    switch (c) {
      case '"':
        *out += "\\\"";
        break;
      case '\\':
        *out += "\\\\";
        break;
      case '\n':
        *out += "\\n";
        break;
      case '\r':
        *out += "\\r";
        break;
      case '\t':
        *out += "\\t";
        break;
      case '\b':
        *out += "\\b";
        break;
      case '\f':
        *out += "\\f";
        break;
      default:
        if (c < 0x20 || (ensure_ascii && c >= 0x7f && c < 0x10000)) {
          std::snprintf(buf, sizeof(buf), "\\u%04x", static_cast<unsigned>(c));
          *out += buf;
        } else if (ensure_ascii && c >= 0x10000) {
          char32_t v = c - 0x10000;
          std::snprintf(buf, sizeof(buf), "\\u%04x\\u%04x",
                        static_cast<unsigned>(0xd800 + (v >> 10)),
                        static_cast<unsigned>(0xdc00 + (v & 0x3ff)));
          *out += buf;
        } else {
          *out += EncodeUtf8(std::u32string(1, c));
        }
    }
  }
  out->push_back('"');
}

void JsonValue(const Value& v, const JsonOptions& o, int depth, std::string* out) {
  using K = Value::Kind;
  const std::string item_sep = !o.item_separator.empty() ? o.item_separator
                               : o.indent >= 0           ? ","
                                                         : ", ";
  const std::string key_sep = o.key_separator.empty() ? ": " : o.key_separator;
  auto newline = [&](int d) {
    if (o.indent < 0) return;
    out->push_back('\n');
    out->append(static_cast<size_t>(o.indent) * d, ' ');
  };
  switch (v.kind()) {
    case K::kUndefined:
    case K::kNone:
      *out += "null";
      return;
    case K::kBool:
      *out += v.as_bool() ? "true" : "false";
      return;
    case K::kInt:
      *out += absl::StrCat(v.as_int());
      return;
    case K::kFloat: {
      double d = v.as_float();
      *out += std::isnan(d)   ? "NaN"
              : std::isinf(d) ? (d > 0 ? "Infinity" : "-Infinity")
                              : FormatFloat(d);
      return;
    }
    case K::kString:
      JsonString(v.as_string(), o.ensure_ascii, out);
      return;
    case K::kArray: {
      const Array& a = v.as_array();
      if (a.empty()) {
        *out += "[]";
        return;
      }
      out->push_back('[');
      for (size_t i = 0; i < a.size(); ++i) {
        if (i > 0) *out += item_sep;
        newline(depth + 1);
        JsonValue(a[i], o, depth + 1, out);
      }
      newline(depth);
      out->push_back(']');
      return;
    }
    case K::kObject:
    case K::kNamespace: {
      std::vector<const std::pair<std::string, Value>*> entries;
      const Object& obj = v.is_object() ? v.as_object() : v.as_namespace().attrs;
      for (const auto& e : obj.entries) entries.push_back(&e);
      if (o.sort_keys) {
        std::stable_sort(entries.begin(), entries.end(),
                         [](auto* a, auto* b) { return a->first < b->first; });
      }
      if (entries.empty()) {
        *out += "{}";
        return;
      }
      out->push_back('{');
      for (size_t i = 0; i < entries.size(); ++i) {
        if (i > 0) *out += item_sep;
        newline(depth + 1);
        JsonString(entries[i]->first, o.ensure_ascii, out);
        *out += key_sep;
        JsonValue(entries[i]->second, o, depth + 1, out);
      }
      newline(depth);
      out->push_back('}');
      return;
    }
    case K::kFunction:
      throw Error("Object of type function is not JSON serializable");
  }
}

}  // namespace

std::string ToString(const Value& v) {
  using K = Value::Kind;
  switch (v.kind()) {
    case K::kUndefined:
      return "";
    case K::kNone:
      return "None";
    case K::kBool:
      return v.as_bool() ? "True" : "False";
    case K::kInt:
      return absl::StrCat(v.as_int());
    case K::kFloat:
      return FormatFloat(v.as_float());
    case K::kString:
      return v.as_string();
    case K::kArray: {
      std::string out = v.is_tuple() ? "(" : "[";
      const Array& a = v.as_array();
      for (size_t i = 0; i < a.size(); ++i) {
        if (i > 0) out += ", ";
        out += NestedRepr(a[i]);
      }
      if (v.is_tuple()) return out + (a.size() == 1 ? ",)" : ")");
      return out + "]";
    }
    case K::kObject:
    case K::kNamespace: {
      const Object& obj = v.is_object() ? v.as_object() : v.as_namespace().attrs;
      std::string out = "{";
      for (size_t i = 0; i < obj.entries.size(); ++i) {
        if (i > 0) out += ", ";
        out += PyRepr(obj.entries[i].first) + ": " + NestedRepr(obj.entries[i].second);
      }
      out += "}";
      return v.is_object() ? out : "<Namespace " + out + ">";
    }
    case K::kFunction:
      return "<function>";
  }
  return "";
}

std::string ToJson(const Value& v, const JsonOptions& options) {
  std::string out;
  JsonValue(v, options, 0, &out);
  return out;
}

Value FromJson(const nlohmann::ordered_json& j) {
  switch (j.type()) {
    case nlohmann::ordered_json::value_t::null:
      return Value(nullptr);
    case nlohmann::ordered_json::value_t::boolean:
      return Value(j.get<bool>());
    case nlohmann::ordered_json::value_t::number_integer:
      return Value(j.get<int64_t>());
    case nlohmann::ordered_json::value_t::number_unsigned: {
      uint64_t u = j.get<uint64_t>();
      if (u > static_cast<uint64_t>(INT64_MAX)) return Value(static_cast<double>(u));
      return Value(static_cast<int64_t>(u));
    }
    case nlohmann::ordered_json::value_t::number_float:
      return Value(j.get<double>());
    case nlohmann::ordered_json::value_t::string:
      return Value(j.get<std::string>());
    case nlohmann::ordered_json::value_t::array: {
      Array a;
      a.reserve(j.size());
      for (const auto& e : j) a.push_back(FromJson(e));
      return Value(std::move(a));
    }
    case nlohmann::ordered_json::value_t::object: {
      Object o;
      o.entries.reserve(j.size());
      for (const auto& [k, e] : j.items()) o.entries.emplace_back(k, FromJson(e));
      return Value(std::move(o));
    }
    default:
      return Value();
  }
}

}  // namespace kvserve::jinja

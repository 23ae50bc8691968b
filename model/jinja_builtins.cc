// Operators, filters, tests, methods and globals of kvserve's Jinja subset,
// with Python's semantics (Jinja2 evaluates templates as Python objects).
#include <algorithm>
#include <clocale>
#include <cmath>
#include <ctime>
#include <cwctype>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "model/jinja_interpreter.h"

namespace kvserve::jinja {
namespace {

constexpr int64_t kMaxRange = 100000;  // Jinja's sandbox limit

[[noreturn]] void TypeError(const std::string& what, const Value& a, const Value& b) {
  throw Error(absl::StrCat(what, " between '", a.TypeName(), "' and '", b.TypeName(), "'"));
}

bool IsIntLike(const Value& v) { return v.is_int() || v.is_bool(); }
int64_t AsInt(const Value& v) { return v.is_bool() ? v.as_bool() : v.as_int(); }

int64_t FloorDiv(int64_t a, int64_t b) {
  int64_t q = a / b;
  if ((a % b != 0) && ((a < 0) != (b < 0))) --q;
  return q;
}

// Case mapping of one code point; Unicode-aware where the C.UTF-8 locale is
// installed, ASCII otherwise.
char32_t MapCase(char32_t c, bool upper) {
  static const locale_t utf8 = newlocale(LC_CTYPE_MASK, "C.UTF-8", static_cast<locale_t>(0));
  if (c < 0x80 || utf8 == static_cast<locale_t>(0)) {
    if (upper && c >= 'a' && c <= 'z') return c - 32;
    if (!upper && c >= 'A' && c <= 'Z') return c + 32;
    return c;
  }
  return static_cast<char32_t>(upper ? towupper_l(static_cast<wint_t>(c), utf8)
                                     : towlower_l(static_cast<wint_t>(c), utf8));
}

bool IsCased(char32_t c) { return MapCase(c, true) != c || MapCase(c, false) != c; }
bool IsAlnum(char32_t c) {
  return c < 0x80 ? std::isalnum(static_cast<int>(c)) != 0 : (IsCased(c) || c > 0x2000);
}

std::string CaseMap(const std::string& s, bool upper) {
  std::u32string u = DecodeUtf8(s);
  for (char32_t& c : u) c = MapCase(c, upper);
  return EncodeUtf8(u);
}

std::string Title(const std::string& s) {
  std::u32string u = DecodeUtf8(s);
  bool prev_cased = false;
  for (char32_t& c : u) {
    c = MapCase(c, !prev_cased);
    prev_cased = IsCased(c);
  }
  return EncodeUtf8(u);
}

std::string Capitalize(const std::string& s) {
  std::u32string u = DecodeUtf8(s);
  for (size_t i = 0; i < u.size(); ++i) u[i] = MapCase(u[i], i == 0);
  return EncodeUtf8(u);
}

// str.replace; count < 0 replaces all.
std::string Replace(const std::string& s, const std::string& from, const std::string& to,
                    int64_t count) {
  if (from.empty()) {
    std::u32string u = DecodeUtf8(s);
    std::string out;
    int64_t done = 0;
    for (size_t i = 0; i <= u.size(); ++i) {
      if (count < 0 || done < count) {
        out += to;
        ++done;
      }
      if (i < u.size()) out += EncodeUtf8(std::u32string(1, u[i]));
    }
    return out;
  }
  std::string out;
  size_t pos = 0;
  int64_t done = 0;
  while (count < 0 || done < count) {
    size_t hit = s.find(from, pos);
    if (hit == std::string::npos) break;
    out.append(s, pos, hit - pos);
    out += to;
    pos = hit + from.size();
    ++done;
  }
  out.append(s, pos);
  return out;
}

// str.split / str.rsplit.
Array Split(const std::string& s, const Value& sep, int64_t maxsplit, bool from_right) {
  std::vector<std::string> parts;
  if (sep.is_none() || sep.is_undefined()) {
    std::u32string u = DecodeUtf8(s);
    std::vector<std::pair<size_t, size_t>> words;  // [begin, end)
    for (size_t i = 0; i < u.size();) {
      while (i < u.size() && IsSpace(u[i])) ++i;
      size_t b = i;
      while (i < u.size() && !IsSpace(u[i])) ++i;
      if (i > b) words.emplace_back(b, i);
    }
    if (maxsplit >= 0 && static_cast<int64_t>(words.size()) > maxsplit + 1) {
      if (from_right) {
        size_t keep = words.size() - maxsplit;
        std::u32string head = u.substr(0, words[keep - 1].second);
        size_t hb = 0;
        while (hb < head.size() && IsSpace(head[hb])) ++hb;
        parts.push_back(EncodeUtf8(head.substr(hb)));
        for (size_t w = keep; w < words.size(); ++w) {
          parts.push_back(EncodeUtf8(u.substr(words[w].first, words[w].second - words[w].first)));
        }
      } else {
        for (int64_t w = 0; w < maxsplit; ++w) {
          parts.push_back(EncodeUtf8(u.substr(words[w].first, words[w].second - words[w].first)));
        }
        std::u32string tail = u.substr(words[maxsplit].first);
        size_t te = tail.size();
        while (te > 0 && IsSpace(tail[te - 1])) --te;
        parts.push_back(EncodeUtf8(tail.substr(0, te)));
      }
    } else {
      for (auto [b, e] : words) parts.push_back(EncodeUtf8(u.substr(b, e - b)));
    }
  } else {
    if (!sep.is_string()) throw Error("must be str or None, not " + std::string(sep.TypeName()));
    const std::string& d = sep.as_string();
    if (d.empty()) throw Error("empty separator");
    parts = absl::StrSplit(s, d);
    if (maxsplit >= 0 && static_cast<int64_t>(parts.size()) > maxsplit + 1) {
      if (from_right) {
        size_t keep = parts.size() - maxsplit;
        std::vector<std::string> out = {absl::StrJoin(parts.begin(), parts.begin() + keep, d)};
        out.insert(out.end(), parts.begin() + keep, parts.end());
        parts = std::move(out);
      } else {
        std::string tail = absl::StrJoin(parts.begin() + maxsplit, parts.end(), d);
        parts.resize(maxsplit);
        parts.push_back(std::move(tail));
      }
    }
  }
  Array out;
  for (auto& p : parts) out.push_back(Value(std::move(p)));
  return out;
}

// str.splitlines(): \n, \r\n, \r and the other Unicode line boundaries.
std::vector<std::string> SplitLines(const std::string& s, bool keepends) {
  std::u32string u = DecodeUtf8(s);
  std::vector<std::string> lines;
  size_t b = 0;
  for (size_t i = 0; i < u.size(); ++i) {
    char32_t c = u[i];
    if (c == '\n' || c == '\r' || c == 0x0b || c == 0x0c || c == 0x1c || c == 0x1d || c == 0x1e ||
        c == 0x85 || c == 0x2028 || c == 0x2029) {
      size_t end = i;
      if (c == '\r' && i + 1 < u.size() && u[i + 1] == '\n') ++i;
      lines.push_back(EncodeUtf8(u.substr(b, (keepends ? i + 1 : end) - b)));
      b = i + 1;
    }
  }
  if (b < u.size()) lines.push_back(EncodeUtf8(u.substr(b)));
  return lines;
}

bool StartsOrEnds(const std::string& s, const Value& affix, bool starts) {
  auto one = [&](const Value& a) {
    if (!a.is_string()) throw Error("startswith/endswith first arg must be str or a tuple of str");
    return starts ? s.starts_with(a.as_string()) : s.ends_with(a.as_string());
  };
  if (affix.is_array()) {
    for (const Value& a : affix.as_array()) {
      if (one(a)) return true;
    }
    return false;
  }
  return one(affix);
}

int64_t IntArg(const Value& v, int64_t fallback, const char* what) {
  if (v.is_undefined() || v.is_none()) return fallback;
  if (!IsIntLike(v)) throw Error(absl::StrCat(what, " must be an integer, got ", v.TypeName()));
  return AsInt(v);
}

// Code point index of a byte offset (for find/index).
int64_t CodePointIndex(const std::string& s, size_t byte) {
  int64_t n = 0;
  for (size_t i = 0; i < byte; ++i) {
    if ((static_cast<unsigned char>(s[i]) & 0xc0) != 0x80) ++n;
  }
  return n;
}

Value StringMethod(const std::string& s, const std::string& name, CallArgs& a) {
  if (name == "strip" || name == "lstrip" || name == "rstrip") {
    Value chars = a.Get(0, "chars");
    a.CheckConsumed(name, 1);
    return Value(Strip(s, chars, name != "rstrip", name != "lstrip"));
  }
  if (name == "split" || name == "rsplit") {
    Value sep = a.Get(0, "sep");
    int64_t maxsplit = IntArg(a.Get(1, "maxsplit"), -1, "maxsplit");
    a.CheckConsumed(name, 2);
    return Value(Split(s, sep, maxsplit, name == "rsplit"));
  }
  if (name == "startswith" || name == "endswith") {
    Value affix = a.Get(0, "prefix");
    a.CheckConsumed(name, 1);
    return Value(StartsOrEnds(s, affix, name == "startswith"));
  }
  if (name == "upper" || name == "lower") {
    a.CheckConsumed(name, 0);
    return Value(CaseMap(s, name == "upper"));
  }
  if (name == "title") {
    a.CheckConsumed(name, 0);
    return Value(Title(s));
  }
  if (name == "capitalize") {
    a.CheckConsumed(name, 0);
    return Value(Capitalize(s));
  }
  if (name == "replace") {
    Value from = a.Get(0, "old"), to = a.Get(1, "new");
    int64_t count = IntArg(a.Get(2, "count"), -1, "count");
    a.CheckConsumed(name, 3);
    if (!from.is_string() || !to.is_string()) throw Error("replace() arguments must be str");
    return Value(Replace(s, from.as_string(), to.as_string(), count));
  }
  if (name == "find" || name == "rfind" || name == "index" || name == "rindex" || name == "count") {
    Value sub = a.Get(0, "sub");
    a.CheckConsumed(name, 1);
    if (!sub.is_string()) throw Error(absl::StrCat(name, "() argument must be str"));
    const std::string& t = sub.as_string();
    if (name == "count") {
      if (t.empty()) return Value(static_cast<int64_t>(DecodeUtf8(s).size() + 1));
      int64_t n = 0;
      for (size_t p = s.find(t); p != std::string::npos; p = s.find(t, p + t.size())) ++n;
      return Value(n);
    }
    size_t p = name[0] == 'r' ? s.rfind(t) : s.find(t);
    if (p == std::string::npos) {
      if (name == "index" || name == "rindex") throw Error("substring not found");
      return Value(static_cast<int64_t>(-1));
    }
    return Value(CodePointIndex(s, p));
  }
  if (name == "join") {
    Value items = a.Get(0, "iterable");
    a.CheckConsumed(name, 1);
    std::string out;
    bool first = true;
    for (const Value& v : Iterate(items)) {
      if (!v.is_string()) throw Error(absl::StrCat("sequence item: expected str, got ", v.TypeName()));
      if (!first) out += s;
      out += v.as_string();
      first = false;
    }
    return Value(std::move(out));
  }
  if (name == "splitlines") {
    bool keepends = a.Get(0, "keepends").Truthy();
    a.CheckConsumed(name, 1);
    Array out;
    for (auto& l : SplitLines(s, keepends)) out.push_back(Value(std::move(l)));
    return Value(std::move(out));
  }
  if (name == "removeprefix" || name == "removesuffix") {
    Value affix = a.Get(0, "affix");
    a.CheckConsumed(name, 1);
    if (!affix.is_string()) throw Error(absl::StrCat(name, "() argument must be str"));
    const std::string& x = affix.as_string();
    if (name == "removeprefix") return Value(s.starts_with(x) ? s.substr(x.size()) : s);
    return Value(s.ends_with(x) ? s.substr(0, s.size() - x.size()) : s);
  }
  if (name == "isdigit" || name == "isalpha" || name == "isalnum" || name == "isspace" ||
      name == "islower" || name == "isupper") {
    a.CheckConsumed(name, 0);
    std::u32string u = DecodeUtf8(s);
    if (u.empty()) return Value(false);
    if (name == "islower" || name == "isupper") {
      bool cased = false;
      for (char32_t c : u) {
        if (!IsCased(c)) continue;
        cased = true;
        if (MapCase(c, name == "isupper") != c) return Value(false);
      }
      return Value(cased);
    }
    for (char32_t c : u) {
      bool ok = name == "isdigit"   ? (c >= '0' && c <= '9')
                : name == "isspace" ? IsSpace(c)
                : name == "isalpha" ? (c < 0x80 ? std::isalpha(static_cast<int>(c)) != 0 : IsCased(c))
                                    : IsAlnum(c);
      if (!ok) return Value(false);
    }
    return Value(true);
  }
  throw Error(absl::StrCat("'str' object has no attribute '", name, "'"));
}

Array Items(const Object& o) {
  Array out;
  for (const auto& [k, v] : o.entries) out.push_back(Value(Array{Value(k), v}));
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

bool IsStringMethod(const std::string& n) {
  static const char* kNames[] = {"strip", "lstrip", "rstrip", "split", "rsplit", "startswith",
                                 "endswith", "upper", "lower", "title", "capitalize", "replace",
                                 "find", "rfind", "index", "rindex", "count", "join", "splitlines",
                                 "removeprefix", "removesuffix", "isdigit", "isalpha", "isalnum",
                                 "isspace", "islower", "isupper"};
  for (const char* k : kNames) {
    if (n == k) return true;
  }
  return false;
}

// Sort key comparison: numbers, strings (optionally case-folded) and lists.
int Compare3(const Value& a, const Value& b, bool case_sensitive) {
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
      if (int c = Compare3(x[i], y[i], case_sensitive)) return c;
    }
    return x.size() < y.size() ? -1 : x.size() > y.size() ? 1 : 0;
  }
  TypeError("'<' not supported", a, b);
}

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

std::string HtmlEscape(const std::string& s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&#34;"; break;
      case '\'': out += "&#39;"; break;
      default: out.push_back(c);
    }
  }
  return out;
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
      for (int64_t i = 0; i < n; ++i) out.insert(out.end(), seq.as_array().begin(), seq.as_array().end());
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
        throw Error(absl::StrCat("'in <string>' requires string as left operand, not ", a.TypeName()));
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
  int c = Compare3(a, b, /*case_sensitive=*/true);
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
    return i >= 0 && i < static_cast<int64_t>(u.size()) ? Value(EncodeUtf8(u.substr(i, 1))) : Value();
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
    for (char32_t c : DecodeUtf8(v.as_string())) chars.push_back(Value(EncodeUtf8(std::u32string(1, c))));
    return chars;
  }
  if (v.is_undefined()) return {};
  throw Error(absl::StrCat("'", v.TypeName(), "' object is not iterable"));
}

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
          if (kv.size() != 2 || !kv[0].is_string()) throw Error("namespace() expects (key, value) pairs");
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
    if (v.is_undefined() || (boolean && !v.Truthy())) return fallback.is_undefined() ? Value("") : fallback;
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
      int c = Compare3(x.as_array()[pos], y.as_array()[pos], case_sensitive);
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
      int c = Compare3(AttributePath(x, attribute), AttributePath(y, attribute), case_sensitive);
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
      int c = Compare3(AttributePath(items[i], attribute), AttributePath(items[best], attribute),
                       case_sensitive);
      if (n == "min" ? c < 0 : c > 0) best = i;
    }
    return items[best];
  }
  if (n == "sum") {
    Value attribute = a.Get(0, "attribute");
    Value total = a.Get(1, "start");
    a.CheckConsumed(n, 2);
    if (total.is_undefined()) total = Value(static_cast<int64_t>(0));
    for (const Value& item : Iterate(v)) total = BinaryOp("+", total, AttributePath(item, attribute));
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
    if (a.positional.empty() || !a.positional[0].is_string()) throw Error("map() needs a filter name or attribute=");
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
    if (fallback.is_undefined()) fallback = n == "int" ? Value(static_cast<int64_t>(0)) : Value(0.0);
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
    double scale = std::pow(10.0, static_cast<double>(precision));
    double x = v.as_number() * scale;
    x = m == "ceil" ? std::ceil(x) : m == "floor" ? std::floor(x) : std::round(x);
    return Value(x / scale);
  }
  if (n == "indent") {
    Value width = a.Get(0, "width");
    bool first = a.Get(1, "first").Truthy();
    bool blank = a.Get(2, "blank").Truthy();
    a.CheckConsumed(n, 3);
    std::string pad = width.is_string() ? width.as_string()
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
    int64_t words = 0;
    bool in_word = false;
    for (char32_t c : DecodeUtf8(ToString(v))) {
      bool w = IsAlnum(c) || c == '_';
      if (w && !in_word) ++words;
      in_word = w;
    }
    return Value(words);
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
  if (n == "number") return v.is_number();
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
    if (!IsIntLike(v)) throw Error(absl::StrCat("the ", n, " test needs an integer, got ", v.TypeName()));
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

// String methods and text helpers of kvserve's Jinja subset, with Python's
// str semantics (indices and lengths in code points).
#include <cwctype>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "model/chat/jinja/builtins.h"

namespace kvserve::jinja {
namespace {

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

}  // namespace

std::string CaseMap(const std::string& s, bool upper) {
  std::u32string u = DecodeUtf8(s);
  for (char32_t& c : u) c = MapCase(c, upper);
  return EncodeUtf8(u);
}

namespace {

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
    if (maxsplit >= 0 && static_cast<int64_t>(words.size()) > maxsplit) {
      // The unsplit remainder keeps its inner and outer whitespace.
      if (from_right) {
        size_t keep = words.size() - maxsplit;
        parts.push_back(EncodeUtf8(u.substr(0, words[keep - 1].second)));
        for (size_t w = keep; w < words.size(); ++w) {
          parts.push_back(EncodeUtf8(u.substr(words[w].first, words[w].second - words[w].first)));
        }
      } else {
        for (int64_t w = 0; w < maxsplit; ++w) {
          parts.push_back(EncodeUtf8(u.substr(words[w].first, words[w].second - words[w].first)));
        }
        parts.push_back(EncodeUtf8(u.substr(words[maxsplit].first)));
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

}  // namespace

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

namespace {

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

// Code point index of a byte offset (for find/index).
int64_t CodePointIndex(const std::string& s, size_t byte) {
  int64_t n = 0;
  for (size_t i = 0; i < byte; ++i) {
    if ((static_cast<unsigned char>(s[i]) & 0xc0) != 0x80) ++n;
  }
  return n;
}

}  // namespace

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
      if (!v.is_string()) {
        throw Error(absl::StrCat("sequence item: expected str, got ", v.TypeName()));
      }
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
                : name == "isalpha"
                    ? (c < 0x80 ? std::isalpha(static_cast<int>(c)) != 0 : IsCased(c))
                    : IsAlnum(c);
      if (!ok) return Value(false);
    }
    return Value(true);
  }
  throw Error(absl::StrCat("'str' object has no attribute '", name, "'"));
}

bool IsStringMethod(const std::string& n) {
  static const char* kNames[] = {
      "strip",   "lstrip",  "rstrip",  "split",      "rsplit",     "startswith",   "endswith",
      "upper",   "lower",   "title",   "capitalize", "replace",    "find",         "rfind",
      "index",   "rindex",  "count",   "join",       "splitlines", "removeprefix", "removesuffix",
      "isdigit", "isalpha", "isalnum", "isspace",    "islower",    "isupper"};
  for (const char* k : kNames) {
    if (n == k) return true;
  }
  return false;
}

std::string HtmlEscape(const std::string& s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&#34;";
        break;
      case '\'':
        out += "&#39;";
        break;
      default:
        out.push_back(c);
    }
  }
  return out;
}

int64_t CountWords(const std::string& s) {
  int64_t words = 0;
  bool in_word = false;
  for (char32_t c : DecodeUtf8(s)) {
    bool w = IsAlnum(c) || c == '_';
    if (w && !in_word) ++words;
    in_word = w;
  }
  return words;
}

}  // namespace kvserve::jinja

#include "model/grammar/json_schema.h"

#include <cmath>
#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"

namespace kvserve {
namespace {

using json = nlohmann::ordered_json;

const std::set<std::string, std::less<>> kAnnotations = {
    "title",    "description", "default",  "examples",  "$schema",   "$id",
    "$comment", "strict",      "readOnly", "writeOnly", "deprecated"};
const std::set<std::string, std::less<>> kKeywords = {"type",
                                                      "properties",
                                                      "required",
                                                      "additionalProperties",
                                                      "enum",
                                                      "const",
                                                      "minLength",
                                                      "maxLength",
                                                      "minimum",
                                                      "maximum",
                                                      "exclusiveMinimum",
                                                      "exclusiveMaximum",
                                                      "items",
                                                      "minItems",
                                                      "maxItems",
                                                      "anyOf",
                                                      "oneOf",
                                                      "allOf",
                                                      "$ref",
                                                      "$defs",
                                                      "definitions",
                                                      "format"};

// Decimal digits of a non-negative value.
std::string Digits(uint64_t v) { return std::to_string(v); }

class SchemaCompiler {
 public:
  SchemaCompiler(const json& root, std::string root_path, GrammarBuilder* b)
      : root_(root), root_path_(std::move(root_path)), b_(b) {}

  absl::StatusOr<ExprId> Compile(const json& s, const std::string& path) {
    if (++depth_ > 128) return Error(path, "the schema nests deeper than 128 levels");
    absl::StatusOr<ExprId> r = CompileInner(s, path);
    --depth_;
    return r;
  }

  ExprId AnyValue() {
    if (any_value_ < 0) {
      any_value_ = b_->NewRule("value");
      const ExprId v = b_->Ref(any_value_);
      const ExprId member = b_->Seq({String(0, kUnbounded), Ws(), b_->Byte(':'), Ws(), v});
      const ExprId object = Container('{', '}', member, 0, kUnbounded);
      const ExprId array = Container('[', ']', v, 0, kUnbounded);
      b_->SetBody(any_value_,
                  b_->Alt({object, array, String(0, kUnbounded), Number(), Integer(),
                           b_->Literal("true"), b_->Literal("false"), b_->Literal("null")}));
    }
    return b_->Ref(any_value_);
  }

  ExprId AnyObject() {
    AnyValue();
    const ExprId member =
        b_->Seq({String(0, kUnbounded), Ws(), b_->Byte(':'), Ws(), b_->Ref(any_value_)});
    return Container('{', '}', member, 0, kUnbounded);
  }

 private:
  static absl::Status Error(const std::string& path, std::string_view what) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": ", std::string(what)));
  }

  ExprId Ws() {
    if (ws_ < 0) {
      ws_ = b_->NewRule("ws");
      ByteSet s;
      for (char c : std::string_view(" \t\n\r")) s.Add(static_cast<uint8_t>(c));
      b_->SetBody(ws_, b_->Repeat(b_->Class(s), 0, kMaxJsonWhitespace));
    }
    return b_->Ref(ws_);
  }

  ExprId Hex() {
    ByteSet h;
    h.AddRange('0', '9');
    h.AddRange('a', 'f');
    h.AddRange('A', 'F');
    return b_->Class(h);
  }

  // One JSON string character: unescaped UTF-8 or an escape (no surrogate
  // \u escapes, so a character is one code point, as lengths count them).
  ExprId StringChar() {
    if (char_ < 0) {
      char_ = b_->NewRule("char");
      ByteSet excl;
      excl.AddRange(0x00, 0x1f);
      excl.Add('"');
      excl.Add('\\');
      ByteSet esc;
      for (char c : std::string_view("\"\\/bfnrt")) esc.Add(static_cast<uint8_t>(c));
      ByteSet not_d, d, low;
      not_d.AddRange('0', '9');
      not_d.AddRange('a', 'c');
      not_d.AddRange('A', 'C');
      not_d.AddRange('e', 'f');
      not_d.AddRange('E', 'F');
      d.Add('d');
      d.Add('D');
      low.AddRange('0', '7');
      const ExprId u = b_->Seq(
          {b_->Byte('u'), b_->Alt({b_->Seq({b_->Class(not_d), Hex(), Hex(), Hex()}),
                                   b_->Seq({b_->Class(d), b_->Class(low), Hex(), Hex()})})});
      b_->SetBody(char_, b_->Alt({Utf8Char(b_, excl),
                                  b_->Seq({b_->Byte('\\'), b_->Alt({b_->Class(esc), u})})}));
    }
    return b_->Ref(char_);
  }

  // One shared rule per length range (model/grammar/grammar.h): every
  // string field of one range reads the same bytes up to its closing quote,
  // so their masks inside the string are computed once.
  ExprId String(int32_t min, int32_t max) {
    auto [it, inserted] = strings_.try_emplace({min, max}, -1);
    if (inserted) {
      it->second = b_->NewRule("string");
      b_->SetBody(it->second,
                  b_->Seq({b_->Byte('"'), b_->Repeat(StringChar(), min, max), b_->Byte('"')}));
      b_->MarkShared(it->second);
    }
    return b_->Ref(it->second);
  }

  ExprId DigitRun(int32_t min, int32_t max) {
    ByteSet d;
    d.AddRange('0', '9');
    return b_->Repeat(b_->Class(d), min, max);
  }

  ExprId Integer() {
    ByteSet nz;
    nz.AddRange('1', '9');
    return b_->Seq({b_->Optional(b_->Byte('-')),
                    b_->Alt({b_->Byte('0'), b_->Seq({b_->Class(nz), DigitRun(0, 17)})})});
  }

  ExprId Number() {
    ByteSet e, sign;
    e.Add('e');
    e.Add('E');
    sign.Add('+');
    sign.Add('-');
    const ExprId frac = b_->Seq({b_->Byte('.'), DigitRun(1, 16)});
    const ExprId exp = b_->Seq({b_->Class(e), b_->Optional(b_->Class(sign)), DigitRun(1, 3)});
    return b_->Seq({Integer(), b_->Optional(frac), b_->Optional(exp)});
  }

  // Same-width decimal strings from x to y (digit by digit, leading zeros
  // allowed): the classic range-to-regex split.
  ExprId FixedWidthRange(const std::string& x, const std::string& y) {
    if (x.empty()) return b_->Empty();
    const size_t w = x.size();
    if (x == std::string(w, '0') && y == std::string(w, '9')) {
      return DigitRun(static_cast<int32_t>(w), static_cast<int32_t>(w));
    }
    ByteSet c;
    if (x[0] == y[0]) {
      return b_->Seq({b_->Byte(x[0]), FixedWidthRange(x.substr(1), y.substr(1))});
    }
    if (w == 1) {
      c.AddRange(x[0], y[0]);
      return b_->Class(c);
    }
    std::vector<ExprId> alts;
    alts.push_back(
        b_->Seq({b_->Byte(x[0]), FixedWidthRange(x.substr(1), std::string(w - 1, '9'))}));
    if (x[0] + 1 <= y[0] - 1) {
      c.AddRange(x[0] + 1, y[0] - 1);
      alts.push_back(b_->Seq(
          {b_->Class(c), DigitRun(static_cast<int32_t>(w - 1), static_cast<int32_t>(w - 1))}));
    }
    alts.push_back(
        b_->Seq({b_->Byte(y[0]), FixedWidthRange(std::string(w - 1, '0'), y.substr(1))}));
    return b_->Alt(std::move(alts));
  }

  // Non-negative integers lo..hi without leading zeros.
  ExprId NonNegativeRange(uint64_t lo, uint64_t hi) {
    std::vector<ExprId> alts;
    const std::string ls = Digits(lo), hs = Digits(hi);
    for (size_t w = ls.size(); w <= hs.size(); ++w) {
      std::string from = w == ls.size() ? ls : "1" + std::string(w - 1, '0');
      std::string to = w == hs.size() ? hs : std::string(w, '9');
      alts.push_back(FixedWidthRange(from, to));
    }
    return b_->Alt(std::move(alts));
  }

  ExprId IntegerRange(int64_t lo, int64_t hi) {
    std::vector<ExprId> alts;
    if (lo < 0) {
      const uint64_t nlo = hi < 0 ? static_cast<uint64_t>(-hi) : 1;
      alts.push_back(b_->Seq({b_->Byte('-'), NonNegativeRange(nlo, static_cast<uint64_t>(-lo))}));
    }
    if (hi >= 0) alts.push_back(NonNegativeRange(lo < 0 ? 0 : lo, hi));
    return b_->Alt(std::move(alts));
  }

  absl::StatusOr<ExprId> IntegerFor(const json& s, const std::string& path) {
    constexpr int64_t kLimit = 999999999999999999;  // 18 digits
    int64_t lo = -kLimit, hi = kLimit;
    bool bounded = false;
    auto bound = [&](const char* key, int64_t delta, bool lower) -> absl::Status {
      if (!s.contains(key)) return absl::OkStatus();
      const json& v = s[key];
      if (!v.is_number()) return Error(absl::StrCat(path, ".", key), "must be a number");
      const double d = v.get<double>();
      if (d < -1e18 || d > 1e18) {
        return Error(absl::StrCat(path, ".", key), "must be within +-10^18");
      }
      int64_t x = lower ? static_cast<int64_t>(std::ceil(d)) : static_cast<int64_t>(std::floor(d));
      if (delta != 0 && static_cast<double>(x) == d) x += delta;
      if (lower) lo = std::max(lo, x);
      if (!lower) hi = std::min(hi, x);
      bounded = true;
      return absl::OkStatus();
    };
    if (absl::Status st = bound("minimum", 0, true); !st.ok()) return st;
    if (absl::Status st = bound("exclusiveMinimum", 1, true); !st.ok()) return st;
    if (absl::Status st = bound("maximum", 0, false); !st.ok()) return st;
    if (absl::Status st = bound("exclusiveMaximum", -1, false); !st.ok()) return st;
    if (!bounded) return Integer();
    if (lo > hi) return Error(path, "no integer lies between minimum and maximum");
    return IntegerRange(lo, hi);
  }

  absl::StatusOr<int32_t> Count(const json& s, const char* key, const std::string& path,
                                int32_t fallback) {
    if (!s.contains(key)) return fallback;
    const json& v = s[key];
    if (!v.is_number_unsigned() || v.get<uint64_t>() > static_cast<uint64_t>(kMaxRepeat)) {
      return Error(absl::StrCat(path, ".", key),
                   absl::StrCat("must be an integer from 0 to ", kMaxRepeat));
    }
    return static_cast<int32_t>(v.get<uint64_t>());
  }

  ExprId Container(char open, char close, ExprId item, int32_t min, int32_t max) {
    const ExprId sep = b_->Seq({Ws(), b_->Byte(','), Ws()});
    const ExprId next = b_->Seq({sep, item});
    ExprId body;
    if (max == 0) {
      body = b_->Empty();
    } else {
      const int32_t rest_min = std::max(0, min - 1);
      const int32_t rest_max = max == kUnbounded ? kUnbounded : max - 1;
      body = b_->Seq({item, b_->Repeat(next, rest_min, rest_max)});
      if (min == 0) body = b_->Optional(body);
    }
    return b_->Seq({b_->Byte(open), Ws(), body, Ws(), b_->Byte(close)});
  }

  absl::StatusOr<ExprId> Format(const std::string& f, const std::string& path) {
    ByteSet c;
    auto two = [&](char a, char lo, char hi) {
      ByteSet r;
      r.AddRange(lo, hi);
      return b_->Seq({b_->Byte(a), b_->Class(r)});
    };
    auto date = [&]() {
      ByteSet d12, d09;
      d09.AddRange('0', '9');
      d12.AddRange('1', '2');
      const ExprId month = b_->Alt({two('0', '1', '9'), two('1', '0', '2')});
      const ExprId day = b_->Alt({two('0', '1', '9'), b_->Seq({b_->Class(d12), b_->Class(d09)})});
      return b_->Seq({DigitRun(4, 4), b_->Byte('-'), month, b_->Byte('-'), day});
    };
    auto time = [&]() {
      ByteSet d01, d05;
      d01.AddRange('0', '1');
      d05.AddRange('0', '5');
      const ExprId hour = b_->Alt({b_->Seq({b_->Class(d01), DigitRun(1, 1)}), two('2', '0', '3')});
      const ExprId sixty = b_->Seq({b_->Class(d05), DigitRun(1, 1)});
      return b_->Seq({hour, b_->Byte(':'), sixty, b_->Byte(':'), sixty, b_->Byte('Z')});
    };
    ExprId body;
    if (f == "date") {
      body = date();
    } else if (f == "time") {
      body = time();
    } else if (f == "date-time") {
      body = b_->Seq({date(), b_->Byte('T'), time()});
    } else if (f == "uuid") {
      auto hex = [&](int n) { return b_->Repeat(Hex(), n, n); };
      body = b_->Seq({hex(8), b_->Byte('-'), hex(4), b_->Byte('-'), hex(4), b_->Byte('-'), hex(4),
                      b_->Byte('-'), hex(12)});
    } else {
      return Error(absl::StrCat(path, ".format"),
                   absl::StrCat("the string format '", f, "' is not supported"));
    }
    return b_->Seq({b_->Byte('"'), body, b_->Byte('"')});
  }

  absl::StatusOr<ExprId> StringFor(const json& s, const std::string& path) {
    if (s.contains("format")) {
      if (!s["format"].is_string()) return Error(path + ".format", "must be a string");
      return Format(s["format"].get<std::string>(), path);
    }
    absl::StatusOr<int32_t> min = Count(s, "minLength", path, 0);
    if (!min.ok()) return min.status();
    absl::StatusOr<int32_t> max = Count(s, "maxLength", path, kUnbounded);
    if (!max.ok()) return max.status();
    if (*max != kUnbounded && *max < *min) return Error(path, "maxLength is below minLength");
    return String(*min, *max);
  }

  absl::StatusOr<ExprId> ArrayFor(const json& s, const std::string& path) {
    absl::StatusOr<int32_t> min = Count(s, "minItems", path, 0);
    if (!min.ok()) return min.status();
    absl::StatusOr<int32_t> max = Count(s, "maxItems", path, kUnbounded);
    if (!max.ok()) return max.status();
    if (*max != kUnbounded && *max < *min) return Error(path, "maxItems is below minItems");
    ExprId item = AnyValue();
    if (s.contains("items")) {
      absl::StatusOr<ExprId> it = Compile(s["items"], path + ".items");
      if (!it.ok()) return it.status();
      item = *it;
    }
    return Container('[', ']', item, *min, *max);
  }

  absl::StatusOr<ExprId> ObjectFor(const json& s, const std::string& path) {
    const bool has_props = s.contains("properties");
    const json* additional =
        s.contains("additionalProperties") ? &s["additionalProperties"] : nullptr;
    if (!has_props) {
      if (additional != nullptr && additional->is_object()) {
        absl::StatusOr<ExprId> v = Compile(*additional, path + ".additionalProperties");
        if (!v.ok()) return v.status();
        const ExprId member = b_->Seq({String(0, kUnbounded), Ws(), b_->Byte(':'), Ws(), *v});
        return Container('{', '}', member, 0, kUnbounded);
      }
      if (additional != nullptr && additional->is_boolean() && !additional->get<bool>()) {
        return b_->Seq({b_->Byte('{'), Ws(), b_->Byte('}')});
      }
      return AnyObject();
    }
    if (additional != nullptr && !additional->is_boolean()) {
      return Error(path + ".additionalProperties",
                   "a schema next to properties is not supported (use false)");
    }
    const json& props = s["properties"];
    if (!props.is_object()) return Error(path + ".properties", "must be an object");
    std::set<std::string> required;
    if (s.contains("required")) {
      const json& req = s["required"];
      if (!req.is_array()) return Error(path + ".required", "must be an array of names");
      for (const json& r : req) {
        if (!r.is_string()) return Error(path + ".required", "must be an array of names");
        if (!props.contains(r.get<std::string>())) {
          return Error(path + ".required", absl::StrCat("names '", r.get<std::string>(),
                                                        "', which is not in properties"));
        }
        required.insert(r.get<std::string>());
      }
    }
    struct Member {
      ExprId expr;
      bool required;
    };
    std::vector<Member> members;
    for (auto it = props.begin(); it != props.end(); ++it) {
      absl::StatusOr<ExprId> v = Compile(it.value(), absl::StrCat(path, ".properties.", it.key()));
      if (!v.ok()) return v.status();
      const ExprId key = b_->Literal(json(it.key()).dump());
      members.push_back(
          Member{b_->Seq({key, Ws(), b_->Byte(':'), Ws(), *v}), required.count(it.key()) > 0});
    }
    // tail[i][first]: properties i.. in order, `first` when none came yet.
    const ExprId sep = b_->Seq({Ws(), b_->Byte(','), Ws()});
    ExprId tail_first = b_->Empty(), tail_after = b_->Empty();
    for (size_t k = members.size(); k-- > 0;) {
      const RuleId rf = b_->NewRule("props"), ra = b_->NewRule("props");
      const ExprId take_first = b_->Seq({members[k].expr, tail_after});
      const ExprId take_after = b_->Seq({sep, members[k].expr, tail_after});
      if (members[k].required) {
        b_->SetBody(rf, take_first);
        b_->SetBody(ra, take_after);
      } else {
        b_->SetBody(rf, b_->Alt({take_first, tail_first}));
        b_->SetBody(ra, b_->Alt({take_after, tail_after}));
      }
      tail_first = b_->Ref(rf);
      tail_after = b_->Ref(ra);
    }
    return b_->Seq({b_->Byte('{'), Ws(), tail_first, Ws(), b_->Byte('}')});
  }

  absl::StatusOr<ExprId> Ref(const std::string& ref, const std::string& path) {
    std::string name;
    const json* defs = nullptr;
    for (const char* prefix : {"#/$defs/", "#/definitions/"}) {
      if (ref.rfind(prefix, 0) == 0) {
        name = ref.substr(std::string_view(prefix).size());
        const std::string key = std::string(prefix).substr(2, std::string_view(prefix).size() - 3);
        if (root_.contains(key)) defs = &root_[key];
      }
    }
    if (ref == "#") {
      name = "#";
    } else if (defs == nullptr || !defs->contains(name)) {
      return Error(path + ".$ref",
                   absl::StrCat("'", ref,
                                "' is not a definition of this schema (only #, "
                                "#/$defs/... and #/definitions/... are supported)"));
    }
    if (auto it = refs_.find(ref); it != refs_.end()) return b_->Ref(it->second);
    const RuleId rule = b_->NewRule(ref);
    refs_[ref] = rule;
    const json& target = ref == "#" ? root_ : (*defs)[name];
    const std::string def_path =
        ref == "#"
            ? root_path_
            : absl::StrCat(root_path_, ".", ref.substr(2, ref.size() - 3 - name.size()), ".", name);
    absl::StatusOr<ExprId> body = Compile(target, def_path);
    if (!body.ok()) return body.status();
    b_->SetBody(rule, *body);
    return b_->Ref(rule);
  }

  absl::StatusOr<ExprId> CompileInner(const json& s, const std::string& path) {
    if (s.is_boolean()) {
      if (s.get<bool>()) return AnyValue();
      return Error(path, "the schema false accepts nothing");
    }
    if (!s.is_object()) return Error(path, "a schema must be an object or a boolean");
    int constraining = 0;
    for (auto it = s.begin(); it != s.end(); ++it) {
      if (kAnnotations.count(it.key())) continue;
      if (!kKeywords.count(it.key())) {
        return Error(absl::StrCat(path, ".", it.key()),
                     absl::StrCat("the JSON Schema keyword '", it.key(), "' is not supported"));
      }
      if (it.key() != "$defs" && it.key() != "definitions") ++constraining;
    }
    auto literals = [&](const json& values) -> ExprId {
      std::vector<ExprId> alts;
      for (const json& v : values) alts.push_back(b_->Literal(v.dump()));
      return b_->Alt(std::move(alts));
    };
    if (s.contains("const")) return literals(json::array({s["const"]}));
    if (s.contains("enum")) {
      if (!s["enum"].is_array() || s["enum"].empty()) {
        return Error(path + ".enum", "must be a non-empty array");
      }
      return literals(s["enum"]);
    }
    for (const char* key : {"anyOf", "oneOf", "allOf", "$ref"}) {
      if (!s.contains(key)) continue;
      if (constraining > 1) {
        return Error(absl::StrCat(path, ".", key),
                     absl::StrCat(key, " next to other constraining keywords is not supported"));
      }
      if (std::string_view(key) == "$ref") {
        if (!s[key].is_string()) return Error(path + ".$ref", "must be a string");
        return Ref(s[key].get<std::string>(), path);
      }
      const json& list = s[key];
      if (!list.is_array() || list.empty()) {
        return Error(absl::StrCat(path, ".", key), "must be a non-empty array of schemas");
      }
      if (std::string_view(key) == "allOf" && list.size() != 1) {
        return Error(path + ".allOf", "allOf with more than one schema is not supported");
      }
      std::vector<ExprId> alts;
      for (size_t i = 0; i < list.size(); ++i) {
        absl::StatusOr<ExprId> e = Compile(list[i], absl::StrCat(path, ".", key, "[", i, "]"));
        if (!e.ok()) return e.status();
        alts.push_back(*e);
      }
      return b_->Alt(std::move(alts));
    }
    std::vector<std::string> types;
    if (s.contains("type")) {
      const json& t = s["type"];
      if (t.is_string()) {
        types.push_back(t.get<std::string>());
      } else if (t.is_array() && !t.empty()) {
        for (const json& x : t) {
          if (!x.is_string()) return Error(path + ".type", "must be a type name or a list of them");
          types.push_back(x.get<std::string>());
        }
      } else {
        return Error(path + ".type", "must be a type name or a list of them");
      }
    } else if (s.contains("properties") || s.contains("additionalProperties")) {
      types.push_back("object");
    } else if (s.contains("items")) {
      types.push_back("array");
    } else if (constraining == 0) {
      return AnyValue();
    } else {
      return Error(path, "a schema with constraints needs a type");
    }
    std::vector<ExprId> alts;
    for (const std::string& t : types) {
      absl::StatusOr<ExprId> e;
      if (t == "string") {
        e = StringFor(s, path);
      } else if (t == "integer") {
        e = IntegerFor(s, path);
      } else if (t == "number") {
        if (s.contains("minimum") || s.contains("maximum") || s.contains("exclusiveMinimum") ||
            s.contains("exclusiveMaximum")) {
          return Error(path + ".minimum",
                       "bounds on a number are not supported (they are on an integer)");
        }
        e = Number();
      } else if (t == "boolean") {
        e = b_->Alt({b_->Literal("true"), b_->Literal("false")});
      } else if (t == "null") {
        e = b_->Literal("null");
      } else if (t == "object") {
        e = ObjectFor(s, path);
      } else if (t == "array") {
        e = ArrayFor(s, path);
      } else {
        return Error(path + ".type", absl::StrCat("unknown type '", t, "'"));
      }
      if (!e.ok()) return e.status();
      alts.push_back(*e);
    }
    return b_->Alt(std::move(alts));
  }

  const json& root_;
  const std::string root_path_;
  GrammarBuilder* b_;
  int depth_ = 0;
  RuleId ws_ = -1, char_ = -1, any_value_ = -1;
  std::map<std::string, RuleId> refs_;
  std::map<std::pair<int32_t, int32_t>, RuleId> strings_;
};

}  // namespace

absl::Status BuildJsonSchemaGrammar(std::string_view schema_text, const std::string& path,
                                    GrammarBuilder* builder, RuleId rule) {
  json schema = json::parse(schema_text, nullptr, /*allow_exceptions=*/false);
  if (schema.is_discarded()) return absl::InvalidArgumentError(path + ": is not valid JSON");
  SchemaCompiler c(schema, path, builder);
  absl::StatusOr<ExprId> e = c.Compile(schema, path);
  if (!e.ok()) return e.status();
  builder->SetBody(rule, *e);
  return absl::OkStatus();
}

void BuildJsonObjectGrammar(GrammarBuilder* builder, RuleId rule) {
  const json empty = json::object();
  SchemaCompiler c(empty, "", builder);
  builder->SetBody(rule, c.AnyObject());
}

}  // namespace kvserve

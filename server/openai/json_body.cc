#include "server/openai/json_body.h"

#include <vector>

#include "absl/strings/str_cat.h"

namespace kvserve {
namespace {

// A SAX pass that only tracks where it is, to name the field an error is in.
// It runs after the DOM parse failed, so its cost is paid by bad bodies only.
class PathTracker {
 public:
  using json = nlohmann::json;
  explicit PathTracker(std::string* path) : path_(path) {}

  bool null() { return Value(); }
  bool boolean(bool) { return Value(); }
  bool number_integer(json::number_integer_t) { return Value(); }
  bool number_unsigned(json::number_unsigned_t) { return Value(); }
  bool number_float(json::number_float_t, const std::string&) { return Value(); }
  bool string(std::string&) { return Value(); }
  bool binary(json::binary_t&) { return Value(); }
  bool start_object(std::size_t) {
    frames_.push_back({false, "", 0});
    return true;
  }
  bool key(std::string& k) {
    frames_.back().key = k;
    return true;
  }
  bool end_object() { return End(); }
  bool start_array(std::size_t) {
    frames_.push_back({true, "", 0});
    return true;
  }
  bool end_array() { return End(); }
  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception&) {
    *path_ = Path();
    return false;
  }

 private:
  struct Frame {
    bool array;
    std::string key;
    size_t index;
  };
  // A value ended: the next one in an array is one further on.
  bool Value() {
    if (!frames_.empty() && frames_.back().array) ++frames_.back().index;
    return true;
  }
  bool End() {
    frames_.pop_back();
    return Value();
  }
  std::string Path() const {
    std::string p;
    for (const Frame& f : frames_) {
      if (f.array) {
        absl::StrAppend(&p, "[", f.index, "]");
      } else {
        if (!p.empty()) p.push_back('.');
        p += CapClientText(f.key);
      }
    }
    return p;
  }
  std::vector<Frame> frames_;
  std::string* path_;
};

template <typename Json>
std::variant<Json, JsonBodyError> Parse(std::string_view body, int max_depth) {
  bool too_deep = false;
  Json j;
  try {
    j = Json::parse(body, [&too_deep, max_depth](int depth, typename Json::parse_event_t, Json&) {
      too_deep = too_deep || depth > max_depth;
      return true;
    });
  } catch (const nlohmann::json::exception& e) {
    JsonBodyError err;
    // The tracker's own pass cannot throw: its parse_error returns false.
    PathTracker tracker(&err.path);
    nlohmann::json::sax_parse(body, &tracker, nlohmann::json::input_format_t::json,
                              /*strict=*/true);
    if (dynamic_cast<const nlohmann::json::out_of_range*>(&e) != nullptr) {
      err.kind = JsonBodyError::Kind::kOutOfRange;
      err.message = err.path.empty()
                        ? std::string("the JSON body holds a number out of range")
                        : absl::StrCat("'", err.path,
                                       "' is a number out of range (beyond a double's +-1.8e308)");
    } else {
      err.kind = JsonBodyError::Kind::kSyntax;
      err.path.clear();
      err.message = absl::StrCat("invalid JSON body: ", CapClientText(e.what(), 256));
    }
    return err;
  }
  if (too_deep) {
    JsonBodyError err;
    err.kind = JsonBodyError::Kind::kTooDeep;
    err.message = absl::StrCat("the JSON body is nested more than ", max_depth, " levels deep");
    return err;
  }
  return j;
}

}  // namespace

std::variant<nlohmann::json, JsonBodyError> ParseJsonBody(std::string_view body, int max_depth) {
  return Parse<nlohmann::json>(body, max_depth);
}

std::variant<nlohmann::ordered_json, JsonBodyError> ParseOrderedJsonBody(std::string_view body,
                                                                         int max_depth) {
  return Parse<nlohmann::ordered_json>(body, max_depth);
}

std::string CapClientText(std::string_view s, size_t max_bytes) {
  if (s.size() <= max_bytes) return std::string(s);
  size_t cut = max_bytes;
  // Back off continuation bytes so a multi-byte character is not split.
  while (cut > 0 && (static_cast<unsigned char>(s[cut]) & 0xC0) == 0x80) --cut;
  return absl::StrCat(std::string(s.substr(0, cut)), "... (", s.size(), " bytes)");
}

}  // namespace kvserve

#include "server/openai/json_fields.h"

#include <cmath>
#include <limits>

#include "absl/strings/str_cat.h"

namespace kvserve::json_fields {

const char* TypeName(const json& v) {
  switch (v.type()) {
    case json::value_t::null:
      return "null";
    case json::value_t::boolean:
      return "a boolean";
    case json::value_t::string:
      return "a string";
    case json::value_t::array:
      return "an array";
    case json::value_t::object:
      return "an object";
    case json::value_t::number_float:
      return "a number";
    case json::value_t::number_integer:
    case json::value_t::number_unsigned:
      return "an integer";
    default:
      return "a value";
  }
}

ApiError WrongType(const std::string& param, const char* expected, const json& got) {
  return InvalidRequest(param,
                        absl::StrCat("'", param, "' must be ", expected, ", got ", TypeName(got)));
}

// The member, or nullptr when absent or null (null means "not given").
const json* Member(const json& obj, const char* name) {
  auto it = obj.find(name);
  if (it == obj.end() || it->is_null()) return nullptr;
  return &*it;
}

std::optional<ApiError> GetNumber(const json& obj, const char* name, std::optional<double>* out) {
  const json* v = Member(obj, name);
  if (v == nullptr) return std::nullopt;
  if (!v->is_number()) return WrongType(name, "a number", *v);
  double d = v->get<double>();
  if (!std::isfinite(d)) return InvalidRequest(name, absl::StrCat("'", name, "' must be finite"));
  *out = d;
  return std::nullopt;
}

// Integers; a float with an integral value (3.0) is accepted as JSON allows.
std::optional<ApiError> GetInt(const json& obj, const char* name, std::optional<int64_t>* out) {
  const json* v = Member(obj, name);
  if (v == nullptr) return std::nullopt;
  if (v->is_number_integer()) {
    if (v->is_number_unsigned() &&
        v->get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
      return InvalidRequest(name, absl::StrCat("'", name, "' is out of range"));
    }
    *out = v->get<int64_t>();
    return std::nullopt;
  }
  if (v->is_number_float()) {
    double d = v->get<double>();
    if (std::isfinite(d) && d == std::floor(d) && std::fabs(d) < 9.0e15) {
      *out = static_cast<int64_t>(d);
      return std::nullopt;
    }
  }
  return WrongType(name, "an integer", *v);
}

std::optional<ApiError> GetBool(const json& obj, const char* name, std::optional<bool>* out) {
  const json* v = Member(obj, name);
  if (v == nullptr) return std::nullopt;
  if (!v->is_boolean()) return WrongType(name, "a boolean", *v);
  *out = v->get<bool>();
  return std::nullopt;
}

std::optional<ApiError> GetString(const json& obj, const char* name,
                                  std::optional<std::string>* out) {
  const json* v = Member(obj, name);
  if (v == nullptr) return std::nullopt;
  if (!v->is_string()) return WrongType(name, "a string", *v);
  *out = v->get<std::string>();
  return std::nullopt;
}

ApiError OutOfRange(const char* param, const std::string& rule, const std::string& got) {
  return InvalidRequest(param, absl::StrCat("'", param, "' must be ", rule, ", got ", got));
}

// Reads an array of token ids, each in [0, vocab).
std::optional<ApiError> GetTokenIds(const json& arr, const std::string& param, int vocab,
                                    std::vector<int32_t>* out) {
  out->clear();
  for (const json& t : arr) {
    if (!t.is_number_integer()) {
      return InvalidRequest(
          param, absl::StrCat("'", param, "' token ids must be integers, got ", TypeName(t)));
    }
    // The vocabulary range is ValidateRequestParams'; here only what fits.
    int64_t id = t.get<int64_t>();
    if (id < std::numeric_limits<int32_t>::min() || id > std::numeric_limits<int32_t>::max()) {
      return InvalidRequest(param, absl::StrCat("'", param, "' token id ", id,
                                                " is outside the vocabulary [0, ", vocab, ")"));
    }
    out->push_back(static_cast<int32_t>(id));
  }
  return std::nullopt;
}

}  // namespace kvserve::json_fields

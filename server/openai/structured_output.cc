#include "server/openai/structured_output.h"

#include <variant>
#include <vector>

#include "absl/strings/str_cat.h"
#include "server/openai/json_body.h"

namespace kvserve {
namespace {

using ojson = nlohmann::ordered_json;

const ojson* Member(const ojson& obj, const char* name) {
  auto it = obj.find(name);
  if (it == obj.end() || it->is_null()) return nullptr;
  return &*it;
}

ApiError Wrong(const std::string& param, const char* expected) {
  return InvalidRequest(param, absl::StrCat("'", param, "' must be ", expected));
}

// A schema given as an object (or true), or as its JSON text.
std::optional<ApiError> SchemaSpec(const ojson& v, const std::string& param, GrammarSpec* out) {
  out->kind = GrammarSpec::Kind::kJsonSchema;
  out->field = param;
  if (v.is_string()) {
    out->text = v.get<std::string>();
  } else if (v.is_object() || v.is_boolean()) {
    out->text = v.dump();
  } else {
    return Wrong(param, "a JSON schema (an object, or its JSON text)");
  }
  return std::nullopt;
}

std::optional<ApiError> RegexSpec(const ojson& v, const std::string& param, GrammarSpec* out) {
  if (!v.is_string()) return Wrong(param, "a string (a regular expression)");
  out->kind = GrammarSpec::Kind::kRegex;
  out->text = v.get<std::string>();
  out->field = param;
  return std::nullopt;
}

std::optional<ApiError> ChoiceSpec(const ojson& v, const std::string& param, GrammarSpec* out) {
  if (!v.is_array() || v.empty()) return Wrong(param, "a non-empty array of strings");
  out->kind = GrammarSpec::Kind::kChoice;
  out->field = param;
  for (size_t i = 0; i < v.size(); ++i) {
    if (!v[i].is_string()) return Wrong(absl::StrCat(param, "[", i, "]"), "a string");
    out->choices.push_back(v[i].get<std::string>());
  }
  return std::nullopt;
}

std::optional<ApiError> GbnfSpec(const ojson& v, const std::string& param, GrammarSpec* out) {
  if (!v.is_string()) return Wrong(param, "a string (a GBNF grammar)");
  out->kind = GrammarSpec::Kind::kGbnf;
  out->text = v.get<std::string>();
  out->field = param;
  return std::nullopt;
}

std::optional<ApiError> ResponseFormat(const ojson& rf, GrammarSpec* out) {
  if (!rf.is_object()) return Wrong("response_format", "an object");
  const ojson* type = Member(rf, "type");
  if (type == nullptr || !type->is_string()) {
    return Wrong("response_format.type", "one of \"text\", \"json_object\", \"json_schema\"");
  }
  const std::string t = type->get<std::string>();
  if (t == "text") return std::nullopt;
  if (t == "json_object") {
    out->kind = GrammarSpec::Kind::kJsonObject;
    out->field = "response_format";
    return std::nullopt;
  }
  if (t != "json_schema") {
    return InvalidRequest("response_format.type",
                          absl::StrCat("'response_format.type' must be one of \"text\", "
                                       "\"json_object\", \"json_schema\", got \"",
                                       CapClientText(t, 64), "\""));
  }
  const ojson* js = Member(rf, "json_schema");
  if (js == nullptr || !js->is_object()) {
    return Wrong("response_format.json_schema", "an object with a schema");
  }
  if (const ojson* name = Member(*js, "name"); name != nullptr && !name->is_string()) {
    return Wrong("response_format.json_schema.name", "a string");
  }
  if (const ojson* strict = Member(*js, "strict"); strict != nullptr && !strict->is_boolean()) {
    return Wrong("response_format.json_schema.strict", "a boolean");
  }
  const ojson* schema = Member(*js, "schema");
  if (schema == nullptr) {
    return InvalidRequest("response_format.json_schema.schema",
                          "'response_format.json_schema.schema' is required");
  }
  return SchemaSpec(*schema, "response_format.json_schema.schema", out);
}

std::optional<ApiError> StructuredOutputs(const ojson& so, GrammarSpec* out) {
  if (!so.is_object()) return Wrong("structured_outputs", "an object");
  int given = 0;
  std::string first;
  for (const char* key : {"json", "regex", "choice", "grammar", "json_object"}) {
    const ojson* v = Member(so, key);
    if (v == nullptr) continue;
    const std::string param = absl::StrCat("structured_outputs.", key);
    if (++given > 1) {
      return InvalidRequest(param, absl::StrCat("'", param, "' and '", first,
                                                "' both given; structured_outputs takes one"));
    }
    first = param;
    if (std::string_view(key) == "json") {
      if (auto e = SchemaSpec(*v, param, out)) return e;
    } else if (std::string_view(key) == "regex") {
      if (auto e = RegexSpec(*v, param, out)) return e;
    } else if (std::string_view(key) == "choice") {
      if (auto e = ChoiceSpec(*v, param, out)) return e;
    } else if (std::string_view(key) == "grammar") {
      if (auto e = GbnfSpec(*v, param, out)) return e;
    } else {
      if (!v->is_boolean()) return Wrong(param, "a boolean");
      if (v->get<bool>()) {
        out->kind = GrammarSpec::Kind::kJsonObject;
        out->field = param;
      }
    }
  }
  return std::nullopt;
}

}  // namespace

std::optional<ApiError> ParseStructuredOutput(const nlohmann::json& body,
                                              const std::string& raw_body, GrammarSpec* out) {
  static const char* const kFields[] = {"response_format", "guided_json",    "guided_regex",
                                        "guided_choice",   "guided_grammar", "structured_outputs"};
  bool any = false;
  for (const char* f : kFields) {
    auto it = body.find(f);
    any |= it != body.end() && !it->is_null();
  }
  if (!any) return std::nullopt;
  // The body parsed once already, so this parse succeeds.
  std::variant<ojson, JsonBodyError> parsed = ParseOrderedJsonBody(raw_body, kMaxJsonDepth);
  if (const JsonBodyError* err = std::get_if<JsonBodyError>(&parsed)) {
    return InvalidRequest(err->path, err->message);
  }
  const ojson& j = std::get<ojson>(parsed);
  std::string first;
  for (const char* f : kFields) {
    const ojson* v = Member(j, f);
    if (v == nullptr) continue;
    GrammarSpec spec;
    std::optional<ApiError> e;
    const std::string_view name = f;
    if (name == "response_format") {
      e = ResponseFormat(*v, &spec);
    } else if (name == "guided_json") {
      e = SchemaSpec(*v, f, &spec);
    } else if (name == "guided_regex") {
      e = RegexSpec(*v, f, &spec);
    } else if (name == "guided_choice") {
      e = ChoiceSpec(*v, f, &spec);
    } else if (name == "guided_grammar") {
      e = GbnfSpec(*v, f, &spec);
    } else {
      e = StructuredOutputs(*v, &spec);
    }
    if (e) return e;
    if (spec.empty()) continue;
    if (!out->empty()) {
      return InvalidRequest(
          f, absl::StrCat("'", f, "' and '", first, "' both constrain the output; give one"));
    }
    first = f;
    *out = std::move(spec);
  }
  return std::nullopt;
}

}  // namespace kvserve

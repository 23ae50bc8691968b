// A small JSON Schema checker for the keywords bench/kvserve_bench_schema.json
// uses: type (one or a list), const, enum, minimum, properties, required,
// additionalProperties: false, items, oneOf and local $ref ("#/$defs/x").
// A keyword it does not know is reported as an error rather than skipped, so
// a schema cannot silently ask for more than is checked.
#pragma once

#include <algorithm>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace kvserve::testing {

class JsonSchemaCheck {
 public:
  explicit JsonSchemaCheck(nlohmann::json schema) : root_(std::move(schema)) {}

  // Every violation as "path: reason"; empty when `doc` conforms.
  std::vector<std::string> Check(const nlohmann::json& doc) const {
    std::vector<std::string> errors;
    Validate(root_, doc, "$", &errors);
    return errors;
  }

 private:
  static bool HasType(const nlohmann::json& v, const std::string& type) {
    if (type == "object") return v.is_object();
    if (type == "array") return v.is_array();
    if (type == "string") return v.is_string();
    if (type == "integer") return v.is_number_integer();
    if (type == "number") return v.is_number();
    if (type == "boolean") return v.is_boolean();
    if (type == "null") return v.is_null();
    return false;
  }

  void Validate(const nlohmann::json& schema, const nlohmann::json& v, const std::string& path,
                std::vector<std::string>* errors) const {
    static const std::vector<std::string> kIgnored = {"description", "title", "$schema", "$defs"};
    for (const auto& [key, rule] : schema.items()) {
      if (std::find(kIgnored.begin(), kIgnored.end(), key) != kIgnored.end()) continue;
      if (key == "$ref") {
        const std::string ref = rule.get<std::string>();
        const std::string prefix = "#/$defs/";
        if (ref.rfind(prefix, 0) != 0 || !root_["$defs"].contains(ref.substr(prefix.size()))) {
          errors->push_back(path + ": unresolvable $ref " + ref);
          continue;
        }
        Validate(root_["$defs"][ref.substr(prefix.size())], v, path, errors);
      } else if (key == "type") {
        std::vector<std::string> types = rule.is_array()
                                             ? rule.get<std::vector<std::string>>()
                                             : std::vector<std::string>{rule.get<std::string>()};
        if (std::none_of(types.begin(), types.end(),
                         [&](const std::string& t) { return HasType(v, t); })) {
          errors->push_back(path + ": expected type " + rule.dump() + ", got " + v.dump());
        }
      } else if (key == "const") {
        if (v != rule) errors->push_back(path + ": expected " + rule.dump() + ", got " + v.dump());
      } else if (key == "enum") {
        if (std::find(rule.begin(), rule.end(), v) == rule.end()) {
          errors->push_back(path + ": " + v.dump() + " is not one of " + rule.dump());
        }
      } else if (key == "minimum") {
        if (v.is_number() && v.get<double>() < rule.get<double>()) {
          errors->push_back(path + ": " + v.dump() + " < minimum " + rule.dump());
        }
      } else if (key == "required") {
        if (!v.is_object()) continue;
        for (const auto& name : rule) {
          if (!v.contains(name.get<std::string>())) {
            errors->push_back(path + ": missing required key " + name.dump());
          }
        }
      } else if (key == "properties") {
        if (!v.is_object()) continue;
        for (const auto& [name, sub] : rule.items()) {
          if (v.contains(name)) Validate(sub, v[name], path + "." + name, errors);
        }
      } else if (key == "additionalProperties") {
        if (!v.is_object() || rule != false) continue;
        const nlohmann::json& props =
            schema.contains("properties") ? schema["properties"] : nlohmann::json::object();
        for (const auto& [name, unused] : v.items()) {
          if (!props.contains(name)) errors->push_back(path + ": unexpected key \"" + name + "\"");
        }
      } else if (key == "items") {
        if (!v.is_array()) continue;
        for (size_t i = 0; i < v.size(); ++i) {
          Validate(rule, v[i], path + "[" + std::to_string(i) + "]", errors);
        }
      } else if (key == "oneOf") {
        int matches = 0;
        for (const auto& sub : rule) {
          std::vector<std::string> sub_errors;
          Validate(sub, v, path, &sub_errors);
          matches += sub_errors.empty() ? 1 : 0;
        }
        if (matches != 1) {
          errors->push_back(path + ": matches " + std::to_string(matches) +
                            " of the oneOf alternatives, not exactly 1");
        }
      } else {
        errors->push_back(path + ": the checker does not know schema keyword " + key);
      }
    }
  }

  nlohmann::json root_;
};

}  // namespace kvserve::testing

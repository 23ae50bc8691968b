#include "model/loader/generation_config.h"

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "util/json_file.h"
#include "util/status_macros.h"

namespace kvserve {
namespace {

absl::Status Bad(const std::string& path, const std::string& field, const std::string& why) {
  return absl::InvalidArgumentError(absl::StrCat(path, ": field '", field, "' ", why));
}

}  // namespace

absl::StatusOr<std::vector<int32_t>> ParseTokenIds(const nlohmann::json& value,
                                                   const std::string& path,
                                                   const std::string& field) {
  std::vector<int32_t> ids;
  if (value.is_null()) return ids;
  auto add = [&](const nlohmann::json& id) {
    if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() > INT32_MAX) {
      return false;
    }
    ids.push_back(static_cast<int32_t>(id.get<int64_t>()));
    return true;
  };
  bool ok = true;
  if (value.is_array()) {
    for (const auto& id : value) ok = ok && add(id);
  } else {
    ok = add(value);
  }
  if (!ok) {
    return Bad(path, field, absl::StrCat("is not a token id or a list of them: ", value.dump()));
  }
  return ids;
}

absl::Status ApplyGenerationConfig(const std::string& path, ModelConfig* config) {
  KV_ASSIGN_OR_RETURN(nlohmann::json j, ReadJsonFile(path));
  if (!j.is_object()) return absl::InvalidArgumentError(absl::StrCat(path, ": not a JSON object"));
  if (auto it = j.find("eos_token_id"); it != j.end()) {
    KV_ASSIGN_OR_RETURN(std::vector<int32_t> ids, ParseTokenIds(*it, path, "eos_token_id"));
    for (int32_t id : ids) config->AddStopId(id);
  }
  auto number = [&](const char* field) -> const nlohmann::json* {
    auto it = j.find(field);
    return it == j.end() || it->is_null() ? nullptr : &*it;
  };
  if (const auto* t = number("temperature")) {
    if (!t->is_number() || t->get<double>() < 0) {
      return Bad(path, "temperature", absl::StrCat("must be a number >= 0, got ", t->dump()));
    }
    config->default_temperature = t->get<float>();
  }
  if (const auto* p = number("top_p")) {
    if (!p->is_number() || !(p->get<double>() > 0 && p->get<double>() <= 1)) {
      return Bad(path, "top_p", absl::StrCat("must be a number in (0, 1], got ", p->dump()));
    }
    config->default_top_p = p->get<float>();
  }
  if (const auto* k = number("top_k")) {
    if (!k->is_number_integer() || k->get<int64_t>() < -1 || k->get<int64_t>() > INT32_MAX) {
      return Bad(path, "top_k", absl::StrCat("must be an integer >= -1, got ", k->dump()));
    }
    config->default_top_k = static_cast<int32_t>(k->get<int64_t>());
  }
  return absl::OkStatus();
}

}  // namespace kvserve

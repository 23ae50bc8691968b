#include "model/chat/hf_chat_template.h"

#include <filesystem>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"

namespace kvserve {
namespace {

namespace fs = std::filesystem;
using ojson = nlohmann::ordered_json;

absl::StatusOr<std::string> ReadFile(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat(path.string(), ": cannot read"));
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// A special token as tokenizer_config.json writes it: "<s>", {"content":
// "<s>", ...} or null.
absl::StatusOr<std::optional<std::string>> TokenString(const ojson& config, const char* key,
                                                       const std::string& where) {
  auto it = config.find(key);
  if (it == config.end() || it->is_null()) return std::nullopt;
  if (it->is_string()) return it->get<std::string>();
  if (it->is_object() && it->contains("content") && (*it)["content"].is_string()) {
    return (*it)["content"].get<std::string>();
  }
  return absl::InvalidArgumentError(
      absl::StrCat(where, ": ", key, ": expected a string or an object with a \"content\" string"));
}

absl::StatusOr<JinjaTemplate> ParseTemplate(const std::string& source, const std::string& where) {
  absl::StatusOr<JinjaTemplate> t = JinjaTemplate::Parse(source);
  if (!t.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": ", t.status().message()));
  }
  return t;
}

}  // namespace

absl::StatusOr<std::optional<HfChatTemplate>> HfChatTemplate::Load(const std::string& dir) {
  const fs::path config_path = fs::path(dir) / "tokenizer_config.json";
  const fs::path jinja_path = fs::path(dir) / "chat_template.jinja";
  std::error_code ec;
  std::string config_text = "{}", jinja_text;
  std::string where = config_path.string();
  if (fs::is_regular_file(config_path, ec)) {
    absl::StatusOr<std::string> text = ReadFile(config_path);
    if (!text.ok()) return text.status();
    config_text = *std::move(text);
  }
  if (fs::is_regular_file(jinja_path, ec)) {
    absl::StatusOr<std::string> text = ReadFile(jinja_path);
    if (!text.ok()) return text.status();
    jinja_text = *std::move(text);
    where = jinja_path.string();
  }
  return FromConfig(config_text, jinja_text, where);
}

absl::StatusOr<std::optional<HfChatTemplate>> HfChatTemplate::FromConfig(
    std::string_view config_json, std::string_view jinja_text, const std::string& where) {
  ojson config = ojson::parse(config_json, nullptr, /*allow_exceptions=*/false);
  if (config.is_discarded() || !config.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": not a JSON object"));
  }
  HfChatTemplate t;
  absl::StatusOr<std::optional<std::string>> bos = TokenString(config, "bos_token", where);
  if (!bos.ok()) return bos.status();
  absl::StatusOr<std::optional<std::string>> eos = TokenString(config, "eos_token", where);
  if (!eos.ok()) return eos.status();
  t.bos_token_ = *bos;
  t.eos_token_ = *eos;

  std::optional<std::string> default_source, tool_use_source;
  if (!jinja_text.empty()) {
    default_source = std::string(jinja_text);
  } else if (auto it = config.find("chat_template"); it != config.end() && !it->is_null()) {
    if (it->is_string()) {
      default_source = it->get<std::string>();
    } else if (it->is_array()) {
      for (const ojson& entry : *it) {
        if (!entry.is_object() || !entry.contains("name") || !entry["name"].is_string() ||
            !entry.contains("template") || !entry["template"].is_string()) {
          return absl::InvalidArgumentError(absl::StrCat(
              where, ": chat_template: list entries must be {\"name\": ..., \"template\": ...}"));
        }
        const std::string name = entry["name"].get<std::string>();
        if (name == "default") default_source = entry["template"].get<std::string>();
        if (name == "tool_use") tool_use_source = entry["template"].get<std::string>();
      }
      if (!default_source) {
        return absl::InvalidArgumentError(
            absl::StrCat(where, ": chat_template: the list has no \"default\" template"));
      }
    } else {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": chat_template: expected a string or a list of named templates"));
    }
  }
  if (!default_source) return std::nullopt;
  absl::StatusOr<JinjaTemplate> d = ParseTemplate(*default_source, where);
  if (!d.ok()) return d.status();
  t.default_ = *std::move(d);
  if (tool_use_source) {
    absl::StatusOr<JinjaTemplate> tu = ParseTemplate(*tool_use_source, where);
    if (!tu.ok()) return tu.status();
    t.tool_use_ = *std::move(tu);
  }
  t.tool_call_format_ = DetectToolCallFormat(tool_use_source ? *tool_use_source : *default_source);
  return t;
}

std::string DetectToolCallFormat(std::string_view source) {
  if (source.find("<tool_call>") != std::string_view::npos) return "hermes";
  if (source.find("[TOOL_CALLS]") != std::string_view::npos) return "mistral";
  if (source.find("<|python_tag|>") != std::string_view::npos ||
      source.find("ipython") != std::string_view::npos) {
    return "llama3_json";
  }
  return "";
}

absl::StatusOr<std::string> HfChatTemplate::Render(const ojson& messages,
                                                   bool add_generation_prompt, const ojson& tools,
                                                   const ojson& extra) const {
  ojson context = ojson::object();
  context["messages"] = messages;
  context["add_generation_prompt"] = add_generation_prompt;
  if (bos_token_) context["bos_token"] = *bos_token_;
  if (eos_token_) context["eos_token"] = *eos_token_;
  const bool has_tools = !tools.is_null();
  if (has_tools) context["tools"] = tools;
  if (extra.is_object()) {
    for (const auto& [k, v] : extra.items()) {
      if (!context.contains(k)) context[k] = v;
    }
  }
  const bool use_tools_template = has_tools && tool_use_ && !(tools.is_array() && tools.empty());
  return (use_tools_template ? *tool_use_ : default_).Render(context);
}

}  // namespace kvserve

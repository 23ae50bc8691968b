// HfChatTemplate: the chat template a Hugging Face model directory ships,
// with the special-token strings it refers to, rendered the way
// transformers' apply_chat_template renders it.
//
// Where it comes from, first found wins:
//   1. chat_template.jinja (what recent transformers versions save);
//   2. tokenizer_config.json "chat_template": a string, or a list of
//      {"name", "template"} of which "default" is used, and "tool_use"
//      instead when the request carries tools (as transformers does).
// bos_token / eos_token come from tokenizer_config.json, each a string or an
// {"content": ...} object (AddedToken); absent or null ones are left out of
// the template's variables, as transformers leaves them out.
//
// Render's variables: messages, add_generation_prompt, bos_token,
// eos_token, tools (when given), then `extra` (e.g. enable_thinking: false)
// for names not already set.
//
// Thread-safety: immutable after loading; Render may run concurrently.
#pragma once

#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "model/chat/jinja/template.h"

namespace kvserve {

class HfChatTemplate {
 public:
  // nullopt when `dir` holds neither file or its tokenizer_config.json has
  // no chat_template; an error names the file when one is malformed.
  static absl::StatusOr<std::optional<HfChatTemplate>> Load(const std::string& dir);
  // From tokenizer_config.json text (and a chat_template.jinja text, "" if
  // none); `where` names the source in errors.
  static absl::StatusOr<std::optional<HfChatTemplate>> FromConfig(std::string_view config_json,
                                                                  std::string_view jinja_text,
                                                                  const std::string& where);

  // messages: an array of OpenAI-style message objects; tools: null or an
  // array of tool definitions; extra: null or an object of more variables.
  absl::StatusOr<std::string> Render(const nlohmann::ordered_json& messages,
                                     bool add_generation_prompt,
                                     const nlohmann::ordered_json& tools = nullptr,
                                     const nlohmann::ordered_json& extra = nullptr) const;

  const std::optional<std::string>& bos_token() const { return bos_token_; }
  const std::optional<std::string>& eos_token() const { return eos_token_; }
  // The tool-call format the template's text writes (DetectToolCallFormat),
  // "" when it shows none.
  const std::string& tool_call_format() const { return tool_call_format_; }

 private:
  JinjaTemplate default_;
  std::optional<JinjaTemplate> tool_use_;
  std::optional<std::string> bos_token_;
  std::optional<std::string> eos_token_;
  std::string tool_call_format_;
};

// The tool-call format a chat template's source writes, from the markers
// each family's templates carry: "hermes" (<tool_call>: Hermes, Qwen),
// "mistral" ([TOOL_CALLS]), "llama3_json" (<|python_tag|> or the ipython
// role: Llama 3.1/3.2); "" when none appears.
std::string DetectToolCallFormat(std::string_view source);

}  // namespace kvserve

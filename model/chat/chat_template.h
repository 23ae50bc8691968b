// ChatTemplate: turns OpenAI chat messages into one prompt string, in one of
// two ways:
//   - the checkpoint's own Jinja chat template (HfChatTemplate, from the
//     model directory's tokenizer_config.json or chat_template.jinja), which
//     sees the whole messages (tool_calls, tool_call_id, name, ...), the
//     request's tools and extra variables, like transformers'
//     apply_chat_template;
//   - a pattern per role with {role} and {content} placeholders (a `default`
//     pattern covers roles without their own), plus a generation prompt
//     appended after the last message so the model answers as the
//     assistant. Placeholders are replaced in a single pass, so a message's
//     content is never itself expanded.
//
// Built-in patterns: "plain" (the fallback for models without a template:
// "user: hi\n" lines, then "assistant:"), "chatml" and "llama3".
// ForModelDir is what `model.chat_template: auto` resolves to.
//
// Thread-safety: immutable value type; Render may run concurrently.
//
// Example:
//   auto t = ChatTemplate::Builtin("plain");
//   t->Render({{"user", "Hi"}});  // "user: Hi\nassistant:"
#pragma once

#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <span>
#include <string>
#include <string_view>
#include <utility>

#include "absl/status/statusor.h"
#include "model/chat/hf_chat_template.h"

namespace kvserve {

struct ChatMessage {
  ChatMessage() = default;
  ChatMessage(std::string role, std::string content, nlohmann::ordered_json fields = nullptr)
      : role(std::move(role)), content(std::move(content)), fields(std::move(fields)) {}

  std::string role;
  std::string content;  // content parts already joined into text
  // The message object as the client sent it, for checkpoint templates
  // (null: just role and content). Its "content" is replaced by `content`.
  nlohmann::ordered_json fields;
};

struct ChatRenderOptions {
  // Whether to open the assistant's turn (a pattern's generation prompt).
  bool add_generation_prompt = true;
  nlohmann::ordered_json tools;      // null or the request's tool definitions
  nlohmann::ordered_json variables;  // null or more template variables
};

class ChatTemplate {
 public:
  // The "plain" template.
  ChatTemplate();

  static absl::StatusOr<ChatTemplate> Builtin(std::string_view name);
  // role_patterns: role name (or "default") -> pattern. Fails when a pattern
  // has an unknown {placeholder}.
  static absl::StatusOr<ChatTemplate> FromPatterns(std::map<std::string, std::string> role_patterns,
                                                   std::string generation_prompt);
  static ChatTemplate FromCheckpoint(HfChatTemplate hf);
  // The template of the Hugging Face model directory `dir`, or "plain" when
  // it has none (or `dir` is not a directory). Fails when the directory's
  // template files are malformed or the template does not parse.
  static absl::StatusOr<ChatTemplate> ForModelDir(const std::string& dir);
  // Placeholder for `model.chat_template: auto` until the config knows the
  // model directory; renders as "plain" and is named "auto".
  static ChatTemplate Auto();

  // Fails (InvalidArgument) only for checkpoint templates: a render error or
  // the template's raise_exception, whose message is kept verbatim.
  absl::StatusOr<std::string> Render(std::span<const ChatMessage> messages,
                                     const ChatRenderOptions& options = {}) const;

  // Whether the rendered prompt is encoded with the tokenizer's BOS.
  // Checkpoint templates write their special tokens themselves (transformers
  // encodes their output without special tokens); patterns rely on add_bos.
  bool add_bos() const { return !from_checkpoint(); }
  // Whether this is the checkpoint's own template (it reads ChatMessage
  // fields and ChatRenderOptions tools and variables).
  bool from_checkpoint() const { return hf_ != nullptr; }

  // "plain", "chatml", "llama3", "custom", "checkpoint" or "auto".
  const std::string& name() const { return name_; }
  // The tool-call format of the model's family ("hermes", "mistral",
  // "llama3_json"; "" unknown: every format is tried): a checkpoint
  // template's own markers (DetectToolCallFormat) unless set
  // (model.tool_call_format).
  const std::string& tool_call_format() const { return tool_call_format_; }
  void set_tool_call_format(std::string format) { tool_call_format_ = std::move(format); }

 private:
  std::string name_;
  std::map<std::string, std::string> role_patterns_;
  std::string generation_prompt_;
  std::shared_ptr<const HfChatTemplate> hf_;
  std::string tool_call_format_;
};

}  // namespace kvserve

// ChatTemplate: turns OpenAI chat messages into one prompt string. A template
// is one pattern per role with {role} and {content} placeholders (a `default`
// pattern covers roles without their own), plus a generation prompt appended
// after the last message so the model answers as the assistant.
//
// Built-ins: "plain" (the default for models without a template: "user: hi\n"
// lines, then "assistant:"), "chatml" and "llama3".
//
// Placeholders are replaced in a single pass, so a message's content is never
// itself expanded. Thread-safety: immutable value type.
//
// Example:
//   auto t = ChatTemplate::Builtin("plain");
//   t->Render({{"user", "Hi"}});  // "user: Hi\nassistant:"
#pragma once

#include <map>
#include <span>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"

namespace kvserve {

struct ChatMessage {
  std::string role;
  std::string content;
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

  std::string Render(std::span<const ChatMessage> messages) const;

  // "plain", "chatml", "llama3" or "custom".
  const std::string& name() const { return name_; }

 private:
  std::string name_;
  std::map<std::string, std::string> role_patterns_;
  std::string generation_prompt_;
};

}  // namespace kvserve

#include "server/chat_template.h"

#include <utility>

#include "absl/strings/str_cat.h"

namespace kvserve {
namespace {

constexpr std::string_view kRole = "{role}";
constexpr std::string_view kContent = "{content}";

// Appends `pattern` with its placeholders filled in, in one pass.
void Expand(std::string_view pattern, const ChatMessage& m, std::string* out) {
  size_t i = 0;
  while (i < pattern.size()) {
    if (pattern.compare(i, kRole.size(), kRole) == 0) {
      out->append(m.role);
      i += kRole.size();
    } else if (pattern.compare(i, kContent.size(), kContent) == 0) {
      out->append(m.content);
      i += kContent.size();
    } else {
      out->push_back(pattern[i++]);
    }
  }
}

absl::Status CheckPlaceholders(const std::string& key, std::string_view pattern) {
  for (size_t open = pattern.find('{'); open != std::string_view::npos;
       open = pattern.find('{', open + 1)) {
    size_t close = pattern.find('}', open);
    if (close == std::string_view::npos) break;
    std::string_view name = pattern.substr(open, close - open + 1);
    if (name != kRole && name != kContent) {
      return absl::InvalidArgumentError(absl::StrCat(
          key, ": unknown placeholder ", std::string(name), " (known: {role}, {content})"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

ChatTemplate::ChatTemplate()
    : name_("plain"),
      role_patterns_{{"default", "{role}: {content}\n"}},
      generation_prompt_("assistant:") {}

absl::StatusOr<ChatTemplate> ChatTemplate::Builtin(std::string_view name) {
  ChatTemplate t;
  if (name == "plain") return t;
  if (name == "chatml") {
    t.name_ = "chatml";
    t.role_patterns_ = {{"default", "<|im_start|>{role}\n{content}<|im_end|>\n"}};
    t.generation_prompt_ = "<|im_start|>assistant\n";
    return t;
  }
  if (name == "llama3") {
    // BOS (<|begin_of_text|>) comes from the tokenizer's add_bos.
    t.name_ = "llama3";
    t.role_patterns_ = {
        {"default", "<|start_header_id|>{role}<|end_header_id|>\n\n{content}<|eot_id|>"}};
    t.generation_prompt_ = "<|start_header_id|>assistant<|end_header_id|>\n\n";
    return t;
  }
  return absl::InvalidArgumentError(absl::StrCat("unknown chat template '", std::string(name),
                                                 "' (built-ins: plain, chatml, llama3)"));
}

absl::StatusOr<ChatTemplate> ChatTemplate::FromPatterns(
    std::map<std::string, std::string> role_patterns, std::string generation_prompt) {
  for (const auto& [role, pattern] : role_patterns) {
    if (absl::Status s = CheckPlaceholders(role, pattern); !s.ok()) return s;
  }
  ChatTemplate t;
  t.name_ = "custom";
  // Roles without a pattern of their own fall back to the plain line format.
  role_patterns.try_emplace("default", "{role}: {content}\n");
  t.role_patterns_ = std::move(role_patterns);
  t.generation_prompt_ = std::move(generation_prompt);
  return t;
}

std::string ChatTemplate::Render(std::span<const ChatMessage> messages) const {
  std::string out;
  for (const ChatMessage& m : messages) {
    auto it = role_patterns_.find(m.role);
    if (it == role_patterns_.end()) it = role_patterns_.find("default");
    Expand(it->second, m, &out);
  }
  out.append(generation_prompt_);
  return out;
}

}  // namespace kvserve

#include "model/chat/chat_template.h"

#include <filesystem>
#include <utility>

#include "absl/strings/str_cat.h"

namespace kvserve {
namespace {

using ojson = nlohmann::ordered_json;

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

// The message as a checkpoint template sees it. Assistant tool-call
// arguments sent as a JSON string (as OpenAI clients send them) become
// objects, as vLLM passes them, so templates that apply `tojson` to them
// render JSON rather than a quoted string.
constexpr int kMaxArgumentsDepth = 64;

ojson TemplateMessage(const ChatMessage& m) {
  ojson msg = m.fields.is_object() ? m.fields : ojson::object();
  msg["role"] = m.role;
  msg["content"] = m.content;
  auto calls = msg.find("tool_calls");
  if (calls == msg.end() || !calls->is_array()) return msg;
  for (ojson& call : *calls) {
    if (!call.is_object() || !call.contains("function") || !call["function"].is_object()) continue;
    ojson& fn = call["function"];
    auto args = fn.find("arguments");
    if (args == fn.end() || !args->is_string()) continue;
    // Arguments nested deeper than a request body stay a string (see
    // kMaxJsonDepth in openai_protocol.h: templates dump them recursively).
    bool too_deep = false;
    ojson parsed = ojson::parse(
        args->get<std::string>(),
        [&too_deep](int depth, ojson::parse_event_t, ojson&) {
          too_deep = too_deep || depth > kMaxArgumentsDepth;
          return true;
        },
        /*allow_exceptions=*/false);
    if (parsed.is_object() && !too_deep) *args = std::move(parsed);
  }
  return msg;
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

ChatTemplate ChatTemplate::FromCheckpoint(HfChatTemplate hf) {
  ChatTemplate t;
  t.name_ = "checkpoint";
  t.role_patterns_.clear();
  t.generation_prompt_.clear();
  t.tool_call_format_ = hf.tool_call_format();
  t.hf_ = std::make_shared<const HfChatTemplate>(std::move(hf));
  return t;
}

absl::StatusOr<ChatTemplate> ChatTemplate::ForModelDir(const std::string& dir) {
  std::error_code ec;
  if (dir.empty() || !std::filesystem::is_directory(dir, ec)) return ChatTemplate();
  absl::StatusOr<std::optional<HfChatTemplate>> hf = HfChatTemplate::Load(dir);
  if (!hf.ok()) return hf.status();
  if (!hf->has_value()) return ChatTemplate();
  return FromCheckpoint(**std::move(hf));
}

ChatTemplate ChatTemplate::Auto() {
  ChatTemplate t;
  t.name_ = "auto";
  return t;
}

absl::StatusOr<std::string> ChatTemplate::Render(std::span<const ChatMessage> messages,
                                                 const ChatRenderOptions& options) const {
  if (hf_ != nullptr) {
    ojson list = ojson::array();
    for (const ChatMessage& m : messages) list.push_back(TemplateMessage(m));
    return hf_->Render(list, options.add_generation_prompt, options.tools, options.variables);
  }
  std::string out;
  for (const ChatMessage& m : messages) {
    auto it = role_patterns_.find(m.role);
    if (it == role_patterns_.end()) it = role_patterns_.find("default");
    Expand(it->second, m, &out);
  }
  if (options.add_generation_prompt) out.append(generation_prompt_);
  return out;
}

}  // namespace kvserve

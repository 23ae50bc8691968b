#include "server/openai/tool_calls.h"

#include "absl/strings/str_cat.h"

namespace kvserve {
namespace {

using json = nlohmann::json;

std::string_view Trim(std::string_view s) {
  while (!s.empty() &&
         (s.front() == ' ' || s.front() == '\n' || s.front() == '\t' || s.front() == '\r')) {
    s.remove_prefix(1);
  }
  while (!s.empty() &&
         (s.back() == ' ' || s.back() == '\n' || s.back() == '\t' || s.back() == '\r')) {
    s.remove_suffix(1);
  }
  return s;
}

// {"name": string, "arguments" | "parameters": object or JSON text}.
bool CallFromJson(const json& j, ParsedToolCall* out) {
  if (!j.is_object() || !j.contains("name") || !j["name"].is_string()) return false;
  const json* args = nullptr;
  for (const char* key : {"arguments", "parameters"}) {
    if (j.contains(key)) args = &j[key];
  }
  out->name = j["name"].get<std::string>();
  if (args == nullptr) {
    out->arguments = "{}";
  } else if (args->is_string()) {
    out->arguments = args->get<std::string>();
  } else if (args->is_object()) {
    out->arguments = args->dump();
  } else {
    return false;
  }
  return true;
}

json Parse(std::string_view text) {
  return json::parse(text.begin(), text.end(), nullptr, /*allow_exceptions=*/false);
}

bool Hermes(std::string_view text, ParsedToolCalls* out) {
  constexpr std::string_view kOpen = "<tool_call>", kClose = "</tool_call>";
  ParsedToolCalls r;
  size_t pos = 0;
  while (true) {
    const size_t open = text.find(kOpen, pos);
    if (open == std::string_view::npos) break;
    size_t close = text.find(kClose, open + kOpen.size());
    const bool closed = close != std::string_view::npos;
    if (!closed) close = text.size();  // a last call cut short of its tag
    ParsedToolCall call;
    if (!CallFromJson(Parse(Trim(text.substr(open + kOpen.size(), close - open - kOpen.size()))),
                      &call)) {
      return false;
    }
    r.content += text.substr(pos, open - pos);
    r.calls.push_back(std::move(call));
    pos = closed ? close + kClose.size() : text.size();
  }
  if (r.calls.empty()) return false;
  r.content += text.substr(pos);
  r.content = std::string(Trim(r.content));
  *out = std::move(r);
  return true;
}

bool Llama3Json(std::string_view text, ParsedToolCalls* out) {
  std::string_view t = Trim(text);
  constexpr std::string_view kPythonTag = "<|python_tag|>";
  if (t.substr(0, kPythonTag.size()) == kPythonTag) t = Trim(t.substr(kPythonTag.size()));
  // Several calls may be separated by ';' (Llama 3.2's template allows it).
  ParsedToolCalls r;
  const json whole = Parse(t);
  ParsedToolCall call;
  if (CallFromJson(whole, &call)) {
    r.calls.push_back(std::move(call));
  } else {
    size_t pos = 0;
    while (pos <= t.size()) {
      size_t semi = t.find(';', pos);
      if (semi == std::string_view::npos) semi = t.size();
      ParsedToolCall c;
      if (!CallFromJson(Parse(Trim(t.substr(pos, semi - pos))), &c)) return false;
      r.calls.push_back(std::move(c));
      pos = semi + 1;
    }
  }
  *out = std::move(r);
  return true;
}

bool Mistral(std::string_view text, ParsedToolCalls* out) {
  std::string_view t = Trim(text);
  const size_t marker = t.find("[TOOL_CALLS]");
  std::string content;
  if (marker != std::string_view::npos) {
    content = std::string(Trim(t.substr(0, marker)));
    t = Trim(t.substr(marker + std::string_view("[TOOL_CALLS]").size()));
  }
  const json arr = Parse(t);
  if (!arr.is_array() || arr.empty()) return false;
  ParsedToolCalls r;
  for (const json& j : arr) {
    ParsedToolCall c;
    if (!CallFromJson(j, &c)) return false;
    r.calls.push_back(std::move(c));
  }
  r.content = std::move(content);
  *out = std::move(r);
  return true;
}

}  // namespace

ToolCallFormat ToolCallFormatNamed(std::string_view name) {
  if (name == "hermes") return ToolCallFormat::kHermes;
  if (name == "llama3_json") return ToolCallFormat::kLlama3Json;
  if (name == "mistral") return ToolCallFormat::kMistral;
  return ToolCallFormat::kAuto;
}

ToolCallFrame ConstrainedCallFrame(ToolCallFormat format) {
  switch (format) {
    case ToolCallFormat::kHermes:
      return {"<tool_call>\n", "\n</tool_call>"};
    case ToolCallFormat::kMistral:
      return {"[TOOL_CALLS][", "]"};
    case ToolCallFormat::kAuto:
    case ToolCallFormat::kLlama3Json:
      break;
  }
  return {"", ""};
}

ParsedToolCalls ParseToolCalls(std::string_view text, ToolCallFormat format) {
  ParsedToolCalls r;
  const bool all = format == ToolCallFormat::kAuto;
  if ((all || format == ToolCallFormat::kHermes) && Hermes(text, &r)) return r;
  if ((all || format == ToolCallFormat::kMistral) && Mistral(text, &r)) return r;
  if ((all || format == ToolCallFormat::kLlama3Json) && Llama3Json(text, &r)) return r;
  r.calls.clear();
  r.content = std::string(text);
  return r;
}

json ToolCallsJson(const std::vector<ParsedToolCall>& calls, const std::string& id) {
  json out = json::array();
  for (size_t k = 0; k < calls.size(); ++k) {
    out.push_back({{"id", absl::StrCat("call_", id, "_", k)},
                   {"type", "function"},
                   {"function", {{"name", calls[k].name}, {"arguments", calls[k].arguments}}}});
  }
  return out;
}

}  // namespace kvserve

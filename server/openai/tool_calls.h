// Tool calls in a model's output text -> OpenAI message.tool_calls, by the
// format of the model family:
//   hermes (Hermes, Qwen 2/2.5/3):  <tool_call>{"name": ..., "arguments": {...}}</tool_call>
//                                   (one block per call, text around kept as content);
//   llama3_json (Llama 3.1/3.2):    the whole output one {"name": ..., "parameters": {...}}
//                                   object (or "arguments"), optionally after <|python_tag|>;
//   mistral:                        [TOOL_CALLS] then a JSON array of {"name", "arguments"}
//                                   (the marker may be missing when it decodes to nothing).
// kAuto tries them in that order. Text that holds no well-formed call is
// left as content (no tool_calls), as vLLM's parsers do.
//
// Thread-safety: free functions.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

namespace kvserve {

enum class ToolCallFormat : unsigned char { kAuto, kHermes, kLlama3Json, kMistral };

struct ParsedToolCall {
  std::string name;
  std::string arguments;  // JSON text, as the OpenAI API carries it
};

struct ParsedToolCalls {
  std::string content;  // the text outside the calls
  std::vector<ParsedToolCall> calls;
};

ParsedToolCalls ParseToolCalls(std::string_view text, ToolCallFormat format);

// "hermes", "llama3_json", "mistral" -> that format; anything else (the ""
// of a template without markers) -> kAuto.
ToolCallFormat ToolCallFormatNamed(std::string_view name);

// The text around the {"name", "arguments"} JSON of a call that decoding is
// constrained to (tool_choice "required" or a named function), so the
// output reads as the family writes it: hermes "<tool_call>\n" ...
// "\n</tool_call>", mistral "[TOOL_CALLS][" ... "]", llama3_json and kAuto
// bare JSON.
struct ToolCallFrame {
  std::string_view prefix, suffix;
};
ToolCallFrame ConstrainedCallFrame(ToolCallFormat format);

// The OpenAI tool_calls array ("call_<id>_<k>" ids).
nlohmann::json ToolCallsJson(const std::vector<ParsedToolCall>& calls, const std::string& id);

}  // namespace kvserve

#pragma once

// Parsing a request body into JSON without letting the parser's exceptions
// out: whatever nlohmann::json can throw while parsing (syntax errors,
// invalid UTF-8, numbers that overflow a double such as 1e309) becomes a
// JsonBodyError naming where in the body it happened, as an OpenAI `param`
// path ("messages[0].content", "logit_bias.5").

#include <cstddef>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <variant>

namespace kvserve {

struct JsonBodyError {
  enum class Kind {
    kSyntax,      // not JSON (or not UTF-8)
    kOutOfRange,  // a number no double can hold
    kTooDeep,     // nested deeper than max_depth
  };
  Kind kind = Kind::kSyntax;
  std::string path;     // "" for the body itself or a syntax error before any field
  std::string message;  // says what and where; client text in it is capped
};

// Parses `body`; arrays and objects nested deeper than max_depth (the body's
// own object counting 1) are refused. Never throws for any input.
std::variant<nlohmann::json, JsonBodyError> ParseJsonBody(std::string_view body, int max_depth);

// The same for member order kept (chat templates dump tool schemas in order).
std::variant<nlohmann::ordered_json, JsonBodyError> ParseOrderedJsonBody(std::string_view body,
                                                                         int max_depth);

// A client string for an error message or a log line: at most max_bytes of it
// (cut at a UTF-8 boundary), followed by "... (N bytes)" when cut.
std::string CapClientText(std::string_view s, size_t max_bytes = 64);

}  // namespace kvserve

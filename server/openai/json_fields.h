// Reading the fields of an OpenAI request body (nlohmann::json) with
// OpenAI-style errors: each getter leaves *out unset when the field is
// absent or null, and returns an ApiError naming the field ('temperature'
// must be a number, got a string) when it has another type or no finite
// value. For openai_request.cc and the request parsers beside it.
//
// Thread-safety: pure functions.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "server/openai/openai_protocol.h"

namespace kvserve::json_fields {

using json = nlohmann::json;

// A value's JSON type as the errors name it: "a string", "an integer", ...
const char* TypeName(const json& v);

// "'param' must be EXPECTED, got TYPE".
ApiError WrongType(const std::string& param, const char* expected, const json& got);

// The member, or nullptr when absent or null (null means "not given").
const json* Member(const json& obj, const char* name);

std::optional<ApiError> GetNumber(const json& obj, const char* name, std::optional<double>* out);

// Integers; a float with an integral value (3.0) is accepted as JSON allows.
std::optional<ApiError> GetInt(const json& obj, const char* name, std::optional<int64_t>* out);

std::optional<ApiError> GetBool(const json& obj, const char* name, std::optional<bool>* out);

std::optional<ApiError> GetString(const json& obj, const char* name,
                                  std::optional<std::string>* out);

// "'param' must be RULE, got GOT".
ApiError OutOfRange(const char* param, const std::string& rule, const std::string& got);

// Reads an array of token ids, each in [0, vocab).
std::optional<ApiError> GetTokenIds(const json& arr, const std::string& param, int vocab,
                                    std::vector<int32_t>* out);

}  // namespace kvserve::json_fields

// /tokenize and /detokenize in vLLM's shapes, so clients count tokens with
// the server's own tokenizer and chat template.
//
//   POST /tokenize   {"prompt": "text", "add_special_tokens": true}
//                 or {"messages": [...], "add_generation_prompt": true, ...}
//     -> {"count": N, "max_model_len": M, "tokens": [ids], "token_strs": null}
//     ("return_token_strs": true fills token_strs with each token's piece).
//     Messages are rendered with the chat template exactly as
//     /v1/chat/completions renders them.
//   POST /detokenize {"tokens": [ids]} -> {"prompt": "text"}
// "model", when given, must name the served model (404 otherwise, as the
// completion routes do).
//
// Thread-safety: free functions.
#pragma once

#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "server/openai/openai_protocol.h"

namespace kvserve {

std::optional<ApiError> Tokenize(const std::string& body, const ApiContext& ctx,
                                 nlohmann::json* response);
std::optional<ApiError> Detokenize(const std::string& body, const ApiContext& ctx,
                                   nlohmann::json* response);

}  // namespace kvserve

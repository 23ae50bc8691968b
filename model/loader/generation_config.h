// generation_config.json of a Hugging Face checkpoint: which tokens end
// generation and the sampling defaults the model was released with.
//
//   {"eos_token_id": [128001, 128008, 128009], "temperature": 0.6,
//    "top_p": 0.9, "top_k": 50, "do_sample": true, ...}
//
// eos_token_id (an id or a list) adds every id to ModelConfig::stop_ids;
// temperature, top_p and top_k become ModelConfig's default_* (top_k 0 is
// off, as in SamplingParams). do_sample is not read: like vLLM, kvserve takes
// the values as the defaults whatever it says. Other fields are ignored.
// Errors are InvalidArgument naming the file and the field.
//
// Thread-safety: plain functions.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "model/model_config.h"

namespace kvserve {

// An HF "*_token_id" value: one id or a list of ids (`path` and `field`
// name it in the error).
absl::StatusOr<std::vector<int32_t>> ParseTokenIds(const nlohmann::json& value,
                                                   const std::string& path,
                                                   const std::string& field);

// Reads the generation_config.json at `path` into *config.
absl::Status ApplyGenerationConfig(const std::string& path, ModelConfig* config);

}  // namespace kvserve

// ReadJsonFile: a whole JSON file parsed with nlohmann::json. Every error
// names the file: NotFound when it cannot be opened, InvalidArgument when it
// is not JSON.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "absl/status/statusor.h"

namespace kvserve {

absl::StatusOr<nlohmann::json> ReadJsonFile(const std::string& path);

}  // namespace kvserve

// Fuzzes the YAML config loader (server/config/config.h, ParseServeConfig).
//
// Input: YAML text; after a NUL byte, optional "key.path=value" override
// lines. Whatever it accepts must convert to an engine config.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/strings/str_split.h"
#include "fuzz_util.h"
#include "server/config/config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace kvserve;
  std::string_view in(reinterpret_cast<const char*>(data), size);
  std::string yaml(in.substr(0, in.find('\0')));
  std::vector<std::string> overrides;
  if (yaml.size() < in.size()) {
    const std::string rest(in.substr(yaml.size() + 1));
    for (absl::string_view line : absl::StrSplit(rest, '\n')) {
      if (!line.empty()) overrides.emplace_back(line);
    }
  }
  absl::StatusOr<ServeConfig> config = ParseServeConfig(yaml, "/nonexistent-base", overrides);
  if (!config.ok()) {
    FUZZ_CHECK(!config.status().message().empty());
    return 0;
  }
  (void)config->ToEngineConfig();
  return 0;
}

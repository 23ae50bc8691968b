// The scalar values of a config file and its --set overrides: ${VAR}
// expansion and the parsers of integers, numbers, booleans, byte sizes,
// durations and names, each failing with the key and what it expected
// (InvalidArgument "KEY: expected WHAT, got 'TEXT'"). config.cc's field table
// is built on them.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace kvserve::config_values {

// InvalidArgument "KEY: expected EXPECTED, got 'GOT'".
absl::Status Bad(const std::string& key, const std::string& expected, const std::string& got);

// ${VAR} and ${VAR:-fallback} (the fallback may itself hold ${...}); an
// unset or empty VAR without a fallback is an error naming it.
absl::StatusOr<std::string> ExpandEnv(const std::string& key, const std::string& text);

// An integer in [min, max], else Bad(key, expected, text).
absl::StatusOr<int64_t> ParseInt(const std::string& key, const std::string& text, int64_t min,
                                 int64_t max, const std::string& expected);
// A finite number.
absl::StatusOr<double> ParseDouble(const std::string& key, const std::string& text,
                                   const std::string& expected);
// true/yes/on/1 or false/no/off/0, any case.
absl::StatusOr<bool> ParseBool(const std::string& key, const std::string& text);
// A plain count is bytes; units as util/byte_size.h's ParseByteSize.
absl::StatusOr<int64_t> ParseBytes(const std::string& key, const std::string& text);
// Seconds >= 0 as a number, optionally with an "s", "ms" or "m" suffix.
absl::StatusOr<double> ParseSeconds(const std::string& key, const std::string& text);
// One of `allowed`, surrounding whitespace stripped.
absl::StatusOr<std::string> ParseEnum(const std::string& key, const std::string& text,
                                      const std::vector<std::string>& allowed);

}  // namespace kvserve::config_values

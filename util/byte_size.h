// Byte sizes in text: ParseByteSize is the one parser for config keys, CLI
// flags and environment variables (cache.memory_bytes, `kvserve plan
// --memory`, KVSERVE_DUMMY_MAX_BYTES); FormatBytes prints both unit systems.
// IEC units are powers of 1024 (KiB MiB GiB TiB, or Kubernetes' Ki Mi Gi
// Ti), SI units powers of 1000 (kB MB GB TB, and as in Kubernetes
// quantities the bare k M G T); B is bytes; any case.
//
// Thread-safety: pure functions.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"

namespace kvserve {

// "80GiB" -> 85899345920, "80GB" -> 80000000000, "1.5KiB" -> 1536, "4096B"
// -> 4096; "4096" -> 4096 unless the unit is required. `what` names the flag
// or field in the error (InvalidArgument).
enum class ByteSizeUnit : uint8_t { kOptional, kRequired };
absl::StatusOr<int64_t> ParseByteSize(std::string_view text, std::string_view what = "size",
                                      ByteSizeUnit unit = ByteSizeUnit::kOptional);

// "40.00 GiB (42.95 GB)"; below 1 MiB: "327680 B (320.0 KiB)".
std::string FormatBytes(int64_t bytes);

}  // namespace kvserve

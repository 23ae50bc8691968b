#include "util/byte_size.h"

#include <cmath>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace kvserve {

absl::StatusOr<int64_t> ParseByteSize(std::string_view text, std::string_view what,
                                      ByteSizeUnit unit) {
  const std::string t(absl::StripAsciiWhitespace(absl::string_view(text.data(), text.size())));
  auto bad = [&](std::string_view why) {
    return absl::InvalidArgumentError(absl::StrCat(
        std::string(what), ": '", std::string(text), "' ", std::string(why),
        unit == ByteSizeUnit::kRequired ? " (e.g. 80GiB = 80 x 1024^3, 80GB = 80 x 1000^3, 4096B)"
                                        : " (e.g. 80GiB = 80 x 1024^3, 80GB = 80 x 1000^3, "
                                          "or a plain byte count)"));
  };
  size_t i = 0;
  while (i < t.size() && (absl::ascii_isdigit(static_cast<unsigned char>(t[i])) || t[i] == '.')) {
    ++i;
  }
  double value = 0;
  if (i == 0 || !absl::SimpleAtod(t.substr(0, i), &value)) return bad("is not a byte size");
  const std::string suffix = absl::AsciiStrToLower(absl::StripLeadingAsciiWhitespace(t.substr(i)));
  // IEC units are powers of 1024, SI units (and, as in Kubernetes
  // quantities, the bare letters) powers of 1000. Case does not matter.
  static constexpr std::pair<const char*, double> kUnits[] = {
      {"b", 1.0},      {"k", 1e3},     {"kb", 1e3},     {"m", 1e6},     {"mb", 1e6},
      {"g", 1e9},      {"gb", 1e9},    {"t", 1e12},     {"tb", 1e12},   {"ki", 0x1p10},
      {"kib", 0x1p10}, {"mi", 0x1p20}, {"mib", 0x1p20}, {"gi", 0x1p30}, {"gib", 0x1p30},
      {"ti", 0x1p40},  {"tib", 0x1p40}};
  double mult = 0;
  if (suffix.empty()) {
    if (unit == ByteSizeUnit::kRequired) return bad("has no unit");
    mult = 1;
  } else {
    for (const auto& [name, m] : kUnits) {
      if (suffix == name) mult = m;
    }
    if (mult == 0) return bad("has an unknown unit");
  }
  const double bytes = std::round(value * mult);
  if (!(bytes >= 0) || bytes > 9.2e18) return bad("is out of range");
  if (mult == 1 && value != std::floor(value)) return bad("is not a whole number of bytes");
  return static_cast<int64_t>(bytes);
}

std::string FormatBytes(int64_t bytes) {
  const double b = static_cast<double>(bytes);
  if (bytes >= (int64_t{1} << 30)) {
    return absl::StrFormat("%.2f GiB (%.2f GB)", b / (1 << 30), b / 1e9);
  }
  if (bytes >= (int64_t{1} << 20)) {
    return absl::StrFormat("%.2f MiB (%.2f MB)", b / (1 << 20), b / 1e6);
  }
  if (bytes >= 1024) return absl::StrFormat("%d B (%.1f KiB)", bytes, b / 1024);
  return absl::StrFormat("%d B", bytes);
}

}  // namespace kvserve

#include "model/loader/weight_check.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>

#include "absl/strings/str_cat.h"

namespace kvserve {
namespace {

constexpr uint32_t kExponentMask = 0x7f800000u;  // all ones: NaN or infinity
constexpr int64_t kBlock = 4096;

}  // namespace

int64_t FirstNonFinite(const float* x, int64_t n) {
  for (int64_t begin = 0; begin < n; begin += kBlock) {
    const int64_t end = std::min(n, begin + kBlock);
    uint32_t bad = 0;
    for (int64_t i = begin; i < end; ++i) {
      uint32_t bits;
      std::memcpy(&bits, x + i, sizeof(bits));
      bad |= static_cast<uint32_t>((bits & kExponentMask) == kExponentMask);
    }
    if (bad != 0) {
      for (int64_t i = begin; i < end; ++i) {
        if (!std::isfinite(x[i])) return i;
      }
    }
  }
  return -1;
}

absl::Status CheckFinite(const float* x, int64_t n, std::string_view tensor,
                         std::string_view path) {
  const int64_t i = FirstNonFinite(x, n);
  if (i < 0) return absl::OkStatus();
  const char* what = std::isnan(x[i]) ? "NaN" : (x[i] > 0 ? "+Inf" : "-Inf");
  return absl::DataLossError(absl::StrCat(std::string(path), ": tensor '", std::string(tensor),
                                          "' holds ", what, " at element ", i, " (of ", n,
                                          "); the checkpoint is corrupt"));
}

}  // namespace kvserve

#include "cache/format/kv_cross_layer.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace kvserve {

int KvCrossLayerSpec::RetainSlots(int block_size) const {
  const int slots = static_cast<int>(std::lround(retain * block_size));
  return std::clamp(slots, 1, std::min(block_size, 254));
}

KvCrossRole KvCrossLayerSpec::RoleOf(int layer, int num_layers) const {
  if (!enabled() || layer < from_layer) return KvCrossRole::kNone;
  if ((layer - from_layer) % 2 == 0) {
    return layer + 1 < num_layers ? KvCrossRole::kBase : KvCrossRole::kNone;
  }
  return KvCrossRole::kShared;
}

absl::Status KvCrossLayerSpec::Validate(int num_layers) const {
  if (!enabled()) return absl::OkStatus();
  if (from_layer + 1 >= num_layers) {
    return absl::InvalidArgumentError(absl::StrCat("cache.cross_layer.from_layer: ", from_layer,
                                                   " leaves no pair of layers (the ", "model has ",
                                                   num_layers, "; at most ", num_layers - 2, ")"));
  }
  if (!(threshold >= 0.0 && threshold <= 1.0)) {
    return absl::InvalidArgumentError(absl::StrCat("cache.cross_layer.threshold: ", threshold,
                                                   " is not an angle / pi in [0, 1]"));
  }
  if (!(retain > 0.0 && retain <= 1.0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("cache.cross_layer.retain: ", retain, " is not a fraction in (0, 1]"));
  }
  return absl::OkStatus();
}

std::string KvCrossLayerSpec::ToString() const {
  return absl::StrCat(from_layer, ":", threshold, ":", retain);
}

absl::StatusOr<KvCrossLayerSpec> ParseKvCrossLayer(std::string_view text, std::string_view what) {
  const absl::string_view t(text.data(), text.size());
  const std::vector<absl::string_view> parts = absl::StrSplit(t, ':');
  KvCrossLayerSpec s;
  auto bad = [&] {
    return absl::InvalidArgumentError(
        absl::StrCat(absl::string_view(what.data(), what.size()), ": '", t,
                     "' is not L[:T[:R]] (first merged layer, threshold, retained fraction)"));
  };
  if (parts.size() > 3 || !absl::SimpleAtoi(parts[0], &s.from_layer) || s.from_layer < 0) {
    return bad();
  }
  if (parts.size() > 1 && !absl::SimpleAtod(parts[1], &s.threshold)) return bad();
  if (parts.size() > 2 && !absl::SimpleAtod(parts[2], &s.retain)) return bad();
  return s;
}

}  // namespace kvserve

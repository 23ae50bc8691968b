// KvCrossLayerSpec: the cache.cross_layer setting (MiniCache-style cross-layer
// KV sharing; the page layout is in kv_layout.h, the merge and its attention
// in kernels/cpu/attention/cross_layer_attention.h). Layers pair up from
// from_layer on: (L, L+1), (L+2, L+3), ... while both exist; an odd last
// layer stays plain. When a block fills, each token whose two layers'
// directions are within `threshold` (angle / pi, the largest over the kv
// heads, K and V) is merged: one stored direction plus both layers'
// magnitudes; of the others, the retain * block_size with the largest
// distance (ties: the lower slot) keep layer l+1 whole in the shared page's
// retention area, and the rest are merged anyway.
//
// Example: {from_layer: 2, threshold: 0.1, retain: 0.125} on stories260K (5
// layers, block 16) pairs (2, 3), leaves 4 plain, and keeps up to 2 tokens a
// block unmerged.
//
// Thread-safety: immutable value type.
#pragma once

#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "cache/format/kv_layout.h"

namespace kvserve {

struct KvCrossLayerSpec {
  static constexpr double kDefaultThreshold = 0.1;
  static constexpr double kDefaultRetain = 0.125;

  int from_layer = -1;  // -1: off
  double threshold = kDefaultThreshold;
  double retain = kDefaultRetain;

  bool enabled() const { return from_layer >= 0; }
  // Retention slots of a block: retain * block_size rounded to nearest, at
  // least 1 and at most min(block_size, 254).
  int RetainSlots(int block_size) const;
  // Layer l's part (kNone when off, below from_layer, or an odd last layer).
  KvCrossRole RoleOf(int layer, int num_layers) const;
  // InvalidArgument naming the cache.cross_layer.* field that is out of range.
  absl::Status Validate(int num_layers) const;
  // "L:T:R", the form ParseKvCrossLayer reads.
  std::string ToString() const;
};

// "L", "L:T" or "L:T:R" (eval-kv --cross-layer, kvserve plan). InvalidArgument
// names `what`.
absl::StatusOr<KvCrossLayerSpec> ParseKvCrossLayer(std::string_view text, std::string_view what);

}  // namespace kvserve

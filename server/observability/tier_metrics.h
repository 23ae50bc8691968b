// TierMetrics: the KV tiers' Prometheus series (cache/tier/kv_tiers.h),
// labelled tier="device"|"host"|"disk"|"remote": hit and miss blocks,
// tokens and bytes loaded and stored, bytes used, write-through drops, load timeouts,
// rejected values by cause, and the load latency histogram. Registered by
// ServerMetrics at the first scrape whose engine has tiers; refreshed, like
// the rest, by the growth since the previous scrape.
//
// Thread-safety: ServerMetrics calls it under its own lock.
#pragma once

#include <array>

#include "cache/tier/kv_tiers.h"

namespace prometheus {
class Registry;
class Counter;
class Gauge;
class Histogram;
}  // namespace prometheus

namespace kvserve {

class TierMetrics {
 public:
  explicit TierMetrics(prometheus::Registry& registry);
  void Update(const TierStats& now, const TierStats& before);

 private:
  struct PerTier {
    prometheus::Counter* hits;
    prometheus::Counter* misses;
    prometheus::Counter* loaded_tokens;
    prometheus::Counter* loaded_bytes;
    prometheus::Counter* stored_tokens;
    prometheus::Counter* stored_bytes;
    prometheus::Counter* drops;
    prometheus::Counter* timeouts;
    std::array<prometheus::Counter*, kNumTierRejects> rejects;
    prometheus::Gauge* bytes_used;
    prometheus::Histogram* load_seconds;
  };
  std::array<PerTier, kNumTiers> tiers_;
};

}  // namespace kvserve

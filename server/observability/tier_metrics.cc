#include "server/observability/tier_metrics.h"

#include <prometheus/counter.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>

#include <string>
#include <vector>

namespace kvserve {
namespace {

void Advance(prometheus::Counter& c, int64_t now, int64_t before) {
  if (now > before) c.Increment(static_cast<double>(now - before));
}

prometheus::Family<prometheus::Counter>& Counters(prometheus::Registry& r, const std::string& name,
                                                  const std::string& help) {
  return prometheus::BuildCounter().Name(name).Help(help).Register(r);
}

}  // namespace

TierMetrics::TierMetrics(prometheus::Registry& r) {
  auto& hits = Counters(r, "kvserve_kv_tier_hit_blocks_total",
                        "Prefix blocks a prompt found in each KV tier.");
  auto& misses = Counters(r, "kvserve_kv_tier_miss_blocks_total",
                          "Prefix blocks a tier was asked for and did not hold.");
  auto& loaded_tokens = Counters(r, "kvserve_kv_tier_loaded_tokens_total",
                                 "Tokens of KV loaded from each tier into the device pool.");
  auto& loaded_bytes = Counters(r, "kvserve_kv_tier_loaded_bytes_total",
                                "Bytes of KV loaded from each tier into the device pool.");
  auto& stored_tokens =
      Counters(r, "kvserve_kv_tier_stored_tokens_total", "Tokens of KV stored in each tier.");
  auto& stored_bytes =
      Counters(r, "kvserve_kv_tier_stored_bytes_total", "Bytes of KV values stored in each tier.");
  auto& drops = Counters(r, "kvserve_kv_tier_write_drops_total",
                         "Values a tier did not take (full queue, Redis down, full disk).");
  auto& timeouts = Counters(r, "kvserve_kv_tier_load_timeouts_total",
                            "Background loads past cache.tier_load_timeout_ms (the prompt was "
                            "recomputed).");
  auto& rejects = Counters(r, "kvserve_kv_tier_rejected_blocks_total",
                           "Values refused on load, by cause (truncated, corrupt, foreign, "
                           "mismatch).");
  auto& used = prometheus::BuildGauge()
                   .Name("kvserve_kv_tier_bytes_used")
                   .Help("Bytes each tier holds now (remote: not known, 0).")
                   .Register(r);
  auto& latency = prometheus::BuildHistogram()
                      .Name("kvserve_kv_tier_load_seconds")
                      .Help("Latency of one tier load (a block; remote: one fetch of a prompt).")
                      .Register(r);
  std::vector<double> bounds;
  for (int64_t us : kTierLoadBucketsUs) bounds.push_back(static_cast<double>(us) * 1e-6);
  for (int t = 0; t < kNumTiers; ++t) {
    const std::map<std::string, std::string> label = {
        {"tier", std::string(TierName(static_cast<TierKind>(t)))}};
    PerTier& p = tiers_[t];
    p.hits = &hits.Add(label);
    p.misses = &misses.Add(label);
    p.loaded_tokens = &loaded_tokens.Add(label);
    p.loaded_bytes = &loaded_bytes.Add(label);
    p.stored_tokens = &stored_tokens.Add(label);
    p.stored_bytes = &stored_bytes.Add(label);
    p.drops = &drops.Add(label);
    p.timeouts = &timeouts.Add(label);
    for (int c = 1; c < kNumTierRejects; ++c) {
      std::map<std::string, std::string> l = label;
      l["cause"] = std::string(TierRejectName(static_cast<TierReject>(c)));
      p.rejects[c] = &rejects.Add(l);
    }
    p.rejects[0] = nullptr;
    p.bytes_used = &used.Add(label);
    p.load_seconds = &latency.Add(label, bounds);
  }
}

void TierMetrics::Update(const TierStats& now, const TierStats& before) {
  for (int t = 0; t < kNumTiers; ++t) {
    const TierCounters& n = now[t];
    const TierCounters& b = before[t];
    PerTier& p = tiers_[t];
    Advance(*p.hits, n.hit_blocks, b.hit_blocks);
    Advance(*p.misses, n.miss_blocks, b.miss_blocks);
    Advance(*p.loaded_tokens, n.loaded_tokens, b.loaded_tokens);
    Advance(*p.loaded_bytes, n.loaded_bytes, b.loaded_bytes);
    Advance(*p.stored_tokens, n.stored_tokens, b.stored_tokens);
    Advance(*p.stored_bytes, n.stored_bytes, b.stored_bytes);
    Advance(*p.drops, n.write_drops, b.write_drops);
    Advance(*p.timeouts, n.load_timeouts, b.load_timeouts);
    for (int c = 1; c < kNumTierRejects; ++c) Advance(*p.rejects[c], n.rejects[c], b.rejects[c]);
    p.bytes_used->Set(static_cast<double>(n.bytes_used));
    if (n.load_count > b.load_count) {
      // Per-bucket increments from the cumulative counts, +Inf last.
      std::vector<double> inc(kTierLoadBucketsUs.size() + 1, 0);
      int64_t prev_now = 0, prev_before = 0;
      for (size_t i = 0; i < kTierLoadBucketsUs.size(); ++i) {
        inc[i] =
            static_cast<double>((n.load_us_le[i] - prev_now) - (b.load_us_le[i] - prev_before));
        prev_now = n.load_us_le[i];
        prev_before = b.load_us_le[i];
      }
      inc.back() = static_cast<double>((n.load_count - prev_now) - (b.load_count - prev_before));
      p.load_seconds->ObserveMultiple(inc,
                                      static_cast<double>(n.load_us_sum - b.load_us_sum) * 1e-6);
    }
  }
}

}  // namespace kvserve

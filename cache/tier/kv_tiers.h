// KvTiers: the tiers below the device pool, walked in order host, disk,
// remote, for the blocks a prompt's chain of hashes names past the device
// pool (KvTierSource), and fed the blocks that leave it.
//
// Placement: a block leaving the device goes to the host tier (slots of
// one arena, host_arena.h: pinned on CUDA); what the host tier's LRU pushes
// out goes down to the disk tier (without a host tier, straight to disk).
// A spill into the host tier may arrive asynchronously: BeginStore hands out
// the slot's payload for the runner's copy, FinishStores lists it. A hit stays where it was found
// (a block loaded back to the device is spilled again later at no cost: Store of a hash the host
// holds only refreshes it). The remote tier (remote_tier.h) is never waited on here: full, computed
// blocks are written through to it in the background (WriteThrough), and a
// prompt's remote blocks are fetched by the engine before the request is
// scheduled (scheduler/tier_prefetch.h), then staged (AddFetched) for Find,
// which serves them as remote hits. With background loads on
// (set_background_loads, as the engine runs), disk blocks are read the same
// way, by a DiskLoader (disk_loader.h), settled and staged (SettleDiskLoad),
// and Find never reads the disk itself; host hits stay on the engine thread
// (a lookup; their bytes move in the step's one batched import).
// Every value is checked on load (block_value.h); a refused one is dropped
// and counted by cause. Counters are per tier, TierKind-indexed.
//
// Thread-safety: none; engine thread only.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "cache/kv_tier_hooks.h"
#include "cache/tier/block_value.h"
#include "cache/tier/disk_loader.h"
#include "cache/tier/disk_tier.h"
#include "cache/tier/host_arena.h"
#include "cache/tier/host_tier.h"
#include "cache/tier/remote_tier.h"

namespace kvserve {

enum class TierKind : uint8_t { kDevice, kHost, kDisk, kRemote };
inline constexpr int kNumTiers = 4;
std::string_view TierName(TierKind t);  // "device", "host", "disk", "remote"

// cache.host_tier_bytes, cache.disk_tier_path + cache.disk_tier_bytes,
// cache.remote_tier_url, cache.tier_load_timeout_ms.
struct KvTierConfig {
  int64_t host_bytes = 0;
  std::string disk_path;
  int64_t disk_bytes = 0;
  std::string remote_url;
  int32_t load_timeout_ms = 1000;
  // The most bytes of background disk and remote loads held until their
  // request takes them, per tier (an LRU: past it, the oldest are dropped and
  // recomputed). The engine sets it to the device pool's bytes in tier
  // values (no prompt loads more), at least kMinStagingBytes.
  int64_t staging_bytes = kMinStagingBytes;
  static constexpr int64_t kMinStagingBytes = int64_t{64} << 20;
  // Whether any tier below the device is configured.
  bool enabled() const { return host_bytes > 0 || !disk_path.empty() || !remote_url.empty(); }
  absl::Status Validate() const;  // names the bad key
};

struct TierCounters {
  int64_t hit_blocks = 0;
  int64_t miss_blocks = 0;
  int64_t loaded_tokens = 0;
  int64_t loaded_bytes = 0;
  int64_t stored_tokens = 0;
  int64_t stored_bytes = 0;
  int64_t bytes_used = 0;     // gauge
  int64_t write_drops = 0;    // values a full or failing tier did not take
  int64_t load_timeouts = 0;  // background loads past cache.tier_load_timeout_ms (recomputed)
  std::array<int64_t, kNumTierRejects> rejects{};  // by TierReject
  // Load latency, microseconds: sum and count (the histogram's buckets
  // below, cumulative as Prometheus has them).
  int64_t load_us_sum = 0;
  int64_t load_count = 0;
  std::array<int64_t, 6> load_us_le{};  // <= 10, 100, 1000, 10000, 100000, 1000000 us
};
inline constexpr std::array<int64_t, 6> kTierLoadBucketsUs = {10,    100,    1000,
                                                              10000, 100000, 1000000};
using TierStats = std::array<TierCounters, kNumTiers>;

class KvTiers final : public KvTierSource {
 public:
  // Opens the configured tiers.
  // The disk tier's failure to open is an error (serve --check reports it
  // first). host_arena: the runner's memory for the host tier's slots
  // (ModelRunner::AllocateTierArena); empty: the tier allocates its own.
  static absl::StatusOr<std::unique_ptr<KvTiers>> Create(const KvTierConfig& config,
                                                         const TierIdentity& id,
                                                         std::span<uint8_t> host_arena = {});

  const TierIdentity& identity() const { return id_; }
  const HostArena* host() const { return host_.get(); }
  const DiskTier* disk() const { return disk_.get(); }
  RemoteTier* remote() { return remote_.get(); }

  // Whether the host, a staged fetch or the disk holds the block.
  bool HoldsLocally(BlockHash hash) const;
  // Whether the host or a staged load holds it (Find needs no read).
  bool HoldsInMemory(BlockHash hash) const;

  // Disk reads through a DiskLoader instead of in Find (no-op without a
  // disk tier). Before any Find.
  void set_background_loads(bool on);
  DiskLoader* disk_loader() { return disk_loader_.get(); }
  // The disk slot of a block for a background read; false on a miss.
  bool LocateOnDisk(BlockHash hash, DiskLoader::Read* read) const;
  // A background disk load's answer: each read settled in order (a slot
  // rewritten meanwhile ends the chain, a refused value is dropped and
  // counted), the usable ones staged for Find; its latency counted once.
  void SettleDiskLoad(const std::vector<DiskLoader::Read>& reads,
                      std::vector<DiskLoader::Result>& results, int64_t micros);
  // A background load of tier t abandoned past its deadline.
  void CountTimeout(TierKind t);
  // A full, computed block, for the remote tier (no-op without one).
  void WriteThrough(const TierBlockKey& key, std::span<const uint8_t> payload);
  // A block the remote tier answered (checked), staged for Find.
  void AddFetched(BlockHash hash, std::shared_ptr<const std::string> value);
  // A remote load's latency, once per load.
  void CountRemoteLoad(int64_t micros) { CountLatency(TierKind::kRemote, micros); }

  // A block leaving the device pool (its bytes as stored).
  void Store(const TierBlockKey& key, std::span<const uint8_t> payload);
  // The same into a host-tier slot whose bytes the caller copies in: the
  // payload's address (header and tokens written), or null when there is
  // nothing to copy (the host holds it already: refreshed; or no slot is
  // free: a drop). Needs a host tier. FinishStores lists every slot begun,
  // once their bytes are there.
  uint8_t* BeginStore(const TierBlockKey& key);
  void FinishStores();
  bool stores_pending() const { return !pending_.empty(); }
  TierHit Find(const TierBlockKey& key) override;

  // Counters so far (bytes_used refreshed).
  TierStats Stats() const;
  // One line per tier that turned itself off since the last call (the
  // engine logs them once).
  std::string TakeNotice();

 private:
  KvTiers(const KvTierConfig& config, const TierIdentity& id);
  void StoreValue(BlockHash hash, std::shared_ptr<const std::string> value);
  // Reserves a host slot, the entries it pushes out going to the disk.
  int32_t ReserveHostSlot();
  void ToDisk(const std::vector<HostTier::Entry>& evicted);
  void CountLoad(TierKind t, int64_t micros);
  void CountHit(TierKind t);
  void CountLatency(TierKind t, int64_t micros);

  KvTierConfig config_;
  TierIdentity id_;
  std::unique_ptr<HostArena> host_;
  struct PendingStore {
    int32_t slot;
    BlockHash hash;
  };
  std::vector<PendingStore> pending_;  // begun, not yet listed
  std::unique_ptr<DiskTier> disk_;
  std::unique_ptr<RemoteTier> remote_;
  HostTier staging_;                         // fetched remote values until Find takes them
  HostTier staged_disk_;                     // background disk reads until Find takes them
  std::unique_ptr<DiskLoader> disk_loader_;  // with background loads; before disk_ dies
  bool disk_notice_given_ = false;
  std::string notice_;
  std::vector<HostTier::Entry> evicted_;  // scratch
  TierStats stats_{};
};

}  // namespace kvserve

// EngineTiers: the engine's end of the tiers below the device pool
// (cache/tier/kv_tiers.h). It opens the tiers for the runner's model and KV
// format, and runs each step's tier transfers (cache/kv_tier_hooks.h)
// through the runner: spills exported first in the step, in one batched
// ExportBlocks, and loads imported with the swap-ins, in one batched
// ImportBlocks.
//
// Host loads come from the host tier's Find on the engine thread (a lookup;
// the bytes move in the batched import). Disk and remote loads are read in
// the background before the request is scheduled (tier_prefetch.h) and
// staged for Find. Blocks filed by MarkComputed are exported with the
// spills and written through to the remote tier.
//
// Thread-safety: engine thread only.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "cache/kv_cache_manager.h"
#include "cache/tier/kv_tiers.h"
#include "model/model_runner.h"

namespace kvserve {

// The identity of the runner's blocks: weights fingerprint, model shape and
// RoPE, weight dtype; layer 0's KV format and the whole block's bytes.
TierIdentity TierIdentityOf(const ModelRunner& runner, const std::string& weights_fingerprint);

class EngineTiers {
 public:
  // InvalidArgument naming the key when the runner has no tier support or a
  // setting is wrong; the disk tier's own errors otherwise.
  // The host tier's slots live in the runner's arena where it has one
  // (ModelRunner::AllocateTierArena: pinned memory on CUDA).
  static absl::StatusOr<std::unique_ptr<EngineTiers>> Create(
      const KvTierConfig& config, ModelRunner& runner, const std::string& weights_fingerprint);

  KvTiers& tiers() { return *tiers_; }
  // The hash seed every replica of this model shares (so their chains, and
  // the disk tier across restarts, name blocks alike).
  uint64_t hash_seed() const;

  // Exports the spills and write-throughs (before any other copy of the
  // step). Spills into the host tier's arena may still be in flight:
  // FinishSpills (before the next step's lookups) waits for them and lists
  // them in the host tier.
  absl::Status RunSpills(const TierTransfers& t, ModelRunner& runner, int32_t block_size);
  absl::Status FinishSpills(ModelRunner& runner);
  // Imports the loads (with the swap-ins, before the forward pass).
  absl::Status RunLoads(const TierTransfers& t, ModelRunner& runner);
  // Device-tier counters from the cache's and the lower tiers' own.
  TierStats Stats(const KvCacheStats& kv, int32_t block_size) const;

 private:
  explicit EngineTiers(std::unique_ptr<KvTiers> tiers) : tiers_(std::move(tiers)) {}
  std::unique_ptr<KvTiers> tiers_;
  std::vector<BlockId> ids_;            // scratch
  std::vector<uint8_t*> outputs_;       // scratch
  std::vector<size_t> copied_;          // scratch: spills and writes through bytes_
  std::vector<uint8_t> bytes_;          // scratch: [copied_][tier_block_bytes]
  std::vector<const uint8_t*> inputs_;  // scratch
};

}  // namespace kvserve

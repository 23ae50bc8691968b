// The KV cache manager's side of the tiers below the device pool
// (cache/tier/): what it asks a lower tier when a prompt's chain of block
// hashes ends in the device pool, and the transfers it records for the
// engine to run with the step's copies.
//
// Spills: a filed block that the pool hands out for new content (the LRU
// cached block) leaves the device; its bytes must be read before anything
// writes the block, so the engine exports spills first in a step, before
// swap-out, copy-on-write and swap-in (the block is written only by those
// and the forward pass, which all come after).
// Loads: a block found below the device gets a fresh device block at
// Allocate; its bytes (already checked by the tier) are imported with the
// swap-ins, before the forward pass that reads them. The block is filed at
// Allocate, as SwapIn files what it copies in. A spill may be copied out
// asynchronously (into the host tier's pinned arena on CUDA): the engine
// finishes it (EngineTiers::FinishSpills) before the next step's lookups.
//
// Thread-safety: engine thread only.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "cache/block_hash.h"
#include "cache/block_pool.h"

namespace kvserve {

// What names one block: its chained hash (tokens and cache salt included)
// and what the hash stands for, re-checked on every load.
struct TierBlockKey {
  BlockHash hash = 0;
  BlockHash parent = 0;
  uint64_t extra_key = 0;
  std::span<const int32_t> tokens;
};

// A checked value from a lower tier: its payload (the block's bytes as
// stored), kept alive and unchanged by `owner` (a staged value, or a pin on
// a host-arena slot) until the load that reads it is done.
struct TierHit {
  std::shared_ptr<const void> owner;
  const uint8_t* payload = nullptr;
  uint8_t tier = 0;  // TierKind (cache/tier/kv_tiers.h)
  explicit operator bool() const { return payload != nullptr; }
};

class KvTierSource {
 public:
  virtual ~KvTierSource() = default;
  // The block from the highest lower tier that holds it, checked against
  // `key`; empty on a miss.
  virtual TierHit Find(const TierBlockKey& key) = 0;
};

struct TierSpill {
  BlockId block = kNoBlock;
  BlockHash hash = 0;
  BlockHash parent = 0;
  uint64_t extra_key = 0;
};

struct TierLoad {
  BlockId block = kNoBlock;
  TierHit hit;
};

struct TierTransfers {
  std::vector<TierSpill> spills;      // export first in the step
  std::vector<int32_t> spill_tokens;  // [spills][block_size]
  // Blocks filed since the last step, for write-through to a shared tier
  // (exported with the spills: a filed block is written only after the pool
  // hands it out, which records a spill first).
  std::vector<TierSpill> writes;
  std::vector<int32_t> write_tokens;  // [writes][block_size]
  std::vector<TierLoad> loads;        // import with the swap-ins
  bool empty() const { return spills.empty() && writes.empty() && loads.empty(); }
};

}  // namespace kvserve

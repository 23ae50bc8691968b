// PrefixCache: the content index of full, computed KV blocks, for automatic
// prefix caching. It maps a chained block hash (block_hash.h) to the one block
// registered under it and keeps, per registered block, exactly what the hash
// stands for (parent hash, extra key, token ids) so a hit is re-checked
// token by token and a hash collision can never hand out wrong K/V.
//
// It indexes block ids only; whether a registered block is in use or free
// (cached-reusable in the BlockPool's LRU list) is the pool's business. The
// KvCacheManager registers a block once its K/V are computed and erases the
// registration when the pool hands the block out for new content.
//
// Invariants: a block is registered under at most one hash and a hash names
// at most one block; registered blocks are full and never written.
// Storage (tokens of every block) is preallocated; the hash map is reserved
// for num_blocks entries, so the hot path does not allocate.
//
// Thread-safety: none; owned by the engine thread (through KvCacheManager).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "cache/block_hash.h"
#include "cache/block_pool.h"

namespace kvserve {

class PrefixCache {
 public:
  PrefixCache(int32_t num_blocks, int32_t block_size);

  PrefixCache(const PrefixCache&) = delete;
  PrefixCache& operator=(const PrefixCache&) = delete;

  int32_t block_size() const { return block_size_; }
  // Registered blocks.
  int32_t size() const { return static_cast<int32_t>(by_hash_.size()); }
  bool contains(BlockId id) const { return registered_[id] != 0; }
  // The hash a registered block is filed under.
  BlockHash hash(BlockId id) const { return hash_[id]; }
  // What a registered block's hash stands for (tiers re-check it on load).
  BlockHash parent(BlockId id) const { return parent_[id]; }
  uint64_t extra_key(BlockId id) const { return extra_key_[id]; }
  std::span<const int32_t> tokens(BlockId id) const {
    return std::span<const int32_t>(tokens_).subspan(static_cast<size_t>(id) * block_size_,
                                                     block_size_);
  }
  // True when some block is registered under `hash`.
  bool ContainsHash(BlockHash hash) const { return by_hash_.contains(hash); }

  // The block registered under `hash` holding exactly `tokens` after a parent
  // whose hash is `parent`, under `extra_key`; kNoBlock on a miss.
  BlockId Find(BlockHash hash, BlockHash parent, uint64_t extra_key,
               std::span<const int32_t> tokens) const;

  // Files a full, computed block. Returns false, registering nothing, when
  // the hash is already taken (the same content computed twice, or a
  // collision): the block then stays private. Aborts if `id` is registered.
  bool Insert(BlockId id, BlockHash hash, BlockHash parent, uint64_t extra_key,
              std::span<const int32_t> tokens);

  // Drops a registration (the block is about to get new content).
  void Erase(BlockId id);

  // Map and per-block records agree (for KvCacheManager::CheckInvariants).
  absl::Status CheckConsistent() const;

 private:
  int32_t block_size_;
  absl::flat_hash_map<BlockHash, BlockId> by_hash_;
  std::vector<uint8_t> registered_;  // [num_blocks]
  std::vector<BlockHash> hash_;      // [num_blocks]
  std::vector<BlockHash> parent_;    // [num_blocks]
  std::vector<uint64_t> extra_key_;  // [num_blocks]
  std::vector<int32_t> tokens_;      // [num_blocks][block_size]
};

}  // namespace kvserve

// HostTier: an LRU of encoded block values (block_value.h) in host memory,
// sized in bytes. Values are immutable and shared: a value handed out by Get
// stays valid after the tier evicts it.
//
// Invariants: bytes_used() is the sum of the stored values' sizes and never
// exceeds capacity_bytes() after Put returns; a value larger than the whole
// tier is refused (Put returns false, nothing evicted).
//
// Thread-safety: none; engine thread only.
//
// Example:
//   HostTier host(1 << 20);
//   std::vector<HostTier::Entry> evicted;   // what went out, for the tier below
//   host.Put(hash, value, &evicted);
//   if (auto v = host.Get(hash)) ...        // now most recently used
#pragma once

#include <cstdint>
#include <list>
#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "cache/block_hash.h"

namespace kvserve {

class HostTier {
 public:
  struct Entry {
    BlockHash hash = 0;
    std::shared_ptr<const std::string> value;
  };

  explicit HostTier(int64_t capacity_bytes) : capacity_(capacity_bytes) {}
  HostTier(const HostTier&) = delete;
  HostTier& operator=(const HostTier&) = delete;

  int64_t capacity_bytes() const { return capacity_; }
  int64_t bytes_used() const { return used_; }
  int32_t size() const { return static_cast<int32_t>(index_.size()); }
  bool Contains(BlockHash hash) const { return index_.contains(hash); }

  // Stores (or replaces) a value as most recently used, evicting least
  // recently used ones into *evicted (appended; may be null). False when the
  // value alone exceeds the capacity.
  bool Put(BlockHash hash, std::shared_ptr<const std::string> value, std::vector<Entry>* evicted);
  // The value, now most recently used; null when absent.
  std::shared_ptr<const std::string> Get(BlockHash hash);
  // Drops a value (a refused one); no-op when absent.
  void Erase(BlockHash hash);
  // Hashes from least to most recently used (tests).
  std::vector<BlockHash> LruOrder() const;

 private:
  int64_t capacity_;
  int64_t used_ = 0;
  std::list<Entry> lru_;  // front: least recently used
  absl::flat_hash_map<BlockHash, std::list<Entry>::iterator> index_;
};

}  // namespace kvserve

// HostArena: the host tier's LRU of encoded block values (block_value.h) in
// fixed slots of one byte arena, sized in bytes. On CUDA the arena is one
// pinned allocation (ModelRunner::AllocateTierArena), so spills and loads
// are asynchronous copies straight to and from the slots; elsewhere it is
// plain host memory the tier allocates (pages committed as slots are used).
//
// A spill reserves a slot (Reserve: a free one, else the least recently
// used entry's, which goes into *evicted for the tier below), the engine
// writes the header and tokens at once and has the runner copy the block's
// bytes in (maybe asynchronously), then Commit lists it once the bytes are
// there. A hit (Get) hands out a pin with the slot's bytes: a pinned slot
// is never reserved again until every pin is dropped (a load in flight
// reads it), though it may leave the LRU meanwhile.
//
// Invariants: bytes_used() is size() x value_bytes() <= capacity_bytes();
// a slot is free, reserved, or listed under one hash.
//
// Thread-safety: none; engine thread only.
#pragma once

#include <cstdint>
#include <list>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "cache/block_hash.h"
#include "cache/tier/host_tier.h"

namespace kvserve {

class HostArena {
 public:
  // `arena` (the runner's) or, when empty, capacity_bytes of the tier's own;
  // one slot per value_bytes, packed (as kvserve plan counts them).
  HostArena(std::span<uint8_t> arena, int64_t capacity_bytes, int64_t value_bytes);
  HostArena(const HostArena&) = delete;
  HostArena& operator=(const HostArena&) = delete;

  int64_t capacity_bytes() const { return int64_t{num_slots()} * value_bytes_; }
  int64_t bytes_used() const { return int64_t{size()} * value_bytes_; }
  int64_t value_bytes() const { return value_bytes_; }
  int32_t num_slots() const { return static_cast<int32_t>(pins_.size()); }
  int32_t size() const { return static_cast<int32_t>(index_.size()); }
  bool Contains(BlockHash hash) const { return index_.contains(hash); }
  // Whether [p, p + n) lies in the arena.
  bool Holds(const void* p, int64_t n) const;

  // A slot for a new value, or -1 when every slot is reserved or pinned.
  // Entries it pushes out are appended to *evicted (their bytes copied).
  int32_t Reserve(std::vector<HostTier::Entry>* evicted);
  uint8_t* slot(int32_t s) { return base_ + int64_t{s} * value_bytes_; }
  // Lists a reserved slot under `hash` as most recently used (a value
  // already listed under it is replaced).
  void Commit(int32_t s, BlockHash hash);
  // Gives back a reserved slot unused.
  void Release(int32_t s);

  struct Pinned {
    std::shared_ptr<const void> pin;  // keeps the slot from reuse
    std::string_view value;
  };
  // The value, now most recently used; empty pin when absent.
  Pinned Get(BlockHash hash);
  void Erase(BlockHash hash);
  // Hashes from least to most recently used (tests).
  std::vector<BlockHash> LruOrder() const;

 private:
  struct Entry {
    BlockHash hash;
    int32_t slot;
  };
  bool Usable(int32_t s) const { return pins_[s].use_count() == 1; }

  std::unique_ptr<uint8_t[]> owned_;
  uint8_t* base_ = nullptr;
  int64_t value_bytes_;
  std::vector<std::shared_ptr<int32_t>> pins_;  // [slots]; use_count > 1: pinned by a hit
  std::vector<int32_t> free_;                   // slots neither listed nor reserved
  std::list<Entry> lru_;                        // front: least recently used
  absl::flat_hash_map<BlockHash, std::list<Entry>::iterator> index_;
};

}  // namespace kvserve

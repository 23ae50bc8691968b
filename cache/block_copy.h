// BlockCopy and StepCopies: the whole-block copies the KV cache manager asks
// the backend to perform before a step's forward pass, and the single-slot
// moves of KV eviction.
//
// The manager records copies while the scheduler plans a step (copy-on-write,
// swap-out, swap-in) and the engine drains them once per step with
// KvCacheManager::TakePendingCopies(), then runs them as three batches, in
// this order, before the forward pass:
//   1. swap_out  (primary -> host)
//   2. copies    (primary -> primary, copy-on-write)
//   3. swap_in   (host -> primary)
//   4. slot_moves (primary slot -> primary slot, eviction; see below)
// Inside one batch the copies are independent (a backend may run them in
// parallel): no block is the destination of two copies, and no destination
// is also a source in the same batch. KvCacheManager documents why running the
// batches in this order is equivalent to running every copy in the order it
// was recorded.
//
// Tails (int4_kc): ids past a pool's blocks name its tails. A primary id p >=
// num_blocks is tail p - num_blocks, a host id h >= num_swap_blocks is host
// tail h - num_swap_blocks; a copy moves a whole tail (every layer that keeps
// tails) and is always tail to tail.
//
// Slot moves come only from KvCacheManager::Evict, which the engine calls
// after a step's forward pass and drains at once (so no swap-out recorded
// later can read a block before its moves ran). A move copies one token's K
// and V (scales included, every layer, every kv head) byte for byte from
// one flat slot (block_id * block_size + offset) to another: an evicted
// entry's slot is refilled by a later entry of the same sequence. Inside one
// batch no slot is written twice or both read and written, so a backend may
// run the moves in parallel; they run after the copy-on-write copies, which
// may have produced the blocks they write.
//
// Thread-safety: plain values.
#pragma once

#include <cstdint>
#include <vector>

#include "cache/block_pool.h"

namespace kvserve {

// One whole-block copy (every layer, K and V, scales included), or one
// whole-tail copy (extended ids, above).
struct BlockCopy {
  BlockId src;
  BlockId dst;
  friend bool operator==(const BlockCopy&, const BlockCopy&) = default;
};

// One token's K/V from slot src to slot dst (flat slots, primary pool).
struct SlotMove {
  int64_t src;
  int64_t dst;
  friend bool operator==(const SlotMove&, const SlotMove&) = default;
};

struct StepCopies {
  std::vector<BlockCopy> swap_out;   // src: primary id, dst: host id; run first
  std::vector<BlockCopy> copies;     // both primary ids (copy-on-write); run second
  std::vector<BlockCopy> swap_in;    // src: host id, dst: primary id; run third
  std::vector<SlotMove> slot_moves;  // eviction refills inside the primary pool; run fourth

  bool empty() const {
    return swap_out.empty() && copies.empty() && swap_in.empty() && slot_moves.empty();
  }
};

}  // namespace kvserve

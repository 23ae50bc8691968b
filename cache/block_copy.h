// BlockCopy and StepCopies: the whole-block copies the KV cache manager asks
// the backend to perform before a step's forward pass.
//
// The manager records copies while the scheduler plans a step (copy-on-write,
// swap-out, swap-in) and the engine drains them once per step with
// KvCacheManager::TakePendingCopies(), then runs them as three batches, in
// this order, before the forward pass:
//   1. swap_out  (primary -> host)
//   2. copies    (primary -> primary, copy-on-write)
//   3. swap_in   (host -> primary)
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
// Thread-safety: plain values.
#pragma once

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

struct StepCopies {
  std::vector<BlockCopy> swap_out;  // src: primary id, dst: host id; run first
  std::vector<BlockCopy> copies;    // both primary ids (copy-on-write); run second
  std::vector<BlockCopy> swap_in;   // src: host id, dst: primary id; run third

  bool empty() const { return swap_out.empty() && copies.empty() && swap_in.empty(); }
};

}  // namespace kvserve

// The shared invariant checker for KvCacheManager tests. It recomputes, from
// the public views only (block tables, pools, pending copies), what the
// manager's state must be, and also runs the manager's own CheckInvariants:
//   * every block's ref count equals the references block tables hold, plus
//     one pin for each block a pending copy reads or writes (except swap-out
//     sources, which are released at once);
//   * free + used == total; a listed-free block has ref count 0 and every
//     unreferenced block is listed free (no block both free and used);
//   * inside each batch of pending copies no block (slot, for eviction's
//     slot moves) is written twice or both read and written, so a backend
//     may run a batch in parallel; slot moves pin the blocks they touch;
//   * the prefix cache's map and per-block records agree.
#pragma once

#include <catch2/catch.hpp>
#include <set>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "cache/kv_cache_manager.h"

namespace kvserve::testing {

// Copies as (src, dst) pairs, for exact comparisons with readable failures.
using CopyPairs = std::vector<std::pair<BlockId, BlockId>>;
inline CopyPairs Pairs(const std::vector<BlockCopy>& copies) {
  CopyPairs out;
  for (const BlockCopy& c : copies) out.emplace_back(c.src, c.dst);
  return out;
}

inline void CheckBatchIndependent(const std::vector<BlockCopy>& batch, const char* name,
                                  bool same_pool) {
  std::set<BlockId> dsts, srcs;
  for (const BlockCopy& c : batch) {
    INFO(name << " copy " << c.src << " -> " << c.dst);
    REQUIRE(dsts.insert(c.dst).second);  // written once
    srcs.insert(c.src);
  }
  if (same_pool) {
    for (BlockId d : dsts) {
      INFO(name << " block " << d << " is read and written in one batch");
      REQUIRE(srcs.count(d) == 0);
    }
  }
}

inline void CheckKvCache(const KvCacheManager& kv, std::span<const SeqId> live) {
  const BlockPool& pool = kv.pool();
  const BlockPool& host = kv.swap_pool();
  REQUIRE(kv.num_sequences() == static_cast<int32_t>(live.size()));

  std::vector<int32_t> refs(pool.num_blocks(), 0), host_refs(host.num_blocks(), 0);
  for (SeqId seq : live) {
    REQUIRE(kv.Contains(seq));
    const BlockTable& t = kv.block_table(seq);
    REQUIRE(t.num_blocks() == t.BlocksFor(t.num_tokens()));
    for (BlockId id : t.blocks()) ++(kv.IsSwapped(seq) ? host_refs : refs)[id];
  }

  const StepCopies& pending = kv.pending_copies();
  CheckBatchIndependent(pending.swap_out, "swap_out", false);
  CheckBatchIndependent(pending.copies, "copies", true);
  CheckBatchIndependent(pending.swap_in, "swap_in", false);
  {
    std::set<int64_t> dsts, srcs;
    for (const SlotMove& m : pending.slot_moves) {
      INFO("slot move " << m.src << " -> " << m.dst);
      REQUIRE(dsts.insert(m.dst).second);
      srcs.insert(m.src);
    }
    for (int64_t d : dsts) REQUIRE(srcs.count(d) == 0);
  }
  std::set<BlockId> pinned, host_pinned;
  for (const SlotMove& m : pending.slot_moves) {
    pinned.insert(static_cast<BlockId>(m.src / kv.block_size()));
    pinned.insert(static_cast<BlockId>(m.dst / kv.block_size()));
  }
  for (const BlockCopy& c : pending.copies) {
    pinned.insert(c.src);
    pinned.insert(c.dst);
  }
  for (const BlockCopy& c : pending.swap_in) {
    host_pinned.insert(c.src);
    pinned.insert(c.dst);
  }
  for (const BlockCopy& c : pending.swap_out) host_pinned.insert(c.dst);
  // A block written by a copy-on-write copy is not also swapped in.
  for (const BlockCopy& c : pending.copies) {
    for (const BlockCopy& s : pending.swap_in) REQUIRE(c.dst != s.dst);
  }

  auto check_pool = [](const BlockPool& p, const std::vector<int32_t>& r,
                       const std::set<BlockId>& pins, const char* name) {
    int32_t used = 0;
    for (BlockId id = 0; id < p.num_blocks(); ++id) {
      INFO(name << " block " << id << ": tables hold " << r[id] << ", pinned " << pins.count(id));
      REQUIRE(p.ref_count(id) == r[id] + static_cast<int32_t>(pins.count(id)));
      if (p.ref_count(id) > 0) ++used;
    }
    const std::vector<BlockId> free_list = p.FreeListInOrder();
    REQUIRE(static_cast<int32_t>(free_list.size()) == p.num_free());
    REQUIRE(p.num_free() + used == p.num_blocks());
    REQUIRE(p.num_used() == used);
    std::set<BlockId> distinct(free_list.begin(), free_list.end());
    REQUIRE(distinct.size() == free_list.size());
    for (BlockId id : free_list) REQUIRE(p.ref_count(id) == 0);
  };
  check_pool(pool, refs, pinned, "primary");
  check_pool(host, host_refs, host_pinned, "host");

  int32_t cached_free = 0;
  for (BlockId id = 0; id < pool.num_blocks(); ++id) {
    if (pool.is_free(id) && kv.IsCachedBlock(id)) ++cached_free;
  }
  REQUIRE(kv.Stats().num_cached_blocks == cached_free);
  const absl::Status self = kv.CheckInvariants();
  INFO(std::string(self.message()));
  REQUIRE(self.ok());
}

}  // namespace kvserve::testing

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
//   * the prefix cache's map and per-block records agree;
//   * tails (int4_kc): a sequence holds one exactly when it has uncomputed
//     tokens or its computed or reserved token count is not a multiple of
//     block_size, and tail pools
//     obey the same ref-count rules (copies name tails with extended ids:
//     past the pool's blocks).
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
  const BlockPool& tails = kv.tail_pool();
  const BlockPool& host_tails = kv.swap_tail_pool();
  REQUIRE(kv.num_sequences() == static_cast<int32_t>(live.size()));

  // Extended ids: blocks, then tails.
  std::vector<int32_t> refs(pool.num_blocks() + tails.num_blocks(), 0),
      host_refs(host.num_blocks() + host_tails.num_blocks(), 0);
  const int32_t bs = kv.block_size();
  for (SeqId seq : live) {
    REQUIRE(kv.Contains(seq));
    const BlockTable& t = kv.block_table(seq);
    REQUIRE(t.num_blocks() == t.BlocksFor(t.num_tokens()));
    for (BlockId id : t.blocks()) ++(kv.IsSwapped(seq) ? host_refs : refs)[id];
    const BlockId tail = kv.tail_block(seq);
    const int32_t computed = kv.num_computed_tokens(seq);
    const bool partial =
        computed < t.num_tokens() || computed % bs != 0 || t.num_tokens() % bs != 0;
    INFO("sequence " << seq << " tail " << tail);
    REQUIRE((tail != kNoBlock) == (kv.has_tails() && partial));
    if (tail == kNoBlock) continue;
    if (kv.IsSwapped(seq)) {
      REQUIRE(tail >= host.num_blocks());
      ++host_refs.at(tail);
    } else {
      REQUIRE(tail >= pool.num_blocks());
      REQUIRE(kv.tail_id(seq) == tail - pool.num_blocks());
      ++refs.at(tail);
    }
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

  // `base`: the pool's first extended id.
  auto check_pool = [](const BlockPool& p, const std::vector<int32_t>& r,
                       const std::set<BlockId>& pins, int32_t base, const char* name) {
    int32_t used = 0;
    for (BlockId id = 0; id < p.num_blocks(); ++id) {
      const BlockId x = base + id;
      INFO(name << " block " << id << ": tables hold " << r[x] << ", pinned " << pins.count(x));
      REQUIRE(p.ref_count(id) == r[x] + static_cast<int32_t>(pins.count(x)));
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
  check_pool(pool, refs, pinned, 0, "primary");
  check_pool(host, host_refs, host_pinned, 0, "host");
  check_pool(tails, refs, pinned, pool.num_blocks(), "tail");
  check_pool(host_tails, host_refs, host_pinned, host.num_blocks(), "host tail");
  // A copy moves a block to a block or a tail to a tail.
  for (const auto* batch : {&pending.swap_out, &pending.copies, &pending.swap_in}) {
    for (const BlockCopy& c : *batch) {
      const bool src_tail =
          batch == &pending.swap_in ? c.src >= host.num_blocks() : c.src >= pool.num_blocks();
      const bool dst_tail =
          batch == &pending.swap_out ? c.dst >= host.num_blocks() : c.dst >= pool.num_blocks();
      REQUIRE(src_tail == dst_tail);
    }
  }

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

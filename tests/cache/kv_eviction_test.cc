// Exact-id scenarios for KvCacheManager::Evict on a tiny pool (8 blocks of 4
// tokens, 4 host blocks): which entries move where (slot moves), which
// blocks go back to the pool, which shared or filed blocks are copied first,
// and that an evicted sequence files nothing. Every scenario ends with the
// shared invariant checker.
#include <catch2/catch.hpp>
#include <numeric>
#include <string>
#include <vector>

#include "cache/kv_cache_manager.h"
#include "tests/cache/kv_cache_checker.h"
#include "tests/cache/tiny_cache.h"

namespace kvserve {
namespace {

using testing::Blocks;
using testing::Range;
using testing::Tiny;
using Ids = std::vector<BlockId>;
using Moves = std::vector<IndexMove>;
using SlotMoves = std::vector<SlotMove>;
using testing::CopyPairs;
using testing::Pairs;

std::vector<int32_t> Tokens(const KvCacheManager& kv, SeqId seq) {
  auto t = kv.token_ids(seq);
  return {t.begin(), t.end()};
}

EvictResult MustEvict(KvCacheManager& kv, SeqId seq, std::vector<int32_t> victims) {
  absl::StatusOr<EvictResult> r = kv.Evict(seq, victims);
  INFO(r.status().ToString());
  REQUIRE(r.ok());
  return *r;
}

void Check(const KvCacheManager& kv, std::vector<SeqId> live) { testing::CheckKvCache(kv, live); }

TEST_CASE("Evict refills holes with the last entries and frees the tail", "[cache][eviction]") {
  KvCacheManager kv(Tiny(false));
  REQUIRE(kv.Allocate(1, Range(100, 10)).ok());
  kv.MarkComputed(1, 10);
  REQUIRE(Blocks(kv, 1) == Ids{0, 1, 2});

  SECTION("holes below the new length take the entries past it, in order") {
    const EvictResult r = MustEvict(kv, 1, {5, 1});
    REQUIRE(r.moves == Moves{{8, 1}, {9, 5}});
    REQUIRE(r.num_evicted == 2);
    REQUIRE(r.freed_blocks == 1);
    REQUIRE(Blocks(kv, 1) == Ids{0, 1});
    REQUIRE(kv.num_tokens(1) == 8);
    REQUIRE(kv.num_computed_tokens(1) == 8);
    REQUIRE(Tokens(kv, 1) == std::vector<int32_t>{100, 108, 102, 103, 104, 109, 106, 107});
    // Slots block * 4 + offset: 8 -> 1 and 9 -> 5.
    REQUIRE(kv.pending_copies().slot_moves == SlotMoves{{8, 1}, {9, 5}});
    REQUIRE(kv.pending_copies().copies.empty());
    // Block 2 is read by the moves: pinned (not free) until they are taken.
    REQUIRE(kv.pool().ref_count(2) == 1);
    REQUIRE(kv.pool().FreeListInOrder() == Ids{3, 4, 5, 6, 7});
    Check(kv, {1});
    const StepCopies step = kv.TakePendingCopies();
    REQUIRE(step.slot_moves.size() == 2);
    REQUIRE(kv.pool().FreeListInOrder() == Ids{3, 4, 5, 6, 7, 2});
    REQUIRE(kv.Stats().kv_evictions == 1);
    REQUIRE(kv.Stats().kv_evicted_tokens == 2);
    REQUIRE(kv.Stats().kv_eviction_freed_blocks == 1);
    REQUIRE(kv.Stats().kv_eviction_slot_moves == 2);
    Check(kv, {1});
  }
  SECTION("a victim past the new length is skipped as a source") {
    const EvictResult r = MustEvict(kv, 1, {8, 0, 3});
    // New length 7: holes 0 and 3; index 8 is a victim, so 7 and 9 move.
    REQUIRE(r.moves == Moves{{7, 0}, {9, 3}});
    REQUIRE(Tokens(kv, 1) == std::vector<int32_t>{107, 101, 102, 109, 104, 105, 106});
    REQUIRE(kv.pending_copies().slot_moves == SlotMoves{{7, 0}, {9, 3}});
    Check(kv, {1});
  }
  SECTION("evicting the newest entries moves nothing and frees at once") {
    const EvictResult r = MustEvict(kv, 1, {9, 8});
    REQUIRE(r.moves.empty());
    REQUIRE(r.freed_blocks == 1);
    REQUIRE(kv.pending_copies().empty());
    REQUIRE(kv.pool().FreeListInOrder() == Ids{3, 4, 5, 6, 7, 2});
    Check(kv, {1});
  }
  SECTION("nothing to evict changes nothing") {
    const EvictResult r = MustEvict(kv, 1, {});
    REQUIRE(r.num_evicted == 0);
    REQUIRE_FALSE(kv.HasEvicted(1));
    REQUIRE(kv.Stats().kv_evictions == 0);
    Check(kv, {1});
  }
  SECTION("the sequence then grows as usual, into its partial last block") {
    MustEvict(kv, 1, {0, 1, 2});  // 7 entries: block 1 is partial
    kv.TakePendingCopies();
    REQUIRE(kv.Append(1, {200, 201}).ok());
    REQUIRE(Blocks(kv, 1) == Ids{0, 1, 3});
    std::vector<int64_t> slots;
    kv.AppendSlotMapping(1, 7, 9, &slots);
    REQUIRE(slots == std::vector<int64_t>{7, 12});
    Check(kv, {1});
  }
}

TEST_CASE("Evict copies filed blocks before writing them and files nothing after",
          "[cache][eviction]") {
  KvCacheManager kv(Tiny(true));
  REQUIRE(kv.Allocate(1, Range(100, 10)).ok());
  kv.MarkComputed(1, 10);  // files blocks 0 and 1
  REQUIRE(kv.IsCachedBlock(0));
  REQUIRE(kv.IsCachedBlock(1));

  const EvictResult r = MustEvict(kv, 1, {1, 5});
  REQUIRE(r.moves == Moves{{8, 1}, {9, 5}});
  // Both receive a moved entry: copied into fresh blocks 3 and 4 first.
  REQUIRE(Pairs(kv.pending_copies().copies) == CopyPairs{{0, 3}, {1, 4}});
  REQUIRE(Blocks(kv, 1) == Ids{3, 4});
  REQUIRE(kv.pending_copies().slot_moves == SlotMoves{{8, 13}, {9, 17}});
  REQUIRE(kv.HasEvicted(1));
  Check(kv, {1});
  kv.TakePendingCopies();
  // The filed originals stay cached for later requests.
  REQUIRE(kv.Stats().num_cached_blocks == 2);
  REQUIRE(kv.pool().FreeListInOrder() == Ids{5, 6, 7, 0, 1, 2});
  absl::StatusOr<AllocateResult> hit = kv.Allocate(2, Range(100, 10));
  REQUIRE(hit.ok());
  REQUIRE(hit->num_cached_tokens == 8);
  REQUIRE(Blocks(kv, 2) == Ids{0, 1, 5});
  Check(kv, {1, 2});

  // Grown to 16 entries and computed: none of its blocks is filed.
  REQUIRE(kv.Append(1, Range(300, 8)).ok());
  REQUIRE(Blocks(kv, 1) == Ids{3, 4, 6, 7});
  kv.MarkComputed(1, 16);
  for (BlockId b : Blocks(kv, 1)) REQUIRE_FALSE(kv.IsCachedBlock(b));
  Check(kv, {1, 2});
}

TEST_CASE("Evict copies a new partial last block that is filed", "[cache][eviction]") {
  KvCacheManager kv(Tiny(true));
  REQUIRE(kv.Allocate(1, Range(0, 12)).ok());
  kv.MarkComputed(1, 12);  // files 0, 1, 2
  const EvictResult r = MustEvict(kv, 1, {10, 11});
  REQUIRE(r.moves.empty());
  REQUIRE(r.freed_blocks == 0);
  // Block 2 will take the next token: copied, so the filed one stays intact.
  REQUIRE(Pairs(kv.pending_copies().copies) == CopyPairs{{2, 3}});
  REQUIRE(Blocks(kv, 1) == Ids{0, 1, 3});
  Check(kv, {1});
  kv.TakePendingCopies();
  REQUIRE(kv.IsCachedBlock(2));
  REQUIRE(kv.Append(1, {99}).ok());
  REQUIRE(Blocks(kv, 1) == Ids{0, 1, 3});
  Check(kv, {1});
}

TEST_CASE("Evict drops the filing of its own block when the pool is full", "[cache][eviction]") {
  KvCacheManager kv(Tiny(true));
  REQUIRE(kv.Allocate(1, Range(0, 8)).ok());
  kv.MarkComputed(1, 8);                        // files 0, 1
  REQUIRE(kv.Allocate(2, Range(50, 24)).ok());  // blocks 2..7: none free
  REQUIRE(kv.num_free_blocks() == 0);
  const EvictResult r = MustEvict(kv, 1, {2});
  REQUIRE(r.moves == Moves{{7, 2}});
  REQUIRE(kv.pending_copies().copies.empty());
  REQUIRE(Blocks(kv, 1) == Ids{0, 1});
  REQUIRE_FALSE(kv.IsCachedBlock(0));  // written by the move: no longer filed
  REQUIRE_FALSE(kv.IsCachedBlock(1));  // the new partial last block
  Check(kv, {1, 2});
}

TEST_CASE("Evict copies blocks a fork shares, or refuses when it cannot", "[cache][eviction]") {
  KvCacheManager kv(Tiny(false));
  REQUIRE(kv.Allocate(1, Range(0, 6)).ok());
  kv.MarkComputed(1, 6);
  kv.Fork(1, 2);
  REQUIRE(Blocks(kv, 2) == Ids{0, 1});

  SECTION("copy-on-write of the block a move writes and of the partial last block") {
    const EvictResult r = MustEvict(kv, 1, {2});
    REQUIRE(r.moves == Moves{{5, 2}});
    REQUIRE(Pairs(kv.pending_copies().copies) == CopyPairs{{0, 2}, {1, 3}});
    REQUIRE(Blocks(kv, 1) == Ids{2, 3});
    REQUIRE(Blocks(kv, 2) == Ids{0, 1});  // the fork keeps the originals
    REQUIRE(kv.pending_copies().slot_moves == SlotMoves{{13, 10}});
    Check(kv, {1, 2});
    kv.TakePendingCopies();
    REQUIRE(Tokens(kv, 2) == Range(0, 6));
    REQUIRE(Tokens(kv, 1) == std::vector<int32_t>{0, 1, 5, 3, 4});
    Check(kv, {1, 2});
  }
  SECTION("with no free block: ResourceExhausted and nothing changed") {
    REQUIRE(kv.Allocate(3, Range(50, 24)).ok());
    REQUIRE(kv.num_free_blocks() == 0);
    absl::StatusOr<EvictResult> r = kv.Evict(1, std::vector<int32_t>{2});
    REQUIRE(r.status().code() == absl::StatusCode::kResourceExhausted);
    REQUIRE(std::string(r.status().message()) ==
            "eviction in sequence 1 must copy 2 shared blocks; 0 of 8 blocks are free");
    REQUIRE(Blocks(kv, 1) == Ids{0, 1});
    REQUIRE(kv.num_tokens(1) == 6);
    REQUIRE(kv.pending_copies().empty());
    REQUIRE_FALSE(kv.HasEvicted(1));
    Check(kv, {1, 2, 3});
  }
  SECTION("a fork taken before the moves run waits for them too") {
    MustEvict(kv, 1, {2});
    kv.Fork(1, 3);
    REQUIRE(Blocks(kv, 3) == Ids{2, 3});
    Check(kv, {1, 2, 3});
    kv.TakePendingCopies();
    REQUIRE(kv.Evict(3, std::vector<int32_t>{0}).ok());
    Check(kv, {1, 2, 3});
  }
}

TEST_CASE("Swap-in takes an evicted sequence's untouched blocks from the cache, not moved ones",
          "[cache][eviction]") {
  KvCacheManager kv(Tiny(true));
  REQUIRE(kv.Allocate(1, Range(0, 12)).ok());
  kv.MarkComputed(1, 12);  // files 0, 1, 2
  const EvictResult r = MustEvict(kv, 1, {6});
  REQUIRE(r.moves == Moves{{11, 6}});
  REQUIRE(Pairs(kv.pending_copies().copies) == CopyPairs{{1, 3}, {2, 4}});
  REQUIRE(Blocks(kv, 1) == Ids{0, 3, 4});
  kv.TakePendingCopies();
  REQUIRE(kv.SwapOut(1).ok());
  REQUIRE(kv.pending_copies().swap_out.size() == 3);
  kv.TakePendingCopies();
  REQUIRE(kv.SwapIn(1).ok());
  // Block 0 is still what was filed: taken back without a copy. Blocks 1
  // and 2 of the sequence changed: copied back from the host.
  REQUIRE(Blocks(kv, 1)[0] == 0);
  REQUIRE(kv.pending_copies().swap_in.size() == 2);
  for (const BlockCopy& c : kv.pending_copies().swap_in) {
    REQUIRE(c.dst != 1);
    REQUIRE(c.dst != 2);
  }
  Check(kv, {1});
  kv.TakePendingCopies();
  Check(kv, {1});
}

}  // namespace
}  // namespace kvserve

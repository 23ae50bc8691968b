// Exact-id scenarios for KvCacheManager on a tiny pool (8 blocks of 4 tokens,
// 4 host blocks): which block ids are handed out, reused, evicted and copied,
// and the ResourceExhausted values the scheduler sees. Every scenario ends
// with the shared invariant checker.
#include "cache/kv_cache_manager.h"

#include <catch2/catch.hpp>
#include <numeric>
#include <string>
#include <vector>

#include "tests/cache/kv_cache_checker.h"
#include "tests/cache/tiny_cache.h"

namespace kvserve {
namespace {

using testing::Blocks;
using testing::Range;
using testing::Tiny;
using Ids = std::vector<BlockId>;

std::vector<int32_t> Concat(std::vector<int32_t> a, const std::vector<int32_t>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

int32_t Cached(const absl::StatusOr<AllocateResult>& r) {
  REQUIRE(r.ok());
  return r->num_cached_tokens;
}

std::string Message(const absl::Status& s) { return std::string(s.message()); }

TEST_CASE("KvCacheConfig names the bad field", "[cache]") {
  KvCacheConfig c = Tiny();
  REQUIRE(c.Validate().ok());
  c.block_size = 0;
  REQUIRE(Message(c.Validate()) == "cache.block_size must be positive, got 0");
  c = Tiny();
  c.num_blocks = -3;
  REQUIRE(Message(c.Validate()) == "cache.num_blocks must be positive, got -3");
  c = Tiny();
  c.num_swap_blocks = -1;
  REQUIRE(Message(c.Validate()) == "cache.num_swap_blocks must not be negative, got -1");
}

TEST_CASE("Allocate takes blocks in LRU order and Free releases the tail first", "[cache]") {
  KvCacheManager kv(Tiny());
  REQUIRE(Cached(kv.Allocate(1, Range(100, 10))) == 0);
  REQUIRE(Blocks(kv, 1) == Ids{0, 1, 2});
  REQUIRE(kv.pool().FreeListInOrder() == Ids{3, 4, 5, 6, 7});
  REQUIRE(Cached(kv.Allocate(2, Range(200, 5))) == 0);
  REQUIRE(Blocks(kv, 2) == Ids{3, 4});

  SECTION("the freed sequence's tail goes to the free list first") {
    kv.Free(1);
    REQUIRE(kv.pool().FreeListInOrder() == Ids{5, 6, 7, 2, 1, 0});
    SeqId live[] = {2};
    testing::CheckKvCache(kv, live);
  }
  SECTION("slot mapping names block * 4 + offset") {
    std::vector<int64_t> slots;
    kv.AppendSlotMapping(2, 0, 5, &slots);
    REQUIRE(slots == std::vector<int64_t>{12, 13, 14, 15, 16});
    kv.AppendSlotMapping(1, 8, 10, &slots);
    REQUIRE(slots == std::vector<int64_t>{12, 13, 14, 15, 16, 8, 9});
  }
}

TEST_CASE("Cached blocks are evicted least recently freed first and tail first", "[cache]") {
  KvCacheManager kv(Tiny());
  const std::vector<int32_t> a = Range(100, 13);
  REQUIRE(Cached(kv.Allocate(1, a)) == 0);
  REQUIRE(Blocks(kv, 1) == Ids{0, 1, 2, 3});
  kv.MarkComputed(1, 13);
  // Full blocks are filed; the partial last block stays private.
  REQUIRE(kv.IsCachedBlock(0));
  REQUIRE(kv.IsCachedBlock(2));
  REQUIRE_FALSE(kv.IsCachedBlock(3));
  REQUIRE(Cached(kv.Allocate(2, Range(200, 8))) == 0);
  REQUIRE(Blocks(kv, 2) == Ids{4, 5});
  kv.MarkComputed(2, 8);

  kv.Free(1);
  kv.Free(2);
  REQUIRE(kv.pool().FreeListInOrder() == Ids{6, 7, 3, 2, 1, 0, 5, 4});
  REQUIRE(kv.Stats().num_cached_blocks == 5);

  // Four fresh blocks: two never used, 3 (uncached partial), then 2, the
  // first cached block in LRU order: the tail of sequence 1.
  REQUIRE(Cached(kv.Allocate(3, Range(300, 16))) == 0);
  REQUIRE(Blocks(kv, 3) == Ids{6, 7, 3, 2});
  REQUIRE(kv.Stats().evicted_cached_blocks == 1);
  REQUIRE_FALSE(kv.IsCachedBlock(2));

  // Sequence 1's prompt again: its head survived (0, 1), its third block was
  // evicted, and the rest comes from sequence 2's blocks, tail (5) first.
  REQUIRE(Cached(kv.Allocate(4, a)) == 8);
  REQUIRE(Blocks(kv, 4) == Ids{0, 1, 5, 4});
  REQUIRE(kv.Stats().evicted_cached_blocks == 3);
  REQUIRE(kv.Stats().num_cached_blocks == 0);
  REQUIRE(kv.pool().num_free() == 0);
  SeqId live[] = {3, 4};
  testing::CheckKvCache(kv, live);
}

TEST_CASE("Prefix hits reuse blocks of running and finished sequences", "[cache]") {
  KvCacheManager kv(Tiny());
  const std::vector<int32_t> p = Range(100, 10);
  REQUIRE(Cached(kv.Allocate(1, p)) == 0);
  REQUIRE(Blocks(kv, 1) == Ids{0, 1, 2});
  kv.MarkComputed(1, 10);

  // Shares the two full blocks with running sequence 1.
  const std::vector<int32_t> p8 = Range(100, 8);
  REQUIRE(Cached(kv.Allocate(2, Concat(p8, {900, 901}))) == 8);
  REQUIRE(Blocks(kv, 2) == Ids{0, 1, 3});
  REQUIRE(kv.pool().ref_count(0) == 2);
  REQUIRE(kv.pool().ref_count(1) == 2);

  // An 8-token prompt could be fully cached, but its last token must be
  // computed for logits, so its second block is computed again.
  REQUIRE(Cached(kv.Allocate(3, p8)) == 4);
  REQUIRE(Blocks(kv, 3) == Ids{0, 4});

  // Another cache salt never shares.
  REQUIRE(Cached(kv.Allocate(4, p, "tenant-b")) == 0);
  REQUIRE(Blocks(kv, 4) == Ids{5, 6, 7});

  SECTION("hits on freed blocks take them out of the LRU list") {
    kv.Free(1);  // frees 2; 1 and 0 are still shared
    kv.Free(2);  // frees 3, then 1; 0 is still sequence 3's
    REQUIRE(kv.pool().FreeListInOrder() == Ids{2, 3, 1});
    REQUIRE(Cached(kv.Allocate(5, p)) == 8);
    REQUIRE(Blocks(kv, 5) == Ids{0, 1, 2});
    REQUIRE(kv.Stats().evicted_cached_blocks == 0);
    SeqId live[] = {3, 4, 5};
    testing::CheckKvCache(kv, live);
  }
  SECTION("stats count queries and hits in tokens") {
    const KvCacheStats st = kv.Stats();
    REQUIRE(st.prefix_queries == 4);
    REQUIRE(st.prefix_query_tokens == 38);
    REQUIRE(st.prefix_hit_tokens == 12);
    REQUIRE(st.prefix_hit_rate() == Approx(12.0 / 38.0));
    SeqId live[] = {1, 2, 3, 4};
    testing::CheckKvCache(kv, live);
  }
}

TEST_CASE("Blocks enter the prefix cache only once their K/V are computed", "[cache]") {
  KvCacheManager kv(Tiny());
  const std::vector<int32_t> p = Range(100, 10);
  REQUIRE(Cached(kv.Allocate(1, p)) == 0);
  REQUIRE(Cached(kv.Allocate(2, p)) == 0);  // sequence 1 is not computed yet
  REQUIRE(Blocks(kv, 2) == Ids{3, 4, 5});

  kv.MarkComputed(1, 4);  // a first prefill chunk
  REQUIRE(Cached(kv.Allocate(3, p)) == 4);
  REQUIRE(Blocks(kv, 3) == Ids{0, 6, 7});

  // Sequence 2 computed the same first block: the hash is taken, so block 3
  // stays private; its second block is filed under the chain through block 0.
  kv.MarkComputed(2, 10);
  REQUIRE_FALSE(kv.IsCachedBlock(3));
  REQUIRE(kv.IsCachedBlock(4));
  kv.Free(3);
  REQUIRE(Cached(kv.Allocate(4, p)) == 8);
  REQUIRE(Blocks(kv, 4) == Ids{0, 4, 7});
  SeqId live[] = {1, 2, 4};
  testing::CheckKvCache(kv, live);
}

TEST_CASE("Prefix caching off never shares", "[cache]") {
  KvCacheManager kv(Tiny(false));
  REQUIRE(Cached(kv.Allocate(1, Range(100, 10))) == 0);
  kv.MarkComputed(1, 10);
  REQUIRE_FALSE(kv.IsCachedBlock(0));
  REQUIRE(Cached(kv.Allocate(2, Range(100, 10))) == 0);
  REQUIRE(Blocks(kv, 2) == Ids{3, 4, 5});
  REQUIRE(kv.Stats().prefix_queries == 0);
}

TEST_CASE("Fork shares every block and the first write copies the shared last block", "[cache]") {
  KvCacheManager kv(Tiny());
  REQUIRE(Cached(kv.Allocate(1, Range(100, 6))) == 0);
  kv.MarkComputed(1, 6);
  kv.Fork(1, 2);
  REQUIRE(Blocks(kv, 2) == Ids{0, 1});
  REQUIRE(kv.pool().ref_count(0) == 2);
  REQUIRE(kv.pool().ref_count(1) == 2);
  REQUIRE(kv.pending_copies().empty());

  REQUIRE(kv.Append(2, {7}).ok());
  REQUIRE(Blocks(kv, 2) == Ids{0, 2});
  REQUIRE(testing::Pairs(kv.pending_copies().copies) == testing::CopyPairs{{1, 2}});

  // Block 1 is sequence 1's alone now: no second copy.
  REQUIRE(kv.Append(1, {8}).ok());
  REQUIRE(Blocks(kv, 1) == Ids{0, 1});
  // Growing into a new block copies nothing.
  REQUIRE(kv.Append(2, {9, 10}).ok());
  REQUIRE(Blocks(kv, 2) == Ids{0, 2, 3});
  REQUIRE(kv.token_ids(2).size() == 9);
  SeqId live[] = {1, 2};
  testing::CheckKvCache(kv, live);  // blocks 1 and 2 pinned by the copy

  const StepCopies step = kv.TakePendingCopies();
  REQUIRE(testing::Pairs(step.copies) == testing::CopyPairs{{1, 2}});
  REQUIRE(step.swap_out.empty());
  REQUIRE(step.swap_in.empty());
  REQUIRE(kv.pending_copies().empty());
  REQUIRE(kv.pool().ref_count(1) == 1);
  REQUIRE(kv.pool().ref_count(2) == 1);
  REQUIRE(kv.Stats().cow_copies == 1);
  std::vector<int64_t> slots;
  kv.AppendSlotMapping(2, 4, 9, &slots);
  REQUIRE(slots == std::vector<int64_t>{8, 9, 10, 11, 12});
  testing::CheckKvCache(kv, live);

  SECTION("a copy source freed in the same step is not reused before the copy runs") {
    kv.MarkComputed(1, 7);
    kv.MarkComputed(2, 9);
    kv.Fork(2, 3);                     // shares 0, 2, 3
    REQUIRE(kv.Append(3, {11}).ok());  // copies 3 -> 4
    kv.Free(2);
    kv.Free(3);  // 3 (source) and 4 (copy) have no owner now
    REQUIRE(kv.pool().FreeListInOrder() == Ids{5, 6, 7, 2});
    REQUIRE(testing::Pairs(kv.TakePendingCopies().copies) == testing::CopyPairs{{3, 4}});
    REQUIRE(kv.pool().FreeListInOrder() == Ids{5, 6, 7, 2, 3, 4});
    SeqId one[] = {1};
    testing::CheckKvCache(kv, one);
  }
}

TEST_CASE("Running out of blocks is a ResourceExhausted value that changes nothing", "[cache]") {
  KvCacheManager kv(Tiny());
  REQUIRE(Cached(kv.Allocate(1, Range(100, 30))) == 0);
  kv.MarkComputed(1, 30);
  REQUIRE(kv.pool().num_free() == 0);

  REQUIRE_FALSE(kv.CanAllocate(Range(500, 1)));
  absl::StatusOr<AllocateResult> r = kv.Allocate(2, Range(500, 1));
  REQUIRE(r.status().code() == absl::StatusCode::kResourceExhausted);
  REQUIRE(Message(r.status()) ==
          "prompt of 1 tokens needs 1 block (0 cached, 1 to take); 0 of 8 blocks are free");
  REQUIRE_FALSE(kv.Contains(2));
  REQUIRE(kv.Allocate(2, {}).status().code() == absl::StatusCode::kInvalidArgument);

  kv.Fork(1, 2);
  // The shared partial last block needs a private copy first.
  REQUIRE_FALSE(kv.CanAppend(2, 1));
  absl::Status s = kv.Append(2, {5});
  REQUIRE(s.code() == absl::StatusCode::kResourceExhausted);
  REQUIRE(Message(s) ==
          "sequence 2 needs 1 more block (one copy-on-write); 0 of 8 blocks are free");
  REQUIRE(kv.num_tokens(2) == 30);
  REQUIRE(kv.pending_copies().empty());
  REQUIRE(kv.Append(2, {}).ok());

  kv.Free(2);
  REQUIRE(kv.CanAppend(1, 2));  // fills the last block
  REQUIRE(kv.Append(1, {5, 6}).ok());
  s = kv.Append(1, {7});
  REQUIRE(s.code() == absl::StatusCode::kResourceExhausted);
  REQUIRE(Message(s) == "sequence 1 needs 1 more block; 0 of 8 blocks are free");

  SeqId one[] = {1};
  REQUIRE_FALSE(kv.CanSwapOut(one));
  s = kv.SwapOut(1);
  REQUIRE(s.code() == absl::StatusCode::kResourceExhausted);
  REQUIRE(Message(s) == "swap-out of 1 sequence(s) needs 8 host blocks; 4 of 4 are free");
  REQUIRE_FALSE(kv.IsSwapped(1));
  testing::CheckKvCache(kv, one);
}

TEST_CASE("Swap moves a sequence's blocks in one batched copy each way", "[cache]") {
  KvCacheManager kv(Tiny(false));
  REQUIRE(Cached(kv.Allocate(1, Range(100, 7))) == 0);
  REQUIRE(Cached(kv.Allocate(2, Range(200, 9))) == 0);
  REQUIRE(Blocks(kv, 2) == Ids{2, 3, 4});

  REQUIRE(kv.SwapOut(2).ok());
  REQUIRE(kv.IsSwapped(2));
  REQUIRE(Blocks(kv, 2) == Ids{0, 1, 2});  // host ids now
  REQUIRE(testing::Pairs(kv.pending_copies().swap_out) ==
          testing::CopyPairs{{2, 0}, {3, 1}, {4, 2}});
  // The primary blocks are free at once, so preemption makes room this step.
  REQUIRE(kv.pool().FreeListInOrder() == Ids{5, 6, 7, 4, 3, 2});

  absl::Status s = kv.SwapOut(1);
  REQUIRE(s.code() == absl::StatusCode::kResourceExhausted);
  REQUIRE(Message(s) == "swap-out of 1 sequence(s) needs 2 host blocks; 1 of 4 are free");

  REQUIRE(testing::Pairs(kv.TakePendingCopies().swap_out) ==
          testing::CopyPairs{{2, 0}, {3, 1}, {4, 2}});
  REQUIRE(Cached(kv.Allocate(3, Range(300, 8))) == 0);
  REQUIRE(Blocks(kv, 3) == Ids{5, 6});

  SeqId two[] = {2};
  REQUIRE(kv.CanSwapIn(two));
  REQUIRE(kv.SwapIn(2).ok());
  REQUIRE(Blocks(kv, 2) == Ids{7, 4, 3});
  REQUIRE(testing::Pairs(kv.pending_copies().swap_in) ==
          testing::CopyPairs{{0, 7}, {1, 4}, {2, 3}});
  REQUIRE(kv.swap_pool().num_free() == 1);  // host blocks wait for the copy
  SeqId live[] = {1, 2, 3};
  testing::CheckKvCache(kv, live);
  REQUIRE(testing::Pairs(kv.TakePendingCopies().swap_in) ==
          testing::CopyPairs{{0, 7}, {1, 4}, {2, 3}});
  REQUIRE(kv.swap_pool().num_free() == 4);

  const KvCacheStats st = kv.Stats();
  REQUIRE(st.swapped_out_blocks == 3);
  REQUIRE(st.swapped_in_blocks == 3);
  REQUIRE(kv.CanSwapIn(std::span<const SeqId>()));
  testing::CheckKvCache(kv, live);
}

TEST_CASE("Forked sequences swap as a group and stay shared", "[cache]") {
  KvCacheManager kv(Tiny());
  REQUIRE(Cached(kv.Allocate(3, Range(300, 5))) == 0);
  REQUIRE(Cached(kv.Allocate(1, Range(100, 7))) == 0);
  REQUIRE(Blocks(kv, 1) == Ids{2, 3});
  kv.MarkComputed(1, 7);  // files block 2
  kv.Fork(1, 2);

  SeqId group[] = {1, 2};
  REQUIRE(kv.SwapOut(group).ok());
  REQUIRE(testing::Pairs(kv.pending_copies().swap_out) ==
          testing::CopyPairs{{2, 0}, {3, 1}});  // once each
  REQUIRE(Blocks(kv, 1) == Ids{0, 1});
  REQUIRE(Blocks(kv, 2) == Ids{0, 1});
  REQUIRE(kv.swap_pool().ref_count(0) == 3);  // two tables and the pending copy
  REQUIRE(kv.pool().FreeListInOrder() == Ids{4, 5, 6, 7, 3, 2});
  kv.TakePendingCopies();

  REQUIRE(Cached(kv.Allocate(4, Range(400, 16))) == 0);
  REQUIRE(Cached(kv.Allocate(5, Range(500, 4))) == 0);
  REQUIRE(kv.pool().FreeListInOrder() == Ids{2});
  REQUIRE_FALSE(kv.CanSwapIn(group));
  absl::Status s = kv.SwapIn(group);
  REQUIRE(s.code() == absl::StatusCode::kResourceExhausted);
  REQUIRE(Message(s) == "swap-in of 2 sequence(s) needs 2 blocks; 1 of 8 are free");

  kv.Free(5);
  // Block 2 still holds the first block's K/V in the prefix cache: it comes
  // back without a copy; only the second block is copied in.
  REQUIRE(kv.SwapIn(group).ok());
  REQUIRE(Blocks(kv, 1) == Ids{2, 3});
  REQUIRE(Blocks(kv, 2) == Ids{2, 3});
  REQUIRE(testing::Pairs(kv.pending_copies().swap_in) == testing::CopyPairs{{1, 3}});
  REQUIRE(kv.Stats().swapped_in_blocks == 1);
  SeqId live[] = {1, 2, 3, 4};
  testing::CheckKvCache(kv, live);
}

TEST_CASE("Copies recorded in one step never read a block a pending copy writes", "[cache]") {
  KvCacheManager kv(Tiny());
  REQUIRE(Cached(kv.Allocate(1, Range(100, 6))) == 0);
  kv.MarkComputed(1, 6);

  SECTION("swapping out a fresh copy-on-write block copies from its source") {
    kv.Fork(1, 2);
    REQUIRE(kv.Append(2, {7}).ok());  // copies 1 -> 2
    REQUIRE(kv.SwapOut(2).ok());
    const StepCopies& p = kv.pending_copies();
    REQUIRE(testing::Pairs(p.copies) == testing::CopyPairs{{1, 2}});
    REQUIRE(testing::Pairs(p.swap_out) ==
            testing::CopyPairs{{0, 0}, {1, 1}});  // not {2, 1}: 2 is written after
    SeqId live[] = {1, 2};
    testing::CheckKvCache(kv, live);
  }
  SECTION("copy-on-write of a block still being swapped in copies from the host") {
    REQUIRE(kv.SwapOut(1).ok());
    kv.TakePendingCopies();
    REQUIRE(kv.SwapIn(1).ok());
    REQUIRE(Blocks(kv, 1) == Ids{0, 2});  // block 0 was still cached
    kv.Fork(1, 2);
    REQUIRE(kv.Append(2, {7}).ok());
    REQUIRE(Blocks(kv, 2) == Ids{0, 3});
    const StepCopies& p = kv.pending_copies();
    REQUIRE(testing::Pairs(p.swap_in) == testing::CopyPairs{{1, 2}, {1, 3}});
    REQUIRE(p.copies.empty());
    SeqId live[] = {1, 2};
    testing::CheckKvCache(kv, live);
  }
  SECTION("swapping out a block still being swapped in keeps its host block") {
    REQUIRE(kv.SwapOut(1).ok());
    kv.TakePendingCopies();
    REQUIRE(kv.SwapIn(1).ok());
    REQUIRE(kv.SwapOut(1).ok());
    REQUIRE(Blocks(kv, 1) == Ids{2, 1});  // 0 -> new host 2; block 2 -> host 1 again
    const StepCopies& p = kv.pending_copies();
    REQUIRE(testing::Pairs(p.swap_out) == testing::CopyPairs{{0, 2}});
    REQUIRE(testing::Pairs(p.swap_in) == testing::CopyPairs{{1, 2}});
    SeqId live[] = {1};
    testing::CheckKvCache(kv, live);
  }
}

}  // namespace
}  // namespace kvserve

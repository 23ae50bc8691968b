// Exact-id scenarios for KvCacheManager's tail blocks (int4_kc) on a tiny
// pool: 8 blocks of 4 tokens and 3 tails, 4 host blocks and 2 host tails.
// Copies name tails with extended ids: primary tails are 8, 9, 10 and host
// tails 4, 5. Every scenario ends with the shared invariant checker.
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
using testing::TinyWithTails;
using Ids = std::vector<BlockId>;
using testing::CopyPairs;
using testing::Pairs;

std::string Message(const absl::Status& s) { return std::string(s.message()); }

TEST_CASE("A sequence holds a tail while a block of it is partial or uncomputed", "[cache]") {
  KvCacheManager kv(TinyWithTails());
  REQUIRE(kv.has_tails());
  REQUIRE(kv.Allocate(1, Range(100, 6)).ok());
  REQUIRE(Blocks(kv, 1) == Ids{0, 1});
  REQUIRE(kv.tail_id(1) == 0);
  REQUIRE(kv.tail_block(1) == 8);  // extended id: blocks 0..7, then tails
  REQUIRE(kv.tail_pool().num_free() == 2);
  kv.MarkComputed(1, 6);
  REQUIRE(kv.tail_id(1) == 0);  // rows 4, 5 live in it
  REQUIRE(kv.Append(1, {7, 8}).ok());
  kv.MarkComputed(1, 8);
  // Both blocks full and computed: nothing partial left.
  REQUIRE(kv.tail_id(1) == -1);
  REQUIRE(kv.tail_pool().FreeListInOrder() == Ids{1, 2, 0});
  REQUIRE(kv.Append(1, {9}).ok());
  REQUIRE(kv.tail_id(1) == 1);
  SeqId live[] = {1};
  testing::CheckKvCache(kv, live);

  SECTION("a prompt that fills its blocks still holds a tail until it is computed") {
    REQUIRE(kv.Allocate(2, Range(200, 8)).ok());
    REQUIRE(kv.tail_id(2) == 2);  // a prefill chunk may end inside a block
    kv.MarkComputed(2, 4);
    REQUIRE(kv.tail_id(2) == 2);
    kv.MarkComputed(2, 8);
    REQUIRE(kv.tail_id(2) == -1);
  }
  SECTION("Free releases the tail") {
    kv.Free(1);
    REQUIRE(kv.tail_pool().num_free() == 3);
    testing::CheckKvCache(kv, {});
  }
}

TEST_CASE("Fork shares the tail and the first Append copies it, not the partial block", "[cache]") {
  KvCacheManager kv(TinyWithTails());
  REQUIRE(kv.Allocate(1, Range(100, 6)).ok());
  kv.MarkComputed(1, 6);
  kv.Fork(1, 2);
  REQUIRE(kv.tail_block(2) == 8);
  REQUIRE(kv.tail_pool().ref_count(0) == 2);
  REQUIRE(kv.pending_copies().empty());

  REQUIRE(kv.CanAppend(2, 1));
  REQUIRE(kv.Append(2, {7}).ok());
  // The partial block 1 moves to a fresh block 2 without a copy (its rows
  // are in the tail); the tail is copied 8 -> 9.
  REQUIRE(Blocks(kv, 2) == Ids{0, 2});
  REQUIRE(kv.tail_block(2) == 9);
  REQUIRE(Pairs(kv.pending_copies().copies) == CopyPairs{{8, 9}});
  // Sequence 1 holds tail 0 alone now: no second copy.
  REQUIRE(kv.Append(1, {8}).ok());
  REQUIRE(kv.tail_block(1) == 8);
  SeqId live[] = {1, 2};
  testing::CheckKvCache(kv, live);  // tails 8 and 9 pinned by the copy

  const StepCopies step = kv.TakePendingCopies();
  REQUIRE(Pairs(step.copies) == CopyPairs{{8, 9}});
  REQUIRE(kv.Stats().cow_copies == 1);
  REQUIRE(kv.tail_pool().ref_count(0) == 1);
  REQUIRE(kv.tail_pool().ref_count(1) == 1);
  testing::CheckKvCache(kv, live);

  SECTION("forked at a block boundary, each sibling takes a fresh tail and copies nothing") {
    kv.MarkComputed(1, 7);
    kv.MarkComputed(2, 7);
    REQUIRE(kv.Append(2, {1}).ok());
    kv.MarkComputed(2, 8);
    REQUIRE(kv.tail_id(2) == -1);
    kv.Fork(2, 3);
    REQUIRE(kv.Append(3, {2}).ok());
    REQUIRE(kv.Append(2, {3}).ok());
    REQUIRE(kv.pending_copies().empty());
    REQUIRE(kv.tail_id(3) == 2);
    REQUIRE(kv.tail_id(2) == 1);
    SeqId three[] = {1, 2, 3};
    testing::CheckKvCache(kv, three);
  }
}

TEST_CASE("Swap moves the tail to a host tail and back", "[cache]") {
  KvCacheManager kv(TinyWithTails(false));
  REQUIRE(kv.Allocate(1, Range(100, 6)).ok());
  kv.MarkComputed(1, 6);
  REQUIRE(kv.SwapOut(1).ok());
  REQUIRE(Blocks(kv, 1) == Ids{0, 1});  // host ids
  REQUIRE(kv.tail_block(1) == 4);       // host tail 0: after the 4 host blocks
  REQUIRE(Pairs(kv.pending_copies().swap_out) == CopyPairs{{0, 0}, {1, 1}, {8, 4}});
  REQUIRE(kv.tail_pool().num_free() == 3);  // freed at once, like the blocks
  SeqId one[] = {1};
  testing::CheckKvCache(kv, one);
  kv.TakePendingCopies();

  REQUIRE(kv.CanSwapIn(one));
  REQUIRE(kv.SwapIn(1).ok());
  REQUIRE(Blocks(kv, 1) == Ids{2, 3});
  REQUIRE(kv.tail_block(1) == 9);
  REQUIRE(kv.tail_id(1) == 1);
  REQUIRE(Pairs(kv.pending_copies().swap_in) == CopyPairs{{0, 2}, {1, 3}, {4, 9}});
  testing::CheckKvCache(kv, one);
  kv.TakePendingCopies();
  REQUIRE(kv.swap_tail_pool().num_free() == 2);

  SECTION("host tails run out before host blocks: ResourceExhausted, nothing changed") {
    REQUIRE(kv.Allocate(2, {1}).ok());
    REQUIRE(kv.Allocate(3, {2}).ok());
    SeqId group[] = {1, 2, 3};
    REQUIRE_FALSE(kv.CanSwapOut(group));
    const absl::Status s = kv.SwapOut(group);
    REQUIRE(s.code() == absl::StatusCode::kResourceExhausted);
    REQUIRE(Message(s) ==
            "swap-out of 3 sequence(s) needs 4 host blocks; 4 of 4 are free (and 3 of 2 free of "
            "2 host tails)");
    REQUIRE(kv.pending_copies().empty());
    testing::CheckKvCache(kv, group);
  }
  SECTION("a tail swapped in and out in one step goes back to its host tail, uncopied") {
    REQUIRE(kv.SwapOut(1).ok());
    kv.TakePendingCopies();
    REQUIRE(kv.SwapIn(1).ok());
    const BlockId host_tail = Pairs(kv.pending_copies().swap_in).back().first;
    REQUIRE(kv.SwapOut(1).ok());
    REQUIRE(kv.tail_block(1) == host_tail);
    REQUIRE(kv.pending_copies().swap_out.empty());
    testing::CheckKvCache(kv, one);
  }
}

TEST_CASE("Running out of tails is a ResourceExhausted value that changes nothing", "[cache]") {
  KvCacheManager kv(TinyWithTails());
  for (SeqId s = 1; s <= 3; ++s) REQUIRE(kv.Allocate(s, Range(10 * s, 4)).ok());
  REQUIRE(kv.tail_pool().num_free() == 0);
  REQUIRE_FALSE(kv.CanAllocate(Range(500, 1)));
  absl::StatusOr<AllocateResult> r = kv.Allocate(4, Range(500, 1));
  REQUIRE(r.status().code() == absl::StatusCode::kResourceExhausted);
  REQUIRE(Message(r.status()) == "prompt of 1 tokens needs a tail block; all 3 are taken");
  REQUIRE_FALSE(kv.Contains(4));
  REQUIRE(kv.pool().num_free() == 5);

  kv.MarkComputed(1, 4);  // block 0 full and computed: its tail goes back
  REQUIRE(kv.tail_id(1) == -1);
  kv.MarkComputed(2, 4);
  REQUIRE(kv.tail_pool().num_free() == 2);
  kv.Fork(2, 4);
  REQUIRE(kv.Allocate(5, Range(700, 1)).ok());
  REQUIRE(kv.Allocate(6, Range(800, 1)).ok());  // takes the last free tail
  // Appending to a sequence without a tail needs one.
  REQUIRE_FALSE(kv.CanAppend(4, 1));
  absl::Status s = kv.Append(4, {1});
  REQUIRE(s.code() == absl::StatusCode::kResourceExhausted);
  REQUIRE(Message(s) == "sequence 4 needs a tail block; all 3 are taken");
  REQUIRE(kv.num_tokens(4) == 4);
  SeqId live[] = {1, 2, 3, 4, 5, 6};
  testing::CheckKvCache(kv, live);
}

TEST_CASE("Only full, computed blocks are filed, and a prefix hit leaves the tail to compute",
          "[cache]") {
  KvCacheManager kv(TinyWithTails());
  REQUIRE(kv.Allocate(1, Range(100, 10)).ok());
  kv.MarkComputed(1, 10);
  REQUIRE(kv.IsCachedBlock(0));
  REQUIRE(kv.IsCachedBlock(1));
  REQUIRE_FALSE(kv.IsCachedBlock(2));  // partial: its rows are in tail 0
  std::vector<int32_t> prompt = Range(100, 8);
  prompt.push_back(999);
  absl::StatusOr<AllocateResult> r = kv.Allocate(2, prompt);
  REQUIRE(r.ok());
  REQUIRE(r->num_cached_tokens == 8);
  REQUIRE(Blocks(kv, 2) == Ids{0, 1, 3});
  REQUIRE(kv.tail_id(2) == 1);  // its own, fresh tail
  SeqId live[] = {1, 2};
  testing::CheckKvCache(kv, live);
}

TEST_CASE("Tail counts are validated", "[cache]") {
  KvCacheConfig c = TinyWithTails();
  c.num_tail_blocks = -1;
  REQUIRE(Message(c.Validate()) == "cache tail blocks must not be negative, got -1 and 2");
}

}  // namespace
}  // namespace kvserve

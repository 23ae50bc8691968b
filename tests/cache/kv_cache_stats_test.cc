// KvCacheStats after a scripted scenario on the tiny pool (8 blocks of 4
// tokens, 4 host blocks): gauges and counters at each stage.
#include <catch2/catch.hpp>
#include <numeric>
#include <vector>

#include "cache/kv_cache_manager.h"
#include "tests/cache/kv_cache_checker.h"
#include "tests/cache/tiny_cache.h"

namespace kvserve {
namespace {

using testing::Range;

TEST_CASE("KvCacheStats follow a scripted scenario", "[cache]") {
  KvCacheConfig config;
  config.block_size = 4;
  config.num_blocks = 8;
  config.num_swap_blocks = 4;
  KvCacheManager kv(config);

  KvCacheStats st = kv.Stats();
  REQUIRE(st.num_blocks == 8);
  REQUIRE(st.num_free_blocks == 8);
  REQUIRE(st.num_active_blocks == 0);
  REQUIRE(st.active_usage == 0.0);
  REQUIRE(st.prefix_hit_rate() == 0.0);

  // Two sequences with one prompt: the second shares two computed blocks.
  REQUIRE(kv.Allocate(1, Range(100, 10)).ok());
  kv.MarkComputed(1, 10);
  REQUIRE(kv.Allocate(2, Range(100, 10))->num_cached_tokens == 8);
  st = kv.Stats();
  REQUIRE(st.num_free_blocks == 4);
  REQUIRE(st.num_active_blocks == 4);  // 0, 1 shared; 2, 3 private
  REQUIRE(st.num_cached_blocks == 0);
  REQUIRE(st.active_usage == 0.5);
  REQUIRE(st.usage_with_cached == 0.5);
  REQUIRE(st.prefix_queries == 2);
  REQUIRE(st.prefix_query_tokens == 20);
  REQUIRE(st.prefix_hit_tokens == 8);
  REQUIRE(st.num_sequences == 2);

  // Both finish: their filed blocks stay cached and reusable.
  kv.Free(1);
  kv.Free(2);
  st = kv.Stats();
  REQUIRE(st.num_free_blocks == 8);
  REQUIRE(st.num_active_blocks == 0);
  REQUIRE(st.num_cached_blocks == 2);
  REQUIRE(st.active_usage == 0.0);
  REQUIRE(st.usage_with_cached == 0.25);

  // A fork writes into its shared last block, and its parent is swapped out.
  REQUIRE(kv.Allocate(3, Range(500, 6)).ok());  // blocks 4, 5
  kv.MarkComputed(3, 6);
  kv.Fork(3, 4);
  REQUIRE(kv.Append(4, {1}).ok());  // copies 5 -> 6
  REQUIRE(kv.SwapOut(3).ok());      // 4 -> host 0, 5 -> host 1
  st = kv.Stats();
  REQUIRE(st.cow_copies == 1);
  REQUIRE(st.swapped_out_blocks == 2);
  REQUIRE(st.num_swapped_sequences == 1);
  REQUIRE(st.num_swap_free_blocks == 2);
  REQUIRE(st.num_active_blocks == 3);  // 4 (fork), 5 (pinned by its copy), 6
  REQUIRE(st.num_cached_blocks == 2);

  const StepCopies copies = kv.TakePendingCopies();
  REQUIRE(testing::Pairs(copies.copies) == testing::CopyPairs{{5, 6}});
  REQUIRE(testing::Pairs(copies.swap_out) == testing::CopyPairs{{4, 0}, {5, 1}});
  REQUIRE(kv.Stats().num_active_blocks == 2);

  // Back in: block 4 is still held by the fork, so only block 5 is copied.
  REQUIRE(kv.SwapIn(3).ok());
  REQUIRE(kv.block_table(3).blocks() == std::vector<BlockId>{4, 7});
  REQUIRE(testing::Pairs(kv.pending_copies().swap_in) == testing::CopyPairs{{1, 7}});
  // A new prompt needs three blocks: 2, 3, then cached block 1 is evicted.
  REQUIRE(kv.Allocate(5, Range(900, 12)).ok());
  REQUIRE(kv.block_table(5).blocks() == std::vector<BlockId>{2, 3, 1});

  st = kv.Stats();
  REQUIRE(st.num_blocks == 8);
  REQUIRE(st.num_free_blocks == 2);
  REQUIRE(st.num_active_blocks == 6);
  REQUIRE(st.num_cached_blocks == 1);
  REQUIRE(st.active_usage == 0.75);
  REQUIRE(st.usage_with_cached == 0.875);
  REQUIRE(st.num_swap_blocks == 4);
  REQUIRE(st.num_swap_free_blocks == 3);  // host 1 waits for its copy
  REQUIRE(st.num_sequences == 3);
  REQUIRE(st.num_swapped_sequences == 0);
  REQUIRE(st.prefix_queries == 4);
  REQUIRE(st.prefix_query_tokens == 38);
  REQUIRE(st.prefix_hit_tokens == 8);
  REQUIRE(st.cow_copies == 1);
  REQUIRE(st.swapped_out_blocks == 2);
  REQUIRE(st.swapped_in_blocks == 1);
  REQUIRE(st.evicted_cached_blocks == 1);
  SeqId live[] = {3, 4, 5};
  testing::CheckKvCache(kv, live);
}

}  // namespace
}  // namespace kvserve

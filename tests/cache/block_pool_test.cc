#include "cache/block_pool.h"

#include <catch2/catch.hpp>

namespace kvserve {
namespace {

TEST_CASE("BlockPool hands out ids in LRU order and counts references", "[cache]") {
  BlockPool pool(4);
  REQUIRE(pool.num_free() == 4);
  REQUIRE(pool.FreeListInOrder() == std::vector<BlockId>{0, 1, 2, 3});

  SECTION("allocate takes from the head") {
    REQUIRE(*pool.Allocate() == 0);
    REQUIRE(*pool.Allocate() == 1);
    REQUIRE(pool.num_free() == 2);
    REQUIRE(pool.ref_count(0) == 1);
  }
  SECTION("a shared block is freed only by its last reference") {
    BlockId a = *pool.Allocate();
    pool.AddRef(a);
    REQUIRE(pool.ref_count(a) == 2);
    REQUIRE_FALSE(pool.Release(a));
    REQUIRE_FALSE(pool.is_free(a));
    REQUIRE(pool.Release(a));
    REQUIRE(pool.is_free(a));
    // Released blocks go to the tail, so they are reused last.
    REQUIRE(pool.FreeListInOrder() == std::vector<BlockId>{1, 2, 3, 0});
  }
  SECTION("Take removes a block from the middle of the free list") {
    pool.Take(2);
    REQUIRE(pool.FreeListInOrder() == std::vector<BlockId>{0, 1, 3});
    REQUIRE(pool.ref_count(2) == 1);
  }
  SECTION("an empty pool says so instead of failing") {
    for (int i = 0; i < 4; ++i) REQUIRE(pool.Allocate().has_value());
    REQUIRE_FALSE(pool.Allocate().has_value());
    REQUIRE(pool.num_used() == 4);
    for (BlockId id = 0; id < 4; ++id) pool.Release(id);
    REQUIRE(pool.num_free() == 4);
  }
}

}  // namespace
}  // namespace kvserve

#include "cache/block_hash.h"

#include <catch2/catch.hpp>
#include <unordered_set>
#include <vector>

#include "cache/prefix_cache.h"

namespace kvserve {
namespace {

TEST_CASE("HashBlock depends on parent and extra key and every token in order", "[cache]") {
  const std::vector<int32_t> t = {1, 2, 3, 4};
  const BlockHash h = HashBlock(0, 0, t);
  REQUIRE(HashBlock(0, 0, t) == h);
  REQUIRE(HashBlock(1, 0, t) != h);
  REQUIRE(HashBlock(0, 1, t) != h);
  REQUIRE(HashBlock(0, 0, std::vector<int32_t>{1, 2, 4, 3}) != h);
  REQUIRE(HashBlock(0, 0, std::vector<int32_t>{1, 2, 3, 0}) != h);
  // A trailing 0 token is not the same as no token.
  REQUIRE(HashBlock(0, 0, std::vector<int32_t>{1, 2, 3}) !=
          HashBlock(0, 0, std::vector<int32_t>{1, 2, 3, 0}));
}

TEST_CASE("HashBlock has no collisions over every pair of 600 tokens", "[cache]") {
  std::unordered_set<BlockHash> seen;
  for (int32_t a = 0; a < 600; ++a) {
    for (int32_t b = 0; b < 600; ++b) {
      const int32_t block[4] = {a, b, 7, 7};
      REQUIRE(seen.insert(HashBlock(0, 0, block)).second);
    }
  }
  // Chains of the same block under different parents spread too.
  BlockHash h = 0;
  const int32_t same[4] = {5, 5, 5, 5};
  for (int i = 0; i < 10000; ++i) {
    h = HashBlock(h, 0, same);
    REQUIRE(seen.insert(h).second);
  }
}

TEST_CASE("HashCacheSalt keeps the empty salt apart from every other", "[cache]") {
  REQUIRE(HashCacheSalt("") == 0);
  REQUIRE(HashCacheSalt("a") != 0);
  REQUIRE(HashCacheSalt("a") != HashCacheSalt("b"));
  REQUIRE(HashCacheSalt("tenant-0001") != HashCacheSalt("tenant-0002"));
  REQUIRE(HashCacheSalt(std::string_view("a\0", 2)) != HashCacheSalt("a"));
}

TEST_CASE("PrefixCache re-checks a hit token by token", "[cache]") {
  PrefixCache cache(4, 2);
  const std::vector<int32_t> t = {10, 11};
  const BlockHash h = HashBlock(0, 0, t);
  REQUIRE(cache.Insert(3, h, 0, 0, t));
  REQUIRE(cache.size() == 1);
  REQUIRE(cache.contains(3));
  REQUIRE(cache.Find(h, 0, 0, t) == 3);

  SECTION("a colliding hash with other content is a miss, never a false hit") {
    REQUIRE(cache.Find(h, 0, 0, std::vector<int32_t>{10, 12}) == kNoBlock);
    REQUIRE(cache.Find(h, 1, 0, t) == kNoBlock);  // another parent
    REQUIRE(cache.Find(h, 0, 9, t) == kNoBlock);  // another salt
  }
  SECTION("a taken hash is not filed twice") {
    REQUIRE_FALSE(cache.Insert(1, h, 0, 0, t));
    REQUIRE_FALSE(cache.contains(1));
  }
  SECTION("Erase drops the registration") {
    cache.Erase(3);
    REQUIRE_FALSE(cache.contains(3));
    REQUIRE(cache.Find(h, 0, 0, t) == kNoBlock);
    REQUIRE(cache.Insert(1, h, 0, 0, t));
  }
  REQUIRE(cache.CheckConsistent().ok());
}

}  // namespace
}  // namespace kvserve

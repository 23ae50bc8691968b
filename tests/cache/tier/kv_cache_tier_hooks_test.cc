// KvCacheManager with a tier source: which blocks spill when the pool hands
// out filed blocks, and which device blocks a chain found below the device
// is loaded into (exact ids, on a 4-block pool of 4-token blocks).
#include <catch2/catch.hpp>
#include <cstring>
#include <vector>

#include "cache/kv_cache_manager.h"
#include "cache/tier/kv_tiers.h"

namespace kvserve {
namespace {

const TierIdentity kId{.model_fingerprint = 1, .kv_format = 2, .block_size = 4, .payload_bytes = 8};

std::vector<uint8_t> PayloadOf(BlockId block) { return std::vector<uint8_t>(8, 0x10 + block); }

TEST_CASE("Filed blocks the pool reuses spill and come back from the host tier into fresh blocks",
          "[cache][tier]") {
  KvCacheManager kv({.block_size = 4, .num_blocks = 4});
  KvTierConfig config;
  config.host_bytes = 1 << 20;
  auto tiers = KvTiers::Create(config, kId);
  REQUIRE(tiers.ok());
  kv.set_tier_source(tiers->get());

  const std::vector<int32_t> a = {1, 2, 3, 4, 5, 6, 7, 8, 9};
  REQUIRE(kv.Allocate(1, a).ok());
  kv.MarkComputed(1, 9);  // blocks 0 and 1 filed
  kv.Free(1);             // free list: 3, then 2, 1, 0 (tail first)
  REQUIRE(kv.TakeTierTransfers().empty());

  const std::vector<int32_t> b = {21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31, 32, 33};
  REQUIRE(kv.Allocate(2, b).ok());
  TierTransfers t = kv.TakeTierTransfers();
  REQUIRE(t.loads.empty());
  REQUIRE(t.spills.size() == 2);
  REQUIRE(t.spills[0].block == 1);
  REQUIRE(t.spills[1].block == 0);
  REQUIRE(t.spill_tokens == std::vector<int32_t>{5, 6, 7, 8, 1, 2, 3, 4});
  REQUIRE(t.spills[0].parent == t.spills[1].hash);
  // What the engine does with a spill: the block's bytes into the tier.
  for (size_t i = 0; i < t.spills.size(); ++i) {
    const TierSpill& s = t.spills[i];
    const std::vector<uint8_t> bytes = PayloadOf(s.block);
    (*tiers)->Store(
        {s.hash, s.parent, s.extra_key, std::span<const int32_t>(t.spill_tokens).subspan(4 * i, 4)},
        bytes);
  }
  kv.Free(2);  // nothing computed: free list 0, 1, 2, 3

  SECTION("the same prompt loads both blocks below the device into blocks 0 and 1") {
    auto r = kv.Allocate(3, a);
    REQUIRE(r.ok());
    REQUIRE(r->num_cached_tokens == 8);
    REQUIRE(r->num_tier_tokens == 8);
    REQUIRE(kv.block_table(3).blocks() == std::vector<BlockId>{0, 1, 2});
    REQUIRE(kv.num_computed_tokens(3) == 8);
    t = kv.TakeTierTransfers();
    REQUIRE(t.spills.empty());
    REQUIRE(t.loads.size() == 2);
    REQUIRE(t.loads[0].block == 0);
    REQUIRE(t.loads[1].block == 1);
    // Block 0 of the chain was spilled from device block 0, block 1 from 1.
    REQUIRE(std::memcmp(t.loads[0].hit.payload, PayloadOf(0).data(), 8) == 0);
    REQUIRE(std::memcmp(t.loads[1].hit.payload, PayloadOf(1).data(), 8) == 0);
    REQUIRE(t.loads[0].hit.tier == static_cast<uint8_t>(TierKind::kHost));
    // Filed again: a second sequence shares them on the device.
    REQUIRE(kv.IsCachedBlock(0));
    REQUIRE(kv.IsCachedBlock(1));
    auto r2 = kv.Allocate(4, std::vector<int32_t>{1, 2, 3, 4, 5, 6, 7, 8, 40});
    REQUIRE(r2.ok());
    REQUIRE(r2->num_tier_tokens == 0);
    REQUIRE(r2->num_cached_tokens == 8);
    REQUIRE(kv.block_table(4).blocks() == std::vector<BlockId>{0, 1, 3});
    REQUIRE(kv.CheckInvariants().ok());
    REQUIRE((*tiers)->Stats()[static_cast<int>(TierKind::kHost)].hit_blocks == 2);
  }
  SECTION("another salt or a prompt that differs in its first block loads nothing") {
    auto r = kv.Allocate(3, a, "salt");
    REQUIRE(r.ok());
    REQUIRE(r->num_cached_tokens == 0);
    kv.Free(3);
    REQUIRE(kv.Allocate(4, std::vector<int32_t>{99, 2, 3, 4, 5}).ok());
    REQUIRE(kv.TakeTierTransfers().loads.empty());
    REQUIRE(kv.CheckInvariants().ok());
  }
  SECTION("a prompt ending inside the second block loads only the first") {
    auto r = kv.Allocate(3, std::vector<int32_t>{1, 2, 3, 4, 5, 6, 7, 8});
    REQUIRE(r.ok());
    REQUIRE(r->num_cached_tokens == 4);  // the last token is always computed
    REQUIRE(kv.TakeTierTransfers().loads.size() == 1);
  }
}

}  // namespace
}  // namespace kvserve

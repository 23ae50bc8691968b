// KvTiers' staging of background loads: fetched values wait, least recently
// used first out, within cache staging_bytes (the engine sets it to its
// device pool's bytes, so a prompt's first blocks outlive its last loads).
#include <catch2/catch.hpp>
#include <memory>
#include <string>

#include "cache/tier/kv_tiers.h"

namespace kvserve {
namespace {

const TierIdentity kId{.model_fingerprint = 1, .kv_format = 2, .block_size = 4, .payload_bytes = 8};

std::shared_ptr<const std::string> Value() {
  return std::make_shared<const std::string>(TierValueBytes(kId), '\x5a');
}

TEST_CASE("Staged loads are kept up to staging_bytes, the oldest dropped first", "[cache][tier]") {
  KvTierConfig config;
  config.host_bytes = 1 << 20;
  SECTION("room for two values: the third pushes out the first") {
    config.staging_bytes = 2 * TierValueBytes(kId);
    auto tiers = KvTiers::Create(config, kId);
    REQUIRE(tiers.ok());
    for (BlockHash h : {11, 12, 13}) (*tiers)->AddFetched(h, Value());
    CHECK_FALSE((*tiers)->HoldsInMemory(11));
    CHECK((*tiers)->HoldsInMemory(12));
    CHECK((*tiers)->HoldsInMemory(13));
  }
  SECTION("room for three: all stay") {
    config.staging_bytes = 3 * TierValueBytes(kId);
    auto tiers = KvTiers::Create(config, kId);
    REQUIRE(tiers.ok());
    for (BlockHash h : {11, 12, 13}) (*tiers)->AddFetched(h, Value());
    CHECK((*tiers)->HoldsInMemory(11));
    CHECK((*tiers)->HoldsInMemory(13));
  }
}

}  // namespace
}  // namespace kvserve

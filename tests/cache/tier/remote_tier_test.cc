// RemoteTier against a real redis-server (tests/cache/tier/redis_fixture.h).
#include "cache/tier/remote_tier.h"

#include <catch2/catch.hpp>
#include <numeric>
#include <vector>

#include "tests/cache/tier/redis_fixture.h"

namespace kvserve {
namespace {

using testing::Eventually;
using testing::RedisServer;

const TierIdentity kId{
    .model_fingerprint = 0xAA, .kv_format = 0xBB, .block_size = 4, .payload_bytes = 32};

struct Block {
  RemoteTier::BlockRequest req;
  std::string value;
};

Block MakeBlock(BlockHash hash, int32_t first, const TierIdentity& id = kId) {
  Block b;
  b.req = {hash, hash - 1, 0, {first, first + 1, first + 2, first + 3}};
  std::vector<uint8_t> payload(32);
  std::iota(payload.begin(), payload.end(), static_cast<uint8_t>(first));
  b.value = EncodeBlockValue(id, {hash, hash - 1, 0, b.req.tokens}, payload);
  return b;
}

std::vector<RemoteTier::BlockResult> Load(RemoteTier& t, std::vector<RemoteTier::BlockRequest> r) {
  const uint64_t ticket = t.StartLoad(std::move(r));
  std::vector<RemoteTier::BlockResult> out;
  REQUIRE(Eventually([&] { return t.TakeLoad(ticket, &out); }));
  return out;
}

TEST_CASE("Redis URLs are parsed and a bad one names its key", "[cache][tier]") {
  auto a = ParseRedisUrl("redis://10.0.0.5:6380/3");
  REQUIRE(a.ok());
  REQUIRE(a->host == "10.0.0.5");
  REQUIRE(a->port == 6380);
  REQUIRE(a->db == 3);
  auto d = ParseRedisUrl("redis://cache");
  REQUIRE(d.ok());
  REQUIRE(d->port == 6379);
  REQUIRE(d->db == 0);
  for (const char* bad :
       {"http://x:1/0", "redis://:1/0", "redis://x:0/0", "redis://x:1/-1", "redis://x:port/0"}) {
    INFO(bad);
    REQUIRE(std::string(ParseRedisUrl(bad).status().message()).find("cache.remote_tier_url") == 0);
  }
}

TEST_CASE("Blocks written through to Redis load back and a miss ends the chain",
          "[cache][tier][redis]") {
  RedisServer redis;
  if (!redis.has_server()) {
    WARN("redis-server is not installed (Debian package redis-server): skipped");
    return;
  }
  auto tier = RemoteTier::Create(redis.url(), kId, 1000);
  REQUIRE(tier.ok());
  Block a = MakeBlock(100, 1), b = MakeBlock(200, 5), c = MakeBlock(300, 9);
  (*tier)->WriteThrough(100, std::make_shared<const std::string>(a.value));
  (*tier)->WriteThrough(200, std::make_shared<const std::string>(b.value));
  REQUIRE(Eventually([&] { return (*tier)->counters().stored_blocks == 2; }));
  REQUIRE(redis.Get(TierStoreKey("kvserve:", kId, 100)) == a.value);

  const auto got = Load(**tier, {a.req, b.req, c.req});
  REQUIRE(got.size() == 3);
  REQUIRE(*got[0].value == a.value);
  REQUIRE(*got[1].value == b.value);
  REQUIRE(got[2].value == nullptr);
  REQUIRE(got[2].reject == TierReject::kNone);
  const RemoteTier::Counters n = (*tier)->counters();
  REQUIRE(n.hit_blocks == 2);
  REQUIRE(n.miss_blocks == 1);
  REQUIRE((*tier)->connected());

  SECTION("a corrupted value is rejected and deleted from Redis") {
    std::string bad = a.value;
    bad[bad.size() - 2] ^= 1;
    redis.Set(TierStoreKey("kvserve:", kId, 100), bad);
    const auto r = Load(**tier, {a.req});
    REQUIRE(r[0].value == nullptr);
    REQUIRE(r[0].reject == TierReject::kCorrupt);
    REQUIRE(redis.Command("EXISTS " + TierStoreKey("kvserve:", kId, 100)) == "0");
    REQUIRE((*tier)->counters().rejects[static_cast<int>(TierReject::kCorrupt)] == 1);
  }
  SECTION("a truncated value is rejected") {
    redis.Set(TierStoreKey("kvserve:", kId, 200), b.value.substr(0, 40));
    REQUIRE(Load(**tier, {b.req})[0].reject == TierReject::kTruncated);
  }
  SECTION("another model's replica names other keys, and a forged value is foreign") {
    TierIdentity other = kId;
    other.model_fingerprint = 0xAB;
    auto foreign = RemoteTier::Create(redis.url(), other, 1000);
    REQUIRE(foreign.ok());
    REQUIRE(Load(**foreign, {a.req})[0].value == nullptr);
    // A value of this model stored under the other model's key.
    redis.Set(TierStoreKey("kvserve:", other, 100), a.value);
    const auto r = Load(**foreign, {a.req});
    REQUIRE(r[0].value == nullptr);
    REQUIRE(r[0].reject == TierReject::kForeign);
  }
  SECTION("Redis killed: loads answer misses at once and writes are dropped and counted") {
    redis.Kill();
    const auto r = Load(**tier, {a.req, b.req});
    REQUIRE(r[0].value == nullptr);
    REQUIRE(r[1].value == nullptr);
    (*tier)->WriteThrough(300, std::make_shared<const std::string>(c.value));
    REQUIRE(Eventually([&] { return (*tier)->counters().write_drops == 1; }));
    REQUIRE_FALSE((*tier)->connected());
    REQUIRE((*tier)->TakeNotice().find("remote tier down") != std::string::npos);
  }
}

TEST_CASE("serve --check's Redis probe says what failed", "[cache][tier][redis]") {
  RedisServer redis;
  if (!redis.has_server()) {
    WARN("redis-server is not installed: skipped");
    return;
  }
  REQUIRE(PingRedis(redis.url(), 1000).ok());
  const int port = redis.port();
  redis.Kill();
  const absl::Status s = PingRedis("redis://127.0.0.1:" + std::to_string(port) + "/0", 1000);
  REQUIRE(s.code() == absl::StatusCode::kUnavailable);
  REQUIRE(std::string(s.message()).find("cannot connect to 127.0.0.1:") == 0);
}

}  // namespace
}  // namespace kvserve

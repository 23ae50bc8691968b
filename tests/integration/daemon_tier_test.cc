// Two daemons share one real redis-server as their remote KV tier
// (cache.remote_tier_url): a prompt daemon A computed is served by daemon B
// from Redis with A's exact greedy text and remote hits in B's /metrics;
// with API keys, the other key gets none of it (TenantCacheSalt salts every
// tier's keys); Redis killed: every request still 200 with the same text.
#include <catch2/catch.hpp>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "tests/cache/tier/redis_fixture.h"
#include "tests/integration/daemon_fixture.h"

namespace kvserve {
namespace {

using json = nlohmann::json;
using testing::DaemonProcess;
using testing::Eventually;
using testing::RedisServer;

constexpr char kStory[] =
    "Once upon a time, there was a little girl named Lily. She loved to play outside in the sun. "
    "One day, she saw a big red ball in the park. She ran to the ball and kicked it very high. "
    "The ball flew over the trees and landed in a pond. Lily was sad because she could not swim. "
    "A kind duck swam to the ball and pushed it back to her. Lily smiled and said thank you.";

struct Completion {
  std::string text;
  int64_t cached = -1;
};

Completion Complete(const DaemonProcess& d, const std::string& key) {
  json body = {
      {"model", "stories260k"}, {"prompt", kStory}, {"max_tokens", 32}, {"temperature", 0}};
  auto r = d.Client().Post("/v1/completions", {{"Authorization", "Bearer " + key}}, body.dump(),
                           "application/json");
  REQUIRE(r);
  INFO(r->body);
  REQUIRE(r->status == 200);
  const json j = json::parse(r->body);
  return {j["choices"][0]["text"].get<std::string>(),
          j["usage"]["prompt_tokens_details"]["cached_tokens"].get<int64_t>()};
}

// The value of one series in /metrics (0 when absent).
double Metric(const DaemonProcess& d, const std::string& series) {
  auto r = d.Client().Get("/metrics");
  REQUIRE(r);
  const std::string needle = "\n" + series + " ";
  const size_t at = r->body.find(needle);
  if (at == std::string::npos) return 0;
  return std::stod(r->body.substr(at + needle.size()));
}

TEST_CASE("Daemons share prefix blocks through Redis and tenants do not",
          "[integration][tier][redis]") {
  RedisServer redis;
  if (!redis.has_server()) {
    WARN("redis-server is not installed (Debian package redis-server): skipped");
    return;
  }
  const std::string dir = testing::MakeTempDir("tier-keys");
  std::ofstream(dir + "/keys") << "key-a\nkey-b\n";
  const std::vector<std::string> sets = {"server.api_key_file=" + dir + "/keys",
                                         "cache.remote_tier_url=" + redis.url()};
  DaemonProcess a(sets);
  DaemonProcess b(sets);
  INFO(a.Log() << b.Log());

  const Completion computed = Complete(a, "key-a");
  REQUIRE(computed.cached == 0);
  const std::string stored = "kvserve_kv_tier_stored_tokens_total{tier=\"remote\"}";
  // The prompt's full blocks (and the output's) are written through.
  REQUIRE(Eventually([&] { return Metric(a, stored) >= 96; }));

  const Completion served = Complete(b, "key-a");
  REQUIRE(served.text == computed.text);
  REQUIRE(served.cached >= 96);
  REQUIRE(served.cached % 16 == 0);
  const double hits = Metric(b, "kvserve_kv_tier_hit_blocks_total{tier=\"remote\"}");
  REQUIRE(hits == served.cached / 16);
  REQUIRE(Metric(b, "kvserve_kv_tier_rejected_blocks_total{cause=\"corrupt\",tier=\"remote\"}") ==
          0);

  SECTION("the other key is computed afresh, with the same text") {
    const Completion other = Complete(b, "key-b");
    REQUIRE(other.text == computed.text);
    REQUIRE(other.cached == 0);
    REQUIRE(Metric(b, "kvserve_kv_tier_hit_blocks_total{tier=\"remote\"}") == hits);
  }
  SECTION("Redis killed: still 200 with the same text") {
    redis.Kill();
    DaemonProcess c(sets);
    const Completion again = Complete(c, "key-a");
    REQUIRE(again.text == computed.text);
    REQUIRE(again.cached == 0);
    REQUIRE(Complete(a, "key-b").text == computed.text);
  }
}

}  // namespace
}  // namespace kvserve

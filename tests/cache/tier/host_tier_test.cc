#include "cache/tier/host_tier.h"

#include <catch2/catch.hpp>
#include <memory>
#include <string>
#include <vector>

namespace kvserve {
namespace {

std::shared_ptr<const std::string> Value(size_t n, char c) {
  return std::make_shared<const std::string>(n, c);
}

TEST_CASE("The host tier evicts least recently used values to stay within its bytes",
          "[cache][tier]") {
  HostTier host(300);
  std::vector<HostTier::Entry> out;
  REQUIRE(host.Put(1, Value(100, 'a'), &out));
  REQUIRE(host.Put(2, Value(100, 'b'), &out));
  REQUIRE(host.Put(3, Value(100, 'c'), &out));
  REQUIRE(out.empty());
  REQUIRE(host.bytes_used() == 300);
  SECTION("a Get makes a value most recently used, so the next Put evicts another") {
    REQUIRE(*host.Get(1) == std::string(100, 'a'));
    REQUIRE(host.LruOrder() == std::vector<BlockHash>{2, 3, 1});
    REQUIRE(host.Put(4, Value(150, 'd'), &out));
    REQUIRE(out.size() == 2);
    REQUIRE(out[0].hash == 2);
    REQUIRE(out[1].hash == 3);
    REQUIRE(*out[1].value == std::string(100, 'c'));
    REQUIRE(host.LruOrder() == std::vector<BlockHash>{1, 4});
    REQUIRE(host.bytes_used() == 250);
  }
  SECTION("a value larger than the tier is refused and nothing is evicted") {
    REQUIRE_FALSE(host.Put(9, Value(301, 'x'), &out));
    REQUIRE(out.empty());
    REQUIRE(host.size() == 3);
  }
  SECTION("a value handed out stays valid after its eviction") {
    std::shared_ptr<const std::string> held = host.Get(2);
    host.Erase(2);
    REQUIRE_FALSE(host.Contains(2));
    REQUIRE(host.Get(2) == nullptr);
    REQUIRE(*held == std::string(100, 'b'));
    REQUIRE(host.bytes_used() == 200);
  }
  SECTION("replacing a value counts its bytes once") {
    REQUIRE(host.Put(1, Value(50, 'z'), &out));
    REQUIRE(out.empty());
    REQUIRE(host.bytes_used() == 250);
    REQUIRE(host.LruOrder() == std::vector<BlockHash>{2, 3, 1});
  }
}

}  // namespace
}  // namespace kvserve

// The host tier's slot arena: LRU by slots, entries pushed out with their
// bytes, and a slot a load still reads (pinned) never handed out again.
#include "cache/tier/host_arena.h"

#include <catch2/catch.hpp>
#include <cstring>
#include <string>
#include <vector>

namespace kvserve {
namespace {

// Stores `c` x 100 under hash in a freshly reserved slot.
int32_t Put(HostArena& arena, BlockHash hash, char c, std::vector<HostTier::Entry>* out) {
  const int32_t s = arena.Reserve(out);
  REQUIRE(s >= 0);
  std::memset(arena.slot(s), c, 100);
  arena.Commit(s, hash);
  return s;
}

TEST_CASE("The host arena keeps values in slots, LRU, pushing out the oldest with its bytes",
          "[cache][tier]") {
  std::vector<uint8_t> memory(3 * 100 + 10);  // 3 slots of 100 bytes
  HostArena arena(memory, static_cast<int64_t>(memory.size()), 100);
  REQUIRE(arena.num_slots() == 3);
  REQUIRE(arena.Holds(memory.data(), 3 * 100));
  REQUIRE_FALSE(arena.Holds(memory.data() + 1, 3 * 100));
  std::vector<HostTier::Entry> out;
  Put(arena, 1, 'a', &out);
  Put(arena, 2, 'b', &out);
  Put(arena, 3, 'c', &out);
  REQUIRE(out.empty());
  REQUIRE(arena.bytes_used() == 300);
  REQUIRE(arena.Get(1).value == std::string(100, 'a'));  // 1 is now the newest
  REQUIRE(arena.LruOrder() == std::vector<BlockHash>{2, 3, 1});

  SECTION("a new value takes the least recently used slot; its bytes go out") {
    Put(arena, 4, 'd', &out);
    REQUIRE(out.size() == 1);
    REQUIRE(out[0].hash == 2);
    REQUIRE(*out[0].value == std::string(100, 'b'));
    REQUIRE(arena.LruOrder() == std::vector<BlockHash>{3, 1, 4});
    REQUIRE(arena.size() == 3);
  }
  SECTION("a pinned slot is not reused until its pin is dropped") {
    HostArena::Pinned pin = arena.Get(2);  // a load in flight reads slot of 2
    REQUIRE(arena.LruOrder() == std::vector<BlockHash>{3, 1, 2});
    arena.Erase(2);  // out of the LRU, still pinned
    arena.Erase(3);
    const int32_t s = arena.Reserve(&out);
    REQUIRE(s >= 0);
    REQUIRE(pin.value == std::string(100, 'b'));  // untouched
    REQUIRE(arena.slot(s) != reinterpret_cast<const uint8_t*>(pin.value.data()));
    arena.Commit(s, 5);
    // The only slots left: the pinned one and 1's; 1 goes out, the pin stays.
    const int32_t t = arena.Reserve(&out);
    REQUIRE(out.size() == 1);
    REQUIRE(out[0].hash == 1);
    REQUIRE(reinterpret_cast<const uint8_t*>(pin.value.data()) != arena.slot(t));
    arena.Commit(t, 6);
    // Every slot pinned: nothing to hand out until a pin is dropped.
    HostArena::Pinned p5 = arena.Get(5), p6 = arena.Get(6);
    arena.Erase(5);
    arena.Erase(6);
    REQUIRE(arena.Reserve(&out) == -1);
    const auto* pinned = reinterpret_cast<const uint8_t*>(pin.value.data());
    pin = {};
    REQUIRE(arena.slot(arena.Reserve(&out)) == pinned);
  }
}

}  // namespace
}  // namespace kvserve

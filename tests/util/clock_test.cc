#include "util/clock.h"

#include <catch2/catch.hpp>

namespace kvserve {
namespace {

TEST_CASE("A SimulatedClock moves only when told", "[util]") {
  SimulatedClock clock(absl::FromUnixSeconds(100));
  REQUIRE(clock.Now() == absl::FromUnixSeconds(100));
  REQUIRE(clock.Now() == absl::FromUnixSeconds(100));
  clock.AdvanceTime(absl::Milliseconds(1500));
  REQUIRE(clock.Now() == absl::FromUnixMillis(101500));
  clock.SetTime(absl::FromUnixSeconds(7));
  REQUIRE(clock.Now() == absl::FromUnixSeconds(7));
}

TEST_CASE("RealClock is absl::Now and one shared instance", "[util]") {
  const absl::Time before = absl::Now();
  const absl::Time t = RealClock()->Now();
  REQUIRE(t >= before);
  REQUIRE(t <= absl::Now());
  REQUIRE(RealClock().get() == RealClock().get());
}

}  // namespace
}  // namespace kvserve

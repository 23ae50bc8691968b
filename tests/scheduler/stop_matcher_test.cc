// The stop matcher: stop strings matched across streamed pieces, the bytes
// that could start one held back, and the text before a stop emitted whole.
#include "scheduler/stop_matcher.h"

#include <catch2/catch.hpp>
#include <string>
#include <vector>

#include "scheduler/detokenizer.h"  // IsValidUtf8

namespace kvserve {
namespace {

// Feeds pieces through a matcher; returns the emitted text.
std::string Feed(StopMatcher& m, const std::vector<std::string>& pieces, bool* stopped) {
  std::string out;
  *stopped = false;
  for (const std::string& p : pieces) {
    if (m.Add(p, &out)) {
      *stopped = true;
      return out;
    }
  }
  m.Flush(&out);
  return out;
}

TEST_CASE("StopMatcher finds stop strings across pieces and never emits them", "[scheduler]") {
  bool stopped = false;
  SECTION("a stop string split over three pieces") {
    StopMatcher m({"The end"});
    std::string out;
    REQUIRE_FALSE(m.Add("and they were happy. Th", &out));
    REQUIRE(out == "and they were happy. ");  // "Th" could start "The end"
    REQUIRE(m.held_bytes() == 2);
    REQUIRE_FALSE(m.Add("e e", &out));
    REQUIRE(out == "and they were happy. ");
    REQUIRE(m.Add("nd. More", &out));
    REQUIRE(out == "and they were happy. ");
    REQUIRE(m.matched() == 0);
  }
  SECTION("the earliest of several stop strings wins") {
    StopMatcher m({"dog", "cat"});
    REQUIRE(Feed(m, {"the c", "at and the dog"}, &stopped) == "the ");
    REQUIRE(stopped);
    REQUIRE(m.matched() == 1);
  }
  SECTION("a partial match that does not complete is released") {
    StopMatcher m({"Lily!"});
    std::string out;
    REQUIRE_FALSE(m.Add("Hi Lil", &out));
    REQUIRE(out == "Hi ");
    REQUIRE_FALSE(m.Add("y.", &out));
    REQUIRE(out == "Hi Lily.");
  }
  SECTION("a partial match held at the end is released by Flush") {
    StopMatcher m({"\n\n"});
    REQUIRE(Feed(m, {"One day.", "\n"}, &stopped) == "One day.\n");
    REQUIRE_FALSE(stopped);
  }
  SECTION("a stop string at the very start emits nothing") {
    StopMatcher m({"Once"});
    REQUIRE(Feed(m, {"On", "ce upon"}, &stopped).empty());
    REQUIRE(stopped);
  }
  SECTION("held-back text never splits a UTF-8 character") {
    // "\xC3\xA9" is e-acute; the stop string starts with its last byte.
    StopMatcher m({"\xA9x"});
    std::string out;
    REQUIRE_FALSE(m.Add("caf\xC3\xA9", &out));
    REQUIRE(out == "caf");
    REQUIRE(IsValidUtf8(out));
    m.Flush(&out);
    REQUIRE(out == "caf\xC3\xA9");
  }
  SECTION("without stop strings text passes straight through") {
    StopMatcher m({});
    REQUIRE(m.empty());
    REQUIRE(Feed(m, {"a", "b"}, &stopped) == "ab");
  }
}

}  // namespace
}  // namespace kvserve

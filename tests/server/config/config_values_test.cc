#include "server/config/config_values.h"

#include <catch2/catch.hpp>
#include <cstdlib>
#include <string>

namespace kvserve::config_values {
namespace {

template <typename T>
std::string Error(const absl::StatusOr<T>& v) {
  REQUIRE_FALSE(v.ok());
  REQUIRE(v.status().code() == absl::StatusCode::kInvalidArgument);
  return std::string(v.status().message());
}

TEST_CASE("ExpandEnv substitutes variables and nested fallbacks", "[server]") {
  ::setenv("KVSERVE_CV_SET", "value", 1);
  ::setenv("KVSERVE_CV_EMPTY", "", 1);
  ::unsetenv("KVSERVE_CV_UNSET");
  REQUIRE(*ExpandEnv("k", "a-${KVSERVE_CV_SET}-b") == "a-value-b");
  REQUIRE(*ExpandEnv("k", "${KVSERVE_CV_UNSET:-fb}") == "fb");
  // An empty variable counts as unset; the fallback holds another ${...}.
  REQUIRE(*ExpandEnv("k", "${KVSERVE_CV_EMPTY:-${KVSERVE_CV_SET}}") == "value");
  REQUIRE(*ExpandEnv("k", "${KVSERVE_CV_UNSET:-}") == "");
  REQUIRE(Error(ExpandEnv("model.path", "${KVSERVE_CV_UNSET}")) ==
          "model.path: environment variable KVSERVE_CV_UNSET is not set (use "
          "${KVSERVE_CV_UNSET:-fallback})");
  REQUIRE(Error(ExpandEnv("model.path", "x${KVSERVE_CV_SET")) ==
          "model.path: unterminated ${ in 'x${KVSERVE_CV_SET'");
}

TEST_CASE("The scalar parsers take their forms and name the key otherwise", "[server]") {
  REQUIRE(*ParseInt("n", " 42 ", 1, 100, "an integer in [1, 100]") == 42);
  REQUIRE(Error(ParseInt("n", "0", 1, 100, "an integer in [1, 100]")) ==
          "n: expected an integer in [1, 100], got '0'");
  REQUIRE(Error(ParseInt("n", "4.5", 1, 100, "an integer")) == "n: expected an integer, got '4.5'");
  REQUIRE(*ParseDouble("f", "0.25", "a number") == 0.25);
  REQUIRE(Error(ParseDouble("f", "nan", "a number")) == "f: expected a number, got 'nan'");
  for (const char* t : {"true", "YES", "On", "1"}) REQUIRE(*ParseBool("b", t));
  for (const char* t : {"false", "no", "OFF", "0"}) REQUIRE_FALSE(*ParseBool("b", t));
  REQUIRE(Error(ParseBool("b", "maybe")) == "b: expected true or false, got 'maybe'");
  REQUIRE(*ParseBytes("m", "4096") == 4096);
  REQUIRE(*ParseBytes("m", "2MiB") == 2 << 20);
  REQUIRE_FALSE(ParseBytes("m", "lots").ok());
  REQUIRE(*ParseSeconds("t", "30") == 30.0);
  REQUIRE(*ParseSeconds("t", "2.5s") == 2.5);
  REQUIRE(*ParseSeconds("t", "500ms") == 0.5);
  REQUIRE(*ParseSeconds("t", "1m") == 60.0);
  REQUIRE(Error(ParseSeconds("t", "-1")) ==
          "t: expected a duration in seconds >= 0 (e.g. 30, 2.5s, 500ms, 1m), got '-1'");
  REQUIRE(*ParseEnum("e", " lru ", {"lru", "fifo"}) == "lru");
  REQUIRE(Error(ParseEnum("e", "mru", {"lru", "fifo"})) ==
          "e: expected one of lru, fifo, got 'mru'");
}

}  // namespace
}  // namespace kvserve::config_values

#include "util/byte_size.h"

#include <catch2/catch.hpp>

namespace kvserve {
namespace {

constexpr int64_t kGiB = int64_t{1} << 30;

TEST_CASE("byte sizes: GiB is 1024^3, GB is 1000^3", "[util]") {
  REQUIRE(*ParseByteSize("80GiB") == 80 * kGiB);
  REQUIRE(*ParseByteSize("80Gi") == 80 * kGiB);
  // Bare letters are SI, as in Kubernetes quantities.
  REQUIRE(*ParseByteSize("80G") == 80000000000);
  REQUIRE(*ParseByteSize("64k") == 64000);
  REQUIRE(*ParseByteSize("80gib") == 80 * kGiB);
  REQUIRE(*ParseByteSize("80GB") == 80000000000);
  REQUIRE(*ParseByteSize("1.5 TiB") == 3 * (int64_t{1} << 39));
  REQUIRE(*ParseByteSize("512MiB") == 512 << 20);
  REQUIRE(*ParseByteSize("12345") == 12345);
  REQUIRE(*ParseByteSize("4kB") == 4000);
  REQUIRE(*ParseByteSize("1.5KiB") == 1536);
  REQUIRE(*ParseByteSize("4096B") == 4096);
  REQUIRE_FALSE(ParseByteSize("80 parsecs").ok());
  REQUIRE_FALSE(ParseByteSize("1.5").ok());  // half a byte
  SECTION("a required unit: a plain number is refused, naming the flag") {
    auto s = ParseByteSize("80", "--memory", ByteSizeUnit::kRequired);
    REQUIRE(s.status().code() == absl::StatusCode::kInvalidArgument);
    REQUIRE(s.status().message() ==
            "--memory: '80' has no unit (e.g. 80GiB = 80 x 1024^3, 80GB = 80 x 1000^3, 4096B)");
    REQUIRE(*ParseByteSize("80B", "--memory", ByteSizeUnit::kRequired) == 80);
  }
  REQUIRE_FALSE(ParseByteSize("GiB").ok());
  REQUIRE_FALSE(ParseByteSize("-3GB").ok());
  REQUIRE(ParseByteSize("x", "--memory").status().message() ==
          "--memory: 'x' is not a byte size (e.g. 80GiB = 80 x 1024^3, 80GB = 80 x 1000^3, or a "
          "plain byte count)");
  REQUIRE(FormatBytes(40 * kGiB) == "40.00 GiB (42.95 GB)");
  REQUIRE(FormatBytes(327680) == "327680 B (320.0 KiB)");
  REQUIRE(FormatBytes(5 << 20) == "5.00 MiB (5.24 MB)");
}

}  // namespace
}  // namespace kvserve

// A client that keeps its connection open must not wait longer than one
// that connects afresh for every request. Nagle's algorithm once made
// kept-alive HTTP requests wait ~40 ms for the client's delayed ACK (the
// response went out as headers, then body) against ~1 ms on a fresh
// connection. The probe of kvserve_bench interleaves the two kinds of
// request in one run, so a busy machine slows both alike; the medians
// compare with a generous factor and no absolute limit.
#include <catch2/catch.hpp>

#include "bench/loadgen/probe.h"
#include "tests/integration/daemon_fixture.h"

namespace kvserve {
namespace {

using testing::DaemonProcess;

// Kept-alive may be up to this much slower than fresh before the test fails;
// the Nagle stall was 40-60x, scheduling noise moves medians by far less.
constexpr double kMaxRatio = 3.0;

TEST_CASE("Kept-alive connections are as fast as fresh ones (HTTP, SSE and gRPC)",
          "[bench][integration]") {
  DaemonProcess d;
  bench::ClientOptions o;
  o.url = d.base_url();
  o.grpc_target = d.grpc_target();
  o.model = "stories260k";
  std::vector<bench::ProbeCase> cases =
      bench::RunConnectionProbe(o, /*requests=*/100, /*include_http=*/true, /*progress=*/false);
  REQUIRE(cases.size() == 3);
  for (const bench::ProbeCase& c : cases) {
    INFO(c.name << ": fresh p50 " << c.fresh_ms.p50 << " ms, kept-alive p50 " << c.kept_alive_ms.p50
                << " ms (p90 " << c.fresh_ms.p90 << " / " << c.kept_alive_ms.p90 << "); "
                << c.first_error);
    REQUIRE(c.failed == 0);
    REQUIRE(c.fresh_ms.count == 100);
    REQUIRE(c.kept_alive_ms.count == 100);
    REQUIRE(c.kept_alive_ms.p50 < kMaxRatio * c.fresh_ms.p50);
  }
}

}  // namespace
}  // namespace kvserve

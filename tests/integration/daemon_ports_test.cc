// A port in use fails start-up with an error naming its key, instead of two
// daemons silently sharing the port (SO_REUSEPORT is off unless
// server.reuse_port asks for it).
#include <catch2/catch.hpp>
#include <string>

#include "tests/integration/daemon_fixture.h"

namespace kvserve {
namespace {

// Runs a second `kvserve serve` on the given ports; its exit code and output.
int SecondDaemon(int http_port, int grpc_port, std::string* out) {
  const std::string cmd =
      testing::ShellQuote(testing::KvserveBinary()) + " serve --config " +
      testing::ShellQuote(std::string(KVSERVE_SOURCE_DIR) + "/configs/default.yaml") +
      " --set server.http_port=" + std::to_string(http_port) +
      " --set server.grpc_port=" + std::to_string(grpc_port) + " --set logging.level=warn";
  return testing::RunCommand("timeout 30 " + cmd, out);
}

TEST_CASE("Daemon: a port in use fails start-up naming the key", "[integration]") {
  testing::DaemonProcess d;
  std::string out;
  SECTION("the HTTP port") {
    REQUIRE(SecondDaemon(d.http_port(), testing::FreeLoopbackPort(), &out) == 1);
    REQUIRE(out.find("server.http_port: cannot listen on 127.0.0.1:" +
                     std::to_string(d.http_port())) != std::string::npos);
  }
  SECTION("the gRPC port") {
    int http = testing::FreeLoopbackPort();
    while (http == d.grpc_port()) http = testing::FreeLoopbackPort();
    REQUIRE(SecondDaemon(http, d.grpc_port(), &out) == 1);
    REQUIRE(out.find("server.grpc_port: cannot listen on 127.0.0.1:" +
                     std::to_string(d.grpc_port())) != std::string::npos);
  }
  // The first daemon still serves.
  auto health = d.Client().Get("/health");
  REQUIRE(health);
  REQUIRE(health->status == 200);
}

}  // namespace
}  // namespace kvserve

// A Python grpcio client (tests/integration/python/grpc_stream_test.py, with
// stubs generated from proto/ at run time) streams the greedy reference
// completion from the real daemon. Skipped with a message when no Python
// with grpcio (Debian: python3-grpcio) or no stub generator is installed.
#include <catch2/catch.hpp>

#include "tests/integration/daemon_fixture.h"

namespace kvserve {
namespace {

TEST_CASE("Daemon: a Python grpcio client streams the reference completion", "[integration]") {
  const std::string python = testing::PythonWithModule("grpc");
  if (python.empty()) {
    WARN("no python3 with grpcio (Debian package python3-grpcio): skipping");
    return;
  }
  std::string out;
  if (testing::RunCommand(
          "'" + python + "' -c 'import grpc_tools' || command -v grpc_python_plugin", &out) != 0) {
    WARN("neither grpc_tools nor grpc_python_plugin (Debian protobuf-compiler-grpc): skipping");
    return;
  }
  testing::DaemonProcess d;
  const std::string src = KVSERVE_SOURCE_DIR;
  out.clear();
  const int rc = testing::RunCommand(
      "KVSERVE_GRPC_ADDR=" + d.grpc_target() + " KVSERVE_PROTO_DIR='" + src + "/proto'" +
          " KVSERVE_GOLDEN_FILE='" + testing::Stories260kDir() + "/golden_greedy_256.txt' '" +
          python + "' '" + src + "/tests/integration/python/grpc_stream_test.py'",
      &out);
  INFO(out);
  REQUIRE(rc == 0);
  REQUIRE(out.find("python grpc client: ") != std::string::npos);
}

}  // namespace
}  // namespace kvserve

// model.device: cuda where it cannot run (this build has no CUDA, or the
// machine no device, as in make test) stops start-up at once with an error
// naming the key, before any weights are read; model.device: cpu is what
// every other daemon test serves with.
#include <catch2/catch.hpp>
#include <string>

#include "tests/integration/daemon_fixture.h"

namespace kvserve {
namespace {

TEST_CASE("Daemon: model.device cuda without a usable device fails naming the key",
          "[integration]") {
  std::string probe;
  if (testing::RunCommand("nvidia-smi -L", &probe) == 0) {
    WARN("a CUDA device is present: the [gpu] daemon test covers model.device: cuda");
    return;
  }
  for (const char* device : {"cuda", "cuda:3"}) {
    INFO(device);
    const std::string cmd =
        "timeout 60 " + testing::ShellQuote(testing::KvserveBinary()) + " serve --config " +
        testing::ShellQuote(std::string(KVSERVE_SOURCE_DIR) + "/configs/default.yaml") +
        " --set server.http_port=0 --set server.grpc_port=0 --set model.device=" + device;
    std::string out;
    REQUIRE(testing::RunCommand(cmd, &out) == 1);
    INFO(out);
    REQUIRE(out.find(std::string("model.device: ") + device + ": ") != std::string::npos);

    // --check says so too, without starting anything (exit 2, as for a bad config).
    out.clear();
    REQUIRE(testing::RunCommand(cmd + " --check", &out) == 2);
    REQUIRE(out.find(std::string("model.device: ") + device + ": ") != std::string::npos);
    REQUIRE(out.find("config OK") == std::string::npos);
  }
}

TEST_CASE("kvserve serve --check refuses a model path that is not there", "[integration]") {
  const std::string cmd =
      "timeout 60 " + testing::ShellQuote(testing::KvserveBinary()) + " serve --config " +
      testing::ShellQuote(std::string(KVSERVE_SOURCE_DIR) + "/configs/default.yaml") +
      " --set model.path=/no/such/model.bin --check";
  std::string out;
  REQUIRE(testing::RunCommand(cmd, &out) == 2);
  REQUIRE(out.find("model.path: /no/such/model.bin does not exist") != std::string::npos);
  out.clear();
  REQUIRE(testing::RunCommand(
              cmd.substr(0, cmd.find(" --set model.path")) + " --set model.path=dummy:nope --check",
              &out) == 2);
  REQUIRE(out.find("model.path: unknown dummy model preset 'nope'") != std::string::npos);
}

}  // namespace
}  // namespace kvserve

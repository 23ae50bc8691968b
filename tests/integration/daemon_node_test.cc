// The official OpenAI Node SDK (npm package `openai`, pinned by
// tests/integration/node/package-lock.json and installed with `npm ci`)
// completes and streams through /v1/completions and /v1/chat/completions of
// the real daemon, with bearer-key auth on. Needs node and npm (skipped with
// a message without them) and the npm registry (or a warm npm cache).
#include <catch2/catch.hpp>
#include <filesystem>

#include "tests/integration/daemon_fixture.h"

namespace kvserve {
namespace {

namespace fs = std::filesystem;

TEST_CASE("Daemon: the OpenAI Node SDK completes and streams", "[integration]") {
  testing::NpmWorkdir npm(
      "tests/integration/node",
      {"package.json", "package-lock.json", "openai_sdk_test.mjs", "sdk_client.mjs"},
      "node-openai");
  if (!npm.has_node()) {
    WARN("node/npm not installed (Debian packages nodejs, npm): skipping");
    return;
  }
  INFO("npm ci:\n" << npm.log());
  REQUIRE(npm.Install());
  const fs::path work = npm.dir();
  std::string out;
  int rc = 0;

  testing::DaemonProcess d({"server.api_key=node-test-key"});
  out.clear();
  rc = testing::RunCommand("cd '" + work.string() + "' && KVSERVE_BASE_URL='" + d.base_url() +
                               "/v1' KVSERVE_API_KEY=node-test-key KVSERVE_MODEL=stories260k"
                               " KVSERVE_GOLDEN_FILE='" +
                               testing::Stories260kDir() +
                               "/golden_greedy_256.txt' node openai_sdk_test.mjs",
                           &out);
  INFO(out);
  REQUIRE(rc == 0);
  REQUIRE(out.find("openai sdk: ") != std::string::npos);
}

}  // namespace
}  // namespace kvserve

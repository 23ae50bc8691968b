// kvserve_bench end to end: it drives a live `kvserve serve` for a few
// seconds (closed loop over HTTP with the connection probe, open loop over
// gRPC) and writes JSON that conforms to bench/kvserve_bench_schema.json and
// agrees with the daemon's own counters.
#include <catch2/catch.hpp>
#include <fstream>
#include <nlohmann/json.hpp>

#include "tests/bench/json_schema_check.h"
#include "tests/integration/daemon_fixture.h"

namespace kvserve {
namespace {

using json = nlohmann::json;
using testing::DaemonProcess;

std::string BenchBinary() { return std::string(KVSERVE_BINARY_DIR) + "/bench/kvserve_bench"; }

testing::JsonSchemaCheck Schema() {
  return testing::JsonSchemaCheck(json::parse(testing::ReadFileOrDie(
      std::string(KVSERVE_SOURCE_DIR) + "/bench/kvserve_bench_schema.json")));
}

// Runs kvserve_bench with `args`; its JSON output, after checking the exit code.
json RunBench(const DaemonProcess& d, const std::string& args, std::string* printed) {
  const std::string out = d.dir() + "/bench.json";
  const std::string cmd = testing::ShellQuote(BenchBinary()) + " --url " + d.base_url() +
                          " --grpc-target " + d.grpc_target() + " --tokenizer " +
                          testing::ShellQuote(testing::Stories260kTokenizer()) +
                          " --progress never --json " + testing::ShellQuote(out) + " " + args;
  const int rc = testing::RunCommand(cmd, printed);
  INFO(cmd << "\n" << *printed << "\ndaemon log:\n" << d.Log());
  REQUIRE(rc == 0);
  return json::parse(testing::ReadFileOrDie(out));
}

void RequireConforms(const json& doc) {
  std::vector<std::string> errors = Schema().Check(doc);
  INFO(doc.dump(2));
  for (const std::string& e : errors) UNSCOPED_INFO(e);
  REQUIRE(errors.empty());
}

TEST_CASE("kvserve_bench: a closed-loop sweep over HTTP with the probe conforms to the schema",
          "[bench][integration]") {
  DaemonProcess d;
  std::string printed;
  json doc = RunBench(d,
                      "--workload fixed --input-len 24 --output-len 16 --token-ids true "
                      "--concurrency 1,3 --duration 1 --probe 10 --label smoke",
                      &printed);
  RequireConforms(doc);
  REQUIRE(doc["label"] == "smoke");
  REQUIRE(doc["target"]["model"] == "stories260k");
  REQUIRE(doc["target"]["max_model_len"] == 512);
  REQUIRE(doc["runs"].size() == 2);
  REQUIRE(doc["runs"][0]["load"]["concurrency"] == 1);
  REQUIRE(doc["runs"][1]["load"]["concurrency"] == 3);
  for (const json& run : doc["runs"]) {
    INFO(run.dump(2));
    const int64_t done = run["requests"]["completed"];
    REQUIRE(done > 0);
    REQUIRE(run["requests"]["failed"] == 0);
    // ignore_eos and token ids: every request is exactly 24 in, 16 out.
    REQUIRE(run["tokens"]["input"] == 24 * done);
    REQUIRE(run["tokens"]["output"] == 16 * done);
    REQUIRE(run["latency_ms"]["tpot"]["count"] == done);
    REQUIRE(run["latency_ms"]["ttft"]["p50"] <= run["latency_ms"]["e2e"]["p50"]);
    // The daemon generated exactly what the clients received.
    REQUIRE(run["server"]["scraped"] == true);
    REQUIRE(run["server"]["generation_tokens"] == 16.0 * done);
    REQUIRE(run["server"]["preemptions"] == 0.0);
    REQUIRE(run["server"]["running_peak"] <= run["load"]["concurrency"]);
    REQUIRE(run["server"]["cpu_seconds"] > 0.0);
  }
  REQUIRE(doc["connection_probe"]["requests_each"] == 10);
  std::vector<std::string> cases;
  for (const json& c : doc["connection_probe"]["cases"]) {
    cases.push_back(c["name"]);
    REQUIRE(c["failed"] == 0);
    REQUIRE(c["fresh_ms"]["count"] == 10);
    REQUIRE(c["kept_alive_ms"]["count"] == 10);
  }
  REQUIRE(cases == std::vector<std::string>{"http", "http_stream", "grpc"});
  // The table names every run and every probe case.
  REQUIRE(printed.find("closed c=1 ") != std::string::npos);
  REQUIRE(printed.find("closed c=3 ") != std::string::npos);
  REQUIRE(printed.find("http_stream ") != std::string::npos);
}

TEST_CASE("kvserve_bench: an open loop over gRPC with ShareGPT-like lengths conforms too",
          "[bench][integration]") {
  DaemonProcess d;
  std::string printed;
  json doc = RunBench(d,
                      "--api grpc --workload sharegpt --input-len 40 --output-len 12 "
                      "--request-rate 40 --duration 1.5 --seed 5",
                      &printed);
  RequireConforms(doc);
  REQUIRE(doc["target"]["api"] == "grpc");
  REQUIRE(doc["connection_probe"].is_null());
  REQUIRE(doc["runs"].size() == 1);
  const json& run = doc["runs"][0];
  INFO(run.dump(2));
  REQUIRE(run["load"]["mode"] == "open");
  REQUIRE(run["load"]["request_rate"] == 40.0);
  REQUIRE(run["requests"]["failed"] == 0);
  REQUIRE(run["requests"]["completed"] >= 10);
  REQUIRE(run["tokens"]["cached_prompt"].is_number_integer());
  // /metrics comes from the HTTP port (--url) and agrees with the clients.
  REQUIRE(run["server"]["scraped"] == true);
  REQUIRE(run["server"]["generation_tokens"] == run["tokens"]["output"].get<double>());
}

TEST_CASE("kvserve_bench: a server without /metrics gets nulls, not made-up numbers",
          "[bench][integration]") {
  DaemonProcess d;
  std::string printed;
  json doc = RunBench(d, "--num-prompts 3 --output-len 4 --metrics-url none", &printed);
  RequireConforms(doc);
  const json& server = doc["runs"][0]["server"];
  REQUIRE(server["scraped"] == false);
  REQUIRE(server["kv_usage_peak"].is_null());
  REQUIRE(server["preemptions"].is_null());
  REQUIRE(server["cpu_seconds"].is_null());
  REQUIRE(doc["runs"][0]["requests"]["completed"] == 3);
}

TEST_CASE("The schema check rejects documents that break the schema", "[bench]") {
  testing::JsonSchemaCheck check = Schema();
  json doc = {{"schema", "kvserve-bench/1"}, {"label", ""}, {"started_at", "x"}};
  std::vector<std::string> errors = check.Check(doc);
  REQUIRE(std::find(errors.begin(), errors.end(), "$: missing required key \"runs\"") !=
          errors.end());
  doc = {{"schema", "kvserve-bench/2"}};
  errors = check.Check(doc);
  REQUIRE(std::find(errors.begin(), errors.end(),
                    "$.schema: expected \"kvserve-bench/1\", got \"kvserve-bench/2\"") !=
          errors.end());
  doc = {{"label", 3}, {"surprise", true}};
  errors = check.Check(doc);
  REQUIRE(std::find(errors.begin(), errors.end(), "$: unexpected key \"surprise\"") !=
          errors.end());
  REQUIRE(std::find(errors.begin(), errors.end(), "$.label: expected type \"string\", got 3") !=
          errors.end());
}

}  // namespace
}  // namespace kvserve

// [gpu] The daemon on a GPU: `kvserve serve` with model.device: cuda
// (stories260K in fp32, fp32 KV) answers the greedy reference request over
// HTTP and gRPC with llama2.c's exact text, and /metrics exports the pool it
// allocated on the device.
#include <grpcpp/grpcpp.h>

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>
#include <string>

#include "proto/kvserve.grpc.pb.h"
#include "tests/integration/daemon_fixture.h"

namespace kvserve {
namespace {

using json = nlohmann::json;
using testing::DaemonProcess;

double MetricValue(const std::string& text, const std::string& series) {
  const size_t pos = text.find("\n" + series + " ");
  REQUIRE(pos != std::string::npos);
  const size_t start = pos + series.size() + 2;
  return std::stod(text.substr(start, text.find('\n', start) - start));
}

TEST_CASE("[gpu] kvserve serve on model.device cuda answers the golden request", "[gpu]") {
  DaemonProcess d({"model.device=cuda", "model.dtype=fp32", "cache.kv_dtype=fp32",
                   "cache.memory_fraction=0.05", "scheduler.max_num_seqs=16"});
  const std::string golden = testing::GoldenGreedyText();
  INFO(d.Log());
  REQUIRE(d.Log().find("on cuda:0 (") != std::string::npos);

  SECTION("over HTTP") {
    auto r = d.Client().Post(
        "/v1/completions",
        R"({"model": "stories260k", "prompt": "", "max_tokens": 256, "temperature": 0})",
        "application/json");
    REQUIRE(r);
    INFO(r->body);
    REQUIRE(r->status == 200);
    json j = json::parse(r->body);
    REQUIRE(j["choices"][0]["text"].get<std::string>() == golden);
    REQUIRE(j["usage"]["completion_tokens"] == 256);
  }
  SECTION("over gRPC") {
    auto channel = grpc::CreateChannel(d.grpc_target(), grpc::InsecureChannelCredentials());
    auto stub = v1::Generation::NewStub(channel);
    v1::GenerateRequest req;
    req.set_prompt("");
    req.set_max_tokens(256);
    req.mutable_sampling()->set_temperature(0);
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(120));
    auto reader = stub->Generate(&ctx, req);
    std::string text;
    v1::GenerateResponse resp;
    while (reader->Read(&resp)) text += resp.text();
    grpc::Status st = reader->Finish();
    INFO(st.error_message());
    REQUIRE(st.ok());
    REQUIRE(text == golden);
  }
  SECTION("/metrics exports the device pool") {
    const std::string text = d.Client().Get("/metrics")->body;
    const double blocks = MetricValue(text, "kvserve_kv_blocks_capacity");
    REQUIRE(blocks > 0);
    REQUIRE(MetricValue(text, "kvserve_kv_block_bytes") == 5 * 2 * 4 * 16 * 8 * 4);
    REQUIRE(MetricValue(text, "kvserve_kv_pool_tokens") == blocks * 16);
    REQUIRE(MetricValue(text, "kvserve_activation_bytes") > 0);
  }
}

}  // namespace
}  // namespace kvserve

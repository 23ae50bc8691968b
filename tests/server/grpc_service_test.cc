#include "server/grpc_service.h"

#include <grpcpp/grpcpp.h>

#include <catch2/catch.hpp>

#include "proto/kvserve.grpc.pb.h"
#include "spdlog/spdlog.h"
#include "tests/grpc_health.h"
#include "tests/server/fake_engine.h"

namespace kvserve {
namespace {

namespace v1 = ::kvserve::v1;

struct GrpcFixture {
  explicit GrpcFixture(bool ready = true, std::string api_key = "")
      : state(&metrics, ChatTemplate(), std::move(api_key)), service(&state) {
    spdlog::set_level(spdlog::level::warn);
    REQUIRE(service.Start("127.0.0.1", 0).ok());
    channel = grpc::CreateChannel("127.0.0.1:" + std::to_string(service.port()),
                                  grpc::InsecureChannelCredentials());
    stub = v1::Generation::NewStub(channel);
    if (ready) MakeReady();
  }
  ~GrpcFixture() { service.Shutdown(absl::Now()); }
  void MakeReady() {
    ServedModelInfo info;
    info.name = "fake";
    info.max_model_len = 256;
    info.kv_dtype = "fp32";
    info.block_size = 16;
    state.SetReady(&engine, info);
    service.SetServing(true);
  }
  // 1 SERVING, 2 NOT_SERVING, -1 on error.
  int Health(const std::string& name) { return testing::GrpcHealthCheck(channel, name); }

  ServerMetrics metrics;
  ServingState state;
  testing::FakeEngine engine;
  GrpcService service;
  std::shared_ptr<grpc::Channel> channel;
  std::unique_ptr<v1::Generation::Stub> stub;
};

// field: when given, the kvserve-field trailer ("" when absent).
std::vector<v1::GenerateResponse> Generate(GrpcFixture& f, const v1::GenerateRequest& req,
                                           grpc::Status* status, std::string* field = nullptr) {
  grpc::ClientContext ctx;
  auto reader = f.stub->Generate(&ctx, req);
  std::vector<v1::GenerateResponse> out;
  v1::GenerateResponse r;
  while (reader->Read(&r)) out.push_back(r);
  *status = reader->Finish();
  if (field != nullptr) {
    const auto& trailers = ctx.GetServerTrailingMetadata();
    auto it = trailers.find("kvserve-field");
    *field = it == trailers.end() ? "" : std::string(it->second.data(), it->second.size());
  }
  return out;
}

TEST_CASE("gRPC Generate streams the text and ends with usage", "[server]") {
  GrpcFixture f;
  v1::GenerateRequest req;
  req.set_prompt("hi");
  req.set_max_tokens(5);
  req.mutable_sampling()->set_temperature(0);
  req.set_request_id("g-1");
  req.set_logprobs(1);
  grpc::Status st;
  auto responses = Generate(f, req, &st);
  REQUIRE(st.ok());
  std::string text;
  for (const auto& r : responses) {
    REQUIRE(r.request_id() == "g-1");
    text += r.text();
    REQUIRE(r.logprobs_size() == 1);
  }
  REQUIRE(text == "abcde");
  REQUIRE(responses.back().request_finished());
  REQUIRE(responses.back().finish_reason() == v1::FINISH_REASON_LENGTH);
  REQUIRE(responses.back().usage().completion_tokens() == 5);
  GenerateRequest seen = f.engine.last_request();
  REQUIRE(seen.prompt == "hi");
  REQUIRE(seen.add_bos);
  REQUIRE(seen.sampling.temperature == 0.0f);
  REQUIRE(seen.max_tokens == 5);
  REQUIRE(seen.logprobs == 1);
  REQUIRE(f.state.WaitForCalls(absl::Now() + absl::Seconds(10)));
}

TEST_CASE("gRPC kv_policy reaches the engine, unset fields left to its defaults", "[server]") {
  GrpcFixture f;
  v1::GenerateRequest req;
  req.set_prompt("hi");
  req.set_max_tokens(3);
  grpc::Status st;
  Generate(f, req, &st);
  REQUIRE(st.ok());
  REQUIRE(f.engine.last_request().kv_policy.empty());
  v1::KvPolicy* k = req.mutable_kv_policy();
  k->set_policy("streaming");
  k->set_budget(256);
  k->set_sink_tokens(0);  // set, though zero
  Generate(f, req, &st);
  REQUIRE(st.ok());
  KvPolicyOverride seen = f.engine.last_request().kv_policy;
  REQUIRE(seen.policy == "streaming");
  REQUIRE(seen.budget == 256);
  REQUIRE(seen.sink_tokens == 0);
  REQUIRE(seen.recent_tokens == -1);
  REQUIRE(f.state.WaitForCalls(absl::Now() + absl::Seconds(10)));
}

TEST_CASE("gRPC errors carry the status code and name the field", "[server]") {
  GrpcFixture f;
  grpc::Status st;
  v1::GenerateRequest req;
  req.mutable_sampling()->set_temperature(-1);
  std::string field;
  Generate(f, req, &st, &field);
  REQUIRE(st.error_code() == grpc::StatusCode::INVALID_ARGUMENT);
  REQUIRE(st.error_message() == "temperature must be >= 0, got -1");
  REQUIRE(field == "temperature");  // the same field HTTP names in "param"

  req.Clear();
  req.add_prompt_token_ids(9999);
  Generate(f, req, &st);
  REQUIRE(st.error_code() == grpc::StatusCode::INVALID_ARGUMENT);
  REQUIRE(st.error_message() == "prompt_token_ids[0] = 9999 is outside the vocabulary [0, 512)");

  // 100,000 stop strings are refused by count, naming the field.
  req.Clear();
  for (int i = 0; i < 100000; ++i) req.add_stop("x");
  Generate(f, req, &st);
  REQUIRE(st.error_code() == grpc::StatusCode::INVALID_ARGUMENT);
  REQUIRE(st.error_message() == "stop has 100000 strings, at most 16 are allowed");

  req.Clear();
  f.engine.queue_full = true;
  Generate(f, req, &st);
  REQUIRE(st.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED);
  f.engine.queue_full = false;

  f.state.StartDraining();
  Generate(f, req, &st);
  REQUIRE(st.error_code() == grpc::StatusCode::UNAVAILABLE);
}

TEST_CASE("gRPC health reflects loading and readiness", "[server]") {
  GrpcFixture f(/*ready=*/false);
  REQUIRE(f.Health("") == 2);
  REQUIRE(f.Health("kvserve.v1.Generation") == 2);
  grpc::Status st;
  Generate(f, v1::GenerateRequest(), &st);
  REQUIRE(st.error_code() == grpc::StatusCode::UNAVAILABLE);
  f.MakeReady();
  REQUIRE(f.Health("") == 1);
  REQUIRE(f.Health("kvserve.v1.Generation") == 1);
  f.service.SetServing(false);
  REQUIRE(f.Health("") == 2);
}

TEST_CASE("gRPC unary calls: Tokenize, GetModelInfo, GetStats", "[server]") {
  GrpcFixture f;
  grpc::ClientContext c1;
  v1::TokenizeRequest tr;
  tr.set_text("ab");
  v1::TokenizeResponse tresp;
  REQUIRE(f.stub->Tokenize(&c1, tr, &tresp).ok());
  REQUIRE(std::vector<int32_t>(tresp.token_ids().begin(), tresp.token_ids().end()) ==
          std::vector<int32_t>{1, 3 + 'a', 3 + 'b'});
  REQUIRE(tresp.pieces(1) == "a");

  grpc::ClientContext c2;
  v1::ModelInfo info;
  REQUIRE(f.stub->GetModelInfo(&c2, v1::GetModelInfoRequest(), &info).ok());
  REQUIRE(info.name() == "fake");
  REQUIRE(info.vocab_size() == 512);
  REQUIRE(info.max_model_len() == 256);
  REQUIRE(info.kv_dtype() == "fp32");
  REQUIRE(info.block_size() == 16);

  grpc::ClientContext c3;
  v1::Stats stats;
  REQUIRE(f.stub->GetStats(&c3, v1::GetStatsRequest(), &stats).ok());
  REQUIRE(stats.num_running() == 0);
}

TEST_CASE("gRPC checks the bearer key when one is configured", "[server]") {
  GrpcFixture f(/*ready=*/true, "k");
  grpc::Status st;
  Generate(f, v1::GenerateRequest(), &st);
  REQUIRE(st.error_code() == grpc::StatusCode::UNAUTHENTICATED);
  grpc::ClientContext ctx;
  ctx.AddMetadata("authorization", "Bearer k");
  v1::GenerateRequest req;
  req.set_max_tokens(2);
  auto reader = f.stub->Generate(&ctx, req);
  v1::GenerateResponse r;
  std::string text;
  while (reader->Read(&r)) text += r.text();
  REQUIRE(reader->Finish().ok());
  REQUIRE(text == "ab");
}

TEST_CASE("A gRPC client cancelling mid-stream cancels the request", "[server]") {
  GrpcFixture f;
  f.engine.reply_length = 1 << 30;
  f.engine.token_interval = absl::Milliseconds(1);
  grpc::ClientContext ctx;
  v1::GenerateRequest req;
  req.set_max_tokens(100000);
  auto reader = f.stub->Generate(&ctx, req);
  v1::GenerateResponse r;
  REQUIRE(reader->Read(&r));
  REQUIRE(r.text() == "a");
  ctx.TryCancel();
  while (reader->Read(&r)) {
  }
  REQUIRE(reader->Finish().error_code() == grpc::StatusCode::CANCELLED);
  REQUIRE(f.engine.WaitForCancelled(1) == 1);
  REQUIRE(f.state.WaitForCalls(absl::Now() + absl::Seconds(10)));
}

}  // namespace
}  // namespace kvserve

// The daemon's gRPC API end to end through the real `kvserve serve` binary:
// Generate streams the greedy reference text (256 tokens from [BOS], as
// llama2.c's run.c prints it), bad requests are INVALID_ARGUMENT naming the
// field and the daemon serves on, the health service says SERVING, and the
// unary calls describe the model.
#include <grpcpp/grpcpp.h>

#include <catch2/catch.hpp>

#include "proto/kvserve.grpc.pb.h"
#include "tests/grpc_health.h"
#include "tests/integration/daemon_fixture.h"

namespace kvserve {
namespace {

namespace v1 = ::kvserve::v1;
using testing::DaemonProcess;

struct GrpcClient {
  explicit GrpcClient(const DaemonProcess& d)
      : channel(grpc::CreateChannel(d.grpc_target(), grpc::InsecureChannelCredentials())),
        stub(v1::Generation::NewStub(channel)) {}

  std::vector<v1::GenerateResponse> Generate(const v1::GenerateRequest& req, grpc::Status* st) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(120));
    auto reader = stub->Generate(&ctx, req);
    std::vector<v1::GenerateResponse> out;
    v1::GenerateResponse r;
    while (reader->Read(&r)) out.push_back(r);
    *st = reader->Finish();
    return out;
  }

  // 1 SERVING, 2 NOT_SERVING, -1 on error.
  int Health(const std::string& service) { return testing::GrpcHealthCheck(channel, service); }

  std::shared_ptr<grpc::Channel> channel;
  std::unique_ptr<v1::Generation::Stub> stub;
};

v1::GenerateRequest Greedy() {
  v1::GenerateRequest req;
  req.set_prompt("");
  req.set_max_tokens(256);
  req.mutable_sampling()->set_temperature(0);
  return req;
}

std::string Text(const std::vector<v1::GenerateResponse>& responses) {
  std::string text;
  for (const auto& r : responses) text += r.text();
  return text;
}

TEST_CASE("Daemon: gRPC Generate at temperature 0 streams the reference text", "[integration]") {
  DaemonProcess d;
  GrpcClient c(d);
  grpc::Status st;
  v1::GenerateRequest req = Greedy();
  req.set_request_id("golden-1");
  auto responses = c.Generate(req, &st);
  INFO(st.error_message());
  REQUIRE(st.ok());
  REQUIRE(responses.size() > 10);  // streamed
  REQUIRE(Text(responses) == testing::GoldenGreedyText());
  int tokens = 0;
  for (const auto& r : responses) {
    REQUIRE(r.request_id() == "golden-1");
    REQUIRE(r.index() == 0);
    tokens += r.token_ids_size();
  }
  REQUIRE(tokens == 256);
  const v1::GenerateResponse& last = responses.back();
  REQUIRE(last.request_finished());
  REQUIRE(last.finish_reason() == v1::FINISH_REASON_LENGTH);
  REQUIRE(last.usage().prompt_tokens() == 1);
  REQUIRE(last.usage().completion_tokens() == 256);
  REQUIRE(last.usage().total_tokens() == 257);

  SECTION("the same prompt as token ids gives the same text") {
    v1::GenerateRequest ids = Greedy();
    ids.add_prompt_token_ids(1);  // BOS
    REQUIRE(Text(c.Generate(ids, &st)) == testing::GoldenGreedyText());
  }
  SECTION("the health service says SERVING") {
    REQUIRE(c.Health("") == 1);
    REQUIRE(c.Health("kvserve.v1.Generation") == 1);
  }
  SECTION("Tokenize, GetModelInfo and GetStats describe the served model") {
    grpc::ClientContext c1;
    v1::TokenizeRequest tr;
    tr.set_text("Once upon a time");
    v1::TokenizeResponse tok;
    REQUIRE(c.stub->Tokenize(&c1, tr, &tok).ok());
    REQUIRE(tok.token_ids(0) == 1);
    REQUIRE(tok.token_ids_size() == tok.pieces_size());

    grpc::ClientContext c2;
    v1::ModelInfo info;
    REQUIRE(c.stub->GetModelInfo(&c2, v1::GetModelInfoRequest(), &info).ok());
    REQUIRE(info.name() == "stories260k");
    REQUIRE(info.vocab_size() == 512);
    REQUIRE(info.max_model_len() == 512);
    REQUIRE(info.num_layers() == 5);
    REQUIRE(info.num_kv_heads() == 4);
    REQUIRE(info.head_dim() == 8);
    REQUIRE(info.kv_dtype() == "fp32");
    REQUIRE(info.block_size() == 16);
    REQUIRE(info.device() == "cpu");

    grpc::ClientContext c3;
    v1::Stats stats;
    REQUIRE(c.stub->GetStats(&c3, v1::GetStatsRequest(), &stats).ok());
    REQUIRE(stats.generated_tokens() == 256);
    REQUIRE(stats.requests_finished_length() == 1);
    REQUIRE(stats.num_running() == 0);
  }
}

TEST_CASE("Daemon: bad gRPC requests are INVALID_ARGUMENT naming the field", "[integration]") {
  DaemonProcess d;
  GrpcClient c(d);
  struct Case {
    std::function<void(v1::GenerateRequest*)> edit;
    const char* field;
  };
  const Case cases[] = {
      {[](v1::GenerateRequest* r) { r->mutable_sampling()->set_temperature(-1); }, "temperature"},
      {[](v1::GenerateRequest* r) { r->mutable_sampling()->set_top_p(0); }, "top_p"},
      {[](v1::GenerateRequest* r) { r->mutable_sampling()->set_top_p(1.5f); }, "top_p"},
      {[](v1::GenerateRequest* r) { r->set_max_tokens(0); }, "max_tokens"},
      {[](v1::GenerateRequest* r) { r->set_max_tokens(600); }, "max_tokens"},
      {[](v1::GenerateRequest* r) { r->set_n(0); }, "n"},
      {[](v1::GenerateRequest* r) { r->add_prompt_token_ids(4096); }, "prompt_token_ids"},
      {[](v1::GenerateRequest* r) {
         for (int i = 0; i < 600; ++i) r->add_prompt_token_ids(100);
       },
       "prompt"},
  };
  for (const Case& k : cases) {
    v1::GenerateRequest req = Greedy();
    k.edit(&req);
    grpc::Status st;
    auto responses = c.Generate(req, &st);
    INFO(k.field << ": " << st.error_message());
    REQUIRE(st.error_code() == grpc::StatusCode::INVALID_ARGUMENT);
    REQUIRE(responses.empty());
    REQUIRE(st.error_message().rfind(k.field, 0) == 0);
  }
  grpc::Status st;
  REQUIRE(Text(c.Generate(Greedy(), &st)) == testing::GoldenGreedyText());
  REQUIRE(st.ok());
}

TEST_CASE("Daemon: a gRPC client cancelling mid-stream frees its KV blocks", "[integration]") {
  DaemonProcess d;
  GrpcClient c(d);
  grpc::ClientContext ctx;
  // A request far longer than the test: streaming eviction is not held to
  // max_model_len, and it asks for 30,000 tokens (within limits.max_generated_tokens,
  // 64 x max_model_len); it is cancelled after its first event.
  v1::GenerateRequest req = Greedy();
  req.set_max_tokens(30000);
  req.set_ignore_eos(true);
  req.mutable_kv_policy()->set_policy("streaming");
  req.mutable_kv_policy()->set_budget(48);
  req.mutable_kv_policy()->set_sink_tokens(4);
  auto reader = c.stub->Generate(&ctx, req);
  v1::GenerateResponse r;
  REQUIRE(reader->Read(&r));
  ctx.TryCancel();
  while (reader->Read(&r)) {
  }
  REQUIRE(reader->Finish().error_code() == grpc::StatusCode::CANCELLED);
  // The cancel reaches the server on this connection before the next call
  // does, and the engine frees a cancelled request at its next step; it
  // publishes stats before a step's events, so once the next request's last
  // event is here the stats show the cancelled one gone. No polling.
  grpc::Status st;
  REQUIRE(Text(c.Generate(Greedy(), &st)) == testing::GoldenGreedyText());
  REQUIRE(st.ok());
  v1::Stats stats;
  grpc::ClientContext sc;
  REQUIRE(c.stub->GetStats(&sc, v1::GetStatsRequest(), &stats).ok());
  REQUIRE(stats.requests_finished_cancelled() == 1);
  REQUIRE(stats.kv_blocks_active() == 0);
  REQUIRE(stats.num_running() == 0);
}

}  // namespace
}  // namespace kvserve

// The gRPC client of client.h: kvserve.v1.Generation/Generate, one stream per
// request.
#include <grpcpp/grpcpp.h>

#include <chrono>

#include "absl/strings/str_cat.h"
#include "bench/loadgen/client.h"
#include "proto/kvserve.grpc.pb.h"

namespace kvserve::bench {
namespace {

namespace v1 = ::kvserve::v1;

std::shared_ptr<grpc::Channel> NewChannel(const std::string& target, bool shared) {
  grpc::ChannelArguments args;
  // A fresh connection per request must not reuse the process-wide
  // subchannel (and its TCP connection) of another channel to the same target.
  if (!shared) args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  args.SetInt(GRPC_ARG_MAX_RECEIVE_MESSAGE_LENGTH, -1);
  return grpc::CreateCustomChannel(target, grpc::InsecureChannelCredentials(), args);
}

class GrpcClient final : public Client {
 public:
  GrpcClient(const ClientOptions& options, bool keep_alive)
      : options_(options), keep_alive_(keep_alive) {
    if (keep_alive_) {
      channel_ = NewChannel(options_.grpc_target, /*shared=*/true);
      stub_ = v1::Generation::NewStub(channel_);
    }
  }

  RequestResult Send(const BenchRequest& request) override {
    RequestResult res;
    if (options_.grpc_target.empty()) {
      res.error = "--grpc-target is required for --api grpc";
      return res;
    }
    v1::GenerateRequest req;
    if (options_.send_token_ids && !request.prompt_ids.empty()) {
      for (int32_t id : request.prompt_ids) req.add_prompt_token_ids(id);
    } else {
      req.set_prompt(request.prompt);
    }
    req.set_max_tokens(request.max_tokens);
    req.set_ignore_eos(options_.ignore_eos);
    req.mutable_sampling()->set_temperature(static_cast<float>(options_.temperature));

    res.start_s = SteadySeconds();
    std::shared_ptr<grpc::Channel> channel = channel_;
    std::unique_ptr<v1::Generation::Stub> fresh_stub;
    v1::Generation::Stub* stub = stub_.get();
    if (!keep_alive_) {
      channel = NewChannel(options_.grpc_target, /*shared=*/false);
      fresh_stub = v1::Generation::NewStub(channel);
      stub = fresh_stub.get();
    }
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(options_.timeout_s));
    std::unique_ptr<grpc::ClientReader<v1::GenerateResponse>> reader = stub->Generate(&ctx, req);
    v1::GenerateResponse r;
    double last = 0;
    int64_t tokens = 0;
    std::string error;
    while (reader->Read(&r)) {
      const double now = SteadySeconds();
      if (r.token_ids_size() > 0 || !r.text().empty()) {
        res.text += r.text();
        if (res.ttft_s < 0) {
          res.ttft_s = now - res.start_s;
        } else {
          res.itl_s.push_back(now - last);
        }
        last = now;
        ++res.chunks;
        tokens += r.token_ids_size();
      }
      if (!r.error().empty() && error.empty()) error = r.error();
      if (r.request_finished() && r.has_usage()) {
        res.usage_reported = true;
        res.prompt_tokens = r.usage().prompt_tokens();
        res.cached_tokens = r.usage().cached_prompt_tokens();
        res.output_tokens = r.usage().completion_tokens();
      }
    }
    grpc::Status st = reader->Finish();
    res.e2e_s = SteadySeconds() - res.start_s;
    if (!st.ok()) {
      res.error = absl::StrCat("gRPC ", st.error_code(), ": ", st.error_message());
    } else if (!error.empty()) {
      res.error = error;
    } else {
      res.ok = true;
      if (!res.usage_reported) res.output_tokens = tokens;
    }
    return res;
  }

 private:
  const ClientOptions options_;
  const bool keep_alive_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::Generation::Stub> stub_;
};

}  // namespace

std::unique_ptr<Client> MakeGrpcClient(const ClientOptions& options, bool keep_alive) {
  return std::make_unique<GrpcClient>(options, keep_alive);
}

}  // namespace kvserve::bench

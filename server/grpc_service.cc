#include "server/grpc_service.h"

#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/grpcpp.h>
#include <grpcpp/health_check_service_interface.h>

#include <utility>

#include "absl/strings/str_cat.h"
#include "proto/kvserve.grpc.pb.h"
#include "model/field_status.h"
#include "scheduler/request_validation.h"
#include "server/logging.h"
#include "server/reflection_v1.h"
#include "server/stats_proto.h"

namespace kvserve {
namespace {

namespace v1 = ::kvserve::v1;

// The trailing metadata key that names the request field an
// INVALID_ARGUMENT is about (what HTTP puts in the error's "param").
constexpr char kFieldTrailer[] = "kvserve-field";

// ctx (when given) gets the kvserve-field trailer of a FieldError.
grpc::Status ToGrpc(const absl::Status& s, grpc::CallbackServerContext* ctx = nullptr) {
  if (const std::string field = ErrorField(s); ctx != nullptr && !field.empty()) {
    ctx->AddTrailingMetadata(kFieldTrailer, field);
  }
  return grpc::Status(static_cast<grpc::StatusCode>(s.code()), std::string(s.message()));
}

// Refuses calls the daemon cannot take: no model yet, draining, wrong key.
grpc::Status Admit(const ServingState& state, const grpc::CallbackServerContext& ctx,
                   bool needs_ready) {
  if (!state.api_key().empty()) {
    const auto& md = ctx.client_metadata();
    auto it = md.find("authorization");
    std::string_view auth = it == md.end() ? std::string_view()
                                           : std::string_view(it->second.data(), it->second.size());
    if (!state.Authorized(auth)) {
      return grpc::Status(grpc::StatusCode::UNAUTHENTICATED,
                          "missing or wrong 'authorization: Bearer <key>' metadata");
    }
  }
  if (state.engine() == nullptr) {
    return grpc::Status(grpc::StatusCode::UNAVAILABLE, "the model is still loading");
  }
  if (needs_ready && !state.ready()) {
    return grpc::Status(grpc::StatusCode::UNAVAILABLE, "the server is shutting down");
  }
  return grpc::Status::OK;
}

// Applies the proto's defaults, then the one request validator
// (scheduler/request_validation.h) that HTTP and the engine use too.
absl::Status FromProto(const v1::GenerateRequest& p, int vocab, const SamplingParams& defaults,
                       GenerateRequest* g) {
  g->sampling = defaults;
  if (!p.request_id().empty() && !IsAcceptableRequestId(p.request_id())) {
    return FieldError("request_id", "request_id: use 1-128 characters of [A-Za-z0-9._:-]");
  }
  g->request_id = p.request_id().empty() ? NewRequestId() : p.request_id();
  g->prompt = p.prompt();
  g->prompt_token_ids.assign(p.prompt_token_ids().begin(), p.prompt_token_ids().end());
  g->add_bos = p.has_add_bos() ? p.add_bos() : true;
  const v1::SamplingParams& s = p.sampling();
  if (s.has_temperature()) g->sampling.temperature = s.temperature();
  if (s.has_top_k()) g->sampling.top_k = s.top_k();
  if (s.has_top_p()) g->sampling.top_p = s.top_p();
  if (s.has_min_p()) g->sampling.min_p = s.min_p();
  if (s.has_repetition_penalty()) g->sampling.repetition_penalty = s.repetition_penalty();
  if (s.has_presence_penalty()) g->sampling.presence_penalty = s.presence_penalty();
  if (s.has_frequency_penalty()) g->sampling.frequency_penalty = s.frequency_penalty();
  if (s.has_seed()) g->sampling.seed = s.seed();
  g->max_tokens = p.has_max_tokens() ? p.max_tokens() : 16;
  g->n = p.has_n() ? p.n() : 1;
  // Counted before copying: 100,000 stop strings are refused, not copied.
  if (p.stop_size() > kDefaultRequestLimits.max_stop_strings) {
    return FieldError("stop", absl::StrCat("stop has ", p.stop_size(), " strings, at most ",
                                           kDefaultRequestLimits.max_stop_strings,
                                           " are allowed"));
  }
  g->stop.assign(p.stop().begin(), p.stop().end());
  g->stop_token_ids.assign(p.stop_token_ids().begin(), p.stop_token_ids().end());
  g->ignore_eos = p.ignore_eos();
  g->logprobs = p.has_logprobs() ? p.logprobs() : -1;
  if (p.has_logprobs() && p.logprobs() < 0) {
    return FieldError("logprobs", absl::StrCat("logprobs must be >= 0, got ", p.logprobs()));
  }
  g->cache_salt = p.cache_salt();
  g->priority = p.priority();
  if (p.has_kv_policy()) {
    const v1::KvPolicy& k = p.kv_policy();
    g->kv_policy.policy = k.policy();
    g->kv_policy.budget = k.budget();
    if (k.has_sink_tokens()) g->kv_policy.sink_tokens = k.sink_tokens();
    if (k.has_recent_tokens()) g->kv_policy.recent_tokens = k.recent_tokens();
  }
  RequestLimits limits = kDefaultRequestLimits;
  limits.vocab_size = vocab;
  return ValidateRequestParams(*g, limits);
}

v1::FinishReason ToProto(FinishReason r) {
  switch (r) {
    case FinishReason::kNone:
      return v1::FINISH_REASON_UNSPECIFIED;
    case FinishReason::kStop:
      return v1::FINISH_REASON_STOP;
    case FinishReason::kLength:
      return v1::FINISH_REASON_LENGTH;
    case FinishReason::kCancelled:
      return v1::FINISH_REASON_CANCELLED;
    case FinishReason::kError:
      return v1::FINISH_REASON_ERROR;
  }
  return v1::FINISH_REASON_UNSPECIFIED;
}

void ToProto(const GenerateOutput& out, const std::string& request_id, const Tokenizer& tok,
             v1::GenerateResponse* r) {
  r->Clear();
  r->set_request_id(request_id);
  r->set_index(out.index);
  r->set_text(out.text);
  r->mutable_token_ids()->Add(out.token_ids.begin(), out.token_ids.end());
  for (const TokenLogprob& lp : out.logprobs) {
    v1::TokenLogprob* p = r->add_logprobs();
    p->set_token_id(lp.token_id);
    p->set_logprob(lp.logprob);
    p->set_token(tok.IdToPiece(lp.token_id));
    for (const auto& [id, value] : lp.top) {
      v1::TopLogprob* t = p->add_top();
      t->set_token_id(id);
      t->set_logprob(value);
      t->set_token(tok.IdToPiece(id));
    }
  }
  r->set_finish_reason(ToProto(out.finish_reason));
  r->set_error(out.error);
  r->set_request_finished(out.request_finished);
  if (out.request_finished) {
    v1::Usage* u = r->mutable_usage();
    u->set_prompt_tokens(out.usage.prompt_tokens);
    u->set_cached_prompt_tokens(out.usage.cached_prompt_tokens);
    u->set_completion_tokens(out.usage.completion_tokens);
    u->set_total_tokens(out.usage.prompt_tokens + out.usage.completion_tokens);
  }
}

// One Generate call. Deletes itself in OnDone.
class GenerateReactor final : public grpc::ServerWriteReactor<v1::GenerateResponse> {
 public:
  GenerateReactor(ServingState* state, grpc::CallbackServerContext* ctx,
                  const v1::GenerateRequest* request)
      : state_(state), link_(std::make_shared<Link>()) {
    link_->reactor = this;
    grpc::Status st = Begin(ctx, *request);
    if (!st.ok()) {
      {
        absl::MutexLock lock(&mu_);
        finished_ = true;
      }
      Finish(st);
      return;
    }
    // The engine may push before this returns: Pump is safe at any time.
    std::shared_ptr<Link> link = link_;
    stream_->SetNotify([link] {
      absl::MutexLock lock(&link->mu);
      if (link->reactor != nullptr) link->reactor->Pump();
    });
    Pump();
  }

  void OnWriteDone(bool ok) override {
    if (!ok) {
      // The client is gone; stop generating for it.
      stream_->Cancel();
      {
        absl::MutexLock lock(&mu_);
        writing_ = false;
        if (finished_) return;
        finished_ = true;
      }
      Finish(grpc::Status(grpc::StatusCode::CANCELLED, "the stream to the client broke"));
      return;
    }
    {
      absl::MutexLock lock(&mu_);
      writing_ = false;
    }
    Pump();
  }

  void OnCancel() override {
    if (stream_ != nullptr) {
      stream_->Cancel();
      LogRequest(spdlog::level::info, request_id_, "grpc call cancelled by the client");
    }
  }

  void OnDone() override {
    {
      absl::MutexLock lock(&link_->mu);
      link_->reactor = nullptr;
    }
    if (stream_ != nullptr) {
      LogRequest(spdlog::level::info, request_id_, "grpc Generate done after {:.3f}s",
                 absl::ToDoubleSeconds(absl::Now() - start_));
      state_->CallFinished();
    }
    delete this;
  }

 private:
  // Lets the engine's notify reach the reactor only while it exists.
  struct Link {
    absl::Mutex mu;
    GenerateReactor* reactor ABSL_GUARDED_BY(mu) = nullptr;
  };

  grpc::Status Begin(grpc::CallbackServerContext* ctx, const v1::GenerateRequest& p) {
    grpc::Status st = Admit(*state_, *ctx, /*needs_ready=*/true);
    if (!st.ok()) return st;
    Engine* engine = state_->engine();
    tokenizer_ = &engine->tokenizer();
    GenerateRequest g;
    if (absl::Status v =
            FromProto(p, tokenizer_->vocab_size(), engine->model_config().DefaultSampling(), &g);
        !v.ok()) {
      return ToGrpc(v, ctx);
    }
    request_id_ = g.request_id;
    absl::StatusOr<std::shared_ptr<RequestStream>> s = engine->Submit(std::move(g));
    if (!s.ok()) {
      LogRequest(spdlog::level::info, request_id_, "grpc Generate refused: {}",
                 std::string(s.status().message()));
      return ToGrpc(s.status(), ctx);
    }
    LogRequest(spdlog::level::info, request_id_, "grpc Generate max_tokens={}",
               p.has_max_tokens() ? p.max_tokens() : 16);
    start_ = absl::Now();
    state_->CallStarted();
    stream_ = *std::move(s);
    return grpc::Status::OK;
  }

  // Writes the next ready output, or finishes at the end of the stream.
  void Pump() {
    bool write = false;
    bool finish = false;
    grpc::Status status;
    {
      absl::MutexLock lock(&mu_);
      if (finished_ || writing_) return;
      GenerateOutput out;
      switch (stream_->TryNext(&out)) {
        case RequestStream::Pop::kOutput:
          if (out.finish_reason == FinishReason::kError && error_.empty()) {
            error_ = out.error.empty() ? "generation failed" : out.error;
          }
          ToProto(out, request_id_, *tokenizer_, &response_);
          writing_ = true;
          write = true;
          break;
        case RequestStream::Pop::kEnd:
          finished_ = true;
          finish = true;
          status =
              error_.empty() ? grpc::Status::OK : grpc::Status(grpc::StatusCode::INTERNAL, error_);
          break;
        case RequestStream::Pop::kTimeout:
          return;
      }
    }
    // response_ is not touched again until OnWriteDone clears writing_.
    if (write) StartWrite(&response_);
    if (finish) Finish(status);
  }

  ServingState* const state_;
  const std::shared_ptr<Link> link_;
  const Tokenizer* tokenizer_ = nullptr;
  std::shared_ptr<RequestStream> stream_;
  std::string request_id_;
  absl::Time start_;
  absl::Mutex mu_;
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
  std::string error_ ABSL_GUARDED_BY(mu_);
  v1::GenerateResponse response_;
};

}  // namespace

class GrpcService::Impl final : public v1::Generation::CallbackService {
 public:
  explicit Impl(ServingState* state) : state_(state) {}

  grpc::ServerWriteReactor<v1::GenerateResponse>* Generate(
      grpc::CallbackServerContext* ctx, const v1::GenerateRequest* request) override {
    return new GenerateReactor(state_, ctx, request);
  }

  grpc::ServerUnaryReactor* Tokenize(grpc::CallbackServerContext* ctx,
                                     const v1::TokenizeRequest* request,
                                     v1::TokenizeResponse* response) override {
    grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
    grpc::Status st = Admit(*state_, *ctx, /*needs_ready=*/false);
    if (st.ok()) {
      const Tokenizer& tok = state_->engine()->tokenizer();
      for (int32_t id :
           tok.Encode(request->text(), request->has_add_bos() ? request->add_bos() : true)) {
        response->add_token_ids(id);
        response->add_pieces(tok.IdToPiece(id));
      }
    }
    reactor->Finish(st);
    return reactor;
  }

  grpc::ServerUnaryReactor* GetModelInfo(grpc::CallbackServerContext* ctx,
                                         const v1::GetModelInfoRequest*,
                                         v1::ModelInfo* info) override {
    grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
    grpc::Status st = Admit(*state_, *ctx, /*needs_ready=*/false);
    if (st.ok()) {
      const ModelConfig& m = state_->engine()->model_config();
      const ServedModelInfo& s = state_->info();
      info->set_name(s.name);
      info->set_architecture(m.architecture);
      info->set_vocab_size(m.vocab_size);
      info->set_max_model_len(s.max_model_len);
      info->set_num_layers(m.num_layers);
      info->set_num_heads(m.num_heads);
      info->set_num_kv_heads(m.num_kv_heads);
      info->set_head_dim(m.head_dim);
      info->set_hidden_size(m.dim);
      info->set_bos_id(m.bos_id);
      info->set_eos_id(m.eos_id);
      info->set_device(s.device);
      info->set_kv_dtype(s.kv_dtype);
      info->set_block_size(s.block_size);
      info->set_num_blocks(s.num_blocks);
      info->set_num_swap_blocks(s.num_swap_blocks);
      info->set_prefix_caching(s.prefix_caching);
    }
    reactor->Finish(st);
    return reactor;
  }

  grpc::ServerUnaryReactor* GetStats(grpc::CallbackServerContext* ctx, const v1::GetStatsRequest*,
                                     v1::Stats* out) override {
    grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
    grpc::Status st = Admit(*state_, *ctx, /*needs_ready=*/false);
    if (st.ok()) {
      ToProto(state_->engine()->GetStats(), out);
    }
    reactor->Finish(st);
    return reactor;
  }

 private:
  ServingState* const state_;
};

GrpcService::GrpcService(ServingState* state)
    : state_(state), impl_(std::make_unique<Impl>(state)) {}

GrpcService::~GrpcService() { Shutdown(absl::Now()); }

absl::Status GrpcService::Start(const std::string& host, int port, bool reuse_port) {
  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  int selected = 0;
  // IPv6 literals need brackets in a gRPC target.
  std::string address = host.find(':') != std::string::npos ? absl::StrCat("[", host, "]:", port)
                                                            : absl::StrCat(host, ":", port);
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, reuse_port ? 1 : 0);
  builder.AddListeningPort(address, grpc::InsecureServerCredentials(), &selected);
  builder.RegisterService(impl_.get());
  // Reflection v1 beside gRPC's own v1alpha (registered by the plugin above).
  reflection_v1_ = std::make_unique<ReflectionV1Service>(std::vector<std::string>{
      v1::Generation::service_full_name(), "grpc.health.v1.Health",
      "grpc.reflection.v1.ServerReflection", "grpc.reflection.v1alpha.ServerReflection"});
  builder.RegisterService(reflection_v1_.get());
  builder.SetMaxReceiveMessageSize(64 << 20);
  server_ = builder.BuildAndStart();
  if (server_ == nullptr || selected == 0) {
    server_.reset();
    return absl::UnavailableError(
        absl::StrCat("server.grpc_port: cannot listen on ", address, " (in use, or a bad host?)"));
  }
  port_ = selected;
  SetServing(state_->ready());
  return absl::OkStatus();
}

void GrpcService::SetServing(bool serving) {
  if (server_ == nullptr) return;
  if (grpc::HealthCheckServiceInterface* health = server_->GetHealthCheckService()) {
    health->SetServingStatus(serving);
    health->SetServingStatus(v1::Generation::service_full_name(), serving);
  }
}

void GrpcService::Shutdown(absl::Time deadline) {
  if (server_ == nullptr) return;
  SetServing(false);
  server_->Shutdown(absl::ToChronoTime(deadline));
  server_->Wait();
  server_.reset();
}

}  // namespace kvserve

#include "server/grpc/grpc_service.h"

#include <grpc/grpc_security.h>
#include <grpc/support/log.h>
#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/grpcpp.h>
#include <grpcpp/health_check_service_interface.h>
#include <grpcpp/impl/codegen/client_unary_call.h>
#include <grpcpp/resource_quota.h>
#include <grpcpp/security/auth_metadata_processor.h>
#include <grpcpp/support/proto_buffer_reader.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <deque>
#include <fstream>
#include <sstream>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "proto/kvserve.grpc.pb.h"
#include "scheduler/request_validation.h"
#include "server/admission/auth.h"
#include "server/admission/client_limiter.h"
#include "server/admission/engine_gate.h"
#include "server/admission/request_budget.h"
#include "server/config/config.h"
#include "server/grpc/grpc_call.h"
#include "server/grpc/reflection_v1.h"
#include "server/grpc/stats_proto.h"
#include "server/observability/logging.h"
#include "util/field_status.h"

namespace kvserve {
namespace {

namespace v1 = ::kvserve::v1;

using grpc_call::CallEnv;
using grpc_call::ParseRequest;
using grpc_call::Serialize;
using grpc_call::ToGrpc;

using RawGenerationService =
    v1::Generation::WithRawCallbackMethod_Generate<v1::Generation::WithRawCallbackMethod_Tokenize<
        v1::Generation::WithRawCallbackMethod_GetModelInfo<
            v1::Generation::WithRawCallbackMethod_GetStats<v1::Generation::Service>>>>;

}  // namespace

class GrpcService::Impl final : public RawGenerationService {
 public:
  Impl(ServingState* state, const Options* options)
      : limiter_(options->limiter != nullptr
                     ? options->limiter
                     : std::make_shared<ClientLimiter>(options->max_concurrent_per_client)),
        workers_(options->prompt_workers, options->prompt_threads) {
    env_.state = state;
    env_.options = options;
    env_.limiter = limiter_.get();
    env_.workers = &workers_;
    env_.gate = &state->gate();
  }

  void StopWorkers() { workers_.Drain(); }
  bool CloseGate(absl::Time deadline) { return env_.gate->Close(deadline); }

  grpc::ServerWriteReactor<grpc::ByteBuffer>* Generate(grpc::CallbackServerContext* ctx,
                                                       const grpc::ByteBuffer* request) override {
    return grpc_call::StartGenerate(env_, ctx, request);
  }

  grpc::ServerUnaryReactor* Tokenize(grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* raw,
                                     grpc::ByteBuffer* response) override {
    grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
    EngineGate::Lease lease;
    grpc::Status st = env_.Admit(*ctx, /*needs_ready=*/false, &lease);
    auto request = std::make_shared<v1::TokenizeRequest>();
    if (st.ok()) {
      if (absl::Status parsed = ParseRequest(*raw, request.get()); !parsed.ok()) {
        st = ToGrpc(parsed, ctx);
      }
    }
    RequestLimits limits;
    if (st.ok()) {
      limits = env_.Limits();
      // The byte budget before any work, on this thread.
      if (absl::Status b = CheckPromptBytes(request->text().size(), limits, "text"); !b.ok()) {
        st = ToGrpc(b, ctx);
      }
    }
    absl::StatusOr<ClientLimiter::Token> slot;
    if (st.ok()) {
      slot = limiter_->Acquire(env_.ClientOf(*ctx));
      if (!slot.ok()) st = ToGrpc(slot.status(), ctx);
    }
    if (!st.ok()) {
      reactor->Finish(st);
      return reactor;
    }
    auto held = std::make_shared<ClientLimiter::Token>(*std::move(slot));
    auto leased = std::make_shared<EngineGate::Lease>(std::move(lease));
    ServingState* state = env_.state;
    workers_.Run([state, ctx, reactor, request, response, limits, held, leased] {
      const Tokenizer& tok = state->engine()->tokenizer();
      absl::StatusOr<std::vector<int32_t>> ids = TokenizeWithinBudget(
          tok, request->text(), request->has_add_bos() ? request->add_bos() : true, limits, "text");
      grpc::Status result;
      if (!ids.ok()) {
        result = ToGrpc(ids.status(), ctx);
      } else {
        v1::TokenizeResponse out;
        for (int32_t id : *ids) {
          out.add_token_ids(id);
          out.add_pieces(tok.IdToPiece(id));
        }
        result = Serialize(out, response);
      }
      held->Release();
      leased->Release();
      reactor->Finish(result);
    });
    return reactor;
  }

  grpc::ServerUnaryReactor* GetModelInfo(grpc::CallbackServerContext* ctx,
                                         const grpc::ByteBuffer* raw,
                                         grpc::ByteBuffer* response) override {
    grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
    EngineGate::Lease lease;
    grpc::Status st = env_.Admit(*ctx, /*needs_ready=*/false, &lease);
    v1::GetModelInfoRequest request;
    if (st.ok()) {
      if (absl::Status parsed = ParseRequest(*raw, &request); !parsed.ok()) st = ToGrpc(parsed);
    }
    if (st.ok()) {
      const ModelConfig& m = env_.state->engine()->model_config();
      const ServedModelInfo& s = env_.state->info();
      v1::ModelInfo info;
      info.set_name(s.name);
      info.set_architecture(m.architecture);
      info.set_vocab_size(m.vocab_size);
      info.set_max_model_len(s.max_model_len);
      info.set_num_layers(m.num_layers);
      info.set_num_heads(m.num_heads);
      info.set_num_kv_heads(m.num_kv_heads);
      info.set_head_dim(m.head_dim);
      info.set_hidden_size(m.dim);
      info.set_bos_id(m.bos_id);
      info.set_eos_id(m.eos_id);
      info.set_device(s.device);
      info.set_kv_dtype(s.kv_dtype);
      info.set_block_size(s.block_size);
      info.set_num_blocks(s.num_blocks);
      info.set_num_swap_blocks(s.num_swap_blocks);
      info.set_prefix_caching(s.prefix_caching);
      st = Serialize(info, response);
    }
    reactor->Finish(st);
    return reactor;
  }

  grpc::ServerUnaryReactor* GetStats(grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* raw,
                                     grpc::ByteBuffer* response) override {
    grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
    EngineGate::Lease lease;
    grpc::Status st = env_.Admit(*ctx, /*needs_ready=*/false, &lease);
    v1::GetStatsRequest request;
    if (st.ok()) {
      if (absl::Status parsed = ParseRequest(*raw, &request); !parsed.ok()) st = ToGrpc(parsed);
    }
    if (st.ok()) {
      v1::Stats out;
      ToProto(env_.state->engine()->GetStats(), &out);
      st = Serialize(out, response);
    }
    reactor->Finish(st);
    return reactor;
  }

 private:
  const std::shared_ptr<ClientLimiter> limiter_;
  PromptClient workers_;
  CallEnv env_;
};

GrpcService::Options GrpcService::OptionsFromConfig(const ServeConfig& config) {
  Options o;
  o.limits = config.ToRequestLimits();
  o.max_concurrent_per_client = config.limits.max_concurrent_per_client;
  o.max_unsent_outputs = config.limits.max_unsent_outputs;
  o.tls_cert_file = config.server.tls.cert_file;
  o.tls_key_file = config.server.tls.key_file;
  // A stalled or idle connection lasts as long as on the HTTP port.
  o.handshake_timeout = absl::Seconds(config.server.http_header_timeout_s);
  o.idle_timeout = absl::Seconds(config.server.http_idle_timeout_s);
  return o;
}

GrpcService::GrpcService(ServingState* state, Options options)
    : state_(state),
      options_(std::move(options)),
      impl_(std::make_unique<Impl>(state, &options_)) {}

GrpcService::~GrpcService() {
  Shutdown(absl::Now());
  impl_->StopWorkers();
}

namespace {

absl::StatusOr<std::string> ReadPem(const std::string& path, const char* key) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat(key, ": cannot read ", path));
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// The API key, checked on a call's metadata before gRPC reads its message
// (so an unauthenticated 64 MiB message is refused, not received). Health and
// reflection stay open, as before; Admit checks again (a path the processor
// did not see is not let through).
grpc::Status CheckMetadataKey(const ServingState& state, std::string_view path,
                              std::string_view authorization) {
  if (path.rfind("/kvserve.v1.Generation/", 0) != 0) return grpc::Status::OK;
  if (state.Authorized(authorization)) return grpc::Status::OK;
  return grpc::Status(grpc::StatusCode::UNAUTHENTICATED,
                      "missing or wrong 'authorization: Bearer <key>' metadata");
}

// For TLS (grpc::SslServerCredentials takes a C++ processor).
class KeyProcessor final : public grpc::AuthMetadataProcessor {
 public:
  explicit KeyProcessor(const ServingState* state) : state_(state) {}
  bool IsBlocking() const override { return false; }  // a constant-time compare
  grpc::Status Process(const InputMetadata& md, grpc::AuthContext*, OutputMetadata*,
                       OutputMetadata*) override {
    std::string_view path, authorization;
    for (const auto& [key, value] : md) {
      if (key == ":path") path = std::string_view(value.data(), value.size());
      if (key == "authorization") authorization = std::string_view(value.data(), value.size());
    }
    return CheckMetadataKey(*state_, path, authorization);
  }

 private:
  const ServingState* const state_;
};

// Plaintext with the same processor: grpc::InsecureServerCredentials()
// refuses a processor in 1.51, the core's insecure credentials take one.
class InsecureKeyCredentials final : public grpc::ServerCredentials {
 public:
  explicit InsecureKeyCredentials(const ServingState* state)
      : creds_(grpc_insecure_server_credentials_create()) {
    grpc_server_credentials_set_auth_metadata_processor(
        creds_, {&Process, nullptr, const_cast<ServingState*>(state)});
  }
  ~InsecureKeyCredentials() override { grpc_server_credentials_release(creds_); }
  void SetAuthMetadataProcessor(const std::shared_ptr<grpc::AuthMetadataProcessor>&) override {
    std::abort();  // this one has its processor
  }

 private:
  int AddPortToServer(const std::string& addr, grpc_server* server) override {
    return grpc_server_add_http2_port(server, addr.c_str(), creds_);
  }
  static void Process(void* arg, grpc_auth_context*, const grpc_metadata* md, size_t n,
                      grpc_process_auth_metadata_done_cb done, void* user_data) {
    std::string_view path, authorization;
    for (size_t i = 0; i < n; ++i) {
      const std::string_view key(reinterpret_cast<const char*>(GRPC_SLICE_START_PTR(md[i].key)),
                                 GRPC_SLICE_LENGTH(md[i].key));
      const std::string_view value(reinterpret_cast<const char*>(GRPC_SLICE_START_PTR(md[i].value)),
                                   GRPC_SLICE_LENGTH(md[i].value));
      if (key == ":path") path = value;
      if (key == "authorization") authorization = value;
    }
    const grpc::Status st =
        CheckMetadataKey(*static_cast<const ServingState*>(arg), path, authorization);
    done(user_data, nullptr, 0, nullptr, 0, static_cast<grpc_status_code>(st.error_code()),
         st.ok() ? nullptr : st.error_message().c_str());
  }

  grpc_server_credentials* const creds_;
};

absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> Credentials(const GrpcService::Options& o,
                                                                     const ServingState* state) {
  if (o.tls_cert_file.empty() && o.tls_key_file.empty()) {
    return std::make_shared<InsecureKeyCredentials>(state);
  }
  if (o.tls_cert_file.empty() || o.tls_key_file.empty()) {
    return absl::InvalidArgumentError(
        "server.tls.cert_file and server.tls.key_file: set both for TLS, or neither");
  }
  grpc::SslServerCredentialsOptions ssl;
  grpc::SslServerCredentialsOptions::PemKeyCertPair pair;
  absl::StatusOr<std::string> key = ReadPem(o.tls_key_file, "server.tls.key_file");
  if (!key.ok()) return key.status();
  absl::StatusOr<std::string> cert = ReadPem(o.tls_cert_file, "server.tls.cert_file");
  if (!cert.ok()) return cert.status();
  pair.private_key = *std::move(key);
  pair.cert_chain = *std::move(cert);
  ssl.pem_key_cert_pairs.push_back(std::move(pair));
  std::shared_ptr<grpc::ServerCredentials> creds = grpc::SslServerCredentials(ssl);
  creds->SetAuthMetadataProcessor(std::make_shared<KeyProcessor>(state));
  return creds;
}

}  // namespace

namespace {

// Set by gRPC's "Failed accept4: ..." line: 1.51's listener has stopped
// (any accept error but EAGAIN/ECONNABORTED/EINTR ends its accept loop).
std::atomic<bool> g_accept_failed{false};

// gRPC core's own lines (a failed TLS handshake, ...) through spdlog too.
void OnGrpcLog(gpr_log_func_args* args) {
  if (absl::StartsWith(args->message, "Failed accept4")) g_accept_failed.store(true);
  const spdlog::level::level_enum level =
      args->severity == GPR_LOG_SEVERITY_ERROR  ? spdlog::level::warn
      : args->severity == GPR_LOG_SEVERITY_INFO ? spdlog::level::info
                                                : spdlog::level::debug;
  spdlog::log(level, "grpc ({}:{}): {}", args->file, args->line, args->message);
}

}  // namespace

absl::Status GrpcService::Start(const std::string& host, int port, bool reuse_port) {
  RouteProtobufLogs();
  gpr_set_log_function(&OnGrpcLog);
  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  address_host_ = host;
  reuse_port_ = reuse_port;
  port_ = port;
  {
    absl::MutexLock lock(&server_mu_);
    if (absl::Status s = BuildServerLocked(); !s.ok()) return s;
    serving_ = state_->ready();
    SetServingLocked(serving_);
  }
  if (options_.watchdog_interval > absl::ZeroDuration()) {
    watchdog_ = std::thread([this] { WatchdogLoop(); });
  }
  return absl::OkStatus();
}

absl::Status GrpcService::BuildServerLocked() {
  absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> credentials =
      Credentials(options_, state_);
  if (!credentials.ok()) return credentials.status();
  grpc::ServerBuilder builder;
  int selected = 0;
  // IPv6 literals need brackets in a gRPC target.
  const std::string address = address_host_.find(':') != std::string::npos
                                  ? absl::StrCat("[", address_host_, "]:", port_)
                                  : absl::StrCat(address_host_, ":", port_);
  auto ms = [](absl::Duration d) { return static_cast<int>(absl::ToInt64Milliseconds(d)); };
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, reuse_port_ ? 1 : 0);
  // Rapid reset and stream floods: at most this many open streams per
  // connection. gRPC 1.51 has no option that closes a connection resetting
  // streams faster than it completes them (the upstream fix for
  // CVE-2023-44487 came in 1.56.3+); README: terminate HTTP/2 in front.
  builder.AddChannelArgument(GRPC_ARG_MAX_CONCURRENT_STREAMS, options_.max_concurrent_streams);
  // A connection that never sends its SETTINGS closes after this (1.51's
  // default is 120 s); one without calls after idle_timeout. 1.51 has no
  // connection cap (GRPC_ARG_MAX_ALLOWED_INCOMING_CONNECTIONS came later):
  // these timeouts and the resource quota are what bound them.
  builder.AddChannelArgument(GRPC_ARG_SERVER_HANDSHAKE_TIMEOUT_MS, ms(options_.handshake_timeout));
  builder.AddChannelArgument(GRPC_ARG_MAX_CONNECTION_IDLE_MS, ms(options_.idle_timeout));
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIME_MS, ms(options_.keepalive_time));
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, ms(options_.keepalive_timeout));
  grpc::ResourceQuota quota("kvserve-grpc");
  quota.Resize(static_cast<size_t>(options_.memory_quota_bytes));
  quota.SetMaxThreads(64);  // sync handlers only (health, reflection)
  builder.SetResourceQuota(quota);
  builder.AddListeningPort(address, *credentials, &selected);
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
  return absl::OkStatus();
}

bool GrpcService::Probe() const {
  if (!options_.tls_cert_file.empty()) return true;  // TLS: the accept-failure line only
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);  // a connection of its own
  const std::string host = address_host_ == "0.0.0.0" ? "127.0.0.1"
                           : address_host_ == "::"    ? "::1"
                                                      : address_host_;
  const std::string target = host.find(':') != std::string::npos
                                 ? absl::StrCat("[", host, "]:", port_)
                                 : absl::StrCat(host, ":", port_);
  std::shared_ptr<grpc::Channel> channel =
      grpc::CreateCustomChannel(target, grpc::InsecureChannelCredentials(), args);
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + options_.probe_timeout));
  grpc::Slice empty("");  // HealthCheckRequest{service: ""}
  grpc::ByteBuffer request(&empty, 1), response;
  const grpc::Status st = grpc::internal::BlockingUnaryCall<grpc::ByteBuffer, grpc::ByteBuffer>(
      channel.get(),
      grpc::internal::RpcMethod("/grpc.health.v1.Health/Check",
                                grpc::internal::RpcMethod::NORMAL_RPC),
      &ctx, request, &response);
  // NOT_SERVING (drain, loading) still proves the port accepts.
  return st.ok();
}

void GrpcService::WatchdogLoop() {
  int failures = 0;
  bool accepting = true;
  for (;;) {
    {
      absl::MutexLock lock(&server_mu_);
      if (server_mu_.AwaitWithTimeout(absl::Condition(&stopping_), options_.watchdog_interval)) {
        return;
      }
    }
    const bool accept_failed = g_accept_failed.exchange(false);
    failures = accept_failed ? options_.probe_failures : (Probe() ? 0 : failures + 1);
    if (failures < options_.probe_failures) {
      if (!accepting) {
        accepting = true;
        state_->SetGrpcAccepting(true);
        absl::MutexLock lock(&server_mu_);
        SetServingLocked(serving_);
        spdlog::info("grpc port {} accepts again", port_);
      }
      continue;
    }
    if (accepting) {
      accepting = false;
      state_->SetGrpcAccepting(false);
      spdlog::warn("grpc port {} stopped accepting ({}); restarting the gRPC server", port_,
                   accept_failed ? "accept failed" : "health probes failed");
    }
    // The old listener must close first: a second socket on the port would
    // take a share of the connections and never accept them.
    absl::MutexLock lock(&server_mu_);
    if (stopping_) return;
    if (server_ != nullptr) {
      server_->Shutdown(absl::ToChronoTime(absl::Now() + absl::Seconds(1)));
      server_->Wait();
      server_.reset();
    }
    if (absl::Status s = BuildServerLocked(); !s.ok()) {
      spdlog::warn("grpc restart failed (retrying): {}", std::string(s.message()));
      continue;
    }
    restarts_.fetch_add(1);
    SetServingLocked(serving_);
    failures = options_.probe_failures - 1;  // the next probe decides
  }
}

void GrpcService::SetServing(bool serving) {
  absl::MutexLock lock(&server_mu_);
  serving_ = serving;
  SetServingLocked(serving);
}

void GrpcService::SetServingLocked(bool serving) {
  if (server_ == nullptr) return;
  if (grpc::HealthCheckServiceInterface* health = server_->GetHealthCheckService()) {
    // Not serving while the port could not accept, whatever the phase.
    const bool ok = serving && state_->grpc_accepting();
    health->SetServingStatus(ok);
    health->SetServingStatus(v1::Generation::service_full_name(), ok);
  }
}

bool GrpcService::StopServing(absl::Time deadline) {
  SetServing(false);
  return impl_->CloseGate(deadline);
}

void GrpcService::Shutdown(absl::Time deadline) {
  {
    absl::MutexLock lock(&server_mu_);
    stopping_ = true;
  }
  if (watchdog_.joinable()) watchdog_.join();
  absl::MutexLock lock(&server_mu_);
  if (server_ == nullptr) return;
  SetServingLocked(false);
  server_->Shutdown(absl::ToChronoTime(deadline));
  server_->Wait();
  server_.reset();
}

}  // namespace kvserve

// GrpcService: the kvserve.v1.Generation service (proto/kvserve.proto) plus
// the standard grpc.health.v1 health service and server reflection.
//
// Files: grpc_service.cc (the service, its unary methods, credentials, the
// watchdog), grpc_call.h/.cc (what the methods share: errors and messages to
// and from raw buffers, admission, CallEnv), generate_call.cc (the Generate
// stream), stats_proto and reflection_v1.
//
// Built on gRPC's callback API: a Generate stream is a ServerWriteReactor
// that holds no thread while it waits. The engine's RequestStream notify
// (engine thread) and OnWriteDone (gRPC thread) both "pump" the reactor:
// outputs move from the stream into a bounded buffer, with no write in
// flight the next one is written, and the end of the stream finishes the
// call. Nothing in a reaction blocks.
//
// Requests arrive as raw bytes and are parsed here, so a malformed message
// (truncated, invalid UTF-8 in a string field) is answered INVALID_ARGUMENT
// saying what is wrong (gRPC's own handlers answer UNIMPLEMENTED with no
// message), and libprotobuf's complaint is not printed to stderr.
//
// The cost budget (scheduler/request_validation.h) is checked before any
// work: every cheap limit and the prompt's bytes on the gRPC thread, then the
// prompt is tokenized and submitted on PromptWorkers (server/admission/request_budget.h),
// never on a gRPC callback thread. Generate and Tokenize calls count against
// the per-client limit (server/admission/client_limiter.h): RESOURCE_EXHAUSTED over it.
//
// Backpressure: a client that stops reading leaves its outputs in the
// stream's buffer; past options.max_unsent_outputs the request is cancelled
// (its KV blocks freed by the engine's next step) and the call finished
// RESOURCE_EXHAUSTED, which the client sees if it ever reads again.
//
// Health: NOT_SERVING while the model loads and while draining, SERVING when
// ready; SetServing() flips both the overall ("") and the Generation status.
// Drain: Generate is refused UNAVAILABLE from the start of the drain;
// StopServing then closes the daemon's engine gate (ServingState::gate,
// server/admission/engine_gate.h, shared with HTTP), so every call is refused, and
// waits until none touches the engine; the port keeps answering
// UNAVAILABLE (not connection refused) until Shutdown, which the daemon
// calls last.
//
// Hostile connections (gRPC 1.51 lacks the upstream fixes, so the bounds
// are ours): a stalled connection is closed after options.handshake_timeout
// (no HTTP/2 SETTINGS) or options.idle_timeout (no call); each connection
// advertises MAX_CONCURRENT_STREAMS; a grpc::ResourceQuota bounds the
// transport's buffers; the API key is checked on the call's metadata by an
// auth metadata processor, before its message is read; a call cancelled
// before it reached the engine costs the engine nothing.
//
// Watchdog: gRPC 1.51 stops accepting for good after one failed accept()
// (EMFILE: CVE-2023-4785). A thread probes the port every
// options.watchdog_interval with a health call over a fresh connection (and
// notices gRPC's "Failed accept4" line at once); when the port does not
// answer, health is NOT_SERVING (ServingState::SetGrpcAccepting, which
// /health reads too) and the server is rebuilt on the same port until it
// answers again.
//
// Thread-safety: Start/Shutdown from one thread; calls run on gRPC's threads.
#pragma once

#include <atomic>
#include <memory>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "scheduler/request_validation.h"
#include "server/admission/request_budget.h"
#include "server/serving_state.h"

namespace grpc {
class Server;
}

namespace kvserve {

class ClientLimiter;
class ReflectionV1Service;
struct ServeConfig;

class GrpcService {
 public:
  struct Options {
    // The config's limits section (derived limits still 0; resolved against
    // the served model's max_model_len).
    RequestLimits limits = kDefaultRequestLimits;
    int32_t max_concurrent_per_client = 0;  // 0: unlimited
    // The limiter to count calls in; set one shared with the HTTP front end
    // so a client's calls over both count together. Null: a limiter of
    // max_concurrent_per_client of its own.
    std::shared_ptr<ClientLimiter> limiter;
    int32_t max_unsent_outputs = 4096;  // per Generate stream
    // The prompt workers (server/admission/request_budget.h), shared with HTTP in the
    // daemon; null: a pool of prompt_threads of its own.
    std::shared_ptr<PromptWorkers> prompt_workers;
    int32_t prompt_threads = 2;
    // PEM files; both set: TLS (grpc::SslServerCredentials), else plaintext.
    std::string tls_cert_file;
    std::string tls_key_file;
    // Connection bounds (gRPC channel arguments).
    int32_t max_concurrent_streams = 128;                  // per connection
    absl::Duration handshake_timeout = absl::Seconds(10);  // until the client's SETTINGS
    absl::Duration idle_timeout = absl::Seconds(60);       // a connection without a call
    absl::Duration keepalive_time = absl::Seconds(30);     // server pings; dead peers close
    absl::Duration keepalive_timeout = absl::Seconds(10);
    int64_t memory_quota_bytes = int64_t{1} << 30;  // transport buffers, all connections
    // 0: no watchdog. A probe waits at most probe_timeout; probe_failures
    // failures in a row (or one failed accept) restart the server.
    absl::Duration watchdog_interval = absl::Seconds(1);
    absl::Duration probe_timeout =
        absl::Seconds(5);  // generous: a loaded host is no stopped listener
    int32_t probe_failures = 3;
  };
  // The options a ServeConfig asks for.
  static Options OptionsFromConfig(const ServeConfig& config);

  explicit GrpcService(ServingState* state) : GrpcService(state, Options()) {}
  GrpcService(ServingState* state, Options options);
  ~GrpcService();
  GrpcService(const GrpcService&) = delete;
  GrpcService& operator=(const GrpcService&) = delete;

  // Listens on host:port (0: any free port).
  // reuse_port: SO_REUSEPORT (gRPC's default is on; kvserve turns it off so a
  // port in use fails start-up).
  absl::Status Start(const std::string& host, int port, bool reuse_port = false);
  int port() const { return port_; }
  // Health status of every service.
  void SetServing(bool serving);
  // The end of a drain: from now on every call (all methods) is answered
  // UNAVAILABLE without touching the engine, while the port stays open;
  // returns once no call uses the engine (calls still open at `deadline` are
  // cancelled), so the engine may be destroyed. False when some call still
  // held on a few seconds past the deadline.
  bool StopServing(absl::Time deadline);
  // Stops accepting calls and closes the port; calls still open at
  // `deadline` are cancelled.
  void Shutdown(absl::Time deadline);
  // Times the watchdog rebuilt the server.
  int64_t restarts() const { return restarts_.load(); }

 private:
  class Impl;
  // Builds and starts a server on port_ (0: any); server_mu_ held.
  absl::Status BuildServerLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(server_mu_);
  void SetServingLocked(bool serving) ABSL_EXCLUSIVE_LOCKS_REQUIRED(server_mu_);
  // True when a health call over a fresh connection answers in time.
  bool Probe() const;
  void WatchdogLoop();

  ServingState* const state_;
  const Options options_;
  std::unique_ptr<Impl> impl_;
  std::string address_host_;
  bool reuse_port_ = false;
  int port_ = 0;
  mutable absl::Mutex server_mu_;
  std::unique_ptr<ReflectionV1Service> reflection_v1_ ABSL_GUARDED_BY(server_mu_);
  std::unique_ptr<grpc::Server> server_ ABSL_GUARDED_BY(server_mu_);
  bool serving_ ABSL_GUARDED_BY(server_mu_) = false;   // what SetServing last asked
  bool stopping_ ABSL_GUARDED_BY(server_mu_) = false;  // Shutdown began: no restarts
  std::atomic<int64_t> restarts_{0};
  std::thread watchdog_;
};

}  // namespace kvserve

// HttpService: the OpenAI-compatible HTTP front end, on the event-driven
// connection layer of server/http/http_server.h.
//
//   POST /v1/completions, POST /v1/chat/completions   plain JSON or SSE (`stream: true`)
//   GET  /v1/models                                   the one served model
//   POST /tokenize, POST /detokenize                  vLLM's shapes (server/openai/tokenize.h)
//   GET  /health                                      200 ready; 503 loading or draining
//   GET  /metrics                                     Prometheus text format
//
// Errors are OpenAI error objects: 400 for bad bodies (naming the field) and
// bad framing, 401 without a configured bearer key (checked on the head,
// before the body is read), 404 for another model or path, 408 for a
// request that arrives too slowly, 413 over server.max_body_bytes, 429 when
// the engine queue is full, 501 for a transfer coding other than chunked,
// 503 while loading or draining (and over server.max_connections), 500 when
// generation fails.
//
// No request holds a thread while it waits for the engine. Parsing and
// tokenizing a body runs on a small worker pool (server.http_threads
// threads, beside as many io threads); the request is then submitted and
// its outputs reach the connection by the stream's notification, so a
// response — whole or SSE — is written as the engine produces it. A
// stream's unsent bytes are bounded (server.http_stream_buffer_bytes): a
// client that stops reading has its request CANCELLED (blocks freed) and
// its connection closed. A client that disconnects cancels its request too.
//
// A handler uses the engine only while it holds a lease on the daemon's
// engine gate (ServingState::gate, server/admission/engine_gate.h, shared with gRPC):
// once the gate is closed, /metrics leaves out the engine's numbers and
// generation and tokenization answer 503.
//
// Thread-safety: Start/Stop from one thread; handlers run on the io threads
// and the worker pool.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "scheduler/request_validation.h"
#include "server/admission/auth.h"
#include "server/admission/client_limiter.h"
#include "server/admission/request_budget.h"
#include "server/http/http_server.h"
#include "server/serving_state.h"

namespace kvserve {

class HttpService {
 public:
  struct Options {
    std::string host = "127.0.0.1";
    int port = 0;  // 0: any free port
    int64_t max_body_bytes = 8 << 20;
    // io threads, and as many workers that parse and tokenize bodies when
    // prompt_workers is null.
    int threads = 4;
    // The prompt workers (server/admission/request_budget.h), shared with gRPC in the
    // daemon; null: a pool of `threads` of its own.
    std::shared_ptr<PromptWorkers> prompt_workers;
    // SO_REUSEPORT: let other processes bind the same port (off: a port in
    // use fails Start).
    bool reuse_port = false;
    absl::Duration header_timeout = absl::Seconds(10);
    absl::Duration body_timeout = absl::Seconds(30);
    absl::Duration idle_timeout = absl::Seconds(60);
    absl::Duration write_timeout = absl::Seconds(30);
    int max_connections = 4096;
    int64_t stream_buffer_bytes = 1 << 20;
    std::string tls_cert_file;  // both set: HTTPS
    std::string tls_key_file;
    // Null: the state's server.api_key alone.
    std::shared_ptr<const ApiKeys> api_keys;
    // With keys, GET /metrics needs one too (server.metrics_auth).
    bool metrics_auth = false;
    // The request cost budget (the config's limits section; limits left 0
    // are derived from the served model's max_model_len).
    RequestLimits limits = kDefaultRequestLimits;
    // Generation calls open at once per client (its API key, or its peer
    // address without auth); shared with gRPC so both count together.
    // Null: no limit.
    std::shared_ptr<ClientLimiter> limiter;
  };

  HttpService(ServingState* state, Options options);
  ~HttpService();
  HttpService(const HttpService&) = delete;
  HttpService& operator=(const HttpService&) = delete;

  // Binds and starts serving on background threads.
  absl::Status Start();
  // The bound port (after Start).
  int port() const { return port_; }
  // Open connections.
  int connections() const { return server_->connections(); }
  // Closes the listener and every connection, cancelling what they run,
  // and joins the threads.
  void Stop();

 private:
  struct GenerateCall;

  std::optional<HttpResponse> Authorize(const HttpRequest& head) const;
  void Handle(std::shared_ptr<HttpExchange> exchange);
  void HandleGenerate(bool chat, std::shared_ptr<HttpExchange> exchange);
  // POST /tokenize and /detokenize (server/openai/tokenize.h).
  void HandleTokenize(bool detokenize, std::shared_ptr<HttpExchange> exchange);
  // The body of HandleGenerate on a worker thread; may throw (caught there).
  void GenerateOnWorker(bool chat, const std::shared_ptr<HttpExchange>& exchange);
  HttpResponse Health() const;
  HttpResponse Metrics() const;
  HttpResponse Models() const;

  ServingState* const state_;
  const Options options_;
  const int64_t created_;  // unix seconds, reported as the model's `created`
  std::shared_ptr<const ApiKeys> keys_;
  std::unique_ptr<HttpServer> server_;
  std::unique_ptr<PromptClient> workers_;
  int port_ = 0;
};

}  // namespace kvserve

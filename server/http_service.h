// HttpService: the OpenAI-compatible HTTP front end (cpp-httplib).
//
//   POST /v1/completions, POST /v1/chat/completions   plain JSON or SSE (`stream: true`)
//   GET  /v1/models                                   the one served model
//   GET  /health                                      200 ready; 503 loading or draining
//   GET  /metrics                                     Prometheus text format
//
// Errors are OpenAI error objects: 400 for bad bodies (naming the field),
// 401 without the configured bearer key, 404 for another model or path, 413
// over server.max_body_bytes, 429 when the engine queue is full, 503 while
// loading or draining, 500 when generation fails.
//
// A streaming response holds one httplib worker thread while it runs (the
// library is thread-per-connection); it wakes on engine output and cancels
// the request as soon as a write to the client fails.
//
// Thread-safety: Start/Stop from one thread; handlers run on httplib's pool.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <thread>

#include "absl/status/status.h"
#include "server/serving_state.h"

namespace httplib {
class Server;
struct Request;
struct Response;
}  // namespace httplib

namespace kvserve {

class HttpService {
 public:
  struct Options {
    std::string host = "127.0.0.1";
    int port = 0;  // 0: any free port
    int64_t max_body_bytes = 8 << 20;
    int threads = 64;
    // SO_REUSEPORT: let other processes bind the same port (off: a port in
    // use fails Start).
    bool reuse_port = false;
  };

  HttpService(ServingState* state, Options options);
  ~HttpService();
  HttpService(const HttpService&) = delete;
  HttpService& operator=(const HttpService&) = delete;

  // Binds and starts serving on a background thread.
  absl::Status Start();
  // The bound port (after Start).
  int port() const { return port_; }
  // Closes the listener, ends open connections and joins the threads.
  void Stop();

 private:
  void Register();
  void HandleGenerate(bool chat, const httplib::Request& req, httplib::Response& res);
  void HandleModels(httplib::Response& res);
  void HandleHealth(httplib::Response& res);
  void HandleMetrics(httplib::Response& res);

  ServingState* const state_;
  const Options options_;
  const int64_t created_;  // unix seconds, reported as the model's `created`
  std::unique_ptr<httplib::Server> server_;
  std::thread thread_;
  int port_ = 0;
  int listen_fd_ = -1;
};

}  // namespace kvserve

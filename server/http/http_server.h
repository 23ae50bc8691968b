// HttpServer: the event-driven HTTP/1.1 connection layer (Boost.Beast over
// Boost.Asio, optionally TLS through OpenSSL) under the OpenAI front end.
//
// A connection costs no thread: a fixed pool of io threads runs every
// socket's reads, writes and timers; a handler answers an exchange whenever
// its result is ready, from any thread, through HttpExchange. Per connection:
//
//   accept --(TLS handshake)--> header --> body --> handler --> response
//                                  ^                                 |
//                                  +------ idle (keep-alive) <-------+
//
// Limits, each answered with an OpenAI-style JSON error naming the problem:
//  - connections beyond max_connections: 503, then close;
//  - a request head not complete within header_timeout of its first byte
//    (of the accept for a new connection): 408, close; a body not complete
//    within body_timeout of its head: 408, close (over TLS too); no new request within
//    idle_timeout of the last response: closed quietly;
//  - a response write that makes no progress for write_timeout: closed;
//  - heads over 64 KiB: 431.
// Framing is strict (RFC 9112 6): Content-Length together with
// Transfer-Encoding, two different Content-Lengths, or chunked applied twice:
// 400 and close; a transfer coding other than chunked (gzip, ...): 501 and
// close; bodies over max_body_bytes, whatever their framing (the declared
// length, or chunks as they arrive): 413 and close. `authorize` runs on the
// head, before any body byte is read (401 and close, the body unread).
// After a refusal the connection half-closes and discards what the client
// still sends for a moment, so the client reads the answer instead of a
// reset; nothing of a refused body is kept.
//
// Keep-alive has no request limit. Pipelined requests are answered in order:
// the next request is parsed once the previous response is written. While a
// handler runs, the connection keeps one read open to notice a client that
// leaves (end of stream or reset: the exchange ends early, which cancels a
// generation); once bytes of a next request arrive it stops reading until
// the response is done.
//
// Backpressure: a response's unsent bytes (queued plus being written) are
// bounded by max_unsent_bytes. A stream whose client stops reading fills it;
// the exchange then ends (the handler's attached state is released, which
// for a generation CANCELS the request and frees its KV blocks) and the
// connection closes. Streams are never paused: the engine runs one batch for
// everyone, so a paused request would hold its blocks for the slowest reader.
//
// Thread-safety: Start/Stop from one thread. HttpExchange::Post from any
// thread; every other HttpExchange method only on the exchange's strand
// (inside the handler call, or a function given to Post).
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"

namespace kvserve {

struct HttpRequest {
  std::string method;  // "GET", "POST", ...
  std::string target;  // as sent
  std::string path;    // target without the query
  int version = 11;    // 10 or 11
  std::vector<std::pair<std::string, std::string>> headers;
  std::string body;  // empty while `authorize` looks at the head
  std::string peer;  // "address:port"

  // The first header of that name (case-insensitive); "" when absent.
  std::string_view Header(std::string_view name) const;
};

struct HttpResponse {
  int status = 200;
  std::string content_type = "application/json";
  std::vector<std::pair<std::string, std::string>> headers;
  std::string body;  // ignored by StartStream
};

// One request and its response. Ends when the response is complete, the
// client leaves, the unsent bytes overflow, or the server stops; the state
// attached to it is released then (once, on whatever thread drops it last).
class HttpExchange {
 public:
  virtual ~HttpExchange() = default;
  virtual const HttpRequest& request() const = 0;

  // Runs `fn` on the exchange's strand, unless the exchange has ended by
  // then (then `fn` is destroyed without running). Any thread.
  virtual void Post(std::function<void()> fn) = 0;
  // Keeps `state` until the exchange ends.
  virtual void Attach(std::shared_ptr<void> state) = 0;
  virtual bool ended() const = 0;

  // A whole response (Content-Length); ends the exchange.
  virtual void Respond(HttpResponse response) = 0;
  // A chunked response: the head now, then Write()s, then EndStream().
  virtual void StartStream(HttpResponse head) = 0;
  virtual void Write(std::string_view data) = 0;
  virtual void EndStream() = 0;
};

class HttpServer {
 public:
  struct Options {
    std::string host = "127.0.0.1";
    int port = 0;  // 0: any free port
    // SO_REUSEPORT: let other processes bind the same port (off: a port in
    // use fails Start).
    bool reuse_port = false;
    int io_threads = 4;
    absl::Duration header_timeout = absl::Seconds(10);
    absl::Duration body_timeout = absl::Seconds(30);
    absl::Duration idle_timeout = absl::Seconds(60);
    absl::Duration write_timeout = absl::Seconds(30);
    int max_connections = 4096;
    int64_t max_body_bytes = 8 << 20;
    int64_t max_unsent_bytes = 1 << 20;  // per response
    // Both set: HTTPS only (PEM files).
    std::string tls_cert_file;
    std::string tls_key_file;
  };
  // Called on the head, before the body is read: a response refuses the
  // request (the connection then closes unless there is no body).
  using Authorize = std::function<std::optional<HttpResponse>(const HttpRequest& head)>;
  // Called on the connection's strand with the whole request; must not block.
  using Handler = std::function<void(std::shared_ptr<HttpExchange>)>;
  // Every response status sent, the server's own refusals included.
  using Observer = std::function<void(int status)>;

  HttpServer(Options options, Authorize authorize, Handler handler, Observer observer);
  ~HttpServer();
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  // Binds, listens and starts the io threads. Errors name server.http_port
  // (or server.tls.* for unusable certificate files).
  absl::Status Start();
  int port() const { return port_; }
  // Open connections (the ones being refused over the cap not counted).
  int connections() const;
  // Closes the listener and every connection (ending their exchanges) and
  // joins the io threads.
  void Stop();

  struct Core;  // shared with connections, which may outlive the server

 private:
  const Options options_;
  std::shared_ptr<Core> core_;
  int port_ = 0;
};

// "Bad Request" for 400, ... ("Unknown" for codes Beast does not name).
std::string_view HttpReason(int status);

}  // namespace kvserve

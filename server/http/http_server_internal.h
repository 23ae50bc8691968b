// Internal to HttpServer's sources (server/http/http_server.h):
//   http_server.cc      the listener: TLS setup, bind and listen, the accept
//                       loop and its connection cap, Start and Stop;
//   http_connection.cc  one connection's state machine (a template over the
//                       plain and the TLS stream): reading the head and the
//                       body under their deadlines, the handler's exchange,
//                       writing, lingering after a refusal, closing;
//   http_message.cc     the message pieces (server/http/http_message.h).
// What the listener and the connections share: the server's Core and the
// interface through which Stop reaches every open connection. Only those
// files include this header. Thread-safety: Core's guarded members under
// their mutexes; the rest is the io threads' (see HttpServer).
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

// After <utility>: Boost 1.74's asio/awaitable.hpp uses std::exchange without
// including it.
#include <boost/asio.hpp>
#include <boost/asio/ssl.hpp>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "server/http/http_server.h"

namespace kvserve {

namespace http_internal {

class ExchangeImpl;

// What an exchange needs of its connection (whatever its stream type).
class ConnectionBase {
 public:
  virtual ~ConnectionBase() = default;
  virtual void PostFor(std::shared_ptr<ExchangeImpl> ex, std::function<void()> fn) = 0;
  virtual void Respond(ExchangeImpl* ex, HttpResponse r) = 0;
  virtual void StartStream(ExchangeImpl* ex, HttpResponse head) = 0;
  virtual void Write(ExchangeImpl* ex, std::string_view data) = 0;
  virtual void EndStream(ExchangeImpl* ex) = 0;
  // Server stop: ends the exchange and closes the socket (posted to the strand).
  virtual void Shutdown() = 0;
};

}  // namespace http_internal

struct HttpServer::Core {
  Core(Options o, Authorize a, Handler h, Observer obs)
      : options(std::move(o)),
        authorize(std::move(a)),
        handler(std::move(h)),
        observer(std::move(obs)),
        acceptor(boost::asio::make_strand(ioc)),
        accept_retry(acceptor.get_executor()) {}

  const Options options;
  const Authorize authorize;
  const Handler handler;
  const Observer observer;
  boost::asio::io_context ioc;
  std::optional<boost::asio::executor_work_guard<boost::asio::io_context::executor_type>> work;
  boost::asio::ip::tcp::acceptor acceptor;
  boost::asio::steady_timer accept_retry;
  std::unique_ptr<boost::asio::ssl::context> tls;
  std::vector<std::thread> threads;

  // Posting from outside the io threads stops with Stop().
  absl::Mutex mu;
  bool stopped ABSL_GUARDED_BY(mu) = false;
  // Live connections, for Stop().
  absl::Mutex conns_mu;
  uint64_t next_id ABSL_GUARDED_BY(conns_mu) = 0;
  absl::flat_hash_map<uint64_t, std::weak_ptr<http_internal::ConnectionBase>> conns
      ABSL_GUARDED_BY(conns_mu);
  std::atomic<int> connections{0};
  std::atomic<int> refusing{0};
};

namespace http_internal {

// Starts a connection on an accepted socket (over TLS when the server has a
// TLS context). `refuse`: the connection is over server.max_connections and
// is answered 503, then closed.
void StartConnection(std::shared_ptr<HttpServer::Core> core, boost::asio::ip::tcp::socket socket,
                     bool refuse);

}  // namespace http_internal

}  // namespace kvserve

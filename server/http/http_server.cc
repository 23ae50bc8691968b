// HttpServer: the listener (the TLS context, bind and listen, the accept
// loop and its connection cap), Start and Stop
// (server/http/http_server_internal.h).

#include "server/http/http_server.h"

#include <sys/socket.h>

#include <algorithm>
#include <boost/asio.hpp>
#include <boost/asio/ssl.hpp>
#include <boost/beast/core.hpp>
#include <chrono>
#include <future>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "server/http/http_server_internal.h"
#include "server/observability/logging.h"

namespace kvserve {

namespace asio = boost::asio;
namespace beast = boost::beast;
using tcp = asio::ip::tcp;

namespace {

// Connections over the cap still get their 503; beyond this many at once
// they are closed without one.
constexpr int kMaxRefusing = 1024;
constexpr auto kAcceptRetry = std::chrono::milliseconds(50);

void Accept(std::shared_ptr<HttpServer::Core> core) {
  HttpServer::Core* c = core.get();
  c->acceptor.async_accept(asio::make_strand(c->ioc), [core = std::move(core)](beast::error_code ec,
                                                                               tcp::socket socket) {
    if (!core->acceptor.is_open()) return;
    if (ec) {
      // Out of descriptors (or a transient error): try again shortly
      // rather than spin.
      spdlog::warn("http: accept failed: {}", ec.message());
      core->accept_retry.expires_after(kAcceptRetry);
      core->accept_retry.async_wait([core](beast::error_code e) {
        if (!e) Accept(core);
      });
      return;
    }
    const bool refuse = core->connections.load() >= core->options.max_connections;
    if (refuse && core->refusing.load() >= kMaxRefusing) {
      beast::error_code ignored;
      socket.close(ignored);
    } else {
      http_internal::StartConnection(core, std::move(socket), refuse);
    }
    Accept(core);
  });
}

}  // namespace

HttpServer::HttpServer(Options options, Authorize authorize, Handler handler, Observer observer)
    : options_(options),
      core_(std::make_shared<Core>(std::move(options), std::move(authorize), std::move(handler),
                                   std::move(observer))) {}

HttpServer::~HttpServer() { Stop(); }

int HttpServer::connections() const { return core_->connections.load(); }

absl::Status HttpServer::Start() {
  Core& c = *core_;
  if (options_.tls_cert_file.empty() != options_.tls_key_file.empty()) {
    return absl::InvalidArgumentError(
        "server.tls.cert_file and server.tls.key_file: set both (HTTPS) or neither");
  }
  if (!options_.tls_cert_file.empty()) {
    c.tls = std::make_unique<asio::ssl::context>(asio::ssl::context::tls_server);
    c.tls->set_options(asio::ssl::context::default_workarounds | asio::ssl::context::no_sslv2 |
                       asio::ssl::context::no_sslv3 | asio::ssl::context::no_tlsv1 |
                       asio::ssl::context::no_tlsv1_1 | asio::ssl::context::single_dh_use);
    // TLS 1.2 suites of Mozilla's "intermediate" profile less its DHE ones:
    // ECDHE (forward secret) with AES-GCM or ChaCha20-Poly1305 only; no CBC,
    // no SHA-1 MAC, no static RSA. TLS 1.3 has only such suites already.
    static constexpr char kTls12Ciphers[] =
        "ECDHE-ECDSA-AES128-GCM-SHA256:ECDHE-RSA-AES128-GCM-SHA256:"
        "ECDHE-ECDSA-AES256-GCM-SHA384:ECDHE-RSA-AES256-GCM-SHA384:"
        "ECDHE-ECDSA-CHACHA20-POLY1305:ECDHE-RSA-CHACHA20-POLY1305";
    if (SSL_CTX_set_cipher_list(c.tls->native_handle(), kTls12Ciphers) != 1) {
      return absl::InternalError("HTTPS: the TLS 1.2 cipher suites are not available");
    }
    beast::error_code ec;
    c.tls->use_certificate_chain_file(options_.tls_cert_file, ec);
    if (ec) {
      return absl::InvalidArgumentError(absl::StrCat("server.tls.cert_file: cannot use '",
                                                     options_.tls_cert_file, "': ", ec.message()));
    }
    c.tls->use_private_key_file(options_.tls_key_file, asio::ssl::context::pem, ec);
    if (ec) {
      return absl::InvalidArgumentError(absl::StrCat("server.tls.key_file: cannot use '",
                                                     options_.tls_key_file, "': ", ec.message()));
    }
  }

  const std::string where = absl::StrCat("server.http_port: cannot listen on ", options_.host, ":",
                                         options_.port, " (in use, or a bad host?)");
  beast::error_code ec;
  tcp::endpoint endpoint;
  asio::ip::address address = asio::ip::make_address(options_.host, ec);
  if (!ec) {
    endpoint = tcp::endpoint(address, static_cast<uint16_t>(options_.port));
  } else {
    tcp::resolver resolver(c.ioc);
    auto results = resolver.resolve(options_.host, std::to_string(options_.port), ec);
    if (ec || results.empty()) return absl::UnavailableError(where);
    endpoint = results.begin()->endpoint();
  }
  c.acceptor.open(endpoint.protocol(), ec);
  if (ec) return absl::UnavailableError(where);
  c.acceptor.set_option(asio::socket_base::reuse_address(true), ec);
  if (options_.reuse_port) {
    int yes = 1;
    ::setsockopt(c.acceptor.native_handle(), SOL_SOCKET, SO_REUSEPORT, &yes, sizeof(yes));
  }
  c.acceptor.bind(endpoint, ec);
  if (ec) return absl::UnavailableError(where);
  c.acceptor.listen(asio::socket_base::max_listen_connections, ec);
  if (ec) return absl::UnavailableError(where);
  port_ = c.acceptor.local_endpoint().port();

  c.work.emplace(c.ioc.get_executor());
  Accept(core_);
  const int threads = std::max(1, options_.io_threads);
  for (int i = 0; i < threads; ++i) {
    c.threads.emplace_back([core = core_.get()] { core->ioc.run(); });
  }
  return absl::OkStatus();
}

void HttpServer::Stop() {
  Core& c = *core_;
  if (c.threads.empty()) return;
  {
    absl::MutexLock lock(&c.mu);
    c.stopped = true;
  }
  // Close the listener first (on its strand) so no connection starts after
  // the ones below are told to close.
  std::promise<void> closed;
  asio::post(c.acceptor.get_executor(), [core = core_, &closed] {
    beast::error_code ec;
    core->acceptor.close(ec);
    core->accept_retry.cancel();
    closed.set_value();
  });
  closed.get_future().wait();
  std::vector<std::shared_ptr<http_internal::ConnectionBase>> open;
  {
    absl::MutexLock lock(&c.conns_mu);
    for (auto& [id, weak] : c.conns) {
      if (auto conn = weak.lock()) open.push_back(std::move(conn));
    }
  }
  for (auto& conn : open) conn->Shutdown();
  open.clear();
  c.work.reset();
  for (std::thread& t : c.threads) t.join();
  c.threads.clear();
}

}  // namespace kvserve

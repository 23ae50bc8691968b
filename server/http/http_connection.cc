// HttpServer: one connection's state machine, from the accept (and the TLS
// handshake) to the close (server/http/http_server_internal.h).

#include <algorithm>
#include <chrono>
#include <functional>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>

// After <utility>: Boost 1.74's asio/awaitable.hpp uses std::exchange without
// including it.
#include <boost/asio.hpp>
#include <boost/asio/ssl.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "server/http/http_message.h"
#include "server/http/http_server_internal.h"
#include "server/observability/logging.h"

namespace kvserve {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = asio::ip::tcp;
using Clock = std::chrono::steady_clock;

namespace http_internal {
namespace {

constexpr uint32_t kHeaderLimit = 64 * 1024;
// After a refusal, how long the client's remaining bytes are read and
// dropped before the socket closes (so it reads our answer, not a reset).
constexpr auto kLinger = std::chrono::seconds(2);
// ... and at most this much of it (a client pushing a refused body at full
// speed must not keep an io thread busy).
constexpr size_t kLingerBytes = 64 << 20;

Clock::duration ToClock(absl::Duration d) { return absl::ToChronoNanoseconds(d); }

std::string SecondsText(absl::Duration d) {
  return absl::StrFormat("%g s", absl::ToDoubleSeconds(d));
}

}  // namespace

class ExchangeImpl final : public HttpExchange, public std::enable_shared_from_this<ExchangeImpl> {
 public:
  ExchangeImpl(std::weak_ptr<ConnectionBase> conn, HttpRequest request)
      : conn_(std::move(conn)), request_(std::move(request)) {}

  const HttpRequest& request() const override { return request_; }
  void Post(std::function<void()> fn) override {
    if (std::shared_ptr<ConnectionBase> c = conn_.lock())
      c->PostFor(shared_from_this(), std::move(fn));
  }
  void Attach(std::shared_ptr<void> state) override {
    if (!ended_) state_ = std::move(state);
  }
  bool ended() const override { return ended_; }
  void Respond(HttpResponse r) override {
    if (auto c = conn_.lock(); c && !ended_) c->Respond(this, std::move(r));
  }
  void StartStream(HttpResponse head) override {
    if (auto c = conn_.lock(); c && !ended_) c->StartStream(this, std::move(head));
  }
  void Write(std::string_view data) override {
    if (auto c = conn_.lock(); c && !ended_) c->Write(this, data);
  }
  void EndStream() override {
    if (auto c = conn_.lock(); c && !ended_) c->EndStream(this);
  }

  // On the strand: marks the end and releases the attached state.
  void End() {
    ended_ = true;
    std::shared_ptr<void> state = std::move(state_);
    state.reset();
  }

 private:
  std::weak_ptr<ConnectionBase> conn_;
  HttpRequest request_;
  std::shared_ptr<void> state_;
  bool ended_ = false;
};

namespace {

template <class Stream>
class Connection final : public ConnectionBase,
                         public std::enable_shared_from_this<Connection<Stream>> {
 public:
  static constexpr bool kTls = !std::is_same_v<Stream, tcp::socket>;

  Connection(std::shared_ptr<HttpServer::Core> core, tcp::socket socket, bool refuse)
      : core_(std::move(core)),
        stream_(MakeStream(*core_, std::move(socket))),
        timer_(Socket().get_executor()),
        refuse_(refuse) {
    (refuse_ ? core_->refusing : core_->connections).fetch_add(1);
  }

  ~Connection() override {
    if (exchange_) exchange_->End();
    (refuse_ ? core_->refusing : core_->connections).fetch_sub(1);
    if (id_ != 0) {
      absl::MutexLock lock(&core_->conns_mu);
      core_->conns.erase(id_);
    }
  }

  void Start() {
    {
      absl::MutexLock lock(&core_->conns_mu);
      id_ = ++core_->next_id;
      core_->conns[id_] = this->shared_from_this();
    }
    beast::error_code ec;
    Socket().set_option(tcp::no_delay(true), ec);
    if (auto ep = Socket().remote_endpoint(ec); !ec) {
      peer_ = absl::StrCat(ep.address().to_string(), ":", ep.port());
    }
    if constexpr (kTls) {
      phase_ = Phase::kHandshake;
      SetReadDeadline(core_->options.header_timeout);
      stream_.async_handshake(asio::ssl::stream_base::server,
                              [self = this->shared_from_this()](beast::error_code ec) {
                                self->read_deadline_ = Clock::time_point::max();
                                if (ec) return self->CloseNow();
                                self->AfterHandshake();
                              });
    } else {
      AfterHandshake();
    }
  }

  void PostFor(std::shared_ptr<ExchangeImpl> ex, std::function<void()> fn) override {
    absl::ReaderMutexLock lock(&core_->mu);
    if (core_->stopped) return;
    asio::post(Socket().get_executor(),
               [self = this->shared_from_this(), ex = std::move(ex), fn = std::move(fn)] {
                 if (!ex->ended()) fn();
               });
  }

  void Respond(ExchangeImpl* ex, HttpResponse r) override {
    if (ex != exchange_.get()) return;
    Observe(r.status);
    std::string out = Head(r, keep_alive_, version_, r.body.size(), /*chunked=*/false);
    out += r.body;
    EndExchange();
    response_complete_ = true;
    Enqueue(std::move(out));
  }

  void StartStream(ExchangeImpl* ex, HttpResponse head) override {
    if (ex != exchange_.get() || streaming_) return;
    Observe(head.status);
    streaming_ = true;
    // HTTP/1.0 has no chunked coding: the body ends with the connection.
    chunked_ = version_ != 10;
    if (!chunked_) keep_alive_ = false;
    Enqueue(Head(head, keep_alive_, version_, std::nullopt, chunked_));
  }

  void Write(ExchangeImpl* ex, std::string_view data) override {
    if (ex != exchange_.get() || !streaming_ || data.empty()) return;
    if (chunked_) {
      std::string chunk = absl::StrCat(absl::Hex(data.size()), "\r\n");
      chunk.append(data);
      chunk += "\r\n";
      Enqueue(std::move(chunk));
    } else {
      Enqueue(std::string(data));
    }
    const int64_t unsent = static_cast<int64_t>(pending_.size() + inflight_.size() - written_);
    if (unsent > core_->options.max_unsent_bytes && exchange_ != nullptr) {
      spdlog::warn(
          "http {} {} from {}: the client is not reading ({} bytes unsent, over "
          "server.http_stream_buffer_bytes = {}); ending the response",
          exchange_->request().method, exchange_->request().path, peer_, unsent,
          core_->options.max_unsent_bytes);
      CloseNow();
    }
  }

  void EndStream(ExchangeImpl* ex) override {
    if (ex != exchange_.get() || !streaming_) return;
    EndExchange();
    response_complete_ = true;
    if (chunked_) {
      Enqueue("0\r\n\r\n");
    } else {
      keep_alive_ = false;
      if (!writing_) OnDrained();
    }
  }

  void Shutdown() override {
    asio::post(Socket().get_executor(), [self = this->shared_from_this()] { self->CloseNow(); });
  }

 private:
  enum class Phase { kHandshake, kIdle, kHeader, kBody, kHandling, kLinger, kClosed };

  static Stream MakeStream(HttpServer::Core& core, tcp::socket socket) {
    if constexpr (kTls) {
      return Stream(std::move(socket), *core.tls);
    } else {
      return socket;
    }
  }

  tcp::socket& Socket() {
    if constexpr (kTls) {
      return stream_.next_layer();
    } else {
      return stream_;
    }
  }

  void AfterHandshake() {
    if (refuse_) {
      keep_alive_ = false;
      close_after_ = true;
      response_complete_ = true;
      HttpResponse r =
          ErrorResponse(503,
                        absl::StrCat("too many open connections (server.max_connections = ",
                                     core_->options.max_connections, "); retry later"),
                        "too_many_connections", "service_unavailable");
      Observe(r.status);
      std::string out = Head(r, false, 11, r.body.size(), false) + r.body;
      Enqueue(std::move(out));
      return;
    }
    ReadRequest(/*first=*/true);
  }

  // ---- reading -------------------------------------------------------------

  void ReadRequest(bool first) {
    parser_.emplace();
    parser_->header_limit(kHeaderLimit);
    // The limit waits until the head has been checked (authorization first).
    // (Not boost::none: Beast 1.74 compares a length with an empty optional
    // as "over the limit".)
    parser_->body_limit(std::numeric_limits<uint64_t>::max());
    if (first || buffer_.size() > 0) {
      ReadHeader();
    } else {
      phase_ = Phase::kIdle;
      SetReadDeadline(core_->options.idle_timeout);
      if (!reading_) StartRead();
    }
  }

  // One read into the buffer: the first byte of the next request (idle),
  // a client leaving while its request runs (handling), or what a refused
  // client still sends (linger).
  void StartRead() {
    reading_ = true;
    stream_.async_read_some(
        buffer_.prepare(16 * 1024),
        [self = this->shared_from_this()](beast::error_code ec, size_t n) { self->OnRead(ec, n); });
  }

  void OnRead(beast::error_code ec, size_t n) {
    reading_ = false;
    if (phase_ == Phase::kClosed) return;
    if (ec) {
      if (phase_ == Phase::kHandling && exchange_) {
        spdlog::debug("http {} {} from {}: the client left before the response ended",
                      exchange_->request().method, exchange_->request().path, peer_);
      }
      return CloseNow();
    }
    buffer_.commit(n);
    switch (phase_) {
      case Phase::kIdle:
        return ReadHeader();
      case Phase::kHandling:
        // Keep watching only while nothing of a next request has arrived.
        if (buffer_.size() == 0) StartRead();
        return;
      case Phase::kLinger:
        lingered_ += buffer_.size();
        buffer_.consume(buffer_.size());
        if (lingered_ > kLingerBytes) return CloseNow();
        return StartRead();
      default:
        return;
    }
  }

  void ReadHeader() { ReadUnderDeadline(Phase::kHeader); }

  // Reads the head (kHeader) or the rest of the body (kBody) under its
  // deadline. A deadline that fires cancels the read (OnTimer), and the
  // completion answers 408 naming the setting, over TLS as over plain TCP.
  void ReadUnderDeadline(Phase phase) {
    phase_ = phase;
    const bool head = phase == Phase::kHeader;
    SetReadDeadline(head ? core_->options.header_timeout : core_->options.body_timeout);
    reading_ = true;
    auto done = [self = this->shared_from_this()](beast::error_code ec, size_t) {
      self->OnReadUnderDeadline(ec);
    };
    if (head) {
      http::async_read_header(stream_, buffer_, *parser_, std::move(done));
    } else {
      http::async_read(stream_, buffer_, *parser_, std::move(done));
    }
  }

  void OnReadUnderDeadline(beast::error_code ec) {
    reading_ = false;
    if (phase_ == Phase::kClosed) return;
    ClearReadDeadline();
    const bool head = phase_ == Phase::kHeader;
    if (timed_out_) {
      return Refuse(ErrorResponse(
          408,
          absl::StrCat(
              "the request ", head ? "head" : "body", " did not arrive within server.http_",
              head ? "header" : "body", "_timeout_s (",
              SecondsText(head ? core_->options.header_timeout : core_->options.body_timeout), ")"),
          "request_timeout"));
    }
    if (head) {
      OnHeader(ec);
    } else {
      OnBody(ec);
    }
  }

  void OnHeader(beast::error_code ec) {
    if (ec) {
      const auto& fields = parser_->get();
      if (ec == http::error::header_limit) {
        return Refuse(ErrorResponse(
            431, absl::StrCat("the request head is larger than ", kHeaderLimit, " bytes"),
            "headers_too_large"));
      }
      if (ec == http::error::bad_content_length || ec == http::error::bad_transfer_encoding) {
        const bool has_cl = fields.count(http::field::content_length) > 0;
        const bool has_te = fields.count(http::field::transfer_encoding) > 0;
        if (has_cl && has_te == false && ec == http::error::bad_content_length) {
          return Refuse(ErrorResponse(400,
                                      "ambiguous framing: the request has two different "
                                      "Content-Length values",
                                      "bad_content_length"));
        }
        if ((ec == http::error::bad_content_length && has_te) ||
            (ec == http::error::bad_transfer_encoding && has_cl)) {
          return Refuse(ErrorResponse(400,
                                      "ambiguous framing: the request has both Content-Length "
                                      "and Transfer-Encoding",
                                      "ambiguous_framing"));
        }
        if (ec == http::error::bad_transfer_encoding) {
          return Refuse(ErrorResponse(400, "Transfer-Encoding: chunked is applied more than once",
                                      "bad_transfer_encoding"));
        }
        return Refuse(
            ErrorResponse(400, "Content-Length is not a valid length (or lists different values)",
                          "bad_content_length"));
      }
      // The client closed between requests, or vanished.
      if (ec == http::error::end_of_stream || ec == asio::error::eof ||
          ec == asio::error::connection_reset || ec == asio::error::operation_aborted ||
          ec == asio::ssl::error::stream_truncated) {
        return CloseNow();
      }
      return Refuse(ErrorResponse(400, absl::StrCat("malformed HTTP request: ", ec.message()),
                                  "malformed_request"));
    }
    if (std::optional<HttpResponse> bad = CheckTransferEncoding(*parser_)) return Refuse(*bad);

    const auto& h = parser_->get();
    version_ = h.version();
    request_ = HttpRequest();
    request_.method = std::string(h.method_string());
    request_.target = std::string(h.target());
    request_.path = request_.target.substr(0, request_.target.find('?'));
    request_.version = version_;
    request_.peer = peer_;
    for (const auto& f : h) request_.headers.emplace_back(f.name_string(), f.value());

    const bool has_body = !parser_->is_done();
    if (core_->authorize) {
      if (std::optional<HttpResponse> refused = core_->authorize(request_)) {
        if (has_body) return Refuse(*std::move(refused));
        keep_alive_ = parser_->keep_alive();
        return RespondDirect(*std::move(refused));
      }
    }
    if (auto cl = parser_->content_length();
        cl && *cl > static_cast<uint64_t>(core_->options.max_body_bytes)) {
      return Refuse(TooLarge());
    }
    if (!has_body) return Dispatch();
    if (IEquals(request_.Header("Expect"), "100-continue") && version_ == 11) {
      Enqueue("HTTP/1.1 100 Continue\r\n\r\n");
    }
    parser_->body_limit(static_cast<uint64_t>(core_->options.max_body_bytes));
    ReadUnderDeadline(Phase::kBody);
  }

  void OnBody(beast::error_code ec) {
    if (ec == http::error::body_limit) return Refuse(TooLarge());
    if (ec == http::error::end_of_stream || ec == asio::error::eof ||
        ec == http::error::partial_message || ec == asio::error::connection_reset ||
        ec == asio::error::operation_aborted || ec == asio::ssl::error::stream_truncated) {
      return CloseNow();
    }
    if (ec) {
      return Refuse(ErrorResponse(400, absl::StrCat("malformed request body: ", ec.message()),
                                  "malformed_request"));
    }
    request_.body = std::move(parser_->get().body());
    Dispatch();
  }

  HttpResponse TooLarge() const {
    return ErrorResponse(413,
                         absl::StrCat("the request body is larger than server.max_body_bytes (",
                                      core_->options.max_body_bytes, " bytes)"),
                         "payload_too_large");
  }

  void Dispatch() {
    phase_ = Phase::kHandling;
    keep_alive_ = parser_->keep_alive();
    streaming_ = false;
    chunked_ = false;
    exchange_ = std::make_shared<ExchangeImpl>(this->weak_from_this(), std::move(request_));
    self_ = this->shared_from_this();
    if (!reading_ && buffer_.size() == 0) StartRead();
    std::shared_ptr<ExchangeImpl> ex = exchange_;
    core_->handler(ex);
  }

  // ---- writing -------------------------------------------------------------

  void Observe(int status) {
    if (core_->observer) core_->observer(status);
    if (exchange_) {
      spdlog::debug("http {} {} -> {}", exchange_->request().method, exchange_->request().path,
                    status);
    }
  }

  // A response decided before the request reached a handler.
  void RespondDirect(HttpResponse r) {
    Observe(r.status);
    phase_ = Phase::kHandling;
    response_complete_ = true;
    Enqueue(Head(r, keep_alive_, version_, r.body.size(), false) + r.body);
  }

  // Answers and closes without reading what is left of the request.
  void Refuse(HttpResponse r) {
    spdlog::debug("http refused a request from {}: {} {}", peer_, r.status, r.body);
    keep_alive_ = false;
    close_after_ = true;
    RespondDirect(std::move(r));
  }

  void EndExchange() {
    if (!exchange_) return;
    std::shared_ptr<ExchangeImpl> ex = std::move(exchange_);
    ex->End();
    self_.reset();
  }

  void Enqueue(std::string bytes) {
    if (phase_ == Phase::kClosed) return;
    pending_ += bytes;
    if (!writing_) Flush();
  }

  // Writes piece by piece so the write deadline measures progress, not the
  // time a whole (possibly large) response takes.
  void Flush() {
    if (written_ == inflight_.size()) {
      inflight_.swap(pending_);
      pending_.clear();
      written_ = 0;
    }
    writing_ = true;
    write_deadline_ = Clock::now() + ToClock(core_->options.write_timeout);
    ArmTimer();
    stream_.async_write_some(asio::buffer(inflight_.data() + written_, inflight_.size() - written_),
                             [self = this->shared_from_this()](beast::error_code ec, size_t n) {
                               self->OnWrite(ec, n);
                             });
  }

  void OnWrite(beast::error_code ec, size_t n) {
    writing_ = false;
    if (phase_ == Phase::kClosed) return;
    if (ec) return CloseNow();
    written_ += n;
    if (written_ < inflight_.size() || !pending_.empty()) return Flush();
    inflight_.clear();
    written_ = 0;
    write_deadline_ = Clock::time_point::max();
    if (response_complete_ && exchange_ == nullptr) OnDrained();
  }

  // The response is written in full.
  void OnDrained() {
    response_complete_ = false;
    streaming_ = false;
    if (close_after_ || !keep_alive_) return Linger();
    ReadRequest(/*first=*/false);
  }

  // ---- closing -------------------------------------------------------------

  // Half-closes and drops what the client still sends for a moment.
  void Linger() {
    phase_ = Phase::kLinger;
    beast::error_code ec;
    Socket().shutdown(tcp::socket::shutdown_send, ec);
    if (ec) return CloseNow();
    read_deadline_ = Clock::now() + kLinger;
    ArmTimer();
    if (!reading_) StartRead();
  }

  // Ends the exchange and closes at once. Whatever is still unsent is
  // dropped with a reset (SO_LINGER 0) rather than left in the kernel for a
  // client that is not reading.
  void CloseNow() {
    if (phase_ == Phase::kClosed) return;
    phase_ = Phase::kClosed;
    EndExchange();
    beast::error_code ec;
    timer_.cancel();
    if (writing_ || !pending_.empty()) Socket().set_option(asio::socket_base::linger(true, 0), ec);
    Socket().close(ec);
    self_.reset();
  }

  // ---- deadlines -----------------------------------------------------------

  void SetReadDeadline(absl::Duration d) {
    timed_out_ = false;
    read_deadline_ = Clock::now() + ToClock(d);
    ArmTimer();
  }
  void ClearReadDeadline() {
    read_deadline_ = Clock::time_point::max();
    ArmTimer();
  }

  // One timer serves both deadlines. It is re-armed only when a deadline
  // moves earlier; a wait that fires early re-checks and re-arms (so a
  // stream's many writes do not each reset it).
  void ArmTimer() {
    const Clock::time_point next = std::min(read_deadline_, write_deadline_);
    if (next == Clock::time_point::max() || next >= armed_) return;
    armed_ = next;
    timer_.expires_at(next);
    timer_.async_wait([self = this->shared_from_this()](beast::error_code ec) {
      if (!ec) self->OnTimer();
    });
  }

  void OnTimer() {
    if (phase_ == Phase::kClosed) return;
    armed_ = Clock::time_point::max();
    const Clock::time_point now = Clock::now();
    if (now >= write_deadline_) {
      spdlog::info(
          "http: a response to {} made no progress for server.http_write_timeout_s; "
          "closing",
          peer_);
      return CloseNow();
    }
    if (now >= read_deadline_) {
      read_deadline_ = Clock::time_point::max();
      switch (phase_) {
        case Phase::kHeader:
        case Phase::kBody: {
          // The pending read ends with operation_aborted and its completion
          // answers 408. Over TLS too: cancelling the socket read leaves the
          // TLS session able to write (OpenSSL keeps reads and writes apart).
          timed_out_ = true;
          beast::error_code ec;
          Socket().cancel(ec);
          return;
        }
        default:  // idle keep-alive, handshake, linger
          return CloseNow();
      }
    }
    ArmTimer();
  }

  std::shared_ptr<HttpServer::Core> core_;
  Stream stream_;
  asio::steady_timer timer_;
  const bool refuse_;
  uint64_t id_ = 0;
  std::string peer_;

  Phase phase_ = Phase::kHeader;
  beast::flat_buffer buffer_;
  std::optional<http::request_parser<http::string_body>> parser_;
  HttpRequest request_;
  int version_ = 11;
  bool keep_alive_ = true;
  bool close_after_ = false;
  bool reading_ = false;
  bool timed_out_ = false;
  size_t lingered_ = 0;  // bytes dropped after a refusal

  std::shared_ptr<ExchangeImpl> exchange_;
  // Keeps the connection alive while a handler holds its exchange and no
  // socket operation is pending.
  std::shared_ptr<Connection> self_;
  bool streaming_ = false;
  bool chunked_ = false;
  bool response_complete_ = false;

  std::string pending_;   // queued, not yet handed to a write
  std::string inflight_;  // being written
  size_t written_ = 0;    // of inflight_
  bool writing_ = false;

  Clock::time_point read_deadline_ = Clock::time_point::max();
  Clock::time_point write_deadline_ = Clock::time_point::max();
  Clock::time_point armed_ = Clock::time_point::max();
};

using PlainConnection = Connection<tcp::socket>;
using TlsConnection = Connection<asio::ssl::stream<tcp::socket>>;

}  // namespace

void StartConnection(std::shared_ptr<HttpServer::Core> core, tcp::socket socket, bool refuse) {
  if (core->tls) {
    std::make_shared<TlsConnection>(std::move(core), std::move(socket), refuse)->Start();
  } else {
    std::make_shared<PlainConnection>(std::move(core), std::move(socket), refuse)->Start();
  }
}

}  // namespace http_internal
}  // namespace kvserve

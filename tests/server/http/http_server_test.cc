// The event-driven HTTP layer under the OpenAI front end, with the fake
// engine and raw sockets: strict framing (each finding of issue 15 with its
// status and a message naming the problem), authorization before the body,
// timeouts, the connection cap, keep-alive and pipelining, backpressure on a
// stream nobody reads, clients that leave, and TLS.
#include <httplib.h>
#include <openssl/ssl.h>
#include <sys/time.h>

#include <catch2/catch.hpp>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "server/http/http_service.h"
#include "spdlog/spdlog.h"
#include "tests/server/fake_engine.h"
#include "tests/server/http/raw_http.h"
#include "tests/test_util.h"

namespace kvserve {
namespace {

using json = nlohmann::json;
using testing::RawConnection;
using testing::RawResponse;
using namespace std::chrono_literals;

struct Server {
  explicit Server(HttpService::Options o = {}, std::string api_key = "",
                  int32_t max_model_len = 256)
      : state(&metrics, ChatTemplate(), std::move(api_key)) {
    o.port = 0;
    if (o.max_body_bytes == (8 << 20)) o.max_body_bytes = 4096;
    spdlog::set_level(spdlog::level::warn);
    http = std::make_unique<HttpService>(&state, o);
    REQUIRE(http->Start().ok());
    ServedModelInfo info;
    info.name = "fake";
    info.max_model_len = max_model_len;
    state.SetReady(&engine, info);
  }
  ~Server() { http->Stop(); }
  RawConnection Connect(int rcvbuf = 0) const {
    RawConnection c(http->port(), rcvbuf);
    REQUIRE(c.connected());
    return c;
  }
  // A well-formed completion request for max_tokens tokens.
  static std::string Completion(int max_tokens, std::string extra_headers = "") {
    const std::string body =
        R"({"prompt": "hi", "max_tokens": )" + std::to_string(max_tokens) + "}";
    return "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n" +
           extra_headers + "Content-Length: " + std::to_string(body.size()) + "\r\n\r\n" + body;
  }

  ServerMetrics metrics;
  ServingState state;
  testing::FakeEngine engine;
  std::unique_ptr<HttpService> http;
};

// The status, the error code and a piece of the message of an error reply.
void RequireError(const std::optional<RawResponse>& r, int status, const std::string& code,
                  const std::string& message_part) {
  REQUIRE(r.has_value());
  INFO(r->head << "\n\n" << r->body);
  REQUIRE(r->status == status);
  REQUIRE(r->Header("Content-Type") == "application/json");
  const json e = json::parse(r->body)["error"];
  REQUIRE(e["code"] == code);
  REQUIRE(e["message"].get<std::string>().find(message_part) != std::string::npos);
}

std::string CompletionText(const std::optional<RawResponse>& r) {
  REQUIRE(r.has_value());
  INFO(r->body);
  REQUIRE(r->status == 200);
  return json::parse(r->body)["choices"][0]["text"].get<std::string>();
}

TEST_CASE("Ambiguous or unsupported framing is refused with its status, then closed",
          "[server][http]") {
  Server s;
  struct Case {
    const char* what;
    std::string request;
    int status;
    const char* code;
    const char* message;
  };
  const std::string post = "POST /v1/completions HTTP/1.1\r\nHost: x\r\n";
  const std::string body = R"({"prompt": "hi", "max_tokens": 2})";
  const std::string chunked_body = "5\r\nhello\r\n0\r\n\r\n";
  const Case cases[] = {
      {"Content-Length and Transfer-Encoding: chunked",
       post + "Content-Length: 26\r\nTransfer-Encoding: chunked\r\n\r\n" + chunked_body, 400,
       "ambiguous_framing", "both Content-Length and Transfer-Encoding"},
      {"Transfer-Encoding: chunked, then Content-Length",
       post + "Transfer-Encoding: chunked\r\nContent-Length: 26\r\n\r\n" + chunked_body, 400,
       "ambiguous_framing", "both Content-Length and Transfer-Encoding"},
      {"Transfer-Encoding: gzip with Content-Length",
       post + "Transfer-Encoding: gzip\r\nContent-Length: 5\r\n\r\nhello", 400, "ambiguous_framing",
       "both Content-Length and Transfer-Encoding ('gzip')"},
      {"two different Content-Lengths",
       post + "Content-Length: 5\r\nContent-Length: 6\r\n\r\nhello!", 400, "bad_content_length",
       "two different Content-Length values"},
      {"a Content-Length list of different values", post + "Content-Length: 5, 6\r\n\r\nhello!",
       400, "bad_content_length", "Content-Length is not a valid length"},
      {"Transfer-Encoding: gzip", post + "Transfer-Encoding: gzip\r\n\r\nxxxxxxxxxx", 501,
       "unsupported_transfer_encoding", "Transfer-Encoding 'gzip' is not supported"},
      {"Transfer-Encoding: gzip, chunked",
       post + "Transfer-Encoding: gzip, chunked\r\n\r\n" + chunked_body, 501,
       "unsupported_transfer_encoding", "'gzip, chunked' is not supported"},
      {"chunked applied twice in one header",
       post + "Transfer-Encoding: chunked, chunked\r\n\r\n" + chunked_body, 400,
       "bad_transfer_encoding", "applies chunked more than once"},
      {"two Transfer-Encoding: chunked headers",
       post + "Transfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n" + chunked_body,
       400, "bad_transfer_encoding", "chunked is applied more than once"},
      {"a declared body over server.max_body_bytes", post + "Content-Length: 100000000\r\n\r\n",
       413, "payload_too_large", "larger than server.max_body_bytes (4096 bytes)"},
      {"chunks adding up to more than server.max_body_bytes",
       post + "Transfer-Encoding: chunked\r\n\r\n1000\r\n" + std::string(4096, 'a') + "\r\n10\r\n" +
           std::string(16, 'b') + "\r\n0\r\n\r\n",
       413, "payload_too_large", "larger than server.max_body_bytes (4096 bytes)"},
      {"a bad chunk size", post + "Transfer-Encoding: chunked\r\n\r\nzz\r\nhello\r\n0\r\n\r\n", 400,
       "malformed_request", "malformed request body"},
      {"a head over 64 KiB", post + "X-Big: " + std::string(70000, 'h') + "\r\n\r\n", 431,
       "headers_too_large", "larger than 65536 bytes"},
      {"a malformed request line", "GET\x01 / HTTP/1.1\r\n\r\n", 400, "malformed_request",
       "malformed HTTP request"},
  };
  for (const Case& k : cases) {
    INFO(k.what);
    RawConnection c = s.Connect();
    REQUIRE(c.Send(k.request));
    RequireError(c.ReadResponse(), k.status, k.code, k.message);
    REQUIRE(c.WaitClosed());
  }
  SECTION("a chunked body (coding name in any case) is read, and the server serves on") {
    for (const char* coding : {"chunked", "CHUNKED", " Chunked"}) {
      INFO(coding);
      RawConnection c = s.Connect();
      std::string chunks = "10\r\n" + body.substr(0, 16) + "\r\n" +
                           absl::StrCat(absl::Hex(body.size() - 16)) + "\r\n" + body.substr(16) +
                           "\r\n0\r\n\r\n";
      REQUIRE(c.Send(post + "Transfer-Encoding:" + coding + "\r\n\r\n" + chunks));
      REQUIRE(CompletionText(c.ReadResponse()) == "ab");
    }
  }
  REQUIRE(s.state.calls_in_flight() == 0);
  const std::string metrics = s.state.metrics().Scrape();
  REQUIRE(metrics.find("kvserve_http_responses_total{code=\"501\"} 2") != std::string::npos);
}

TEST_CASE("A body of exactly server.max_body_bytes is read and one byte more is 413",
          "[server][http]") {
  Server s;  // max_body_bytes 4096
  const std::string post = "POST /v1/completions HTTP/1.1\r\nHost: x\r\n";
  // Valid JSON of exactly n bytes: the request, then spaces.
  auto body_of = [](size_t n) {
    std::string b = R"({"prompt": "hi", "max_tokens": 2})";
    b.append(n - b.size(), ' ');
    return b;
  };
  for (bool chunked : {false, true}) {
    INFO((chunked ? "chunked" : "Content-Length"));
    for (size_t n : {size_t{4096}, size_t{4097}}) {
      INFO(n << " bytes");
      const std::string body = body_of(n);
      RawConnection c = s.Connect();
      if (chunked) {
        REQUIRE(c.Send(post + "Transfer-Encoding: chunked\r\n\r\n" +
                       absl::StrCat(absl::Hex(body.size())) + "\r\n" + body + "\r\n0\r\n\r\n"));
      } else {
        REQUIRE(
            c.Send(post + "Content-Length: " + std::to_string(body.size()) + "\r\n\r\n" + body));
      }
      if (n == 4096) {
        REQUIRE(CompletionText(c.ReadResponse()) == "ab");
      } else {
        RequireError(c.ReadResponse(), 413, "payload_too_large",
                     "larger than server.max_body_bytes (4096 bytes)");
      }
    }
  }
  REQUIRE(s.state.calls_in_flight() == 0);
}

TEST_CASE("A query string does not change the route", "[server][http]") {
  Server s;
  RawConnection c = s.Connect();
  REQUIRE(c.Send("GET /health?probe=1 HTTP/1.1\r\nHost: x\r\n\r\n"));
  std::optional<RawResponse> health = c.ReadResponse();
  REQUIRE(health.has_value());
  INFO(health->body);
  REQUIRE(health->status == 200);
  REQUIRE(json::parse(health->body)["status"] == "ready");
  REQUIRE(c.Send("GET /v1/models?limit=1&x HTTP/1.1\r\nHost: x\r\n\r\n"));
  std::optional<RawResponse> models = c.ReadResponse();
  REQUIRE(models.has_value());
  REQUIRE(models->status == 200);
  REQUIRE(json::parse(models->body)["data"][0]["id"] == "fake");
  const std::string body = R"({"prompt": "hi", "max_tokens": 2})";
  REQUIRE(c.Send("POST /v1/completions?x=y HTTP/1.1\r\nHost: x\r\nContent-Length: " +
                 std::to_string(body.size()) + "\r\n\r\n" + body));
  REQUIRE(CompletionText(c.ReadResponse()) == "ab");
  // The query is not part of the path a 404 names.
  REQUIRE(c.Send("GET /nope?x=y HTTP/1.1\r\nHost: x\r\n\r\n"));
  std::optional<RawResponse> missing = c.ReadResponse();
  REQUIRE(missing.has_value());
  REQUIRE(missing->status == 404);
}

TEST_CASE("The API key is checked on the head, before any body byte is read", "[server][http]") {
  HttpService::Options o;
  o.max_body_bytes = 1 << 30;
  Server s(o, "s3cret");
  SECTION("a 1 GiB body declared and never sent: 401 at once, then closed") {
    RawConnection c = s.Connect();
    REQUIRE(
        c.Send("POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 1073741824\r\n\r\n"));
    auto r = c.ReadResponse(5s);
    RequireError(r, 401, "invalid_api_key", "Authorization: Bearer <key>");
    REQUIRE(r->Header("WWW-Authenticate") == "Bearer");
    REQUIRE(c.WaitClosed());
  }
  SECTION("the same for a chunked body, and Expect: 100-continue gets no 100") {
    RawConnection c = s.Connect();
    REQUIRE(
        c.Send("POST /v1/completions HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\n"
               "Transfer-Encoding: chunked\r\nAuthorization: Bearer wrong\r\n\r\n"));
    auto r = c.ReadResponse(5s);
    RequireError(r, 401, "invalid_api_key", "Bearer");
    REQUIRE(r->head.rfind("HTTP/1.1 401", 0) == 0);
  }
  SECTION("with the key (scheme in any case) and Expect: 100-continue, the body is read") {
    RawConnection c = s.Connect();
    const std::string body = R"({"prompt": "hi", "max_tokens": 3})";
    REQUIRE(
        c.Send("POST /v1/completions HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\n"
               "Authorization: bearer s3cret\r\nContent-Length: " +
               std::to_string(body.size()) + "\r\n\r\n"));
    // The 100 arrives before the body is sent (ReadResponse would skip it).
    std::string got;
    while (got.find("\r\n\r\n") == std::string::npos) {
      char buf[256];
      const ssize_t n = recv(c.fd(), buf, sizeof(buf), 0);
      REQUIRE(n > 0);
      got.append(buf, static_cast<size_t>(n));
    }
    REQUIRE(got == "HTTP/1.1 100 Continue\r\n\r\n");
    REQUIRE(c.Send(body));
    REQUIRE(CompletionText(c.ReadResponse()) == "abc");
  }
  SECTION("a refused request without a body keeps the connection") {
    RawConnection c = s.Connect();
    REQUIRE(c.Send("GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n"));
    RequireError(c.ReadResponse(), 401, "invalid_api_key", "Bearer");
    REQUIRE(c.Send("GET /v1/models HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer s3cret\r\n\r\n"));
    auto r = c.ReadResponse();
    REQUIRE(r->status == 200);
    REQUIRE(json::parse(r->body)["data"][0]["id"] == "fake");
  }
}

TEST_CASE("Slow, silent and idle connections are timed out and hold no thread", "[server][http]") {
  HttpService::Options o;
  o.threads = 1;  // one io thread serves all of them
  o.header_timeout = absl::Milliseconds(300);
  o.body_timeout = absl::Milliseconds(300);
  o.idle_timeout = absl::Milliseconds(300);
  Server s(o);
  // While these wait, others are served at once on the one io thread.
  RawConnection silent = s.Connect();
  RawConnection half_head = s.Connect();
  REQUIRE(half_head.Send("POST /v1/completions HTTP/1.1\r\nHo"));
  RawConnection half_body = s.Connect();
  REQUIRE(
      half_body.Send("POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 50\r\n\r\n{"));
  RawConnection idle = s.Connect();
  REQUIRE(idle.Send(Server::Completion(2)));
  REQUIRE(CompletionText(idle.ReadResponse()) == "ab");
  {
    RawConnection other = s.Connect();
    REQUIRE(other.Send("GET /health HTTP/1.1\r\nHost: x\r\n\r\n"));
    REQUIRE(other.ReadResponse(10s)->status == 200);
  }

  RequireError(silent.ReadResponse(), 408, "request_timeout",
               "the request head did not arrive within server.http_header_timeout_s (0.3 s)");
  REQUIRE(silent.WaitClosed());
  RequireError(half_head.ReadResponse(), 408, "request_timeout", "server.http_header_timeout_s");
  REQUIRE(half_head.WaitClosed());
  RequireError(half_body.ReadResponse(), 408, "request_timeout",
               "the request body did not arrive within server.http_body_timeout_s (0.3 s)");
  REQUIRE(half_body.WaitClosed());
  // An idle kept-alive connection is closed without a word.
  REQUIRE(idle.WaitClosed());
  REQUIRE(idle.unread().empty());
}

TEST_CASE("Connections over server.max_connections get a 503 with a JSON body", "[server][http]") {
  HttpService::Options o;
  o.max_connections = 3;
  Server s(o);
  std::vector<RawConnection> open;
  for (int i = 0; i < 3; ++i) {
    open.push_back(s.Connect());
    REQUIRE(open.back().Send("GET /health HTTP/1.1\r\nHost: x\r\n\r\n"));
    REQUIRE(open.back().ReadResponse()->status == 200);
  }
  REQUIRE(s.http->connections() == 3);
  RawConnection extra = s.Connect();
  REQUIRE(extra.Send(Server::Completion(2)));
  auto r = extra.ReadResponse();
  RequireError(r, 503, "too_many_connections",
               "too many open connections (server.max_connections = 3)");
  REQUIRE(r->Header("Connection") == "close");
  REQUIRE(extra.WaitClosed());
  // The open ones are served on.
  for (RawConnection& c : open) {
    REQUIRE(c.Send(Server::Completion(3)));
    REQUIRE(CompletionText(c.ReadResponse()) == "abc");
  }
}

TEST_CASE("Keep-alive has no request limit and pipelined requests are answered in order",
          "[server][http]") {
  Server s;
  RawConnection c = s.Connect();
  for (int i = 1; i <= 20; ++i) {
    REQUIRE(c.Send(Server::Completion(i)));
    auto r = c.ReadResponse();
    REQUIRE(CompletionText(r) == std::string("abcdefghijklmnopqrstuvwxyz").substr(0, i));
    REQUIRE(r->Header("Connection").empty());
  }
  // Three requests in one write: three answers, in order.
  REQUIRE(c.Send(Server::Completion(4) + "GET /health HTTP/1.1\r\nHost: x\r\n\r\n" +
                 Server::Completion(1)));
  REQUIRE(CompletionText(c.ReadResponse()) == "abcd");
  auto health = c.ReadResponse();
  REQUIRE(health->status == 200);
  REQUIRE(json::parse(health->body)["status"] == "ready");
  REQUIRE(CompletionText(c.ReadResponse()) == "a");
  SECTION("Connection: close is honoured after the answer") {
    REQUIRE(c.Send(Server::Completion(2, "Connection: close\r\n")));
    auto r = c.ReadResponse();
    REQUIRE(CompletionText(r) == "ab");
    REQUIRE(r->Header("Connection") == "close");
    REQUIRE(c.WaitClosed());
  }
  SECTION("HTTP/1.0 closes unless asked to keep alive") {
    RawConnection old = s.Connect();
    REQUIRE(old.Send("GET /health HTTP/1.0\r\n\r\n"));
    REQUIRE(old.ReadResponse()->status == 200);
    REQUIRE(old.WaitClosed());
  }
}

TEST_CASE("A stream whose client stops reading is cancelled once its buffer fills",
          "[server][http]") {
  HttpService::Options o;
  o.stream_buffer_bytes = 64 * 1024;
  Server s(o);
  s.engine.reply_length = 1 << 30;
  s.engine.token_interval = absl::Microseconds(20);
  // Never read, with a small window: the unsent bytes pile up in the server.
  RawConnection c = s.Connect(/*rcvbuf=*/4096);
  const std::string body =
      R"({"prompt": "hi", "max_tokens": 250, "n": 64, "logprobs": 5, "stream": true})";
  REQUIRE(c.Send("POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: " +
                 std::to_string(body.size()) + "\r\n\r\n" + body));
  REQUIRE(s.engine.WaitForCancelled(1) == 1);
  REQUIRE(s.state.WaitForCalls(absl::Now() + absl::Seconds(10)));
  // The client sees the start of the stream, then the close.
  REQUIRE(c.WaitClosed());
  // Others are served on.
  RawConnection next = s.Connect();
  REQUIRE(next.Send(Server::Completion(2)));
  REQUIRE(CompletionText(next.ReadResponse()) == "ab");
}

TEST_CASE("A response the client does not read is dropped after the write timeout",
          "[server][http]") {
  HttpService::Options o;
  o.write_timeout = absl::Milliseconds(300);
  Server s(o, "", /*max_model_len=*/1 << 20);
  s.engine.reply_length = 1 << 30;
  // Over 10 MB of JSON (more than the kernel buffers) to a client that never reads.
  RawConnection c = s.Connect(/*rcvbuf=*/4096);
  const std::string body = R"({"prompt": "hi", "max_tokens": 2000, "n": 64, "logprobs": 5})";
  REQUIRE(c.Send("POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: " +
                 std::to_string(body.size()) + "\r\n\r\n" + body));
  // The server resets the connection: seen without reading.
  pollfd p{c.fd(), 0, 0};
  REQUIRE(poll(&p, 1, 30000) == 1);
  REQUIRE((p.revents & (POLLHUP | POLLERR)) != 0);
  REQUIRE(s.state.calls_in_flight() == 0);
}

TEST_CASE("A client that leaves before a plain (non-streamed) answer cancels its request",
          "[server][http]") {
  Server s;
  s.engine.reply_length = 1 << 30;
  s.engine.token_interval = absl::Milliseconds(5);
  RawConnection c = s.Connect();
  REQUIRE(c.Send(Server::Completion(250)));
  c.Close();
  REQUIRE(s.engine.WaitForCancelled(1) == 1);
  REQUIRE(s.state.WaitForCalls(absl::Now() + absl::Seconds(10)));
}

TEST_CASE("Stop ends open streams and cancels their requests", "[server][http]") {
  auto s = std::make_unique<Server>();
  s->engine.reply_length = 1 << 30;
  s->engine.token_interval = absl::Milliseconds(1);
  RawConnection c = s->Connect();
  const std::string body = R"({"prompt": "hi", "max_tokens": 250, "stream": true})";
  REQUIRE(c.Send("POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: " +
                 std::to_string(body.size()) + "\r\n\r\n" + body));
  std::string first(64, '\0');
  REQUIRE(recv(c.fd(), first.data(), first.size(), 0) > 0);
  s->http->Stop();
  REQUIRE(s->engine.WaitForCancelled(1) == 1);
  REQUIRE(s->state.WaitForCalls(absl::Now() + absl::Seconds(10)));
  REQUIRE(c.WaitClosed());
}
// The value of kvserve_http_open_connections in a /metrics body.
int OpenConnectionsGauge(const std::string& metrics) {
  const std::string series = "\nkvserve_http_open_connections ";
  const size_t pos = metrics.find(series);
  REQUIRE(pos != std::string::npos);
  return std::stoi(metrics.substr(pos + series.size()));
}

// Waits (at most 10 s) until the server counts `open` connections: it
// notices a client's close asynchronously.
void WaitForConnections(const Server& s, int open) {
  const auto deadline = std::chrono::steady_clock::now() + 10s;
  while (s.http->connections() != open && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(5ms);
  }
  REQUIRE(s.http->connections() == open);
}

TEST_CASE("kvserve_http_open_connections counts idle keep-alive connections until they close",
          "[server][http][metrics]") {
  Server s;
  RawConnection scraper = s.Connect();
  auto scrape = [&scraper] {
    REQUIRE(scraper.Send("GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n"));
    const std::optional<RawResponse> r = scraper.ReadResponse();
    REQUIRE(r.has_value());
    REQUIRE(r->status == 200);
    REQUIRE(r->Header("Connection").empty());  // kept alive
    return OpenConnectionsGauge(r->body);
  };
  REQUIRE(scrape() == 1);  // the scraper's own
  constexpr int kIdle = 5;
  {
    std::vector<RawConnection> idle;
    for (int i = 0; i < kIdle; ++i) {
      idle.push_back(s.Connect());
      REQUIRE(idle.back().Send("GET /health HTTP/1.1\r\nHost: x\r\n\r\n"));
      REQUIRE(idle.back().ReadResponse()->status == 200);
    }
    REQUIRE(scrape() == 1 + kIdle);
    // Still open after another exchange on one of them.
    REQUIRE(idle[2].Send("GET /health HTTP/1.1\r\nHost: x\r\n\r\n"));
    REQUIRE(idle[2].ReadResponse()->status == 200);
    REQUIRE(scrape() == 1 + kIdle);
  }
  WaitForConnections(s, 1);
  REQUIRE(scrape() == 1);
}

// A self-signed certificate for 127.0.0.1, made with the openssl CLI.
void MakeCertificate(const std::string& dir) {
  std::string out;
  const int rc = testing::RunShell(
      "openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 1 "
      "-subj /CN=127.0.0.1 -addext subjectAltName=IP:127.0.0.1 -keyout " +
          testing::ShellQuote(dir + "/key.pem") + " -out " +
          testing::ShellQuote(dir + "/cert.pem") + " 2>&1",
      &out);
  INFO(out);
  REQUIRE(rc == 0);
}

TEST_CASE("HTTPS from server.tls.cert_file and key_file", "[server][http][tls]") {
  const std::string dir = testing::MakeTempDir("tls");
  MakeCertificate(dir);
  HttpService::Options o;
  o.tls_cert_file = dir + "/cert.pem";
  o.tls_key_file = dir + "/key.pem";
  Server s(o, "s3cret");
  httplib::SSLClient client("127.0.0.1", s.http->port());
  client.set_ca_cert_path((dir + "/cert.pem").c_str());
  client.enable_server_certificate_verification(true);
  auto health = client.Get("/health");
  REQUIRE(health);
  REQUIRE(health->status == 200);
  REQUIRE(
      client.Post("/v1/completions", R"({"prompt": "hi", "max_tokens": 2})", "application/json")
          ->status == 401);
  auto r = client.Post("/v1/completions", {{"Authorization", "Bearer s3cret"}},
                       R"({"prompt": "hi", "max_tokens": 2, "stream": true})", "application/json");
  REQUIRE(r);
  REQUIRE(r->status == 200);
  REQUIRE(r->get_header_value("Content-Type") == "text/event-stream");
  REQUIRE(r->body.find("data: [DONE]") != std::string::npos);
  SECTION("plain HTTP on the TLS port gets no answer") {
    RawConnection c = s.Connect();
    REQUIRE(c.Send("GET /health HTTP/1.1\r\nHost: x\r\n\r\n"));
    REQUIRE_FALSE(c.ReadResponse(2s).has_value());
  }
  SECTION("unusable files fail Start naming the key") {
    ServerMetrics metrics;
    ServingState state(&metrics, ChatTemplate(), "");
    HttpService::Options bad;
    bad.tls_cert_file = dir + "/missing.pem";
    bad.tls_key_file = dir + "/key.pem";
    HttpService http(&state, bad);
    absl::Status st = http.Start();
    REQUIRE(st.message().rfind("server.tls.cert_file: cannot use '" + dir + "/missing.pem'", 0) ==
            0);
    bad.tls_cert_file = dir + "/cert.pem";
    bad.tls_key_file = dir + "/cert.pem";
    HttpService http2(&state, bad);
    REQUIRE(http2.Start().message().rfind("server.tls.key_file: cannot use", 0) == 0);
  }
}

// A TLS client on a raw socket that sends exactly the bytes it is given
// (half a head, half a body), which a client library will not.
class RawTlsConnection {
 public:
  explicit RawTlsConnection(int port) : tcp_(port), ctx_(SSL_CTX_new(TLS_client_method())) {
    ssl_ = SSL_new(ctx_);
    SSL_set_fd(ssl_, tcp_.fd());
    handshaken_ = tcp_.connected() && SSL_connect(ssl_) == 1;
  }
  ~RawTlsConnection() {
    SSL_free(ssl_);
    SSL_CTX_free(ctx_);
  }
  RawTlsConnection(const RawTlsConnection&) = delete;
  RawTlsConnection& operator=(const RawTlsConnection&) = delete;

  bool handshaken() const { return handshaken_; }
  bool Send(std::string_view bytes) {
    return SSL_write(ssl_, bytes.data(), static_cast<int>(bytes.size())) ==
           static_cast<int>(bytes.size());
  }
  // The decrypted bytes the server sends up to its close; nullopt when a
  // read waits longer than `timeout` (the server has not closed).
  std::optional<std::string> ReadUntilClosed(std::chrono::milliseconds timeout) {
    timeval tv{};
    tv.tv_sec = timeout.count() / 1000;
    tv.tv_usec = (timeout.count() % 1000) * 1000;
    setsockopt(tcp_.fd(), SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    std::string out;
    char buf[4096];
    for (;;) {
      const int n = SSL_read(ssl_, buf, sizeof(buf));
      if (n > 0) {
        out.append(buf, static_cast<size_t>(n));
        continue;
      }
      // A close with or without close_notify (the server half-closes the TCP
      // connection after a refusal), or a reset.
      const int err = SSL_get_error(ssl_, n);
      if (err == SSL_ERROR_ZERO_RETURN || err == SSL_ERROR_SYSCALL || err == SSL_ERROR_SSL) {
        return out;
      }
      return std::nullopt;
    }
  }

 private:
  testing::RawConnection tcp_;
  SSL_CTX* ctx_;
  SSL* ssl_ = nullptr;
  bool handshaken_ = false;
};

TEST_CASE("Over TLS, slow heads and bodies get the same 408 as over plain TCP",
          "[server][http][tls]") {
  const std::string dir = testing::MakeTempDir("tls-timeout");
  MakeCertificate(dir);
  HttpService::Options o;
  o.tls_cert_file = dir + "/cert.pem";
  o.tls_key_file = dir + "/key.pem";
  o.header_timeout = absl::Milliseconds(300);
  o.body_timeout = absl::Milliseconds(300);
  Server s(o);
  // The exact bytes of the answer, then the close.
  auto require_408 = [](RawTlsConnection& c, const std::string& message) {
    const std::optional<std::string> got = c.ReadUntilClosed(10s);
    REQUIRE(got.has_value());
    INFO(*got);
    const size_t head_end = got->find("\r\n\r\n");
    REQUIRE(head_end != std::string::npos);
    const std::string body = got->substr(head_end + 4);
    REQUIRE(got->substr(0, head_end + 4) ==
            "HTTP/1.1 408 Request Timeout\r\nContent-Type: application/json\r\n"
            "Content-Length: " +
                std::to_string(body.size()) + "\r\nConnection: close\r\n\r\n");
    const json e = json::parse(body)["error"];
    REQUIRE(e["code"] == "request_timeout");
    REQUIRE(e["type"] == "invalid_request_error");
    REQUIRE(e["message"] == message);
  };
  const std::string head_message =
      "the request head did not arrive within server.http_header_timeout_s (0.3 s)";
  SECTION("nothing sent after the handshake") {
    RawTlsConnection c(s.http->port());
    REQUIRE(c.handshaken());
    require_408(c, head_message);
  }
  SECTION("half a head") {
    RawTlsConnection c(s.http->port());
    REQUIRE(c.handshaken());
    REQUIRE(c.Send("POST /v1/completions HTTP/1.1\r\nHo"));
    require_408(c, head_message);
  }
  SECTION("half a body") {
    RawTlsConnection c(s.http->port());
    REQUIRE(c.handshaken());
    REQUIRE(c.Send("POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 50\r\n\r\n{"));
    require_408(c, "the request body did not arrive within server.http_body_timeout_s (0.3 s)");
  }
  SECTION("a whole request in time is not timed out") {
    RawTlsConnection c(s.http->port());
    REQUIRE(c.handshaken());
    REQUIRE(c.Send("GET /health HTTP/1.1\r\nHost: x\r\n\r\n"));
    // The connection stays open past the 408 deadlines: the read times out.
    REQUIRE_FALSE(c.ReadUntilClosed(1s).has_value());
  }
}

TEST_CASE("kvserve_http_open_connections counts TLS connections", "[server][http][tls][metrics]") {
  const std::string dir = testing::MakeTempDir("tls-gauge");
  MakeCertificate(dir);
  HttpService::Options o;
  o.tls_cert_file = dir + "/cert.pem";
  o.tls_key_file = dir + "/key.pem";
  Server s(o);
  constexpr int kIdle = 3;
  {
    std::vector<std::unique_ptr<RawTlsConnection>> idle;
    for (int i = 0; i < kIdle; ++i) {
      idle.push_back(std::make_unique<RawTlsConnection>(s.http->port()));
      REQUIRE(idle.back()->handshaken());
    }
    RawTlsConnection scraper(s.http->port());
    REQUIRE(scraper.handshaken());
    REQUIRE(scraper.Send("GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"));
    const std::optional<std::string> got = scraper.ReadUntilClosed(10s);
    REQUIRE(got.has_value());
    REQUIRE(got->rfind("HTTP/1.1 200 OK\r\n", 0) == 0);
    REQUIRE(OpenConnectionsGauge(*got) == kIdle + 1);
  }
  WaitForConnections(s, 0);
}

}  // namespace
}  // namespace kvserve

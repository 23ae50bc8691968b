// The HTTP front end's config keys (server/config/config.h): defaults, the YAML
// file (server.tls as a nested map, paths relative to the file), --set, and
// errors naming the key.
#include <catch2/catch.hpp>
#include <string>

#include "server/config/config.h"

namespace kvserve {
namespace {

std::string Error(const absl::StatusOr<ServeConfig>& c) {
  REQUIRE_FALSE(c.ok());
  return std::string(c.status().message());
}

TEST_CASE("HTTP limits, keys and TLS have defaults and are read from the file", "[server][http]") {
  auto d = ParseServeConfig("model:\n  path: dummy:tiny\n", "/cfg");
  REQUIRE(d.ok());
  REQUIRE(d->server.http_threads == 4);
  REQUIRE(d->server.http_header_timeout_s == 10);
  REQUIRE(d->server.http_body_timeout_s == 30);
  REQUIRE(d->server.http_idle_timeout_s == 60);
  REQUIRE(d->server.http_write_timeout_s == 30);
  REQUIRE(d->server.max_connections == 4096);
  REQUIRE(d->server.http_stream_buffer_bytes == 1 << 20);
  REQUIRE(d->server.api_key_file.empty());
  REQUIRE(d->server.tls.cert_file.empty());
  REQUIRE(d->server.tls.key_file.empty());

  auto c = ParseServeConfig(R"(
model:
  path: dummy:tiny
server:
  http_header_timeout_s: 2.5s
  http_body_timeout_s: 500ms
  http_idle_timeout_s: 1m
  http_write_timeout_s: 7
  max_connections: 100
  http_stream_buffer_bytes: 256KiB
  api_key_file: secrets/keys
  tls:
    cert_file: tls/cert.pem
    key_file: /abs/key.pem
)",
                            "/cfg", {"server.max_connections=200"});
  REQUIRE(c.ok());
  REQUIRE(c->server.http_header_timeout_s == 2.5);
  REQUIRE(c->server.http_body_timeout_s == 0.5);
  REQUIRE(c->server.http_idle_timeout_s == 60);
  REQUIRE(c->server.http_write_timeout_s == 7);
  REQUIRE(c->server.max_connections == 200);  // --set wins
  REQUIRE(c->server.http_stream_buffer_bytes == 256 * 1024);
  REQUIRE(c->server.api_key_file == "/cfg/secrets/keys");
  REQUIRE(c->server.tls.cert_file == "/cfg/tls/cert.pem");
  REQUIRE(c->server.tls.key_file == "/abs/key.pem");

  auto set = ParseServeConfig("model:\n  path: dummy:tiny\n", "/cfg",
                              {"server.tls.cert_file=c.pem", "server.tls.key_file=k.pem"});
  REQUIRE(set.ok());
  REQUIRE(set->server.tls.cert_file == "c.pem");  // --set paths stay relative to the cwd
  REQUIRE(set->server.tls.key_file == "k.pem");
}

TEST_CASE("Bad HTTP settings name their key", "[server][http]") {
  const std::string base = "model:\n  path: dummy:tiny\n";
  REQUIRE(Error(ParseServeConfig(base, "", {"server.http_header_timeout_s=0"})) ==
          "server.http_header_timeout_s: expected a duration in seconds > 0 (e.g. 10, 2.5s, "
          "500ms), got '0'");
  REQUIRE(Error(ParseServeConfig(base, "", {"server.http_idle_timeout_s=soon"})) ==
          "server.http_idle_timeout_s: expected a duration in seconds >= 0 (e.g. 30, 2.5s, "
          "500ms, 1m), got 'soon'");
  REQUIRE(Error(ParseServeConfig(base, "", {"server.max_connections=0"})) ==
          "server.max_connections: expected an integer in [1, 1048576], got '0'");
  REQUIRE(Error(ParseServeConfig(base, "", {"server.http_stream_buffer_bytes=0"})) ==
          "server.http_stream_buffer_bytes: expected a positive byte count, got '0'");
  REQUIRE(Error(ParseServeConfig(base + "server:\n  tls:\n    cert: x\n", "")) ==
          "server.tls.cert: unknown key (server has: host, http_port, grpc_port, "
          "shutdown_timeout, max_body_bytes, max_queue, api_key, http_threads, reuse_port, "
          "http_header_timeout_s, http_body_timeout_s, http_idle_timeout_s, "
          "http_write_timeout_s, max_connections, http_stream_buffer_bytes, api_key_file, "
          "metrics_auth, "
          "tls.cert_file, tls.key_file)");
  for (const char* key :
       {"server.http_header_timeout_s", "server.http_body_timeout_s", "server.http_idle_timeout_s",
        "server.http_write_timeout_s", "server.max_connections", "server.http_stream_buffer_bytes",
        "server.api_key_file", "server.tls.cert_file", "server.tls.key_file"}) {
    INFO(key);
    REQUIRE_FALSE(ServeConfigKeyHelp(key).empty());
  }
}

}  // namespace
}  // namespace kvserve

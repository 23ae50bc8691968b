#include "server/admission/client_limiter.h"

#include <catch2/catch.hpp>
#include <utility>
#include <vector>

#include "server/openai/openai_protocol.h"

namespace kvserve {
namespace {

TEST_CASE("ClientLimiter holds each client to its limit, and tokens give slots back", "[server]") {
  ClientLimiter limiter(2);
  std::vector<ClientLimiter::Token> a;
  for (int i = 0; i < 2; ++i) {
    absl::StatusOr<ClientLimiter::Token> t = limiter.Acquire("ipv4:10.0.0.1");
    REQUIRE(t.ok());
    a.push_back(*std::move(t));
  }
  REQUIRE(limiter.active("ipv4:10.0.0.1") == 2);
  absl::StatusOr<ClientLimiter::Token> third = limiter.Acquire("ipv4:10.0.0.1");
  REQUIRE(third.status().code() == absl::StatusCode::kResourceExhausted);
  REQUIRE(third.status().message() ==
          "this client already has 2 generation calls open, the most "
          "limits.max_concurrent_per_client allows");
  REQUIRE(IsClientLimitError(third.status()));
  REQUIRE_FALSE(IsClientLimitError(absl::ResourceExhaustedError("queue full")));
  // Another client is not affected.
  absl::StatusOr<ClientLimiter::Token> other = limiter.Acquire("ipv4:10.0.0.2");
  REQUIRE(other.ok());
  REQUIRE(limiter.active("ipv4:10.0.0.2") == 1);
  // Moving a token moves the slot; releasing twice gives back one.
  ClientLimiter::Token moved = std::move(a[0]);
  REQUIRE(limiter.active("ipv4:10.0.0.1") == 2);
  moved.Release();
  moved.Release();
  REQUIRE(limiter.active("ipv4:10.0.0.1") == 1);
  REQUIRE(limiter.Acquire("ipv4:10.0.0.1").ok());  // a temporary: released at once
  a.clear();
  REQUIRE(limiter.active("ipv4:10.0.0.1") == 0);
  other->Release();
  REQUIRE(limiter.active("ipv4:10.0.0.2") == 0);
}

TEST_CASE("ClientLimiter with 0 counts nothing", "[server]") {
  ClientLimiter limiter(0);
  std::vector<ClientLimiter::Token> held;
  for (int i = 0; i < 1000; ++i) {
    absl::StatusOr<ClientLimiter::Token> t = limiter.Acquire("x");
    REQUIRE(t.ok());
    held.push_back(*std::move(t));
  }
  REQUIRE(limiter.active("x") == 0);
}

TEST_CASE("ClientKey: the API key, else the peer without its port", "[server]") {
  REQUIRE(ClientKey("k1", "ipv4:127.0.0.1:5678") == "key:k1");
  REQUIRE(ClientKey("", "ipv4:127.0.0.1:5678") == "ipv4:127.0.0.1");
  REQUIRE(ClientKey("", "ipv6:[::1]:80") == "ipv6:[::1]");
  REQUIRE(ClientKey("", "1.2.3.4:80") == "1.2.3.4");
  REQUIRE(ClientKey("", "unix:/tmp/s") == "unix:/tmp/s");
  REQUIRE(ClientKey("", "ipv6:[::1]") == "ipv6:[::1]");
}

TEST_CASE("Over the per-client limit is HTTP 429 with its own code", "[server]") {
  ClientLimiter limiter(1);
  absl::StatusOr<ClientLimiter::Token> first = limiter.Acquire("c");
  REQUIRE(first.ok());
  const ApiError e = ApiErrorFromStatus(limiter.Acquire("c").status(), "prompt");
  REQUIRE(e.http_status == 429);
  REQUIRE(e.code == "concurrency_limit_exceeded");
  REQUIRE(ApiErrorFromStatus(absl::ResourceExhaustedError("queue full"), "prompt").code ==
          "queue_full");
}

}  // namespace
}  // namespace kvserve

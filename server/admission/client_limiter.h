// ClientLimiter: at most `max_per_client` generation calls open at once per
// client, so one client cannot take every slot of the queue and the engine.
// A client is its API key when the server checks keys, else its peer
// address without the port (every connection from one host counts
// together); ClientKey builds that key.
//
// Acquire returns a token that holds one slot until it is destroyed (RAII,
// movable); over the limit it returns ResourceExhausted naming
// limits.max_concurrent_per_client, which the front ends answer with 429 /
// RESOURCE_EXHAUSTED (IsClientLimitError tells it from a full queue).
//
//   ClientLimiter limiter(4);
//   absl::StatusOr<ClientLimiter::Token> t = limiter.Acquire(ClientKey(key, peer));
//   if (!t.ok()) return t.status();  // the 5th concurrent call
//
// Invariant: the count of a client equals its live tokens; clients with no
// live token are not stored.
//
// Thread-safety: every method is safe from any thread; a Token must not
// outlive its limiter.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"

namespace kvserve {

class ClientLimiter {
 public:
  // 0 = unlimited (Acquire always succeeds and counts nothing).
  explicit ClientLimiter(int32_t max_per_client) : max_per_client_(max_per_client) {}
  ClientLimiter(const ClientLimiter&) = delete;
  ClientLimiter& operator=(const ClientLimiter&) = delete;

  class Token {
   public:
    Token() = default;
    Token(Token&& other) noexcept { *this = std::move(other); }
    Token& operator=(Token&& other) noexcept;
    ~Token() { Release(); }
    // Gives the slot back now (idempotent).
    void Release();

   private:
    friend class ClientLimiter;
    Token(ClientLimiter* limiter, std::string client)
        : limiter_(limiter), client_(std::move(client)) {}
    ClientLimiter* limiter_ = nullptr;
    std::string client_;
  };

  absl::StatusOr<Token> Acquire(std::string_view client);
  // Calls the client holds now.
  int32_t active(std::string_view client) const;
  int32_t max_per_client() const { return max_per_client_; }

 private:
  void Release(const std::string& client);

  const int32_t max_per_client_;
  mutable absl::Mutex mu_;
  absl::flat_hash_map<std::string, int32_t> active_ ABSL_GUARDED_BY(mu_);
};

// The limiter's key: "key:<api key>" when the server checks keys (api_key
// non-empty, the caller already authorized), else the peer address without
// its port ("ipv4:127.0.0.1" from gRPC's "ipv4:127.0.0.1:5678", "1.2.3.4"
// from "1.2.3.4:80", "ipv6:[::1]" from "ipv6:[::1]:80").
std::string ClientKey(std::string_view api_key, std::string_view peer);

// True for the status Acquire refuses with (not a full queue).
bool IsClientLimitError(const absl::Status& status);

}  // namespace kvserve

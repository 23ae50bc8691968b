// server/admission/: what lets a request in, shared by the HTTP and gRPC
// front ends: the API keys and the tenant salt (auth.h, this header), the
// per-client cap on open calls (client_limiter.h), the prompt budget and the
// prompt workers that tokenize within it (request_budget.h), and the drain
// gate every use of the engine holds a lease on (engine_gate.h).
//
// ApiKeys: the daemon's API keys (server.api_key plus the lines of
// server.api_key_file) and the one check both front ends make of a request's
// `Authorization` header (HTTP) or `authorization` metadata (gRPC).
//
//   Authorization: Bearer <key>     the scheme name is case-insensitive
//                                   (RFC 9110 11.1); the key is not.
//
// Keys never leave this class: each is kept as its SHA-256 digest, and a
// presented token is digested and compared with every key's digest by a
// loop that reads all 32 bytes of both, for every key, whatever matches or
// differs and where (ConstantTimeEquals). The time taken therefore depends
// on the token's length and the number of keys, never on how much of a key
// the token guessed right.
//
// An empty set (no key configured) authorizes everything.
//
// Key file: one key per line; surrounding whitespace and CR are stripped,
// empty lines and lines starting with '#' are skipped. A file that cannot
// be read, or holds a key with inner whitespace, is an error naming
// server.api_key_file and the line.
//
// Thread-safety: immutable after construction; Authorize from any thread.
//
// Example:
//   auto keys = ApiKeys::Load(config.server.api_key, config.server.api_key_file);
//   if (!keys->Authorize(request.header("Authorization"))) return 401;
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace kvserve {

// Compares n bytes, reading every byte of both sides whatever their contents
// (no early exit; the differences are OR-ed into a volatile accumulator).
// `a(i)` and `b(i)` return byte i; tests pass counting accessors.
template <typename ByteAtA, typename ByteAtB>
bool ConstantTimeEqualsWith(size_t n, ByteAtA a, ByteAtB b) {
  volatile uint8_t diff = 0;
  for (size_t i = 0; i < n; ++i) diff = diff | static_cast<uint8_t>(a(i) ^ b(i));
  return diff == 0;
}

// Equal lengths and equal bytes; all min(size) bytes are read either way.
bool ConstantTimeEquals(std::string_view a, std::string_view b);

// The token of "Bearer <token>" (scheme matched case-insensitively, one or
// more spaces after it); nullopt for another scheme or no token.
std::optional<std::string_view> BearerToken(std::string_view authorization);

// The prefix-cache salt of a request from the client holding `key` (the
// bearer token that authorized it; "" when no key is configured). Without a
// key it is the client's cache_salt as sent. With one it is the hex SHA-256
// of the key's SHA-256 and the client's salt: every tenant's cache is apart
// from every other's whatever salt either sends (B sending A's salt gets a
// salt of B's own), a client salt still divides one tenant's cache, and
// neither the key nor a digest that could be compared with one is kept in
// the request.
std::string TenantCacheSalt(std::string_view key, std::string_view client_salt);

class ApiKeys {
 public:
  using Digest = std::array<uint8_t, 32>;

  ApiKeys() = default;
  explicit ApiKeys(const std::vector<std::string>& keys);

  // server.api_key ("" = none) plus the keys of server.api_key_file ("" = none).
  static absl::StatusOr<ApiKeys> Load(const std::string& key, const std::string& key_file);
  // The keys of a key file, in order (format above).
  static absl::StatusOr<std::vector<std::string>> ReadKeyFile(const std::string& key_file);

  // True when no key is configured.
  bool empty() const { return digests_.empty(); }
  size_t size() const { return digests_.size(); }

  // True when no key is configured, or `authorization` is "Bearer <k>" for
  // one of the keys.
  bool Authorize(std::string_view authorization) const;
  // The same for a bare token.
  bool MatchesToken(std::string_view token) const;

 private:
  std::vector<Digest> digests_;
};

}  // namespace kvserve

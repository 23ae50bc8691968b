#include "server/admission/client_limiter.h"

#include <utility>

#include "absl/strings/cord.h"
#include "absl/strings/str_cat.h"

namespace kvserve {
namespace {

constexpr char kLimitPayloadUrl[] = "type.kvserve.dev/limit";
constexpr char kLimitName[] = "limits.max_concurrent_per_client";

}  // namespace

ClientLimiter::Token& ClientLimiter::Token::operator=(Token&& other) noexcept {
  if (this != &other) {
    Release();
    limiter_ = std::exchange(other.limiter_, nullptr);
    client_ = std::move(other.client_);
  }
  return *this;
}

void ClientLimiter::Token::Release() {
  if (limiter_ != nullptr) std::exchange(limiter_, nullptr)->Release(client_);
}

absl::StatusOr<ClientLimiter::Token> ClientLimiter::Acquire(std::string_view client) {
  if (max_per_client_ <= 0) return Token();
  std::string key(client);
  absl::MutexLock lock(&mu_);
  int32_t& n = active_[key];
  if (n >= max_per_client_) {
    if (n == 0) active_.erase(key);
    absl::Status s = absl::ResourceExhaustedError(
        absl::StrCat("this client already has ", max_per_client_,
                     " generation calls open, the most ", kLimitName, " allows"));
    s.SetPayload(kLimitPayloadUrl, absl::Cord(kLimitName));
    return s;
  }
  ++n;
  return Token(this, std::move(key));
}

int32_t ClientLimiter::active(std::string_view client) const {
  absl::MutexLock lock(&mu_);
  auto it = active_.find(std::string(client));
  return it == active_.end() ? 0 : it->second;
}

void ClientLimiter::Release(const std::string& client) {
  absl::MutexLock lock(&mu_);
  auto it = active_.find(client);
  if (it == active_.end() || it->second <= 0) std::abort();  // a token released twice
  if (--it->second == 0) active_.erase(it);
}

std::string ClientKey(std::string_view api_key, std::string_view peer) {
  if (!api_key.empty()) return absl::StrCat("key:", std::string(api_key));
  // Drop ":port" (after the closing bracket for IPv6).
  const size_t colon = peer.rfind(':');
  const size_t bracket = peer.rfind(']');
  if (colon != std::string_view::npos && (bracket == std::string_view::npos || colon > bracket)) {
    std::string_view host = peer.substr(0, colon);
    // "ipv4:1.2.3.4:80" -> "ipv4:1.2.3.4", but "ipv4:80" has no port to drop
    // only if what is left still names an address.
    if (!host.empty() && host != "ipv4" && host != "ipv6" && host != "unix") {
      return std::string(host);
    }
  }
  return std::string(peer);
}

bool IsClientLimitError(const absl::Status& status) {
  return status.code() == absl::StatusCode::kResourceExhausted &&
         status.GetPayload(kLimitPayloadUrl).has_value();
}

}  // namespace kvserve

#include "server/serving_state.h"

#include "absl/random/random.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace kvserve {

std::string NewRequestId() {
  thread_local absl::BitGen gen;
  return absl::StrFormat("%016x", absl::Uniform<uint64_t>(gen));
}

bool IsAcceptableRequestId(std::string_view id) {
  if (id.empty() || id.size() > 128) return false;
  for (char c : id) {
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '.' && c != '_' && c != ':' &&
        c != '-') {
      return false;
    }
  }
  return true;
}

void ServingState::SetReady(Engine* engine, ServedModelInfo info) {
  info_ = std::move(info);
  engine_.store(engine, std::memory_order_release);
  Phase expected = Phase::kLoading;
  // A drain that began while loading wins.
  phase_.compare_exchange_strong(expected, Phase::kReady, std::memory_order_acq_rel);
  metrics_->SetReady(ready());
}

void ServingState::StartDraining() {
  phase_.store(Phase::kDraining, std::memory_order_release);
  metrics_->SetReady(false);
}

bool ServingState::Authorized(std::string_view authorization) const {
  if (api_key_.empty()) return true;
  // Compare every byte so the time taken does not reveal a matching prefix.
  const std::string expected = absl::StrCat("Bearer ", api_key_);
  if (authorization.size() != expected.size()) return false;
  unsigned char diff = 0;
  for (size_t i = 0; i < expected.size(); ++i) {
    diff |= static_cast<unsigned char>(authorization[i] ^ expected[i]);
  }
  return diff == 0;
}

void ServingState::CallStarted() {
  absl::MutexLock lock(&mu_);
  ++calls_;
}

void ServingState::CallFinished() {
  absl::MutexLock lock(&mu_);
  --calls_;
}

int64_t ServingState::calls_in_flight() const {
  absl::MutexLock lock(&mu_);
  return calls_;
}

bool ServingState::WaitForCalls(absl::Time deadline) const {
  absl::MutexLock lock(&mu_);
  auto idle = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) { return calls_ == 0; };
  mu_.AwaitWithDeadline(absl::Condition(&idle), deadline);
  return calls_ == 0;
}

}  // namespace kvserve

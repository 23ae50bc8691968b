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

ServingState::ServingState(ServerMetrics* metrics, ChatTemplate chat_template,
                           std::shared_ptr<const ApiKeys> api_keys)
    : metrics_(metrics),
      chat_template_(std::move(chat_template)),
      api_keys_(api_keys != nullptr ? std::move(api_keys) : std::make_shared<const ApiKeys>()) {}

ServingState::ServingState(ServerMetrics* metrics, ChatTemplate chat_template,
                           const std::string& api_key)
    : ServingState(
          metrics, std::move(chat_template),
          std::make_shared<const ApiKeys>(api_key.empty() ? std::vector<std::string>{}
                                                          : std::vector<std::string>{api_key})) {}

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

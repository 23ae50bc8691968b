#include "server/admission/engine_gate.h"

#include <algorithm>

namespace kvserve {

EngineGate::Lease EngineGate::Enter() {
  absl::MutexLock lock(&mu_);
  if (closed_) return Lease();
  ++users_;
  return Lease(this);
}

void EngineGate::Track(std::weak_ptr<Cancellable> call) {
  absl::MutexLock lock(&mu_);
  calls_.erase(std::remove_if(calls_.begin(), calls_.end(),
                              [](const std::weak_ptr<Cancellable>& c) { return c.expired(); }),
               calls_.end());
  calls_.push_back(std::move(call));
}

bool EngineGate::Close(absl::Time deadline) {
  {
    absl::MutexLock lock(&mu_);
    closed_ = true;
  }
  if (WaitIdle(deadline)) return true;
  std::vector<std::weak_ptr<Cancellable>> calls;
  {
    absl::MutexLock lock(&mu_);
    calls = calls_;
  }
  for (const std::weak_ptr<Cancellable>& weak : calls) {
    if (std::shared_ptr<Cancellable> call = weak.lock()) call->Cancel();
  }
  return WaitIdle(absl::Now() + absl::Seconds(5));
}

bool EngineGate::closed() const {
  absl::MutexLock lock(&mu_);
  return closed_;
}

void EngineGate::Leave() {
  absl::MutexLock lock(&mu_);
  --users_;
}

bool EngineGate::WaitIdle(absl::Time deadline) {
  absl::MutexLock lock(&mu_);
  auto idle = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return users_ == 0; };
  mu_.AwaitWithDeadline(absl::Condition(&idle), deadline);
  return users_ == 0;
}

}  // namespace kvserve

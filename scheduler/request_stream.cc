#include "scheduler/request_stream.h"

namespace kvserve {

std::string_view FinishReasonName(FinishReason r) {
  switch (r) {
    case FinishReason::kNone:
      return "";
    case FinishReason::kStop:
      return "stop";
    case FinishReason::kLength:
      return "length";
    case FinishReason::kCancelled:
      return "cancelled";
    case FinishReason::kError:
      return "error";
  }
  return "";
}

RequestStream::Pop RequestStream::Next(GenerateOutput* out, absl::Duration timeout) {
  absl::MutexLock lock(&mu_);
  auto ready = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) { return !queue_.empty() || closed_; };
  if (timeout == absl::InfiniteDuration()) {
    mu_.Await(absl::Condition(&ready));
  } else if (timeout > absl::ZeroDuration()) {
    mu_.AwaitWithTimeout(absl::Condition(&ready), timeout);
  }
  if (!queue_.empty()) {
    *out = std::move(queue_.front());
    queue_.pop_front();
    return Pop::kOutput;
  }
  return closed_ ? Pop::kEnd : Pop::kTimeout;
}

void RequestStream::SetNotify(std::function<void()> notify) {
  absl::MutexLock lock(&mu_);
  notify_ = std::move(notify);
}

void RequestStream::Push(GenerateOutput out) {
  std::function<void()> notify;
  {
    absl::MutexLock lock(&mu_);
    queue_.push_back(std::move(out));
    notify = notify_;
  }
  if (notify) notify();
}

void RequestStream::Close() {
  std::function<void()> notify;
  {
    absl::MutexLock lock(&mu_);
    closed_ = true;
    notify = notify_;
  }
  if (notify) notify();
}

void RequestStream::Cancel() {
  // Under mu_ so that AwaitCancelled's condition is re-evaluated.
  absl::MutexLock lock(&mu_);
  cancelled_.store(true, std::memory_order_relaxed);
}

bool RequestStream::AwaitCancelled(absl::Duration timeout) const {
  absl::MutexLock lock(&mu_);
  auto cancelled = [this]() { return cancelled_.load(std::memory_order_relaxed); };
  mu_.AwaitWithTimeout(absl::Condition(&cancelled), timeout);
  return cancelled_.load(std::memory_order_relaxed);
}

bool RequestStream::closed() const {
  absl::MutexLock lock(&mu_);
  return closed_;
}

}  // namespace kvserve

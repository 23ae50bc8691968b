#include "server/admission/request_budget.h"

#include <algorithm>
#include <utility>

#include "absl/cleanup/cleanup.h"
#include "spdlog/spdlog.h"
#include "util/status_macros.h"

namespace kvserve {

absl::StatusOr<std::vector<int32_t>> TokenizeWithinBudget(const Tokenizer& tokenizer,
                                                          std::string_view text, bool add_bos,
                                                          const RequestLimits& limits,
                                                          std::string_view field) {
  KV_RETURN_IF_ERROR(CheckPromptBytes(text.size(), limits, field));
  std::vector<int32_t> ids = tokenizer.Encode(text, add_bos);
  KV_RETURN_IF_ERROR(CheckPromptTokens(ids.size(), limits, field));
  return ids;
}

PromptWorkers::PromptWorkers(int threads) {
  threads_.reserve(threads);
  for (int i = 0; i < threads; ++i) threads_.emplace_back([this] { Loop(); });
}

PromptWorkers::~PromptWorkers() { Stop(); }

void PromptWorkers::Run(std::function<void()> work) {
  {
    absl::MutexLock lock(&mu_);
    if (!stopping_) {
      queue_.push_back(std::move(work));
      return;
    }
  }
  work();
}

void PromptWorkers::Stop() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  for (std::thread& t : threads_) t.join();
  threads_.clear();
}

void PromptWorkers::Loop() {
  for (;;) {
    std::function<void()> work;
    {
      absl::MutexLock lock(&mu_);
      auto ready = [this]()
                       ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stopping_ || !queue_.empty(); };
      mu_.Await(absl::Condition(&ready));
      if (queue_.empty()) return;  // stopping and drained
      work = std::move(queue_.front());
      queue_.pop_front();
    }
    // Work finishes its own call on failure; an exception that still gets
    // here must not end the process (std::thread would call terminate).
    try {
      work();
    } catch (const std::exception& e) {
      spdlog::error("prompt worker: uncaught exception: {}", e.what());
    }
  }
}

PromptClient::PromptClient(std::shared_ptr<PromptWorkers> shared, int threads)
    : pool_(std::move(shared)) {
  if (pool_ == nullptr) {
    pool_ = std::make_shared<PromptWorkers>(std::max(1, threads));
    own_ = true;
  }
}

PromptClient::~PromptClient() { Drain(); }

void PromptClient::Run(std::function<void()> work) {
  {
    absl::MutexLock lock(&mu_);
    ++pending_;
  }
  pool_->Run([this, work = std::move(work)] {
    // Counted down even when the work throws (the pool's loop catches it).
    absl::Cleanup done = [this] {
      absl::MutexLock lock(&mu_);
      --pending_;
    };
    work();
  });
}

void PromptClient::Drain() {
  {
    absl::MutexLock lock(&mu_);
    auto idle = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return pending_ == 0; };
    mu_.Await(absl::Condition(&idle));
  }
  if (own_) pool_->Stop();
}

}  // namespace kvserve

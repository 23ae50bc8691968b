#include "server/request_budget.h"

#include <utility>

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

}  // namespace kvserve

#include "cache/tier/disk_loader.h"

#include <chrono>
#include <utility>

namespace kvserve {

DiskLoader::DiskLoader(const DiskTier* disk) : disk_(disk) {
  worker_ = std::thread([this] { Run(); });
}

DiskLoader::~DiskLoader() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  work_cv_.notify_all();
  worker_.join();
}

uint64_t DiskLoader::StartLoad(std::vector<Read> reads) {
  uint64_t ticket;
  {
    std::lock_guard<std::mutex> lock(mu_);
    ticket = next_ticket_++;
    loads_.push_back({ticket, std::move(reads)});
  }
  work_cv_.notify_one();
  return ticket;
}

bool DiskLoader::TakeLoad(uint64_t ticket, std::vector<Result>* out) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = answered_.find(ticket);
  if (it == answered_.end()) return false;
  *out = std::move(it->second);
  answered_.erase(it);
  return true;
}

void DiskLoader::AbandonLoad(uint64_t ticket) {
  std::lock_guard<std::mutex> lock(mu_);
  if (answered_.erase(ticket) > 0) return;
  if (running_ == ticket) {
    abandon_running_ = true;  // its answer is thrown away
    return;
  }
  for (auto it = loads_.begin(); it != loads_.end(); ++it) {
    if (it->ticket == ticket) {
      loads_.erase(it);
      return;
    }
  }
}

void DiskLoader::WaitForLoads(int timeout_ms) {
  std::unique_lock<std::mutex> lock(mu_);
  if (!answered_.empty()) return;
  done_cv_.wait_for(lock, std::chrono::milliseconds(timeout_ms),
                    [this] { return !answered_.empty() || stop_; });
}

void DiskLoader::Run() {
  for (;;) {
    Load load{0, {}};
    {
      std::unique_lock<std::mutex> lock(mu_);
      work_cv_.wait(lock, [this] { return stop_ || !loads_.empty(); });
      if (stop_) return;
      load = std::move(loads_.front());
      loads_.pop_front();
      running_ = load.ticket;
      abandon_running_ = false;
    }
    std::vector<Result> results(load.reads.size());
    for (size_t i = 0; i < load.reads.size(); ++i) {
      const Read& r = load.reads[i];
      results[i].value =
          disk_->ReadSlot(r.slot, {r.hash, r.parent, r.extra_key, r.tokens}, &results[i].reject);
      if (results[i].value == nullptr) break;  // the chain ends here
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!abandon_running_) answered_[load.ticket] = std::move(results);
      running_ = 0;
    }
    done_cv_.notify_all();
  }
}

}  // namespace kvserve
